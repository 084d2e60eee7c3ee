// Tests of reclaim (cc/lake/reclaim.cc): empty_cache(), destruction,
// driver failures rolled back or kept and retried, reclaim steps made
// with the lock released, and a lake emptied near its capacity starting
// over.
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cc/vmm/host_driver.h"
#include "tests/cc/check.h"
#include "tests/cc/test_util.h"

// The tests live in jaxlake::testing, where the lake, its options and
// the helpers of test_util.h need no qualification.
namespace jaxlake::testing {
namespace {

// From inside a driver call (the lake's lock released), runs `request` on
// a thread of its own and returns that thread once the request was refused
// and waits (the lake's reclaim count moved) or has returned; *waited
// tells which.
template <typename F>
std::thread RunUntilRefused(Lake& lake, F request, bool* waited) {
  const auto reclaims = lake.stats().reclaims;
  auto done = std::make_shared<std::atomic<bool>>(false);
  std::thread t([request, done]() mutable {
    request();
    *done = true;
  });
  while (lake.stats().reclaims == reclaims && !*done)
    std::this_thread::yield();
  *waited = !*done;
  return t;
}

TEST(driver_failures_roll_back) {
  jaxlake::vmm::HostDriver host(SmallDevice());
  jaxlake::vmm::FaultyDriver drv(host);
  Lake lake(drv, Capped(64 * kMiB));
  std::vector<std::uintptr_t> blocks = AllocEach(lake, 8, 8 * kMiB);
  for (int i = 0; i < 8; i += 2) CHECK(lake.free(blocks[i], 0) == Status::kOk);
  for (Call c : {Call::reserve, Call::map, Call::set_access}) {
    drv.fail(c, c == Call::map ? 2 : 1);
    std::uintptr_t p = 0;
    CHECK(lake.allocate(24 * kMiB, 0, &p) == Status::kDriverError);
    CHECK_EQ(lake.check(), std::string());
  }
  drv.fail(Call::create);
  std::uintptr_t p = 0;
  CHECK(lake.allocate(80 * kMiB, 0, &p) == Status::kOutOfMemory);
  CHECK_EQ(lake.check(), std::string());
  AllocState how{};
  // The free blocks are not adjacent (live ones between): a mapped stitch.
  auto big = Alloc(lake, 24 * kMiB, &how);
  CHECK(how == AllocState::stitch);
  Fill(big, 24 * kMiB, 7);
  CHECK(Holds(big, 24 * kMiB, 7));
  CHECK_EQ(host.mapped_bytes(), 64 * kMiB + 24 * kMiB);
  CHECK(lake.free(blocks[1], 0) == Status::kOk);
  CHECK_EQ(lake.check(), std::string());
}

TEST(empty_cache_and_destruction_release_everything) {
  jaxlake::vmm::SimDriver drv(SmallDevice());
  {
    Lake lake(drv, Capped(64 * kMiB));
    std::vector<std::uintptr_t> blocks = AllocEach(lake, 8, 8 * kMiB);
    for (int i = 0; i < 8; i += 2) lake.free(blocks[i], 0);
    auto big = Alloc(lake, 24 * kMiB);
    lake.free(big, 0);
    for (int i = 1; i < 8; i += 2) lake.free(blocks[i], 0);
    CHECK_EQ(lake.empty_cache(), 64 * kMiB);
    CHECK_EQ(lake.stats().bytes_reserved.current, 0);
    CHECK_EQ(drv.physical_bytes(), 0u);
    CHECK_EQ(drv.reserved_bytes(), 0u);
    Alloc(lake, 8 * kMiB);
    Alloc(lake, 100);
  }
  CHECK_EQ(Leftovers(drv), std::string());
}

// Defect: the reclaim loop ignored memory released by another thread while
// it waited and answered out of memory with half the capacity free.
TEST(reclaim_retries_after_changes_by_other_threads) {
  TwoChunks t;
  Lake& lake = t.lake;
  t.drv.hook(Call::event_synchronize, [&] { t.sim.release_stream(1); },
             false);
  std::size_t released = 0;
  t.drv.hook(Call::event_synchronize,
             [&] { released = lake.empty_cache(); });
  std::uintptr_t p = 0;
  CHECK(lake.allocate(2 * kMiB, 2, &p) == Status::kOk);
  CHECK_EQ(released, 2 * kMiB);
  CHECK_EQ(lake.check(), std::string());
  CHECK(lake.free(p, 2) == Status::kOk);
  CHECK(lake.free(t.y, 1) == Status::kOk);
}

// Defect: empty_cache() merged free neighbours only when its own event query
// made progress, so a segment whose free blocks carry different streams'
// tags stayed reserved after the streams had been advanced elsewhere.
TEST(empty_cache_releases_segments_freed_on_several_streams) {
  SimDriver sim(SmallDevice());
  LakeOptions o = Capped(64 * kMiB);
  o.stitch_cache = 0;  // a stitched free trims the cache at once
  Lake lake(sim, o);
  // A live stitched range on stream 3.
  std::vector<std::uintptr_t> e = AllocEach(lake, 4, 2 * kMiB, 3);
  CHECK(lake.free(e[0], 3) == Status::kOk);
  CHECK(lake.free(e[2], 3) == Status::kOk);
  AllocState how{};
  std::uintptr_t s = Alloc(lake, 4 * kMiB, &how, 3);
  CHECK(how == AllocState::stitch);
  // One 8 MiB segment split into two blocks, freed on two streams: they
  // stay apart while neither free is known complete.
  std::uintptr_t whole = Alloc(lake, 8 * kMiB, nullptr, 1);
  CHECK(lake.free(whole, 1) == Status::kOk);
  std::uintptr_t a = Alloc(lake, 4 * kMiB, nullptr, 1);
  std::uintptr_t b = Alloc(lake, 4 * kMiB, nullptr, 1);
  CHECK(lake.free(a, 1) == Status::kOk);
  CHECK(lake.free(b, 2) == Status::kOk);
  CHECK(lake.free(e[1], 3) == Status::kOk);
  CHECK(lake.free(e[3], 3) == Status::kOk);
  // Freeing the stitched range trims the cache, which advances every
  // stream's event (without merging anything).
  CHECK(lake.free(s, 3) == Status::kOk);
  for (int i = 0; i < 3; ++i) lake.empty_cache();
  CHECK_EQ(lake.stats().live_allocations.current, 0);
  CHECK_EQ(lake.stats().bytes_reserved.current, 0);
  CHECK_EQ(lake.check(), std::string());
}

// Defect: a failed unmap/release/address_free was counted and forgotten.
TEST(failed_releases_are_kept_and_retried) {
  for (Call call : {Call::unmap, Call::release, Call::address_free}) {
    SimDriver sim(SmallDevice());
    FaultyDriver drv(sim);
    {
      Lake lake(drv, Capped(64 * kMiB));
      std::uintptr_t p = Alloc(lake, 8 * kMiB);
      CHECK(lake.free(p, 0) == Status::kOk);
      drv.fail(call);
      Status s = Status::kOk;
      std::size_t released = lake.empty_cache(&s);
      CHECK(s == Status::kDriverError);  // the caller asked: it is told
      CHECK(!lake.last_error().empty());
      // Only what the driver gave back counts as released (a failed
      // address_free leaks address space, not memory).
      CHECK_EQ(released, call == Call::address_free ? 8 * kMiB : 0u);
      jaxlake::Stats st = lake.stats();
      CHECK_EQ(st.bytes_unreleased.current,
               static_cast<std::int64_t>(call == Call::address_free ? 0 : 8 * kMiB));
      CHECK_EQ(st.unreleased.current, 1);
      CHECK_EQ(lake.check(), std::string());
      // The next empty_cache() finishes the job.
      released = lake.empty_cache(&s);
      CHECK(s == Status::kOk);
      CHECK_EQ(released, call == Call::address_free ? 0u : 8 * kMiB);
      CHECK_EQ(lake.stats().unreleased.current, 0);
      CHECK_EQ(sim.physical_bytes(), 0u);
      CHECK_EQ(sim.reserved_bytes(), 0u);
      CHECK_EQ(sim.live_handles(), 0u);
      // A failure the lake's destructor cleans up.
      p = Alloc(lake, 8 * kMiB);
      CHECK(lake.free(p, 0) == Status::kOk);
      drv.fail(call);
      lake.empty_cache(&s);
      CHECK(s == Status::kDriverError);
    }
    CHECK_EQ(Leftovers(sim), std::string());
  }
}

// Failed unmaps of a stitched range (dropped from the cache) are kept too.
TEST(failed_stitch_unmaps_are_kept_and_retried) {
  SimDriver sim(SmallDevice());
  FaultyDriver drv(sim);
  {
    Lake lake(drv, Capped(16 * kMiB));
    std::vector<std::uintptr_t> b = AllocEach(lake, 4, 4 * kMiB);
    CHECK(lake.free(b[0], 0) == Status::kOk);
    CHECK(lake.free(b[2], 0) == Status::kOk);
    AllocState how{};
    std::uintptr_t big = Alloc(lake, 8 * kMiB, &how);
    CHECK(how == AllocState::stitch);
    CHECK(lake.free(big, 0) == Status::kOk);
    drv.fail(Call::unmap, 2);
    Status s = Status::kOk;
    lake.empty_cache(&s);
    CHECK(s == Status::kDriverError);
    CHECK_EQ(lake.stats().unreleased.current, 1);
    CHECK_EQ(lake.check(), std::string());
    CHECK(lake.free(b[1], 0) == Status::kOk);
    CHECK(lake.free(b[3], 0) == Status::kOk);
    lake.empty_cache(&s);
    CHECK(s == Status::kOk);
    CHECK_EQ(lake.stats().unreleased.current, 0);
    CHECK_EQ(lake.stats().bytes_reserved.current, 0);
    CHECK_EQ(sim.physical_bytes(), 0u);
    CHECK_EQ(sim.reserved_bytes(), 0u);
  }
  CHECK_EQ(sim.live_handles(), 0u);
}

// A cached range's unmap and a segment's release release the lock: hooks
// inside them change the lake, which must come out consistent, with no
// memory handed twice (as for a growth: lake_growth_test.cc).
TEST(cache_drop_and_release_with_the_lock_released) {
  HookedLake t(32 * kMiB);
  std::vector<std::uintptr_t> b = AllocEach(t.lake, 4, 4 * kMiB, 1);
  CHECK(t.lake.free(b[0], 1) == Status::kOk);
  CHECK(t.lake.free(b[2], 1) == Status::kOk);
  std::uintptr_t big = Alloc(t.lake, 8 * kMiB, nullptr, 1);
  CHECK(t.lake.free(big, 1) == Status::kOk);  // cached
  std::uintptr_t during = 0;
  // While empty_cache unmaps the cached range, a request of its size must
  // not reuse it; a stream is held and a live block freed meanwhile.
  t.drv.hook(Call::unmap, [&] {
    ++t.fired;
    AllocState how{};
    during = Alloc(t.lake, 8 * kMiB, &how, 2);
    CHECK(how != AllocState::stitch_reuse);
    t.sim.hold_stream(2);
    CHECK(t.lake.free(b[1], 1) == Status::kOk);
    CHECK_EQ(t.lake.check(), std::string());
  }, false);
  t.lake.empty_cache();
  CHECK_EQ(t.lake.check(), std::string());
  // While a free segment is released, a grow takes the capacity it gives.
  CHECK(t.lake.free(during, 2) == Status::kOk);
  std::uintptr_t late = 0;
  t.drv.hook(Call::release, [&] {
    ++t.fired;
    late = Alloc(t.lake, 16 * kMiB, nullptr, 3);
    CHECK_EQ(t.lake.check(), std::string());
  });
  CHECK(t.lake.free(b[3], 1) == Status::kOk);
  t.lake.empty_cache();
  t.sim.release_stream(2);
  CHECK(late != 0);
  CHECK(t.lake.free(late, 3) == Status::kOk);
  t.lake.empty_cache();
  CHECK_EQ(t.lake.stats().bytes_reserved.current, 0);
  CHECK_EQ(t.lake.check(), std::string());
  CHECK_EQ(t.sim.physical_bytes(), 0u);
  CHECK_EQ(t.fired, 2);
}

// Found by the stress harness (8 threads, faults): while a free segment was
// being released (lock released), its bytes were already off the books, so
// another thread grew into that capacity; when the release then failed, the
// lake held more than its capacity. Now the bytes count until the driver
// answers, and a request they refuse waits for the release instead of
// failing: here the release fails, the other thread's request then retries
// it in its own reclaim and is served, and the capacity holds throughout.
TEST(capacity_counts_memory_being_released) {
  SimDriver sim(SmallDevice());
  FaultyDriver drv(sim);
  Lake lake(drv, Capped(4 * kMiB));
  std::uintptr_t a = Alloc(lake, 4 * kMiB);
  CHECK(lake.free(a, 0) == Status::kOk);
  Status during = Status::kOutOfMemory;
  std::thread other;
  int fired = 0;
  drv.hook(Call::unmap, [&] {
    ++fired;
    // The release goes on once the request was refused and waits for it.
    bool waited = false;
    other = RunUntilRefused(lake, [&] {
      std::uintptr_t p = 0;
      during = lake.allocate(4 * kMiB, 1, &p);
      CHECK(sim.physical_bytes() <= 4 * kMiB);
      if (during == Status::kOk) CHECK(lake.free(p, 1) == Status::kOk);
    }, &waited);
    CHECK(waited);
  }, /*after=*/false);
  drv.fail(Call::unmap);
  Status s = Status::kOk;
  lake.empty_cache(&s);
  other.join();
  CHECK_EQ(fired, 1);
  CHECK(s == Status::kDriverError);
  CHECK(during == Status::kOk);
  CHECK(sim.physical_bytes() <= 4 * kMiB);
  CHECK_EQ(lake.check(), std::string());
  lake.empty_cache(&s);
  CHECK(s == Status::kOk);
  CHECK_EQ(sim.physical_bytes(), 0u);
  std::uintptr_t p = Alloc(lake, 4 * kMiB, nullptr, 1);  // free again now
  CHECK(lake.free(p, 1) == Status::kOk);
}

// Segments laid out by one run's order (here eight of 8 MiB, up to the
// capacity): once the lake has emptied, the next allocation releases them
// and the lake grows again as a fresh one, so a repeated run is placed as
// the first was, in no more memory.
TEST(a_lake_emptied_near_its_capacity_starts_over) {
  SimDriver drv(SmallDevice());
  Lake lake(drv, Capped(64 * kMiB));
  std::vector<std::uintptr_t> blocks = AllocEach(lake, 8, 8 * kMiB);
  CHECK_EQ(lake.stats().segments.current, 8);
  for (std::size_t i = 0; i + 1 < blocks.size(); ++i)
    CHECK(lake.free(blocks[i], 0) == Status::kOk);
  // Not empty yet: the segments stay.
  std::uintptr_t p = Alloc(lake, 8 * kMiB);
  CHECK(lake.free(p, 0) == Status::kOk);
  CHECK_EQ(lake.stats().segments_released, 0u);
  CHECK(lake.free(blocks.back(), 1) == Status::kOk);
  CHECK_EQ(Reserved(lake), 64 * kMiB);  // nothing released at the free
  AllocState how{};
  p = Alloc(lake, 12 * kMiB, &how);
  CHECK(how == AllocState::grow);
  CHECK_EQ(lake.stats().segments_released, 8u);
  CHECK_EQ(lake.stats().segments.current, 1);
  CHECK_EQ(Reserved(lake), 12 * kMiB);
  CHECK_EQ(lake.check(), std::string());
  CHECK(lake.free(p, 0) == Status::kOk);
  // Emptied again with one segment: nothing to lay out anew, it stays.
  Alloc(lake, 4 * kMiB, &how);
  CHECK(how == AllocState::split);
  CHECK_EQ(lake.stats().segments_released, 8u);
}

// Far below its capacity, an emptied lake keeps its segments: the next run
// is served from them with no driver call, and may grow where it needs.
TEST(a_lake_emptied_far_from_its_capacity_keeps_its_segments) {
  SimDriver drv(SmallDevice());
  Lake lake(drv, Capped(128 * kMiB));
  std::vector<std::uintptr_t> blocks = AllocEach(lake, 8, 8 * kMiB);
  for (std::uintptr_t b : blocks) CHECK(lake.free(b, 0) == Status::kOk);
  const std::uint64_t creates =
      drv.calls()[static_cast<int>(Call::create)];
  AllocState how{};
  Alloc(lake, 8 * kMiB, &how);
  CHECK(how == AllocState::fit);
  CHECK_EQ(drv.calls()[static_cast<int>(Call::create)], creates);
  CHECK_EQ(lake.stats().segments_released, 0u);
  CHECK_EQ(lake.stats().segments.current, 8);
}

// A free whose last use is still in flight (stream 1 held until someone
// waits for it) is waited for, as reclaim does, and its segment released
// with the others.
TEST(starting_over_waits_for_frees_in_flight) {
  SimDriver drv(SmallDevice());
  Lake lake(drv, Capped(64 * kMiB));
  std::vector<std::uintptr_t> blocks = AllocEach(lake, 7, 8 * kMiB);
  drv.hold_stream(1, /*until_waited=*/true);
  const std::uintptr_t p = Alloc(lake, 8 * kMiB, nullptr, 1);
  for (std::uintptr_t b : blocks) CHECK(lake.free(b, 0) == Status::kOk);
  CHECK(lake.free(p, 1) == Status::kOk);
  Alloc(lake, 8 * kMiB);
  CHECK(!drv.stream_held(1));
  CHECK_EQ(lake.stats().segments_released, 8u);
  CHECK_EQ(lake.stats().segments.current, 1);
  CHECK_EQ(lake.check(), std::string());
}

// Starting over releases the lock twice: waiting for a stream's frees in
// flight and releasing the free segments. Meanwhile other threads allocate
// and free (run inside those driver calls): the block taken while the
// restart waits is not released under its owner, a request made while the
// segments are released is served once they are, the restarting request
// is served, and the books stay consistent and within the capacity.
TEST(starting_over_with_the_lock_released) {
  HookedLake t(64 * kMiB);
  std::vector<std::uintptr_t> blocks = AllocEach(t.lake, 7, 8 * kMiB);
  t.sim.hold_stream(1, /*until_waited=*/true);
  const std::uintptr_t q = Alloc(t.lake, 8 * kMiB, nullptr, 1);
  for (std::uintptr_t b : blocks) CHECK(t.lake.free(b, 0) == Status::kOk);
  CHECK(t.lake.free(q, 1) == Status::kOk);  // emptied at the capacity
  std::uintptr_t x = 0, y = 0;
  t.drv.hook(Call::event_synchronize, [&] {
    ++t.fired;
    x = Alloc(t.lake, 4 * kMiB, nullptr, 2);
    CHECK_EQ(t.lake.check(), std::string());
  }, /*after=*/false);
  // A request refused while the restart's releases still hold the
  // capacity waits for them (it runs on a thread of its own).
  std::thread other;
  t.drv.hook(Call::release, [&] {
    ++t.fired;
    CHECK(t.lake.free(x, 2) == Status::kOk);
    CHECK_EQ(t.lake.check(), std::string());
    // x's segment is free now but kept; the rest is being released.
    bool waited = false;
    other = RunUntilRefused(
        t.lake, [&] { y = Alloc(t.lake, 16 * kMiB, nullptr, 3); }, &waited);
    CHECK(waited);  // refused, and waiting for the releases
  });
  AllocState how{};
  const std::uintptr_t p = Alloc(t.lake, 16 * kMiB, &how);
  other.join();
  CHECK_EQ(t.fired, 2);
  CHECK(x != 0 && y != 0);
  CHECK(p + 16 * kMiB <= y || y + 16 * kMiB <= p);  // no byte handed twice
  CHECK(t.lake.stats().segments_released > 0u);
  CHECK(Reserved(t.lake) <= 64 * kMiB);
  CHECK_EQ(t.lake.stats().live_allocations.current, 2);
  CHECK_EQ(t.lake.check(), std::string());
  CHECK(t.lake.free(y, 3) == Status::kOk);
  CHECK(t.lake.free(p, 0) == Status::kOk);
  t.lake.empty_cache();
  CHECK_EQ(t.lake.stats().bytes_reserved.current, 0);
  CHECK_EQ(t.sim.physical_bytes(), 0u);
  CHECK_EQ(t.lake.check(), std::string());
}

}  // namespace
}  // namespace jaxlake::testing

int main(int argc, char** argv) { return jaxlake::check::RunAll(argc, argv); }
