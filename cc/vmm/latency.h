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
// Three terms sit beside the points:
// - map and unmap cost per physical handle, not per byte (PyTorch pull
//   request 96995: ten 2 MiB handles take about ten times as long as one
//   20 MiB handle). Their points give the time per handle of that size,
//   and a call that covers several handles (an unmap of a stitched range)
//   is charged once per handle.
// - an access grant covers `devices` devices (XLA grants access to every
//   peer device, openxla/xla#40852): a cuMemSetAccess costs its points'
//   value plus peer_us for each device after the first.
// - the first cuMemSetAccess of a process costs first_set_access_us more
//   (about 0.5 ms in a profile in PyTorch issue 122057); each clock
//   (one policy's replay, as one process) charges it once.
//
// The defaults (LatencyModel()) come from published figures where there
// are any and are marked as guesses where there are none; see latency.cc
// and docs/benchmarks.md ("Driver time") for each figure and its source. A
// measured model, written by the GPU check in the JSON format of
// docs/benchmarks.md, replaces them kind by kind (jaxlake bench
// --driver-model FILE).
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

  // Microseconds of the points of kind c at `bytes` bytes (for calls with
  // no size, such as events, bytes is 0 and the first point's value is
  // used). The terms below are not included.
  double us(Call c, std::size_t bytes) const;

  // Microseconds of one call of kind c on `bytes` bytes that covers
  // `handles` physical handles (>= 1): us() per handle of bytes / handles
  // for map and unmap, us() plus the per-device term for set_access, us()
  // for the other kinds. The first-call term is the clock's.
  double call_us(Call c, std::size_t bytes, std::uint64_t handles = 1) const;

  // The scalar terms: "devices" (an integer >= 1), "peer_us" and
  // "first_set_access_us" (finite, >= 0). Returns "" when set, else a
  // message naming the term and the bad value; the model is unchanged then.
  std::string set_term(const std::string& name, double value);
  int devices() const { return devices_; }
  double peer_us() const { return peer_us_; }
  double first_set_access_us() const { return first_set_access_us_; }

  // Free text: where the figures come from.
  std::string source;

 private:
  std::array<std::vector<LatencyPoint>, kNumCalls> points_{};
  int devices_ = 1;
  double peer_us_ = 0;
  double first_set_access_us_ = 0;
};

// The kind named `name` (as CallName() spells it); false when none is.
bool CallFromName(const std::string& name, Call* out);

// Accumulates the modelled time of calls, by kind (not thread-safe; the
// simulated driver guards it with its own mutex).
class DriverClock {
 public:
  explicit DriverClock(const LatencyModel& model) : model_(model) {}
  // n calls of kind c, each on `bytes` bytes covering `handles` handles.
  void charge(Call c, std::size_t bytes, std::uint64_t n = 1,
              std::uint64_t handles = 1) {
    const int k = static_cast<int>(c);
    if (n == 0) return;
    double each;
    if (handles == 1) {
      if (bytes != last_bytes_[k]) {  // most calls repeat the last size
        last_bytes_[k] = bytes;
        last_us_[k] = model_.call_us(c, bytes);
      }
      each = last_us_[k];
    } else {
      each = model_.call_us(c, bytes, handles);
    }
    times_[k] += each * static_cast<double>(n);
    if (c == Call::set_access && !granted_) {
      granted_ = true;
      times_[k] += model_.first_set_access_us();
    }
  }
  const CallTimes& times() const { return times_; }
  const LatencyModel& model() const { return model_; }

 private:
  LatencyModel model_;
  CallTimes times_{};
  std::array<std::size_t, kNumCalls> last_bytes_ = Unset();
  CallTimes last_us_{};
  bool granted_ = false;  // a set_access was charged (its first-call term)
  static std::array<std::size_t, kNumCalls> Unset() {
    std::array<std::size_t, kNumCalls> a{};
    a.fill(~std::size_t{0});
    return a;
  }
};

}  // namespace jaxlake::vmm

#endif  // JAXLAKE_VMM_LATENCY_H_
