// jaxlake shim: settings read from the environment when the shim loads.
//
// Lake options: one variable JAXLAKE_<FIELD> per row of cc/lake/options.inc
// (the Python package normalises values, so only plain forms are accepted
// here): sizes and counts in decimal digits, booleans 0 or 1.
//   JAXLAKE_CAPACITY       unset or 0: the capacity rule below; not read
//                          when JAXLAKE_CAPACITY_FRACTION is set
// Shim settings:
//   JAXLAKE_SHIM_HOOKS     0 or 1 (default 1); 0 forwards every call
//   JAXLAKE_SHIM_PEER_ACCESS  0 or 1 (default 1): also map the lake's memory
//                          for the devices that can access it as peers
//   JAXLAKE_TRACE_FILE     a path: write the allocation trace there from
//                          the start (JSON lines, docs/traces.md)
//   JAXLAKE_CAPACITY_FRACTION  a decimal in (0, 1]: the capacity as that
//                          share of each device's memory (wins over
//                          JAXLAKE_CAPACITY)
//   JAXLAKE_TRACE_FLUSH    events between two flushes of the trace file
//                          (default 64; it is flushed at exit as well)
//   JAXLAKE_EXIT_REPORT    0 or 1 (default 0; `jaxlake run` sets 1 unless
//                          --quiet): print what the lakes did, per device,
//                          on stderr when the process exits (report.h)
// And XLA's own:
//   XLA_CLIENT_MEM_FRACTION  a decimal in (0, 1]: the capacity as that
//                          share of each device's memory when neither
//                          JAXLAKE_CAPACITY (non-zero) nor
//                          JAXLAKE_CAPACITY_FRACTION is given
//   XLA_PYTHON_CLIENT_MEM_FRACTION  its deprecated spelling, read when the
//                          other is unset; both set is malformed (jaxlib
//                          raises ValueError then)
//   JAXLAKE_REAL_LIBCUDA   the real driver's absolute path (loader.h)
// The capacity rule (Lakes::LakeFor, whole granules of each device):
// JAXLAKE_CAPACITY_FRACTION, else JAXLAKE_CAPACITY, else XLA's fraction
// when one of its variables is set: each a hard cap. With none of them, a
// lake that does not preallocate may hold the device's whole memory: it
// grows on demand as far as the driver gives, as XLA's cuda_async pool
// (which the lake serves) does, and gives its cached memory back when
// another allocation of the process finds the device full (hooks.cc); a
// preallocating lake takes XLA's default share, 0.75.
// They are read at the first call into the shim. Numbers are decimal digits
// only; an unset or empty variable keeps the default. A malformed value
// makes the shim inactive (it forwards every call) and the reason names the
// variable.
#ifndef JAXLAKE_SHIM_OPTIONS_H_
#define JAXLAKE_SHIM_OPTIONS_H_

#include <string>

#include "cc/lake/lake.h"

namespace jaxlake::shim {

// XLA's default share of device memory (XLA_CLIENT_MEM_FRACTION).
inline constexpr double kXlaDefaultFraction = 0.75;

struct ShimOptions {
  LakeOptions lake;
  bool hooks = true;
  bool peer_access = true;
  // Capacity as a fraction of each device's memory, in (0, 1]; 0: unset
  // (then lake.capacity applies).
  double capacity_fraction = 0.0;
  // XLA_CLIENT_MEM_FRACTION (or its deprecated spelling), in (0, 1]; 0:
  // neither is set.
  double xla_fraction = 0.0;
  std::string trace_file;
  std::size_t trace_flush = 64;
  bool exit_report = false;
};

// Reads the variables above into *out (defaults for those unset). Returns an
// empty string, or a message naming the first malformed variable.
std::string ReadOptions(ShimOptions* out);

// The options as a JSON object (lake fields by name, plus the shim's).
std::string OptionsJson(const ShimOptions& options);

// The share of each device's memory a lake gets under `options`, by the
// capacity rule above: a fraction in (0, 1], or 0 when the capacity is
// lake.capacity's bytes.
double CapacityFraction(const ShimOptions& options);

}  // namespace jaxlake::shim

#endif  // JAXLAKE_SHIM_OPTIONS_H_
