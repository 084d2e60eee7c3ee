// jaxlake: the small pool (small_pool.h), and the lake's small requests:
// slabs taken from the large pool and given back to it.
#include "cc/lake/small_pool.h"

#include <sstream>

#include "cc/lake/lake_impl.h"

namespace jaxlake {
namespace detail {

void SmallPool::AddSlab(std::uint64_t id, Slab slab) {
  slab.free.clear();
  slab.free.emplace(0, slab.bytes);
  slab.used = 0;
  by_base_.emplace(slab.base, id);
  free_[slab.stream].emplace(slab.bytes, slab.base);
  slabs_.emplace(id, std::move(slab));
}

bool SmallPool::Take(std::size_t len, Stream s, std::uintptr_t* addr,
                     std::uint64_t* slab_id) {
  auto& pool = free_[s];
  auto it = pool.lower_bound({len, 0});
  if (it == pool.end()) return false;
  const auto [flen, faddr] = *it;
  pool.erase(it);
  const std::uint64_t id = std::prev(by_base_.upper_bound(faddr))->second;
  Slab& sl = slabs_.at(id);
  const std::size_t off = faddr - sl.base;
  sl.free.erase(off);
  if (flen > len) {
    sl.free.emplace(off + len, flen - len);
    pool.emplace(flen - len, faddr + len);
  }
  sl.used += len;
  *addr = faddr;
  *slab_id = id;
  return true;
}

bool SmallPool::Return(std::uint64_t slab_id, std::size_t off,
                       std::size_t len) {
  Slab& sl = slabs_.at(slab_id);
  auto& pool = free_[sl.stream];
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
  return sl.used == 0;
}

Slab SmallPool::RemoveSlab(std::uint64_t slab_id) {
  Slab sl = std::move(slabs_.at(slab_id));
  assert(sl.used == 0 && sl.free.size() == 1);
  free_[sl.stream].erase({sl.bytes, sl.base});
  sl.free.clear();
  by_base_.erase(sl.base);
  slabs_.erase(slab_id);
  return sl;
}

std::string SmallPool::CheckInvariants() const {
  std::ostringstream e;
  std::size_t ranges = 0;
  for (const auto& [id, sl] : slabs_) {
    auto bit = by_base_.find(sl.base);
    if (bit == by_base_.end() || bit->second != id) {
      e << "slab " << id << " is not indexed at its base " << sl.base;
      return e.str();
    }
    std::size_t free_bytes = 0, end = 0;
    for (const auto& [off, len] : sl.free) {
      if (len == 0 || off + len > sl.bytes || (free_bytes != 0 && off <= end)) {
        e << "small range at slab " << id << "+" << off
          << " is empty, past the slab or not merged with the one before";
        return e.str();
      }
      end = off + len;
      free_bytes += len;
      auto pit = free_.find(sl.stream);
      if (pit == free_.end() || !pit->second.count({len, sl.base + off})) {
        e << "small range at slab " << id << "+" << off << " not indexed";
        return e.str();
      }
    }
    ranges += sl.free.size();
    if (free_bytes + sl.used != sl.bytes) {
      e << "slab " << id << " accounts " << free_bytes + sl.used << " of "
        << sl.bytes << " bytes";
      return e.str();
    }
  }
  if (by_base_.size() != slabs_.size()) {
    e << "slab address index has " << by_base_.size() << " entries for "
      << slabs_.size() << " slabs";
    return e.str();
  }
  std::size_t indexed = 0;
  for (const auto& [s, pool] : free_) indexed += pool.size();
  if (indexed != ranges) {
    e << "small pool indexes " << indexed << " free ranges for " << ranges;
    return e.str();
  }
  for (const Deferred& d : deferred_) {
    auto it = slabs_.find(d.slab);
    if (it == slabs_.end() || d.off + d.len > it->second.bytes ||
        it->second.used < d.len) {
      e << "deferred small range at slab " << d.slab << "+" << d.off
        << " lies outside a slab's lent bytes";
      return e.str();
    }
  }
  return e.str();
}

}  // namespace detail

// A new slab for stream s: one primary block (never a stitch, which would
// tie a stitched range to the long-lived small pool).
Status Lake::Impl::NewSlab(MutexLock& lk, Stream s,
                           std::uint64_t* slab_id) {
  const auto n = static_cast<std::uint64_t>(slab_bytes / unit);
  const std::uint64_t id = next_id++;
  *slab_id = id;
  std::uint64_t seg = 0, start = 0;
  AllocState how;
  Status r =
      ClaimPrimary(lk, n, s, BlockState::kSlab, id, &seg, &start, &how);
  if (r != Status::kOk) return r;
  Slab sl;
  sl.seg = seg;
  sl.start = start;
  sl.nunits = n;
  sl.base = segs.at(seg).va + std::size_t{start} * unit;
  sl.bytes = slab_bytes;
  sl.stream = s;
  small.AddSlab(id, std::move(sl));
  st.bytes_small_reserved.add(static_cast<std::int64_t>(slab_bytes));
  return Status::kOk;
}

// Serves a small request from stream s's slabs; false if none has room.
bool Lake::Impl::SmallFromPool(std::size_t size, std::size_t len, Stream s,
                               std::uintptr_t* addr) {
  std::uint64_t id = 0;
  if (!small.Take(len, s, addr, &id)) return false;
  Alloc a;
  a.size = size;
  a.rounded = len;
  a.stream = s;
  a.kind = Kind::kSmall;
  a.owner = id;
  OnAllocated(*addr, a, AllocState::small);
  return true;
}

// Returns a small range to its slab; an empty slab goes back to the large
// pool.
void Lake::Impl::ReturnSmall(std::uint64_t slab_id, std::size_t off,
                             std::size_t len) {
  ++changes;
  if (small.Return(slab_id, off, len)) DropEmptySlab(slab_id);
}

// An empty slab's chunks go back to the large pool, tagged with the stream
// the slab served (its last uses were all ordered on it).
void Lake::Impl::DropEmptySlab(std::uint64_t slab_id) {
  const Slab sl = small.RemoveSlab(slab_id);
  st.bytes_small_reserved.add(-static_cast<std::int64_t>(sl.bytes));
  MakeFree(sl.seg, sl.start, clock.FreeTag(sl.stream));
}

void Lake::Impl::FreeSmall(std::uintptr_t addr, const Alloc& a, Stream s) {
  const Slab& sl = small.slab(a.owner);
  const std::size_t off = addr - sl.base;
  if (s != sl.stream) {
    small.Defer(SmallPool::Deferred{clock.FreeTag(s), a.owner, off,
                                    a.rounded});
    return;
  }
  ReturnSmall(a.owner, off, a.rounded);
}

void Lake::Impl::FlushDeferredSmall() {
  if (!small.HasDeferred()) return;
  for (const SmallPool::Deferred& d :
       small.TakeReady([&](const Tag& t) {
         mu.AssertHeld();
         return clock.Safe(t);
       }))
    ReturnSmall(d.slab, d.off, d.len);
}

Status Lake::Impl::Small(MutexLock& lk, std::size_t size,
                         Stream s, std::uintptr_t* addr) {
  const std::size_t len = RoundUp(size, opt.alignment);
  if (SmallFromPool(size, len, s, addr)) return Status::kOk;
  // Ranges freed on other streams come back once those frees are
  // complete, whoever saw them complete (another call may have advanced
  // the streams already).
  if (small.HasDeferred()) {
    clock.Advance();
    FlushDeferredSmall();
    if (SmallFromPool(size, len, s, addr)) return Status::kOk;
  }
  std::uint64_t slab = 0;
  Status r = WithReclaim(lk, [&] {
    mu.AssertHeld();
    return NewSlab(lk, s, &slab);
  });
  if (r != Status::kOk) return r;
  SmallFromPool(size, len, s, addr);
  // While NewSlab had the lock released, another call may have freed a range
  // of stream s's older slabs that fits better: then the new slab served
  // nothing, and an empty slab is never freed again, so it goes back to the
  // large pool now.
  if (small.slab(slab).used == 0) DropEmptySlab(slab);
  return Status::kOk;
}

}  // namespace jaxlake
