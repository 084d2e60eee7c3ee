// jaxlake: a model of XLA's VMM allocator (DeviceAddressVmmAllocator) as
// the GPU client configures it (XLA_PYTHON_CLIENT_ALLOCATOR=vmm, or chosen
// by XLA itself for command-buffer update modes other than ALWAYS_UPDATE).
//
// Read at openxla/xla:
//   xla/stream_executor/device_address_vmm_allocator.cc
//     (1714b757065699f603a35ed2767d4e571b8de0b4)
//   xla/stream_executor/cuda/cuda_device_address_vmm_allocator.cc
//     (2d1869ffbaa068429ea42142713d3424bc6b0b50)
//   xla/stream_executor/cuda/cuda_memory_reservation.cc
//     (050c3958f8a33c32a8ecc861585c8a0d977c3756)
//
// The modelling choices, each with where it comes from:
//   * Granularity: sizes are padded to the recommended allocation
//     granularity (CudaDeviceAddressVmmAllocator::InitializeDeviceState,
//     CU_MEM_ALLOC_GRANULARITY_RECOMMENDED; RoundUpToGranularity). The
//     model uses the replay's granularity (2 MiB, the recommended value on
//     current data-centre GPUs), the smallest it can be.
//   * Budget: pa_budget = total memory x memory fraction, or the client's
//     absolute size (CudaDeviceAddressVmmAllocator::Create). The model's
//     budget is the replay capacity (the fraction folded into it).
//   * A fresh allocation (Allocate, its try_fresh) fails with
//     ResourceExhausted when pa_allocated + rounded > pa_budget, else makes
//     its own physical allocation, its own reservation and its own
//     mapping: cuMemCreate + cuMemAddressReserve + cuMemMap +
//     cuMemSetAccess (CudaMemoryReservation::Map and SetAccess; one device,
//     so no peer cuMemSetAccess). pa_allocated grows by the rounded size.
//   * Deallocate never frees: it enqueues a GPU write of the next sequence
//     number (cuStreamWriteValue64, EnqueueDeferredDeallocation; charged as
//     an event record, the nearest kind of stream-ordered call the latency
//     model has) and appends the record to pending_deallocations, in
//     sequence order.
//   * Reuse (Allocate, its try_reuse): the oldest pending allocation whose
//     rounded size equals the request's is reactivated, with no driver
//     call. No split, coalescing or stitching anywhere.
//   * Pressure (TryWithPendingReclaim): reuse, then fresh; on
//     ResourceExhausted, complete the pending frees the GPU timeline has
//     passed (CompleteReadyAllocatorDeallocationsForReclaim), fresh again;
//     then select the oldest pending frees until they add up to the
//     rounded request plus a tenth, wait for the last of them, complete
//     them, fresh again; then out of memory. A replay has no GPU timeline.
//     Reading most favourable to XLA: the timeline has passed none of them
//     at the first completion step, so only the oldest frees up to 1.1x
//     the request are torn down and the rest stay cached for reuse. Either
//     reading fits the same capacities (both free enough whenever the
//     pending bytes allow: pa_allocated <= pa_budget, so freeing 1.1x the
//     request always makes room), so this reading changes only the calls.
//   * Teardown of a completed free (CompletePendingDeallocation, the
//     record's ScopedMapping then CudaMemoryReservation's destructor):
//     cuMemUnmap + cuMemAddressFree + cuMemRelease. The destructor's second
//     cuMemUnmap of an already unmapped range fails and is not counted.
//   * Without budget pressure nothing is ever released (pending frees
//     wait for reuse or pressure).
//   * Multi-device records (CurrentMultiDevice) are reused only by
//     requests of the same kind; a replayed device's requests are all of
//     one kind, so the model ignores it. One stream per device.
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <sstream>
#include <unordered_map>

#include "cc/replay/model.h"
#include "cc/replay/policy.h"

namespace jaxlake::replay {

namespace {

class XlaVmmPolicy final : public Policy {
 public:
  explicit XlaVmmPolicy(const PolicyOptions& o)
      : device_(o.capacity, o.granularity, o.latency),
        budget_(o.capacity / o.granularity * o.granularity) {}

  const char* name() const override { return "xla-vmm"; }

  bool allocate(std::size_t nbytes, std::uint64_t,
                std::uintptr_t* address) override {
    const std::size_t rounded = RoundUp(nbytes, device_.granularity());
    if (reuse(rounded, address) || fresh(rounded, address)) return true;
    // The first completion step frees nothing (see the header), so the
    // next is the wait for the oldest pending frees up to 1.1x the request.
    const std::size_t target = rounded + rounded / 10;
    std::size_t selected = 0;
    while (!pending_.empty() && selected < target) {
      const Pending p = pending_.begin()->second;
      selected += p.size;
      teardown(p);
    }
    return fresh(rounded, address);
  }

  void free(std::uintptr_t address, std::uint64_t) override {
    auto it = live_.find(address);
    if (it == live_.end()) return;
    const std::size_t size = it->second;
    live_.erase(it);
    device_.count(vmm::Call::event_record, 1, 0);  // cuStreamWriteValue64
    const std::uint64_t seqno = next_seqno_++;
    pending_.emplace_hint(pending_.end(), seqno,
                          Pending{seqno, address, size});
    by_size_[size].push_back(seqno);
  }

  std::size_t reserved() const override { return pa_allocated_; }
  vmm::CallCounts calls() const override { return device_.calls(); }
  vmm::CallTimes driver_us() const override { return device_.driver_us(); }
  Counters counters() const override {
    return {{"stitches", 0},
            {"stitched_bytes", 0},
            {"stitch_reuses", 0},
            {"reclaims", reclaims_},
            {"reuses", reuses_},
            {"fresh", fresh_},
            {"pending_bytes", pending_bytes()}};
  }
  std::string check() const override;

 private:
  struct Pending {
    std::uint64_t seqno;
    std::uintptr_t address;
    std::size_t size;  // rounded
  };

  std::uint64_t pending_bytes() const {
    std::uint64_t n = 0;
    for (const auto& [seqno, p] : pending_) n += p.size;
    return n;
  }

  // try_reuse: the oldest pending record of exactly this rounded size.
  bool reuse(std::size_t rounded, std::uintptr_t* address) {
    auto bs = by_size_.find(rounded);
    if (bs == by_size_.end() || bs->second.empty()) return false;
    const std::uint64_t seqno = bs->second.front();
    bs->second.pop_front();
    if (bs->second.empty()) by_size_.erase(bs);
    auto it = pending_.find(seqno);
    *address = it->second.address;
    live_[it->second.address] = rounded;
    pending_.erase(it);
    ++reuses_;
    return true;
  }

  // try_fresh: a new physical allocation, reservation and mapping.
  bool fresh(std::size_t rounded, std::uintptr_t* address) {
    if (pa_allocated_ + rounded > budget_) return false;
    device_.count(vmm::Call::create, 1, rounded);
    if (!device_.take(rounded)) return false;  // cannot happen: in budget
    device_.count(vmm::Call::reserve, 1, rounded);
    device_.count(vmm::Call::map, 1, rounded);
    device_.count(vmm::Call::set_access, 1, rounded);
    pa_allocated_ += rounded;
    *address = device_.reserve_va(rounded);
    live_[*address] = rounded;
    ++fresh_;
    return true;
  }

  // Completes the oldest pending free `p` (pending_.begin()).
  void teardown(const Pending& p) {
    device_.count(vmm::Call::unmap, 1, p.size);
    device_.count(vmm::Call::address_free, 1, p.size);
    device_.count(vmm::Call::release, 1, p.size);
    device_.give(p.size);
    pa_allocated_ -= p.size;
    auto bs = by_size_.find(p.size);
    bs->second.pop_front();  // the oldest of its size is the oldest of all
    if (bs->second.empty()) by_size_.erase(bs);
    pending_.erase(pending_.begin());
    ++reclaims_;
  }

  SimDevice device_;
  std::size_t budget_;
  std::size_t pa_allocated_ = 0;
  std::uint64_t next_seqno_ = 1;
  // pending_deallocations, by sequence number (oldest first).
  std::map<std::uint64_t, Pending> pending_;
  // Pending seqnos by rounded size, oldest first.
  std::map<std::size_t, std::deque<std::uint64_t>> by_size_;
  std::unordered_map<std::uintptr_t, std::size_t> live_;
  std::uint64_t reclaims_ = 0;
  std::uint64_t reuses_ = 0;
  std::uint64_t fresh_ = 0;
};

std::string XlaVmmPolicy::check() const {
  std::ostringstream err;
  std::uint64_t total = pending_bytes();
  for (const auto& [addr, size] : live_) total += size;
  if (total != pa_allocated_)
    err << "live and pending hold " << total << " bytes, pa_allocated is "
        << pa_allocated_ << "; ";
  if (pa_allocated_ != device_.reserved())
    err << "pa_allocated " << pa_allocated_ << " but the device holds "
        << device_.reserved() << "; ";
  if (pa_allocated_ > budget_) err << "over the budget; ";
  std::size_t indexed = 0;
  for (const auto& [size, q] : by_size_) indexed += q.size();
  if (indexed != pending_.size())
    err << "size index holds " << indexed << " of " << pending_.size()
        << " pending; ";
  for (const auto& [seqno, p] : pending_)
    if (p.seqno != seqno) err << "pending " << seqno << " mislabelled; ";
  return err.str();
}

}  // namespace

std::unique_ptr<Policy> MakeXlaVmmPolicy(const PolicyOptions& o) {
  return std::make_unique<XlaVmmPolicy>(o);
}

}  // namespace jaxlake::replay
