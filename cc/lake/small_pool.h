// jaxlake: the small pool: slabs (whole chunks taken from the large pool)
// carved into small ranges, per stream (docs/design.md, "Structures", slabs).
// Private to cc/lake/; not installed.
//
// Each slab serves one stream. Its free ranges are indexed per stream by
// (length, address) for a best fit; a returned range merges with its free
// neighbours. A range freed on another stream than its slab's is deferred
// until that free is complete. Taking a slab's chunks from the large pool
// and giving an empty slab's back stay with Lake::Impl (small_pool.cc):
// this class keeps the slabs and their ranges.
//
// No locking of its own: Lake::Impl guards it with its lock.
#ifndef JAXLAKE_CC_LAKE_SMALL_POOL_H_
#define JAXLAKE_CC_LAKE_SMALL_POOL_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cc/lake/structures.h"

namespace jaxlake {
namespace detail {

class SmallPool {
 public:
  // A small range freed on another stream than its slab's, waiting for
  // that free (its tag) to be complete.
  struct Deferred {
    Tag tag;
    std::uint64_t slab;
    std::size_t off, len;
  };

  SmallPool() = default;
  SmallPool(const SmallPool&) = delete;
  SmallPool& operator=(const SmallPool&) = delete;

  // Adds slab `id` (its placement, base, bytes and stream set), all free.
  void AddSlab(std::uint64_t id, Slab slab);
  // Takes `len` bytes for stream s from the best-fitting free range of its
  // slabs: false if none has room, else the address and the slab.
  bool Take(std::size_t len, Stream s, std::uintptr_t* addr,
            std::uint64_t* slab_id);
  // Returns `len` bytes at offset `off` of a slab, merging neighbours; true
  // when the slab is then empty (the caller gives it back: RemoveSlab).
  bool Return(std::uint64_t slab_id, std::size_t off, std::size_t len);
  // Removes an empty slab; returns it (where its chunks lie).
  Slab RemoveSlab(std::uint64_t slab_id);

  const Slab& slab(std::uint64_t id) const { return slabs_.at(id); }
  const std::unordered_map<std::uint64_t, Slab>& slabs() const {
    return slabs_;
  }

  // ---- ranges freed on other streams ------------------------------------
  void Defer(const Deferred& d) { deferred_.push_back(d); }
  bool HasDeferred() const { return !deferred_.empty(); }
  // Takes out the deferred ranges for which safe(tag) holds, in the order
  // they were deferred (the caller returns each).
  template <typename Safe>
  std::vector<Deferred> TakeReady(Safe&& safe) {
    std::vector<Deferred> ready;
    std::size_t keep = 0;
    for (std::size_t i = 0; i < deferred_.size(); ++i) {
      const Deferred d = deferred_[i];
      if (safe(d.tag))
        ready.push_back(d);
      else
        deferred_[keep++] = d;
    }
    deferred_.resize(keep);
    return ready;
  }

  // The pool's own invariants (each slab's free ranges tile what it does
  // not lend, are merged and indexed); "" when they hold, else the first
  // broken. The slabs' blocks in their segments are Lake::Impl::Check's.
  std::string CheckInvariants() const;

 private:
  std::unordered_map<std::uint64_t, Slab> slabs_;
  std::map<std::uintptr_t, std::uint64_t> by_base_;  // slab base -> id
  // Per stream: free small ranges as (length, address).
  std::unordered_map<Stream, std::set<std::pair<std::size_t, std::uintptr_t>>>
      free_;
  std::vector<Deferred> deferred_;
};

}  // namespace detail
}  // namespace jaxlake

#endif  // JAXLAKE_CC_LAKE_SMALL_POOL_H_
