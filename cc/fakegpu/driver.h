// The fake driver's own state and helpers, shared by the files that
// implement the driver API (README.md lists them by API area): devices and
// contexts (device.cc), memory (memory.cc), streams and events (stream.cc),
// modules and kernels (module.cc), and errors and entry points by name
// (driver.cc). Not a public header.
#ifndef JAXLAKE_FAKEGPU_DRIVER_H_
#define JAXLAKE_FAKEGPU_DRIVER_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cc/fakegpu/fakegpu.h"
#include "cc/vmm/cuda_types.h"

// An implemented driver entry point: exported, returns CUresult.
#define FAKE \
  ::jaxlake::cuda::CUresult __attribute__((visibility("default")))
#define ENTER() JAXLAKE_FAKEGPU_ENTER()

namespace jaxlake::fakegpu::driver {

using cuda::CUcontext;
using cuda::CUmemoryPool;
using cuda::CUresult;
using cuda::CUstream;

constexpr int kDriverVersion = 13000;
constexpr std::size_t kGranularity = std::size_t{2} << 20;
constexpr std::uintptr_t kContextBase = 0xC000;
constexpr std::uintptr_t kPoolBase = 0x9000;
constexpr CUresult CUDA_ERROR_INVALID_IMAGE = 200;
constexpr CUresult CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED = 704;

// The driver's state, under one lock.
struct Driver {
  std::mutex mu;
  // devices and contexts
  bool initialized = false;
  std::vector<int> primary_refs;
  std::set<std::pair<int, int>> peers;
  // memory
  struct Handle {
    int device;
    std::size_t size;
  };
  std::unordered_map<cuda::CUmemGenericAllocationHandle, Handle> handles;
  struct Alloc {
    int device;
    std::size_t size;
    bool pool;
  };
  std::unordered_map<cuda::CUdeviceptr, Alloc> allocs;  // cuMemAlloc, pools
  std::unordered_map<std::uintptr_t, std::size_t> host_allocs;
  std::vector<std::uint64_t> pool_used, pool_high, release_threshold;
  // modules and kernels
  struct Module {
    std::map<std::string, std::size_t> symbols;  // from the image's ELF
    std::map<std::string, std::pair<void*, std::size_t>> globals;
  };
  std::map<std::uintptr_t, Module> modules;
  struct Function {
    std::string name;
    int attrs[16] = {};
  };
  std::unordered_map<std::uintptr_t, std::unique_ptr<Function>> functions;
  std::uintptr_t next_module = 0x7000000;
  std::uint64_t launches = 0;
};
Driver& D();

inline int Count() { return Opts().count; }
inline bool ValidDevice(int d) { return d >= 0 && d < Count(); }

// Contexts and default pools are small integers, one a device.
inline CUcontext ContextOf(int device) {
  return reinterpret_cast<CUcontext>(kContextBase +
                                     static_cast<std::uintptr_t>(device));
}
inline int DeviceOfContext(CUcontext ctx) {
  const auto v = reinterpret_cast<std::uintptr_t>(ctx);
  return v >= kContextBase && v < kContextBase + static_cast<unsigned>(Count())
             ? static_cast<int>(v - kContextBase)
             : -1;
}
inline CUmemoryPool PoolOf(int device) {
  return reinterpret_cast<CUmemoryPool>(kPoolBase +
                                        static_cast<std::uintptr_t>(device));
}
inline int DeviceOfPool(CUmemoryPool pool) {
  const auto v = reinterpret_cast<std::uintptr_t>(pool);
  return v >= kPoolBase && v < kPoolBase + static_cast<unsigned>(Count())
             ? static_cast<int>(v - kPoolBase)
             : -1;
}

// CUDA_ERROR_NOT_INITIALIZED before cuInit.
CUresult NeedInit();
// As NeedInit, and CUDA_ERROR_INVALID_CONTEXT without a current context;
// else *device (when given) is the current device.
CUresult NeedContext(int* device = nullptr);
// The stream a handle names, for the calling thread's current device.
Stream* StreamFor(CUstream s);

}  // namespace jaxlake::fakegpu::driver

#endif  // JAXLAKE_FAKEGPU_DRIVER_H_
