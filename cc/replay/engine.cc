// jaxlake: the replay engine. See engine.h.
#include "cc/replay/engine.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <memory>

#if defined(__x86_64__)
#include <cpuid.h>
#include <x86intrin.h>
#endif

namespace jaxlake::replay {

namespace {

using Clock = std::chrono::steady_clock;

// Per-call timing reads a tick counter: the x86 time-stamp counter where
// the CPU says it is invariant (one tick is a fixed time, on every core),
// else the steady clock in ns. On the development machine steady_clock
// costs 20-30 ns a read and moves in steps of about 10 ns, as coarse as
// the calls it times; the time-stamp counter costs about 10 ns, in steps of
// under 1 ns.
// The steady clock, in ns.
inline std::uint64_t SteadyNs() {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(
          Clock::now().time_since_epoch())
          .count());
}

#if defined(__x86_64__)
bool InvariantTsc() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(0x80000007, &a, &b, &c, &d) && (d & (1u << 8)) != 0;
}
const bool kUseTsc = InvariantTsc();
inline std::uint64_t Ticks() {
  if (!kUseTsc) return SteadyNs();
  _mm_lfence();  // the calls before have finished
  const std::uint64_t t = __rdtsc();
  _mm_lfence();  // the timed call starts after the read
  return t;
}
#else
const bool kUseTsc = false;
inline std::uint64_t Ticks() { return SteadyNs(); }
#endif

// Ticks per ns: 1 for the steady clock, else measured once against it
// over 20 ms.
double TicksPerNs() {
  static const double ratio = [] {
    if (!kUseTsc) return 1.0;
    const auto t0 = Clock::now();
    const std::uint64_t c0 = Ticks();
    auto t1 = t0;
    while (t1 - t0 < std::chrono::milliseconds(20)) t1 = Clock::now();
    const std::uint64_t c1 = Ticks();
    const double ns = static_cast<double>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0)
            .count());
    return static_cast<double>(c1 - c0) / ns;
  }();
  return ratio;
}

// The ticks of one Ticks() pair (median of many).
std::uint64_t OverheadTicks() {
  std::vector<std::uint64_t> d(2001);
  for (auto& x : d) {
    const std::uint64_t a = Ticks();
    const std::uint64_t b = Ticks();
    x = b - a;
  }
  std::nth_element(d.begin(), d.begin() + 1000, d.end());
  return d[1000];
}

// Percentile q of times in ticks, in ns.
double Percentile(std::vector<std::uint32_t>* v, double q) {
  if (v->empty()) return 0;
  const auto k = static_cast<std::size_t>(q * static_cast<double>(v->size() - 1));
  std::nth_element(v->begin(), v->begin() + static_cast<std::ptrdiff_t>(k),
                   v->end());
  return static_cast<double>((*v)[k]) / TicksPerNs();
}

OpTimes Summarise(std::vector<std::uint32_t>* v) {
  OpTimes t;
  t.count = v->size();
  if (v->empty()) return t;
  double total = 0;
  for (std::uint32_t x : *v) total += x;
  t.total_ns = total / TicksPerNs();
  t.mean_ns = t.total_ns / static_cast<double>(v->size());
  t.p99_ns = Percentile(v, 0.99);
  t.p50_ns = Percentile(v, 0.50);
  return t;
}

// Times of the timed calls (ticks, less the clock's own).
struct CallTicks {
  std::vector<std::uint32_t> alloc, free;
};

void SummariseTimes(CallTicks* t, ReplayResult* r) {
  std::vector<std::uint32_t> all;
  all.reserve(t->alloc.size() + t->free.size());
  all.insert(all.end(), t->alloc.begin(), t->alloc.end());
  all.insert(all.end(), t->free.begin(), t->free.end());
  r->median_ns = Percentile(&all, 0.5);
  r->alloc_times = Summarise(&t->alloc);
  r->free_times = Summarise(&t->free);
}

// One replay of the device's events; the timed calls' ticks are appended
// to *ticks.
ReplayResult ReplayOnce(const Trace& trace, Policy& policy,
                        const ReplayOptions& options, CallTicks* ticks) {
  ReplayResult r;
  r.policy = policy.name();
  r.device = options.device;
  const std::vector<TraceFileEvent>& events = trace.events;

  std::uint64_t device_events = 0;
  for (const TraceFileEvent& e : events)
    device_events += e.dev == options.device;

  std::vector<std::uintptr_t> address(trace.slots, 0);
  std::vector<std::uint8_t> valid(trace.slots, 0);
  std::vector<std::uint32_t>& alloc_ticks = ticks->alloc;
  std::vector<std::uint32_t>& free_ticks = ticks->free;
  if (options.timing) {
    alloc_ticks.reserve(alloc_ticks.size() + device_events / 2 + 1);
    free_ticks.reserve(free_ticks.size() + device_events / 2 + 1);
  }
  const std::uint64_t overhead = options.timing ? OverheadTicks() : 0;
  r.clock_overhead_ns = static_cast<double>(overhead) / TicksPerNs();
  // One timed call, in ticks less the clock's own (clamped to 32 bits).
  auto elapsed = [overhead](std::uint64_t t0, std::uint64_t t1) {
    const std::uint64_t d = t1 - t0;
    return static_cast<std::uint32_t>(
        std::min<std::uint64_t>(d > overhead ? d - overhead : 0, 0xffffffff));
  };

  // Timeline buckets over the whole trace's event indices, so that the
  // timelines of all devices and policies share one x axis.
  std::size_t bucket = 0;
  if (options.timeline_points > 0 && !events.empty())
    bucket = (events.size() + options.timeline_points - 1) /
             options.timeline_points;
  std::uint64_t cur_bucket = std::numeric_limits<std::uint64_t>::max();
  std::uint64_t bucket_live = 0;
  std::uint64_t bucket_reserved = 0;
  auto flush = [&] {
    if (cur_bucket == std::numeric_limits<std::uint64_t>::max()) return;
    r.timeline_event.push_back(cur_bucket * bucket);
    r.timeline_live.push_back(bucket_live);
    r.timeline_reserved.push_back(bucket_reserved);
  };

  // The steady state: what the policy does from the device's middle event
  // on (a trace that runs out of memory before it has no second half).
  const std::uint64_t half = device_events / 2;
  std::uint64_t seen = 0;
  bool reached_half = false;
  vmm::CallCounts half_calls{};
  vmm::CallTimes half_us{};

  std::uint64_t live = 0;
  std::uint64_t since_check = 0;
  const auto start = Clock::now();
  for (std::size_t i = 0; i < events.size(); ++i) {
    const TraceFileEvent& e = events[i];
    if (e.dev != options.device) continue;
    if (seen++ == half) {
      reached_half = true;
      r.half_event = i;
      half_calls = policy.calls();
      half_us = policy.driver_us();
    }
    if (e.alloc) {
      std::uintptr_t a = 0;
      bool ok;
      if (options.timing) {
        const std::uint64_t t0 = Ticks();
        ok = policy.allocate(e.size, e.stream, &a);
        alloc_ticks.push_back(elapsed(t0, Ticks()));
      } else {
        ok = policy.allocate(e.size, e.stream, &a);
      }
      if (!ok) {
        r.oom = true;
        r.oom_event = i;
        r.oom_line = e.line;
        r.oom_size = e.size;
        r.oom_stream = e.stream;
        r.oom_live = live;
        r.oom_reserved = policy.reserved();
        break;
      }
      address[e.slot] = a;
      valid[e.slot] = 1;
      live += e.size;
      ++r.allocs;
      if (live > r.peak_live) r.peak_live = live;
    } else {
      if (!valid[e.slot]) continue;  // cannot happen: the parser checked
      if (options.timing) {
        const std::uint64_t t0 = Ticks();
        policy.free(address[e.slot], e.stream);
        free_ticks.push_back(elapsed(t0, Ticks()));
      } else {
        policy.free(address[e.slot], e.stream);
      }
      valid[e.slot] = 0;
      live -= e.size;
      ++r.frees;
    }
    ++r.events;
    const std::uint64_t reserved = policy.reserved();
    if (reserved > r.peak_reserved) r.peak_reserved = reserved;
    if (bucket != 0) {
      const std::uint64_t b = i / bucket;
      if (b != cur_bucket) {
        flush();
        cur_bucket = b;
        bucket_live = 0;
        bucket_reserved = 0;
      }
      bucket_live = std::max(bucket_live, live);
      bucket_reserved = std::max(bucket_reserved, reserved);
    }
    if (options.check_every != 0 && ++since_check >= options.check_every) {
      since_check = 0;
      if (r.check_error.empty()) {
        const std::string problem = policy.check();
        if (!problem.empty())
          r.check_error = "after event " + std::to_string(i) + " (line " +
                          std::to_string(e.line) + "): " + problem;
      }
    }
  }
  const auto stop = Clock::now();
  flush();
  if (options.check_every != 0 && r.check_error.empty()) {
    const std::string problem = policy.check();
    if (!problem.empty()) r.check_error = "at the end: " + problem;
  }

  r.wall_s = std::chrono::duration<double>(stop - start).count();
  r.events_per_s =
      r.wall_s > 0 ? static_cast<double>(r.events) / r.wall_s : 0;
  r.final_reserved = policy.reserved();
  r.utilisation = r.peak_reserved
                      ? static_cast<double>(r.peak_live) /
                            static_cast<double>(r.peak_reserved)
                      : 0;
  r.waste = static_cast<std::int64_t>(r.peak_reserved) -
            static_cast<std::int64_t>(r.peak_live);
  r.calls = policy.calls();
  r.driver_us = policy.driver_us();
  if (reached_half) {
    for (int k = 0; k < vmm::kNumCalls; ++k) {
      r.calls_second_half[k] = r.calls[k] - half_calls[k];
      r.driver_us_second_half[k] = r.driver_us[k] - half_us[k];
    }
  }
  r.counters = policy.counters();
  return r;
}

}  // namespace

ReplayResult Replay(const Trace& trace, Policy& policy,
                    const ReplayOptions& options) {
  CallTicks ticks;
  ReplayResult r = ReplayOnce(trace, policy, options, &ticks);
  if (options.timing) SummariseTimes(&ticks, &r);
  return r;
}

ReplayResult Replay(const Trace& trace, const PolicyFactory& make,
                    const ReplayOptions& options) {
  CallTicks ticks;
  ReplayResult r;
  {
    std::unique_ptr<Policy> p = make();
    r = ReplayOnce(trace, *p, options, &ticks);
  }  // the policy's teardown is not timed
  if (!options.timing) return r;
  ReplayOptions again = options;
  again.timeline_points = 0;
  again.check_every = 0;
  for (int round = 1; round < options.timing_rounds; ++round) {
    std::unique_ptr<Policy> p = make();
    ReplayOnce(trace, *p, again, &ticks);
  }
  r.timing_rounds = std::max(options.timing_rounds, 1);
  SummariseTimes(&ticks, &r);
  return r;
}

}  // namespace jaxlake::replay
