// jaxlake shim: the process-wide state behind the hooks and the C API.
//
// One lake per device, over a CudaDriver for that device, created on the
// first request that reaches it. Requests are matched to a device by their
// memory pool: the lake serves the pools returned by
// cuDeviceGetDefaultMemPool (the pools XLA's cuda_async allocator uses);
// any other pool stays with the real driver.
//
// The state is created at the first call into the shim and never
// destroyed: lakes hold device memory until the process exits, and tearing
// them down from a static destructor could call a driver that is already
// shutting down.
#ifndef JAXLAKE_SHIM_LAKES_H_
#define JAXLAKE_SHIM_LAKES_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "cc/lake/lake.h"
#include "cc/shim/options.h"
#include "cc/shim/trace.h"
#include "cc/vmm/cuda_driver.h"
#include "cc/vmm/cuda_types.h"

namespace jaxlake::shim {

// The hooked entry points (hooked.inc: exports, counters, JSON).
enum class Hook : int {
#define JAXLAKE_SHIM_HOOK(name) name,
#include "cc/shim/hooked.inc"
#undef JAXLAKE_SHIM_HOOK
  kCount
};
inline constexpr int kNumHooks = static_cast<int>(Hook::kCount);
const char* HookName(Hook h);

// Per hooked entry point: calls, those the shim answered itself (served by
// a lake, or a rewritten cuGetProcAddress answer), those passed on to the
// real driver, and those that returned an error either way. `captured`
// counts the allocations and frees made under stream capture (forwarded
// to the driver's pool, or, for a lake address, refused): a subset of
// forwarded + failed.
struct HookCounter {
  std::atomic<std::uint64_t> calls{0};
  std::atomic<std::uint64_t> served{0};
  std::atomic<std::uint64_t> forwarded{0};
  std::atomic<std::uint64_t> failed{0};
  std::atomic<std::uint64_t> captured{0};
  // Device bytes of the successful allocations passed on to the driver
  // (allocating entry points only; a running total, frees not subtracted).
  std::atomic<std::uint64_t> forwarded_bytes{0};
  // Forwarded allocations the driver refused for lack of memory, after
  // which the shim released the lakes' cached memory and tried once more
  // (hooks.cc, "memory pressure"): the tries, those that then succeeded,
  // and the physical bytes the lakes gave back for them.
  std::atomic<std::uint64_t> pressure{0};
  std::atomic<std::uint64_t> pressure_ok{0};
  std::atomic<std::uint64_t> pressure_bytes{0};
};

// Device memory taken outside the lakes through the shim: the allocations
// it passed on to the driver (cuMemAlloc_v2, cuMemAllocPitch_v2,
// cuMemAllocManaged, cuMemAllocAsync, the cuMemAllocFromPoolAsync calls no
// lake served) by address, and the physical allocations of cuMemCreate
// made by the program (the lakes' own go to the driver directly) by
// handle. Their frees (cuMemFree_v2, cuMemFreeAsync of such an address,
// cuMemRelease) take them off. `current` is the bytes live, `peak` its
// highest value since the last ResetPeak.
class OutsideLedger {
 public:
  enum class Key { kAddress, kHandle };
  void Add(Key kind, std::uintptr_t key, std::size_t bytes);
  // Takes `key` off when it is there; false when it was not.
  bool Remove(Key kind, std::uintptr_t key);
  std::uint64_t current() const;
  std::uint64_t peak() const;
  // Allocations added since the start.
  std::uint64_t allocations() const;
  // The peak starts again from the bytes live now.
  void ResetPeak();

 private:
  mutable std::mutex mu_;
  std::unordered_map<std::uintptr_t, std::size_t> addresses_;
  std::unordered_map<std::uintptr_t, std::size_t> handles_;
  std::uint64_t current_ = 0;
  std::uint64_t peak_ = 0;
  std::uint64_t allocations_ = 0;
};

// Per device: the cuMemAllocFromPoolAsync calls (both variants) on its
// default pool that a lake answered (served), that went to the driver
// (forwarded), and of those the ones made under stream capture (captured).
// Requests on other pools belong to no device here.
struct DeviceCounter {
  std::atomic<std::uint64_t> served{0};
  std::atomic<std::uint64_t> forwarded{0};
  std::atomic<std::uint64_t> captured{0};
};

class Lakes {
 public:
  // Devices the shim can hold a lake for (ordinals 0 .. kMaxDevices-1).
  static constexpr int kMaxDevices = 64;

  // The process-wide instance (loads the real driver, reads the options).
  static Lakes& Get();

  // True when the hooks serve allocations: a real driver was loaded, the
  // options are valid, JAXLAKE_SHIM_HOOKS is not 0 and Disable() was not
  // called.
  bool active() const { return active_.load(std::memory_order_acquire); }
  // Makes the shim forward every new request from now on (lakes that exist
  // keep taking back their own addresses). `why` becomes the reason.
  void Disable(const std::string& why);
  // Why the shim is not active, and why any device has no lake; "" if none.
  std::string reason() const;
  const ShimOptions& options() const { return options_; }

  // The ordinal of the device whose default pool is `pool`, or -1.
  int DeviceOfPool(cuda::CUmemoryPool pool);
  // The ordinal of the calling thread's current context's device, or -1.
  int CurrentDevice() const;
  // The lake of `device`, created on first use; nullptr when the shim is
  // inactive or the lake cannot be made (the reason is kept, and printed
  // once to stderr).
  Lake* LakeFor(int device);
  // The lake of `device` if it exists.
  Lake* Existing(int device) const;
  // Ordinals of the devices that have a lake.
  std::vector<int> Devices() const;
  // The device whose lake reserved the virtual range holding `ptr` (a live
  // allocation or not), or -1: such an address is never handed to the
  // driver's own pool, and no other address to a lake.
  int AddressOwner(std::uintptr_t ptr) const;
  // The live allocations the lakes handed out through the hooks, kept so
  // that an address-range query of any address inside one (stitched from
  // several mappings or not) reports the whole allocation: `bytes`
  // requested at `address` on `device`'s lake, then freed.
  void Served(int device, std::uintptr_t address, std::size_t bytes);
  void Freed(int device, std::uintptr_t address);
  // The live lake allocation holding `ptr`: false when there is none; else
  // *base and *bytes are its address and requested size.
  bool FindLive(std::uintptr_t ptr, std::uintptr_t* base,
                std::size_t* bytes) const;

  HookCounter& counter(Hook h) { return counters_[static_cast<int>(h)]; }
  // The counter of `device`, or nullptr outside 0 .. kMaxDevices-1.
  DeviceCounter* device_counter(int device) {
    return device >= 0 && device < kMaxDevices
               ? &device_counters_[static_cast<std::size_t>(device)]
               : nullptr;
  }
  // The report JAXLAKE_EXIT_REPORT=1 prints at exit: one line naming the
  // process, then per device that had a pool request: served, forwarded
  // and captured allocations, peak in use, peak reserved, U and stitches.
  // Empty when no pool request reached the shim.
  std::string ExitReport();
  OutsideLedger& outside() { return outside_; }
  TraceWriter& trace() { return trace_; }
  // Starts the trace in `path` (TraceWriter::Start) with this process's
  // device count and the peak of the memory outside the lakes from now.
  int StartTrace(const std::string& path, const std::string& name);
  // Devices the real driver reports (0 when it cannot say).
  int DeviceCount() const;

 private:
  Lakes();
  struct DeviceLake {
    std::unique_ptr<vmm::CudaDriver> driver;  // declared first: outlives lake
    std::unique_ptr<Lake> lake;
  };

  std::atomic<bool> active_{false};
  std::string inactive_reason_;
  ShimOptions options_;

  mutable std::mutex mu_;  // guards creation and the strings below
  std::shared_ptr<vmm::CudaLibrary> library_;
  std::array<std::atomic<DeviceLake*>, kMaxDevices> lakes_{};
  std::array<bool, kMaxDevices> failed_{};
  std::vector<std::string> failures_;

  std::atomic<bool> pools_known_{false};
  std::vector<cuda::CUmemoryPool> pools_;  // by ordinal, set once

  struct Live {
    mutable std::mutex mu;
    std::map<std::uintptr_t, std::size_t> allocations;  // address -> bytes
  };
  std::array<Live, kMaxDevices> live_;

  std::array<HookCounter, kNumHooks> counters_;
  std::array<DeviceCounter, kMaxDevices> device_counters_;
  OutsideLedger outside_;
  TraceWriter trace_;
};

}  // namespace jaxlake::shim

#endif  // JAXLAKE_SHIM_LAKES_H_
