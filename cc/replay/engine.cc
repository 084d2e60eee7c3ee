// jaxlake: the replay engine. See engine.h.
#include "cc/replay/engine.h"

#include <algorithm>
#include <chrono>
#include <limits>

namespace jaxlake::replay {

namespace {

using Clock = std::chrono::steady_clock;

double Percentile(std::vector<std::uint32_t>* v, double q) {
  if (v->empty()) return 0;
  const auto k = static_cast<std::size_t>(q * static_cast<double>(v->size() - 1));
  std::nth_element(v->begin(), v->begin() + static_cast<std::ptrdiff_t>(k),
                   v->end());
  return (*v)[k];
}

OpTimes Summarise(std::vector<std::uint32_t>* v) {
  OpTimes t;
  t.count = v->size();
  if (v->empty()) return t;
  double total = 0;
  for (std::uint32_t x : *v) total += x;
  t.total_ns = total;
  t.mean_ns = total / static_cast<double>(v->size());
  t.p99_ns = Percentile(v, 0.99);
  t.p50_ns = Percentile(v, 0.50);
  return t;
}

}  // namespace

double ClockOverheadNs() {
  std::vector<std::uint32_t> d(2001);
  for (auto& x : d) {
    const auto a = Clock::now();
    const auto b = Clock::now();
    x = static_cast<std::uint32_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(b - a).count());
  }
  return Percentile(&d, 0.5);
}

ReplayResult Replay(const Trace& trace, Policy& policy,
                    const ReplayOptions& options) {
  ReplayResult r;
  r.policy = policy.name();
  r.device = options.device;
  const std::vector<TraceEvent>& events = trace.events;

  std::uint64_t device_events = 0;
  for (const TraceEvent& e : events) device_events += e.dev == options.device;

  std::vector<std::uintptr_t> address(trace.slots, 0);
  std::vector<std::uint8_t> valid(trace.slots, 0);
  std::vector<std::uint32_t> alloc_ns;
  std::vector<std::uint32_t> free_ns;
  if (options.timing) {
    alloc_ns.reserve(device_events / 2 + 1);
    free_ns.reserve(device_events / 2 + 1);
  }
  const double overhead = options.timing ? ClockOverheadNs() : 0;
  r.clock_overhead_ns = overhead;
  const auto overhead_ns = static_cast<std::int64_t>(overhead);

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
    const TraceEvent& e = events[i];
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
        const auto t0 = Clock::now();
        ok = policy.allocate(e.size, e.stream, &a);
        const auto t1 = Clock::now();
        const std::int64_t ns =
            std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0)
                .count() -
            overhead_ns;
        alloc_ns.push_back(static_cast<std::uint32_t>(
            std::clamp<std::int64_t>(ns, 0, 0xffffffff)));
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
        const auto t0 = Clock::now();
        policy.free(address[e.slot], e.stream);
        const auto t1 = Clock::now();
        const std::int64_t ns =
            std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0)
                .count() -
            overhead_ns;
        free_ns.push_back(static_cast<std::uint32_t>(
            std::clamp<std::int64_t>(ns, 0, 0xffffffff)));
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
  if (options.timing) {
    std::vector<std::uint32_t> all;
    all.reserve(alloc_ns.size() + free_ns.size());
    all.insert(all.end(), alloc_ns.begin(), alloc_ns.end());
    all.insert(all.end(), free_ns.begin(), free_ns.end());
    r.median_ns = Percentile(&all, 0.5);
    r.alloc_times = Summarise(&alloc_ns);
    r.free_times = Summarise(&free_ns);
  }
  return r;
}

}  // namespace jaxlake::replay
