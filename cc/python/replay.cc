// jaxlake._core: the trace and replay bindings (cc/replay), added to the
// module by module.cc through BindReplay(). Private like the rest of
// _core: jaxlake/_src/trace/tracefile.py and replay.py wrap them.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cc/replay/engine.h"
#include "cc/replay/fit.h"
#include "cc/replay/lake_view.h"
#include "cc/replay/policy.h"
#include "cc/replay/trace.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace jaxlake::replay {
namespace {

// A parsed trace, shared so that a replay may run while Python drops it.
class PyTrace {
 public:
  explicit PyTrace(Trace t) : trace_(std::make_shared<Trace>(std::move(t))) {}

  std::size_t size() const { return trace_->events.size(); }
  std::optional<std::tuple<std::uint32_t, std::string, bool>> error() const {
    if (trace_->ok()) return std::nullopt;
    return std::make_tuple(trace_->error.line, trace_->error.reason,
                           trace_->error_fatal);
  }
  std::vector<std::pair<std::uint32_t, std::string>> skipped() const {
    std::vector<std::pair<std::uint32_t, std::string>> out;
    for (const TraceProblem& p : trace_->skipped)
      out.emplace_back(p.line, p.reason);
    return out;
  }
  std::uint64_t skipped_count() const { return trace_->skipped_count; }
  std::uint64_t ignored() const { return trace_->ignored; }
  std::uint32_t lines() const { return trace_->lines; }
  std::uint32_t devices() const { return trace_->devices; }
  std::uint32_t header_line() const { return trace_->header_line; }
  const std::string& header() const { return trace_->header; }

  // (t, alloc, id, dev, size, stream, kind) per event.
  std::vector<std::tuple<std::uint64_t, bool, std::uint64_t, std::uint32_t,
                         std::uint64_t, std::uint64_t, std::string>>
  events() const {
    std::vector<std::tuple<std::uint64_t, bool, std::uint64_t, std::uint32_t,
                           std::uint64_t, std::uint64_t, std::string>>
        out;
    out.reserve(trace_->events.size());
    for (const TraceFileEvent& e : trace_->events)
      out.emplace_back(e.t, e.alloc, e.id, e.dev, e.size, e.stream,
                       KindName(e.kind));
    return out;
  }

  // The events as columns of little-endian arrays (bytes), for numpy:
  // t, size, stream (uint64), dev, slot, line (uint32), alloc, kind
  // (uint8; kind as in JAXLAKE_TRACE_KINDS, 0 when not given).
  nb::dict columns() const {
    const std::vector<TraceFileEvent>& ev = trace_->events;
    const std::size_t n = ev.size();
    std::vector<std::uint64_t> t(n), size(n), stream(n);
    std::vector<std::uint32_t> dev(n), slot(n), line(n);
    std::vector<std::uint8_t> alloc(n), kind(n);
    for (std::size_t i = 0; i < n; ++i) {
      t[i] = ev[i].t;
      size[i] = ev[i].size;
      stream[i] = ev[i].stream;
      dev[i] = ev[i].dev;
      slot[i] = ev[i].slot;
      line[i] = ev[i].line;
      alloc[i] = ev[i].alloc ? 1 : 0;
      kind[i] = ev[i].kind;
    }
    auto raw = [](const auto& v) {
      return nb::bytes(reinterpret_cast<const char*>(v.data()),
                       v.size() * sizeof(v[0]));
    };
    nb::dict d;
    d["t"] = raw(t);
    d["size"] = raw(size);
    d["stream"] = raw(stream);
    d["dev"] = raw(dev);
    d["slot"] = raw(slot);
    d["line"] = raw(line);
    d["alloc"] = raw(alloc);
    d["kind"] = raw(kind);
    return d;
  }

  // Events per device (index: device).
  std::vector<std::uint64_t> device_events() const {
    std::vector<std::uint64_t> out(trace_->devices, 0);
    for (const TraceFileEvent& e : trace_->events) ++out[e.dev];
    return out;
  }

  // The most requested bytes live at once on a device (no replay needed).
  std::uint64_t peak_live(std::uint32_t dev) const {
    std::uint64_t live = 0;
    std::uint64_t peak = 0;
    for (const TraceFileEvent& e : trace_->events) {
      if (e.dev != dev) continue;
      if (e.alloc) {
        live += e.size;
        if (live > peak) peak = live;
      } else {
        live -= e.size;
      }
    }
    return peak;
  }

  nb::bytes to_jsonl(const std::string& header) const {
    std::string out;
    {
      nb::gil_scoped_release release;
      out = WriteJsonl(*trace_, header);
    }
    return nb::bytes(out.data(), out.size());
  }

  nb::bytes to_csv() const {
    std::string out;
    std::string error;
    bool ok;
    {
      nb::gil_scoped_release release;
      ok = WriteCsv(*trace_, &out, &error);
    }
    if (!ok) throw nb::value_error(error.c_str());
    return nb::bytes(out.data(), out.size());
  }

  std::shared_ptr<Trace> get() const { return trace_; }

 private:
  std::shared_ptr<Trace> trace_;
};

PyTrace Parse(nb::bytes data, bool csv, bool lenient) {
  const char* p = data.c_str();
  const std::size_t n = data.size();
  Trace t;
  {
    nb::gil_scoped_release release;
    t = ParseTrace(p, n, csv, lenient);
  }
  return PyTrace(std::move(t));
}

nb::dict ByKind(const vmm::CallCounts& c) {
  nb::dict d;
  for (int i = 0; i < vmm::kNumCalls; ++i)
    d[vmm::CallName(static_cast<vmm::Call>(i))] = c[i];
  return d;
}

nb::dict ByKind(const vmm::CallTimes& t) {
  nb::dict d;
  for (int i = 0; i < vmm::kNumCalls; ++i)
    d[vmm::CallName(static_cast<vmm::Call>(i))] = t[i];
  return d;
}

// A by-kind member of T as a dict, for a read-only property.
template <typename T, typename A>
auto KindProperty(A T::*member) {
  return [member](const T& r) { return ByKind(r.*member); };
}

vmm::Call KindOf(const std::string& name) {
  vmm::Call c;
  if (!vmm::CallFromName(name, &c)) {
    std::string known;
    for (int i = 0; i < vmm::kNumCalls; ++i)
      known += std::string(known.empty() ? "" : ", ") +
               vmm::CallName(static_cast<vmm::Call>(i));
    throw nb::value_error(("unknown driver call kind '" + name +
                           "': expected one of " + known)
                              .c_str());
  }
  return c;
}

void SetLatency(vmm::LatencyModel& m, const std::string& kind,
                const std::vector<std::uint64_t>& sizes,
                const std::vector<double>& us) {
  if (sizes.size() != us.size())
    throw nb::value_error("sizes and us must be lists of the same length");
  std::vector<vmm::LatencyPoint> p;
  for (std::size_t i = 0; i < sizes.size(); ++i)
    p.push_back(vmm::LatencyPoint{static_cast<std::size_t>(sizes[i]), us[i]});
  const std::string problem = m.set(KindOf(kind), std::move(p));
  if (!problem.empty()) throw nb::value_error(problem.c_str());
}

std::vector<std::pair<std::uint64_t, double>> LatencyPoints(
    const vmm::LatencyModel& m, const std::string& kind) {
  std::vector<std::pair<std::uint64_t, double>> out;
  for (const vmm::LatencyPoint& p : m.points(KindOf(kind)))
    out.emplace_back(p.bytes, p.us);
  return out;
}

void CheckDevice(const PyTrace& trace, std::uint32_t device) {
  if (device >= trace.devices())
    throw nb::value_error(("device " + std::to_string(device) +
                           " is not below the trace's devices (" +
                           std::to_string(trace.devices()) + ")")
                              .c_str());
}

// One replay of one device (the GIL released by the caller).
ReplayResult ReplayDevice(const Trace& trace, const std::string& policy,
                          const PolicyOptions& options, std::uint32_t device,
                          std::size_t timeline_points, bool timing,
                          std::size_t check_every, int timing_rounds) {
  std::string unused;
  // The first replay's policy was checked by the caller's MakePolicy.
  ReplayOptions ro;
  ro.device = device;
  ro.timeline_points = timeline_points;
  ro.timing = timing;
  ro.check_every = check_every;
  ro.timing_rounds = timing_rounds;
  // The lake's teardown is not part of the measurement (Replay destroys
  // each policy outside the timing).
  return Replay(
      trace, [&]() { return MakePolicy(policy, options, &unused); }, ro);
}

// Throws ValueError when the policy or its options are invalid, or the
// timing rounds are.
void CheckPolicy(const std::string& policy, const PolicyOptions& options,
                 int timing_rounds) {
  std::string error;
  if (!MakePolicy(policy, options, &error))
    throw nb::value_error(error.c_str());
  if (timing_rounds < 1)
    throw nb::value_error(("timing_rounds must be at least 1, got " +
                           std::to_string(timing_rounds))
                              .c_str());
}

ReplayResult RunReplay(const PyTrace& trace, const std::string& policy,
                       const PolicyOptions& options, std::uint32_t device,
                       std::size_t timeline_points, bool timing,
                       std::size_t check_every, int timing_rounds) {
  CheckPolicy(policy, options, timing_rounds);
  CheckDevice(trace, device);
  std::shared_ptr<Trace> t = trace.get();
  nb::gil_scoped_release release;
  return ReplayDevice(*t, policy, options, device, timeline_points, timing,
                      check_every, timing_rounds);
}

// Adds `from` into `into` by name, names in the order first seen.
void AddCounters(Counters& into, const Counters& from) {
  for (const auto& [name, value] : from) {
    auto it = std::find_if(into.begin(), into.end(),
                           [&](const auto& c) { return c.first == name; });
    if (it == into.end())
      into.emplace_back(name, value);
    else
      it->second += value;
  }
}

template <typename T, std::size_t N>
void AddByKind(std::array<T, N>& into, const std::array<T, N>& from) {
  for (std::size_t i = 0; i < N; ++i) into[i] += from[i];
}

// Per-device timelines summed on their shared event axis, each device
// holding its last value where it has no point.
void MergeTimelines(const std::vector<ReplayResult>& parts,
                    ReplayResult& out) {
  if (parts.size() == 1) {
    out.timeline_event = parts[0].timeline_event;
    out.timeline_live = parts[0].timeline_live;
    out.timeline_reserved = parts[0].timeline_reserved;
    return;
  }
  std::vector<std::uint64_t> keys;
  for (const ReplayResult& p : parts)
    keys.insert(keys.end(), p.timeline_event.begin(), p.timeline_event.end());
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  std::vector<std::uint64_t> live(keys.size(), 0), reserved(keys.size(), 0);
  for (const ReplayResult& p : parts) {
    std::size_t j = 0;  // p's next point (its events are increasing)
    std::uint64_t last_live = 0, last_reserved = 0;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      // A device's repeated event keeps its last point, as a dict would.
      while (j < p.timeline_event.size() && p.timeline_event[j] == keys[i]) {
        last_live = p.timeline_live[j];
        last_reserved = p.timeline_reserved[j];
        ++j;
      }
      live[i] += last_live;
      reserved[i] += last_reserved;
    }
  }
  out.timeline_event = std::move(keys);
  out.timeline_live = std::move(live);
  out.timeline_reserved = std::move(reserved);
}

// The replays of each device (`parts`, in device order) as one result:
// counts, bytes, calls, driver time, counters and wall time summed; the
// call times those of the busiest device (the first with the most
// events); the timelines merged; the out-of-memory event the earliest
// (`device` is that event's device, 0 when none).
ReplayResult Merge(const std::vector<ReplayResult>& parts) {
  ReplayResult out;
  if (parts.empty()) return out;
  out.policy = parts[0].policy;
  const ReplayResult* busiest = &parts[0];
  const ReplayResult* oom = nullptr;
  for (const ReplayResult& p : parts) {
    out.events += p.events;
    out.allocs += p.allocs;
    out.frees += p.frees;
    out.peak_live += p.peak_live;
    out.peak_reserved += p.peak_reserved;
    out.final_reserved += p.final_reserved;
    AddByKind(out.calls, p.calls);
    AddByKind(out.calls_second_half, p.calls_second_half);
    AddByKind(out.driver_us, p.driver_us);
    AddByKind(out.driver_us_second_half, p.driver_us_second_half);
    AddCounters(out.counters, p.counters);
    out.wall_s += p.wall_s;
    if (p.events > busiest->events) busiest = &p;
    if (p.oom && (oom == nullptr || p.oom_event < oom->oom_event)) oom = &p;
  }
  out.waste = static_cast<std::int64_t>(out.peak_reserved) -
              static_cast<std::int64_t>(out.peak_live);
  out.utilisation = out.peak_reserved
                        ? static_cast<double>(out.peak_live) /
                              static_cast<double>(out.peak_reserved)
                        : 0.0;
  out.events_per_s =
      out.wall_s > 0 ? static_cast<double>(out.events) / out.wall_s : 0.0;
  out.half_event = busiest->half_event;
  out.alloc_times = busiest->alloc_times;
  out.free_times = busiest->free_times;
  out.median_ns = busiest->median_ns;
  out.timing_rounds = busiest->timing_rounds;
  out.clock_overhead_ns = busiest->clock_overhead_ns;
  if (oom != nullptr) {
    out.oom = true;
    out.device = oom->device;
    out.oom_event = oom->oom_event;
    out.oom_line = oom->oom_line;
    out.oom_size = oom->oom_size;
    out.oom_stream = oom->oom_stream;
    out.oom_live = oom->oom_live;
    out.oom_reserved = oom->oom_reserved;
  }
  MergeTimelines(parts, out);
  return out;
}

// One policy's replay of a trace's devices, in one call (bench/replay.py's
// replay()): each device uncapped, then, when asked, each device's fit
// capacity, then, under a capacity, again each device whose uncapped peak
// exceeded it. A failed check stops it where it failed.
struct TraceReplay {
  ReplayResult uncapped;  // merged over the devices
  std::uint32_t devices = 0;
  // The first check failure (check_every) and its device; under the cap
  // when `capped_check_error` is set instead.
  std::string check_error;
  std::uint32_t check_device = 0;
  std::string capped_check_error;
  // The fit (fit=True): the devices whose fit was found before the first
  // that had none (fit_found: all of them), the largest fit capacity,
  // U_fit = summed peak live / summed fit capacity (when all were found),
  // and the replays at the fit capacities, summed.
  bool fit_asked = false;
  std::uint32_t fit_devices = 0;
  bool fit_found = false;
  std::uint64_t fit_capacity = 0;
  double u_fit = 0;
  bool fit_nonmonotone = false;
  vmm::CallCounts fit_calls{};
  vmm::CallCounts fit_calls_second_half{};
  vmm::CallTimes fit_driver_us{};
  // Under the capacity: each device's capped replay, or its uncapped one
  // where that fit, merged; and each device's peak reserved bytes there,
  // in the order of `devices`.
  std::optional<ReplayResult> capped;
  std::vector<std::uint64_t> capped_peak_reserved_by_device;
};

TraceReplay RunTraceReplay(const PyTrace& trace, const std::string& policy,
                           const std::vector<std::uint32_t>& devices,
                           const std::vector<PolicyOptions>& options,
                           std::optional<std::vector<PolicyOptions>> capped,
                           std::size_t timeline_points, bool timing,
                           std::size_t check_every,
                           const std::vector<int>& timing_rounds, bool fit,
                           bool capped_figures) {
  if (devices.empty()) throw nb::value_error("no device to replay");
  if (options.size() != devices.size() ||
      timing_rounds.size() != devices.size() ||
      (capped && capped->size() != devices.size()))
    throw nb::value_error(
        "options, capped options and timing rounds need one entry per "
        "device");
  for (std::size_t i = 0; i < devices.size(); ++i) {
    CheckDevice(trace, devices[i]);
    CheckPolicy(policy, options[i], timing_rounds[i]);
    if (capped) CheckPolicy(policy, (*capped)[i], 1);
  }
  std::shared_ptr<Trace> t = trace.get();
  TraceReplay out;
  out.devices = static_cast<std::uint32_t>(devices.size());
  std::string fit_error;
  {
    nb::gil_scoped_release release;
    std::vector<ReplayResult> parts;
    for (std::size_t i = 0; i < devices.size(); ++i)
      parts.push_back(ReplayDevice(*t, policy, options[i], devices[i],
                                   timeline_points, timing, check_every,
                                   timing_rounds[i]));
    out.uncapped = Merge(parts);
    for (const ReplayResult& p : parts) {
      if (!p.check_error.empty()) {
        out.check_error = p.check_error;
        out.check_device = p.device;
        return out;
      }
    }
    out.fit_asked = fit;
    if (fit) {
      std::uint64_t total_fit = 0, total_live = 0;
      out.fit_found = true;
      for (std::size_t i = 0; i < devices.size(); ++i) {
        FitOptions fo;
        fo.device = devices[i];
        fo.max_capacity = options[i].capacity;
        FitResult f;
        if (!FitCapacity(*t, policy, options[i], fo, &f, &fit_error)) break;
        if (!f.found) {
          out.fit_found = false;
          break;
        }
        ++out.fit_devices;
        total_fit += f.capacity;
        total_live += f.peak_live;
        out.fit_capacity = std::max(out.fit_capacity, f.capacity);
        out.fit_nonmonotone |= f.nonmonotone;
        AddByKind(out.fit_calls, f.at_fit.calls);
        AddByKind(out.fit_calls_second_half, f.at_fit.calls_second_half);
        AddByKind(out.fit_driver_us, f.at_fit.driver_us);
      }
      if (out.fit_found && fit_error.empty())
        out.u_fit = total_fit ? static_cast<double>(total_live) /
                                    static_cast<double>(total_fit)
                              : 0.0;
    }
    if (fit_error.empty() && capped) {
      std::vector<ReplayResult> capped_parts;
      for (std::size_t i = 0; i < devices.size(); ++i) {
        const PolicyOptions& o = (*capped)[i];
        if (parts[i].peak_reserved <= o.capacity) {
          capped_parts.push_back(parts[i]);
          continue;
        }
        capped_parts.push_back(ReplayDevice(
            *t, policy, o, devices[i], capped_figures ? timeline_points : 0,
            timing && capped_figures, check_every,
            capped_figures ? timing_rounds[i] : 1));
        if (!capped_parts.back().check_error.empty()) {
          out.capped_check_error = capped_parts.back().check_error;
          return out;
        }
      }
      for (const ReplayResult& c : capped_parts)
        out.capped_peak_reserved_by_device.push_back(c.peak_reserved);
      out.capped = Merge(capped_parts);
    }
  }
  if (!fit_error.empty()) throw nb::value_error(fit_error.c_str());
  return out;
}

// The lake's layout as Python tuples (LakeSnapshot, cc/lake/lake.h).
nb::dict Layout(const LakeViewSnapshot& s) {
  const LakeSnapshot& l = s.layout;
  nb::dict d;
  d["event"] = s.event;
  d["asked"] = (s.why & kSnapshotAsked) != 0;
  d["stitch"] = (s.why & kSnapshotStitch) != 0;
  d["oom"] = (s.why & kSnapshotOom) != 0;
  d["granularity"] = l.granularity;
  d["capacity"] = l.capacity;
  d["free_chunks"] = l.free_chunks;
  d["largest_free"] = l.largest_free;
  const HeldBreakdown& h = l.held;
  nb::dict held;
  held["held"] = h.held;
  held["live"] = h.live;
  held["rounding"] = h.rounding;
  held["free_chunks"] = h.free_chunks;
  held["free_tails"] = h.free_tails;
  held["free_heads"] = h.free_heads;
  held["free_inner"] = h.free_inner;
  held["slab_free"] = h.slab_free;
  held["largest_tail"] = h.largest_tail;
  held["largest_head"] = h.largest_head;
  held["stitched_cached"] = h.stitched_cached;
  d["held"] = held;
  nb::list segments;
  for (const SnapshotSegment& seg : l.segments) {
    nb::list runs;
    for (const SnapshotRun& r : seg.runs)
      runs.append(nb::make_tuple(r.start, r.end, static_cast<int>(r.state),
                                 r.owner, r.address, r.pending));
    segments.append(nb::make_tuple(seg.id, seg.va, seg.nchunks, runs));
  }
  d["segments"] = segments;
  nb::list stitched;
  for (const SnapshotStitched& st : l.stitched) {
    nb::list pieces;
    for (const SnapshotPiece& p : st.pieces)
      pieces.append(nb::make_tuple(p.segment, p.start, p.nchunks));
    stitched.append(nb::make_tuple(st.id, st.va, st.nchunks, st.used,
                                   st.cached, st.busy, pieces, st.address));
  }
  d["stitched"] = stitched;
  nb::list slabs;
  for (const SnapshotSlab& sl : l.slabs)
    slabs.append(nb::make_tuple(sl.id, sl.segment, sl.start, sl.nchunks,
                                sl.base, sl.bytes, sl.used, sl.stream));
  d["slabs"] = slabs;
  nb::list live;
  for (const auto& [addr, event] : s.live)
    live.append(nb::make_tuple(addr, event));
  d["live"] = live;
  return d;
}

nb::dict RunLakeView(const PyTrace& trace, const PolicyOptions& options,
                     std::uint32_t device,
                     std::vector<std::uint64_t> snapshot_events,
                     std::size_t stitch_snapshots) {
  if (device >= trace.devices())
    throw nb::value_error(("device " + std::to_string(device) +
                           " is not below the trace's devices (" +
                           std::to_string(trace.devices()) + ")")
                              .c_str());
  LakeViewOptions o;
  o.device = device;
  o.snapshot_events = std::move(snapshot_events);
  o.stitch_snapshots = stitch_snapshots;
  std::shared_ptr<Trace> t = trace.get();
  LakeViewResult r;
  {
    nb::gil_scoped_release release;
    r = ReplayLakeView(*t, options, o);
  }
  if (!r.error.empty() && r.served.empty())
    throw nb::value_error(r.error.c_str());
  nb::dict d;
  d["served"] = nb::bytes(reinterpret_cast<const char*>(r.served.data()),
                          r.served.size());
  d["stitches"] = r.stitches;
  d["oom_event"] = r.oom ? nb::cast(r.oom_event) : nb::none();
  d["error"] = r.error;
  nb::list snapshots;
  for (const LakeViewSnapshot& s : r.snapshots) snapshots.append(Layout(s));
  d["snapshots"] = snapshots;
  return d;
}

}  // namespace

void BindReplay(nb::module_& m) {
  nb::class_<PyTrace>(m, "TraceData", "A parsed trace (cc/replay/trace.h).")
      .def("size", &PyTrace::size)
      .def("error", &PyTrace::error,
           "(line, reason, fatal) of the problem that stopped the parse, "
           "or None.")
      .def("skipped", &PyTrace::skipped,
           "(line, reason) of the lines a lenient parse skipped (the first "
           "1000).")
      .def_prop_ro("skipped_count", &PyTrace::skipped_count)
      .def_prop_ro("ignored", &PyTrace::ignored)
      .def_prop_ro("lines", &PyTrace::lines)
      .def_prop_ro("devices", &PyTrace::devices)
      .def_prop_ro("header_line", &PyTrace::header_line)
      .def("header", &PyTrace::header)
      .def("events", &PyTrace::events)
      .def("device_events", &PyTrace::device_events)
      .def("columns", &PyTrace::columns,
           "The events as columns of raw arrays (bytes), for numpy.")
      .def("peak_live", &PyTrace::peak_live, "device"_a)
      .def("to_jsonl", &PyTrace::to_jsonl, "header"_a)
      .def("to_csv", &PyTrace::to_csv);

  m.def("parse_trace", &Parse, "data"_a, "csv"_a, "lenient"_a,
        "Parses a whole trace file (JSON lines, or RMM CSV when csv).");

  nb::class_<vmm::LatencyModel>(
      m, "LatencyModel",
      "The driver latency model (cc/vmm/latency.h): microseconds per call "
      "by kind, as points (bytes, us).")
      .def(nb::init<>(), "The published defaults.")
      .def_static("zero", &vmm::LatencyModel::Zero, "Every call free.")
      .def("set", &SetLatency, "kind"_a, "sizes"_a, "us"_a,
           "Replaces one kind's points (sizes[i] bytes take us[i] "
           "microseconds); ValueError naming the kind or point when they "
           "are invalid.")
      .def("points", &LatencyPoints, "kind"_a)
      .def(
          "us",
          [](const vmm::LatencyModel& m, const std::string& kind,
             std::uint64_t bytes) {
            return m.us(KindOf(kind), static_cast<std::size_t>(bytes));
          },
          "kind"_a, "bytes"_a, "Microseconds of one call of that size.")
      .def(
          "set_term",
          [](vmm::LatencyModel& m, const std::string& name, double value) {
            const std::string problem = m.set_term(name, value);
            if (!problem.empty()) throw nb::value_error(problem.c_str());
          },
          "name"_a, "value"_a,
          "Sets a scalar term (devices, peer_us, first_set_access_us); "
          "ValueError naming a bad one.")
      .def(
          "call_us",
          [](const vmm::LatencyModel& m, const std::string& kind,
             std::uint64_t bytes, std::uint64_t handles) {
            return m.call_us(KindOf(kind), static_cast<std::size_t>(bytes),
                             handles);
          },
          "kind"_a, "bytes"_a, "handles"_a = 1,
          "Microseconds of one call covering `handles` handles, with the "
          "per-handle and per-device terms (not the first-grant term).")
      .def_prop_ro("devices", &vmm::LatencyModel::devices)
      .def_prop_ro("peer_us", &vmm::LatencyModel::peer_us)
      .def_prop_ro("first_set_access_us",
                   &vmm::LatencyModel::first_set_access_us)
      .def_rw("source", &vmm::LatencyModel::source);

  nb::class_<PolicyOptions>(m, "PolicyOptions",
                            "The C++ replay::PolicyOptions struct.")
      .def(nb::init<>())
      .def_rw("capacity", &PolicyOptions::capacity)
      .def_rw("granularity", &PolicyOptions::granularity)
      .def_rw("latency", &PolicyOptions::latency)
      .def_rw("lake", &PolicyOptions::lake)
      .def_rw("bfc_initial_region", &PolicyOptions::bfc_initial_region)
      .def_rw("bfc_limit", &PolicyOptions::bfc_limit)
      .def_rw("bfc_max_internal_fragmentation",
              &PolicyOptions::bfc_max_internal_fragmentation)
      .def_rw("bfc_growth_increment", &PolicyOptions::bfc_growth_increment)
      .def_rw("torch_max_split_size", &PolicyOptions::torch_max_split_size)
      .def_rw("gmlake_frag_limit", &PolicyOptions::gmlake_frag_limit)
      .def_rw("gmlake_reuse_limit", &PolicyOptions::gmlake_reuse_limit);

  m.def(
      "call_kinds",
      [] {
        std::vector<std::string> out;
        for (int i = 0; i < vmm::kNumCalls; ++i)
          out.emplace_back(vmm::CallName(static_cast<vmm::Call>(i)));
        return out;
      },
      "The driver call kinds (cc/vmm/driver.h), in its order.");
  m.def("policy_names", &PolicyNames, "The replay policies, in table order.");
  nb::class_<OpTimes>(m, "OpTimes",
                      "CPU time of one kind of allocator call "
                      "(cc/replay/engine.h).")
      .def_ro("count", &OpTimes::count)
      .def_ro("p50_ns", &OpTimes::p50_ns)
      .def_ro("p99_ns", &OpTimes::p99_ns)
      .def_ro("mean_ns", &OpTimes::mean_ns)
      .def_ro("total_ns", &OpTimes::total_ns);

  nb::class_<ReplayResult>(
      m, "ReplayResult",
      "The C++ replay::ReplayResult (cc/replay/engine.h): one device's "
      "replay, or (replay_trace) every device's merged. The by-kind and "
      "counter figures are dicts in the driver's call order and the "
      "policy's counter order; oom is None or (event, line, size, stream, "
      "live, reserved) on `device`.")
      .def_ro("policy", &ReplayResult::policy)
      .def_ro("device", &ReplayResult::device)
      .def_ro("events", &ReplayResult::events)
      .def_ro("allocs", &ReplayResult::allocs)
      .def_ro("frees", &ReplayResult::frees)
      .def_ro("peak_live", &ReplayResult::peak_live)
      .def_ro("peak_reserved", &ReplayResult::peak_reserved)
      .def_ro("final_reserved", &ReplayResult::final_reserved)
      .def_ro("utilisation", &ReplayResult::utilisation)
      .def_ro("waste", &ReplayResult::waste)
      .def_prop_ro("calls", KindProperty(&ReplayResult::calls))
      .def_prop_ro("calls_second_half",
                   KindProperty(&ReplayResult::calls_second_half))
      .def_ro("half_event", &ReplayResult::half_event)
      .def_prop_ro("driver_us", KindProperty(&ReplayResult::driver_us))
      .def_prop_ro("driver_us_second_half",
                   KindProperty(&ReplayResult::driver_us_second_half))
      .def_prop_ro("counters",
                   [](const ReplayResult& r) {
                     nb::dict d;
                     for (const auto& [name, value] : r.counters)
                       d[name.c_str()] = value;
                     return d;
                   })
      .def_prop_ro(
          "oom",
          [](const ReplayResult& r)
              -> std::optional<std::tuple<std::uint64_t, std::uint32_t,
                                          std::uint64_t, std::uint64_t,
                                          std::uint64_t, std::uint64_t>> {
            if (!r.oom) return std::nullopt;
            return std::make_tuple(r.oom_event, r.oom_line, r.oom_size,
                                   r.oom_stream, r.oom_live, r.oom_reserved);
          })
      .def_ro("alloc_times", &ReplayResult::alloc_times)
      .def_ro("free_times", &ReplayResult::free_times)
      .def_ro("median_ns", &ReplayResult::median_ns)
      .def_ro("timing_rounds", &ReplayResult::timing_rounds)
      .def_ro("wall_s", &ReplayResult::wall_s)
      .def_ro("events_per_s", &ReplayResult::events_per_s)
      .def_ro("clock_overhead_ns", &ReplayResult::clock_overhead_ns)
      .def_ro("timeline_event", &ReplayResult::timeline_event)
      .def_ro("timeline_live", &ReplayResult::timeline_live)
      .def_ro("timeline_reserved", &ReplayResult::timeline_reserved)
      .def_ro("check_error", &ReplayResult::check_error);

  nb::class_<TraceReplay>(
      m, "TraceReplay",
      "One policy's replay of every device of a trace (replay_trace): "
      "merged uncapped figures, the fit, and the capped run.")
      .def_ro("uncapped", &TraceReplay::uncapped)
      .def_ro("devices", &TraceReplay::devices)
      .def_ro("check_error", &TraceReplay::check_error)
      .def_ro("check_device", &TraceReplay::check_device)
      .def_ro("capped_check_error", &TraceReplay::capped_check_error)
      .def_ro("fit_asked", &TraceReplay::fit_asked)
      .def_ro("fit_devices", &TraceReplay::fit_devices)
      .def_ro("fit_found", &TraceReplay::fit_found)
      .def_ro("fit_capacity", &TraceReplay::fit_capacity)
      .def_ro("u_fit", &TraceReplay::u_fit)
      .def_ro("fit_nonmonotone", &TraceReplay::fit_nonmonotone)
      .def_prop_ro("fit_calls", KindProperty(&TraceReplay::fit_calls))
      .def_prop_ro("fit_calls_second_half",
                   KindProperty(&TraceReplay::fit_calls_second_half))
      .def_prop_ro("fit_driver_us", KindProperty(&TraceReplay::fit_driver_us))
      .def_ro("capped", &TraceReplay::capped)
      .def_ro("capped_peak_reserved_by_device",
              &TraceReplay::capped_peak_reserved_by_device);

  m.def("replay", &RunReplay, "trace"_a, "policy"_a, "options"_a,
        "device"_a = 0, "timeline_points"_a = 1000, "timing"_a = true,
        "check_every"_a = 0, "timing_rounds"_a = 1,
        "Replays one device of a trace through a policy. With "
        "timing_rounds > 1 the call times of that many replays (each with "
        "a fresh policy) are pooled.");
  m.def("replay_trace", &RunTraceReplay, "trace"_a, "policy"_a, "devices"_a,
        "options"_a, "capped_options"_a.none(), "timeline_points"_a,
        "timing"_a, "check_every"_a, "timing_rounds"_a, "fit"_a,
        "capped_figures"_a,
        "Replays the devices of a trace through a policy, each with its "
        "options (and timing rounds), merges them, and with fit finds each "
        "device's fit capacity (cc/replay/fit.h); with capped_options, "
        "replays again under them each device whose peak exceeded its "
        "capacity (with the timeline and timing only when capped_figures).");
  m.def("lake_view", &RunLakeView, "trace"_a, "options"_a, "device"_a = 0,
        "snapshot_events"_a = std::vector<std::uint64_t>{},
        "stitch_snapshots"_a = 0,
        "Replays one device through the jaxlake policy keeping how each "
        "event was served (bytes: AllocState, 255 none) and snapshots of "
        "the lake's layout (cc/replay/lake_view.h); returns a dict.");
}

}  // namespace jaxlake::replay
