// jaxlake: one replay of the "jaxlake" policy that keeps what a viewer
// needs (`jaxlake view`): how the lake served every allocation, and copies
// of its layout (Lake::snapshot()) after chosen events.
//
// It runs the same lake over the same simulated driver as the "jaxlake"
// policy of the replay engine (LakePolicySetup), with nothing timed.
// Snapshots are taken after the events asked for, after allocations served
// by a stitched range (stitch, stitch_grow or stitch_reuse; at most
// `stitch_snapshots` of them, spread evenly over the run: once the budget
// is full every other one is dropped and only every second later one is
// kept), and after an allocation that failed for lack of memory (the
// replay stops there).
#ifndef JAXLAKE_REPLAY_LAKE_VIEW_H_
#define JAXLAKE_REPLAY_LAKE_VIEW_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "cc/lake/lake.h"
#include "cc/replay/policy.h"
#include "cc/replay/trace.h"

namespace jaxlake::replay {

struct LakeViewOptions {
  std::uint32_t device = 0;
  // Trace event indices to snapshot after (any order; other devices'
  // events and indices past the end are ignored).
  std::vector<std::uint64_t> snapshot_events;
  // Most snapshots taken after allocations served by a stitched range
  // (0: none).
  std::size_t stitch_snapshots = 0;
};

// Why a snapshot was taken (a bit set).
inline constexpr std::uint8_t kSnapshotAsked = 1;
inline constexpr std::uint8_t kSnapshotStitch = 2;
inline constexpr std::uint8_t kSnapshotOom = 4;

struct LakeViewSnapshot {
  std::uint64_t event = 0;  // trace event index (after it)
  std::uint8_t why = 0;     // kSnapshot* bits
  LakeSnapshot layout;
  // The device's live allocations then: (address, trace event index of
  // the allocation).
  std::vector<std::pair<std::uintptr_t, std::uint64_t>> live;
};

// How each event was served: an AllocState for an allocation of the
// device, kNotServed for frees, other devices' events and events after an
// out-of-memory stop.
inline constexpr std::uint8_t kNotServed = 0xff;

struct LakeViewResult {
  std::vector<std::uint8_t> served;  // one per trace event
  std::vector<LakeViewSnapshot> snapshots;  // in event order
  std::uint64_t stitches = 0;  // allocations served by stitch or stitch_grow
  std::uint64_t stitched_allocs = 0;  // ... or by stitch_reuse
  bool oom = false;
  std::uint64_t oom_event = 0;
  std::string error;  // invalid options, or a driver failure
};

LakeViewResult ReplayLakeView(const Trace& trace,
                              const PolicyOptions& policy,
                              const LakeViewOptions& options);

}  // namespace jaxlake::replay

#endif  // JAXLAKE_REPLAY_LAKE_VIEW_H_
