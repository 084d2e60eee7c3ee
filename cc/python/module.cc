// jaxlake._core: the one compiled module.
//
// Private: the package `jaxlake` wraps it (argument checks, options,
// exceptions, the Stats dataclass) and re-exports what users need. Statuses
// come back to Python as names (vmm::StatusName); jaxlake/_src/errors.py
// holds the one mapping from status names to exceptions. Every name list
// below is generated from the X-macros of the C++ headers, so Python never
// declares gauges, counters, driver calls or allocation states by hand.
#include <nanobind/nanobind.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cc/lake/lake.h"
#include "cc/replay/trace_line.h"
#include "cc/stats/stats.h"
#include "cc/vmm/cuda_driver.h"
#include "cc/vmm/driver.h"
#include "cc/vmm/faulty_driver.h"
#include "cc/vmm/host_driver.h"
#include "cc/vmm/make_driver.h"
#include "cc/vmm/sim_driver.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace jaxlake {
namespace {

using NameDoc = std::pair<std::string, std::string>;

// Allocation state names, indexed by AllocState.
const char* const kStateNames[] = {
#define JAXLAKE_X(name) #name,
    JAXLAKE_ALLOC_STATES(JAXLAKE_X)
#undef JAXLAKE_X
};

std::vector<std::string> StatusNames() {
  std::vector<std::string> out;
  for (int i = 0; i <= static_cast<int>(vmm::Status::kDriverError); ++i)
    out.emplace_back(vmm::StatusName(static_cast<vmm::Status>(i)));
  return out;
}

std::string Join(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

vmm::Call CallByName(const std::string& name) {
  std::vector<std::string> names;
  for (int i = 0; i < vmm::kNumCalls; ++i) {
    const auto c = static_cast<vmm::Call>(i);
    if (name == vmm::CallName(c)) return c;
    names.emplace_back(vmm::CallName(c));
  }
  throw nb::value_error(("unknown driver call '" + name +
                         "': expected one of " + Join(names))
                            .c_str());
}

vmm::Status StatusByName(const std::string& name) {
  const std::vector<std::string> names = StatusNames();
  for (std::size_t i = 1; i < names.size(); ++i)  // kOk is not a fault
    if (name == names[i]) return static_cast<vmm::Status>(i);
  throw nb::value_error(
      ("unknown failure status '" + name + "': expected one of " +
       Join(std::vector<std::string>(names.begin() + 1, names.end())))
          .c_str());
}

// Default driver options of a backend (granularity, device bytes).
std::pair<std::size_t, std::size_t> BackendDefaults(const std::string& b) {
  const vmm::SimOptions o = b == "host" ? vmm::HostDefaults() : vmm::SimOptions{};
  return {o.granularity, o.device_bytes};
}

// A lake with the driver stack it owns: backend <- faulty <- lake. Members
// are destroyed in reverse order, the lake first.
class PyLake {
 public:
  PyLake(const std::string& backend, std::size_t granularity,
         std::size_t device_memory, const LakeOptions& options) {
    vmm::SimOptions sim;
    sim.granularity = granularity;
    sim.device_bytes = device_memory;
    std::string error;
    driver_ = vmm::MakeDriver(backend, sim, &error);
    if (!driver_) throw nb::value_error(error.c_str());
    Init(options, 0.0);
  }

  // The cuda backend: device `ordinal` of the real driver at `driver_path`.
  // A capacity_fraction in (0, 1] sets the capacity from the device memory.
  PyLake(const std::string& driver_path, int ordinal,
         const LakeOptions& options, double capacity_fraction) {
    std::string error;
    auto lib = vmm::CudaLibrary::Open(driver_path, &error);
    if (lib != nullptr) driver_ = vmm::CudaDriver::Create(lib, ordinal, &error);
    if (!driver_) throw nb::value_error(error.c_str());
    Init(options, capacity_fraction);
  }

  void Init(LakeOptions options, double capacity_fraction) {
    faulty_ = std::make_unique<vmm::FaultyDriver>(*driver_);
    if (capacity_fraction > 0.0) {
      const std::size_t gran = faulty_->granularity();
      const auto share = static_cast<std::size_t>(
          static_cast<double>(faulty_->total_memory()) * capacity_fraction);
      options.capacity = std::max(gran, share / gran * gran);
    }
    const std::string error = ValidateOptions(options, *faulty_);
    if (!error.empty()) throw nb::value_error(error.c_str());
    lake_ = std::make_unique<Lake>(*faulty_, options);
  }

  // (status, address, state); address and state are meaningful on "ok".
  std::tuple<std::string, std::uintptr_t, std::string> allocate(
      std::size_t nbytes, vmm::Stream stream) {
    std::uintptr_t address = 0;
    AllocState state = AllocState::small;
    vmm::Status s;
    {
      nb::gil_scoped_release release;
      s = lake_->allocate(nbytes, stream, &address, &state);
    }
    return {vmm::StatusName(s), address,
            kStateNames[static_cast<int>(state)]};
  }

  std::string free(std::uintptr_t address, vmm::Stream stream) {
    vmm::Status s;
    {
      nb::gil_scoped_release release;
      s = lake_->free(address, stream);
    }
    return vmm::StatusName(s);
  }

  // (bytes released, status): a status other than "ok" is a driver failure
  // whose resources the lake keeps and retries (see last_error()).
  std::pair<std::size_t, std::string> empty_cache() {
    vmm::Status s;
    std::size_t released;
    {
      nb::gil_scoped_release release;
      released = lake_->empty_cache(&s);
    }
    return {released, vmm::StatusName(s)};
  }

  std::string check() const {
    nb::gil_scoped_release release;
    return lake_->check();
  }

  nb::dict stats() const {
    const Stats s = lake_->stats();
    nb::dict gauges, counters, calls;
#define JAXLAKE_X(name, doc) \
  gauges[#name] = nb::make_tuple(s.name.current, s.name.peak);
    JAXLAKE_GAUGES(JAXLAKE_X)
#undef JAXLAKE_X
#define JAXLAKE_X(name, doc) counters[#name] = s.name;
    JAXLAKE_COUNTERS(JAXLAKE_X)
#undef JAXLAKE_X
    for (int i = 0; i < vmm::kNumCalls; ++i)
      calls[vmm::CallName(static_cast<vmm::Call>(i))] = s.driver_calls[i];
    nb::dict out;
    out["gauges"] = gauges;
    out["counters"] = counters;
    out["driver_calls"] = calls;
    return out;
  }

  // (time_ns, allocate, address, size, stream, state) per event.
  std::vector<std::tuple<std::uint64_t, bool, std::uintptr_t, std::size_t,
                         vmm::Stream, std::string>>
  trace() const {
    std::vector<std::tuple<std::uint64_t, bool, std::uintptr_t, std::size_t,
                           vmm::Stream, std::string>>
        out;
    for (const TraceEvent& e : lake_->trace())
      out.emplace_back(e.time_ns, e.allocate, e.address, e.size, e.stream,
                       e.allocate ? kStateNames[static_cast<int>(e.state)]
                                  : "");
    return out;
  }

  std::size_t allocation_size(std::uintptr_t address) const {
    return lake_->allocation_size(address);
  }
  std::string describe() const { return lake_->describe(); }
  std::string last_error() const { return lake_->last_error(); }
  std::size_t granularity() const { return lake_->granularity(); }
  std::size_t capacity() const { return lake_->capacity(); }
  std::size_t total_memory() const { return driver_->total_memory(); }
  std::string backend() const { return driver_->name(); }

  // Test hooks of the simulated streams (sim and host backends).
  void hold_stream(vmm::Stream s, bool until_waited) {
    sim("hold_stream").hold_stream(s, until_waited);
  }
  bool stream_held(vmm::Stream s) { return sim("stream_held").stream_held(s); }
  void release_stream(vmm::Stream s) { sim("release_stream").release_stream(s); }
  std::size_t physical_bytes() { return sim("physical_bytes").physical_bytes(); }

  void inject_fault(const std::string& call, std::uint64_t nth,
                    std::uint64_t times, const std::string& status) {
    if (nth < 1) throw nb::value_error("nth must be at least 1 (1: the next call)");
    if (times < 1) throw nb::value_error("times must be at least 1");
    faulty_->fail(CallByName(call), nth, StatusByName(status), times);
  }
  void clear_faults() { faulty_->clear(); }
  std::uint64_t injected_faults() const { return faulty_->injected(); }

 private:
  vmm::SimDriver& sim(const char* what) {
    auto* s = dynamic_cast<vmm::SimDriver*>(driver_.get());
    if (s == nullptr)
      throw nb::value_error((std::string(what) + " needs the host or sim "
                             "backend, not " + driver_->name())
                                .c_str());
    return *s;
  }

  std::unique_ptr<vmm::Driver> driver_;
  std::unique_ptr<vmm::FaultyDriver> faulty_;
  std::unique_ptr<Lake> lake_;
};

}  // namespace
}  // namespace jaxlake

// The trace and replay bindings (cc/python/replay.cc).
namespace jaxlake::replay {
void BindReplay(nb::module_& m);
}  // namespace jaxlake::replay

NB_MODULE(_core, m) {
  using namespace jaxlake;
  m.doc() = "jaxlake's compiled core (private: use the package jaxlake).";

  m.def("gauge_names", [] {
    return std::vector<NameDoc>{
#define JAXLAKE_X(name, doc) {#name, doc},
        JAXLAKE_GAUGES(JAXLAKE_X)
#undef JAXLAKE_X
    };
  }, "(name, doc) of every gauge, in declaration order.");
  m.def("counter_names", [] {
    return std::vector<NameDoc>{
#define JAXLAKE_X(name, doc) {#name, doc},
        JAXLAKE_COUNTERS(JAXLAKE_X)
#undef JAXLAKE_X
    };
  }, "(name, doc) of every counter, in declaration order.");
  m.def("call_names", [] {
    return std::vector<std::string>{
#define JAXLAKE_X(name) #name,
        JAXLAKE_DRIVER_CALLS(JAXLAKE_X)
#undef JAXLAKE_X
    };
  }, "Names of the driver entry points, in declaration order.");
  m.def("alloc_state_names", [] {
    return std::vector<std::string>(std::begin(kStateNames),
                                    std::end(kStateNames));
  }, "Names of the ways an allocation can be served, in policy order.");
  m.def("status_names", &StatusNames, "Names of the driver statuses.");
  m.def(
      "trace_line",
      [](std::uint64_t t, std::uint64_t id, std::uint64_t dev,
         std::uint64_t size, std::uint64_t stream, bool alloc,
         const std::string& kind) {
        std::string out;
        AppendTraceLine(&out, TraceLine{t, id, dev, size, stream, alloc,
                                        false, kind.c_str()});
        return out;
      },
      "t"_a, "id"_a, "dev"_a, "size"_a, "stream"_a, "alloc"_a, "kind"_a,
      "One event line of the trace format, with its newline "
      "(cc/replay/trace_line.h); kind \"\" for none, size ignored on a "
      "free.");
  m.def("backend_names", &vmm::BackendNames, "Backends this build knows.");
  m.def("backend_defaults", &BackendDefaults, "backend"_a,
        "(granularity, device_memory) a backend uses by default.");

  nb::class_<LakeOptions> lake_options(m, "LakeOptions",
                                       "The C++ LakeOptions struct.");
  lake_options.def(nb::init<>());
#define JAXLAKE_LAKE_OPTION(type, field, default_value, help) \
  lake_options.def_rw(#field, &LakeOptions::field, help);
#include "cc/lake/options.inc"
#undef JAXLAKE_LAKE_OPTION

  nb::class_<PyLake>(m, "Lake", "A lake over its own driver stack.")
      .def(nb::init<const std::string&, std::size_t, std::size_t,
                    const LakeOptions&>(),
           "backend"_a, "granularity"_a, "device_memory"_a, "options"_a)
      .def(nb::init<const std::string&, int, const LakeOptions&, double>(),
           "driver_path"_a, "device"_a, "options"_a, "capacity_fraction"_a)
      .def("allocate", &PyLake::allocate, "nbytes"_a, "stream"_a)
      .def("free", &PyLake::free, "address"_a, "stream"_a)
      .def("allocation_size", &PyLake::allocation_size, "address"_a)
      .def("empty_cache", &PyLake::empty_cache)
      .def("check", &PyLake::check)
      .def("stats", &PyLake::stats)
      .def("trace", &PyLake::trace)
      .def("describe", &PyLake::describe)
      .def("last_error", &PyLake::last_error)
      .def_prop_ro("granularity", &PyLake::granularity)
      .def_prop_ro("capacity", &PyLake::capacity)
      .def_prop_ro("total_memory", &PyLake::total_memory)
      .def_prop_ro("backend", &PyLake::backend)
      .def("hold_stream", &PyLake::hold_stream, "stream"_a,
           "until_waited"_a = false)
      .def("stream_held", &PyLake::stream_held, "stream"_a)
      .def("release_stream", &PyLake::release_stream, "stream"_a)
      .def("physical_bytes", &PyLake::physical_bytes)
      .def("inject_fault", &PyLake::inject_fault, "call"_a, "nth"_a,
           "times"_a, "status"_a)
      .def("clear_faults", &PyLake::clear_faults)
      .def("injected_faults", &PyLake::injected_faults);

  replay::BindReplay(m);  // after LakeOptions, which PolicyOptions holds
}
