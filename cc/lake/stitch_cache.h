// jaxlake: the stitched ranges and the cache of those not in use
// (docs/design.md, "Structures"). Private to cc/lake/; not installed.
//
// A stitched range is live while its block is lent; once freed it stays
// mapped, cached, so that a later request of its size reuses the mapping
// (stitch reuse) instead of mapping again. The cache orders its ranges by
// their last free, most recent first; eviction takes the oldest whose last
// use is complete. Mapping and unmapping (driver calls, made with the
// lake's lock released) and the pieces' segments stay with Lake::Impl
// (stitch.cc); this class keeps the ranges and the order.
//
// No locking of its own: Lake::Impl guards it with its lock.
#ifndef JAXLAKE_CC_LAKE_STITCH_CACHE_H_
#define JAXLAKE_CC_LAKE_STITCH_CACHE_H_

#include <cstdint>
#include <list>
#include <string>
#include <unordered_map>

#include "cc/lake/structures.h"

namespace jaxlake {
namespace detail {

class StitchCache {
 public:
  using Ranges = std::unordered_map<std::uint64_t, Stitched>;

  StitchCache() = default;
  StitchCache(const StitchCache&) = delete;
  StitchCache& operator=(const StitchCache&) = delete;

  // ---- the ranges, live or cached, by id --------------------------------
  // A new range (id must be unused).
  Stitched& New(std::uint64_t id) { return ranges_[id]; }
  Stitched& at(std::uint64_t id) { return ranges_.at(id); }
  const Stitched& at(std::uint64_t id) const { return ranges_.at(id); }
  // nullptr when there is no range `id`.
  const Stitched* Find(std::uint64_t id) const {
    auto it = ranges_.find(id);
    return it == ranges_.end() ? nullptr : &it->second;
  }
  // Forgets range `id`, leaving the cache first if it is in it.
  void Erase(std::uint64_t id) {
    Uncache(id);
    ranges_.erase(id);
  }
  const Ranges& ranges() const { return ranges_; }
  std::size_t size() const { return ranges_.size(); }

  // ---- the cache of ranges not in use -----------------------------------
  // Range `id` was freed (its last use tagged in its `tag`): it becomes the
  // most recent in the cache.
  void Cache(std::uint64_t id) {
    Stitched& r = ranges_.at(id);
    r.cached = true;
    lru_.push_front(id);
    r.lru = lru_.begin();
  }
  // Range `id` leaves the cache (reused or dropped); nothing if not in it.
  void Uncache(std::uint64_t id) {
    Stitched& r = ranges_.at(id);
    if (!r.cached) return;
    lru_.erase(r.lru);
    r.cached = false;
  }
  // Ranges in the cache.
  std::size_t cached() const { return lru_.size(); }
  // The cached ids, most recently freed first.
  const std::list<std::uint64_t>& MostRecentFirst() const { return lru_; }
  // The oldest cached range for which pred(range) holds; 0 when none.
  template <typename Pred>
  std::uint64_t Oldest(Pred&& pred) const {
    for (auto it = lru_.rbegin(); it != lru_.rend(); ++it)
      if (pred(ranges_.at(*it))) return *it;
    return 0;
  }

  // The cache's own invariants (each range cached exactly when it is
  // neither lent nor busy, and listed once); "" when they hold, else the
  // first broken. The pieces against the segments are Lake::Impl::Check's.
  std::string CheckInvariants() const;

 private:
  Ranges ranges_;
  std::list<std::uint64_t> lru_;  // cached ids, most recent first
};

}  // namespace detail
}  // namespace jaxlake

#endif  // JAXLAKE_CC_LAKE_STITCH_CACHE_H_
