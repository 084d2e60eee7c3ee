// What the fake's cuFFT, cuSOLVER and cuSPARSE (cufft.cc, cusolver.cc,
// cusparse.cc) share: a registry that owns each library's handles and
// descriptors, and the check that a pointer is device memory of the fake.
// Not a public header.
#ifndef JAXLAKE_FAKEGPU_LIBS_H_
#define JAXLAKE_FAKEGPU_LIBS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include "cc/fakegpu/fakegpu.h"

namespace jaxlake::fakegpu {

// True when [p, p + n) lies in memory the fake handed out as device memory
// (cuMemAlloc, the driver's pool, a VMM reservation); n == 0 asks nothing of
// p (an empty buffer may be any pointer, null included).
inline bool DeviceBytes(const void* p, std::uint64_t n) {
  if (n == 0) return true;
  const auto v = reinterpret_cast<std::uintptr_t>(p);
  Range r;
  return v != 0 && FindRange(v, &r) && r.kind != Kind::kHost &&
         v - r.base <= r.size && n <= r.size - (v - r.base);
}

// The live objects of one kind (handles, descriptors), owned here: an object
// is made by Add, which gives the opaque handle the caller sees (the
// object's address), and destroyed by Remove. A handle the registry does not
// hold is refused, so a stale or made-up handle is an error, not a crash.
template <typename T>
class Registry {
 public:
  void* Add(std::unique_ptr<T> object) {
    std::lock_guard<std::mutex> lock(mu_);
    void* key = object.get();
    live_[key] = std::move(object);
    return key;
  }
  // The object, out of the registry (null when it holds no such handle); the
  // caller's unique_ptr destroys it.
  std::unique_ptr<T> Remove(const void* handle) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(handle);
    if (it == live_.end()) return nullptr;
    std::unique_ptr<T> out = std::move(it->second);
    live_.erase(it);
    return out;
  }
  // f(object) under the registry's lock, or `missing` when it holds no such
  // handle.
  template <typename F>
  int With(const void* handle, int missing, F f) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(handle);
    if (it == live_.end()) return missing;
    return f(*it->second);
  }
  std::size_t Size() {
    std::lock_guard<std::mutex> lock(mu_);
    return live_.size();
  }

 private:
  std::mutex mu_;
  std::map<const void*, std::unique_ptr<T>> live_;
};

// Bytes of an element of a cudaDataType_t (library_types.h): 0 for a type
// the fake does not know.
inline std::size_t DataTypeBytes(int type) {
  switch (type) {
    case 0: return 4;    // CUDA_R_32F
    case 1: return 8;    // CUDA_R_64F
    case 2: return 2;    // CUDA_R_16F
    case 3: return 1;    // CUDA_R_8I
    case 4: return 8;    // CUDA_C_32F
    case 5: return 16;   // CUDA_C_64F
    case 6: return 4;    // CUDA_C_16F
    case 7: return 2;    // CUDA_C_8I
    case 8: return 1;    // CUDA_R_8U
    case 9: return 2;    // CUDA_C_8U
    case 10: return 4;   // CUDA_R_32I
    case 11: return 8;   // CUDA_C_32I
    case 12: return 4;   // CUDA_R_32U
    case 13: return 8;   // CUDA_C_32U
    case 14: return 2;   // CUDA_R_16BF
    case 15: return 4;   // CUDA_C_16BF
    default: return 0;
  }
}

}  // namespace jaxlake::fakegpu

#endif  // JAXLAKE_FAKEGPU_LIBS_H_
