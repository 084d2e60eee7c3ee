// jaxlake: the segment and block arena: blocks, gauges, segments, best fit.
#include "cc/lake/lake_impl.h"

namespace jaxlake {

// Marks [start, start+n) of segment `seg`, which must lie inside one free
// block, with `state`/`owner`. The rest of that free block stays free.
void Lake::Impl::Carve(std::uint64_t seg_id, std::uint64_t start,
                       std::uint64_t n, BlockState state, std::uint64_t owner) {
  Segment& seg = segs.at(seg_id);
  auto it = std::prev(seg.blocks.upper_bound(start));
  const std::uint64_t bstart = it->first;
  const Block b = it->second;
  assert(b.state == BlockState::kFree && b.end >= start + n);
  IndexRemove(seg_id, bstart, b);
  // The free block's node becomes the left part, or the carved block
  // itself when it starts there (no node is freed and made again).
  auto hint = std::next(it);
  if (bstart < start) {
    it->second.end = start;
    IndexAdd(seg_id, bstart, it->second);
    it = seg.blocks.emplace_hint(hint, start, Block{});
  }
  Block& mid = it->second;
  mid.end = start + n;
  mid.state = state;
  mid.owner = owner;
  mid.tag = b.tag;
  if (start + n < b.end) {
    auto r = seg.blocks.emplace_hint(hint, start + n, b);
    IndexAdd(seg_id, start + n, r->second);
  }
}

// Two free neighbours merge when they share a stream or one of them is
// safe for everyone; the merged block keeps the tag that still matters.
bool Lake::Impl::MergeTags(const Tag& a, const Tag& b, Tag* out) const {
  if (a.stream == b.stream) {
    *out = a.seq >= b.seq ? a : b;
    return true;
  }
  if (clock.Safe(a)) {
    *out = b;
    return true;
  }
  if (clock.Safe(b)) {
    *out = a;
    return true;
  }
  return false;
}

// Makes [start, end) of a segment a free block with `tag`, merging with
// free neighbours where allowed.
void Lake::Impl::MakeFree(std::uint64_t seg_id, std::uint64_t start, Tag tag) {
  ++changes;
  Segment& seg = segs.at(seg_id);
  auto it = seg.blocks.find(start);
  assert(it != seg.blocks.end());
  it->second.state = BlockState::kFree;
  it->second.owner = 0;
  it->second.tag = tag;
  // Merge with the right neighbour.
  auto next = std::next(it);
  Tag merged;
  if (next != seg.blocks.end() && next->second.state == BlockState::kFree &&
      MergeTags(it->second.tag, next->second.tag, &merged)) {
    IndexRemove(seg_id, next->first, next->second);
    it->second.end = next->second.end;
    it->second.tag = merged;
    seg.blocks.erase(next);
  }
  // Merge with the left neighbour.
  if (it != seg.blocks.begin()) {
    auto prev = std::prev(it);
    if (prev->second.state == BlockState::kFree &&
        MergeTags(prev->second.tag, it->second.tag, &merged)) {
      IndexRemove(seg_id, prev->first, prev->second);
      prev->second.end = it->second.end;
      prev->second.tag = merged;
      seg.blocks.erase(it);
      it = prev;
    }
  }
  IndexAdd(seg_id, it->first, it->second);
}

// Merges free neighbours that were kept apart by pending events.
void Lake::Impl::Coalesce() {
  for (auto [id, seg] : segs) {
    for (auto it = seg.blocks.begin(); it != seg.blocks.end();) {
      auto next = std::next(it);
      Tag merged;
      if (next != seg.blocks.end() && it->second.state == BlockState::kFree &&
          next->second.state == BlockState::kFree &&
          MergeTags(it->second.tag, next->second.tag, &merged)) {
        IndexRemove(id, it->first, it->second);
        IndexRemove(id, next->first, next->second);
        it->second.end = next->second.end;
        it->second.tag = merged;
        seg.blocks.erase(next);
        IndexAdd(id, it->first, it->second);
        continue;  // try to merge further right
      }
      it = next;
    }
  }
}

// True when [start, start+n) of a segment lies in one free block usable by
// stream s.
bool Lake::Impl::RangeFree(std::uint64_t seg_id, std::uint64_t start,
                           std::uint64_t n, Stream s) const {
  const Segment* found = segs.find(seg_id);
  if (found == nullptr) return false;
  const Segment& seg = *found;
  auto it = seg.blocks.upper_bound(start);
  if (it == seg.blocks.begin()) return false;
  --it;
  const Block& b = it->second;
  return b.state == BlockState::kFree && b.end >= start + n &&
         clock.Usable(b.tag, s);
}

void Lake::Impl::RecordEvent(bool allocate, std::uintptr_t addr,
                             std::size_t size, Stream s, AllocState state) {
  auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                std::chrono::steady_clock::now() - t0)
                .count();
  trace.push_back(TraceEvent{static_cast<std::uint64_t>(ns), allocate, addr,
                             size, s, state});
}

void Lake::Impl::OnAllocated(std::uintptr_t addr, const Alloc& a,
                             AllocState state) {
  live.insert(addr, a);
  st.bytes_in_use.add(static_cast<std::int64_t>(a.size));
  st.bytes_in_use_rounded.add(static_cast<std::int64_t>(a.rounded));
  st.live_allocations.add(1);
  ++st.allocs;
  switch (state) {
#define JAXLAKE_X(name)  \
case AllocState::name: \
  ++st.alloc_##name;   \
  break;
    JAXLAKE_ALLOC_STATES(JAXLAKE_X)
#undef JAXLAKE_X
  }
  Record(true, addr, a.size, a.stream, state);
}

// Creates a segment of n chunks (lock released during driver calls).
// Capacity must have been claimed in pending_bytes by the caller. Its VA
// is the next free stretch of the current growth range, claimed before
// the lock is released so that concurrent growths get adjacent stretches;
// when the range has no room left, a new range is reserved (lock
// released) and becomes the current one.
Status Lake::Impl::CreateSegment(MutexLock& lk,
                                 std::uint64_t n, std::uint64_t* seg_out) {
  const std::size_t bytes = std::size_t{n} * gran;
  std::uintptr_t base = 0, va = 0;
  if (current_range != 0) {
    GrowthRange& g = ranges.at(current_range);
    if (g.bytes - g.next >= bytes) {
      base = current_range;
      va = base + g.next;
      g.next += bytes;
      ++g.segments;
    }
  }
  const bool fresh = va == 0;
  const std::size_t range_bytes = fresh ? RangeBytes(bytes) : 0;
  Unlock(lk);
  Handle h = 0;
  Status s = Status::kOk;
  Unreleased undo;  // what a failure must give back
  if (fresh) {
    s = drv.reserve(range_bytes, &va);
    if (s == Status::kOk) {
      base = va;
      undo.va = va;
      undo.va_bytes = range_bytes;
    }
  }
  Status us = Status::kOk;
  if (s == Status::kOk) {
    s = drv.create(bytes, &h);
    if (s == Status::kOk) {
      undo.handle = h;
      undo.phys = bytes;
      s = drv.map(va, bytes, 0, h);
      if (s == Status::kOk) {
        undo.maps.emplace_back(va, bytes);
        s = drv.set_access(va, bytes);
      }
    }
    if (s != Status::kOk) us = Teardown(undo, nullptr);
  }
  Relock(lk);
  pending_bytes -= bytes;
  ++creations;
  created.notify_all();
  if (s != Status::kOk && !fresh) {
    // Give the stretch back when nothing was placed after it meanwhile;
    // an emptied range stays current (ReleaseFreeSegments frees it).
    GrowthRange& g = ranges.at(base);
    --g.segments;
    if (g.next == va - base + bytes) g.next -= bytes;
  }
  if (s == Status::kOk && fresh) {
    GrowthRange g;
    g.bytes = range_bytes;
    g.next = bytes;
    g.segments = 1;
    ranges.emplace(base, g);
    // The range with more room left takes the next growths.
    if (current_range == 0 ||
        ranges.at(current_range).bytes - ranges.at(current_range).next <
            range_bytes - bytes)
      current_range = base;
  }
  if (s != Status::kOk) {
    ++changes;  // the claimed capacity is free again
    if (s != Status::kOutOfMemory) ++st.driver_errors;
    if (us != Status::kOk) {
      ++st.driver_errors;
      Keep(std::move(undo));
    }
    return s;
  }
  const auto [id, added] = segs.add(&nodes);
  Segment& seg = *added;
  seg.handle = h;
  seg.va = va;
  seg.nchunks = n;
  seg.range = base;
  seg_by_va.emplace(va, id);
  Block b;
  b.end = n * chunk_units;
  IndexAdd(id, 0, seg.blocks.emplace(0, b).first->second);
  st.bytes_reserved.add(static_cast<std::int64_t>(bytes));
  held_high = std::max(held_high,
                       static_cast<std::size_t>(st.bytes_reserved.current));
  st.segments.add(1);
  *seg_out = id;
  return Status::kOk;
}

// Claims capacity for n new chunks; false if the capacity forbids it.
// Memory the driver failed to release still counts against it.
std::size_t Lake::Impl::HeldBytes() const {
  return static_cast<std::size_t>(st.bytes_reserved.current) + pending_bytes +
         releasing_bytes +
         static_cast<std::size_t>(st.bytes_unreleased.current);
}

bool Lake::Impl::ClaimCapacity(std::uint64_t n) {
  const std::size_t bytes = std::size_t{n} * gran;
  const std::size_t held = HeldBytes();
  if (n > capacity / gran || held + bytes > capacity) return false;
  pending_bytes += bytes;
  freed_since_growth = false;
  return true;
}

// Claims capacity for a growth that needs `need` chunks: a larger segment
// where the capacity left allows it (at least grow_min bytes; while nothing
// was freed since the last growth, at least 1/kGrowAhead of what the lake
// holds; the whole capacity at a preallocating lake's first growth; at
// most `most`), else `need`. The share is for a program building its
// state, whose allocations only grow; once frees come between growths (a
// step's transient buffers) a growth is a new high that the next step
// repeats, and a share would stay unused at the peak (uncapped U paid up
// to 1/16: docs/experiments/holdout_changes.md).
// Returns the chunks claimed, 0 when the capacity forbids even `need`.
std::uint64_t Lake::Impl::ClaimGrowth(std::uint64_t need, std::uint64_t most) {
  std::uint64_t want = std::max<std::uint64_t>(
      opt.grow_min / gran,
      freed_since_growth ? 0 : HeldBytes() / gran / kGrowAhead);
  if (prealloc_pending) {  // the first growth of a preallocating lake
    prealloc_pending = false;
    want = std::max<std::uint64_t>(want, capacity / gran);
  }
  if (want > need) {
    const std::size_t held = HeldBytes();
    const std::uint64_t left = held < capacity ? (capacity - held) / gran : 0;
    const std::uint64_t bigger = std::min({want, left, most});
    if (bigger > need && ClaimCapacity(bigger)) return bigger;
  }
  return ClaimCapacity(need) ? need : 0;
}

// A free block of >= n chunks usable by stream s (best fit), or false.
bool Lake::Impl::FindFit(std::uint64_t n, Stream s, FreeKey* out) const {
  auto it = free_index.lower_bound(FreeKey(n, 0, 0));
  if (clock.OnlyStream(s)) {  // every free block is usable: no tag to look at
    if (it == free_index.end()) return false;
    *out = *it;
    return true;
  }
  for (; it != free_index.end(); ++it) {
    const auto [len, seg_id, start] = *it;
    if (clock.Usable(segs.at(seg_id).blocks.at(start).tag, s)) {
      *out = *it;
      return true;
    }
  }
  return false;
}

// Claims n units of one primary block for `state`/`owner`: best fit, else
// a new segment of whole chunks (the rest of its last chunk stays free).
// kOutOfMemory when neither is possible; *how tells which.
// `found`: a fit the caller already found (FindFit), if any.
Status Lake::Impl::ClaimPrimary(MutexLock& lk,
                                std::uint64_t n, Stream s, BlockState state,
                                std::uint64_t owner, std::uint64_t* seg_out,
                                std::uint64_t* start_out, AllocState* how,
                                const FreeKey* found) {
  FreeKey fit;
  if (found != nullptr ? (fit = *found, true) : FindFit(n, s, &fit)) {
    const auto [len, seg_id, start] = fit;
    // A free block that starts its segment and ends inside the first chunk
    // (the head a growth leaves, below) is carved from its end: what stays
    // free is still a head, where carving from its start would leave free
    // units between two live ones, which no stitch can take.
    const std::uint64_t at =
        start == 0 && len > n && len < chunk_units ? len - n : start;
    Carve(seg_id, at, n, state, owner);
    *seg_out = seg_id;
    *start_out = at;
    *how = len == n ? AllocState::fit : AllocState::split;
    return Status::kOk;
  }
  const std::uint64_t need = ChunkUp(n) / chunk_units;
  const std::uint64_t chunks = ClaimGrowth(need);
  if (chunks == 0) return Status::kOutOfMemory;
  Status cs = CreateSegment(lk, chunks, seg_out);
  // A segment larger than the request needs (a preallocation, a growth
  // share) that the driver refuses for lack of memory, as on a device that
  // other programs use too: the request's own chunks are tried instead.
  if (cs == Status::kOutOfMemory && chunks > need && ClaimCapacity(need))
    cs = CreateSegment(lk, need, seg_out);
  if (cs != Status::kOk) return cs;
  // A request of less than a chunk leaves the rest of its chunk free: after
  // it a tail, which can only lead a stitch, before it a head, which can
  // only end one. While a free tail is larger than every free head, the
  // request takes the chunk's end, so that a stitch can have both ends.
  const std::uint64_t at =
      segs.at(*seg_out).nchunks == 1 && n < chunk_units && TailOutgrowsHeads(s)
          ? chunk_units - n
          : 0;
  Carve(*seg_out, at, n, state, owner);
  *start_out = at;
  *how = AllocState::grow;
  return Status::kOk;
}

bool Lake::Impl::TailOutgrowsHeads(Stream s) const {
  // Among the largest free blocks of less than a chunk usable by s: a tail
  // ends at a chunk boundary and starts inside a chunk, a head the other
  // way round.
  std::uint64_t tail = 0, head = 0;
  int seen = 0;
  const bool all = clock.OnlyStream(s);
  for (auto it = std::make_reverse_iterator(
           free_index.lower_bound(FreeKey(chunk_units, 0, 0)));
       it != free_index.rend() && seen < kEndCandidates; ++it, ++seen) {
    const auto [len, seg_id, start] = *it;
    if (!all && !clock.Usable(segs.at(seg_id).blocks.at(start).tag, s))
      continue;
    const bool starts = start % chunk_units == 0;
    const bool ends = (start + len) % chunk_units == 0;
    if (ends && !starts) tail = std::max(tail, len);
    if (starts && !ends) head = std::max(head, len);
  }
  return tail > head;
}

void Lake::Impl::LeaveRange(const Segment& seg, std::uintptr_t* va,
                            std::size_t* va_bytes) {
  *va = 0;
  *va_bytes = 0;
  auto it = ranges.find(seg.range);
  assert(it != ranges.end() && it->second.segments > 0);
  if (--it->second.segments != 0) return;
  *va = it->first;
  *va_bytes = it->second.bytes;
  if (current_range == it->first) current_range = 0;
  ranges.erase(it);
}

bool Lake::Impl::BackToBack(const std::vector<Piece>& pieces) const {
  if (pieces.empty()) return false;
  const std::uintptr_t base = segs.at(pieces[0].seg).range;
  std::uintptr_t end = 0;
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    const Segment& seg = segs.at(pieces[i].seg);
    const std::uintptr_t at = seg.va + std::size_t{pieces[i].start} * unit;
    if (seg.range != base || (i > 0 && at != end)) return false;
    end = at + std::size_t{pieces[i].n} * unit;
  }
  return base != 0;
}

}  // namespace jaxlake
