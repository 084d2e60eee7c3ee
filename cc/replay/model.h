// jaxlake: what the baseline models share: a simulated device that hands
// out physical bytes up to a capacity, virtual addresses, and counts the
// driver calls the modelled allocator would make.
#ifndef JAXLAKE_REPLAY_MODEL_H_
#define JAXLAKE_REPLAY_MODEL_H_

#include <cstddef>
#include <cstdint>

#include "cc/replay/policy.h"

namespace jaxlake::replay {

class SimDevice {
 public:
  SimDevice(std::size_t capacity, std::size_t granularity)
      : capacity_(capacity), granularity_(granularity) {}

  std::size_t capacity() const { return capacity_; }
  std::size_t granularity() const { return granularity_; }
  std::size_t reserved() const { return reserved_; }
  std::size_t available() const { return capacity_ - reserved_; }

  // Takes `bytes` of physical memory; false (nothing taken) when the
  // capacity does not allow it.
  bool take(std::size_t bytes) {
    if (bytes > capacity_ - reserved_) return false;
    reserved_ += bytes;
    return true;
  }
  void give(std::size_t bytes) { reserved_ -= bytes; }

  // A fresh virtual range of `bytes`, granule-aligned, with one unused
  // granule after it (so ranges never touch).
  std::uintptr_t reserve_va(std::size_t bytes) {
    const std::uintptr_t va = next_va_;
    next_va_ += RoundUp(bytes, granularity_) + granularity_;
    return va;
  }

  void count(vmm::Call c, std::uint64_t n = 1) { calls_.add(c, n); }
  const vmm::CallCounts& calls() const { return calls_.counts(); }

  // A cudaMalloc of `bytes`: counts create + map (the create alone when it
  // fails); false when the capacity does not allow it.
  bool cuda_malloc(std::size_t bytes) {
    count(vmm::Call::create);
    if (!take(RoundUp(bytes, granularity_))) return false;
    count(vmm::Call::map);
    return true;
  }
  // A cudaFree of a cudaMalloc of `bytes`: counts unmap + release.
  void cuda_free(std::size_t bytes) {
    count(vmm::Call::unmap);
    count(vmm::Call::release);
    give(RoundUp(bytes, granularity_));
  }

 private:
  std::size_t capacity_;
  std::size_t granularity_;
  std::size_t reserved_ = 0;
  std::uintptr_t next_va_ = std::uintptr_t{1} << 44;
  CallCounter calls_;
};

}  // namespace jaxlake::replay

#endif  // JAXLAKE_REPLAY_MODEL_H_
