// jaxlake: fit capacity. See fit.h.
#include "cc/replay/fit.h"

#include <algorithm>
#include <memory>

namespace jaxlake::replay {

bool FitCapacity(const Trace& trace, const std::string& policy,
                 const PolicyOptions& base, const FitOptions& options,
                 FitResult* out, std::string* error) {
  *out = FitResult{};
  std::string why;
  if (!MakePolicy(policy, base, &why)) {
    *error = why;
    return false;
  }
  const std::uint64_t gran = base.granularity;
  ReplayOptions ro;
  ro.device = options.device;
  ro.timeline_points = 0;
  ro.timing = false;
  // One replay at `granules`; the result kept in *r when asked.
  auto fits = [&](std::uint64_t granules, ReplayResult* r) {
    PolicyOptions o = base;
    o.capacity = static_cast<std::size_t>(granules * gran);
    std::string unused;
    std::unique_ptr<Policy> p = MakePolicy(policy, o, &unused);
    ++out->replays;
    ReplayResult result = Replay(trace, *p, ro);
    out->peak_live = std::max(out->peak_live, result.peak_live);
    const bool ok = !result.oom;
    if (r) *r = std::move(result);
    return ok;
  };
  // The device's peak live bytes, from the trace itself.
  std::uint64_t peak = 0, live = 0;
  for (const TraceFileEvent& e : trace.events) {
    if (e.dev != options.device) continue;
    live = e.alloc ? live + e.size : live - e.size;
    peak = std::max(peak, live);
  }
  out->peak_live = peak;
  const std::uint64_t max_granules = options.max_capacity / gran;
  // Known to fail: fewer granules than the live bytes need (0: none).
  const std::uint64_t bound = peak == 0 ? 0 : (peak + gran - 1) / gran - 1;
  std::uint64_t lo = bound;
  std::uint64_t hi = lo + 1;
  std::uint64_t step = 1;
  while (!fits(hi, nullptr)) {
    lo = hi;
    if (hi >= max_granules) return true;  // found = false
    step *= 2;
    hi = std::min(lo + step, max_granules);
  }
  while (hi - lo > 1) {
    const std::uint64_t mid = lo + (hi - lo) / 2;
    if (fits(mid, nullptr)) hi = mid; else lo = mid;
  }
  // Non-monotone check: the granules just below the boundary.
  for (int k = 1; k <= options.check_below; ++k) {
    if (hi <= static_cast<std::uint64_t>(k) ||
        hi - static_cast<std::uint64_t>(k) <= bound)
      break;
    const std::uint64_t g = hi - static_cast<std::uint64_t>(k);
    if (fits(g, nullptr)) {
      out->nonmonotone = true;
      hi = g;
      k = 0;  // check below the new fit
    }
  }
  fits(hi, &out->at_fit);
  out->found = true;
  out->capacity = hi * gran;
  out->u_fit = out->capacity ? static_cast<double>(out->peak_live) /
                                   static_cast<double>(out->capacity)
                             : 0;
  return true;
}

}  // namespace jaxlake::replay
