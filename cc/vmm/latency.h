// jaxlake: a model of the time the real driver takes per call.
//
// On a GPU an allocator's cost is its driver calls: cuMemCreate, cuMemMap
// and cuMemSetAccess take microseconds to milliseconds, while the
// allocator's own bookkeeping takes nanoseconds. The simulated driver makes
// no real call, so it charges each call the time this model gives: a
// latency per call kind (the kinds of driver.h) as a function of the
// call's size in bytes.
//
// Each kind is a list of points (bytes, microseconds), sorted by bytes.
// Between points the model interpolates linearly; below the first point it
// takes the first point's value; above the last it extrapolates linearly
// from the last two points (or keeps the value of a single point). A kind
// with no points costs nothing.
//
// The defaults (LatencyModel()) come from published figures; see
// docs/benchmarks.md ("Driver time") for each figure and its source. A
// measured model, written by the GPU check in the JSON format of
// docs/benchmarks.md, replaces them kind by kind (jaxlake bench --latency).
#ifndef JAXLAKE_VMM_LATENCY_H_
#define JAXLAKE_VMM_LATENCY_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "cc/vmm/driver.h"

namespace jaxlake::vmm {

struct LatencyPoint {
  std::size_t bytes = 0;  // > 0
  double us = 0;          // >= 0, microseconds of one call of that size
};

// Microseconds by call kind.
using CallTimes = std::array<double, kNumCalls>;

class LatencyModel {
 public:
  // The published defaults.
  LatencyModel();
  // A model in which every call is free.
  static LatencyModel Zero();

  // Replaces the points of one kind. Returns "" when they are valid (bytes
  // > 0 and strictly rising, us finite and >= 0), else a message naming
  // the kind and the bad point; the model is unchanged then.
  std::string set(Call c, std::vector<LatencyPoint> points);
  const std::vector<LatencyPoint>& points(Call c) const {
    return points_[static_cast<int>(c)];
  }

  // Microseconds of one call of kind c on `bytes` bytes (for calls with no
  // size, such as events, bytes is 0 and the first point's value is used).
  double us(Call c, std::size_t bytes) const;

  // Free text: where the figures come from.
  std::string source;

 private:
  std::array<std::vector<LatencyPoint>, kNumCalls> points_{};
};

// The kind named `name` (as CallName() spells it); false when none is.
bool CallFromName(const std::string& name, Call* out);

// Accumulates the modelled time of calls, by kind (not thread-safe; the
// simulated driver guards it with its own mutex).
class DriverClock {
 public:
  explicit DriverClock(const LatencyModel& model) : model_(model) {}
  void charge(Call c, std::size_t bytes, std::uint64_t n = 1) {
    const int k = static_cast<int>(c);
    if (bytes != last_bytes_[k]) {  // most calls repeat the last size
      last_bytes_[k] = bytes;
      last_us_[k] = model_.us(c, bytes);
    }
    times_[k] += last_us_[k] * static_cast<double>(n);
  }
  const CallTimes& times() const { return times_; }
  const LatencyModel& model() const { return model_; }

 private:
  LatencyModel model_;
  CallTimes times_{};
  std::array<std::size_t, kNumCalls> last_bytes_ = Unset();
  CallTimes last_us_{};
  static std::array<std::size_t, kNumCalls> Unset() {
    std::array<std::size_t, kNumCalls> a{};
    a.fill(~std::size_t{0});
    return a;
  }
};

}  // namespace jaxlake::vmm

#endif  // JAXLAKE_VMM_LATENCY_H_
