// Tests of Lake::snapshot(): the layout it reports, before and after a
// stitch, and while another operation has the lock released for a driver
// call (a driver whose map calls run a callback makes that deterministic).
#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "cc/lake/lake.h"
#include "cc/vmm/sim_driver.h"
#include "tests/cc/check.h"
#include "tests/cc/test_util.h"

namespace {

using jaxlake::AllocState;
using jaxlake::ChunkState;
using jaxlake::Lake;
using jaxlake::LakeOptions;
using jaxlake::LakeSnapshot;
using jaxlake::SnapshotRun;
using jaxlake::testing::Alloc;
using jaxlake::vmm::Status;

constexpr std::size_t kMiB = std::size_t{1} << 20;

// The sim driver, running on_map once after the next successful map call.
struct CallbackDriver : jaxlake::testing::HookDriver {
  CallbackDriver() : HookDriver(Options()) { after = true; }
  static jaxlake::vmm::SimOptions Options() {
    jaxlake::vmm::SimOptions o;
    o.granularity = 2 * kMiB;
    o.device_bytes = 256 * kMiB;
    return o;
  }
};

// Every segment tiled by its runs; the figures agree with the runs.
void CheckConsistent(const LakeSnapshot& s) {
  std::size_t free = 0, largest = 0;
  for (const auto& seg : s.segments) {
    std::uint32_t at = 0;
    for (const SnapshotRun& r : seg.runs) {
      CHECK_EQ(r.start, at);
      CHECK(r.end > r.start);
      at = r.end;
      if (r.state == ChunkState::kFree) {
        free += r.end - r.start;
        largest = std::max<std::size_t>(largest, r.end - r.start);
      }
    }
    CHECK_EQ(at, seg.nchunks);
  }
  CHECK_EQ(s.free_chunks, free);
  CHECK_EQ(s.largest_free, largest);
}

const SnapshotRun& RunAt(const LakeSnapshot& s, std::uint32_t seg,
                         std::uint32_t chunk) {
  for (const auto& g : s.segments)
    if (g.id == seg)
      for (const SnapshotRun& r : g.runs)
        if (r.start <= chunk && chunk < r.end) return r;
  static const SnapshotRun none;
  CHECK(false);
  return none;
}

TEST(snapshot_shows_holes_then_the_stitch_over_them) {
  CallbackDriver drv;
  LakeOptions slabs;  // the small-request pool (off by default)
  slabs.small_limit = kMiB;
  Lake lake(drv, slabs);
  const auto a = Alloc(lake, 4 * kMiB);
  const auto b = Alloc(lake, 4 * kMiB);
  const auto c = Alloc(lake, 4 * kMiB);
  const auto small = Alloc(lake, 4096);
  CHECK(lake.free(a, 0) == Status::kOk);
  CHECK(lake.free(c, 0) == Status::kOk);

  LakeSnapshot before = lake.snapshot();
  CheckConsistent(before);
  CHECK_EQ(before.granularity, 2 * kMiB);
  CHECK_EQ(before.segments.size(), 4u);  // three grown, one slab
  CHECK_EQ(before.free_chunks, 4u);      // the two holes
  CHECK_EQ(before.largest_free, 2u);     // no run of four chunks
  CHECK(before.stitched.empty());
  REQUIRE_EQ(before.slabs.size(), 1u);
  CHECK(before.slabs[0].used >= 4096u);
  CHECK(before.slabs[0].base <= small &&
        small < before.slabs[0].base + before.slabs[0].bytes);
  const SnapshotRun& slab_run =
      RunAt(before, before.slabs[0].segment, before.slabs[0].start);
  CHECK(slab_run.state == ChunkState::kSlab);
  CHECK_EQ(slab_run.owner, before.slabs[0].id);
  bool found_b = false;
  for (const auto& seg : before.segments)
    for (const SnapshotRun& r : seg.runs)
      if (r.state == ChunkState::kLive) found_b = found_b || r.address == b;
  CHECK(found_b);

  AllocState how{};
  const auto d = Alloc(lake, 8 * kMiB, &how);
  CHECK(how == AllocState::stitch);
  LakeSnapshot after = lake.snapshot();
  CheckConsistent(after);
  REQUIRE_EQ(after.stitched.size(), 1u);
  const auto& st = after.stitched[0];
  CHECK_EQ(st.va, d);
  CHECK_EQ(st.nchunks, 4u);
  CHECK_EQ(st.used, 4u);
  CHECK(!st.cached && !st.busy);
  REQUIRE_EQ(st.pieces.size(), 2u);
  for (const auto& p : st.pieces) {
    CHECK_EQ(p.nchunks, 2u);
    const SnapshotRun& r = RunAt(after, p.segment, p.start);
    CHECK(r.state == ChunkState::kLent);
    CHECK_EQ(r.owner, st.id);
  }
  CHECK_EQ(after.free_chunks, 0u);

  CHECK(lake.free(d, 0) == Status::kOk);
  LakeSnapshot end = lake.snapshot();
  CheckConsistent(end);
  REQUIRE_EQ(end.stitched.size(), 1u);
  CHECK(end.stitched[0].cached);
  CHECK_EQ(end.stitched[0].used, 0u);
  CHECK_EQ(end.free_chunks, 4u);
  CHECK_EQ(lake.check(), std::string());
}

// Blocks split at the alignment: a chunk holding live units and free
// units shows live, and only wholly free chunks show free.
TEST(snapshot_chunks_hold_the_state_of_their_units) {
  CallbackDriver drv;
  Lake lake(drv, LakeOptions{});
  const auto a = Alloc(lake, 3 * kMiB);  // a segment of 2 chunks
  LakeSnapshot s = lake.snapshot();
  CheckConsistent(s);
  REQUIRE_EQ(s.segments.size(), 1u);
  REQUIRE_EQ(s.segments[0].runs.size(), 1u);  // both chunks hold a's units
  CHECK(s.segments[0].runs[0].state == ChunkState::kLive);
  CHECK_EQ(s.segments[0].runs[0].address, a);
  CHECK_EQ(s.free_chunks, 0u);
  CHECK(lake.free(a, 0) == Status::kOk);
  const auto b = Alloc(lake, kMiB);  // the first half of chunk 0
  s = lake.snapshot();
  CheckConsistent(s);
  REQUIRE_EQ(s.segments[0].runs.size(), 2u);
  CHECK(s.segments[0].runs[0].state == ChunkState::kLive);
  CHECK_EQ(s.segments[0].runs[0].address, b);
  CHECK(s.segments[0].runs[1].state == ChunkState::kFree);
  CHECK_EQ(s.free_chunks, 1u);
  CHECK(lake.free(b, 0) == Status::kOk);
  CHECK_EQ(lake.check(), std::string());
}

// A snapshot taken while a stitch is being mapped (the lock released for
// the driver) sees the range claimed: busy, its pieces lent to it, and no
// longer free for anyone else.
TEST(snapshot_during_a_stitch_sees_the_claimed_range) {
  CallbackDriver drv;
  Lake lake(drv, LakeOptions{});
  const auto a = Alloc(lake, 4 * kMiB);
  Alloc(lake, 4 * kMiB);
  const auto c = Alloc(lake, 4 * kMiB);
  CHECK(lake.free(a, 0) == Status::kOk);
  CHECK(lake.free(c, 0) == Status::kOk);
  bool ran = false;
  drv.on_map = [&] {
    ran = true;
    LakeSnapshot mid = lake.snapshot();
    CheckConsistent(mid);
    REQUIRE_EQ(mid.stitched.size(), 1u);
    const auto& st = mid.stitched[0];
    CHECK(st.busy);
    CHECK_EQ(st.va, std::uintptr_t{0});
    CHECK_EQ(st.used, 0u);
    for (const auto& p : st.pieces) {
      const SnapshotRun& r = RunAt(mid, p.segment, p.start);
      CHECK(r.state == ChunkState::kLent);
      CHECK_EQ(r.owner, st.id);
    }
    CHECK_EQ(mid.free_chunks, 0u);
    CHECK_EQ(lake.check(), std::string());
  };
  AllocState how{};
  const auto d = Alloc(lake, 8 * kMiB, &how);
  CHECK(ran);
  CHECK(how == AllocState::stitch);
  LakeSnapshot after = lake.snapshot();
  REQUIRE_EQ(after.stitched.size(), 1u);
  CHECK(!after.stitched[0].busy);
  CHECK_EQ(after.stitched[0].va, d);
  CHECK_EQ(lake.check(), std::string());
}

// While a new segment is being created its memory is not in the layout
// yet; once made, it is.
TEST(snapshot_during_growth_leaves_out_the_segment_being_made) {
  CallbackDriver drv;
  Lake lake(drv, LakeOptions{});
  Alloc(lake, 4 * kMiB);
  std::size_t segments_mid = 0;
  drv.on_map = [&] {
    LakeSnapshot mid = lake.snapshot();
    CheckConsistent(mid);
    segments_mid = mid.segments.size();
  };
  AllocState how{};
  Alloc(lake, 6 * kMiB, &how);
  CHECK(how == AllocState::grow);
  CHECK_EQ(segments_mid, 1u);
  CHECK_EQ(lake.snapshot().segments.size(), 2u);
}

// A stitch led by a free tail: the range starts at the tail's chunk, the
// allocation past the units before the tail; the snapshot names the
// allocation's address, not the range's.
TEST(snapshot_names_the_address_of_a_tail_led_stitch) {
  CallbackDriver drv;
  Lake lake(drv, LakeOptions{});
  const std::size_t n = 2 * kMiB + kMiB / 4;
  const auto a = Alloc(lake, n);  // 2 chunks, a free tail of 1.75 MiB
  AllocState how{};
  const auto b = Alloc(lake, n, &how);
  REQUIRE(how == AllocState::stitch_grow);
  const LakeSnapshot s = lake.snapshot();
  CheckConsistent(s);
  REQUIRE_EQ(s.stitched.size(), 1u);
  CHECK_EQ(s.stitched[0].address, b);
  CHECK(s.stitched[0].va < b && b < s.stitched[0].va + 2 * kMiB);
  // Its pieces (the tail, then the growth placed right after it) lie back
  // to back: an alias, which is dropped at its free rather than cached
  // (docs/design.md, "Growth"), so the snapshot no longer shows it.
  CHECK(lake.free(b, 0) == Status::kOk);
  const LakeSnapshot after = lake.snapshot();
  CheckConsistent(after);
  CHECK_EQ(after.stitched.size(), 0u);
  CHECK_EQ(lake.check(), std::string());
  CHECK(lake.free(a, 0) == Status::kOk);
}

}  // namespace

int main(int argc, char** argv) { return jaxlake::check::RunAll(argc, argv); }
