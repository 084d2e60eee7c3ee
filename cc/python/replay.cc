// jaxlake._core: the trace and replay bindings (cc/replay), added to the
// module by module.cc through BindReplay(). Private like the rest of
// _core: jaxlake/_src/trace/tracefile.py and replay.py wrap them.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

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
    for (const TraceEvent& e : trace_->events)
      out.emplace_back(e.t, e.alloc, e.id, e.dev, e.size, e.stream,
                       KindName(e.kind));
    return out;
  }

  // The events as columns of little-endian arrays (bytes), for numpy:
  // t, size, stream (uint64), dev, slot, line (uint32), alloc, kind
  // (uint8; kind as in JAXLAKE_TRACE_KINDS, 0 when not given).
  nb::dict columns() const {
    const std::vector<TraceEvent>& ev = trace_->events;
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
    for (const TraceEvent& e : trace_->events) ++out[e.dev];
    return out;
  }

  // The most requested bytes live at once on a device (no replay needed).
  std::uint64_t peak_live(std::uint32_t dev) const {
    std::uint64_t live = 0;
    std::uint64_t peak = 0;
    for (const TraceEvent& e : trace_->events) {
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

nb::dict Times(const OpTimes& t) {
  nb::dict d;
  d["count"] = t.count;
  d["p50_ns"] = t.p50_ns;
  d["p99_ns"] = t.p99_ns;
  d["mean_ns"] = t.mean_ns;
  d["total_ns"] = t.total_ns;
  return d;
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

nb::dict ResultDict(const ReplayResult& r);

nb::dict RunReplay(const PyTrace& trace, const std::string& policy,
                   const PolicyOptions& options, std::uint32_t device,
                   std::size_t timeline_points, bool timing,
                   std::size_t check_every, int timing_rounds) {
  std::string error;
  // The first replay's policy; making it checks the options.
  std::unique_ptr<Policy> first = MakePolicy(policy, options, &error);
  if (!first) throw nb::value_error(error.c_str());
  if (timing_rounds < 1)
    throw nb::value_error(("timing_rounds must be at least 1, got " +
                           std::to_string(timing_rounds))
                              .c_str());
  if (device >= trace.devices())
    throw nb::value_error(("device " + std::to_string(device) +
                           " is not below the trace's devices (" +
                           std::to_string(trace.devices()) + ")")
                              .c_str());
  ReplayOptions ro;
  ro.device = device;
  ro.timeline_points = timeline_points;
  ro.timing = timing;
  ro.check_every = check_every;
  ro.timing_rounds = timing_rounds;
  std::shared_ptr<Trace> t = trace.get();
  ReplayResult r;
  {
    nb::gil_scoped_release release;
    std::string unused;
    // The lake's teardown is not part of the measurement (Replay destroys
    // each policy outside the timing).
    r = Replay(
        *t,
        [&]() -> std::unique_ptr<Policy> {
          if (first) return std::move(first);
          return MakePolicy(policy, options, &unused);
        },
        ro);
  }
  return ResultDict(r);
}

nb::dict ResultDict(const ReplayResult& r) {
  nb::dict d;
  d["policy"] = r.policy;
  d["device"] = r.device;
  d["events"] = r.events;
  d["allocs"] = r.allocs;
  d["frees"] = r.frees;
  d["peak_live"] = r.peak_live;
  d["peak_reserved"] = r.peak_reserved;
  d["final_reserved"] = r.final_reserved;
  d["utilisation"] = r.utilisation;
  d["waste"] = r.waste;
  d["calls"] = ByKind(r.calls);
  d["calls_second_half"] = ByKind(r.calls_second_half);
  d["half_event"] = r.half_event;
  d["driver_us"] = ByKind(r.driver_us);
  d["driver_us_second_half"] = ByKind(r.driver_us_second_half);
  nb::dict counters;
  for (const auto& [name, value] : r.counters) counters[name.c_str()] = value;
  d["counters"] = counters;
  if (r.oom) {
    nb::dict oom;
    oom["event"] = r.oom_event;
    oom["line"] = r.oom_line;
    oom["size"] = r.oom_size;
    oom["stream"] = r.oom_stream;
    oom["live"] = r.oom_live;
    oom["reserved"] = r.oom_reserved;
    d["oom"] = oom;
  } else {
    d["oom"] = nb::none();
  }
  d["alloc_times"] = Times(r.alloc_times);
  d["free_times"] = Times(r.free_times);
  d["median_ns"] = r.median_ns;
  d["timing_rounds"] = r.timing_rounds;
  d["wall_s"] = r.wall_s;
  d["events_per_s"] = r.events_per_s;
  d["clock_overhead_ns"] = r.clock_overhead_ns;
  d["timeline_event"] = r.timeline_event;
  d["timeline_live"] = r.timeline_live;
  d["timeline_reserved"] = r.timeline_reserved;
  d["check_error"] = r.check_error;
  return d;
}

// The fit capacity of one device (cc/replay/fit.h): a dict with the
// search's figures and "at_fit", the replay at that capacity.
nb::dict RunFit(const PyTrace& trace, const std::string& policy,
                const PolicyOptions& options, std::uint32_t device,
                std::uint64_t max_capacity) {
  if (device >= trace.devices())
    throw nb::value_error(("device " + std::to_string(device) +
                           " is not below the trace's devices (" +
                           std::to_string(trace.devices()) + ")")
                              .c_str());
  FitOptions fo;
  fo.device = device;
  fo.max_capacity = static_cast<std::size_t>(max_capacity);
  std::shared_ptr<Trace> t = trace.get();
  FitResult f;
  std::string error;
  bool ok;
  {
    nb::gil_scoped_release release;
    ok = FitCapacity(*t, policy, options, fo, &f, &error);
  }
  if (!ok) throw nb::value_error(error.c_str());
  nb::dict d;
  d["found"] = f.found;
  d["capacity"] = f.capacity;
  d["peak_live"] = f.peak_live;
  d["u_fit"] = f.u_fit;
  d["nonmonotone"] = f.nonmonotone;
  d["replays"] = f.replays;
  d["at_fit"] = f.found ? nb::object(ResultDict(f.at_fit)) : nb::none();
  return d;
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
  m.def("replay", &RunReplay, "trace"_a, "policy"_a, "options"_a,
        "device"_a = 0, "timeline_points"_a = 1000, "timing"_a = true,
        "check_every"_a = 0, "timing_rounds"_a = 1,
        "Replays one device of a trace through a policy; returns a dict. "
        "With timing_rounds > 1 the call times of that many replays (each "
        "with a fresh policy) are pooled.");
  m.def("fit", &RunFit, "trace"_a, "policy"_a, "options"_a, "device"_a = 0,
        "max_capacity"_a = std::uint64_t{1} << 40,
        "The fit capacity of one device of a trace for a policy "
        "(cc/replay/fit.h); returns a dict.");
  m.def("lake_view", &RunLakeView, "trace"_a, "options"_a, "device"_a = 0,
        "snapshot_events"_a = std::vector<std::uint64_t>{},
        "stitch_snapshots"_a = 0,
        "Replays one device through the jaxlake policy keeping how each "
        "event was served (bytes: AllocState, 255 none) and snapshots of "
        "the lake's layout (cc/replay/lake_view.h); returns a dict.");
}

}  // namespace jaxlake::replay
