// jaxlake: statistics, declared once.
//
// Gauges have a current value and a peak; counters only grow. The two lists
// below are the single declaration: the C++ struct, the Python Stats
// dataclass and the JSON/report field names are all generated from them.
#ifndef JAXLAKE_STATS_STATS_H_
#define JAXLAKE_STATS_STATS_H_

#include <algorithm>
#include <cstdint>

#include "cc/vmm/driver.h"

namespace jaxlake {

// X(name, doc)
#define JAXLAKE_GAUGES(X)                                                   \
  X(bytes_in_use, "bytes requested by live allocations (unrounded)")        \
  X(bytes_in_use_rounded, "bytes of live allocations after rounding")       \
  X(bytes_reserved, "physical bytes held from the driver")                  \
  X(bytes_small_reserved, "physical bytes held by the small-request pool")  \
  X(stitched_bytes, "virtual bytes of stitched ranges (live and cached)")   \
  X(segments, "physical handles held from the driver")                      \
  X(live_allocations, "allocations not yet freed")                          \
  X(unreleased, "driver resources whose release failed, kept for a retry")  \
  X(bytes_unreleased, "physical bytes the driver failed to release (retried)")

// X(name, doc)
#define JAXLAKE_COUNTERS(X)                                                  \
  X(allocs, "successful allocations")                                        \
  X(frees, "frees")                                                          \
  X(alloc_small, "allocations served by the small-request pool")             \
  X(alloc_fit, "large allocations served by an exactly fitting free block")  \
  X(alloc_split, "large allocations served by splitting a free block")       \
  X(alloc_stitch_reuse, "large allocations served by a cached stitched range") \
  X(alloc_stitch, "large allocations served by stitching free blocks")       \
  X(alloc_stitch_grow, "stitches that created only the shortfall")           \
  X(alloc_grow, "large allocations served by a new physical handle")         \
  X(stitched_bytes_total, "bytes served by new stitches")                    \
  X(stitch_pieces, "mapped pieces in new stitched ranges")                   \
  X(stitch_evictions, "cached stitched ranges unmapped")                     \
  X(segments_released, "physical handles given back to the driver")          \
  X(reclaims, "times the lake reclaimed memory under pressure")              \
  X(event_waits, "times the lake waited for a stream event")                 \
  X(ooms, "allocations refused for lack of memory")                          \
  X(driver_errors, "driver calls that failed (rolled back, or kept to retry)")

struct Gauge {
  std::int64_t current = 0;
  std::int64_t peak = 0;
  void add(std::int64_t delta) {
    current += delta;
    peak = std::max(peak, current);
  }
};

struct Stats {
#define JAXLAKE_X(name, doc) Gauge name;
  JAXLAKE_GAUGES(JAXLAKE_X)
#undef JAXLAKE_X
#define JAXLAKE_X(name, doc) std::uint64_t name = 0;
  JAXLAKE_COUNTERS(JAXLAKE_X)
#undef JAXLAKE_X
  vmm::CallCounts driver_calls{};
};

}  // namespace jaxlake

#endif  // JAXLAKE_STATS_STATS_H_
