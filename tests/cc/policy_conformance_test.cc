// jaxlake: the conformance suite of the replay policies (cc/replay/policy.h):
// what every policy must do, whatever allocator it models. Each
// POLICY_TEST below becomes one test a policy, named policy_test (with
// the policy's '-' written '_'); policies_are_all_instantiated fails when
// a policy of PolicyNames() has no instantiation here.
#include <cstddef>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cc/replay/policy.h"
#include "tests/cc/check.h"
#include "tests/cc/policy_util.h"

namespace {

using jaxlake::replay::kMiB;
using jaxlake::replay::Policy;
using jaxlake::replay::PolicyNames;
using jaxlake::replay::PolicyOptions;
using jaxlake::replay::testing::Alloc;
using jaxlake::replay::testing::Cap;
using jaxlake::replay::testing::Make;

// XLA's minimum alignment of a device buffer (and cudaMalloc's is larger).
constexpr std::uintptr_t kAlignment = 256;
constexpr std::size_t kGranule = 2 * kMiB;

// The live blocks of a policy under test: each allocation checked against
// the rules as it is made, each free of a live block.
class Books {
 public:
  explicit Books(Policy& p) : p_(p) {}

  // Allocates; false when the policy is out of memory. A block it returns
  // is aligned and overlaps no live block.
  bool allocate(std::size_t n, std::uint64_t stream = 0) {
    std::uintptr_t a = 0;
    if (!p_.allocate(n, stream, &a)) return false;
    CHECK_EQ(a % kAlignment, 0u);
    auto next = live_.lower_bound(a);
    if (next != live_.end()) CHECK(a + n <= next->first);
    if (next != live_.begin()) {
      auto prev = std::prev(next);
      CHECK(prev->first + prev->second <= a);
    }
    live_[a] = n;
    streams_[a] = stream;
    bytes_ += n;
    last_ = a;
    return true;
  }
  // The address the last successful allocate returned.
  std::uintptr_t last() const { return last_; }
  // Frees a live block on the stream that allocated it.
  void free(std::uintptr_t a) {
    auto it = live_.find(a);
    REQUIRE(it != live_.end());
    bytes_ -= it->second;
    live_.erase(it);
    p_.free(a, streams_[a]);
    streams_.erase(a);
  }
  void free_all() {
    while (!live_.empty()) free(live_.begin()->first);
  }
  // What the policy holds covers what is live, in whole granules.
  void check_reserved(std::size_t capacity) const {
    CHECK(p_.reserved() >= bytes_);
    CHECK(p_.reserved() <= capacity);
    CHECK_EQ(p_.reserved() % kGranule, 0u);
    CHECK_EQ(p_.check(), std::string());
  }
  const std::map<std::uintptr_t, std::size_t>& live() const { return live_; }
  std::size_t bytes() const { return bytes_; }

 private:
  Policy& p_;
  std::map<std::uintptr_t, std::size_t> live_;
  std::map<std::uintptr_t, std::uint64_t> streams_;
  std::size_t bytes_ = 0;
  std::uintptr_t last_ = 0;
};

// A reproducible mix of sizes: small, medium and large requests.
std::vector<std::size_t> Sizes(unsigned seed, int n) {
  std::mt19937_64 rng(seed);
  std::vector<std::size_t> out;
  for (int i = 0; i < n; ++i) {
    switch (rng() % 3) {
      case 0: out.push_back(1 + rng() % 8192); break;
      case 1: out.push_back(8192 + rng() % (3 * kMiB)); break;
      default: out.push_back(3 * kMiB + rng() % (40 * kMiB)); break;
    }
  }
  return out;
}

#define JAXLAKE_POLICY_TEST_FOR(prefix, policy, name) \
  TEST(prefix##_##name) { name##_body(policy); }

// The policies, as X(prefix, name-string, test) rows.
#define JAXLAKE_POLICIES(X, test)             \
  X(jaxlake, "jaxlake", test)                 \
  X(bfc, "bfc", test)                         \
  X(torch, "torch", test)                     \
  X(torch_expandable, "torch-expandable", test) \
  X(gmlake, "gmlake", test)                   \
  X(xla_vmm, "xla-vmm", test)                 \
  X(bfc_growth, "bfc-growth", test)

#define POLICY_TEST(name)                                \
  void name##_body(const std::string& policy);           \
  JAXLAKE_POLICIES(JAXLAKE_POLICY_TEST_FOR, name)        \
  void name##_body(const std::string& policy)

#define JAXLAKE_POLICY_NAME(prefix, policy, test) policy,

TEST(policies_are_all_instantiated) {
  const std::vector<std::string> here = {
      JAXLAKE_POLICIES(JAXLAKE_POLICY_NAME, unused)};
  CHECK_EQ(here.size(), PolicyNames().size());
  for (const std::string& name : PolicyNames()) {
    bool found = false;
    for (const std::string& h : here) found = found || h == name;
    if (!found) CHECK_EQ(name, std::string("instantiated here"));
  }
}

// Allocated, freed, allocated again: the same request is served from
// what the free gave back, with no more memory held.
POLICY_TEST(alloc_free_round_trip) {
  auto p = Make(policy);
  Books b(*p);
  for (std::size_t n : {std::size_t{1}, std::size_t{1000}, 3 * kMiB,
                        64 * kMiB}) {
    REQUIRE(b.allocate(n));
    const std::size_t held = p->reserved();
    b.check_reserved(PolicyOptions{}.capacity);
    b.free_all();
    b.check_reserved(PolicyOptions{}.capacity);
    REQUIRE(b.allocate(n));
    CHECK_EQ(p->reserved(), held);
    b.free_all();
  }
}

// Every block is aligned, whatever its size and stream.
POLICY_TEST(blocks_are_aligned) {
  auto p = Make(policy);
  Books b(*p);
  for (std::size_t n : {std::size_t{1}, std::size_t{255}, std::size_t{257},
                        std::size_t{4097}, kMiB + 3, 5 * kMiB + 1})
    for (std::uint64_t stream : {0u, 1u}) REQUIRE(b.allocate(n, stream));
}

// Live blocks never overlap, and what the policy holds covers them, on a
// random mix of allocations and frees on two streams.
POLICY_TEST(live_blocks_do_not_overlap_and_are_held) {
  auto p = Make(policy);
  Books b(*p);
  std::mt19937_64 rng(11);
  const std::vector<std::size_t> sizes = Sizes(3, 400);
  for (std::size_t n : sizes) {
    if (!b.live().empty() && rng() % 100 < 45) {
      auto it = b.live().begin();
      std::advance(it, static_cast<long>(rng() % b.live().size()));
      b.free(it->first);
    }
    REQUIRE(b.allocate(n, rng() % 2));
    if (rng() % 16 == 0) b.check_reserved(PolicyOptions{}.capacity);
  }
  b.check_reserved(PolicyOptions{}.capacity);
  b.free_all();
  b.check_reserved(PolicyOptions{}.capacity);
}

// Out of memory is an answer, not a crash: a request above the capacity
// fails, filling the device ends in a refusal with the policy within its
// capacity, and the policy serves again once memory is freed.
POLICY_TEST(out_of_memory_is_reported_and_the_policy_recovers) {
  const std::size_t capacity = 64 * kMiB;
  auto p = Make(policy, Cap(capacity));
  Books b(*p);
  std::uintptr_t a = 0;
  CHECK(!p->allocate(capacity + kGranule, 0, &a));
  b.check_reserved(capacity);
  int served = 0;
  while (served < 100 && b.allocate(6 * kMiB)) ++served;
  CHECK(served >= 1);
  CHECK(served < 100);
  CHECK(b.bytes() <= capacity);
  b.check_reserved(capacity);
  b.free(b.live().begin()->first);
  CHECK(b.allocate(6 * kMiB));
  b.check_reserved(capacity);
  b.free_all();
  CHECK(b.allocate(4 * kMiB));
  b.check_reserved(capacity);
}

// A free of an address that is not a live block changes nothing: the
// memory held stays, the live block stays live.
POLICY_TEST(free_of_an_unknown_address_changes_nothing) {
  auto p = Make(policy);
  Books b(*p);
  REQUIRE(b.allocate(3 * kMiB));
  const std::uintptr_t live = b.live().begin()->first;
  const std::size_t held = p->reserved();
  p->free(live + 4096, 0);       // inside the live block
  p->free(std::uintptr_t{1} << 47, 0);  // never handed out
  CHECK_EQ(p->reserved(), held);
  for (int i = 0; i < 8; ++i) REQUIRE(b.allocate(3 * kMiB));
  CHECK(b.live().count(live) == 1);
  b.free_all();
}

// One run of a workload: on two streams (i % 2), every third block (the
// oldest live one) freed as it goes, then everything. Returns the most the
// policy held, or 0 when it ran out. The workload frees its oldest live
// block, so its live bytes are the same every run whatever the addresses
// (freeing the lowest address made each run a different workload).
std::size_t RunOnce(Policy& p, const std::vector<std::size_t>& sizes,
                    std::size_t capacity) {
  Books b(p);
  std::deque<std::uintptr_t> order;  // live blocks, oldest first
  std::size_t most = 0;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    if (!b.allocate(sizes[i], i % 2)) return 0;
    order.push_back(b.last());
    most = std::max(most, p.reserved());
    if (i % 3 == 2) {
      b.free(order.front());
      order.pop_front();
    }
  }
  b.check_reserved(capacity);
  b.free_all();
  b.check_reserved(capacity);
  return most;
}

// Once everything is freed, the policy serves the same workload again,
// and again: nothing leaks from one run to the next. The capacity is the
// most it held over three runs without one, and three more runs must fit
// in it; a policy that kept memory back at each run would need more each
// time. Checked over 20 seeds.
POLICY_TEST(freeing_everything_resets_the_policy) {
  for (unsigned seed = 1; seed <= 20; ++seed) {
    const std::vector<std::size_t> sizes = Sizes(seed, 60);
    auto probe = Make(policy);
    std::size_t need = 0;
    for (int round = 0; round < 3; ++round) {
      const std::size_t most = RunOnce(*probe, sizes, PolicyOptions{}.capacity);
      REQUIRE(most > 0);
      need = std::max(need, most);
    }
    auto p = Make(policy, Cap(need));
    for (int round = 0; round < 3; ++round) {
      const std::size_t most = RunOnce(*p, sizes, need);
      if (most == 0) std::fprintf(stderr, "seed %u, run %d\n", seed, round);
      CHECK(most > 0);
    }
  }
}

// The same workload run again after everything was freed fits in what its
// first run held on a fresh policy: a program that fit once (its first
// epoch, its first call) fits again. The memory a policy keeps is laid out
// for the first run's order; best-fitting the next run into it needed more
// (jaxlake ran out on 11 of these 20 seeds, 34 of seeds 1..60, before the
// lake started over once emptied near its capacity). Not every model
// keeps this promise (on these seeds torch and gmlake run out on 5,
// torch-expandable on 1), so the test is not a POLICY_TEST; bfc,
// bfc-growth and xla-vmm keep it as the lake does.
void RepeatedRunsFitTheFirstRunsPeak(const std::string& policy) {
  int failed = 0;
  for (unsigned seed = 1; seed <= 20; ++seed) {
    const std::vector<std::size_t> sizes = Sizes(seed, 60);
    auto probe = Make(policy);
    const std::size_t need = RunOnce(*probe, sizes, PolicyOptions{}.capacity);
    REQUIRE(need > 0);
    auto p = Make(policy, Cap(need));
    for (int round = 0; round < 3; ++round) {
      if (RunOnce(*p, sizes, need) > 0) continue;
      std::fprintf(stderr, "%s: seed %u, run %d out of memory\n",
                   policy.c_str(), seed, round);
      ++failed;
      break;
    }
  }
  CHECK_EQ(failed, 0);
}

TEST(jaxlake_repeated_runs_fit_the_first_runs_peak) {
  RepeatedRunsFitTheFirstRunsPeak("jaxlake");
}
TEST(bfc_repeated_runs_fit_the_first_runs_peak) {
  RepeatedRunsFitTheFirstRunsPeak("bfc");
}
TEST(bfc_growth_repeated_runs_fit_the_first_runs_peak) {
  RepeatedRunsFitTheFirstRunsPeak("bfc-growth");
}
TEST(xla_vmm_repeated_runs_fit_the_first_runs_peak) {
  RepeatedRunsFitTheFirstRunsPeak("xla-vmm");
}

}  // namespace

int main(int argc, char** argv) { return jaxlake::check::RunAll(argc, argv); }
