// Tests of the models of XLA's own allocators (xla-vmm, bfc-growth) and of
// the fit-capacity search, on small hand-made sequences whose answers are
// worked out in the comments (2 MiB granules throughout).
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cc/replay/engine.h"
#include "cc/replay/fit.h"
#include "cc/replay/policy.h"
#include "cc/replay/trace.h"
#include "tests/cc/check.h"
#include "tests/cc/policy_util.h"

namespace {

using namespace jaxlake::replay;           // NOLINT: the code under test
using namespace jaxlake::replay::testing;  // NOLINT: its test helpers
using jaxlake::vmm::Call;

// ---- xla-vmm -----------------------------------------------------------------

TEST(xla_vmm_fresh_allocation_is_create_reserve_map_access) {
  auto p = Make("xla-vmm");
  Alloc(*p, 3 * kMiB);  // rounded to 4 MiB: its own allocation
  CHECK_EQ(p->reserved(), 4 * kMiB);
  for (Call c : {Call::create, Call::reserve, Call::map, Call::set_access})
    CHECK_EQ(Calls(*p, c), 1u);
  CHECK_EQ(Calls(*p, Call::release), 0u);
  CHECK_EQ(p->check(), std::string());
}

TEST(xla_vmm_reuses_only_the_exact_rounded_size) {
  auto p = Make("xla-vmm");
  const std::uintptr_t a = Alloc(*p, 3 * kMiB);  // 4 MiB
  p->free(a, 0);
  // The free is deferred: one timeline write, nothing released.
  CHECK_EQ(Calls(*p, Call::event_record), 1u);
  CHECK_EQ(p->reserved(), 4 * kMiB);
  // 3.5 MiB rounds to 4 MiB too: the pending allocation comes back.
  CHECK_EQ(Alloc(*p, 3 * kMiB + kMiB / 2), a);
  CHECK_EQ(Calls(*p, Call::create), 1u);
  p->free(a, 0);
  // 5 MiB rounds to 6 MiB: no exact match, so a fresh allocation, and the
  // 4 MiB one stays pending (no pressure): 4 + 6 MiB held.
  const std::uintptr_t b = Alloc(*p, 5 * kMiB);
  CHECK(b != a);
  CHECK_EQ(Calls(*p, Call::create), 2u);
  CHECK_EQ(p->reserved(), 10 * kMiB);
  CHECK_EQ(Calls(*p, Call::release), 0u);
  CHECK_EQ(p->check(), std::string());
}

TEST(xla_vmm_reuse_takes_the_oldest_pending) {
  auto p = Make("xla-vmm");
  const std::uintptr_t a = Alloc(*p, 2 * kMiB);
  const std::uintptr_t b = Alloc(*p, 2 * kMiB);
  p->free(b, 0);  // b is older than a in the pending queue
  p->free(a, 0);
  CHECK_EQ(Alloc(*p, 2 * kMiB), b);
  CHECK_EQ(Alloc(*p, 2 * kMiB), a);
}

TEST(xla_vmm_reclaims_the_oldest_up_to_a_tenth_more_under_the_budget) {
  // Budget 10 MiB; four 2 MiB allocations freed in order a, b, c, d.
  auto p = Make("xla-vmm", Cap(10 * kMiB));
  std::uintptr_t x[4];
  for (auto& v : x) v = Alloc(*p, 2 * kMiB);
  for (auto v : x) p->free(v, 0);
  CHECK_EQ(p->reserved(), 8 * kMiB);
  // 4 MiB: no 4 MiB pending; fresh needs 8 + 4 > 10. The oldest frees are
  // torn down until they add up to 4 + 0.4 MiB: a (2), b (4), c (6): three
  // unmap/address-free/release triples. Then fresh: 2 (d) + 4 = 6 MiB.
  Alloc(*p, 4 * kMiB);
  CHECK_EQ(Calls(*p, Call::release), 3u);
  CHECK_EQ(Calls(*p, Call::unmap), 3u);
  CHECK_EQ(Calls(*p, Call::address_free), 3u);
  CHECK_EQ(p->reserved(), 6 * kMiB);
  // d is still pending and serves the next 2 MiB request with no call.
  CHECK_EQ(Alloc(*p, 2 * kMiB), x[3]);
  CHECK_EQ(Calls(*p, Call::create), 5u);
  CHECK_EQ(p->check(), std::string());
}

TEST(xla_vmm_out_of_memory_leaves_it_consistent) {
  auto p = Make("xla-vmm", Cap(10 * kMiB));
  Alloc(*p, 8 * kMiB);
  std::uintptr_t a = 0;
  CHECK(!p->allocate(4 * kMiB, 0, &a));  // 8 live + 4 > 10, nothing pending
  CHECK_EQ(p->reserved(), 8 * kMiB);
  CHECK_EQ(p->check(), std::string());
  Alloc(*p, 2 * kMiB);  // 10 MiB: fits exactly
  CHECK_EQ(p->reserved(), 10 * kMiB);
}

// ---- bfc-growth --------------------------------------------------------------

TEST(bfc_growth_reserves_once_and_grows_by_the_increment) {
  auto p = Make("bfc-growth");  // 64 MiB increment
  Alloc(*p, kMiB);
  CHECK_EQ(p->reserved(), 64 * kMiB);
  for (Call c : {Call::reserve, Call::create, Call::map, Call::set_access})
    CHECK_EQ(Calls(*p, c), 1u);
  CHECK_EQ(p->check(), std::string());
}

TEST(bfc_growth_counts_free_tail_space) {
  // a = 16 MiB splits the first 64 MiB: [0,16) a, [16,64) free. A 100 MiB
  // request misses 100 - 48 = 52 MiB: one 64 MiB extension, which merges
  // with the free tail into [16,128), 112 MiB.
  auto p = Make("bfc-growth");
  Alloc(*p, 16 * kMiB);
  Alloc(*p, 100 * kMiB);
  CHECK_EQ(p->reserved(), 128 * kMiB);
  CHECK_EQ(Calls(*p, Call::create), 2u);
  CHECK_EQ(Calls(*p, Call::reserve), 1u);
  CHECK_EQ(p->check(), std::string());
  // Under a cap of 100 MiB the 52 missing MiB do not fit (36 left).
  auto small = Make("bfc-growth", Cap(100 * kMiB));
  Alloc(*small, 16 * kMiB);
  std::uintptr_t a = 0;
  CHECK(!small->allocate(100 * kMiB, 0, &a));
  CHECK_EQ(small->reserved(), 64 * kMiB);
  CHECK_EQ(small->check(), std::string());
  // Under 120 MiB the extension is cut to the 56 MiB left, still enough.
  auto fits = Make("bfc-growth", Cap(120 * kMiB));
  Alloc(*fits, 16 * kMiB);
  Alloc(*fits, 100 * kMiB);
  CHECK_EQ(fits->reserved(), 120 * kMiB);
}

TEST(bfc_growth_coalesces_across_growth_steps) {
  // a = 16 MiB: [0,16) a, [16,64) free; b = 40 MiB takes the 48 MiB chunk
  // whole (48 < 2 x 40). Free a. c = 100 MiB: no free chunk is large
  // enough and the tail (b) is in use, so the extension doubles 64 -> 128
  // MiB: [64,192), taken whole by c. Freeing b and c merges everything,
  // across the extension's boundary, into one free 192 MiB chunk: 150 MiB
  // then fits with no growth.
  auto p = Make("bfc-growth");
  const std::uintptr_t a = Alloc(*p, 16 * kMiB);
  const std::uintptr_t b = Alloc(*p, 40 * kMiB);
  p->free(a, 0);
  const std::uintptr_t c = Alloc(*p, 100 * kMiB);
  CHECK_EQ(p->reserved(), 192 * kMiB);
  p->free(b, 0);
  p->free(c, 0);
  CHECK_EQ(p->check(), std::string());
  Alloc(*p, 150 * kMiB);
  CHECK_EQ(p->reserved(), 192 * kMiB);
  CHECK_EQ(Calls(*p, Call::create), 2u);
  // Classic BFC on the same requests: its regions (2, 4, ... MiB, then
  // one of 128 MiB for c) never merge, so 150 MiB needs a new region.
  auto bfc = Make("bfc");
  const std::uintptr_t a2 = Alloc(*bfc, 16 * kMiB);
  const std::uintptr_t b2 = Alloc(*bfc, 40 * kMiB);
  bfc->free(a2, 0);
  const std::uintptr_t c2 = Alloc(*bfc, 100 * kMiB);
  bfc->free(b2, 0);
  bfc->free(c2, 0);
  const std::uint64_t before = Calls(*bfc, Call::create);
  Alloc(*bfc, 150 * kMiB);
  CHECK_EQ(Calls(*bfc, Call::create), before + 1);
}

// ---- fit capacity ------------------------------------------------------------

// The fit capacity of `t` under `name`, with default options (a failed
// check when the search fails).
FitResult Fit(const Trace& t, const std::string& name) {
  FitResult f;
  std::string error;
  CHECK(FitCapacity(t, name, PolicyOptions{}, FitOptions{}, &f, &error));
  CHECK_EQ(error, std::string());
  return f;
}

TEST(fit_capacity_of_xla_vmm_worked_by_hand) {
  // x = 3 MiB, y = 3 MiB (4 + 4 MiB held), free x, z = 5 MiB (6 MiB).
  // With x pending, z fits fresh under 14 MiB; under less, x is torn down
  // first: 4 (y) + 6 = 10 MiB. Below 10 MiB, y and z do not fit together.
  // Peak live: 3 + 5 = 8 MiB; U_fit = 8 / 10.
  const Trace t = Jsonl(
      "{\"t\": 0, \"op\": \"alloc\", \"id\": 1, \"size\": 3145728}\n"
      "{\"t\": 1, \"op\": \"alloc\", \"id\": 2, \"size\": 3145728}\n"
      "{\"t\": 2, \"op\": \"free\", \"id\": 1}\n"
      "{\"t\": 3, \"op\": \"alloc\", \"id\": 3, \"size\": 5242880}\n");
  REQUIRE(t.ok());
  FitResult f;
  std::string error;
  CHECK(FitCapacity(t, "xla-vmm", PolicyOptions{}, FitOptions{}, &f,
                    &error));
  CHECK(f.found);
  CHECK_EQ(f.capacity, 10 * kMiB);
  CHECK_EQ(f.peak_live, 8 * kMiB);
  CHECK_EQ(f.u_fit, 0.8);
  CHECK(!f.at_fit.oom);
  CHECK(!f.nonmonotone);
  // At the fit: 2 + 1 fresh allocations, one teardown.
  CHECK_EQ(f.at_fit.calls[static_cast<int>(Call::create)], 3u);
  CHECK_EQ(f.at_fit.calls[static_cast<int>(Call::release)], 1u);
  // The lake stitches no worse: 8 MiB of live bytes fit in 8 MiB.
  FitResult lake;
  CHECK(FitCapacity(t, "jaxlake", PolicyOptions{}, FitOptions{}, &lake,
                    &error));
  CHECK(lake.found);
  CHECK(lake.capacity <= f.capacity);
  CHECK(lake.capacity >= 8 * kMiB);
}

TEST(fit_capacity_fails_one_granule_below_for_every_policy) {
  std::string body;
  for (int i = 0; i < 40; ++i) {
    body += "{\"t\": " + std::to_string(2 * i) +
            ", \"op\": \"alloc\", \"id\": " + std::to_string(i + 1) +
            ", \"size\": " + std::to_string((i % 7 + 1) * 700000) + "}\n";
    if (i % 3 == 2)
      body += "{\"t\": " + std::to_string(2 * i + 1) +
              ", \"op\": \"free\", \"id\": " + std::to_string(i - 1) + "}\n";
  }
  const Trace t = Jsonl(body);
  REQUIRE(t.ok());
  for (const std::string& name : PolicyNames()) {
    const FitResult f = Fit(t, name);
    CHECK(f.found);
    CHECK(f.capacity >= f.peak_live);
    CHECK(!f.at_fit.oom);
    if (f.nonmonotone) continue;  // reported; the check below need not hold
    PolicyOptions o;
    o.capacity = f.capacity - o.granularity;
    if (o.capacity < f.peak_live) continue;
    auto p = Make(name, o);
    jaxlake::replay::ReplayOptions ro;
    ro.timing = false;
    CHECK(jaxlake::replay::Replay(t, *p, ro).oom);
  }
  FitResult f;
  std::string error;
  CHECK(!FitCapacity(t, "nope", PolicyOptions{}, FitOptions{}, &f, &error));
  CHECK(error.find("unknown policy") != std::string::npos);
}

TEST(fit_capacity_matches_a_scan_of_every_granule) {
  // A random trace; for every policy, every capacity from the peak live
  // bytes up to the search's answer is replayed: the smallest that runs
  // is the answer, and none below the boundary the search checked runs
  // unless the result says it was not monotone.
  std::mt19937_64 rng(11);
  std::string body;
  std::vector<int> live;
  int next = 1;
  for (int i = 0; i < 300; ++i) {
    if (live.empty() || (live.size() < 24 && rng() % 100 < 60)) {
      const std::uint64_t size = 1 + rng() % (9u << 20);
      body += "{\"t\": " + std::to_string(i) + ", \"op\": \"alloc\", "
              "\"id\": " + std::to_string(next) + ", \"size\": " +
              std::to_string(size) + "}\n";
      live.push_back(next++);
    } else {
      const std::size_t k = rng() % live.size();
      body += "{\"t\": " + std::to_string(i) + ", \"op\": \"free\", "
              "\"id\": " + std::to_string(live[k]) + "}\n";
      live[k] = live.back();
      live.pop_back();
    }
  }
  const Trace t = Jsonl(body);
  REQUIRE(t.ok());
  for (const std::string& name : PolicyNames()) {
    const FitResult f = Fit(t, name);
    REQUIRE(f.found);
    const std::uint64_t gran = 2 * kMiB;
    std::uint64_t smallest = 0;
    for (std::uint64_t g = (f.peak_live + gran - 1) / gran;
         g * gran <= f.capacity; ++g) {
      PolicyOptions o;
      o.capacity = g * gran;
      auto p = Make(name, o);
      jaxlake::replay::ReplayOptions ro;
      ro.timing = false;
      ro.timeline_points = 0;
      if (!jaxlake::replay::Replay(t, *p, ro).oom) {
        smallest = g * gran;
        break;
      }
    }
    if (smallest != f.capacity) CHECK_EQ(name + " " + std::to_string(smallest),
                                         name + " " +
                                             std::to_string(f.capacity));
  }
}

}  // namespace

int main(int argc, char** argv) { return jaxlake::check::RunAll(argc, argv); }
