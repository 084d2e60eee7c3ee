// jaxlake: fit capacity, the smallest device a policy runs a trace on.
//
// The smallest capacity, in whole granules, under which one device of a
// trace replays through a policy with no out-of-memory. No policy holds
// the live bytes in less physical memory, so the search starts one granule
// below the peak live bytes rounded up, which fails; it steps up by
// doubling steps until a replay succeeds, then bisects. A policy's success
// need not be monotone in the capacity (a policy that sizes its growth by
// the memory left can fail at one capacity and succeed at a smaller one),
// so the granules just below the bisected boundary are replayed too; any
// that succeeds becomes the fit (and the granules below it are checked in
// turn), and the result says the behaviour was not monotone there.
//
// U_fit = peak live / fit capacity: the headline figure of
// docs/benchmarks.md. The replay at the fit capacity gives its driver
// calls and modelled driver time.
#ifndef JAXLAKE_REPLAY_FIT_H_
#define JAXLAKE_REPLAY_FIT_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "cc/replay/engine.h"
#include "cc/replay/policy.h"
#include "cc/replay/trace.h"

namespace jaxlake::replay {

struct FitOptions {
  std::uint32_t device = 0;
  // The largest capacity tried (bytes); no fit below it: found = false.
  std::size_t max_capacity = std::size_t{1} << 40;
  // Granules below the bisected boundary replayed again.
  int check_below = 4;
};

struct FitResult {
  bool found = false;
  std::uint64_t capacity = 0;   // bytes, whole granules
  std::uint64_t peak_live = 0;  // requested bytes
  double u_fit = 0;             // peak_live / capacity
  bool nonmonotone = false;     // a capacity below a failing one succeeded
  std::uint64_t replays = 0;    // replays the search made
  ReplayResult at_fit;          // the replay at the fit capacity
};

// `base` gives every option but the capacity. false and *error set for an
// unknown policy or invalid options.
bool FitCapacity(const Trace& trace, const std::string& policy,
                 const PolicyOptions& base, const FitOptions& options,
                 FitResult* out, std::string* error);

}  // namespace jaxlake::replay

#endif  // JAXLAKE_REPLAY_FIT_H_
