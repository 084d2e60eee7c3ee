// jaxlake: stitching free chunks into ranges, and the cache of stitched ranges.
#include "cc/lake/lake_impl.h"

namespace jaxlake {

void Lake::Impl::StitchRefs(const Stitched& r, int delta) {
  std::set<std::uint64_t> seen;
  for (const Piece& p : r.pieces)
    if (seen.insert(p.seg).second)
      segs.at(p.seg).stitch_refs += static_cast<std::uint64_t>(delta);
}

// Unmaps a stitched range that is not in use (lock released meanwhile).
// A driver failure keeps what is left for a retry; kOk or that failure.
Status Lake::Impl::DropStitched(MutexLock& lk,
                                std::uint64_t id, const char** what) {
  stitches.Uncache(id);
  Stitched& r = stitches.at(id);
  if (r.alias) {  // nothing of its own is mapped: no driver call
    StitchRefs(r, -1);
    st.stitched_bytes.add(-static_cast<std::int64_t>(std::size_t{r.nunits} *
                                                      unit));
    ++st.stitch_evictions;
    stitches.Erase(id);
    ++changes;
    return Status::kOk;
  }
  r.dropping = true;
  Unreleased undo;
  undo.va = r.va;
  undo.va_bytes = std::size_t{r.nunits} * unit;
  // One unmap for the whole range: its pieces are adjacent mappings, and
  // the driver unmaps a run of whole mappings in one call (as NVIDIA's
  // multi-device sample frees stripes mapped one by one).
  undo.maps.emplace_back(r.va, undo.va_bytes);
  const std::size_t bytes = undo.va_bytes;
  Unlock(lk);
  const Status s = Teardown(undo, what);
  Relock(lk);
  Stitched& r2 = stitches.at(id);
  StitchRefs(r2, -1);
  st.stitched_bytes.add(-static_cast<std::int64_t>(bytes));
  ++st.stitch_evictions;
  stitches.Erase(id);
  ++changes;
  if (s != Status::kOk) {
    ++st.driver_errors;
    Keep(std::move(undo));
  }
  return s;
}

// Drops cached stitched ranges, oldest first, while `keep` is exceeded.
// A range is unmapped only once its last use is complete. Frees on one
// stream record no events by themselves, so when no cached range is known
// to be safe, the streams' events are advanced (recorded and queried,
// never waited for) once before giving up.
void Lake::Impl::TrimCache(MutexLock& lk, std::size_t keep,
                           Status* status, std::string* error) {
  bool advanced = false;
  while (stitches.cached() > keep) {
    const std::uint64_t victim = stitches.Oldest(
        [&](const Stitched& r) {
          mu.AssertHeld();
          return clock.Safe(r.tag);
        });
    if (victim == 0) {
      if (advanced || !clock.Advance()) return;  // all still in flight
      advanced = true;
      continue;
    }
    const char* what = "";
    const Status s = DropStitched(lk, victim, &what);
    if (s != Status::kOk) Report(s, what, status, error);
  }
}

Alloc Lake::Impl::StitchedAlloc(std::uint64_t id, std::size_t size,
                                Stream s) const {
  Alloc a;
  a.size = size;
  a.rounded = std::size_t{stitches.at(id).used} * unit;
  a.stream = s;
  a.kind = Kind::kStitched;
  a.owner = id;
  return a;
}

bool Lake::Impl::TryReuse(std::uint64_t n, Stream s, std::size_t size,
                          std::uintptr_t* addr) {
  int candidates = 0;
  for (const std::uint64_t id : stitches.MostRecentFirst()) {
    Stitched& r = stitches.at(id);
    if (r.nunits - r.lead < n) continue;
    if (++candidates > kReuseCandidates) break;
    // Reusing the range's VA from another stream needs its last use done.
    if (!clock.Usable(r.tag, s)) continue;
    bool ok = true;
    ForUsed(r, n, [&](std::uint64_t seg, std::uint64_t start,
                      std::uint64_t k) {
      mu.AssertHeld();
      ok = ok && RangeFree(seg, start, k, s);
    });
    if (!ok) continue;
    stitches.Uncache(id);  // the loop goes no further: this returns
    r.used = n;
    ForUsed(r, n, [&](std::uint64_t seg, std::uint64_t start,
                      std::uint64_t k) {
      mu.AssertHeld();
      Carve(seg, start, k, BlockState::kLent, id);
    });
    *addr = StitchedAddress(r);
    OnAllocated(*addr, StitchedAlloc(id, size, s), AllocState::stitch_reuse);
    return true;
  }
  return false;
}

bool Lake::Impl::FindHead(std::uint64_t units, Stream s,
                          std::uint64_t avoid_seg, std::uint64_t avoid,
                          bool wide, Head* head) const {
  // The smallest head of at least `units` among the first candidates (all
  // of them when wide): the free units from the start of the chunk that
  // holds a free block's end, when the block covers that chunk's start but
  // not its end.
  int seen = 0;
  std::uint64_t best = 0;
  for (auto it = free_index.lower_bound(FreeKey(units, 0, 0));
       it != free_index.end() && (wide || seen < kEndCandidates);
       ++it, ++seen) {
    const auto [len, seg_id, start] = *it;
    const std::uint64_t end = start + len;
    const std::uint64_t c = ChunkDown(end);
    if (end == c || c < start) continue;
    const std::uint64_t part = end - c;
    if (part < units || (best != 0 && part >= best)) continue;
    // Outside the last try, not the tail's own chunk (measured: mapping
    // that chunk twice, its tail first and its head last, moved where
    // requests land for no gain; docs/experiments/holdout_changes.md).
    if (!wide && seg_id == avoid_seg && c == ChunkDown(avoid)) continue;
    if (!clock.Usable(segs.at(seg_id).blocks.at(start).tag, s)) continue;
    *head = Head{seg_id, c, 0};
    best = part;
    if (part == units) break;
  }
  return best != 0;
}

// Plans a stitched range for n units on stream s. Pieces: the whole free
// chunks of free blocks usable by s, largest block first. A free range
// maps whole chunks, so it can hold part of a chunk only at its two ends:
// a free tail (the free units from a block's start to the end of its
// chunk) may lead it (*lead: the units of its chunk before the tail, all
// of the tail used), and a free head (the free units from the start of a
// chunk to the end of a block) may end it (*head: its first units used).
// The ends are chosen to take the
// fewest whole chunks: first the smallest tail that holds the request's
// last partial chunk (one chunk fewer), with a head where one holds what
// is then left of a chunk; then no tail, or the largest tail, each with a
// head, where that takes fewer chunks still. The ends are looked for among
// the first candidates of the free index; `wide` (the last try before out
// of memory) looks at every free block, and at the tail of a block of any
// length. Returns the units the lead and whole chunks cover; the head's
// are head->use.
std::uint64_t Lake::Impl::PlanStitch(std::uint64_t n, Stream s, bool wide,
                                     std::vector<Piece>* plan,
                                     std::uint64_t* lead, Head* head) {
  std::uint64_t got = 0;
  *lead = 0;
  *head = Head{};
  struct Tail {
    std::uint64_t seg = 0, start = 0, len = 0;
  };
  const std::uint64_t rem = n % chunk_units;
  const bool room = !opt.max_pieces || opt.max_pieces >= 2;
  // A head adds a piece after the shortfall's: only with no piece limit.
  const bool head_room = opt.max_pieces == 0;
  Tail fit;  // the smallest tail that holds the last partial chunk
  Tail largest;  // the largest tail (only with room for a head)
  if (wide) {
    // Every free block's tail: its free units from its start to the end
    // of its first chunk, however long the block.
    for (const auto& [len, seg_id, start] : free_index) {
      const std::uint64_t part = ChunkUp(start) - start;
      if (!room || part == 0 || part > len || part >= n) continue;
      if (!clock.Usable(segs.at(seg_id).blocks.at(start).tag, s)) continue;
      if (rem != 0 && part >= rem && (fit.len == 0 || part < fit.len))
        fit = Tail{seg_id, start, part};
      if (head_room && part > largest.len)
        largest = Tail{seg_id, start, part};
    }
  } else {
    int seen = 0;
    for (auto it = free_index.lower_bound(FreeKey(rem, 0, 0));
         rem != 0 && room && it != free_index.end() &&
         seen < kLeadCandidates;
         ++it) {
      auto [len, seg_id, start] = *it;
      if (len >= chunk_units) break;
      if ((start + len) % chunk_units != 0) continue;
      ++seen;
      if (!clock.Usable(segs.at(seg_id).blocks.at(start).tag, s)) continue;
      fit = Tail{seg_id, start, len};
      break;
    }
    // The largest tail among the first candidates below a chunk: the free
    // units of a block from its start to the end of its first chunk (all
    // of it, when it ends there).
    seen = 0;
    for (auto it = std::make_reverse_iterator(
             free_index.lower_bound(FreeKey(chunk_units, 0, 0)));
         head_room && room && it != free_index.rend() &&
         seen < kEndCandidates;
         ++it, ++seen) {
      auto [len, seg_id, start] = *it;
      const std::uint64_t part = ChunkUp(start) - start;
      if (part == 0 || part > len || part <= largest.len || part >= n)
        continue;
      if (!clock.Usable(segs.at(seg_id).blocks.at(start).tag, s)) continue;
      largest = Tail{seg_id, start, part};
    }
  }
  // Whole chunks a plan with tail t takes, and its head (if any).
  auto chunks = [&](const Tail& t, Head* h) {
    mu.AssertHeld();
    assert(t.len < n);  // else a fit would have served it
    const std::uint64_t m = n - t.len;
    *h = Head{};
    if (m % chunk_units == 0) return m / chunk_units;
    if (head_room &&
        FindHead(m % chunk_units, s, t.seg, t.start, wide, h)) {
      h->use = m % chunk_units;
      return m / chunk_units;
    }
    return m / chunk_units + 1;
  };
  Tail best = fit;
  std::uint64_t least = chunks(fit, head);
  if (head_room) {
    for (const Tail& t : {Tail{}, largest}) {
      if (t.len == 0 && fit.len == 0) continue;  // evaluated already
      if (t.len != 0 && t.seg == fit.seg && t.start == fit.start) continue;
      Head h;
      const std::uint64_t c = chunks(t, &h);
      if (c < least) {
        least = c;
        best = t;
        *head = h;
      }
    }
  }
  if (best.len != 0) {
    const std::uint64_t c = best.start + best.len - chunk_units;
    plan->push_back(Piece{best.seg, c, chunk_units});
    *lead = best.start - c;
    got = best.len;
  }
  // The whole chunks: up to what the head leaves.
  const std::uint64_t want = n - head->use;
  for (auto it = free_index.rbegin(); it != free_index.rend() && got < want;
       ++it) {
    auto [len, seg_id, start] = *it;
    if (len < chunk_units) break;  // no whole chunk in this block or any after it
    const std::uint64_t a = ChunkUp(start);
    const std::uint64_t b = ChunkDown(start + len);
    if (b <= a) continue;
    if (!clock.Usable(segs.at(seg_id).blocks.at(start).tag, s)) continue;
    const std::uint64_t k = std::min(b - a, ChunkUp(want - got));
    plan->push_back(Piece{seg_id, a, k});
    got += k;
    if (opt.max_pieces && plan->size() >= opt.max_pieces) break;
  }
  // A shortfall segment needs a piece of its own.
  if (got < n && opt.max_pieces) {
    while (!plan->empty() && plan->size() + 1 > opt.max_pieces) {
      got -= plan->back().n - (plan->size() == 1 ? *lead : 0);
      plan->pop_back();
    }
    if (plan->empty()) *lead = 0;
  }
  return std::min(got, want);
}

// Maps the pieces of range `id` into a new reservation (lock released
// meanwhile); the range's used units must already be lent to it.
Status Lake::Impl::MapStitched(MutexLock& lk,
                               std::uint64_t id) {
  const std::vector<Piece> pieces = stitches.at(id).pieces;
  std::vector<std::pair<Handle, std::size_t>> src;  // handle, byte offset
  std::size_t bytes = 0;
  for (const Piece& p : pieces) {
    const Segment& seg = segs.at(p.seg);
    src.emplace_back(seg.handle, std::size_t{p.start} * unit);
    bytes += std::size_t{p.n} * unit;
  }
  Unlock(lk);
  std::uintptr_t va = 0;
  Status s = drv.reserve(bytes, &va);
  std::size_t mapped = 0;
  std::size_t done_bytes = 0;
  if (s == Status::kOk) {
    for (; mapped < pieces.size(); ++mapped) {
      const std::size_t pb = std::size_t{pieces[mapped].n} * unit;
      s = drv.map(va + done_bytes, pb, src[mapped].second,
                  src[mapped].first);
      if (s != Status::kOk) break;
      done_bytes += pb;
    }
    if (s == Status::kOk) s = drv.set_access(va, bytes);
  }
  Unreleased undo;
  Status us = Status::kOk;
  if (s != Status::kOk && va != 0) {
    undo.va = va;
    undo.va_bytes = bytes;
    if (done_bytes != 0) undo.maps.emplace_back(va, done_bytes);  // one run
    us = Teardown(undo, nullptr);
  }
  Relock(lk);
  Stitched& r = stitches.at(id);
  r.mapping = false;
  if (us != Status::kOk) {
    ++st.driver_errors;
    Keep(std::move(undo));
  }
  if (s != Status::kOk) return s;
  r.va = va;
  st.stitched_bytes.add(static_cast<std::int64_t>(bytes));
  st.stitch_pieces += pieces.size();
  st.stitched_bytes_total += bytes;
  return Status::kOk;
}

// Undoes a failed stitch: returns the lent runs to the free pool with the
// tags they had (one per run, in order).
void Lake::Impl::AbandonStitched(std::uint64_t id,
                                 const std::vector<Tag>& tags) {
  Stitched& r = stitches.at(id);
  StitchRefs(r, -1);
  std::vector<Piece> runs;
  ForUsed(r, r.used, [&](std::uint64_t seg, std::uint64_t start,
                         std::uint64_t k) {
    runs.push_back(Piece{seg, start, k});
  });
  for (std::size_t i = 0; i < runs.size(); ++i)
    MakeFree(runs[i].seg, runs[i].start, tags[i]);
  stitches.Erase(id);
}

// Stitches free chunks (plus, if allowed, a new segment for the
// shortfall) into a range for n units. Returns kOk and sets *addr on
// success; kOutOfMemory if stitching cannot serve the request (nothing
// changed).
Status Lake::Impl::TryStitch(MutexLock& lk, std::uint64_t n,
                             Stream s, std::size_t size, std::uintptr_t* addr,
                             AllocState* state, bool wide) {
  if (!opt.stitch || size < opt.stitch_min) return Status::kOutOfMemory;
  std::vector<Piece> plan;
  std::uint64_t lead = 0;
  Head head;
  const std::uint64_t got = PlanStitch(n, s, wide, &plan, &lead, &head);
  if (plan.empty() && head.use == 0) return Status::kOutOfMemory;
  // Whole free chunks that lie back to back in a growth range, taken in
  // address order, need no mapping of their own (see BackToBack).
  if (lead == 0 && plan.size() > 1) {
    std::vector<Piece> sorted = plan;
    std::sort(sorted.begin(), sorted.end(),
              [&](const Piece& a, const Piece& b) {
                mu.AssertHeld();
                return segs.at(a.seg).va + std::size_t{a.start} * unit <
                       segs.at(b.seg).va + std::size_t{b.start} * unit;
              });
    if (BackToBack(sorted)) plan = std::move(sorted);
  }
  if (got + head.use < n && !opt.stitch_grow) return Status::kOutOfMemory;
  // A shortfall while nothing was freed since the last growth (parameters
  // and optimizer state being made) is sized as a growth, as a plain growth
  // is; once frees come between growths (a step's transient buffers), only
  // the shortfall is created, so no surplus waits at a transient peak.
  return StitchPlan(lk, std::move(plan), lead, got, n, s, size, addr, state,
                    /*grow_ahead=*/!freed_since_growth, ~std::uint64_t{0},
                    head);
}

// Serves n units from a plan: pieces whose first `got` units after `lead`
// are free and usable by s, in range order (a stitch's plan, or a free run
// across back-to-back segments), plus a new segment for the shortfall when
// got < n. With grow_ahead, that segment is sized as a growth (ClaimGrowth:
// at least 1/16 of what the lake holds while nothing was freed since the
// last growth, at most `most` chunks); the rest
// of it stays free. The
// range is an alias when its pieces lie back to back, else it is mapped.
// kOutOfMemory when the shortfall cannot be claimed (nothing changed).
Status Lake::Impl::StitchPlan(MutexLock& lk,
                              std::vector<Piece> plan, std::uint64_t lead,
                              std::uint64_t got, std::uint64_t n, Stream s,
                              std::size_t size, std::uintptr_t* addr,
                              AllocState* state, bool grow_ahead,
                              std::uint64_t most, const Head& head) {
  got = std::min(got, n);
  // The head's units end the range, after the shortfall's whole chunks.
  std::uint64_t hu = got + head.use <= n ? head.use : 0;
  std::uint64_t shortfall = got + hu < n ? ChunkUp(n - got - hu) / chunk_units : 0;
  std::uint64_t create = 0;  // chunks of the new segment
  if (shortfall > 0) {
    create = grow_ahead ? ClaimGrowth(shortfall, most)
                        : (ClaimCapacity(shortfall) ? shortfall : 0);
    if (create == 0) return Status::kOutOfMemory;
    if (hu != 0 && create > shortfall) {
      // The growth's share holds the head's units too: no head.
      hu = 0;
      shortfall = ChunkUp(n - got) / chunk_units;
    }
  }
  bool grew = false;
  const std::uint64_t id = next_id++;
  Stitched& r0 = stitches.New(id);
  r0.pieces = plan;
  if (hu != 0) r0.pieces.push_back(Piece{head.seg, head.start, chunk_units});
  r0.lead = lead;
  r0.mapping = true;
  for (const Piece& p : r0.pieces) r0.nunits += p.n;
  r0.used = got + hu;
  // Claim the planned units before releasing the lock.
  std::vector<Tag> tags;
  ForUsed(r0, got + hu, [&](std::uint64_t seg, std::uint64_t start,
                            std::uint64_t k) {
    mu.AssertHeld();
    tags.push_back(BlockAt(seg, start).tag);
    Carve(seg, start, k, BlockState::kLent, id);
  });
  StitchRefs(r0, +1);
  if (shortfall > 0) {
    std::uint64_t seg_id = 0;
    Status cs = CreateSegment(lk, create, &seg_id);
    if (cs != Status::kOk) {
      AbandonStitched(id, tags);
      return cs;
    }
    // Before a head, the new segment's chunks are used whole.
    Carve(seg_id, 0, hu != 0 ? shortfall * chunk_units : n - got, BlockState::kLent,
          id);
    Stitched& r = stitches.at(id);
    const Piece grown{seg_id, 0, shortfall * chunk_units};
    if (hu != 0) {
      r.pieces.insert(r.pieces.end() - 1, grown);
      tags.insert(tags.end() - 1, Tag{});
    } else {
      r.pieces.push_back(grown);
      tags.push_back(Tag{});
    }
    r.nunits += shortfall * chunk_units;
    r.used = n;
    segs.at(seg_id).stitch_refs += 1;
    grew = true;
  }
  Stitched& rb = stitches.at(id);
  if (BackToBack(rb.pieces)) {
    // The pieces are contiguous where they are already mapped (a growth
    // placed the shortfall right after a free tail, or free chunks of
    // neighbouring segments): the range is an alias of that address.
    const Piece& p0 = rb.pieces.front();
    rb.va = segs.at(p0.seg).va + std::size_t{p0.start} * unit;
    rb.alias = true;
    rb.mapping = false;
    const std::size_t bytes = std::size_t{rb.nunits} * unit;
    st.stitched_bytes.add(static_cast<std::int64_t>(bytes));
    st.stitched_bytes_total += bytes;
  } else {
    Status ms = MapStitched(lk, id);
    if (ms != Status::kOk) {
      ++st.driver_errors;
      AbandonStitched(id, tags);
      return ms;
    }
  }
  Stitched& r = stitches.at(id);
  *addr = StitchedAddress(r);
  *state = grew ? AllocState::stitch_grow : AllocState::stitch;
  OnAllocated(*addr, StitchedAlloc(id, size, s), *state);
  return Status::kOk;
}

}  // namespace jaxlake
