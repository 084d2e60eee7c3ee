// Tests of the small pool (cc/lake/small_pool.h): slabs shared by small
// requests, ranges freed on other streams, and the SmallPool class on its
// own.
#include <cstdint>
#include <string>
#include <vector>

#include "cc/lake/small_pool.h"
#include "tests/cc/check.h"
#include "tests/cc/test_util.h"

// The tests live in jaxlake::testing, where the lake, its options and
// the helpers of test_util.h need no qualification.
namespace jaxlake::testing {
namespace {

TEST(small_requests_share_slabs) {
  jaxlake::vmm::SimDriver drv(SmallDevice());
  Lake lake(drv, Slabs());
  std::vector<std::uintptr_t> ps;
  for (int i = 0; i < 1000; ++i) {
    AllocState how{};
    ps.push_back(Alloc(lake, 1000 + i % 7, &how));
    CHECK(how == AllocState::small);
    CHECK_EQ(ps.back() % 256, 0u);
  }
  auto st = lake.stats();
  CHECK_EQ(st.bytes_small_reserved.current, static_cast<std::int64_t>(kMiB * 2));
  CHECK_EQ(st.bytes_reserved.current, static_cast<std::int64_t>(kMiB * 2));
  for (auto p : ps) CHECK(lake.free(p, 0) == Status::kOk);
  st = lake.stats();
  CHECK_EQ(st.bytes_small_reserved.current, 0);
  CHECK_EQ(st.bytes_in_use.current, 0);
  CHECK_EQ(lake.check(), std::string());
}

TEST(small_range_freed_on_another_stream_is_deferred) {
  jaxlake::vmm::SimDriver drv(SmallDevice());
  Lake lake(drv, Slabs());
  drv.hold_stream(2);
  auto a = Alloc(lake, 4096, nullptr, 1);
  auto keep = Alloc(lake, 4096, nullptr, 1);
  CHECK(lake.free(a, 2) == Status::kOk);  // last use on stream 2, in flight
  auto b = Alloc(lake, 4096, nullptr, 1);
  CHECK(b != a);
  CHECK_EQ(lake.check(), std::string());
  drv.release_stream(2);
  CHECK(lake.free(b, 1) == Status::kOk);
  CHECK(lake.free(keep, 1) == Status::kOk);
  CHECK_EQ(lake.check(), std::string());
}

// Without a small pool, requests of any size share the blocks, split at the
// alignment: a thousand small requests fill one chunk, side by side.
TEST(small_requests_pack_into_shared_blocks) {
  jaxlake::vmm::SimDriver drv(SmallDevice());
  Lake lake(drv, LakeOptions{});
  std::vector<std::uintptr_t> ps;
  std::size_t asked = 0;
  for (int i = 0; i < 1000; ++i) {
    ps.push_back(Alloc(lake, 1000 + i % 7));
    asked += 1024;  // each rounded up to 4 units of 256 B
    CHECK_EQ(ps.back() % 256, 0u);
  }
  auto st = lake.stats();
  CHECK_EQ(st.bytes_in_use_rounded.current, static_cast<std::int64_t>(asked));
  CHECK_EQ(st.bytes_reserved.current, static_cast<std::int64_t>(kMiB * 2));
  CHECK_EQ(st.bytes_small_reserved.current, 0);
  for (auto p : ps) CHECK(lake.free(p, 0) == Status::kOk);
  CHECK_EQ(lake.stats().bytes_in_use.current, 0);
  CHECK_EQ(lake.check(), std::string());
}

// Defect: small ranges freed on another stream were flushed back to their
// slab only when the caller itself saw an event complete.
TEST(small_frees_from_other_streams_come_back) {
  SimDriver sim(SmallDevice());
  LakeOptions o = Capped(8 * kMiB);
  o.small_limit = kMiB;  // the small pool (off by default)
  Lake lake(sim, o);
  for (int i = 0; i < 400; ++i) {
    std::uintptr_t p = 0;
    AllocState how{};
    const Status s = lake.allocate(64 * 1024, 1, &p, &how);
    REQUIRE(s == Status::kOk);
    REQUIRE(how == AllocState::small);
    REQUIRE(lake.free(p, 2) == Status::kOk);
    lake.empty_cache();
  }
  lake.empty_cache();
  CHECK_EQ(lake.stats().bytes_reserved.current, 0);
  CHECK_EQ(lake.check(), std::string());
}

// Defect: a new slab's growth released the lock; meanwhile a small range of
// an older slab of the same stream was freed, the request was served from
// that range, and the new slab stayed empty and reserved for good (nothing
// frees an empty slab but its last free).
TEST(new_slab_left_empty_by_a_free_meanwhile_goes_back) {
  SimDriver sim(SmallDevice());
  FaultyDriver drv(sim);
  LakeOptions o = Capped(8 * kMiB);
  o.small_limit = kMiB;  // the small pool (off by default)
  Lake lake(drv, o);
  // Fill stream 1's first slab (one 2 MiB chunk) with 1 MiB ranges.
  AllocState how{};
  const std::uintptr_t a = Alloc(lake, kMiB, &how, 1);
  CHECK(how == AllocState::small);
  const std::uintptr_t b = Alloc(lake, kMiB, &how, 1);
  CHECK(how == AllocState::small);
  int fired = 0;
  drv.hook(Call::create, [&] {
    ++fired;
    CHECK(lake.free(a, 1) == Status::kOk);  // room in the old slab
  });
  const std::uintptr_t c = Alloc(lake, kMiB, &how, 1);  // grows a new slab
  CHECK_EQ(fired, 1);
  CHECK(how == AllocState::small);
  CHECK_EQ(c, a);  // the freed range fits best
  CHECK_EQ(lake.check(), std::string());
  CHECK_EQ(lake.stats().bytes_small_reserved.current,
           static_cast<std::int64_t>(2 * kMiB));
  CHECK(lake.free(b, 1) == Status::kOk);
  CHECK(lake.free(c, 1) == Status::kOk);
  lake.empty_cache();
  CHECK_EQ(lake.stats().bytes_reserved.current, 0);
  CHECK_EQ(lake.check(), std::string());
}

// ---- the SmallPool class on its own (cc/lake/small_pool.h) ---------------

// A slab of 4 KiB at `base` for stream s (where its chunks lie is the
// lake's business: here nowhere).
detail::Slab SlabOf(Stream s, std::uintptr_t base = 0x10000) {
  detail::Slab sl;
  sl.base = base;
  sl.bytes = 4096;
  sl.stream = s;
  return sl;
}

TEST(small_pool_takes_the_best_fit_and_merges_what_comes_back) {
  detail::SmallPool pool;
  pool.AddSlab(5, SlabOf(1));
  std::uintptr_t a = 0, b = 0, c = 0;
  std::uint64_t slab = 0;
  CHECK(pool.Take(1024, 1, &a, &slab));
  CHECK_EQ(slab, 5u);
  CHECK_EQ(a, std::uintptr_t{0x10000});
  CHECK(pool.Take(1024, 1, &b, &slab));
  CHECK(pool.Take(1024, 1, &c, &slab));
  CHECK_EQ(c, std::uintptr_t{0x10800});
  CHECK(!pool.Take(2048, 1, &c, &slab));  // 1 KiB left
  CHECK(!pool.Take(256, 2, &c, &slab));   // a slab serves its stream only
  CHECK_EQ(pool.slab(5).used, 3072u);
  CHECK_EQ(pool.CheckInvariants(), std::string());
  // a comes back: two free ranges of 1 KiB, apart. A request of 512 bytes
  // fits both equally; the lower address wins.
  CHECK(!pool.Return(5, 0, 1024));
  std::uintptr_t d = 0;
  CHECK(pool.Take(512, 1, &d, &slab));
  CHECK_EQ(d, std::uintptr_t{0x10000});
  CHECK(!pool.Return(5, 0, 512));  // merges with the 512 bytes after it
  // b comes back next to that free range: they merge.
  CHECK(!pool.Return(5, 1024, 1024));
  CHECK(!pool.Take(3072, 1, &d, &slab));  // 2 KiB and 1 KiB, apart
  // c comes back between the two: all merge, and the slab is empty.
  CHECK(pool.Return(5, 2048, 1024));
  CHECK_EQ(pool.slab(5).used, 0u);
  CHECK_EQ(pool.CheckInvariants(), std::string());
  CHECK(pool.Take(4096, 1, &d, &slab));  // one range: the whole slab
  CHECK_EQ(d, std::uintptr_t{0x10000});
  CHECK(pool.Return(5, 0, 4096));
  CHECK_EQ(pool.CheckInvariants(), std::string());
}

TEST(small_pool_says_when_a_slab_is_empty_and_removes_it) {
  detail::SmallPool pool;
  pool.AddSlab(1, SlabOf(1));
  pool.AddSlab(2, SlabOf(2, 0x20000));
  std::uintptr_t a = 0;
  std::uint64_t slab = 0;
  CHECK(pool.Take(4096, 2, &a, &slab));
  CHECK_EQ(slab, 2u);
  CHECK(pool.Return(2, 0, 4096));  // empty now
  const detail::Slab gone = pool.RemoveSlab(2);
  CHECK_EQ(gone.base, std::uintptr_t{0x20000});
  CHECK_EQ(gone.stream, 2u);
  CHECK_EQ(pool.slabs().size(), 1u);
  CHECK(!pool.Take(256, 2, &a, &slab));
  CHECK_EQ(pool.CheckInvariants(), std::string());
}

TEST(small_pool_hands_back_deferred_ranges_once_ready_in_order) {
  detail::SmallPool pool;
  pool.AddSlab(1, SlabOf(1));
  std::uintptr_t a = 0;
  std::uint64_t slab = 0;
  for (int i = 0; i < 3; ++i) CHECK(pool.Take(1024, 1, &a, &slab));
  CHECK(!pool.HasDeferred());
  pool.Defer({detail::Tag{2, 1}, 1, 0, 1024});
  pool.Defer({detail::Tag{3, 1}, 1, 1024, 1024});
  pool.Defer({detail::Tag{2, 2}, 1, 2048, 1024});
  CHECK_EQ(pool.CheckInvariants(), std::string());
  auto ready = pool.TakeReady(
      [](const detail::Tag& t) { return t.stream == 2; });
  CHECK_EQ(ready.size(), 2u);
  CHECK_EQ(ready[0].off, 0u);
  CHECK_EQ(ready[1].off, 2048u);
  CHECK(pool.HasDeferred());
  CHECK(pool.TakeReady([](const detail::Tag&) { return false; }).empty());
  CHECK_EQ(pool.TakeReady([](const detail::Tag&) { return true; }).size(),
           1u);
  CHECK(!pool.HasDeferred());
  // A deferred range must lie in a slab's lent bytes.
  pool.Defer({detail::Tag{2, 3}, 9, 0, 1024});
  CHECK_EQ(pool.CheckInvariants(),
           std::string("deferred small range at slab 9+0 lies outside a "
                       "slab's lent bytes"));
}

}  // namespace
}  // namespace jaxlake::testing

int main(int argc, char** argv) { return jaxlake::check::RunAll(argc, argv); }
