// Tests of the lake's policy over the sim and host drivers.
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "cc/lake/lake.h"
#include "cc/lake/structures.h"  // LiveTable
#include "cc/vmm/faulty_driver.h"
#include "cc/vmm/host_driver.h"
#include "cc/vmm/sim_driver.h"
#include "tests/cc/check.h"
#include "tests/cc/test_util.h"

namespace {

using jaxlake::AllocState;
using jaxlake::Lake;
using jaxlake::LakeOptions;
using jaxlake::vmm::Call;
using jaxlake::testing::Alloc;
using jaxlake::testing::HookDriver;
using jaxlake::vmm::Status;

constexpr std::size_t kMiB = std::size_t{1} << 20;

jaxlake::vmm::SimOptions Small(std::size_t device = 256 * kMiB) {
  jaxlake::vmm::SimOptions o;
  o.granularity = 2 * kMiB;
  o.device_bytes = device;
  return o;
}

LakeOptions Capped(std::size_t capacity) {
  LakeOptions o;
  o.capacity = capacity;
  return o;
}

// The small-request pool of per-stream slabs (off by default).
LakeOptions Slabs() {
  LakeOptions o;
  o.small_limit = kMiB;
  return o;
}

void Fill(std::uintptr_t p, std::size_t n, unsigned char v) {
  std::memset(reinterpret_cast<void*>(p), v, n);
}
bool Holds(std::uintptr_t p, std::size_t n, unsigned char v) {
  const auto* b = reinterpret_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < n; i += 4096)
    if (b[i] != v) return false;
  return b[n - 1] == v;
}

// The headline case: free every other block of a full pool, then ask for
// more than any single free block.
TEST(stitch_serves_scattered_free_memory_with_real_bytes) {
  jaxlake::vmm::HostDriver drv(Small());
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
  jaxlake::vmm::SimDriver drv(Small());
  LakeOptions o = Capped(64 * kMiB);
  o.stitch_cache = 0;  // a freed range is dropped at once
  Lake lake(drv, o);
  std::vector<std::uintptr_t> blocks;
  for (int i = 0; i < 8; ++i) blocks.push_back(Alloc(lake, 8 * kMiB));
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
  jaxlake::vmm::SimDriver drv(Small());
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
  CHECK_EQ(lake.stats().bytes_reserved.current,
           static_cast<std::int64_t>(28 * kMiB));
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
  CHECK_EQ(lake.stats().bytes_reserved.current,
           static_cast<std::int64_t>(28 * kMiB));
  for (auto p : {g, e, h}) CHECK(lake.free(p, 0) == Status::kOk);
  CHECK_EQ(lake.check(), std::string());
}

TEST(stitch_grow_creates_only_the_shortfall) {
  jaxlake::vmm::SimDriver drv(Small());
  Lake lake(drv, Capped(64 * kMiB));
  auto a = Alloc(lake, 8 * kMiB);
  auto b = Alloc(lake, 8 * kMiB);
  CHECK(lake.free(a, 0) == Status::kOk);
  AllocState how{};
  auto c = Alloc(lake, 12 * kMiB, &how);
  CHECK(how == AllocState::stitch_grow);
  CHECK_EQ(lake.stats().bytes_reserved.current,
           static_cast<std::int64_t>(20 * kMiB));
  CHECK(lake.free(b, 0) == Status::kOk);
  CHECK(lake.free(c, 0) == Status::kOk);
  CHECK_EQ(lake.check(), std::string());
}

// A stitch's shortfall is sized as a growth while nothing was freed since
// the last growth (state being built up), and is created exactly once a
// free came between (a transient peak keeps no surplus).
TEST(stitch_shortfall_is_a_growth_only_while_nothing_was_freed) {
  for (const bool freed : {false, true}) {
    jaxlake::vmm::SimDriver drv(Small(1024 * kMiB));
    Lake lake(drv, Capped(1024 * kMiB));
    auto a = Alloc(lake, 256 * kMiB);
    auto b = Alloc(lake, kMiB);  // grows 256 / 16 = 16 MiB; 15 MiB free
    CHECK_EQ(lake.stats().bytes_reserved.current,
             static_cast<std::int64_t>(272 * kMiB));
    if (freed) CHECK(lake.free(Alloc(lake, kMiB), 0) == Status::kOk);
    AllocState how{};
    // 20 MiB: the 7 whole free chunks (14 MiB) and a 6 MiB shortfall,
    // created right after them (an alias).
    auto c = Alloc(lake, 20 * kMiB, &how);
    CHECK(how == AllocState::stitch_grow);
    CHECK_EQ(drv.calls(Call::map), 3u);  // one per segment: no stitch map
    // Sized as a growth: 272 / 16 = 17 MiB, in whole chunks 16 MiB.
    const std::size_t grown = freed ? 6 * kMiB : 16 * kMiB;
    CHECK_EQ(lake.stats().bytes_reserved.current,
             static_cast<std::int64_t>(272 * kMiB + grown));
    for (auto p : {a, b, c}) CHECK(lake.free(p, 0) == Status::kOk);
    CHECK_EQ(lake.check(), std::string());
  }
}

// A free tail that holds the request's last partial chunk leads a stitch
// even when whole free chunks alone would cover it: the stitch then takes
// one whole chunk fewer, and that chunk stays free for the next request.
TEST(free_tail_leads_a_stitch_to_save_a_whole_chunk) {
  jaxlake::vmm::HostDriver drv(Small());
  Lake lake(drv, Capped(64 * kMiB));
  auto a = Alloc(lake, 4 * kMiB);
  auto b = Alloc(lake, 4 * kMiB);
  auto c = Alloc(lake, 4 * kMiB);
  auto d = Alloc(lake, 4 * kMiB);
  auto e = Alloc(lake, 3 * kMiB);  // its last chunk's 1 MiB stays free
  CHECK(lake.free(b, 0) == Status::kOk);
  CHECK(lake.free(d, 0) == Status::kOk);
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
  for (auto p : {a, c, e, r, f}) CHECK(lake.free(p, 0) == Status::kOk);
  CHECK_EQ(lake.check(), std::string());
}

// A best fit that starts its segment stays there, chunk-aligned, even when
// the back-to-back segment before it ends in a free tail: starting in the
// tail would move the request, and each later one carved after it, off
// chunk boundaries, and once freed their chunks would hold free and live
// units side by side, which no stitch takes (docs/benchmarks.md,
// "Hold-out": taking the tail lowered U_fit on the hold-out and the
// synthetic traces). A tail pending on another stream is not taken either.
TEST(fit_at_a_segment_start_stays_on_its_chunks) {
  jaxlake::vmm::HostDriver drv(Small());
  Lake lake(drv, Capped(64 * kMiB));
  auto a = Alloc(lake, 5 * kMiB);  // segment A: 3 chunks, 1 MiB tail free
  auto b = Alloc(lake, 8 * kMiB);  // segment B: 4 chunks, right after A
  CHECK_EQ(b, a + 6 * kMiB);
  CHECK(lake.free(b, 0) == Status::kOk);
  const auto maps = drv.calls(Call::map);
  const auto creates = drv.calls(Call::create);
  AllocState how{};
  auto c = Alloc(lake, 7 * kMiB + kMiB / 2, &how);  // best fit: B
  CHECK(how == AllocState::fit || how == AllocState::split);
  CHECK_EQ(c, b);  // at B's start, not in A's tail
  Fill(a, 5 * kMiB, 1);
  Fill(c, 7 * kMiB + kMiB / 2, 2);
  CHECK(Holds(a, 5 * kMiB, 1));
  CHECK_EQ(drv.calls(Call::map), maps);
  CHECK_EQ(drv.calls(Call::create), creates);
  CHECK(lake.free(c, 0) == Status::kOk);
  // With A's tail freed on a stream whose work is pending, the same.
  jaxlake::vmm::SimDriver sim(Small());
  Lake other(sim, Capped(64 * kMiB));
  auto a2 = Alloc(other, 5 * kMiB);
  auto t = Alloc(other, kMiB);  // fills A's tail
  auto b2 = Alloc(other, 8 * kMiB);
  CHECK(other.free(b2, 0) == Status::kOk);
  sim.hold_stream(7);
  CHECK(other.free(t, 7) == Status::kOk);
  CHECK_EQ(Alloc(other, 7 * kMiB, &how), b2);
  sim.release_stream(7);
  CHECK(other.free(a2, 0) == Status::kOk);
  CHECK(other.free(b2, 0) == Status::kOk);
  for (Lake* l : {&lake, &other}) CHECK_EQ(l->check(), std::string());
  CHECK(lake.free(a, 0) == Status::kOk);
  CHECK_EQ(lake.check(), std::string());
}

// A growth holds at least 1/16 of what the lake holds (kGrowAhead), cut
// to the capacity left, while nothing was freed since the last growth, and
// at least grow_min; the first growth, with nothing held, holds only what
// the request needs.
TEST(growth_holds_a_share_of_what_the_lake_holds) {
  {
    jaxlake::vmm::SimDriver drv(Small(1024 * kMiB));
    Lake lake(drv, Capped(1024 * kMiB));
    auto a = Alloc(lake, 64 * kMiB);
    CHECK_EQ(lake.stats().bytes_reserved.current,
             static_cast<std::int64_t>(64 * kMiB));
    AllocState how{};
    auto b = Alloc(lake, kMiB, &how);  // needs 1 chunk; 64 MiB / 16 = 2
    CHECK(how == AllocState::grow);
    CHECK_EQ(lake.stats().bytes_reserved.current,
             static_cast<std::int64_t>(68 * kMiB));
    CHECK_EQ(drv.calls(Call::create), 2u);
    auto c = Alloc(lake, 3 * kMiB, &how);  // the growth's surplus
    CHECK(how != AllocState::grow && how != AllocState::stitch_grow);
    CHECK_EQ(lake.stats().bytes_reserved.current,
             static_cast<std::int64_t>(68 * kMiB));
    CHECK_EQ(drv.calls(Call::create), 2u);
    // Once something was freed since the last growth, a growth holds only
    // what the request needs: 1 chunk, where the share would be 2.
    CHECK(lake.free(c, 0) == Status::kOk);
    auto e = Alloc(lake, 3 * kMiB, &how);  // c's place again
    CHECK(how == AllocState::fit);
    auto f = Alloc(lake, kMiB, &how);
    CHECK(how == AllocState::grow);
    CHECK_EQ(lake.stats().bytes_reserved.current,
             static_cast<std::int64_t>(70 * kMiB));
    for (auto p : {a, b, e, f}) CHECK(lake.free(p, 0) == Status::kOk);
    CHECK_EQ(lake.check(), std::string());
  }
  {  // the share is cut to the capacity left, never below the need
    jaxlake::vmm::SimDriver drv(Small(1024 * kMiB));
    Lake lake(drv, Capped(66 * kMiB));
    auto a = Alloc(lake, 64 * kMiB);
    auto b = Alloc(lake, kMiB);
    CHECK_EQ(lake.stats().bytes_reserved.current,
             static_cast<std::int64_t>(66 * kMiB));
    for (auto p : {a, b}) CHECK(lake.free(p, 0) == Status::kOk);
    CHECK_EQ(lake.check(), std::string());
  }
  {  // grow_min sets a floor, the first growth included
    jaxlake::vmm::SimDriver drv(Small(1024 * kMiB));
    LakeOptions o = Capped(1024 * kMiB);
    o.grow_min = 16 * kMiB;
    Lake lake(drv, o);
    auto a = Alloc(lake, kMiB);
    CHECK_EQ(lake.stats().bytes_reserved.current,
             static_cast<std::int64_t>(16 * kMiB));
    CHECK(lake.free(a, 0) == Status::kOk);
    CHECK_EQ(lake.check(), std::string());
  }
}

TEST(small_requests_share_slabs) {
  jaxlake::vmm::SimDriver drv(Small());
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

TEST(cross_stream_reuse_waits_for_the_event) {
  jaxlake::vmm::SimDriver drv(Small());
  Lake lake(drv, Capped(64 * kMiB));
  drv.hold_stream(1);
  auto a = Alloc(lake, 8 * kMiB, nullptr, 1);
  CHECK(lake.free(a, 1) == Status::kOk);
  // Stream 2 may not take a block whose last use on stream 1 is in flight.
  auto b = Alloc(lake, 8 * kMiB, nullptr, 2);
  CHECK(b != a);
  // Stream 1 itself may: its own work is ordered.
  auto c = Alloc(lake, 8 * kMiB, nullptr, 1);
  CHECK_EQ(c, a);
  CHECK(lake.free(c, 1) == Status::kOk);
  CHECK(lake.free(b, 2) == Status::kOk);
  drv.release_stream(1);
  // After the event completes, stream 2 reuses it (fit, not grow).
  const auto creates = drv.calls(Call::create);
  AllocState how{};
  Alloc(lake, 16 * kMiB, &how, 2);
  CHECK(how != AllocState::grow);
  CHECK_EQ(drv.calls(Call::create), creates);
  CHECK_EQ(lake.check(), std::string());
}

TEST(pressure_waits_for_pending_events) {
  jaxlake::vmm::SimDriver drv(Small());
  Lake lake(drv, Capped(8 * kMiB));
  drv.hold_stream(1);
  auto a = Alloc(lake, 8 * kMiB, nullptr, 1);
  CHECK(lake.free(a, 1) == Status::kOk);
  std::thread releaser([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    drv.release_stream(1);
  });
  auto b = Alloc(lake, 8 * kMiB, nullptr, 2);  // must wait, then reuse
  releaser.join();
  CHECK_EQ(b, a);
  CHECK(lake.stats().event_waits >= 1u);
  CHECK_EQ(lake.check(), std::string());
}

TEST(small_range_freed_on_another_stream_is_deferred) {
  jaxlake::vmm::SimDriver drv(Small());
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

TEST(out_of_memory_leaves_the_lake_usable) {
  jaxlake::vmm::SimDriver drv(Small());
  Lake lake(drv, Capped(16 * kMiB));
  auto a = Alloc(lake, 12 * kMiB);
  std::uintptr_t p = 0;
  CHECK(lake.allocate(8 * kMiB, 0, &p) == Status::kOutOfMemory);
  CHECK(lake.last_error().find("out of memory") != std::string::npos);
  CHECK(lake.allocate(std::size_t{1} << 40, 0, &p) == Status::kOutOfMemory);
  CHECK_EQ(lake.stats().ooms, 2u);
  CHECK_EQ(lake.check(), std::string());
  CHECK(lake.free(a, 0) == Status::kOk);
  Alloc(lake, 16 * kMiB);
  CHECK_EQ(lake.check(), std::string());
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
  jaxlake::vmm::SimDriver drv(Small());
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
  jaxlake::vmm::SimDriver drv(Small());
  Lake lake(drv, Capped(64 * kMiB));
  std::vector<std::uintptr_t> live;
  FragmentOneSegment(lake, &live);
  AllocState how{};
  Alloc(lake, 32 * kMiB, &how);
  CHECK(how == AllocState::stitch);
  CHECK_EQ(lake.stats().stitch_pieces, 4u);
  CHECK_EQ(lake.check(), std::string());
}

TEST(driver_failures_roll_back) {
  jaxlake::vmm::HostDriver host(Small());
  jaxlake::vmm::FaultyDriver drv(host);
  Lake lake(drv, Capped(64 * kMiB));
  std::vector<std::uintptr_t> blocks;
  for (int i = 0; i < 8; ++i) blocks.push_back(Alloc(lake, 8 * kMiB));
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

// The live table against a std::map model: random inserts and erases of
// addresses that collide (multiples of 2^40 share their low bits), with
// growth, wrap-around at the end of the table and backward-shift erase.
TEST(live_table_matches_a_map_under_random_inserts_and_erases) {
  jaxlake::detail::LiveTable table(16);
  std::map<std::uintptr_t, std::size_t> model;
  std::mt19937_64 rng(7);
  for (int step = 0; step < 20000; ++step) {
    const std::uintptr_t addr =
        (std::uintptr_t{1} + rng() % 300) << (rng() % 2 ? 40 : 12);
    jaxlake::detail::LiveTable::Entry* e = table.find(addr);
    auto m = model.find(addr);
    REQUIRE_EQ(e == nullptr, m == model.end());
    if (e == nullptr) {
      jaxlake::detail::Alloc a;
      a.size = static_cast<std::size_t>(step);
      table.insert(addr, a);
      model[addr] = a.size;
    } else {
      CHECK_EQ(e->second.size, m->second);
      table.erase(e);
      model.erase(m);
    }
    REQUIRE_EQ(table.size(), model.size());
  }
  std::size_t seen = 0;
  for (const auto& [addr, a] : table) {
    REQUIRE(model.count(addr) == 1);
    CHECK_EQ(a.size, model.at(addr));
    ++seen;
  }
  CHECK_EQ(seen, model.size());
  CHECK(table.find(0) == nullptr);
}

// Segments are looked up by id in a table that drops the slots of released
// segments from its front: ids stay unique and in creation order while one
// old segment lives through many created and released after it, and every
// segment stays reachable (check() walks them all).
TEST(segment_ids_stay_unique_while_segments_come_and_go) {
  jaxlake::vmm::SimDriver drv(Small());
  Lake lake(drv, LakeOptions{});
  const auto old = Alloc(lake, 2 * kMiB);  // the first segment, kept
  std::uint64_t last_id = 0;
  for (int round = 0; round < 40; ++round) {
    std::vector<std::uintptr_t> held;
    for (int i = 0; i < 1 + round % 3; ++i) {
      AllocState how{};
      held.push_back(Alloc(lake, 4 * kMiB, &how));
      CHECK(how == AllocState::grow);
    }
    const jaxlake::LakeSnapshot snap = lake.snapshot();
    REQUIRE_EQ(snap.segments.size(), held.size() + 1);
    CHECK_EQ(snap.segments.front().va, old);
    for (std::size_t i = 1; i < snap.segments.size(); ++i) {
      CHECK(snap.segments[i].id > snap.segments[i - 1].id);
      CHECK(snap.segments[i].id > last_id);
    }
    last_id = snap.segments.back().id;
    CHECK_EQ(lake.check(), std::string());
    for (auto p : held) CHECK(lake.free(p, 0) == Status::kOk);
    CHECK_EQ(lake.empty_cache(), held.size() * 4 * kMiB);
    CHECK_EQ(lake.check(), std::string());
    CHECK_EQ(lake.stats().segments.current, 1);
  }
  // The old segment still serves and frees; then it goes too.
  CHECK(lake.free(old, 0) == Status::kOk);
  CHECK_EQ(lake.empty_cache(), 2 * kMiB);
  CHECK(lake.snapshot().segments.empty());
  AllocState how{};
  const auto again = Alloc(lake, 2 * kMiB, &how);
  CHECK(how == AllocState::grow);
  CHECK(lake.snapshot().segments.front().id > last_id);
  CHECK(lake.free(again, 0) == Status::kOk);
  CHECK_EQ(lake.check(), std::string());
}

TEST(empty_cache_and_destruction_release_everything) {
  jaxlake::vmm::SimDriver drv(Small());
  {
    Lake lake(drv, Capped(64 * kMiB));
    std::vector<std::uintptr_t> blocks;
    for (int i = 0; i < 8; ++i) blocks.push_back(Alloc(lake, 8 * kMiB));
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
  CHECK_EQ(drv.physical_bytes(), 0u);
  CHECK_EQ(drv.reserved_bytes(), 0u);
  CHECK_EQ(drv.live_handles(), 0u);
  CHECK_EQ(drv.live_events(), 0u);
}

// vllm#45552: memory whose last use is still queued on a stream is never
// unmapped under that work, when the lake is destroyed either: the lake
// waits for the events of its pending frees first. The sim driver counts
// unmaps made while the stream is held.
class UnmapWatch : public jaxlake::vmm::SimDriver {
 public:
  using SimDriver::SimDriver;
  int unmaps = 0;
  int unmaps_while_held = 0;

 protected:
  Status do_unmap(std::uintptr_t va, std::size_t size) override {
    ++unmaps;
    if (stream_held(1)) ++unmaps_while_held;
    return SimDriver::do_unmap(va, size);
  }
};

TEST(destruction_waits_for_work_in_flight) {
  UnmapWatch drv(Small());
  {
    Lake lake(drv, Capped(64 * kMiB));
    drv.hold_stream(1, /*until_waited=*/true);
    auto a = Alloc(lake, 8 * kMiB, nullptr, 1);
    CHECK(lake.free(a, 1) == Status::kOk);
    CHECK_EQ(lake.empty_cache(), 0u);  // the free's last use is queued
    CHECK_EQ(drv.unmaps, 0);
  }
  CHECK(drv.unmaps >= 1);
  CHECK_EQ(drv.unmaps_while_held, 0);
  CHECK_EQ(drv.physical_bytes(), 0u);
  CHECK_EQ(drv.live_events(), 0u);
}

TEST(bad_frees_are_refused) {
  jaxlake::vmm::SimDriver drv(Small());
  Lake lake(drv, LakeOptions{});
  auto a = Alloc(lake, 3 * kMiB);
  CHECK(lake.free(a + 256, 0) == Status::kInvalidValue);
  CHECK(lake.free(a, 0) == Status::kOk);
  CHECK(lake.free(a, 0) == Status::kInvalidValue);
  std::uintptr_t p = 0;
  CHECK(lake.allocate(0, 0, &p) == Status::kInvalidValue);
  CHECK_EQ(lake.check(), std::string());
  LakeOptions bad;
  bad.capacity = 1000;
  CHECK(!jaxlake::ValidateOptions(bad, drv).empty());
  bad = LakeOptions{};
  bad.alignment = 100;
  CHECK(!jaxlake::ValidateOptions(bad, drv).empty());
}

// Without a small pool, requests of any size share the blocks, split at the
// alignment: a thousand small requests fill one chunk, side by side.
TEST(small_requests_pack_into_shared_blocks) {
  jaxlake::vmm::SimDriver drv(Small());
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

// Mid-size requests hold at most the alignment more than they asked for;
// a run of 2.25 MiB requests holds the whole chunks their sum needs, not
// two chunks each: each new one is led by the free tail of the last chunk.
TEST(mid_size_requests_waste_at_most_the_alignment) {
  jaxlake::vmm::SimDriver drv(Small());
  Lake lake(drv, LakeOptions{});
  const std::size_t n = 2 * kMiB + kMiB / 4;
  std::vector<std::uintptr_t> ps;
  std::vector<AllocState> how;
  for (int i = 0; i < 8; ++i) {
    AllocState h{};
    ps.push_back(Alloc(lake, n, &h));
    how.push_back(h);
  }
  CHECK(how[0] == AllocState::grow);
  CHECK(how[1] == AllocState::stitch_grow);  // led by the 1.75 MiB tail
  auto st = lake.stats();
  CHECK_EQ(st.bytes_in_use_rounded.current, static_cast<std::int64_t>(8 * n));
  CHECK_EQ(st.bytes_reserved.current, static_cast<std::int64_t>(18 * kMiB));
  // Distinct addresses, no overlap, all usable through the sim's access.
  for (std::size_t i = 0; i < ps.size(); ++i) {
    CHECK(drv.accessible(ps[i], n));
    for (std::size_t j = 0; j < i; ++j)
      CHECK(ps[i] + n <= ps[j] || ps[j] + n <= ps[i]);
  }
  for (int i = 0; i < 8; i += 2) CHECK(lake.free(ps[i], 0) == Status::kOk);
  CHECK_EQ(lake.check(), std::string());
  // Freed mid-size blocks are reused at the alignment, with no new memory.
  const auto creates = drv.calls(Call::create);
  for (int i = 0; i < 8; i += 2) ps[i] = Alloc(lake, n);
  CHECK_EQ(drv.calls(Call::create), creates);
  for (auto p : ps) CHECK(lake.free(p, 0) == Status::kOk);
  CHECK_EQ(lake.check(), std::string());
}

// Stitching maps only wholly free chunks: a chunk that still holds a live
// unit is never lent, and the free part of a partly used chunk stays free.
TEST(stitching_takes_only_wholly_free_chunks) {
  jaxlake::vmm::HostDriver drv(Small(64 * kMiB));
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
  CHECK(lake.free(b, 0) == Status::kOk);
  CHECK(lake.free(d, 0) == Status::kOk);
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
  for (auto p : {a, c, e, f}) CHECK(lake.free(p, 0) == Status::kOk);
  CHECK_EQ(lake.check(), std::string());
}

// preallocate: the first growth takes the whole capacity as one segment;
// later requests are served from it with no create, and it is taken once
// (after empty_cache the lake grows on demand).
TEST(preallocate_takes_the_capacity_at_the_first_growth) {
  jaxlake::vmm::SimDriver drv(Small(1024 * kMiB));
  LakeOptions o = Capped(64 * kMiB);
  o.preallocate = true;
  Lake lake(drv, o);
  AllocState how{};
  auto a = Alloc(lake, kMiB, &how);
  CHECK(how == AllocState::grow);
  CHECK_EQ(lake.stats().bytes_reserved.current,
           static_cast<std::int64_t>(64 * kMiB));
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
  CHECK_EQ(lake.stats().bytes_reserved.current,
           static_cast<std::int64_t>(4 * kMiB));
  CHECK(lake.free(b, 0) == Status::kOk);
  CHECK_EQ(lake.check(), std::string());
}

// A segment larger than the request needs that the driver refuses for
// lack of memory (a device that another lake uses too) falls back to the
// request's own chunks: a preallocation, and a growth share.
TEST(refused_larger_segments_fall_back_to_the_request) {
  jaxlake::vmm::SimDriver drv(Small(128 * kMiB));
  Lake other(drv, LakeOptions{});
  auto x = Alloc(other, 62 * kMiB);  // the device has 66 MiB left
  {
    LakeOptions o;
    o.preallocate = true;
    Lake lake(drv, o);
    AllocState how{};
    auto a = Alloc(lake, 3 * kMiB, &how);
    CHECK(how == AllocState::grow);
    CHECK_EQ(lake.stats().bytes_reserved.current,
             static_cast<std::int64_t>(4 * kMiB));
    CHECK(lake.free(a, 0) == Status::kOk);
    CHECK_EQ(lake.check(), std::string());
  }
  Lake lake(drv, LakeOptions{});
  auto a = Alloc(lake, 64 * kMiB);  // 2 MiB left on the device
  AllocState how{};
  auto b = Alloc(lake, kMiB, &how);  // its share would be 4 MiB
  CHECK(how == AllocState::grow);
  CHECK_EQ(lake.stats().bytes_reserved.current,
           static_cast<std::int64_t>(66 * kMiB));
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
  HookDriver drv(Small(1024 * kMiB));
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
  CHECK_EQ(lake.stats().bytes_reserved.current,
           static_cast<std::int64_t>(32 * kMiB));
  for (auto q : {a, b}) CHECK(lake.free(q, 0) == Status::kOk);
  CHECK_EQ(lake.check(), std::string());
}

// While a tail-led stitch maps its pieces (lock released), other threads
// allocate from the free units of the chunks it maps and free the block
// beside its lead: nothing overlaps and every invariant holds.
TEST(tail_led_stitch_shares_its_chunks_while_mapping) {
  HookDriver drv(Small());
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
  CHECK_EQ(lake.stats().bytes_reserved.current,
           static_cast<std::int64_t>(8 * kMiB));
  CHECK_EQ(lake.check(), std::string());
  // a's units are free again and fit a new request beside b's lead.
  auto d = Alloc(lake, 2 * kMiB, &how);
  CHECK(how == AllocState::fit || how == AllocState::split);
  for (auto p : {b, c, d, x}) CHECK(lake.free(p, 0) == Status::kOk);
  CHECK_EQ(lake.check(), std::string());
}

// Growth places segments back to back in one reservation: one reserve for
// several growths, each segment starting where the previous one ends.
TEST(growth_segments_are_back_to_back_in_one_reservation) {
  jaxlake::vmm::SimDriver drv(Small());
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
    CHECK(lake.free(a, 0) == Status::kOk);
    CHECK(lake.free(c, 0) == Status::kOk);
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

// A stitch whose shortfall segment lands right after the free tail it
// takes is an alias of those primary addresses: no reserve or map of its
// own, and the bytes written through it are the segments' bytes.
TEST(back_to_back_stitch_maps_nothing) {
  jaxlake::vmm::HostDriver drv(Small());
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
  CHECK(lake.free(b2, 0) == Status::kOk);
  CHECK(lake.free(a, 0) == Status::kOk);
  CHECK_EQ(lake.empty_cache(), 8 * kMiB);
  CHECK_EQ(drv.calls()[static_cast<int>(Call::unmap)],
           calls0[static_cast<int>(Call::unmap)] + 3);  // the 3 segments
  CHECK_EQ(drv.reserved_bytes(), 0u);
  CHECK_EQ(lake.check(), std::string());
}

// A request that no free block fits is served from a free run that
// crosses back-to-back segments (the free tail of one, a wholly free one,
// the free head of the next): an alias, no driver call. While it is live
// none of the segments it covers is released, even once everything else
// in them is freed; after its free they all go.
TEST(free_run_across_segments_serves_without_a_driver_call) {
  jaxlake::vmm::HostDriver drv(Small());
  Lake lake(drv, LakeOptions{});
  auto x = Alloc(lake, 3 * kMiB / 2);  // segment 1: 1 chunk, 0.5 MiB free
  auto m = Alloc(lake, 2 * kMiB);      // segment 2: 1 chunk
  auto y = Alloc(lake, kMiB);          // segment 3: 1 chunk, 1 MiB free
  auto z = Alloc(lake, kMiB);          // the rest of segment 3
  CHECK_EQ(m, x + 2 * kMiB);
  CHECK_EQ(y, m + 2 * kMiB);
  CHECK_EQ(z, y + kMiB);
  CHECK(lake.free(m, 0) == Status::kOk);
  CHECK(lake.free(y, 0) == Status::kOk);
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
  Fill(z, kMiB, 0x22);
  CHECK(Holds(s, 3 * kMiB, 0x3C));
  CHECK_EQ(lake.check(), std::string());
  CHECK(lake.free(x, 0) == Status::kOk);
  CHECK(lake.free(z, 0) == Status::kOk);
  CHECK_EQ(lake.empty_cache(), 0u);  // s covers all three segments
  CHECK(Holds(s, 3 * kMiB, 0x3C));
  CHECK_EQ(lake.check(), std::string());
  CHECK(lake.free(s, 0) == Status::kOk);
  CHECK_EQ(lake.stats().stitched_bytes.current, 0);
  CHECK_EQ(lake.empty_cache(), 6 * kMiB);
  CHECK_EQ(drv.reserved_bytes(), 0u);
  CHECK_EQ(lake.check(), std::string());
}

// A run across segments is taken only when every part of it is usable by
// the requesting stream: a head freed on another stream, not yet known
// complete, is not.
TEST(free_run_across_segments_respects_stream_order) {
  jaxlake::vmm::SimDriver sim(Small());
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
  for (auto p : {x, z, s}) CHECK(lake.free(p, 0) == Status::kOk);
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
  jaxlake::vmm::HostDriver host(Small());
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
  CHECK_EQ(lake.stats().bytes_reserved.current,
           static_cast<std::int64_t>(6 * kMiB));
  CHECK_EQ(lake.check(), std::string());
  CHECK(lake.free(b, 0) == Status::kOk);
  CHECK(lake.free(c, 0) == Status::kOk);
  CHECK_EQ(lake.empty_cache(), 6 * kMiB);
  CHECK_EQ(host.reserved_bytes(), 0u);
  CHECK_EQ(lake.check(), std::string());
}

// A growth while another growth has the lock released (inside its map):
// each claimed its own stretch of the range before unlocking, so they lie
// back to back in claim order and nothing overlaps.
TEST(growths_with_the_lock_released_get_adjacent_stretches) {
  HookDriver drv(Small());
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
  for (auto p : {a, b, c}) CHECK(lake.free(p, 0) == Status::kOk);
  lake.empty_cache();
  CHECK_EQ(drv.reserved_bytes(), 0u);
}

// Two growths that both find no growth range reserve one each (lock
// released); both ranges are kept, the later growths use one of them, and
// each is freed with its last segment.
TEST(growth_ranges_reserved_with_the_lock_released) {
  HookDriver drv(Small());
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
  for (auto p : {a, c, d}) CHECK(lake.free(p, 0) == Status::kOk);
  CHECK_EQ(lake.empty_cache(), 6 * kMiB);
  CHECK_EQ(drv.reserved_bytes(), 0u);
  CHECK_EQ(lake.check(), std::string());
}

// A failed create gives its stretch back; the emptied range is freed by
// the next empty_cache().
TEST(failed_growth_gives_its_stretch_back) {
  jaxlake::vmm::SimDriver sim(Small());
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
  CHECK(lake.free(b, 0) == Status::kOk);
  CHECK(lake.free(c, 0) == Status::kOk);
  CHECK_EQ(lake.empty_cache(), 6 * kMiB);
  CHECK_EQ(sim.reserved_bytes(), 0u);
  CHECK_EQ(lake.check(), std::string());
}

// Two releases of segments of one growth range, the second made while the
// first is unmapping (lock released): the range's reservation is freed
// only after both unmaps, by whichever finishes last.
TEST(range_freed_after_its_last_segment_is_unmapped) {
  HookDriver drv(Small());
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

// Random operations over real memory, verifying every live block's bytes.
TEST(random_operations_keep_data_and_invariants) {
  jaxlake::vmm::HostDriver drv(Small(512 * kMiB));
  LakeOptions o = Capped(96 * kMiB);
  o.stitch_cache = 4;
  Lake lake(drv, o);
  std::mt19937_64 rng(1234);
  std::map<std::uintptr_t, std::pair<std::size_t, unsigned char>> live;
  int ooms = 0;
  for (int step = 0; step < 3000; ++step) {
    const bool alloc = live.empty() || rng() % 100 < 55;
    if (alloc) {
      std::size_t n = rng() % 4 == 0 ? 1 + rng() % (64 * 1024)
                                      : 1 + rng() % (20 * kMiB);
      std::uintptr_t p = 0;
      Status s = lake.allocate(n, rng() % 3, &p);
      if (s == Status::kOutOfMemory) {
        ++ooms;
        continue;
      }
      REQUIRE(s == Status::kOk);
      const auto v = static_cast<unsigned char>(step);
      Fill(p, n, v);
      live[p] = {n, v};
    } else {
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      REQUIRE(Holds(it->first, it->second.first, it->second.second));
      REQUIRE(lake.free(it->first, rng() % 3) == Status::kOk);
      live.erase(it);
    }
    if (step % 50 == 0) {
      REQUIRE_EQ(lake.check(), std::string());
      for (auto& [p, nv] : live) REQUIRE(Holds(p, nv.first, nv.second));
    }
  }
  CHECK_EQ(lake.check(), std::string());
  CHECK(lake.stats().alloc_stitch + lake.stats().alloc_stitch_reuse > 0u);
  (void)ooms;
}

// Threads share their allocations (frees cross threads and streams) while a
// controller thread holds and releases streams; no two live allocations may
// overlap and the lake must end empty.
TEST(concurrent_threads_keep_invariants) {
  jaxlake::vmm::SimDriver drv(Small(std::size_t{8} << 30));
  LakeOptions o = Capped(std::size_t{1} << 30);
  Lake lake(drv, o);
  std::atomic<int> errors{0};
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::map<std::uintptr_t, std::size_t> live;  // shared by all threads
  std::thread controller([&] {
    std::mt19937_64 rng(99);
    while (!stop.load()) {
      const std::uint64_t s = rng() % 4;
      drv.hold_stream(s);
      std::this_thread::sleep_for(std::chrono::microseconds(rng() % 500));
      drv.release_stream(s);
    }
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(t);
      for (int i = 0; i < 4000; ++i) {
        const std::uint64_t stream = rng() % 4;
        std::unique_lock<std::mutex> lk(mu);
        if (live.empty() || rng() % 2) {
          lk.unlock();
          std::uintptr_t p = 0;
          std::size_t n = rng() % 3 ? 1 + rng() % 100000 : rng() % (40 * kMiB) + 1;
          Status s = lake.allocate(n, stream, &p);
          if (s == Status::kOk) {
            lk.lock();
            auto next = live.lower_bound(p);
            if (next != live.end() && next->first < p + n) ++errors;
            if (next != live.begin() &&
                std::prev(next)->first + std::prev(next)->second > p)
              ++errors;
            live.emplace(p, n);
          } else if (s != Status::kOutOfMemory) {
            ++errors;
          }
        } else {
          auto it = live.begin();
          std::advance(it, rng() % live.size());
          const std::uintptr_t p = it->first;
          live.erase(it);
          lk.unlock();
          if (lake.free(p, stream) != Status::kOk) ++errors;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  stop = true;
  controller.join();
  for (auto& [p, n] : live)
    if (lake.free(p, 0) != Status::kOk) ++errors;
  CHECK_EQ(errors.load(), 0);
  CHECK_EQ(lake.check(), std::string());
  CHECK_EQ(lake.stats().bytes_in_use.current, 0);
  for (std::uint64_t s = 0; s < 4; ++s) drv.release_stream(s);
  lake.empty_cache();
  CHECK_EQ(lake.stats().bytes_reserved.current, 0);
  CHECK_EQ(drv.physical_bytes(), 0u);
}

// Frees on one stream record no events, yet the stitch cache must stay
// bounded: trimming advances the stream's event.
TEST(stitch_cache_stays_bounded_on_one_stream) {
  jaxlake::vmm::SimDriver drv(Small(std::size_t{1} << 30));
  LakeOptions o = Capped(std::size_t{1} << 30);
  o.stitch_cache = 4;
  Lake lake(drv, o);
  std::vector<std::uintptr_t> keep;
  for (int round = 0; round < 20; ++round) {
    // Fragment: alternate live and free 2 MiB blocks, then stitch.
    std::vector<std::uintptr_t> blocks;
    for (int i = 0; i < 6; ++i) blocks.push_back(Alloc(lake, 2 * kMiB));
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


// ---- regression tests: threads, streams and faults ------------------------
//
// The lake releases its lock around driver calls. These tests make the
// interleaving deterministic: a FaultyDriver hook runs, on the calling
// thread, exactly while the lake waits inside a driver call, and changes the
// lake's state meanwhile (as another thread would).

using jaxlake::vmm::FaultyDriver;
using jaxlake::vmm::SimDriver;

// Capacity two chunks; stream 1 held; X and Y (one chunk each) allocated on
// stream 1 and X freed there. A request on stream 2 must wait for stream 1.
struct TwoChunks {
  SimDriver sim{Small()};
  FaultyDriver drv{sim};
  Lake lake{drv, Capped(4 * kMiB)};
  std::uintptr_t x = 0, y = 0;
  TwoChunks() {
    sim.hold_stream(1);
    x = Alloc(lake, 2 * kMiB, nullptr, 1);
    y = Alloc(lake, 2 * kMiB, nullptr, 1);
    CHECK(lake.free(x, 1) == Status::kOk);
  }
};

// Defect: while the waiter had the lock released, another call re-recorded
// stream 1's event for a newer free (Y); the waiter then marked that newer
// free complete and handed Y, still in use on stream 1, to stream 2.
TEST(event_wait_completes_only_what_it_waited_for) {
  TwoChunks t;
  Lake& lake = t.lake;
  // The stream's work completes while the request waits...
  t.drv.hook(Call::event_synchronize, [&] { t.sim.release_stream(1); },
             /*after=*/false);
  // ...and before it retakes the lock, stream 1 gets new work: Y is freed
  // there and another call advances the streams (records the event again).
  t.drv.hook(Call::event_synchronize, [&] {
    t.sim.hold_stream(1);
    CHECK(lake.free(t.y, 1) == Status::kOk);
    lake.empty_cache();
  });
  std::uintptr_t p = 0;
  CHECK(lake.allocate(2 * kMiB, 2, &p) == Status::kOk);
  CHECK(p != t.y);  // Y is still in use on stream 1
  CHECK_EQ(lake.check(), std::string());
  // Nothing else may go to another stream before stream 1's work is done:
  // a third request waits, and gets Y only after the wait.
  bool waited = false;
  t.drv.hook(Call::event_synchronize, [&] {
    waited = true;
    t.sim.release_stream(1);
  }, false);
  std::uintptr_t q = 0;
  const Status s = lake.allocate(2 * kMiB, 3, &q);
  CHECK(s == Status::kOk || s == Status::kOutOfMemory);
  CHECK(waited);
  CHECK(lake.free(p, 2) == Status::kOk);
  if (s == Status::kOk) CHECK(lake.free(q, 3) == Status::kOk);
  CHECK_EQ(lake.check(), std::string());
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

// Defect: small ranges freed on another stream were flushed back to their
// slab only when the caller itself saw an event complete.
TEST(small_frees_from_other_streams_come_back) {
  SimDriver sim(Small());
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
  SimDriver sim(Small());
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

// Defect: empty_cache() merged free neighbours only when its own event query
// made progress, so a segment whose free blocks carry different streams'
// tags stayed reserved after the streams had been advanced elsewhere.
TEST(empty_cache_releases_segments_freed_on_several_streams) {
  SimDriver sim(Small());
  LakeOptions o = Capped(64 * kMiB);
  o.stitch_cache = 0;  // a stitched free trims the cache at once
  Lake lake(sim, o);
  // A live stitched range on stream 3.
  std::vector<std::uintptr_t> e;
  for (int i = 0; i < 4; ++i) e.push_back(Alloc(lake, 2 * kMiB, nullptr, 3));
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
    SimDriver sim(Small());
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
    CHECK_EQ(sim.physical_bytes(), 0u);
    CHECK_EQ(sim.mapped_bytes(), 0u);
    CHECK_EQ(sim.reserved_bytes(), 0u);
    CHECK_EQ(sim.live_handles(), 0u);
    CHECK_EQ(sim.live_events(), 0u);
  }
}

// Failed unmaps of a stitched range (dropped from the cache) are kept too.
TEST(failed_stitch_unmaps_are_kept_and_retried) {
  SimDriver sim(Small());
  FaultyDriver drv(sim);
  {
    Lake lake(drv, Capped(16 * kMiB));
    std::vector<std::uintptr_t> b;
    for (int i = 0; i < 4; ++i) b.push_back(Alloc(lake, 4 * kMiB));
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

// The other paths that release the lock: a grow's create, a stitch's map, a
// cached range's unmap and a segment's release. Each hook changes the lake
// (allocate, free, empty_cache, hold a stream) while the lake waits in the
// driver; the lake must come out consistent, with no memory handed twice.
TEST(grow_with_the_lock_released) {
  SimDriver sim(Small());
  FaultyDriver drv(sim);
  int fired = 0;  // hooks that ran
  Lake lake(drv, Capped(16 * kMiB));
  std::uintptr_t a = Alloc(lake, 4 * kMiB, nullptr, 1);
  std::uintptr_t other = 0;
  drv.hook(Call::create, [&] {
    ++fired;
    // Meanwhile: a free, an empty_cache (which releases that segment) and
    // another grow that takes capacity too.
    CHECK(lake.free(a, 1) == Status::kOk);
    CHECK_EQ(lake.empty_cache(), 4 * kMiB);
    other = Alloc(lake, 6 * kMiB, nullptr, 2);
    CHECK_EQ(lake.check(), std::string());
  });
  AllocState how{};
  std::uintptr_t p = Alloc(lake, 8 * kMiB, &how, 1);
  CHECK(how == AllocState::grow);
  CHECK(other != 0 && (other + 6 * kMiB <= p || p + 8 * kMiB <= other));
  CHECK_EQ(lake.check(), std::string());
  // The capacity left (2 MiB) is honoured.
  std::uintptr_t q = 0;
  CHECK(lake.allocate(4 * kMiB, 3, &q) == Status::kOutOfMemory);
  CHECK(lake.free(p, 1) == Status::kOk);
  CHECK(lake.free(other, 2) == Status::kOk);
  CHECK_EQ(lake.check(), std::string());
  CHECK_EQ(fired, 1);
}

TEST(stitch_with_the_lock_released) {
  SimDriver sim(Small());
  FaultyDriver drv(sim);
  int fired = 0;  // hooks that ran
  Lake lake(drv, Capped(32 * kMiB));
  std::vector<std::uintptr_t> b;
  for (int i = 0; i < 6; ++i) b.push_back(Alloc(lake, 4 * kMiB, nullptr, 1));
  for (int i = 0; i < 6; i += 2) CHECK(lake.free(b[i], 1) == Status::kOk);
  std::uintptr_t during = 0;
  drv.hook(Call::map, [&] {
    ++fired;
    // The pieces are claimed: empty_cache must not release them, nor may a
    // request on the same stream get them.
    CHECK_EQ(lake.empty_cache(), 0u);
    std::uintptr_t x = 0;
    const Status s = lake.allocate(4 * kMiB, 1, &x);
    CHECK(s == Status::kOk || s == Status::kOutOfMemory);
    during = s == Status::kOk ? x : 0;
    CHECK(lake.free(b[1], 1) == Status::kOk);  // a neighbour goes free
    sim.hold_stream(1);
    CHECK_EQ(lake.check(), std::string());
  });
  AllocState how{};
  std::uintptr_t big = Alloc(lake, 12 * kMiB, &how, 1);
  CHECK(how == AllocState::stitch);
  CHECK(during == 0 || during + 4 * kMiB <= big || big + 12 * kMiB <= during);
  CHECK_EQ(lake.check(), std::string());
  CHECK(lake.free(big, 1) == Status::kOk);
  if (during) CHECK(lake.free(during, 1) == Status::kOk);
  sim.release_stream(1);
  for (int i = 3; i < 6; i += 2) CHECK(lake.free(b[i], 1) == Status::kOk);
  lake.empty_cache();
  CHECK_EQ(lake.stats().bytes_reserved.current, 0);
  CHECK_EQ(lake.check(), std::string());
  CHECK_EQ(fired, 1);
}

TEST(cache_drop_and_release_with_the_lock_released) {
  SimDriver sim(Small());
  FaultyDriver drv(sim);
  int fired = 0;  // hooks that ran
  Lake lake(drv, Capped(32 * kMiB));
  std::vector<std::uintptr_t> b;
  for (int i = 0; i < 4; ++i) b.push_back(Alloc(lake, 4 * kMiB, nullptr, 1));
  CHECK(lake.free(b[0], 1) == Status::kOk);
  CHECK(lake.free(b[2], 1) == Status::kOk);
  std::uintptr_t big = Alloc(lake, 8 * kMiB, nullptr, 1);
  CHECK(lake.free(big, 1) == Status::kOk);  // cached
  std::uintptr_t during = 0;
  // While empty_cache unmaps the cached range, a request of its size must
  // not reuse it; a stream is held and a live block freed meanwhile.
  drv.hook(Call::unmap, [&] {
    ++fired;
    AllocState how{};
    during = Alloc(lake, 8 * kMiB, &how, 2);
    CHECK(how != AllocState::stitch_reuse);
    sim.hold_stream(2);
    CHECK(lake.free(b[1], 1) == Status::kOk);
    CHECK_EQ(lake.check(), std::string());
  }, false);
  lake.empty_cache();
  CHECK_EQ(lake.check(), std::string());
  // While a free segment is released, a grow takes the capacity it gives.
  CHECK(lake.free(during, 2) == Status::kOk);
  std::uintptr_t late = 0;
  drv.hook(Call::release, [&] {
    ++fired;
    late = Alloc(lake, 16 * kMiB, nullptr, 3);
    CHECK_EQ(lake.check(), std::string());
  });
  CHECK(lake.free(b[3], 1) == Status::kOk);
  lake.empty_cache();
  sim.release_stream(2);
  CHECK(late != 0);
  CHECK(lake.free(late, 3) == Status::kOk);
  lake.empty_cache();
  CHECK_EQ(lake.stats().bytes_reserved.current, 0);
  CHECK_EQ(lake.check(), std::string());
  CHECK_EQ(sim.physical_bytes(), 0u);
  CHECK_EQ(fired, 2);
}

// Found by the stress harness (8 threads, faults): while a free segment was
// being released (lock released), its bytes were already off the books, so
// another thread grew into that capacity; when the release then failed, the
// lake held more than its capacity.
TEST(capacity_counts_memory_being_released) {
  SimDriver sim(Small());
  FaultyDriver drv(sim);
  Lake lake(drv, Capped(4 * kMiB));
  std::uintptr_t a = Alloc(lake, 4 * kMiB);
  CHECK(lake.free(a, 0) == Status::kOk);
  Status during = Status::kOk;
  int fired = 0;
  drv.hook(Call::unmap, [&] {
    ++fired;
    std::uintptr_t p = 0;
    during = lake.allocate(4 * kMiB, 1, &p);
    if (during == Status::kOk) CHECK(lake.free(p, 1) == Status::kOk);
  }, /*after=*/false);
  drv.fail(Call::unmap);
  Status s = Status::kOk;
  lake.empty_cache(&s);
  CHECK_EQ(fired, 1);
  CHECK(s == Status::kDriverError);
  CHECK(during == Status::kOutOfMemory);  // the driver still held it
  CHECK_EQ(lake.check(), std::string());
  lake.empty_cache(&s);
  CHECK(s == Status::kOk);
  CHECK_EQ(sim.physical_bytes(), 0u);
  std::uintptr_t p = Alloc(lake, 4 * kMiB, nullptr, 1);  // free again now
  CHECK(lake.free(p, 1) == Status::kOk);
}

// Defect: chunk counts were 32 bits; 2**32 + 1 chunks became one.
TEST(chunk_counts_are_64_bit) {
  jaxlake::vmm::SimOptions so;
  so.granularity = 4096;
  so.device_bytes = std::size_t{64} << 40;  // 64 TiB
  SimDriver sim(so);
  LakeOptions lo;
  lo.small_limit = 4096;
  Lake lake(sim, lo);
  const std::size_t n = (std::size_t{1} << 44) + 4096;
  std::uintptr_t p = 0;
  AllocState how{};
  CHECK(lake.allocate(n, 0, &p, &how) == Status::kOk);
  CHECK_EQ(lake.stats().bytes_reserved.current, static_cast<std::int64_t>(n));
  CHECK_EQ(lake.check(), std::string());
  std::uintptr_t q = 0;
  CHECK(lake.allocate(n, 0, &q) == Status::kOk);
  CHECK(q >= p + n || q + n <= p);
  CHECK_EQ(lake.check(), std::string());
  CHECK(lake.free(p, 0) == Status::kOk);
  CHECK(lake.free(q, 0) == Status::kOk);
  CHECK_EQ(lake.check(), std::string());
  // A slab larger than the capacity is refused up front, by name.
  LakeOptions o = lo;
  o.small_slab = std::size_t{1} << 53;
  CHECK(jaxlake::ValidateOptions(o, sim).find("small_slab") !=
        std::string::npos);
}

// The snapshot's breakdown of held bytes (HeldBreakdown) sorts free units
// by where they lie in their chunk, and its parts add up to what is held.
TEST(snapshot_breaks_held_bytes_down_by_where_free_units_lie) {
  jaxlake::vmm::SimDriver sim(Small());
  Lake lake(sim, Capped(64 * kMiB));
  constexpr std::size_t kKiB = 1024;
  auto a = Alloc(lake, 5 * kMiB + 1000);  // 3 chunks; 24 bytes rounding
  jaxlake::HeldBreakdown h = lake.snapshot().held;
  CHECK_EQ(h.held, 6 * kMiB);
  CHECK_EQ(h.live, 5 * kMiB + 1000);
  CHECK_EQ(h.rounding, 24u);
  CHECK_EQ(h.free_tails, kMiB - 1024);
  CHECK_EQ(h.free_chunks + h.free_heads + h.free_inner, 0u);
  auto c = Alloc(lake, 512 * kKiB);  // into a's tail, from its start
  CHECK(lake.free(a, 0) == Status::kOk);
  auto d = Alloc(lake, 64 * kKiB);   // into the tail after c
  auto e = Alloc(lake, 64 * kKiB);   // after d
  CHECK(lake.free(d, 0) == Status::kOk);
  // Chunk 2 now holds: a free head (a's last 1 MiB + 1024), c, a free
  // hole (d's), e, a free tail; chunks 0 and 1 are wholly free.
  h = lake.snapshot().held;
  CHECK_EQ(h.held, 6 * kMiB);
  CHECK_EQ(h.live, 576 * kKiB);
  CHECK_EQ(h.rounding, 0u);
  CHECK_EQ(h.free_chunks, 4 * kMiB);
  CHECK_EQ(h.free_heads, kMiB + 1024);
  CHECK_EQ(h.largest_head, kMiB + 1024);
  CHECK_EQ(h.free_inner, 64 * kKiB);
  CHECK_EQ(h.free_tails, 384 * kKiB - 1024);
  CHECK_EQ(h.largest_tail, 384 * kKiB - 1024);
  CHECK_EQ(h.live + h.rounding + h.free_chunks + h.free_heads + h.free_tails +
               h.free_inner + h.slab_free,
           h.held);
  for (auto p : {c, e}) CHECK(lake.free(p, 0) == Status::kOk);
  h = lake.snapshot().held;
  CHECK_EQ(h.free_chunks, h.held);
  CHECK_EQ(lake.check(), std::string());
}

// A free head (free units that start a chunk whose other units are live)
// may end a stitch, as a free tail may lead one: the range maps the head's
// chunk last and uses only its first units. Here the whole free chunks
// hold 4 of the 5 MiB asked for and the lake may not grow: without the
// head the request runs out of memory.
TEST(free_head_ends_a_stitch_to_save_a_whole_chunk) {
  jaxlake::vmm::HostDriver drv(Small());
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
  for (auto p : {c, d, e}) CHECK(lake.free(p, 0) == Status::kOk);
  CHECK_EQ(lake.check(), std::string());
}

}  // namespace

int main(int argc, char** argv) { return jaxlake::check::RunAll(argc, argv); }
