// Tests of the lake's growth: how much a new segment takes, growth ranges
// (segments back to back in one reservation), free runs across segments
// and at the growth edge, and growths made with the lock released.
#include <cstdint>
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

// A growth holds at least 1/16 of what the lake holds (kGrowAhead), cut
// to the capacity left, while nothing was freed since the last growth, and
// at least grow_min; the first growth, with nothing held, holds only what
// the request needs.
TEST(growth_holds_a_share_of_what_the_lake_holds) {
  {
    jaxlake::vmm::SimDriver drv(SmallDevice(1024 * kMiB));
    Lake lake(drv, Capped(1024 * kMiB));
    auto a = Alloc(lake, 64 * kMiB);
    CHECK_EQ(Reserved(lake), 64 * kMiB);
    AllocState how{};
    auto b = Alloc(lake, kMiB, &how);  // needs 1 chunk; 64 MiB / 16 = 2
    CHECK(how == AllocState::grow);
    CHECK_EQ(Reserved(lake), 68 * kMiB);
    CHECK_EQ(drv.calls(Call::create), 2u);
    auto c = Alloc(lake, 3 * kMiB, &how);  // the growth's surplus
    CHECK(how != AllocState::grow && how != AllocState::stitch_grow);
    CHECK_EQ(Reserved(lake), 68 * kMiB);
    CHECK_EQ(drv.calls(Call::create), 2u);
    // Once something was freed since the last growth, a growth holds only
    // what the request needs: 1 chunk, where the share would be 2.
    CHECK(lake.free(c, 0) == Status::kOk);
    auto e = Alloc(lake, 3 * kMiB, &how);  // c's place again
    CHECK(how == AllocState::fit);
    auto f = Alloc(lake, kMiB, &how);
    CHECK(how == AllocState::grow);
    CHECK_EQ(Reserved(lake), 70 * kMiB);
    CHECK_EQ(FreeAllThenCheck(lake, {a, b, e, f}), std::string());
  }
  {  // the share is cut to the capacity left, never below the need
    jaxlake::vmm::SimDriver drv(SmallDevice(1024 * kMiB));
    Lake lake(drv, Capped(66 * kMiB));
    auto a = Alloc(lake, 64 * kMiB);
    auto b = Alloc(lake, kMiB);
    CHECK_EQ(Reserved(lake), 66 * kMiB);
    CHECK_EQ(FreeAllThenCheck(lake, {a, b}), std::string());
  }
  {  // grow_min sets a floor, the first growth included
    jaxlake::vmm::SimDriver drv(SmallDevice(1024 * kMiB));
    LakeOptions o = Capped(1024 * kMiB);
    o.grow_min = 16 * kMiB;
    Lake lake(drv, o);
    auto a = Alloc(lake, kMiB);
    CHECK_EQ(Reserved(lake), 16 * kMiB);
    CHECK(lake.free(a, 0) == Status::kOk);
    CHECK_EQ(lake.check(), std::string());
  }
}

// preallocate: the first growth takes the whole capacity as one segment;
// later requests are served from it with no create, and it is taken once
// (after empty_cache the lake grows on demand).
TEST(preallocate_takes_the_capacity_at_the_first_growth) {
  jaxlake::vmm::SimDriver drv(SmallDevice(1024 * kMiB));
  LakeOptions o = Capped(64 * kMiB);
  o.preallocate = true;
  Lake lake(drv, o);
  AllocState how{};
  auto a = Alloc(lake, kMiB, &how);
  CHECK(how == AllocState::grow);
  CHECK_EQ(Reserved(lake), 64 * kMiB);
  std::vector<std::uintptr_t> ps{a};
  for (std::size_t n : {9 * kMiB, 20 * kMiB, 30 * kMiB, 3 * kMiB})
    ps.push_back(Alloc(lake, n, &how));
  CHECK_EQ(drv.calls(Call::create), 1u);
  CHECK_EQ(drv.calls(Call::reserve), 1u);
  std::uintptr_t p = 0;  // 63 MiB live: no room for 2 MiB
  CHECK(lake.allocate(2 * kMiB, 0, &p) == Status::kOutOfMemory);
  CHECK_EQ(lake.check(), std::string());
  for (auto q : ps) CHECK(lake.free(q, 0) == Status::kOk);
  lake.empty_cache();
  CHECK_EQ(lake.stats().bytes_reserved.current, 0);
  auto b = Alloc(lake, 4 * kMiB);
  CHECK_EQ(Reserved(lake), 4 * kMiB);
  CHECK(lake.free(b, 0) == Status::kOk);
  CHECK_EQ(lake.check(), std::string());
}

// A segment larger than the request needs that the driver refuses for
// lack of memory (a device that another lake uses too) falls back to the
// request's own chunks: a preallocation, and a growth share.
TEST(refused_larger_segments_fall_back_to_the_request) {
  jaxlake::vmm::SimDriver drv(SmallDevice(128 * kMiB));
  Lake other(drv, LakeOptions{});
  auto x = Alloc(other, 62 * kMiB);  // the device has 66 MiB left
  {
    LakeOptions o;
    o.preallocate = true;
    Lake lake(drv, o);
    AllocState how{};
    auto a = Alloc(lake, 3 * kMiB, &how);
    CHECK(how == AllocState::grow);
    CHECK_EQ(Reserved(lake), 4 * kMiB);
    CHECK(lake.free(a, 0) == Status::kOk);
    CHECK_EQ(lake.check(), std::string());
  }
  Lake lake(drv, LakeOptions{});
  auto a = Alloc(lake, 64 * kMiB);  // 2 MiB left on the device
  AllocState how{};
  auto b = Alloc(lake, kMiB, &how);  // its share would be 4 MiB
  CHECK(how == AllocState::grow);
  CHECK_EQ(Reserved(lake), 66 * kMiB);
  CHECK_EQ(lake.check(), std::string());
  for (auto q : {a, b}) CHECK(lake.free(q, 0) == Status::kOk);
  CHECK(other.free(x, 0) == Status::kOk);
}

// A request that finds the capacity claimed by another thread's segment
// creation in flight (lock released) waits for it to finish instead of
// failing: here the preallocation of the whole capacity. The map hook
// starts a second thread, which finds no memory, and lets the creation
// finish only once that thread waits (its refusal counted in reclaims).
TEST(allocation_waits_for_a_creation_in_flight) {
  HookDriver drv(SmallDevice(1024 * kMiB));
  LakeOptions o = Capped(32 * kMiB);
  o.preallocate = true;
  Lake lake(drv, o);
  std::thread other;
  std::uintptr_t b = 0;
  Status bs = Status::kDriverError;
  drv.hook_at = 1;
  drv.on_map = [&] {
    other = std::thread([&] { bs = lake.allocate(8 * kMiB, 0, &b); });
    while (lake.stats().reclaims == 0) std::this_thread::yield();
    CHECK_EQ(lake.check(), std::string());
  };
  auto a = Alloc(lake, 4 * kMiB);
  other.join();
  CHECK(bs == Status::kOk);
  CHECK(b >= a + 4 * kMiB && b + 8 * kMiB <= a + 32 * kMiB);
  CHECK_EQ(drv.calls(Call::create), 1u);
  CHECK_EQ(Reserved(lake), 32 * kMiB);
  for (auto q : {a, b}) CHECK(lake.free(q, 0) == Status::kOk);
  CHECK_EQ(lake.check(), std::string());
}

// A growth of less than a chunk leaves the rest of its chunk free. While a
// free tail is larger than every free head, the request takes its chunk's
// end, so the rest is a head: a later stitch can be led by the tail and end
// in the head. Here the capacity leaves 2 chunks to create, and 5.25 MiB
// fits only as 0.5 (a's tail) + 4 + 0.75 (b's head): with b at its chunk's
// start, its 0.75 MiB tail could not end the range, and the request ran out
// of memory. A free head at a segment's start is carved from its end, so
// what stays free is still a head.
TEST(growth_below_a_chunk_leaves_a_head_beside_a_free_tail) {
  jaxlake::vmm::HostDriver drv(SmallDevice());
  Lake lake(drv, Capped(8 * kMiB));
  AllocState how{};
  auto a = Alloc(lake, 3 * kMiB / 2, &how);  // a chunk: a 0.5 MiB tail
  CHECK(how == AllocState::grow);
  CHECK_EQ(a % (2 * kMiB), 0u);
  auto b = Alloc(lake, 5 * kMiB / 4, &how);  // a chunk of its own
  CHECK(how == AllocState::grow);
  CHECK_EQ((b + 5 * kMiB / 4) % (2 * kMiB), 0u);  // at its chunk's end
  Fill(a, 3 * kMiB / 2, 1);
  Fill(b, 5 * kMiB / 4, 2);
  auto c = Alloc(lake, 21 * kMiB / 4, &how);
  CHECK(how == AllocState::stitch_grow);
  CHECK_EQ(Reserved(lake), 8 * kMiB);
  Fill(c, 21 * kMiB / 4, 3);
  CHECK(Holds(a, 3 * kMiB / 2, 1));
  CHECK(Holds(b, 5 * kMiB / 4, 2));
  CHECK(Holds(c, 21 * kMiB / 4, 3));
  CHECK_EQ(lake.check(), std::string());
  CHECK(lake.free(c, 0) == Status::kOk);
  // The head (0.75 MiB, the smallest block that fits) is carved from its
  // end: d ends where b starts, the head's first 0.125 MiB stay free.
  auto d = Alloc(lake, 5 * kMiB / 8, &how);
  CHECK(how == AllocState::split);
  CHECK_EQ(d + 5 * kMiB / 8, b);
  Fill(d, 5 * kMiB / 8, 4);
  CHECK(Holds(b, 5 * kMiB / 4, 2));
  CHECK_EQ(FreeAllThenCheck(lake, {a, b, d}), std::string());
}

// Growth places segments back to back in one reservation: one reserve for
// several growths, each segment starting where the previous one ends.
TEST(growth_segments_are_back_to_back_in_one_reservation) {
  jaxlake::vmm::SimDriver drv(SmallDevice());
  {
    Lake lake(drv, LakeOptions{});
    auto a = Alloc(lake, 2 * kMiB);
    auto b = Alloc(lake, 4 * kMiB);
    auto c = Alloc(lake, 2 * kMiB);
    CHECK_EQ(b, a + 2 * kMiB);
    CHECK_EQ(c, b + 4 * kMiB);
    CHECK_EQ(drv.calls()[static_cast<int>(Call::reserve)], 1u);
    CHECK_EQ(drv.calls()[static_cast<int>(Call::create)], 3u);
    // Released segments leave the reservation until its last one goes.
    CHECK(lake.free(b, 0) == Status::kOk);
    CHECK_EQ(lake.empty_cache(), 4 * kMiB);
    CHECK(drv.reserved_bytes() > 0u);
    CHECK(FreeAll(lake, {a, c}));
    CHECK_EQ(lake.empty_cache(), 4 * kMiB);
    CHECK_EQ(drv.reserved_bytes(), 0u);
    CHECK_EQ(lake.check(), std::string());
    // A growth after that reserves a new range.
    auto d = Alloc(lake, 2 * kMiB);
    CHECK_EQ(drv.calls()[static_cast<int>(Call::reserve)], 2u);
    CHECK(lake.free(d, 0) == Status::kOk);
  }
  CHECK_EQ(drv.reserved_bytes(), 0u);
  CHECK_EQ(drv.live_handles(), 0u);
}

// A request that no free block fits is served from a free run that
// crosses back-to-back segments (the free tail of one, a wholly free one,
// the free head of the next): an alias, no driver call. While it is live
// none of the segments it covers is released, even once everything else
// in them is freed; after its free they all go.
TEST(free_run_across_segments_serves_without_a_driver_call) {
  jaxlake::vmm::HostDriver drv(SmallDevice());
  Lake lake(drv, LakeOptions{});
  auto x = Alloc(lake, 3 * kMiB / 2);  // segment 1: 1 chunk, 0.5 MiB free
  auto m = Alloc(lake, 2 * kMiB);      // segment 2: 1 chunk
  // Segment 3: 1 chunk. Beside x's free tail, y takes its chunk's end
  // (growth_below_a_chunk_leaves_a_head_beside_a_free_tail), and z the
  // free head before it.
  auto y = Alloc(lake, kMiB);
  auto z = Alloc(lake, kMiB);
  CHECK_EQ(m, x + 2 * kMiB);
  CHECK_EQ(z, m + 2 * kMiB);
  CHECK_EQ(y, z + kMiB);
  CHECK(FreeAll(lake, {m, z}));
  // Free: 0.5 MiB + 2 MiB + 1 MiB, contiguous; no single block of 3 MiB.
  const auto calls0 = drv.calls();
  AllocState how{};
  auto s = Alloc(lake, 3 * kMiB, &how);
  CHECK(how == AllocState::stitch);
  CHECK_EQ(s, x + 3 * kMiB / 2);
  CHECK(drv.calls() == calls0);
  CHECK(drv.accessible(s, 3 * kMiB));
  Fill(s, 3 * kMiB, 0x3C);
  Fill(x, 3 * kMiB / 2, 0x11);
  Fill(y, kMiB, 0x22);
  CHECK(Holds(s, 3 * kMiB, 0x3C));
  CHECK_EQ(lake.check(), std::string());
  CHECK(FreeAll(lake, {x, y}));
  CHECK_EQ(lake.empty_cache(), 0u);  // s covers all three segments
  CHECK(Holds(s, 3 * kMiB, 0x3C));
  CHECK_EQ(lake.check(), std::string());
  CHECK(lake.free(s, 0) == Status::kOk);
  CHECK_EQ(lake.stats().stitched_bytes.current, 0);
  CHECK_EQ(lake.empty_cache(), 6 * kMiB);
  CHECK_EQ(drv.reserved_bytes(), 0u);
  CHECK_EQ(lake.check(), std::string());
}

// A request of several chunks is placed by best fit over the free space
// as one growing region sees it: three wholly free back-to-back segments
// are one run of 30 MiB, not three blocks of 10. Requests of 8 MiB and a
// bit pack into it one after the other, each starting where the last one
// ended, and the 5.8 MiB left stay in one piece. Fitted into one segment
// each, they would leave three free tails of 1.94 MiB, no stitch could
// take two of them, and the last request would find the capacity spent.
TEST(requests_of_several_chunks_pack_into_a_free_run) {
  jaxlake::vmm::HostDriver drv(SmallDevice());
  Lake lake(drv, Capped(32 * kMiB));
  auto k = Alloc(lake, 2 * kMiB);  // kept: the lake is never emptied
  std::vector<std::uintptr_t> segs = AllocEach(lake, 3, 10 * kMiB);
  CHECK_EQ(lake.stats().segments.current, 4);
  CHECK_EQ(segs[1], segs[0] + 10 * kMiB);
  CHECK_EQ(segs[2], segs[1] + 10 * kMiB);
  CHECK(FreeAll(lake, {segs[0], segs[1], segs[2]}));
  const auto calls0 = drv.calls();
  const std::size_t r = 8 * kMiB + 64 * 1024;
  std::vector<std::uintptr_t> rs;
  for (int i = 0; i < 3; ++i) {
    rs.push_back(Alloc(lake, r));
    CHECK_EQ(rs.back(), segs[0] + i * r);
    Fill(rs.back(), r, 0x41 + i);
  }
  AllocState how{};
  auto last = Alloc(lake, 5 * kMiB, &how);
  CHECK(how == AllocState::split);
  CHECK_EQ(last, segs[0] + 3 * r);
  CHECK(drv.calls() == calls0);  // no driver call: aliases and fits
  Fill(last, 5 * kMiB, 0x50);
  for (int i = 0; i < 3; ++i) CHECK(Holds(rs[i], r, 0x41 + i));
  CHECK_EQ(Reserved(lake), 32 * kMiB);
  CHECK_EQ(lake.check(), std::string());
  CHECK_EQ(FreeAllThenCheck(lake, {rs[0], rs[1], rs[2], last, k}),
           std::string());
}

// The segments a free run can start from (open_ends) follow the blocks:
// a segment whose last block is taken leaves the list when a search next
// passes it, a released one at once, and a search never reads a released
// segment (check() verifies the list after each call in debug builds).
TEST(free_run_starts_follow_takes_and_releases) {
  jaxlake::vmm::HostDriver drv(SmallDevice());
  Lake lake(drv, Capped(64 * kMiB));
  auto k = Alloc(lake, 2 * kMiB);  // kept: the lake is never emptied
  std::vector<std::uintptr_t> s = AllocEach(lake, 4, 8 * kMiB);
  CHECK_EQ(s[3], s[0] + 24 * kMiB);
  // s1 and s2 free: one run of 16 MiB across their boundary.
  CHECK(FreeAll(lake, {s[1], s[2]}));
  CHECK_EQ(lake.check(), std::string());
  AllocState how{};
  auto a = Alloc(lake, 12 * kMiB, &how);  // the run, from s1's start
  CHECK_EQ(a, s[1]);
  CHECK_EQ(lake.check(), std::string());
  CHECK(lake.free(a, 0) == Status::kOk);
  // s2 taken whole by a fit: its last block is no longer free.
  auto b = Alloc(lake, 8 * kMiB, &how);
  CHECK(how == AllocState::fit || how == AllocState::split);
  CHECK_EQ(lake.check(), std::string());
  // s1 released (empty_cache): its end leaves the list.
  CHECK(lake.free(b, 0) == Status::kOk);
  CHECK(lake.free(s[3], 0) == Status::kOk);
  CHECK_EQ(lake.empty_cache(), 24 * kMiB);
  CHECK_EQ(lake.check(), std::string());
  // A search after the release: no run, a fresh growth.
  auto c = Alloc(lake, 12 * kMiB, &how);
  CHECK(how == AllocState::grow || how == AllocState::stitch_grow);
  Fill(c, 12 * kMiB, 0x5A);
  CHECK(Holds(c, 12 * kMiB, 0x5A));
  CHECK_EQ(FreeAllThenCheck(lake, {c, s[0], k}), std::string());
}

// A run across segments is taken only when every part of it is usable by
// the requesting stream: a head freed on another stream, not yet known
// complete, is not.
TEST(free_run_across_segments_respects_stream_order) {
  jaxlake::vmm::SimDriver sim(SmallDevice());
  Lake lake(sim, LakeOptions{});
  auto x = Alloc(lake, 3 * kMiB / 2);  // segment 1, 0.5 MiB free tail
  auto y = Alloc(lake, kMiB);          // segment 2
  auto z = Alloc(lake, kMiB);          // the rest of segment 2
  sim.hold_stream(1);
  CHECK(lake.free(y, 1) == Status::kOk);  // in flight on stream 1
  AllocState how{};
  auto s = Alloc(lake, 3 * kMiB / 2, &how, 0);
  CHECK(how != AllocState::stitch);  // not across y's units
  CHECK(s < x || s >= z + kMiB);
  CHECK_EQ(lake.check(), std::string());
  sim.release_stream(1);
  CHECK(FreeAll(lake, {x, z, s}));
  lake.empty_cache();
  CHECK_EQ(lake.stats().bytes_reserved.current, 0);
  CHECK_EQ(lake.check(), std::string());
}

// A growth led by the free run at the growth edge (here with stitch_grow
// off, so the stitch path leaves it to the edge growth): the new segment
// lands right after the run, the request spans both as an alias. Inside
// the growth's create (lock released) another thread grows too and frees
// the block before the run: its segment comes after the claimed stretch,
// nothing overlaps, and every invariant holds.
TEST(edge_growth_spans_the_free_run_with_the_lock_released) {
  jaxlake::vmm::HostDriver host(SmallDevice());
  jaxlake::vmm::FaultyDriver drv(host);
  LakeOptions o;
  o.stitch_grow = false;
  Lake lake(drv, o);
  auto a = Alloc(lake, 3 * kMiB / 2);  // segment 1: 0.5 MiB free at the edge
  std::uintptr_t c = 0;
  int fired = 0;
  drv.hook(Call::create, [&] {
    ++fired;
    CHECK_EQ(lake.check(), std::string());
    AllocState how{};
    CHECK(lake.allocate(kMiB, 0, &c, &how) == Status::kOk);
    CHECK(how == AllocState::grow);
    CHECK(lake.free(a, 0) == Status::kOk);
    CHECK_EQ(lake.check(), std::string());
  }, /*after=*/false);
  const auto maps0 = host.calls()[static_cast<int>(Call::map)];
  AllocState how{};
  const std::size_t n = 9 * kMiB / 4;  // 2 chunks alone, 1 after the run
  auto b = Alloc(lake, n, &how);
  CHECK_EQ(fired, 1);
  CHECK(how == AllocState::stitch_grow);
  CHECK_EQ(b, a + 3 * kMiB / 2);
  CHECK_EQ(c, a + 4 * kMiB);  // the other growth, after b's segment
  CHECK_EQ(host.calls()[static_cast<int>(Call::map)], maps0 + 2);  // 2 segs
  CHECK(host.accessible(b, n));
  Fill(b, n, 0x6B);
  Fill(c, kMiB, 0x7C);
  CHECK(Holds(b, n, 0x6B));
  CHECK_EQ(Reserved(lake), 6 * kMiB);
  CHECK_EQ(lake.check(), std::string());
  FreeAllAndEmpty(lake, {b, c}, 6 * kMiB, host);
}

// A growth while another growth has the lock released (inside its map):
// each claimed its own stretch of the range before unlocking, so they lie
// back to back in claim order and nothing overlaps.
TEST(growths_with_the_lock_released_get_adjacent_stretches) {
  HookDriver drv(SmallDevice());
  Lake lake(drv, LakeOptions{});
  auto a = Alloc(lake, 2 * kMiB);  // map 1
  std::uintptr_t c = 0;
  drv.hook_at = 2;  // b's segment, mapped with the lock released
  drv.on_map = [&] {
    CHECK_EQ(lake.check(), std::string());
    AllocState how{};
    CHECK(lake.allocate(4 * kMiB, 0, &c, &how) == Status::kOk);
    CHECK(how == AllocState::grow);
    CHECK_EQ(lake.check(), std::string());
  };
  auto b = Alloc(lake, 2 * kMiB);
  CHECK_EQ(b, a + 2 * kMiB);
  CHECK_EQ(c, b + 2 * kMiB);
  CHECK(drv.accessible(b, 2 * kMiB));
  CHECK(drv.accessible(c, 4 * kMiB));
  CHECK_EQ(drv.calls()[static_cast<int>(Call::reserve)], 1u);
  CHECK_EQ(lake.check(), std::string());
  CHECK(FreeAll(lake, {a, b, c}));
  lake.empty_cache();
  CHECK_EQ(drv.reserved_bytes(), 0u);
}

// Two growths that both find no growth range reserve one each (lock
// released); both ranges are kept, the later growths use one of them, and
// each is freed with its last segment.
TEST(growth_ranges_reserved_with_the_lock_released) {
  HookDriver drv(SmallDevice());
  LakeOptions o = Capped(32 * kMiB);
  Lake lake(drv, o);
  std::uintptr_t c = 0;
  drv.hook_at = 1;
  drv.on_reserve = [&] {
    CHECK_EQ(lake.check(), std::string());
    CHECK(lake.allocate(2 * kMiB, 0, &c) == Status::kOk);
    CHECK_EQ(lake.check(), std::string());
  };
  auto a = Alloc(lake, 2 * kMiB);
  CHECK(c != 0);
  CHECK_EQ(drv.calls()[static_cast<int>(Call::reserve)], 2u);
  CHECK_EQ(lake.check(), std::string());
  auto d = Alloc(lake, 2 * kMiB);  // into the current range, no reserve
  CHECK_EQ(drv.calls()[static_cast<int>(Call::reserve)], 2u);
  CHECK(d == a + 2 * kMiB || d == c + 2 * kMiB);
  FreeAllAndEmpty(lake, {a, c, d}, 6 * kMiB, drv);
}

// A failed create gives its stretch back; the emptied range is freed by
// the next empty_cache().
TEST(failed_growth_gives_its_stretch_back) {
  jaxlake::vmm::SimDriver sim(SmallDevice());
  jaxlake::vmm::FaultyDriver drv(sim);
  Lake lake(drv, LakeOptions{});
  auto a = Alloc(lake, 2 * kMiB);
  CHECK(lake.free(a, 0) == Status::kOk);
  CHECK_EQ(lake.empty_cache(), 2 * kMiB);
  CHECK_EQ(sim.reserved_bytes(), 0u);
  auto b = Alloc(lake, 2 * kMiB);
  drv.fail(Call::create);
  std::uintptr_t p = 0;
  CHECK(lake.allocate(4 * kMiB, 0, &p) != Status::kOk);
  CHECK_EQ(lake.check(), std::string());
  auto c = Alloc(lake, 4 * kMiB);
  CHECK_EQ(c, b + 2 * kMiB);  // the failed growth's stretch, taken again
  FreeAllAndEmpty(lake, {b, c}, 6 * kMiB, sim);
}

// Two releases of segments of one growth range, the second made while the
// first is unmapping (lock released): the range's reservation is freed
// only after both unmaps, by whichever finishes last.
TEST(range_freed_after_its_last_segment_is_unmapped) {
  HookDriver drv(SmallDevice());
  Lake lake(drv, LakeOptions{});
  auto x = Alloc(lake, 2 * kMiB);
  auto y = Alloc(lake, 2 * kMiB);
  CHECK_EQ(y, x + 2 * kMiB);
  CHECK(lake.free(x, 0) == Status::kOk);
  Status inner = Status::kDriverError;
  drv.hook_at = 1;  // x's unmap
  drv.on_unmap = [&] {
    CHECK(lake.free(y, 0) == Status::kOk);
    CHECK_EQ(lake.empty_cache(&inner), 2 * kMiB);
    CHECK_EQ(lake.check(), std::string());
    CHECK(drv.reserved_bytes() > 0u);  // x is still mapped in it
  };
  Status s = Status::kDriverError;
  CHECK_EQ(lake.empty_cache(&s), 2 * kMiB);
  CHECK(s == Status::kOk);
  CHECK(inner == Status::kOk);
  CHECK_EQ(drv.reserved_bytes(), 0u);
  CHECK_EQ(drv.physical_bytes(), 0u);
  CHECK_EQ(lake.check(), std::string());
}

// The other paths that release the lock: a grow's create, a stitch's map, a
// cached range's unmap and a segment's release. Each hook changes the lake
// (allocate, free, empty_cache, hold a stream) while the lake waits in the
// driver; the lake must come out consistent, with no memory handed twice.
TEST(grow_with_the_lock_released) {
  HookedLake t(16 * kMiB);
  std::uintptr_t a = Alloc(t.lake, 4 * kMiB, nullptr, 1);
  std::uintptr_t other = 0;
  t.drv.hook(Call::create, [&] {
    ++t.fired;
    // Meanwhile: a free, an empty_cache (which releases that segment) and
    // another grow that takes capacity too.
    CHECK(t.lake.free(a, 1) == Status::kOk);
    CHECK_EQ(t.lake.empty_cache(), 4 * kMiB);
    other = Alloc(t.lake, 6 * kMiB, nullptr, 2);
    CHECK_EQ(t.lake.check(), std::string());
  });
  AllocState how{};
  std::uintptr_t p = Alloc(t.lake, 8 * kMiB, &how, 1);
  CHECK(how == AllocState::grow);
  CHECK(other != 0 && (other + 6 * kMiB <= p || p + 8 * kMiB <= other));
  CHECK_EQ(t.lake.check(), std::string());
  // The capacity left (2 MiB) is honoured.
  std::uintptr_t q = 0;
  CHECK(t.lake.allocate(4 * kMiB, 3, &q) == Status::kOutOfMemory);
  CHECK(t.lake.free(p, 1) == Status::kOk);
  CHECK(t.lake.free(other, 2) == Status::kOk);
  CHECK_EQ(t.lake.check(), std::string());
  CHECK_EQ(t.fired, 1);
}

}  // namespace
}  // namespace jaxlake::testing

int main(int argc, char** argv) { return jaxlake::check::RunAll(argc, argv); }
