// jaxlake: what the baseline models share: a simulated device that hands
// out physical bytes up to a capacity, virtual addresses, and counts the
// driver calls the modelled allocator would make, and the time the latency
// model (cc/vmm/latency.h) charges for them.
#ifndef JAXLAKE_REPLAY_MODEL_H_
#define JAXLAKE_REPLAY_MODEL_H_

#include <cstddef>
#include <cstdint>

#include "cc/replay/policy.h"
#include "cc/vmm/latency.h"

namespace jaxlake::replay {

class SimDevice {
 public:
  SimDevice(std::size_t capacity, std::size_t granularity,
            const vmm::LatencyModel& latency)
      : capacity_(capacity), granularity_(granularity), calls_(latency) {}

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

  // n calls of kind c, each on `bytes` bytes covering `handles` handles.
  void count(vmm::Call c, std::uint64_t n, std::size_t bytes,
             std::uint64_t handles = 1) {
    calls_.add(c, n, bytes, handles);
  }
  const vmm::CallCounts& calls() const { return calls_.counts(); }
  const vmm::CallTimes& driver_us() const { return calls_.times(); }

  // A cudaMalloc of `bytes`: counts create + map + set_access (the create
  // alone when it fails); false when the capacity does not allow it. The
  // memory a cudaMalloc returns is accessible, so it does the work of
  // cuMemSetAccess too (the page-table entries of the range): a VMM
  // allocator pays the same for the same bytes. Its address reservation
  // and release are not charged.
  bool cuda_malloc(std::size_t bytes) {
    const std::size_t rounded = RoundUp(bytes, granularity_);
    count(vmm::Call::create, 1, rounded);
    if (!take(rounded)) return false;
    count(vmm::Call::map, 1, rounded);
    count(vmm::Call::set_access, 1, rounded);
    return true;
  }
  // A cudaFree of a cudaMalloc of `bytes`: counts unmap + release.
  void cuda_free(std::size_t bytes) {
    const std::size_t rounded = RoundUp(bytes, granularity_);
    count(vmm::Call::unmap, 1, rounded);
    count(vmm::Call::release, 1, rounded);
    give(rounded);
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
