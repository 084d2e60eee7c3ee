// Tests of stitching (cc/lake/stitch.cc) and of the stitch cache
// (cc/lake/stitch_cache.h): stitched ranges over free chunks, their leads
// and heads, reuse from the cache and its bound, and the StitchCache class
// on its own.
#include <cstdint>
#include <string>
#include <vector>

#include "cc/vmm/host_driver.h"
#include "cc/lake/stitch_cache.h"
#include "tests/cc/check.h"
#include "tests/cc/test_util.h"

// The tests live in jaxlake::testing, where the lake, its options and
// the helpers of test_util.h need no qualification.
namespace jaxlake::testing {
namespace {

// The headline case: free every other block of a full pool, then ask for
// more than any single free block.
TEST(stitch_serves_scattered_free_memory_with_real_bytes) {
  jaxlake::vmm::HostDriver drv(SmallDevice());
  Lake lake(drv, Capped(64 * kMiB));
  std::vector<std::uintptr_t> blocks;
  for (int i = 0; i < 8; ++i) {
    blocks.push_back(Alloc(lake, 8 * kMiB));
    Fill(blocks.back(), 8 * kMiB, static_cast<unsigned char>(i + 1));
  }
  const auto reserved = lake.stats().bytes_reserved.current;
  CHECK_EQ(reserved, static_cast<std::int64_t>(64 * kMiB));
  for (int i = 0; i < 8; i += 2) CHECK(lake.free(blocks[i], 0) == Status::kOk);
  AllocState how{};
  const std::uintptr_t big = Alloc(lake, 24 * kMiB, &how);
  CHECK(how == AllocState::stitch);
  CHECK_EQ(lake.stats().bytes_reserved.current, reserved);
  CHECK_EQ(lake.check(), std::string());
  // Write through the stitched range; read through the primary blocks.
  for (std::size_t off = 0; off < 24 * kMiB; off += 8 * kMiB)
    Fill(big + off, 8 * kMiB, static_cast<unsigned char>(0xA0 + off / kMiB));
  int seen = 0;
  for (int i = 0; i < 8; i += 2) {
    for (std::size_t off = 0; off < 24 * kMiB; off += 8 * kMiB)
      if (Holds(blocks[i], 8 * kMiB,
                static_cast<unsigned char>(0xA0 + off / kMiB)))
        ++seen;
  }
  CHECK_EQ(seen, 3);  // three of the four freed blocks back the range
  for (int i = 1; i < 8; i += 2)
    CHECK(Holds(blocks[i], 8 * kMiB, static_cast<unsigned char>(i + 1)));
  // Fewer map calls than chunks: one per piece plus one per segment.
  const auto st = lake.stats();
  CHECK_EQ(st.stitch_pieces, 3u);
  CHECK_EQ(st.driver_calls[static_cast<int>(Call::set_access)], 9u);
}

// Dropping a stitched range of several pieces unmaps it in one call (its
// pieces are adjacent mappings) and frees its reservation in one more.
TEST(a_dropped_stitched_range_is_unmapped_in_one_call) {
  jaxlake::vmm::SimDriver drv(SmallDevice());
  LakeOptions o = Capped(64 * kMiB);
  o.stitch_cache = 0;  // a freed range is dropped at once
  Lake lake(drv, o);
  std::vector<std::uintptr_t> blocks = AllocEach(lake, 8, 8 * kMiB);
  for (int i = 0; i < 8; i += 2) CHECK(lake.free(blocks[i], 0) == Status::kOk);
  AllocState how{};
  const auto big = Alloc(lake, 24 * kMiB, &how);
  REQUIRE(how == AllocState::stitch);
  CHECK_EQ(lake.stats().stitch_pieces, 3u);
  const auto unmaps = drv.calls(Call::unmap);
  const auto frees = drv.calls(Call::address_free);
  CHECK(lake.free(big, 0) == Status::kOk);
  CHECK_EQ(drv.calls(Call::unmap), unmaps + 1);
  CHECK_EQ(drv.calls(Call::address_free), frees + 1);
  CHECK_EQ(lake.stats().stitch_evictions, 1u);
  CHECK_EQ(lake.check(), std::string());
  // The chunks it borrowed serve again.
  const auto again = Alloc(lake, 24 * kMiB, &how);
  CHECK(how == AllocState::stitch);
  CHECK(lake.free(again, 0) == Status::kOk);
  for (int i = 1; i < 8; i += 2) CHECK(lake.free(blocks[i], 0) == Status::kOk);
}

TEST(fit_split_and_stitch_reuse) {
  jaxlake::vmm::SimDriver drv(SmallDevice());
  Lake lake(drv, Capped(32 * kMiB));
  AllocState how{};
  auto a = Alloc(lake, 10 * kMiB, &how);
  CHECK(how == AllocState::grow);
  CHECK(lake.free(a, 0) == Status::kOk);
  auto b = Alloc(lake, 4 * kMiB, &how);
  CHECK(how == AllocState::split);
  CHECK_EQ(b, a);
  auto c = Alloc(lake, 6 * kMiB, &how);
  CHECK(how == AllocState::fit);
  CHECK(lake.free(b, 0) == Status::kOk);
  // 4 MiB free: 22 MiB takes it and creates only the other 18 MiB.
  auto d = Alloc(lake, 22 * kMiB, &how);
  CHECK(how == AllocState::stitch_grow);
  CHECK_EQ(Reserved(lake), 28 * kMiB);
  CHECK(lake.free(d, 0) == Status::kOk);
  auto e = Alloc(lake, 2 * kMiB, &how);  // best fit: the 4 MiB block
  CHECK(how == AllocState::split);
  CHECK_EQ(e, a);
  CHECK(lake.free(c, 0) == Status::kOk);
  // Free now: 8 MiB behind e, and the 18 MiB segment.
  // The two lie back to back: one free run across the segments' boundary,
  // served as an alias (no map).
  const auto maps = drv.calls(Call::map);
  auto f = Alloc(lake, 26 * kMiB, &how);
  CHECK(how == AllocState::stitch);
  CHECK_EQ(drv.calls(Call::map), maps);
  CHECK(lake.free(f, 0) == Status::kOk);
  // An alias is dropped at its free; a smaller request takes the same run.
  auto g = Alloc(lake, 20 * kMiB, &how);
  CHECK(how == AllocState::stitch);
  CHECK_EQ(g, f);
  CHECK_EQ(drv.calls(Call::map), maps);  // reuse maps nothing
  CHECK_EQ(lake.stats().bytes_in_use_rounded.current,
           static_cast<std::int64_t>(22 * kMiB));
  CHECK_EQ(lake.check(), std::string());
  auto h = Alloc(lake, 6 * kMiB, &how);  // the chunks g left free
  CHECK(how == AllocState::stitch || how == AllocState::fit ||
        how == AllocState::split);
  CHECK_EQ(Reserved(lake), 28 * kMiB);
  CHECK_EQ(FreeAllThenCheck(lake, {g, e, h}), std::string());
}

TEST(stitch_grow_creates_only_the_shortfall) {
  jaxlake::vmm::SimDriver drv(SmallDevice());
  Lake lake(drv, Capped(64 * kMiB));
  auto a = Alloc(lake, 8 * kMiB);
  auto b = Alloc(lake, 8 * kMiB);
  CHECK(lake.free(a, 0) == Status::kOk);
  AllocState how{};
  auto c = Alloc(lake, 12 * kMiB, &how);
  CHECK(how == AllocState::stitch_grow);
  CHECK_EQ(Reserved(lake), 20 * kMiB);
  CHECK_EQ(FreeAllThenCheck(lake, {b, c}), std::string());
}

// A stitch's shortfall is sized as a growth while nothing was freed since
// the last growth (state being built up), and is created exactly once a
// free came between (a transient peak keeps no surplus).
TEST(stitch_shortfall_is_a_growth_only_while_nothing_was_freed) {
  for (const bool freed : {false, true}) {
    jaxlake::vmm::SimDriver drv(SmallDevice(1024 * kMiB));
    Lake lake(drv, Capped(1024 * kMiB));
    auto a = Alloc(lake, 256 * kMiB);
    auto b = Alloc(lake, kMiB);  // grows 256 / 16 = 16 MiB; 15 MiB free
    CHECK_EQ(Reserved(lake), 272 * kMiB);
    if (freed) CHECK(lake.free(Alloc(lake, kMiB), 0) == Status::kOk);
    AllocState how{};
    // 20 MiB: the 7 whole free chunks (14 MiB) and a 6 MiB shortfall,
    // created right after them (an alias).
    auto c = Alloc(lake, 20 * kMiB, &how);
    CHECK(how == AllocState::stitch_grow);
    CHECK_EQ(drv.calls(Call::map), 3u);  // one per segment: no stitch map
    // Sized as a growth: 272 / 16 = 17 MiB, in whole chunks 16 MiB.
    const std::size_t grown = freed ? 6 * kMiB : 16 * kMiB;
    CHECK_EQ(Reserved(lake), 272 * kMiB + grown);
    CHECK_EQ(FreeAllThenCheck(lake, {a, b, c}), std::string());
  }
}

// A free tail that holds the request's last partial chunk leads a stitch
// even when whole free chunks alone would cover it: the stitch then takes
// one whole chunk fewer, and that chunk stays free for the next request.
TEST(free_tail_leads_a_stitch_to_save_a_whole_chunk) {
  jaxlake::vmm::HostDriver drv(SmallDevice());
  Lake lake(drv, Capped(64 * kMiB));
  const std::vector<std::uintptr_t> v = AllocEach(lake, 4, 4 * kMiB);
  const std::uintptr_t a = v[0], b = v[1], c = v[2], d = v[3];
  auto e = Alloc(lake, 3 * kMiB);  // its last chunk's 1 MiB stays free
  CHECK(FreeAll(lake, {b, d}));
  const auto reserved = lake.stats().bytes_reserved.current;
  AllocState how{};
  // 4.5 MiB: the tail (1 MiB) leads, then the two chunks of b or d; the
  // other two stay free.
  auto r = Alloc(lake, 4 * kMiB + kMiB / 2, &how);
  CHECK(how == AllocState::stitch);
  Fill(r, 4 * kMiB + kMiB / 2, 7);
  Fill(e, 3 * kMiB, 5);
  auto f = Alloc(lake, 4 * kMiB, &how);
  CHECK(how == AllocState::fit);
  CHECK(f == b || f == d);
  Fill(f, 4 * kMiB, 9);
  CHECK(Holds(r, 4 * kMiB + kMiB / 2, 7));
  CHECK(Holds(e, 3 * kMiB, 5));
  CHECK_EQ(lake.stats().bytes_reserved.current, reserved);
  CHECK_EQ(lake.check(), std::string());
  CHECK_EQ(FreeAllThenCheck(lake, {a, c, e, r, f}), std::string());
}

// Holes inside one segment: without stitching only a new segment helps.
void FragmentOneSegment(Lake& lake, std::vector<std::uintptr_t>* live) {
  lake.free(Alloc(lake, 64 * kMiB), 0);
  std::vector<std::uintptr_t> all;
  for (int i = 0; i < 8; ++i) {
    AllocState how{};
    all.push_back(Alloc(lake, 8 * kMiB, &how));
    CHECK(how == AllocState::split || how == AllocState::fit);
  }
  for (int i = 0; i < 8; ++i) {
    if (i % 2)
      live->push_back(all[i]);
    else
      CHECK(lake.free(all[i], 0) == Status::kOk);
  }
  CHECK_EQ(lake.stats().segments.current, 1);
}

TEST(without_stitching_fragmentation_is_fatal) {
  jaxlake::vmm::SimDriver drv(SmallDevice());
  LakeOptions o = Capped(64 * kMiB);
  o.stitch = false;
  Lake lake(drv, o);
  std::vector<std::uintptr_t> live;
  FragmentOneSegment(lake, &live);
  std::uintptr_t p = 0;
  CHECK(lake.allocate(24 * kMiB, 0, &p) == Status::kOutOfMemory);
  CHECK_EQ(lake.check(), std::string());
}

TEST(with_stitching_the_same_holes_serve) {
  jaxlake::vmm::SimDriver drv(SmallDevice());
  Lake lake(drv, Capped(64 * kMiB));
  std::vector<std::uintptr_t> live;
  FragmentOneSegment(lake, &live);
  AllocState how{};
  Alloc(lake, 32 * kMiB, &how);
  CHECK(how == AllocState::stitch);
  CHECK_EQ(lake.stats().stitch_pieces, 4u);
  CHECK_EQ(lake.check(), std::string());
}

// Stitching maps only wholly free chunks: a chunk that still holds a live
// unit is never lent, and the free part of a partly used chunk stays free.
TEST(stitching_takes_only_wholly_free_chunks) {
  jaxlake::vmm::HostDriver drv(SmallDevice(64 * kMiB));
  Lake lake(drv, Capped(16 * kMiB));
  // One 16 MiB segment: [a 3 MiB][b 5 MiB][c 3 MiB][d 5 MiB].
  auto big = Alloc(lake, 16 * kMiB);
  CHECK(lake.free(big, 0) == Status::kOk);
  auto a = Alloc(lake, 3 * kMiB);
  auto b = Alloc(lake, 5 * kMiB);
  auto c = Alloc(lake, 3 * kMiB);
  auto d = Alloc(lake, 5 * kMiB);
  Fill(a, 3 * kMiB, 1);
  Fill(c, 3 * kMiB, 3);
  CHECK(FreeAll(lake, {b, d}));
  // Free: [3, 8) and [11, 16) MiB: whole chunks [4, 8) and [12, 16).
  AllocState how{};
  auto e = Alloc(lake, 8 * kMiB, &how);
  CHECK(how == AllocState::stitch);
  Fill(e, 8 * kMiB, 5);
  CHECK(Holds(a, 3 * kMiB, 1));
  CHECK(Holds(c, 3 * kMiB, 3));
  CHECK_EQ(lake.check(), std::string());
  // The halves of chunks [2, 4) and [10, 12) are still free for a fit.
  auto f = Alloc(lake, kMiB, &how);
  CHECK(how == AllocState::split || how == AllocState::fit);
  Fill(f, kMiB, 6);
  CHECK(Holds(e, 8 * kMiB, 5));
  CHECK_EQ(FreeAllThenCheck(lake, {a, c, e, f}), std::string());
}

// While a tail-led stitch maps its pieces (lock released), other threads
// allocate from the free units of the chunks it maps and free the block
// beside its lead: nothing overlaps and every invariant holds.
TEST(tail_led_stitch_shares_its_chunks_while_mapping) {
  HookDriver drv(SmallDevice());
  Lake lake(drv, LakeOptions{});
  const std::size_t n = 2 * kMiB + kMiB / 4;
  auto a = Alloc(lake, n);  // map 1: a segment of 2 chunks, 1.75 MiB free
  // map 2: a segment between a's and the shortfall's, so that the stitch
  // is not back to back (which would map nothing).
  auto x = Alloc(lake, 2 * kMiB);
  std::uintptr_t c = 0;
  drv.hook_at = 4;  // 3: the shortfall segment; 4: the lead chunk
  drv.on_map = [&] {
    CHECK_EQ(lake.check(), std::string());
    AllocState how{};
    CHECK(lake.allocate(kMiB, 0, &c, &how) == Status::kOk);
    CHECK(how == AllocState::split);  // the shortfall segment's free units
    CHECK(lake.free(a, 0) == Status::kOk);
    CHECK_EQ(lake.check(), std::string());
  };
  AllocState how{};
  auto b = Alloc(lake, n, &how);
  CHECK(how == AllocState::stitch_grow);
  CHECK(c != 0);
  CHECK(drv.accessible(b, n));
  CHECK(drv.accessible(c, kMiB));
  CHECK_EQ(Reserved(lake), 8 * kMiB);
  CHECK_EQ(lake.check(), std::string());
  // a's units are free again and fit a new request beside b's lead.
  auto d = Alloc(lake, 2 * kMiB, &how);
  CHECK(how == AllocState::fit || how == AllocState::split);
  CHECK_EQ(FreeAllThenCheck(lake, {b, c, d, x}), std::string());
}

// A stitch whose shortfall segment lands right after the free tail it
// takes is an alias of those primary addresses: no reserve or map of its
// own, and the bytes written through it are the segments' bytes.
TEST(back_to_back_stitch_maps_nothing) {
  jaxlake::vmm::HostDriver drv(SmallDevice());
  Lake lake(drv, LakeOptions{});
  auto a = Alloc(lake, 2 * kMiB);  // segment 1: 1 chunk
  auto t = Alloc(lake, 4 * kMiB);  // segment 2: 2 chunks, at the edge
  CHECK(lake.free(t, 0) == Status::kOk);
  const auto maps0 = drv.calls()[static_cast<int>(Call::map)];
  const auto reserves0 = drv.calls()[static_cast<int>(Call::reserve)];
  AllocState how{};
  auto b = Alloc(lake, 6 * kMiB, &how);  // 4 MiB free tail + 2 MiB new
  CHECK(how == AllocState::stitch_grow);
  CHECK_EQ(b, t);
  CHECK_EQ(drv.calls()[static_cast<int>(Call::map)], maps0 + 1);  // new seg
  CHECK_EQ(drv.calls()[static_cast<int>(Call::reserve)], reserves0);
  Fill(b, 6 * kMiB, 0x5A);
  CHECK(Holds(b, 6 * kMiB, 0x5A));
  CHECK_EQ(lake.check(), std::string());
  CHECK(lake.free(b, 0) == Status::kOk);
  // An alias is not cached: its free drops it at once (nothing to unmap),
  // and the same free run, across the two segments, serves the next
  // request again without a driver call.
  CHECK_EQ(lake.stats().stitched_bytes.current, 0);
  const auto calls0 = drv.calls();
  auto b2 = Alloc(lake, 6 * kMiB, &how);
  CHECK(how == AllocState::stitch);
  CHECK_EQ(b2, b);
  CHECK(drv.calls() == calls0);
  CHECK(FreeAll(lake, {b2, a}));
  CHECK_EQ(lake.empty_cache(), 8 * kMiB);
  CHECK_EQ(drv.calls()[static_cast<int>(Call::unmap)],
           calls0[static_cast<int>(Call::unmap)] + 3);  // the 3 segments
  CHECK_EQ(drv.reserved_bytes(), 0u);
  CHECK_EQ(lake.check(), std::string());
}

// Frees on one stream record no events, yet the stitch cache must stay
// bounded: trimming advances the stream's event.
TEST(stitch_cache_stays_bounded_on_one_stream) {
  jaxlake::vmm::SimDriver drv(SmallDevice(std::size_t{1} << 30));
  LakeOptions o = Capped(std::size_t{1} << 30);
  o.stitch_cache = 4;
  Lake lake(drv, o);
  std::vector<std::uintptr_t> keep;
  for (int round = 0; round < 20; ++round) {
    // Fragment: alternate live and free 2 MiB blocks, then stitch.
    std::vector<std::uintptr_t> blocks = AllocEach(lake, 6, 2 * kMiB);
    for (int i = 0; i < 6; i += 2) CHECK(lake.free(blocks[i], 0) == Status::kOk);
    for (int i = 1; i < 6; i += 2) keep.push_back(blocks[i]);
    AllocState how{};
    auto big = Alloc(lake, 6 * kMiB + static_cast<std::size_t>(round), &how);
    CHECK(how == AllocState::stitch || how == AllocState::stitch_reuse ||
          how == AllocState::stitch_grow);
    CHECK(lake.free(big, 0) == Status::kOk);
  }
  const auto st = lake.stats();
  CHECK(st.stitch_evictions > 0u);
  CHECK(st.stitched_bytes.current <= static_cast<std::int64_t>(4 * 8 * kMiB));
  CHECK_EQ(lake.check(), std::string());
}

// A stitch's map releases the lock: hooks inside it change the lake
// (allocate, free, hold a stream), which must come out consistent, with no
// memory handed twice (as for a growth: lake_growth_test.cc).
TEST(stitch_with_the_lock_released) {
  HookedLake t(32 * kMiB);
  std::vector<std::uintptr_t> b = AllocEach(t.lake, 6, 4 * kMiB, 1);
  for (int i = 0; i < 6; i += 2) CHECK(t.lake.free(b[i], 1) == Status::kOk);
  std::uintptr_t during = 0;
  t.drv.hook(Call::map, [&] {
    ++t.fired;
    // The pieces are claimed: empty_cache must not release them, nor may a
    // request on the same stream get them.
    CHECK_EQ(t.lake.empty_cache(), 0u);
    std::uintptr_t x = 0;
    const Status s = t.lake.allocate(4 * kMiB, 1, &x);
    CHECK(s == Status::kOk || s == Status::kOutOfMemory);
    during = s == Status::kOk ? x : 0;
    CHECK(t.lake.free(b[1], 1) == Status::kOk);  // a neighbour goes free
    t.sim.hold_stream(1);
    CHECK_EQ(t.lake.check(), std::string());
  });
  AllocState how{};
  std::uintptr_t big = Alloc(t.lake, 12 * kMiB, &how, 1);
  CHECK(how == AllocState::stitch);
  CHECK(during == 0 || during + 4 * kMiB <= big || big + 12 * kMiB <= during);
  CHECK_EQ(t.lake.check(), std::string());
  CHECK(t.lake.free(big, 1) == Status::kOk);
  if (during) CHECK(t.lake.free(during, 1) == Status::kOk);
  t.sim.release_stream(1);
  for (int i = 3; i < 6; i += 2) CHECK(t.lake.free(b[i], 1) == Status::kOk);
  t.lake.empty_cache();
  CHECK_EQ(t.lake.stats().bytes_reserved.current, 0);
  CHECK_EQ(t.lake.check(), std::string());
  CHECK_EQ(t.fired, 1);
}

// A free head (free units that start a chunk whose other units are live)
// may end a stitch, as a free tail may lead one: the range maps the head's
// chunk last and uses only its first units. Here the whole free chunks
// hold 4 of the 5 MiB asked for and the lake may not grow: without the
// head the request runs out of memory.
TEST(free_head_ends_a_stitch_to_save_a_whole_chunk) {
  jaxlake::vmm::HostDriver drv(SmallDevice());
  Lake lake(drv, Capped(8 * kMiB));
  auto a = Alloc(lake, 4 * kMiB);  // two chunks
  auto d = Alloc(lake, 2 * kMiB);  // keeps a's segment apart from b's
  auto b = Alloc(lake, kMiB);      // a chunk of its own...
  auto c = Alloc(lake, kMiB);      // ...shared with c
  CHECK(lake.free(a, 0) == Status::kOk);
  CHECK(lake.free(b, 0) == Status::kOk);  // the head: c's chunk's first half
  Fill(c, kMiB, 3);
  Fill(d, 2 * kMiB, 4);
  const auto reserved = lake.stats().bytes_reserved.current;
  CHECK_EQ(reserved, static_cast<std::int64_t>(8 * kMiB));
  AllocState how{};
  auto r = Alloc(lake, 5 * kMiB, &how);
  CHECK(how == AllocState::stitch);
  Fill(r, 5 * kMiB, 7);
  CHECK(Holds(c, kMiB, 3));
  CHECK(Holds(d, 2 * kMiB, 4));
  CHECK(Holds(r, 5 * kMiB, 7));
  CHECK_EQ(lake.stats().bytes_reserved.current, reserved);
  CHECK_EQ(lake.check(), std::string());
  CHECK(lake.free(r, 0) == Status::kOk);
  CHECK_EQ(lake.check(), std::string());
  // The head's units are free again: a 1 MiB request fits there.
  auto e = Alloc(lake, kMiB, &how);
  CHECK(how == AllocState::fit);
  CHECK(e == b);
  CHECK_EQ(FreeAllThenCheck(lake, {c, d, e}), std::string());
}

// A stitch looks for its ends among the first candidates of the free
// index: the tail that leads it among the largest free blocks of less than
// a chunk. A free block of a chunk or more that holds no whole chunk has a
// tail and a head out of that view. The last try before out of memory
// looks at every free block. Here the capacity is held and the request
// fits only as x's tail, w's chunk and the start of x's head, both ends in
// the one free block of 2.25 MiB that x left.
// A lake of 8 MiB holding one segment [a 0.5][x 2.25][b 1.25][w 2][c 2]
// MiB, with x and w freed: the live blocks a, b and c.
struct XAndWFreed {
  std::uintptr_t a = 0, b = 0, c = 0;
};
XAndWFreed FreeXAndW(Lake& lake) {
  CHECK(lake.free(Alloc(lake, 8 * kMiB), 0) == Status::kOk);
  XAndWFreed l;
  l.a = Alloc(lake, kMiB / 2);
  const std::uintptr_t x = Alloc(lake, 2 * kMiB + kMiB / 4);
  l.b = Alloc(lake, kMiB + kMiB / 4);
  const std::uintptr_t w = Alloc(lake, 2 * kMiB);
  l.c = Alloc(lake, 2 * kMiB);
  CHECK_EQ(x, l.a + kMiB / 2);
  CHECK_EQ(l.b, x + 2 * kMiB + kMiB / 4);
  CHECK_EQ(w, l.a + 4 * kMiB);
  CHECK_EQ(l.c, l.a + 6 * kMiB);
  CHECK_EQ(lake.stats().segments.current, 1);
  CHECK(FreeAll(lake, {x, w}));
  return l;
}

TEST(the_last_try_before_out_of_memory_looks_at_every_free_block) {
  jaxlake::vmm::HostDriver drv(SmallDevice());
  Lake lake(drv, Capped(8 * kMiB));
  const XAndWFreed l = FreeXAndW(lake);
  const std::uintptr_t a = l.a, b = l.b, c = l.c;
  Fill(a, kMiB / 2, 1);
  Fill(b, kMiB + kMiB / 4, 2);
  Fill(c, 2 * kMiB, 3);
  const auto ooms = lake.stats().ooms;
  AllocState how{};
  const std::uintptr_t r = Alloc(lake, 4 * kMiB, &how);
  CHECK(how == AllocState::stitch);
  CHECK_EQ(lake.stats().ooms, ooms);
  CHECK_EQ(lake.stats().bytes_reserved.current,
           static_cast<std::int64_t>(8 * kMiB));
  CHECK_EQ(lake.check(), std::string());
  Fill(r, 4 * kMiB, 7);
  CHECK(Holds(a, kMiB / 2, 1));
  CHECK(Holds(b, kMiB + kMiB / 4, 2));
  CHECK(Holds(c, 2 * kMiB, 3));
  // x's block keeps its last 0.25 MiB free: a request of that size fits
  // there, and one more byte runs out of memory, the lake still sound.
  const std::uintptr_t d = Alloc(lake, kMiB / 4, &how);
  CHECK(how == AllocState::fit || how == AllocState::split);
  CHECK_EQ(d, a + 2 * kMiB + kMiB / 2);
  Fill(d, kMiB / 4, 4);
  CHECK(Holds(r, 4 * kMiB, 7));
  std::uintptr_t p = 0;
  CHECK(lake.allocate(1, 0, &p) == Status::kOutOfMemory);
  CHECK_EQ(lake.check(), std::string());
  CHECK_EQ(FreeAllThenCheck(lake, {a, b, c, r, d}), std::string());
}

// A free head and a free tail of one chunk (a live block between them)
// can end and lead one stitch: the range maps that chunk twice, and the
// request uses the tail's units through the first mapping and the head's
// through the second. The last try before out of memory does; here
// nothing else can serve the request.
TEST(the_last_try_maps_one_chunk_as_both_ends) {
  jaxlake::vmm::HostDriver drv(SmallDevice());
  Lake lake(drv, Capped(8 * kMiB));
  CHECK(lake.free(Alloc(lake, 8 * kMiB), 0) == Status::kOk);
  // Chunk 0: [h 1.25][l 0.25][t 0.5] MiB; the other chunks: rest.
  const std::uintptr_t h = Alloc(lake, kMiB + kMiB / 4);
  const std::uintptr_t l = Alloc(lake, kMiB / 4);
  const std::uintptr_t t = Alloc(lake, kMiB / 2);
  const std::uintptr_t rest = Alloc(lake, 6 * kMiB);
  CHECK_EQ(l, h + kMiB + kMiB / 4);
  CHECK_EQ(t, h + kMiB + kMiB / 2);
  CHECK_EQ(rest, h + 2 * kMiB);
  Fill(l, kMiB / 4, 1);
  Fill(rest, 6 * kMiB, 2);
  CHECK(FreeAll(lake, {h, t}));
  const auto maps = drv.calls()[static_cast<int>(Call::map)];
  AllocState how{};
  const std::uintptr_t r = Alloc(lake, kMiB + kMiB / 2, &how);
  CHECK(how == AllocState::stitch);
  CHECK_EQ(drv.calls()[static_cast<int>(Call::map)], maps + 2);
  CHECK_EQ(Reserved(lake), 8 * kMiB);
  CHECK_EQ(lake.check(), std::string());
  Fill(r, kMiB + kMiB / 2, 7);
  CHECK(Holds(l, kMiB / 4, 1));
  CHECK(Holds(rest, 6 * kMiB, 2));
  // Through the primary range: the tail's units and the head's first MiB
  // hold what was written through the stitched one.
  CHECK(Holds(t, kMiB / 2, 7));
  CHECK(Holds(h, kMiB, 7));
  CHECK(lake.free(r, 0) == Status::kOk);
  CHECK_EQ(lake.check(), std::string());
  // The head's and tail's units are free again.
  const std::uintptr_t e = Alloc(lake, kMiB + kMiB / 4, &how);
  CHECK(how == AllocState::fit);
  CHECK_EQ(e, h);
  CHECK_EQ(FreeAllThenCheck(lake, {e, l, rest}), std::string());
}

// The same last try, with the lock released while it reserves its range:
// meanwhile another thread takes the rest of x's block (the units after
// the head's, in the head's chunk) and frees a, beside the lead. Nothing
// overlaps and every invariant holds.
TEST(the_last_try_shares_its_block_while_mapping) {
  HookDriver drv(SmallDevice());
  Lake lake(drv, Capped(8 * kMiB));
  const XAndWFreed l = FreeXAndW(lake);
  const std::uintptr_t a = l.a, b = l.b, c = l.c;
  std::uintptr_t d = 0;
  drv.hook_at = 0;  // the next reserve: the stitched range's
  drv.on_reserve = [&] {
    CHECK_EQ(lake.check(), std::string());
    AllocState how{};
    CHECK(lake.allocate(kMiB / 4, 0, &d, &how) == Status::kOk);
    CHECK(how == AllocState::fit || how == AllocState::split);
    CHECK_EQ(d, a + 2 * kMiB + kMiB / 2);
    CHECK(lake.free(a, 0) == Status::kOk);
    CHECK_EQ(lake.check(), std::string());
  };
  AllocState how{};
  const std::uintptr_t r = Alloc(lake, 4 * kMiB, &how);
  CHECK(how == AllocState::stitch);
  CHECK(d != 0);
  CHECK(drv.accessible(r, 4 * kMiB));
  CHECK_EQ(Reserved(lake), 8 * kMiB);
  CHECK_EQ(lake.check(), std::string());
  // a's units are free again and fit a new request beside the lead.
  const std::uintptr_t e = Alloc(lake, kMiB / 2, &how);
  CHECK(how == AllocState::fit);
  CHECK_EQ(e, a);
  CHECK_EQ(FreeAllThenCheck(lake, {b, c, d, e, r}), std::string());
}

// ---- the StitchCache class on its own (cc/lake/stitch_cache.h) -----------

// A range of `units` units lent (used > 0) or, once freed, cached.
detail::Stitched& NewRange(detail::StitchCache& cache, std::uint64_t id) {
  detail::Stitched& r = cache.New(id);
  r.nunits = 8;
  r.used = 8;
  return r;
}

// Frees range `id` into the cache (as Lake::free does).
void FreeRange(detail::StitchCache& cache, std::uint64_t id,
               detail::Tag tag) {
  detail::Stitched& r = cache.at(id);
  r.used = 0;
  r.tag = tag;
  cache.Cache(id);
}

TEST(stitch_cache_lists_freed_ranges_most_recent_first) {
  detail::StitchCache cache;
  for (std::uint64_t id : {1, 2, 3}) NewRange(cache, id);
  CHECK_EQ(cache.CheckInvariants(), std::string());
  CHECK_EQ(cache.cached(), 0u);
  FreeRange(cache, 2, detail::Tag{1, 1});
  FreeRange(cache, 1, detail::Tag{2, 1});
  FreeRange(cache, 3, detail::Tag{1, 2});
  const std::vector<std::uint64_t> order(cache.MostRecentFirst().begin(),
                                         cache.MostRecentFirst().end());
  CHECK(order == (std::vector<std::uint64_t>{3, 1, 2}));
  CHECK_EQ(cache.CheckInvariants(), std::string());
  // The oldest for which the predicate holds (eviction: the oldest whose
  // last use is complete).
  auto on_stream = [](Stream s) {
    return [s](const detail::Stitched& r) { return r.tag.stream == s; };
  };
  CHECK_EQ(cache.Oldest(on_stream(1)), 2u);
  CHECK_EQ(cache.Oldest(on_stream(2)), 1u);
  CHECK_EQ(cache.Oldest(on_stream(3)), 0u);
  // Reuse takes a range out of the cache; a dropped range is forgotten.
  cache.Uncache(1);
  cache.at(1).used = 4;
  cache.Uncache(1);  // not cached: nothing
  cache.Erase(2);
  CHECK_EQ(cache.size(), 2u);
  CHECK_EQ(cache.cached(), 1u);
  CHECK(cache.Find(2) == nullptr);
  CHECK_EQ(cache.Oldest(on_stream(1)), 3u);
  CHECK_EQ(cache.CheckInvariants(), std::string());
}

TEST(stitch_cache_check_finds_a_range_both_live_and_cached) {
  detail::StitchCache cache;
  NewRange(cache, 7);
  FreeRange(cache, 7, detail::Tag{});
  CHECK_EQ(cache.CheckInvariants(), std::string());
  cache.at(7).used = 2;  // lent again without leaving the cache
  CHECK_EQ(cache.CheckInvariants(),
           std::string("stitched range 7 is both live and cached or neither"));
  cache.Uncache(7);
  CHECK_EQ(cache.CheckInvariants(), std::string());
  cache.at(7).used = 0;  // freed without entering the cache
  CHECK(!cache.CheckInvariants().empty());
}

}  // namespace
}  // namespace jaxlake::testing

int main(int argc, char** argv) { return jaxlake::check::RunAll(argc, argv); }
