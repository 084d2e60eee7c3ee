// jaxlake: a model of XLA's BFC allocator with spatial growth
// (XLA_PJRT_GPU_BFC_ALLOW_GROWTH=true): the chunks, bins, best fit,
// splitting and coalescing of the BFC model (bfc.h), over one virtual range
// that grows by appending physical memory instead of adding regions.
//
// Read at openxla/xla 050c3958f8a33c32a8ecc861585c8a0d977c3756:
//   docs/gpu_bfc_growth.md (the layout, the growth policy and its settings)
//   xla/tsl/framework/bfc_allocator.cc (BFCAllocator::Extend, its spatial
//     growth branch; the BFC rules themselves as bfc.cc models them)
//   xla/stream_executor/cuda/cuda_contiguous_sub_allocator.cc
//     (CreateCudaContiguousSubAllocator: one reservation of the whole cap,
//     recommended granularity, a headroom check before each allocation)
//   xla/stream_executor/integrations/contiguous_sub_allocator.cc
//     (ContiguousSubAllocator::Alloc, read at
//     f0776532eeca0372f656f1e14f282d859ff4529a: each extension rounded up to the granularity, mapped at the end of
//     the mapped prefix, refused past the cap)
//
// The modelling choices, each with where it comes from:
//   * One reservation of the whole cap, made once (cuMemAddressReserve;
//     CreateCudaContiguousSubAllocator). The model's cap is the device
//     capacity: the headroom the doc keeps outside the arena (1 GiB by
//     default) is taken as already subtracted, the reading most favourable
//     to XLA.
//   * Growth appends physical memory at the end of the mapped prefix and
//     never remaps, relocates or releases it (ContiguousSubAllocator::Alloc;
//     docs/gpu_bfc_growth.md, "Layout and invariants"). Each extension is
//     one cuMemCreate + cuMemMap + cuMemSetAccess.
//   * Extension size (BFCAllocator::Extend): the candidate is reset to the
//     increment (XLA_PJRT_GPU_BFC_GROWTH_INCREMENT_BYTES, 64 MiB) at every
//     extension and doubled until it covers the missing bytes: the request
//     less a free chunk at the end of the arena (the tail), or 256 bytes
//     when the tail covers it; it fails when the missing bytes exceed the
//     memory left under the cap, and is cut to that memory otherwise;
//     ContiguousSubAllocator::Alloc rounds it up to the granularity. The
//     0.9x back-off of Extend runs only when the sub-allocator refuses
//     (the headroom check), which the model's cap never does.
//   * The initial region (Options::initial_region_bytes, from
//     XLA_PYTHON_CLIENT_MEM_FRACTION, allocated in full on the first
//     request) is the user's choice; the model gives it the increment, the
//     smallest a user would pick and the most favourable to XLA's memory
//     figures (a region of the whole cap would make it BFC over one
//     region, which the growth reaches anyway).
//   * Chunks coalesce across extension boundaries: the sub-allocator
//     supports coalescing, so Extend extends the one region and links the
//     new chunk after its last (AddOrExtendAllocationRegion, TryToCoalesce),
//     unlike the separate cudaMalloc regions of classic BFC, which never
//     merge.
//   * Only the default memory space S(0) is replayed (traces hold no
//     collective S(1) buffers), so the shared gap and its reserve
//     (XLA_PJRT_GPU_BFC_COLLECTIVE_GAP_RESERVE_BYTES, 0 by default) do not
//     arise. The doc's "descending equal-size hole selection" for S(0)
//     breaks ties between free chunks of the same size by address; the
//     model keeps BFC's lowest-address tie break (chunks of the same size,
//     so the same bytes are used either way).
#include <algorithm>
#include <memory>

#include "cc/replay/bfc.h"

namespace jaxlake::replay {

namespace {

class BfcGrowthPolicy final : public BfcPolicy {
 public:
  explicit BfcGrowthPolicy(const PolicyOptions& o)
      : BfcPolicy(o),
        granularity_(o.granularity),
        cap_(o.capacity / o.granularity * o.granularity),
        increment_(std::max(o.bfc_growth_increment, o.granularity)) {}

  const char* name() const override { return "bfc-growth"; }

 private:
  bool extend(std::size_t rounded) override {
    // Tail space: a free chunk at the end of the mapped prefix.
    std::size_t tail_free = 0;
    if (tail_ >= 0 && !chunks_[tail_].in_use) tail_free = chunks_[tail_].size;
    const std::size_t missing = rounded - std::min(rounded, tail_free);
    const std::size_t need = RoundUp(missing, granularity_);
    const std::size_t available = cap_ - mapped_;
    if (need > available) return false;
    std::size_t bytes = increment_;
    while (bytes < missing) bytes *= 2;
    bytes = std::min(RoundUp(bytes, granularity_), available);
    if (base_ == 0) {
      base_ = device_.reserve_va(cap_);
      device_.count(vmm::Call::reserve, 1, cap_);
    }
    device_.count(vmm::Call::create, 1, bytes);
    if (!device_.take(bytes)) return false;  // cannot happen: under the cap
    device_.count(vmm::Call::map, 1, bytes);
    device_.count(vmm::Call::set_access, 1, bytes);
    const std::int32_t c = new_chunk();
    chunks_[c].ptr = base_ + mapped_;
    chunks_[c].size = bytes;
    mapped_ += bytes;
    ++regions_;  // counted as extensions
    region_bytes_ += bytes;
    if (tail_ >= 0) {
      chunks_[c].prev = tail_;
      chunks_[tail_].next = c;
    }
    const std::int32_t old_tail = tail_;
    tail_ = c;
    if (old_tail >= 0 && !chunks_[old_tail].in_use) {
      erase_free(old_tail);
      merge(old_tail, c);  // tail_ becomes old_tail
      insert_free(old_tail);
    } else {
      insert_free(c);
    }
    return true;
  }

  std::size_t granularity_;
  std::size_t cap_;
  std::size_t increment_;
  std::uintptr_t base_ = 0;
  std::size_t mapped_ = 0;
};

}  // namespace

std::unique_ptr<Policy> MakeBfcGrowthPolicy(const PolicyOptions& o) {
  return std::make_unique<BfcGrowthPolicy>(o);
}

}  // namespace jaxlake::replay
