// jaxlake: check(), describe() and snapshot() of the lake.
#include "cc/lake/lake_impl.h"

namespace jaxlake {

std::string Lake::Impl::Check() const {
  // Each component's own invariants first, then what ties them together.
  for (std::string err : {clock.CheckInvariants(), stitches.CheckInvariants(),
                          small.CheckInvariants()})
    if (!err.empty()) return err;
  std::ostringstream e;
  std::size_t reserved = 0, free_blocks = 0;
  std::unordered_map<std::uint64_t, std::uint64_t> lent_by;  // id -> chunks
  std::unordered_map<std::uint64_t, std::uint64_t> refs;
  for (const auto& [id, r] : stitches.ranges()) {
    std::set<std::uint64_t> seen;
    std::uint64_t total = 0;
    for (const Piece& p : r.pieces) {
      if (!segs.contains(p.seg)) {
        e << "stitched range " << id << " maps missing segment " << p.seg;
        return e.str();
      }
      if (p.start + p.n > segs.at(p.seg).nchunks * chunk_units || p.start % chunk_units ||
          p.n % chunk_units || p.n == 0) {
        e << "stitched range " << id
          << " maps past segment or not whole chunks of " << p.seg;
        return e.str();
      }
      if (seen.insert(p.seg).second) ++refs[p.seg];
      total += p.n;
    }
    if (total != r.nunits) {
      e << "stitched range " << id << " pieces cover " << total
        << " units, expected " << r.nunits;
      return e.str();
    }
    if (r.lead >= chunk_units || r.lead + r.used > r.nunits) {
      e << "stitched range " << id << " lends more chunks than it maps";
      return e.str();
    }
    // An alias maps nothing: its pieces are contiguous at their primary
    // addresses in one growth range, it starts at the first one's, and it
    // lives only while it is lent (it is dropped at its free).
    if (r.alias && (!BackToBack(r.pieces) ||
                    r.va != segs.at(r.pieces[0].seg).va +
                                std::size_t{r.pieces[0].start} * unit ||
                    r.cached || r.mapping || r.used == 0)) {
      e << "alias range " << id
        << " is not back to back at its pieces, or is cached or unused";
      return e.str();
    }
  }
  // The address index of the segments names each segment once, at its VA.
  if (seg_by_va.size() != segs.size()) {
    e << "segment address index has " << seg_by_va.size() << " entries for "
      << segs.size() << " segments";
    return e.str();
  }
  for (const auto& [va, id] : seg_by_va) {
    if (!segs.contains(id) || segs.at(id).va != va) {
      e << "segment address index names segment " << id << " at " << va;
      return e.str();
    }
  }
  for (auto [id, seg] : segs) {
    reserved += std::size_t{seg.nchunks} * gran;
    std::uint64_t at = 0;
    for (const auto& [start, b] : seg.blocks) {
      if (start != at || b.end <= start || b.end > seg.nchunks * chunk_units) {
        e << "segment " << id << " blocks do not tile it at chunk " << start;
        return e.str();
      }
      at = b.end;
      const std::uint64_t n = b.end - start;
      if (b.state == BlockState::kFree) {
        ++free_blocks;
        if (!free_index.count(FreeKey(n, id, start))) {
          e << "free block " << id << ":" << start << " not indexed";
          return e.str();
        }
      } else if (b.state == BlockState::kLent) {
        const Stitched* rp = stitches.Find(b.owner);
        if (rp == nullptr) {
          e << "block " << id << ":" << start << " lent to missing range";
          return e.str();
        }
        // The block must lie within the lent prefix of its range.
        bool inside = false;
        const Stitched& r = *rp;
        const std::uint64_t seg_id = id, lo = start, hi = b.end;
        ForUsed(r, r.used,
                [&](std::uint64_t sg, std::uint64_t s0, std::uint64_t k) {
                  if (sg == seg_id && lo >= s0 && hi <= s0 + k) inside = true;
                });
        if (!inside) {
          e << "block " << id << ":" << start
            << " is lent outside its range's live chunks";
          return e.str();
        }
        lent_by[b.owner] += n;
      } else if (b.state == BlockState::kSlab) {
        auto sit = small.slabs().find(b.owner);
        if (sit == small.slabs().end() || sit->second.seg != id ||
            sit->second.start != start || sit->second.nunits != n) {
          e << "slab block " << id << ":" << start << " has no slab";
          return e.str();
        }
      } else if (b.state == BlockState::kLive) {
        auto lit = live.find(seg.va + std::size_t{start} * unit);
        if (lit == nullptr || lit->second.kind != Kind::kPrimary ||
            lit->second.rounded != std::size_t{n} * unit) {
          e << "live block " << id << ":" << start << " has no allocation";
          return e.str();
        }
      }
    }
    if (at != seg.nchunks * chunk_units) {
      e << "segment " << id << " blocks end at unit " << at << " of "
        << seg.nchunks * chunk_units;
      return e.str();
    }
    const std::uint64_t want = refs.count(id) ? refs.at(id) : 0;
    if (seg.stitch_refs != want) {
      e << "segment " << id << " stitch_refs " << seg.stitch_refs
        << ", expected " << want;
      return e.str();
    }
  }
  // open_ends: every segment whose last block is free, and only listed
  // segments at their end addresses.
  for (auto [id, seg] : segs) {
    auto it = open_ends.find(EndOf(seg));
    const bool listed = it != open_ends.end() && it->second == id;
    if (listed != seg.open_end ||
        (seg.blocks.rbegin()->second.state == BlockState::kFree && !listed)) {
      e << "segment " << id << " open_end " << seg.open_end
        << " does not match open_ends";
      return e.str();
    }
  }
  for (const auto& [va, id] : open_ends) {
    if (!segs.contains(id) || EndOf(segs.at(id)) != va) {
      e << "open_ends names segment " << id << " at " << va;
      return e.str();
    }
  }
  if (free_blocks != free_index.size()) {
    e << "free index has " << free_index.size() << " entries for "
      << free_blocks << " free blocks";
    return e.str();
  }
  // Growth ranges: each counts the segments placed in it, which lie
  // inside its reserved stretch.
  std::map<std::uintptr_t, std::uint64_t> in_range;
  for (auto [id, seg] : segs) {
    if (seg.range == 0) continue;
    auto rit = ranges.find(seg.range);
    if (rit == ranges.end() || seg.va < seg.range ||
        EndOf(seg) > seg.range + rit->second.next) {
      e << "segment " << id << " lies outside its growth range";
      return e.str();
    }
    ++in_range[seg.range];
  }
  for (const auto& [va, g] : ranges) {
    const std::uint64_t have = in_range.count(va) ? in_range.at(va) : 0;
    // Growths in progress have claimed their stretch but made no segment.
    if (have > g.segments || g.next > g.bytes) {
      e << "growth range " << va << " counts " << g.segments
        << " segments for " << have;
      return e.str();
    }
  }
  if (current_range != 0 && !ranges.count(current_range)) {
    e << "current growth range " << current_range << " is missing";
    return e.str();
  }
  std::size_t stitched_va = 0;
  for (const auto& [id, r] : stitches.ranges()) {
    if (!r.mapping) stitched_va += std::size_t{r.nunits} * unit;
    const std::uint64_t lent = lent_by.count(id) ? lent_by.at(id) : 0;
    const std::uint64_t want = r.used;
    if (lent != want) {
      e << "stitched range " << id << " has " << lent
        << " chunks lent, expected " << want;
      return e.str();
    }
  }
  std::size_t in_use = 0, rounded = 0, small_reserved = 0;
  for (const auto& [addr, a] : live) {
    in_use += a.size;
    rounded += a.rounded;
    if (a.size > a.rounded || addr % opt.alignment != 0) {
      e << "allocation " << addr << " is misaligned or over its size";
      return e.str();
    }
    if (a.kind == Kind::kStitched) {
      const Stitched* rp = stitches.Find(a.owner);
      if (rp == nullptr || StitchedAddress(*rp) != addr ||
          std::size_t{rp->used} * unit != a.rounded) {
        e << "stitched allocation " << addr << " does not match its range";
        return e.str();
      }
    }
  }
  for (const auto& [id, sl] : small.slabs()) small_reserved += sl.bytes;
  auto gauge = [&](const char* name, std::int64_t have, std::size_t want) {
    if (e.tellp() == 0 && have != static_cast<std::int64_t>(want))
      e << "gauge " << name << " is " << have << ", expected " << want;
  };
  gauge("bytes_reserved", st.bytes_reserved.current, reserved);
  gauge("bytes_in_use", st.bytes_in_use.current, in_use);
  gauge("bytes_in_use_rounded", st.bytes_in_use_rounded.current, rounded);
  gauge("bytes_small_reserved", st.bytes_small_reserved.current,
        small_reserved);
  gauge("stitched_bytes", st.stitched_bytes.current, stitched_va);
  gauge("segments", st.segments.current, segs.size());
  gauge("live_allocations", st.live_allocations.current, live.size());
  std::size_t held = retrying_held;
  for (const Unreleased& u : unreleased) {
    held += u.held();
    if (u.done()) {
      e << "a released resource is still in the unreleased list";
      return e.str();
    }
  }
  gauge("unreleased", st.unreleased.current, unreleased.size() + retrying);
  gauge("bytes_unreleased", st.bytes_unreleased.current, held);
  if (e.tellp() == 0 &&
      reserved + pending_bytes + releasing_bytes + held > capacity)
    e << "reserved " << reserved << " bytes (and " << held
      << " unreleased) exceed capacity " << capacity;
  return e.str();
}

void Lake::Impl::FailOnBrokenInvariant() const {
  std::string err = Check();
  if (!err.empty()) {
    std::fprintf(stderr, "jaxlake: invariant broken: %s\n", err.c_str());
    std::abort();
  }
}

std::string Lake::Impl::Describe() const {
  std::size_t largest = 0, free_chunks = 0;
  if (!free_index.empty()) largest = std::get<0>(*free_index.rbegin());
  for (const auto& k : free_index) free_chunks += std::get<0>(k);
  std::ostringstream o;
  o << "in use " << Bytes(st.bytes_in_use.current) << " (peak "
    << Bytes(st.bytes_in_use.peak) << "), reserved "
    << Bytes(st.bytes_reserved.current) << " (peak "
    << Bytes(st.bytes_reserved.peak) << ") of capacity " << Bytes(capacity)
    << ", free " << Bytes(free_chunks * unit) << " in "
    << free_index.size() << " blocks (largest " << Bytes(largest * unit)
    << "), small pool " << Bytes(st.bytes_small_reserved.current)
    << ", cached stitched ranges " << stitches.cached() << ", live allocations "
    << live.size();
  return o.str();
}

std::string Lake::check() const {
  MutexLock lk(impl_->mu);
  return impl_->Check();
}

std::string Lake::describe() const {
  MutexLock lk(impl_->mu);
  return impl_->Describe();
}

LakeSnapshot Lake::snapshot() const {
  const Impl& m = *impl_;
  MutexLock lk(m.mu);
  LakeSnapshot out;
  out.granularity = m.gran;
  out.capacity = m.capacity;
  // Blocks are split at the alignment; the snapshot shows whole chunks.
  // A chunk takes the state of the units that matter most in it: lent,
  // else live, else slab; it is free only when all its units are free
  // (the chunks stitching can take), and pending when any of them is.
  std::unordered_map<std::uint64_t, std::uint64_t> lent_chunks;
  for (auto [id, seg] : m.segs) {
    SnapshotSegment s;
    s.id = id;
    s.va = seg.va;
    s.nchunks = seg.nchunks;
    auto it = seg.blocks.begin();
    for (std::uint64_t c = 0; c < seg.nchunks; ++c) {
      const std::uint64_t lo = c * m.chunk_units, hi = lo + m.chunk_units;
      while (it != seg.blocks.end() && it->second.end <= lo) ++it;
      SnapshotRun r;
      r.start = c;
      r.end = c + 1;
      int rank = 0;  // 0 free, 1 slab, 2 live, 3 lent
      for (auto b = it; b != seg.blocks.end() && b->first < hi; ++b) {
        const Block& blk = b->second;
        int k = 0;
        if (blk.state == BlockState::kLent) k = 3;
        else if (blk.state == BlockState::kLive) k = 2;
        else if (blk.state == BlockState::kSlab) k = 1;
        if (k == 0 && !m.clock.Safe(blk.tag)) r.pending = true;
        if (k <= rank) continue;
        rank = k;
        r.owner = blk.owner;
        r.address = k == 2 ? seg.va + std::size_t{b->first} * m.unit : 0;
      }
      // The breakdown of held bytes: free units by where they lie in the
      // chunk (HeldBreakdown).
      {
        std::uint64_t free_units = 0, tail = 0, head = 0;
        for (auto b = it; b != seg.blocks.end() && b->first < hi; ++b) {
          if (b->second.state != BlockState::kFree) continue;
          const std::uint64_t a = std::max(b->first, lo);
          const std::uint64_t e = std::min(b->second.end, hi);
          free_units += e - a;
          if (a == lo && e == hi) continue;
          if (e == hi) tail = e - a;
          else if (a == lo) head = e - a;
        }
        HeldBreakdown& h = out.held;
        if (free_units == m.chunk_units) {
          h.free_chunks += m.gran;
        } else {
          h.free_tails += tail * m.unit;
          h.free_heads += head * m.unit;
          h.free_inner += (free_units - tail - head) * m.unit;
          h.largest_tail = std::max<std::size_t>(h.largest_tail,
                                                 tail * m.unit);
          h.largest_head = std::max<std::size_t>(h.largest_head,
                                                 head * m.unit);
        }
        h.held += m.gran;
      }
      r.state = rank == 3   ? ChunkState::kLent
                : rank == 2 ? ChunkState::kLive
                : rank == 1 ? ChunkState::kSlab
                            : ChunkState::kFree;
      if (rank != 0) r.pending = false;
      if (rank == 3) ++lent_chunks[r.owner];
      SnapshotRun* last = s.runs.empty() ? nullptr : &s.runs.back();
      if (last && last->state == r.state && last->owner == r.owner &&
          last->address == r.address && last->pending == r.pending) {
        last->end = r.end;
      } else {
        s.runs.push_back(r);
      }
    }
    for (const SnapshotRun& r : s.runs) {
      if (r.state != ChunkState::kFree) continue;
      out.free_chunks += r.end - r.start;
      out.largest_free =
          std::max<std::size_t>(out.largest_free, r.end - r.start);
    }
    out.segments.push_back(std::move(s));
  }
  out.held.live = static_cast<std::size_t>(m.st.bytes_in_use.current);
  out.held.rounding =
      static_cast<std::size_t>(m.st.bytes_in_use_rounded.current -
                               m.st.bytes_in_use.current);
  for (const auto& [id, sl] : m.small.slabs())
    out.held.slab_free += sl.bytes - sl.used;
  for (const auto& [id, r] : m.stitches.ranges())
    if (r.cached) out.held.stitched_cached += std::size_t{r.nunits} * m.unit;
  for (const auto& [id, r] : m.stitches.ranges()) {
    SnapshotStitched s;
    s.id = id;
    s.va = r.va;
    s.nchunks = r.nunits / m.chunk_units;
    auto lc = lent_chunks.find(id);
    s.used = r.mapping || lc == lent_chunks.end() ? 0 : lc->second;
    s.address = r.mapping || r.used == 0 ? 0 : m.StitchedAddress(r);
    s.cached = r.cached;
    s.busy = r.mapping || r.dropping;
    for (const Piece& p : r.pieces)
      s.pieces.push_back(SnapshotPiece{p.seg, p.start / m.chunk_units, p.n / m.chunk_units});
    out.stitched.push_back(std::move(s));
  }
  for (const auto& [id, sl] : m.small.slabs())
    out.slabs.push_back(SnapshotSlab{id, sl.seg, sl.start / m.chunk_units,
                                     sl.nunits / m.chunk_units,
                                     sl.base, sl.bytes, sl.used, sl.stream});
  auto by_id = [](const auto& a, const auto& b) { return a.id < b.id; };
  std::sort(out.segments.begin(), out.segments.end(), by_id);
  std::sort(out.stitched.begin(), out.stitched.end(), by_id);
  std::sort(out.slabs.begin(), out.slabs.end(), by_id);
  return out;
}

}  // namespace jaxlake
