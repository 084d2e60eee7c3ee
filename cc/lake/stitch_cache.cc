// jaxlake: the stitch cache's invariants (stitch_cache.h).
#include "cc/lake/stitch_cache.h"

#include <sstream>
#include <unordered_set>

namespace jaxlake {
namespace detail {

std::string StitchCache::CheckInvariants() const {
  std::ostringstream e;
  // The list first: each id once, of a cached range. Then, with as many
  // cached ranges as listed ids, every cached range is listed and its
  // iterator is valid.
  std::unordered_set<std::uint64_t> listed;
  for (std::uint64_t id : lru_) {
    auto it = ranges_.find(id);
    if (it == ranges_.end() || !it->second.cached ||
        !listed.insert(id).second) {
      e << "stitch cache lists range " << id
        << " twice, or one missing or not cached";
      return e.str();
    }
  }
  std::size_t cached = 0;
  for (const auto& [id, r] : ranges_) {
    if (r.cached) ++cached;
    if (r.cached == (r.used > 0) && !r.mapping && !r.dropping) {
      e << "stitched range " << id << " is both live and cached or neither";
      return e.str();
    }
  }
  if (cached != lru_.size()) {
    e << "stitch cache holds " << lru_.size() << " ids for " << cached
      << " cached ranges";
    return e.str();
  }
  for (const auto& [id, r] : ranges_) {
    if (r.cached && *r.lru != id) {
      e << "cached stitched range " << id << " is listed as " << *r.lru;
      return e.str();
    }
  }
  return e.str();
}

}  // namespace detail
}  // namespace jaxlake
