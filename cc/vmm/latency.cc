// jaxlake: the driver latency model. See latency.h; the sources of the
// default figures are in docs/benchmarks.md ("Driver time").
#include "cc/vmm/latency.h"

#include <cmath>
#include <sstream>
#include <utility>

namespace jaxlake::vmm {

namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::size_t kGiB = std::size_t{1} << 30;

}  // namespace

// The defaults. Published figures where there are any, each cited; the
// rest are guesses, marked so, until the GPU check (benchmarks/gpu/
// latency.py) measures them. "kvcached" is the VMM microbenchmark of
// ovg-project/kvcached (benchmarks/bench_vmm/README.md): averages of
// calls on 2 MiB handles on an A100 80 GB.
LatencyModel::LatencyModel() {
  // map: kvcached 1.45 us (p99 5 us) at 2 MiB. Per handle, not per byte
  // (PyTorch pull request 96995), so one point: every handle size costs
  // the same.
  set(Call::map, {{2 * kMiB, 1.45}});
  // unmap: kvcached 25.6 us at 2 MiB; per handle as map.
  set(Call::unmap, {{2 * kMiB, 25.6}});
  // set_access: kvcached 36 us (p99 54 us) at 2 MiB, one device. The
  // 1 GiB point (ten times, for the page-table entries a larger range
  // needs) is a guess.
  set(Call::set_access, {{2 * kMiB, 36}, {kGiB, 360}});
  // create: kvcached measured 193 us on an A100 and 7.6 us on another
  // GPU at 2 MiB; 40 us sits between the two (their geometric mean is 38)
  // and is a guess within the published range (docs/results/suite.md
  // gives the conclusions at 8, 40 and 200 us). The 1 GiB point is a guess.
  set(Call::create, {{2 * kMiB, 40}, {kGiB, 1000}});
  // release: no published figure; guesses.
  set(Call::release, {{2 * kMiB, 20}, {kGiB, 500}});
  // reserve: kvcached 19 us for an 8 GiB range; address space only, so
  // the same at any size (a guess beyond the one size measured).
  set(Call::reserve, {{8 * kGiB, 19}});
  // address_free: no published figure; a guess.
  set(Call::address_free, {{2 * kMiB, 5}});
  // Events: no published figure; guesses (no wait counted).
  set(Call::event_create, {{1, 2}});
  set(Call::event_destroy, {{1, 2}});
  set(Call::event_record, {{1, 2}});
  set(Call::event_query, {{1, 1}});
  set(Call::event_synchronize, {{1, 5}});
  // Each device after the first adds as much as the first costs (36 us,
  // kvcached's one-device figure): a guess. One device by default.
  devices_ = 1;
  peer_us_ = 36;
  // The first cuMemSetAccess of a process: about 505 us in the profile of
  // PyTorch issue 122057 (an A100), charged once per clock above the
  // call's own time (which is included in the 505: 505 - 36).
  first_set_access_us_ = 505 - 36;
  source = "defaults (cc/vmm/latency.cc; docs/benchmarks.md, Driver time)";
}

LatencyModel LatencyModel::Zero() {
  LatencyModel m;
  for (auto& p : m.points_) p.clear();
  m.peer_us_ = 0;
  m.first_set_access_us_ = 0;
  m.source = "zero";
  return m;
}

std::string LatencyModel::set(Call c, std::vector<LatencyPoint> points) {
  std::ostringstream err;
  for (std::size_t i = 0; i < points.size(); ++i) {
    const LatencyPoint& p = points[i];
    if (p.bytes == 0) {
      err << CallName(c) << " point " << i << ": bytes must be > 0";
    } else if (!std::isfinite(p.us) || p.us < 0) {
      err << CallName(c) << " point " << i << " (" << p.bytes
          << " bytes): us must be a finite number >= 0, got " << p.us;
    } else if (i > 0 && p.bytes <= points[i - 1].bytes) {
      err << CallName(c) << " point " << i << " (" << p.bytes
          << " bytes): points must be sorted by bytes, without repeats";
    }
    if (err.tellp() != 0) return err.str();
  }
  points_[static_cast<int>(c)] = std::move(points);
  return {};
}

double LatencyModel::us(Call c, std::size_t bytes) const {
  const std::vector<LatencyPoint>& p = points_[static_cast<int>(c)];
  if (p.empty()) return 0;
  if (p.size() == 1 || bytes <= p.front().bytes) return p.front().us;
  const auto x = static_cast<double>(bytes);
  std::size_t i = 1;
  while (i + 1 < p.size() && p[i].bytes < bytes) ++i;
  // Segment [i-1, i]: interpolates inside it, extrapolates past the last.
  const auto x0 = static_cast<double>(p[i - 1].bytes);
  const auto x1 = static_cast<double>(p[i].bytes);
  const double y = p[i - 1].us + (p[i].us - p[i - 1].us) * (x - x0) / (x1 - x0);
  return y < 0 ? 0 : y;
}

double LatencyModel::call_us(Call c, std::size_t bytes,
                             std::uint64_t handles) const {
  if (handles == 0) handles = 1;
  switch (c) {
    case Call::map:
    case Call::unmap:
      return us(c, bytes / handles) * static_cast<double>(handles);
    case Call::set_access:
      return us(c, bytes) + peer_us_ * static_cast<double>(devices_ - 1);
    default:
      return us(c, bytes);
  }
}

std::string LatencyModel::set_term(const std::string& name, double value) {
  std::ostringstream err;
  if (!std::isfinite(value) || value < 0) {
    err << name << " must be a finite number >= 0, got " << value;
    return err.str();
  }
  if (name == "devices") {
    if (value < 1 || value != std::floor(value) || value > 1 << 16) {
      err << "devices must be a whole number from 1 to 65536, got " << value;
      return err.str();
    }
    devices_ = static_cast<int>(value);
  } else if (name == "peer_us") {
    peer_us_ = value;
  } else if (name == "first_set_access_us") {
    first_set_access_us_ = value;
  } else {
    return "unknown latency term '" + name +
           "': expected devices, peer_us or first_set_access_us";
  }
  return {};
}

bool CallFromName(const std::string& name, Call* out) {
  for (int i = 0; i < kNumCalls; ++i) {
    if (name == CallName(static_cast<Call>(i))) {
      *out = static_cast<Call>(i);
      return true;
    }
  }
  return false;
}

}  // namespace jaxlake::vmm
