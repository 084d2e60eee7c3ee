// jaxlake: free runs across back-to-back segments. Segments lie back to
// back in a growth range (docs/design.md, "Growth"), so the free last block
// of one segment, any wholly free segments after it and the free first
// block of the next one are one run of contiguous addresses. Each segment
// keeps its own blocks; a request served from such a run is an alias
// stitched range over the run's chunks: nothing is reserved or mapped for
// it, its units are lent to it in every segment it covers, and its
// stitch_refs keep those segments from being released under it.
#include "cc/lake/lake_impl.h"

namespace jaxlake {

std::uint64_t Lake::Impl::NextInRange(std::uint64_t seg_id) const {
  const Segment& seg = segs.at(seg_id);
  if (seg.range == 0) return 0;
  auto it = seg_by_va.find(EndOf(seg));
  if (it == seg_by_va.end()) return 0;
  return segs.at(it->second).range == seg.range ? it->second : 0;
}

std::uint64_t Lake::Impl::PrevInRange(std::uint64_t seg_id) const {
  const Segment& seg = segs.at(seg_id);
  if (seg.range == 0) return 0;
  auto it = seg_by_va.find(seg.va);
  assert(it != seg_by_va.end());
  if (it == seg_by_va.begin()) return 0;
  const std::uint64_t prev = std::prev(it)->second;
  const Segment& p = segs.at(prev);
  return p.range == seg.range && EndOf(p) == seg.va ? prev : 0;
}

bool Lake::Impl::LastFree(std::uint64_t seg_id, Stream s,
                          std::uint64_t* start) const {
  const Segment& seg = segs.at(seg_id);
  const auto& [at, b] = *seg.blocks.rbegin();
  if (b.state != BlockState::kFree || !clock.Usable(b.tag, s)) return false;
  *start = at;
  return true;
}

bool Lake::Impl::PrevEndsFree(std::uint64_t seg_id, Stream s) const {
  const std::uint64_t prev = PrevInRange(seg_id);
  std::uint64_t at = 0;
  return prev != 0 && LastFree(prev, s, &at);
}

bool Lake::Impl::FirstFree(std::uint64_t seg_id, Stream s,
                           std::uint64_t* end) const {
  const Block& b = segs.at(seg_id).blocks.begin()->second;
  if (b.state != BlockState::kFree || !clock.Usable(b.tag, s)) return false;
  *end = b.end;
  return true;
}

std::uint64_t Lake::Impl::PlanRun(std::uint64_t seg_id, std::uint64_t start,
                                  std::uint64_t n, Stream s,
                                  std::vector<Piece>* plan,
                                  std::uint64_t* lead) const {
  const std::uint64_t first = ChunkDown(start);
  const std::uint64_t seg_end = segs.at(seg_id).nchunks * chunk_units;
  plan->push_back(Piece{seg_id, first, seg_end - first});
  *lead = start - first;
  std::uint64_t got = seg_end - start;
  for (std::uint64_t cur = seg_id; got < n;) {
    const std::uint64_t next = NextInRange(cur);
    std::uint64_t end = 0;
    if (next == 0 || !FirstFree(next, s, &end)) break;
    const std::uint64_t whole = segs.at(next).nchunks * chunk_units;
    const std::uint64_t k = std::min(n - got, end);
    plan->push_back(Piece{next, 0, k == whole ? whole : ChunkUp(k)});
    got += k;
    if (end != whole) break;  // the run ends inside this segment
    cur = next;
  }
  return got;
}

bool Lake::Impl::FindSpan(std::uint64_t n, Stream s, std::uint64_t* seg_out,
                          std::uint64_t* start_out,
                          std::uint64_t* len_out) {
  // Every maximal run starts in the free last block of a segment
  // (open_ends, in address order) and goes on across wholly free segments
  // to the free first block of a later one.
  bool found = false;
  std::uint64_t best = 0;
  for (auto it = open_ends.begin(); it != open_ends.end();) {
    const std::uint64_t id = it->second;
    Segment& last = segs.at(id);
    if (last.blocks.rbegin()->second.state != BlockState::kFree) {
      last.open_end = false;  // its last block was taken since
      it = open_ends.erase(it);
      continue;
    }
    ++it;
    std::uint64_t start = 0;
    if (!LastFree(id, s, &start)) continue;
    const Segment& seg = last;
    // A wholly free segment right after another free end lies inside the
    // run that starts there.
    if (start == 0 && PrevEndsFree(id, s)) continue;
    std::uint64_t len = seg.nchunks * chunk_units - start;
    std::uint64_t nsegs = 1;
    for (std::uint64_t cur = id;;) {
      const std::uint64_t next = NextInRange(cur);
      std::uint64_t end = 0;
      if (next == 0 || !FirstFree(next, s, &end)) break;
      len += end;
      ++nsegs;
      if (end != segs.at(next).nchunks * chunk_units) break;
      cur = next;
    }
    if (nsegs >= 2 && len >= n && (!found || len < best)) {
      found = true;
      best = len;
      if (len_out != nullptr) *len_out = len;
      *seg_out = id;
      *start_out = start;
    }
  }
  return found;
}

bool Lake::Impl::InRun(std::uint64_t seg_id, std::uint64_t start,
                        std::uint64_t len, Stream s) const {
  const Segment& seg = segs.at(seg_id);
  if (seg.range == 0) return false;
  std::uint64_t at = 0;
  if (start + len == seg.nchunks * chunk_units) {
    const std::uint64_t next = NextInRange(seg_id);
    if (next != 0 && FirstFree(next, s, &at)) return true;
  }
  return start == 0 && PrevEndsFree(seg_id, s);
}

Lake::Impl::RegionFit Lake::Impl::FindRegionFit(
    std::uint64_t n, Stream s, FreeKey* fit, std::uint64_t* seg_out,
    std::uint64_t* start_out) {
  // The smallest single block that is not part of a run, and the smallest
  // run (FindSpan, a pass over the free segment ends). Once kRunSkips
  // blocks that fit were passed over as parts of runs, the smallest run is
  // looked at: when it is shorter than the block reached, no single block
  // left can beat it, and the scan stops there.
  bool single = false, looked = false, run = false;
  std::uint64_t run_len = 0;
  int skipped = 0;
  for (auto it = free_index.lower_bound(FreeKey(n, 0, 0));
       it != free_index.end(); ++it) {
    const auto [len, seg_id, start] = *it;
    if (!clock.Usable(segs.at(seg_id).blocks.at(start).tag, s)) continue;
    if (!InRun(seg_id, start, len, s)) {
      *fit = *it;
      single = true;
      break;
    }
    if (++skipped == kRunSkips) {
      looked = true;
      run = FindSpan(n, s, seg_out, start_out, &run_len);
      if (run && run_len < len) return RegionFit::kRun;
    }
  }
  // No run is smaller than an exact fit.
  if (single && std::get<0>(*fit) == n) return RegionFit::kBlock;
  if (!looked) run = FindSpan(n, s, seg_out, start_out, &run_len);
  if (run && (!single || run_len < std::get<0>(*fit))) return RegionFit::kRun;
  return single ? RegionFit::kBlock : RegionFit::kNone;
}

bool Lake::Impl::EdgeRun(Stream s, std::uint64_t* seg_out,
                         std::uint64_t* start_out) const {
  if (current_range == 0) return false;
  const std::uintptr_t edge = current_range + ranges.at(current_range).next;
  auto it = seg_by_va.lower_bound(edge);
  if (it == seg_by_va.begin()) return false;
  --it;
  std::uint64_t id = it->second;
  const Segment& last = segs.at(id);
  if (last.range != current_range || EndOf(last) != edge)
    return false;  // a growth in progress holds the edge
  std::uint64_t start = 0;
  if (!LastFree(id, s, &start)) return false;
  // Walk back over wholly free segments that lie right before it.
  while (start == 0) {
    const std::uint64_t prev = PrevInRange(id);
    std::uint64_t ps = 0;
    if (prev == 0 || !LastFree(prev, s, &ps)) break;
    id = prev;
    start = ps;
  }
  *seg_out = id;
  *start_out = start;
  return true;
}

// A request that no single free block fits, served from a free run that
// crosses segment boundaries: no driver call.
Status Lake::Impl::TrySpan(MutexLock& lk, std::uint64_t n,
                           Stream s, std::size_t size, std::uintptr_t* addr,
                           AllocState* state) {
  if (!opt.stitch || size < opt.stitch_min) return Status::kOutOfMemory;
  std::uint64_t seg = 0, start = 0;
  if (!FindSpan(n, s, &seg, &start)) return Status::kOutOfMemory;
  return ServeRun(lk, seg, start, n, s, size, addr, state);
}

// Serves n units from the free run that starts at unit `start` of seg_id
// and goes on across the back-to-back segments after it, as an alias; no
// driver call. The caller has found the run to hold n units; kOutOfMemory
// when it needs more pieces than max_pieces (nothing changed).
Status Lake::Impl::ServeRun(MutexLock& lk,
                            std::uint64_t seg_id, std::uint64_t start,
                            std::uint64_t n, Stream s, std::size_t size,
                            std::uintptr_t* addr, AllocState* state) {
  std::vector<Piece> plan;
  std::uint64_t lead = 0;
  const std::uint64_t got = PlanRun(seg_id, start, n, s, &plan, &lead);
  assert(got >= n);
  if (opt.max_pieces && plan.size() > opt.max_pieces)
    return Status::kOutOfMemory;
  return StitchPlan(lk, std::move(plan), lead, got, n, s, size, addr, state,
                    /*grow_ahead=*/false);
}

// A growth that starts in the free run at the growth edge: the new segment
// is placed right after it, so run + new segment are one contiguous range
// (an alias), and the free space stays in one piece at the edge, as in a
// single growing region. The new segment is sized as a growth.
Status Lake::Impl::TryEdgeGrow(MutexLock& lk,
                               std::uint64_t n, Stream s, std::size_t size,
                               std::uintptr_t* addr, AllocState* state) {
  if (!opt.stitch || size < opt.stitch_min) return Status::kOutOfMemory;
  std::uint64_t seg = 0, start = 0;
  if (!EdgeRun(s, &seg, &start)) return Status::kOutOfMemory;
  std::vector<Piece> plan;
  std::uint64_t lead = 0;
  const std::uint64_t got = PlanRun(seg, start, n, s, &plan, &lead);
  if (got >= n) return Status::kOutOfMemory;  // FindFit/FindSpan's case
  // Only when the run saves a chunk of the growth. Taking it always (a
  // bump allocator's packing) moves later requests off chunk boundaries,
  // and once they are freed their chunks are split between free and live
  // units that a stitch cannot take (docs/experiments/lake_changes.md,
  // "The edge run for every growth").
  if (ChunkUp(n - got) == ChunkUp(n)) return Status::kOutOfMemory;
  if (opt.max_pieces && plan.size() + 1 > opt.max_pieces)
    return Status::kOutOfMemory;
  // The new segment must land right after the run: the current range
  // needs room for it (else a plain growth starts a new range).
  const GrowthRange& g = ranges.at(current_range);
  const std::uint64_t room = (g.bytes - g.next) / gran;
  if (room < ChunkUp(n - got) / chunk_units) return Status::kOutOfMemory;
  return StitchPlan(lk, std::move(plan), lead, got, n, s, size, addr, state,
                    /*grow_ahead=*/true, room);
}

}  // namespace jaxlake
