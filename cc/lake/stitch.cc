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
Status Lake::Impl::DropStitched(std::unique_lock<std::mutex>& lk,
                                std::uint64_t id, const char** what) {
  Stitched& r = stitched.at(id);
  if (r.cached) {
    lru.erase(r.lru);
    r.cached = false;
  }
  if (r.alias) {  // nothing of its own is mapped: no driver call
    StitchRefs(r, -1);
    st.stitched_bytes.add(-static_cast<std::int64_t>(std::size_t{r.nunits} *
                                                      unit));
    ++st.stitch_evictions;
    stitched.erase(id);
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
  lk.unlock();
  const Status s = Teardown(undo, what);
  lk.lock();
  Stitched& r2 = stitched.at(id);
  StitchRefs(r2, -1);
  st.stitched_bytes.add(-static_cast<std::int64_t>(bytes));
  ++st.stitch_evictions;
  stitched.erase(id);
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
void Lake::Impl::TrimCache(std::unique_lock<std::mutex>& lk, std::size_t keep,
                           Status* status, std::string* error) {
  bool advanced = false;
  while (lru.size() > keep) {
    std::uint64_t victim = 0;
    for (auto it = lru.rbegin(); it != lru.rend(); ++it)
      if (Safe(stitched.at(*it).tag)) {
        victim = *it;
        break;
      }
    if (victim == 0) {
      if (advanced || !AdvanceStreams()) return;  // all still in flight
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
  a.rounded = std::size_t{stitched.at(id).used} * unit;
  a.stream = s;
  a.kind = Kind::kStitched;
  a.owner = id;
  return a;
}

bool Lake::Impl::TryReuse(std::uint64_t n, Stream s, std::size_t size,
                          std::uintptr_t* addr) {
  int candidates = 0;
  for (auto it = lru.begin(); it != lru.end(); ++it) {
    Stitched& r = stitched.at(*it);
    if (r.nunits - r.lead < n) continue;
    if (++candidates > kReuseCandidates) break;
    // Reusing the range's VA from another stream needs its last use done.
    if (!Usable(r.tag, s)) continue;
    bool ok = true;
    ForUsed(r, n, [&](std::uint64_t seg, std::uint64_t start,
                      std::uint64_t k) {
      ok = ok && RangeFree(seg, start, k, s);
    });
    if (!ok) continue;
    const std::uint64_t id = *it;
    lru.erase(it);
    r.cached = false;
    r.used = n;
    ForUsed(r, n, [&](std::uint64_t seg, std::uint64_t start,
                      std::uint64_t k) {
      Carve(seg, start, k, BlockState::kLent, id);
    });
    *addr = StitchedAddress(r);
    OnAllocated(*addr, StitchedAlloc(id, size, s), AllocState::stitch_reuse);
    return true;
  }
  return false;
}

// Plans a stitched range for n units on stream s. Pieces: the whole free
// chunks of free blocks usable by s, largest block first. A free block
// smaller than a chunk that ends at a chunk boundary and holds the
// request's last partial chunk leads the range (*lead: the units of its
// chunk before it), which then takes one whole chunk fewer (best fit among
// the first candidates), whether or not the whole chunks would cover the
// request without it. Returns the units the plan covers after the lead.
std::uint64_t Lake::Impl::PlanStitch(std::uint64_t n, Stream s,
                                     std::vector<Piece>* plan,
                                     std::uint64_t* lead) {
  std::uint64_t got = 0;
  *lead = 0;
  // A free block smaller than a chunk that ends at a chunk boundary and
  // holds the request's last partial chunk leads the range: the range then
  // takes one whole chunk fewer (best fit among the first candidates).
  const std::uint64_t rem = n % cu;
  const bool room = !opt.max_pieces || opt.max_pieces >= 2;
  int seen = 0;
  for (auto it = free_index.lower_bound(FreeKey(rem, 0, 0));
       rem != 0 && room && it != free_index.end() && seen < kLeadCandidates;
       ++it) {
    auto [len, seg_id, start] = *it;
    if (len >= cu) break;
    if ((start + len) % cu != 0) continue;
    ++seen;
    if (!Usable(segs.at(seg_id).blocks.at(start).tag, s)) continue;
    const std::uint64_t c = start + len - cu;
    plan->push_back(Piece{seg_id, c, cu});
    *lead = start - c;
    got = len;
    break;
  }
  for (auto it = free_index.rbegin(); it != free_index.rend() && got < n;
       ++it) {
    auto [len, seg_id, start] = *it;
    if (len < cu) break;  // no whole chunk in this block or any after it
    const std::uint64_t a = ChunkUp(start);
    const std::uint64_t b = ChunkDown(start + len);
    if (b <= a) continue;
    if (!Usable(segs.at(seg_id).blocks.at(start).tag, s)) continue;
    const std::uint64_t k = std::min(b - a, ChunkUp(n - got));
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
  return std::min(got, n);
}

// Maps the pieces of range `id` into a new reservation (lock released
// meanwhile); the range's used units must already be lent to it.
Status Lake::Impl::MapStitched(std::unique_lock<std::mutex>& lk,
                               std::uint64_t id) {
  const std::vector<Piece> pieces = stitched.at(id).pieces;
  std::vector<std::pair<Handle, std::size_t>> src;  // handle, byte offset
  std::size_t bytes = 0;
  for (const Piece& p : pieces) {
    const Segment& seg = segs.at(p.seg);
    src.emplace_back(seg.handle, std::size_t{p.start} * unit);
    bytes += std::size_t{p.n} * unit;
  }
  lk.unlock();
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
  lk.lock();
  Stitched& r = stitched.at(id);
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
  Stitched& r = stitched.at(id);
  StitchRefs(r, -1);
  std::vector<Piece> runs;
  ForUsed(r, r.used, [&](std::uint64_t seg, std::uint64_t start,
                         std::uint64_t k) {
    runs.push_back(Piece{seg, start, k});
  });
  for (std::size_t i = 0; i < runs.size(); ++i)
    MakeFree(runs[i].seg, runs[i].start, tags[i]);
  stitched.erase(id);
}

// Stitches free chunks (plus, if allowed, a new segment for the
// shortfall) into a range for n units. Returns kOk and sets *addr on
// success; kOutOfMemory if stitching cannot serve the request (nothing
// changed).
Status Lake::Impl::TryStitch(std::unique_lock<std::mutex>& lk, std::uint64_t n,
                             Stream s, std::size_t size, std::uintptr_t* addr,
                             AllocState* state) {
  if (!opt.stitch || size < opt.stitch_min) return Status::kOutOfMemory;
  std::vector<Piece> plan;
  std::uint64_t lead = 0;
  const std::uint64_t got = PlanStitch(n, s, &plan, &lead);
  if (plan.empty()) return Status::kOutOfMemory;
  // Whole free chunks that lie back to back in a growth range, taken in
  // address order, need no mapping of their own (see BackToBack).
  if (lead == 0 && plan.size() > 1) {
    std::vector<Piece> sorted = plan;
    std::sort(sorted.begin(), sorted.end(),
              [&](const Piece& a, const Piece& b) {
                return segs.at(a.seg).va + std::size_t{a.start} * unit <
                       segs.at(b.seg).va + std::size_t{b.start} * unit;
              });
    if (BackToBack(sorted)) plan = std::move(sorted);
  }
  if (got < n && !opt.stitch_grow) return Status::kOutOfMemory;
  // A shortfall while nothing was freed since the last growth (parameters
  // and optimizer state being made) is sized as a growth, as a plain growth
  // is; once frees come between growths (a step's transient buffers), only
  // the shortfall is created, so no surplus waits at a transient peak.
  return StitchPlan(lk, std::move(plan), lead, got, n, s, size, addr, state,
                    /*grow_ahead=*/!freed_since_growth);
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
Status Lake::Impl::StitchPlan(std::unique_lock<std::mutex>& lk,
                              std::vector<Piece> plan, std::uint64_t lead,
                              std::uint64_t got, std::uint64_t n, Stream s,
                              std::size_t size, std::uintptr_t* addr,
                              AllocState* state, bool grow_ahead,
                              std::uint64_t most) {
  got = std::min(got, n);
  const std::uint64_t shortfall = got < n ? ChunkUp(n - got) / cu : 0;
  std::uint64_t create = 0;  // chunks of the new segment
  if (shortfall > 0) {
    create = grow_ahead ? ClaimGrowth(shortfall, most)
                        : (ClaimCapacity(shortfall) ? shortfall : 0);
    if (create == 0) return Status::kOutOfMemory;
  }
  bool grew = false;
  const std::uint64_t id = next_id++;
  Stitched& r0 = stitched[id];
  r0.pieces = plan;
  r0.lead = lead;
  r0.mapping = true;
  for (const Piece& p : plan) r0.nunits += p.n;
  r0.used = got;
  // Claim the planned units before releasing the lock.
  std::vector<Tag> tags;
  ForUsed(r0, got, [&](std::uint64_t seg, std::uint64_t start,
                       std::uint64_t k) {
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
    Carve(seg_id, 0, n - got, BlockState::kLent, id);
    Stitched& r = stitched.at(id);
    r.pieces.push_back(Piece{seg_id, 0, shortfall * cu});
    r.nunits += shortfall * cu;
    r.used = n;
    tags.push_back(Tag{});
    segs.at(seg_id).stitch_refs += 1;
    grew = true;
  }
  Stitched& rb = stitched.at(id);
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
  Stitched& r = stitched.at(id);
  *addr = StitchedAddress(r);
  *state = grew ? AllocState::stitch_grow : AllocState::stitch;
  OnAllocated(*addr, StitchedAlloc(id, size, s), *state);
  return Status::kOk;
}

}  // namespace jaxlake
