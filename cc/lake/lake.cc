// jaxlake: the stitching allocator. See lake.h for the policy and
// docs/design.md for the data structures and their invariants.
#include "cc/lake/lake.h"

#include "cc/lake/lake_impl.h"

namespace jaxlake {

const char* AllocStateName(AllocState s) {
  switch (s) {
#define JAXLAKE_X(name) \
  case AllocState::name: \
    return #name;
    JAXLAKE_ALLOC_STATES(JAXLAKE_X)
#undef JAXLAKE_X
  }
  return "unknown";
}

std::string ValidateOptions(const LakeOptions& o, const vmm::Driver& driver) {
  const std::size_t gran = driver.granularity();
  std::ostringstream err;
  if (o.capacity != 0 && o.capacity < gran) {
    err << "capacity " << o.capacity << " is below one chunk (" << gran
        << " bytes): expected 0 (the whole device) or at least " << gran;
  } else if (!IsPow2(o.alignment) || o.alignment < 256 ||
             o.alignment > gran) {
    err << "alignment " << o.alignment
        << " is invalid: expected a power of two between 256 and " << gran;
  } else if (o.small_slab != 0 && o.small_slab % gran != 0) {
    err << "small_slab " << o.small_slab
        << " is invalid: expected 0 or a multiple of the granularity "
        << gran;
  } else if (o.small_slab >
             (o.capacity != 0 ? o.capacity : driver.total_memory())) {
    err << "small_slab " << o.small_slab << " exceeds the capacity ("
        << (o.capacity != 0 ? o.capacity : driver.total_memory())
        << " bytes): expected 0 or a multiple of the granularity at most "
           "the capacity";
  } else if (o.small_limit > (o.small_slab ? o.small_slab : gran)) {
    err << "small_limit " << o.small_limit
        << " is larger than one small slab ("
        << (o.small_slab ? o.small_slab : gran) << " bytes)";
  }
  return err.str();
}

// ---------------------------------------------------------------------------
// The allocation order (lake.h). A large request tries, in order:
//   fit or split  FindFit, ClaimPrimary (arena.cc): best fit in a free block
//   stitch reuse  TryReuse (stitch.cc): a cached stitched range
//   stitch        TryStitch (stitch.cc): stitch free chunks into a range
//   stitch grow   TryStitch: the same, with a new segment for the shortfall
//   grow          ClaimPrimary: a new segment
//   reclaim       WithReclaim (lake_impl.h; its steps in stream_clock.cc
//                 and reclaim.cc), around all of the above
//   wide stitch   TryStitch with its ends looked for among every free
//                 block: the last try before out of memory (allocate)
// Small requests go to the small pool (small_pool.cc).

// One pass of the large-request states for n units. kOutOfMemory:
// nothing fit.
Status Lake::Impl::LargeOnce(MutexLock& lk, std::uint64_t n,
                             Stream s, std::size_t size, std::uintptr_t* addr,
                             AllocState* state) {
  FreeKey fit;
  bool found = false;
  if (n >= kRegionFitChunks * chunk_units && opt.stitch &&
      size >= opt.stitch_min) {
    // A request of several chunks: best fit over free runs as well as
    // blocks, so that consecutive requests pack into one run as in a
    // single growing region.
    std::uint64_t seg = 0, start = 0;
    switch (FindRegionFit(n, s, &fit, &seg, &start)) {
      case RegionFit::kRun: {
        // The run's first block may hold the request on its own.
        const std::uint64_t len = segs.at(seg).blocks.at(start).end - start;
        if (len >= n) {
          fit = FreeKey(len, seg, start);
          found = true;
          break;
        }
        Status r = ServeRun(lk, seg, start, n, s, size, addr, state);
        if (r != Status::kOutOfMemory) return r;
        found = FindFit(n, s, &fit);  // the run had too many pieces
        break;
      }
      case RegionFit::kBlock:
        found = true;
        break;
      case RegionFit::kNone:
        break;
    }
  } else {
    found = FindFit(n, s, &fit);
  }
  if (!found && TryReuse(n, s, size, addr)) {
    *state = AllocState::stitch_reuse;
    return Status::kOk;
  }
  // Before mapping or creating anything, see whether frees of other
  // streams have completed meanwhile (an event query each, no wait).
  if (!found && clock.Advance(s)) {
    Coalesce();
    FlushDeferredSmall();
    found = FindFit(n, s, &fit);
    if (!found && TryReuse(n, s, size, addr)) {
      *state = AllocState::stitch_reuse;
      return Status::kOk;
    }
  }
  if (!found) {
    Status r = TrySpan(lk, n, s, size, addr, state);
    if (r != Status::kOutOfMemory) return r;
    r = TryStitch(lk, n, s, size, addr, state);
    if (r != Status::kOutOfMemory) return r;
    r = TryEdgeGrow(lk, n, s, size, addr, state);
    if (r != Status::kOutOfMemory) return r;
  }
  std::uint64_t seg = 0, start = 0;
  Status r = ClaimPrimary(lk, n, s, BlockState::kLive, 0, &seg, &start,
                          state, found ? &fit : nullptr);
  if (r != Status::kOk) return r;
  Alloc a;
  a.size = size;
  a.rounded = std::size_t{n} * unit;
  a.stream = s;
  a.kind = Kind::kPrimary;
  a.seg = seg;
  a.start = start;
  *addr = segs.at(seg).va + std::size_t{start} * unit;
  OnAllocated(*addr, a, *state);
  return Status::kOk;
}

Lake::Lake(vmm::Driver& driver, const LakeOptions& options)
    : impl_(std::make_unique<Impl>(driver, options)) {
  assert(ValidateOptions(options, driver).empty());
}

Lake::~Lake() {
  Impl& m = *impl_;
  MutexLock lk(m.mu);
  // Memory whose last use is still queued on a stream is unmapped only
  // once that work ran (vllm#45552): wait for the pending frees' events.
  m.WaitStreams(lk);
  std::vector<std::uint64_t> ids;
  for (const auto& [id, r] : m.stitches.ranges()) ids.push_back(id);
  for (std::uint64_t id : ids) m.DropStitched(lk, id);
  for (auto [id, seg] : m.segs) {
    const std::size_t bytes = std::size_t{seg.nchunks} * m.gran;
    Unreleased u;
    u.maps.emplace_back(seg.va, bytes);
    u.handle = seg.handle;
    u.phys = bytes;
    if (m.Teardown(u, nullptr) != Status::kOk) m.Keep(std::move(u));
  }
  m.segs.clear();
  m.seg_by_va.clear();
  // The growth ranges' reservations, once their segments are unmapped.
  for (const auto& [va, g] : m.ranges) {
    Unreleased u;
    u.va = va;
    u.va_bytes = g.bytes;
    if (m.Teardown(u, nullptr) != Status::kOk) m.Keep(std::move(u));
  }
  m.ranges.clear();
  m.current_range = 0;
  // What failed before, and just now, is retried twice more; what still
  // fails is lost (the lake is gone).
  for (int attempt = 0; attempt < 2; ++attempt)
    for (Unreleased& u : m.unreleased)
      if (!u.done()) m.Teardown(u, nullptr);
  m.clock.DestroyEvents();
}

Status Lake::allocate(std::size_t nbytes, Stream stream,
                      std::uintptr_t* address, AllocState* state) {
  Impl& m = *impl_;
  AllocState dummy;
  if (!state) state = &dummy;
  if (nbytes == 0 || address == nullptr) return Status::kInvalidValue;
  MutexLock lk(m.mu);
  if (m.restart_pending) m.Restart(lk);
  Status r;
  if (nbytes <= m.opt.small_limit) {
    r = m.Small(lk, nbytes, stream, address);
    if (r == Status::kOk) *state = AllocState::small;
  } else {
    if (nbytes > m.max_request) {  // more whole chunks than the capacity
      r = Status::kOutOfMemory;
    } else {
      const auto n =
          static_cast<std::uint64_t>((nbytes + m.unit - 1) >> m.unit_shift);
      r = m.WithReclaim(lk, [&] {
        m.mu.AssertHeld();
        return m.LargeOnce(lk, n, stream, nbytes, address, state);
      });
      // The last try: a stitch whose ends are looked for among every free
      // block, not only the first candidates of each kind.
      if (r == Status::kOutOfMemory)
        r = m.TryStitch(lk, n, stream, nbytes, address, state, /*wide=*/true);
    }
  }
  if (r == Status::kOutOfMemory) {
    ++m.st.ooms;
    m.last_error = "out of memory allocating " + Bytes(nbytes) + " (" +
                   std::to_string(nbytes) + " bytes) on stream " +
                   std::to_string(stream) + ": " + m.Describe();
  } else if (r != Status::kOk) {
    m.last_error = std::string("driver error ") + vmm::StatusName(r) +
                   " allocating " + std::to_string(nbytes) + " bytes: " +
                   m.Describe();
  }
  m.DebugCheck();
  return r;
}

Status Lake::free(std::uintptr_t address, Stream stream) {
  Impl& m = *impl_;
  MutexLock lk(m.mu);
  LiveTable::Entry* it = m.live.find(address);
  if (it == nullptr) return Status::kInvalidValue;
  const Alloc a = it->second;
  m.live.erase(it);
  m.st.bytes_in_use.add(-static_cast<std::int64_t>(a.size));
  m.st.bytes_in_use_rounded.add(-static_cast<std::int64_t>(a.rounded));
  m.st.live_allocations.add(-1);
  ++m.st.frees;
  m.freed_since_growth = true;
  m.Record(false, address, a.size, stream, AllocState::small);
  switch (a.kind) {
    case Kind::kSmall:
      m.FreeSmall(address, a, stream);
      break;
    case Kind::kPrimary:
      m.MakeFree(a.seg, a.start, m.clock.FreeTag(stream));
      break;
    case Kind::kStitched: {
      const Tag tag = m.clock.FreeTag(stream);
      Stitched& r = m.stitches.at(a.owner);
      std::vector<Piece> used;
      Impl::ForUsed(r, r.used, [&](std::uint64_t seg, std::uint64_t start,
                                   std::uint64_t k) {
        used.push_back(Piece{seg, start, k});
      });
      r.used = 0;
      r.tag = tag;
      if (r.alias) {
        // Nothing is mapped for it: it is not cached but dropped at once
        // (its units go back to their segments' blocks, where a fit or a
        // span finds them again), and pins no segment.
        m.StitchRefs(r, -1);
        m.st.stitched_bytes.add(
            -static_cast<std::int64_t>(std::size_t{r.nunits} * m.unit));
        m.stitches.Erase(a.owner);
        for (const Piece& p : used) m.MakeFree(p.seg, p.start, tag);
        break;
      }
      m.stitches.Cache(a.owner);
      for (const Piece& p : used) m.MakeFree(p.seg, p.start, tag);
      m.TrimCache(lk, m.opt.stitch_cache);
      break;
    }
  }
  // The last live allocation freed after the lake came within 1/16 of its
  // capacity: the segments it holds are laid out for the order of what
  // came before, and a repeated run, best-fitting into them, can need more
  // than a fresh lake would. The next allocation starts over (Restart).
  // One segment (a preallocation) is no such layout and is kept.
  if (m.st.live_allocations.current == 0 && m.st.segments.current > 1 &&
      (m.capacity - std::min(m.capacity, m.held_high)) * 16 < m.held_high)
    m.restart_pending = true;
  m.DebugCheck();
  return Status::kOk;
}

std::size_t Lake::allocation_size(std::uintptr_t address) const {
  MutexLock lk(impl_->mu);
  const LiveTable::Entry* it = impl_->live.find(address);
  return it == nullptr ? 0 : it->second.size;
}

Stats Lake::stats() const {
  MutexLock lk(impl_->mu);
  Stats s = impl_->st;
  s.driver_calls = impl_->drv.calls();
  return s;
}

std::vector<TraceEvent> Lake::trace() const {
  MutexLock lk(impl_->mu);
  return impl_->trace;
}

std::string Lake::last_error() const {
  MutexLock lk(impl_->mu);
  return impl_->last_error;
}

const LakeOptions& Lake::options() const { return impl_->opt; }

std::size_t Lake::granularity() const { return impl_->gran; }

std::size_t Lake::capacity() const { return impl_->capacity; }

vmm::Driver& Lake::driver() const { return impl_->drv; }

}  // namespace jaxlake
