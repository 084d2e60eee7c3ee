// jaxlake: the small pool: slabs carved into small ranges.
#include "cc/lake/lake_impl.h"

namespace jaxlake {

// A new slab for stream s: one primary block (never a stitch, which would
// tie a stitched range to the long-lived small pool).
Status Lake::Impl::NewSlab(std::unique_lock<std::mutex>& lk, Stream s,
                           std::uint64_t* slab_id) {
  const auto n = static_cast<std::uint64_t>(slab_bytes / unit);
  const std::uint64_t id = next_id++;
  *slab_id = id;
  std::uint64_t seg = 0, start = 0;
  AllocState how;
  Status r =
      ClaimPrimary(lk, n, s, BlockState::kSlab, id, &seg, &start, &how);
  if (r != Status::kOk) return r;
  Slab& sl = slabs[id];
  sl.seg = seg;
  sl.start = start;
  sl.nunits = n;
  sl.base = segs.at(seg).va + std::size_t{start} * unit;
  sl.bytes = slab_bytes;
  sl.stream = s;
  sl.free.emplace(0, slab_bytes);
  slab_by_base.emplace(sl.base, id);
  small_free[s].emplace(slab_bytes, sl.base);
  st.bytes_small_reserved.add(static_cast<std::int64_t>(slab_bytes));
  return Status::kOk;
}

// Serves a small request from stream s's slabs; false if none has room.
bool Lake::Impl::SmallFromPool(std::size_t size, std::size_t len, Stream s,
                               std::uintptr_t* addr) {
  auto& pool = small_free[s];
  auto it = pool.lower_bound({len, 0});
  if (it == pool.end()) return false;
  const auto [flen, faddr] = *it;
  pool.erase(it);
  const std::uint64_t id =
      std::prev(slab_by_base.upper_bound(faddr))->second;
  Slab& sl = slabs.at(id);
  const std::size_t off = faddr - sl.base;
  sl.free.erase(off);
  if (flen > len) {
    sl.free.emplace(off + len, flen - len);
    pool.emplace(flen - len, faddr + len);
  }
  sl.used += len;
  Alloc a;
  a.size = size;
  a.rounded = len;
  a.stream = s;
  a.kind = Kind::kSmall;
  a.owner = id;
  *addr = faddr;
  OnAllocated(faddr, a, AllocState::small);
  return true;
}

// Returns a small range to its slab, merging neighbours; an empty slab
// goes back to the large pool.
void Lake::Impl::ReturnSmall(std::uint64_t slab_id, std::size_t off,
                             std::size_t len) {
  ++changes;
  Slab& sl = slabs.at(slab_id);
  auto& pool = small_free[sl.stream];
  sl.used -= len;
  auto next = sl.free.lower_bound(off);
  if (next != sl.free.end() && next->first == off + len) {
    pool.erase({next->second, sl.base + next->first});
    len += next->second;
    next = sl.free.erase(next);
  }
  if (next != sl.free.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == off) {
      pool.erase({prev->second, sl.base + prev->first});
      off = prev->first;
      len += prev->second;
      sl.free.erase(prev);
    }
  }
  sl.free.emplace(off, len);
  pool.emplace(len, sl.base + off);
  if (sl.used == 0) DropEmptySlab(slab_id);
}

// An empty slab's chunks go back to the large pool, tagged with the stream
// the slab served (its last uses were all ordered on it).
void Lake::Impl::DropEmptySlab(std::uint64_t slab_id) {
  Slab& sl = slabs.at(slab_id);
  assert(sl.used == 0 && sl.free.size() == 1);
  small_free[sl.stream].erase({sl.bytes, sl.base});
  sl.free.clear();
  slab_by_base.erase(sl.base);
  st.bytes_small_reserved.add(-static_cast<std::int64_t>(sl.bytes));
  const std::uint64_t seg = sl.seg, start = sl.start;
  const Stream owner_stream = sl.stream;
  slabs.erase(slab_id);
  MakeFree(seg, start, FreeTag(owner_stream));
}

void Lake::Impl::FreeSmall(std::uintptr_t addr, const Alloc& a, Stream s) {
  const Slab& sl = slabs.at(a.owner);
  const std::size_t off = addr - sl.base;
  if (s != sl.stream) {
    deferred_small.push_back(Deferred{FreeTag(s), a.owner, off, a.rounded});
    return;
  }
  ReturnSmall(a.owner, off, a.rounded);
}

void Lake::Impl::FlushDeferredSmall() {
  if (deferred_small.empty()) return;
  std::size_t keep = 0;
  for (std::size_t i = 0; i < deferred_small.size(); ++i) {
    const Deferred d = deferred_small[i];
    if (Safe(d.tag))
      ReturnSmall(d.slab, d.off, d.len);
    else
      deferred_small[keep++] = d;
  }
  deferred_small.resize(keep);
}

Status Lake::Impl::Small(std::unique_lock<std::mutex>& lk, std::size_t size,
                         Stream s, std::uintptr_t* addr) {
  const std::size_t len = RoundUp(size, opt.alignment);
  if (SmallFromPool(size, len, s, addr)) return Status::kOk;
  // Ranges freed on other streams come back once those frees are
  // complete, whoever saw them complete (another call may have advanced
  // the streams already).
  if (!deferred_small.empty()) {
    AdvanceStreams();
    FlushDeferredSmall();
    if (SmallFromPool(size, len, s, addr)) return Status::kOk;
  }
  std::uint64_t slab = 0;
  Status r = WithReclaim(lk, [&] { return NewSlab(lk, s, &slab); });
  if (r != Status::kOk) return r;
  SmallFromPool(size, len, s, addr);
  // While NewSlab had the lock released, another call may have freed a range
  // of stream s's older slabs that fits better: then the new slab served
  // nothing, and an empty slab is never freed again, so it goes back to the
  // large pool now.
  if (slabs.at(slab).used == 0) DropEmptySlab(slab);
  return Status::kOk;
}

}  // namespace jaxlake
