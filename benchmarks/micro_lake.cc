// Microbenchmark of the lake's allocation paths over the sim driver.
//
// Prints p50/p99 nanoseconds of the cached allocate+free path (small and
// large requests, nothing mapped or created) and the operations per second
// of a mixed workload (random sizes from 256 B to 64 MiB, random lifetimes,
// under a capacity that forces stitching) with the driver time the sim
// driver's latency model charges for its calls. Usage:
//   micro_lake [--quick]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "cc/lake/lake.h"
#include "cc/vmm/sim_driver.h"

namespace {

using Clock = std::chrono::steady_clock;
constexpr std::size_t kMiB = std::size_t{1} << 20;

struct Percentiles {
  double p50, p99;
};

Percentiles Summarise(std::vector<double>& ns) {
  std::sort(ns.begin(), ns.end());
  return {ns[ns.size() / 2], ns[ns.size() * 99 / 100]};
}

// Allocate+free of one size, repeated: after the first round it is served
// from the lake's free pool without any driver call.
Percentiles CachedPair(std::size_t size, int iters) {
  jaxlake::vmm::SimDriver drv;
  jaxlake::Lake lake(drv, jaxlake::LakeOptions{});
  std::uintptr_t keep = 0, p = 0;
  lake.allocate(size, 0, &keep);  // keeps a slab/segment alive
  std::vector<double> ns;
  ns.reserve(iters);
  for (int i = 0; i < iters; ++i) {
    const auto t0 = Clock::now();
    lake.allocate(size, 0, &p);
    lake.free(p, 0);
    const auto t1 = Clock::now();
    ns.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count());
  }
  return Summarise(ns);
}

struct Mixed {
  double ops_per_s;
  std::uint64_t ops, ooms, stitches, maps;
  double utilisation;
  double driver_ms;  // the sim driver's latency model, not waited for
};

Mixed MixedWorkload(int ops) {
  jaxlake::vmm::SimDriver drv;
  jaxlake::LakeOptions o;
  o.capacity = std::size_t{4} << 30;
  jaxlake::Lake lake(drv, o);
  std::mt19937_64 rng(42);
  std::vector<std::uintptr_t> live;
  live.reserve(4096);
  std::uint64_t done = 0, ooms = 0;
  const auto t0 = Clock::now();
  for (int i = 0; i < ops; ++i) {
    if (live.empty() || (live.size() < 500 && rng() % 100 < 52)) {
      // Log-uniform sizes: most small, some large.
      const double e = 8.0 + static_cast<double>(rng() % 1800) / 100.0;
      const auto size = static_cast<std::size_t>(std::pow(2.0, e));
      std::uintptr_t p = 0;
      if (lake.allocate(size, 0, &p) == jaxlake::vmm::Status::kOk)
        live.push_back(p);
      else
        ++ooms;
    } else {
      const std::size_t k = rng() % live.size();
      lake.free(live[k], 0);
      live[k] = live.back();
      live.pop_back();
    }
    ++done;
  }
  const double s =
      std::chrono::duration<double>(Clock::now() - t0).count();
  const auto st = lake.stats();
  Mixed m;
  m.ops_per_s = static_cast<double>(done) / s;
  m.ops = done;
  m.ooms = ooms;
  m.stitches = st.alloc_stitch + st.alloc_stitch_grow + st.alloc_stitch_reuse;
  m.maps = st.driver_calls[static_cast<int>(jaxlake::vmm::Call::map)];
  m.driver_ms = 0;
  for (double us : drv.driver_us()) m.driver_ms += us / 1000.0;
  m.utilisation = st.bytes_reserved.peak
                      ? static_cast<double>(st.bytes_in_use.peak) /
                            static_cast<double>(st.bytes_reserved.peak)
                      : 0.0;
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const int iters = quick ? 20000 : 200000;
  std::printf("jaxlake micro-benchmark (sim driver, %d iterations)\n", iters);
  std::printf("%-34s %10s %10s\n", "cached allocate+free", "p50 ns", "p99 ns");
  for (std::size_t size : {std::size_t{4096}, std::size_t{512} * 1024,
                           8 * kMiB, 256 * kMiB}) {
    const Percentiles p = CachedPair(size, iters);
    char label[64];
    std::snprintf(label, sizeof label, "  %zu KiB", size / 1024);
    std::printf("%-34s %10.0f %10.0f\n", label, p.p50, p.p99);
  }
  const Mixed m = MixedWorkload(quick ? 100000 : 1000000);
  std::printf(
      "mixed workload: %.0f ops/s (%llu ops, %llu OOM under 4 GiB, %llu "
      "stitched, %llu map calls, utilisation %.3f, modelled driver time "
      "%.0f ms)\n",
      m.ops_per_s, static_cast<unsigned long long>(m.ops),
      static_cast<unsigned long long>(m.ooms),
      static_cast<unsigned long long>(m.stitches),
      static_cast<unsigned long long>(m.maps), m.utilisation, m.driver_ms);
  return 0;
}
