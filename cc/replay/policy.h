// jaxlake: the allocation policies a trace can be replayed through.
//
// One small interface, one class per policy, each in its own file:
//
//   jaxlake           the real jaxlake::Lake over a vmm::SimDriver
//   bfc               XLA's BFC allocator with growth        (bfc.cc)
//   torch             PyTorch's CUDA caching allocator        (torch.cc)
//   torch-expandable  PyTorch's expandable segments           (torch.cc)
//   gmlake            GMLake as published                     (gmlake.cc)
//   xla-vmm           XLA's DeviceAddressVmmAllocator         (xla_vmm.cc)
//   bfc-growth        XLA's BFC over one growing range        (bfc_growth.cc)
//
// The baselines are models of each allocator's documented behaviour (see
// docs/benchmarks.md for the rules each one follows and where they come
// from). They do no driver calls; they count the calls the real allocator
// would make, by the kinds of vmm::Call, so every policy reports the same
// figures. An allocator that uses cudaMalloc/cudaFree (BFC regions,
// PyTorch segments, GMLake's small pool) counts one create + one map per
// cudaMalloc and one unmap + one release per cudaFree.
//
// Physical bytes ("reserved") count whole driver granules: a cudaMalloc of
// 3 MiB holds 4 MiB of a 2 MiB-granular device.
#ifndef JAXLAKE_REPLAY_POLICY_H_
#define JAXLAKE_REPLAY_POLICY_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cc/lake/lake.h"
#include "cc/vmm/driver.h"
#include "cc/vmm/latency.h"

namespace jaxlake::vmm {
struct SimOptions;
}  // namespace jaxlake::vmm

namespace jaxlake::replay {

inline constexpr std::size_t kMiB = std::size_t{1} << 20;
inline constexpr std::size_t kGiB = std::size_t{1} << 30;

struct PolicyOptions {
  // Physical bytes of the simulated device; every policy fails (out of
  // memory) rather than hold more. The default is a large device.
  std::size_t capacity = std::size_t{80} << 30;
  // Driver granularity (cuMemGetAllocationGranularity).
  std::size_t granularity = 2 * kMiB;
  // The time charged per driver call, for every policy alike.
  vmm::LatencyModel latency;

  // jaxlake: the lake's options (capacity is set from the field above).
  LakeOptions lake;

  // bfc: the first region (then doubling) and the split threshold.
  std::size_t bfc_initial_region = 2 * kMiB;
  // bfc: the allocator's own memory limit (XLA's fraction of the device),
  // where it differs from the memory the device has for it (`capacity`):
  // regions are sized under the limit, and one the device refuses is
  // retried at 90% while that still holds the request. 0: the capacity.
  // (A second process on a shared GPU: its limit is its share of the
  // whole device, more than the first leaves it.)
  std::size_t bfc_limit = 0;
  std::size_t bfc_max_internal_fragmentation = 128 * kMiB;
  // bfc-growth: XLA_PJRT_GPU_BFC_GROWTH_INCREMENT_BYTES, the first size
  // tried for each extension of the growing range.
  std::size_t bfc_growth_increment = 64 * kMiB;

  // torch and torch-expandable: PYTORCH_CUDA_ALLOC_CONF max_split_size_mb
  // (0: unlimited, the default).
  std::size_t torch_max_split_size = 0;

  // gmlake: fragLimit and reuseLimit.
  std::size_t gmlake_frag_limit = 512 * kMiB;
  double gmlake_reuse_limit = 10.0;
};

using Counters = std::vector<std::pair<std::string, std::uint64_t>>;

class Policy {
 public:
  virtual ~Policy() = default;
  Policy(const Policy&) = delete;
  Policy& operator=(const Policy&) = delete;

  virtual const char* name() const = 0;

  // Serves `nbytes` (> 0) on `stream`: true and *address set, or false when
  // the policy is out of memory (after whatever it does under pressure).
  // Addresses of live allocations are distinct.
  virtual bool allocate(std::size_t nbytes, std::uint64_t stream,
                        std::uintptr_t* address) = 0;
  // Frees a live allocation returned by allocate().
  virtual void free(std::uintptr_t address, std::uint64_t stream) = 0;

  // Physical bytes held from the (simulated) driver now.
  virtual std::size_t reserved() const = 0;
  // Driver calls made (or, for the baselines, that would be made), by kind.
  virtual vmm::CallCounts calls() const = 0;
  // The modelled driver time of those calls, by kind, in microseconds
  // (PolicyOptions::latency, the same model for every policy).
  virtual vmm::CallTimes driver_us() const = 0;
  // Policy-specific counters: every policy reports "stitches",
  // "stitched_bytes", "stitch_reuses" and "reclaims" (0 where they do not
  // apply), and may add its own.
  virtual Counters counters() const = 0;
  // Validates the policy's invariants: "" when they hold (tests).
  virtual std::string check() const { return {}; }

 protected:
  Policy() = default;
};

// The policy names, in table order.
std::vector<std::string> PolicyNames();

// A new policy, or null with *error set for an unknown name or invalid
// options.
std::unique_ptr<Policy> MakePolicy(const std::string& name,
                                   const PolicyOptions& options,
                                   std::string* error);

// The factories behind MakePolicy (one per file).
std::unique_ptr<Policy> MakeLakePolicy(const PolicyOptions& o,
                                       std::string* error);
// The simulated driver and lake options the "jaxlake" policy runs with
// (false and *error set when the options are invalid).
bool LakePolicySetup(const PolicyOptions& o, vmm::SimOptions* sim,
                     LakeOptions* lake, std::string* error);
std::unique_ptr<Policy> MakeBfcPolicy(const PolicyOptions& o);
std::unique_ptr<Policy> MakeTorchPolicy(const PolicyOptions& o);
std::unique_ptr<Policy> MakeExpandablePolicy(const PolicyOptions& o);
std::unique_ptr<Policy> MakeGmlakePolicy(const PolicyOptions& o);
std::unique_ptr<Policy> MakeXlaVmmPolicy(const PolicyOptions& o);
std::unique_ptr<Policy> MakeBfcGrowthPolicy(const PolicyOptions& o);

// Shared helpers of the models.
inline std::size_t RoundUp(std::size_t x, std::size_t to) {
  return (x + to - 1) / to * to;
}

// Counts calls by kind, and charges their modelled time, for a model that
// makes none.
class CallCounter {
 public:
  explicit CallCounter(const vmm::LatencyModel& latency) : clock_(latency) {}
  // n calls of kind c, each on `bytes` bytes covering `handles` physical
  // handles (map and unmap cost per handle: cc/vmm/latency.h).
  void add(vmm::Call c, std::uint64_t n, std::size_t bytes,
           std::uint64_t handles = 1) {
    counts_[static_cast<int>(c)] += n;
    clock_.charge(c, bytes, n, handles);
  }
  const vmm::CallCounts& counts() const { return counts_; }
  const vmm::CallTimes& times() const { return clock_.times(); }

 private:
  vmm::CallCounts counts_{};
  vmm::DriverClock clock_;
};

}  // namespace jaxlake::replay

#endif  // JAXLAKE_REPLAY_POLICY_H_
