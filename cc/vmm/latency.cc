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

LatencyModel::LatencyModel() {
  // Published: GMLake (ASPLOS'24) about 80 us per 2 MiB chunk stitched,
  // one cuMemMap and one cuMemSetAccess each: 40 us apiece at 2 MiB. The
  // 1 GiB points and the other kinds are the documented assumptions.
  set(Call::map, {{2 * kMiB, 40}, {kGiB, 200}});
  set(Call::set_access, {{2 * kMiB, 40}, {kGiB, 400}});
  set(Call::create, {{2 * kMiB, 40}, {kGiB, 1000}});
  set(Call::release, {{2 * kMiB, 20}, {kGiB, 500}});
  set(Call::unmap, {{2 * kMiB, 20}, {kGiB, 200}});
  set(Call::reserve, {{2 * kMiB, 5}});
  set(Call::address_free, {{2 * kMiB, 5}});
  set(Call::event_create, {{1, 2}});
  set(Call::event_destroy, {{1, 2}});
  set(Call::event_record, {{1, 2}});
  set(Call::event_query, {{1, 1}});
  set(Call::event_synchronize, {{1, 5}});
  source = "defaults (docs/benchmarks.md, Driver time)";
}

LatencyModel LatencyModel::Zero() {
  LatencyModel m;
  for (auto& p : m.points_) p.clear();
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
