// jaxlake: the replay engine.
//
// Runs the events of one device of a trace through a policy, in order, and
// measures what docs/benchmarks.md reports:
//   U  = peak live requested bytes / peak physical bytes reserved
//   W  = peak reserved - peak live (bytes)
// with the peak reserved, the driver calls by kind (over the whole trace and
// over its second half, the steady state after warm-up), their modelled
// driver time (the policy options' latency model), the policy's counters,
// and the CPU time of every allocate and free (a clock read around each
// call, less the clock's own cost; pooled over several replays when asked):
// percentiles per kind and the median of all. With a capacity (set in the policy's options) an allocation the
// policy cannot serve stops the replay, and the result says at which event
// and line, for what request, with how much live and reserved.
//
// Addresses live in a vector indexed by the events' slots (trace.h); the
// loop makes no allocation of its own after its start.
#ifndef JAXLAKE_REPLAY_ENGINE_H_
#define JAXLAKE_REPLAY_ENGINE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cc/replay/policy.h"
#include "cc/replay/trace.h"

namespace jaxlake::replay {

struct ReplayOptions {
  std::uint32_t device = 0;
  // Points of the memory timeline (max live and reserved per bucket of
  // events); 0: none.
  std::size_t timeline_points = 1000;
  // Time every call (off: only the wall time of the whole loop).
  bool timing = true;
  // Tests: validate the policy's invariants every this many events and at
  // the end (0: never).
  std::size_t check_every = 0;
  // Replay(trace, factory, ...): replays timed in all, each with a fresh
  // policy; the call times of all of them are pooled (the other figures
  // are the first replay's). A trace of a few hundred calls, timed once,
  // gives a median that moves by a tenth from run to run.
  int timing_rounds = 1;
};

struct OpTimes {
  std::uint64_t count = 0;
  double p50_ns = 0;
  double p99_ns = 0;
  double mean_ns = 0;
  double total_ns = 0;
};

struct ReplayResult {
  std::string policy;
  std::uint32_t device = 0;
  std::uint64_t events = 0;  // events of the device replayed
  std::uint64_t allocs = 0;
  std::uint64_t frees = 0;
  std::uint64_t peak_live = 0;      // requested bytes
  std::uint64_t peak_reserved = 0;  // physical bytes
  std::uint64_t final_reserved = 0;
  double utilisation = 0;  // peak_live / peak_reserved (0 when nothing)
  std::int64_t waste = 0;  // peak_reserved - peak_live
  vmm::CallCounts calls{};
  // Calls made from the device's middle event on (its second half).
  vmm::CallCounts calls_second_half{};
  std::uint64_t half_event = 0;  // index in the trace of that middle event
  // Modelled driver time of the calls, by kind (us): all, second half.
  vmm::CallTimes driver_us{};
  vmm::CallTimes driver_us_second_half{};
  Counters counters;

  bool oom = false;
  std::uint64_t oom_event = 0;  // index in the trace's events
  std::uint32_t oom_line = 0;
  std::uint64_t oom_size = 0;
  std::uint64_t oom_stream = 0;
  std::uint64_t oom_live = 0;
  std::uint64_t oom_reserved = 0;

  OpTimes alloc_times;
  OpTimes free_times;
  double median_ns = 0;     // median over every timed call
  int timing_rounds = 1;    // replays whose call times are pooled
  double wall_s = 0;        // the whole loop
  double events_per_s = 0;
  double clock_overhead_ns = 0;

  // Timeline: first event index of each bucket, its max live and reserved.
  std::vector<std::uint64_t> timeline_event;
  std::vector<std::uint64_t> timeline_live;
  std::vector<std::uint64_t> timeline_reserved;

  std::string check_error;  // first invariant failure (check_every)
};

ReplayResult Replay(const Trace& trace, Policy& policy,
                    const ReplayOptions& options);

// The same with options.timing_rounds replays, each with a new policy from
// `make` (destroyed after its replay, outside the timing).
using PolicyFactory = std::function<std::unique_ptr<Policy>()>;
ReplayResult Replay(const Trace& trace, const PolicyFactory& make,
                    const ReplayOptions& options);

}  // namespace jaxlake::replay

#endif  // JAXLAKE_REPLAY_ENGINE_H_
