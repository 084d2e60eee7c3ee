// Tests of the lake's policy over the sim and host drivers.
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "cc/lake/lake.h"
#include "cc/vmm/faulty_driver.h"
#include "cc/vmm/host_driver.h"
#include "cc/vmm/sim_driver.h"
#include "tests/cc/check.h"

namespace {

using jaxlake::AllocState;
using jaxlake::Lake;
using jaxlake::LakeOptions;
using jaxlake::vmm::Call;
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

std::uintptr_t Alloc(Lake& lake, std::size_t n, AllocState* how = nullptr,
                     std::uint64_t stream = 0) {
  std::uintptr_t p = 0;
  AllocState state{};
  Status s = lake.allocate(n, stream, &p, &state);
  CHECK_EQ(static_cast<int>(s), static_cast<int>(Status::kOk));
  if (how) *how = state;
  return p;
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
  auto f = Alloc(lake, 26 * kMiB, &how);
  CHECK(how == AllocState::stitch);
  const auto maps = drv.calls(Call::map);
  CHECK(lake.free(f, 0) == Status::kOk);
  // A smaller request reuses the cached range's leading chunks.
  auto g = Alloc(lake, 20 * kMiB, &how);
  CHECK(how == AllocState::stitch_reuse);
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
  lake.free(blocks[1], 0);
  CHECK(lake.allocate(80 * kMiB, 0, &p) == Status::kOutOfMemory);
  CHECK_EQ(lake.check(), std::string());
  AllocState how{};
  auto big = Alloc(lake, 24 * kMiB, &how);
  CHECK(how == AllocState::stitch);
  Fill(big, 24 * kMiB, 7);
  CHECK(Holds(big, 24 * kMiB, 7));
  CHECK_EQ(host.mapped_bytes(), 64 * kMiB + 24 * kMiB);
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

// A sim driver that runs a callback inside its nth map call, while the
// lake has released its lock: a deterministic interleaving.
class MapHookDriver : public jaxlake::vmm::SimDriver {
 public:
  using SimDriver::SimDriver;
  int hook_at = 0;  // the map call (1 = the first) that runs on_map
  std::function<void()> on_map;

 protected:
  Status do_map(std::uintptr_t va, std::size_t size, std::size_t offset,
                jaxlake::vmm::Handle handle) override {
    if (++maps_ == hook_at && on_map) {
      auto f = std::move(on_map);
      f();
    }
    return SimDriver::do_map(va, size, offset, handle);
  }

 private:
  int maps_ = 0;
};

// While a tail-led stitch maps its pieces (lock released), other threads
// allocate from the free units of the chunks it maps and free the block
// beside its lead: nothing overlaps and every invariant holds.
TEST(tail_led_stitch_shares_its_chunks_while_mapping) {
  MapHookDriver drv(Small());
  Lake lake(drv, LakeOptions{});
  const std::size_t n = 2 * kMiB + kMiB / 4;
  auto a = Alloc(lake, n);  // map 1: a segment of 2 chunks, 1.75 MiB free
  std::uintptr_t c = 0;
  drv.hook_at = 3;  // 2: the shortfall segment; 3: the lead chunk
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
           static_cast<std::int64_t>(6 * kMiB));
  CHECK_EQ(lake.check(), std::string());
  // a's units are free again and fit a new request beside b's lead.
  auto d = Alloc(lake, 2 * kMiB, &how);
  CHECK(how == AllocState::fit || how == AllocState::split);
  for (auto p : {b, c, d}) CHECK(lake.free(p, 0) == Status::kOk);
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

TEST(concurrent_threads_keep_invariants) {
  jaxlake::vmm::SimDriver drv(Small(std::size_t{8} << 30));
  LakeOptions o = Capped(std::size_t{1} << 30);
  Lake lake(drv, o);
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(t);
      std::vector<std::uintptr_t> mine;
      for (int i = 0; i < 4000; ++i) {
        if (mine.empty() || rng() % 2) {
          std::uintptr_t p = 0;
          std::size_t n = rng() % 3 ? 1 + rng() % 100000 : rng() % (40 * kMiB) + 1;
          Status s = lake.allocate(n, t, &p);
          if (s == Status::kOk)
            mine.push_back(p);
          else if (s != Status::kOutOfMemory)
            ++errors;
        } else {
          const std::size_t k = rng() % mine.size();
          if (lake.free(mine[k], t) != Status::kOk) ++errors;
          mine[k] = mine.back();
          mine.pop_back();
        }
      }
      for (auto p : mine)
        if (lake.free(p, t) != Status::kOk) ++errors;
    });
  }
  for (auto& th : threads) th.join();
  CHECK_EQ(errors.load(), 0);
  CHECK_EQ(lake.check(), std::string());
  CHECK_EQ(lake.stats().bytes_in_use.current, 0);
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

}  // namespace

int main(int argc, char** argv) { return jaxlake::check::RunAll(argc, argv); }
