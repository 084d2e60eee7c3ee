// Tests of the replay engine and each policy model, on small hand-made
// traces whose answers are worked out in the comments (the trace parser's
// are in trace_test.cc, what every policy must do in
// policy_conformance_test.cc).
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cc/replay/engine.h"
#include "cc/replay/policy.h"
#include "cc/replay/trace.h"
#include "cc/vmm/sim_driver.h"
#include "tests/cc/check.h"
#include "tests/cc/policy_util.h"

namespace {

using namespace jaxlake::replay;           // NOLINT: the code under test
using namespace jaxlake::replay::testing;  // NOLINT: its test helpers
using jaxlake::vmm::Call;

// ---- BFC -------------------------------------------------------------------

TEST(bfc_regions_start_at_2mib_and_double) {
  auto p = Make("bfc");
  // 1000 B -> 1024 B; first region 2 MiB; the next region size doubles
  // after a region made without raising it.
  const std::uintptr_t a = Alloc(*p, 1000);
  CHECK_EQ(p->reserved(), 2 * kMiB);
  CHECK_EQ(Calls(*p, Call::create), 1u);
  CHECK_EQ(Calls(*p, Call::map), 1u);
  // The 2 MiB chunk was split (2 MiB >= 2 x 1 KiB): the rest serves this.
  CHECK_EQ(Alloc(*p, 256), a + 1024);
  // 3 MiB fits no free chunk: a 4 MiB region (4 >= 3, not raised).
  const std::uintptr_t b = Alloc(*p, 3 * kMiB);
  CHECK_EQ(p->reserved(), 6 * kMiB);
  // 5 MiB: an 8 MiB region.
  Alloc(*p, 5 * kMiB);
  CHECK_EQ(p->reserved(), 14 * kMiB);
  // 40 MiB: 16 -> 32 -> 64 MiB, raised, so the next stays 64 MiB.
  Alloc(*p, 40 * kMiB);
  CHECK_EQ(p->reserved(), 78 * kMiB);
  CHECK_EQ(Counter(*p, "regions"), 4u);
  p->free(b, 0);
  // Best fit: the freed 4 MiB chunk (smallest free chunk that fits).
  CHECK_EQ(Alloc(*p, 4 * kMiB), b);
  CHECK_EQ(p->reserved(), 78 * kMiB);  // BFC never gives memory back
  CHECK_EQ(p->check(), std::string());
}

TEST(bfc_split_rule_twice_or_128mib) {
  auto p = Make("bfc");
  // 5 MiB: region 2 -> 4 -> 8 MiB (raised). 8 < 2 x 5 and 3 < 128: no split.
  const std::uintptr_t a = Alloc(*p, 5 * kMiB);
  CHECK_EQ(p->reserved(), 8 * kMiB);
  // So 1 MiB cannot use the 3 MiB behind it: a new 8 MiB region.
  const std::uintptr_t b = Alloc(*p, 1 * kMiB);
  CHECK(b != a + 5 * kMiB);
  CHECK_EQ(p->reserved(), 16 * kMiB);
  // 300 MiB: region 16 -> 512 MiB; 512 < 600 but 212 >= 128: split.
  const std::uintptr_t c = Alloc(*p, 300 * kMiB);
  CHECK_EQ(p->reserved(), 528 * kMiB);
  CHECK_EQ(Alloc(*p, 200 * kMiB), c + 300 * kMiB);
  CHECK_EQ(p->reserved(), 528 * kMiB);
  CHECK_EQ(p->check(), std::string());
}

TEST(bfc_coalesces_on_free) {
  auto p = Make("bfc");
  const std::uintptr_t a = Alloc(*p, 512 * 1024);
  const std::uintptr_t b = Alloc(*p, 512 * 1024);
  const std::uintptr_t c = Alloc(*p, 512 * 1024);
  CHECK_EQ(b, a + 512 * 1024);
  CHECK_EQ(c, b + 512 * 1024);
  p->free(a, 0);
  p->free(c, 0);
  p->free(b, 0);  // merges with both neighbours: one free 2 MiB chunk
  CHECK_EQ(Alloc(*p, 2 * kMiB), a);
  CHECK_EQ(p->reserved(), 2 * kMiB);
  CHECK_EQ(p->check(), std::string());
}

TEST(bfc_growth_is_cut_to_the_memory_left) {
  auto p = Make("bfc", Cap(12 * kMiB));
  Alloc(*p, 1 * kMiB);  // 2 MiB region (next 4)
  Alloc(*p, 3 * kMiB);  // 4 MiB region (next 8)
  Alloc(*p, 4 * kMiB);  // 8 MiB wanted, 6 MiB left: a 6 MiB region
  CHECK_EQ(p->reserved(), 12 * kMiB);
  std::uintptr_t x;
  CHECK(!p->allocate(2 * kMiB + 1, 0, &x));  // 1 MiB free, nothing left
  CHECK_EQ(p->check(), std::string());
}

TEST(bfc_limit_above_the_device_backs_off_by_a_tenth) {
  // Its own limit 64 MiB on a device of 40 (a second process on a shared
  // GPU): the region for 39 MiB doubles to 64, which the device refuses;
  // 57.6, 51.8, 46.7 and 42.0 MiB are refused too, and 37.8 MiB no longer
  // holds the request: out of memory, where a limit of the device's own
  // 40 MiB cuts the region to 40 and serves it.
  PolicyOptions o = Cap(40 * kMiB);
  o.bfc_limit = 64 * kMiB;
  auto p = Make("bfc", o);
  std::uintptr_t x;
  CHECK(!p->allocate(39 * kMiB, 0, &x));
  CHECK_EQ(p->reserved(), 0u);
  auto q = Make("bfc", Cap(40 * kMiB));
  CHECK(q->allocate(39 * kMiB, 0, &x));
  CHECK_EQ(q->reserved(), 40 * kMiB);
  // On a device of 44 MiB the 42.0 MiB try fits (in 42 MiB of granules).
  PolicyOptions w = Cap(44 * kMiB);
  w.bfc_limit = 64 * kMiB;
  auto r = Make("bfc", w);
  CHECK(r->allocate(39 * kMiB, 0, &x));
  CHECK_EQ(r->reserved(), 42 * kMiB);
  CHECK_EQ(r->check(), std::string());
}

// ---- PyTorch caching allocator -----------------------------------------------

TEST(torch_small_pool_uses_2mib_segments) {
  auto p = Make("torch");
  const std::uintptr_t a = Alloc(*p, 100);  // 512 B in a 2 MiB segment
  CHECK_EQ(p->reserved(), 2 * kMiB);
  CHECK_EQ(Alloc(*p, 1 * kMiB), a + 512);  // the rest of that segment
  CHECK_EQ(p->reserved(), 2 * kMiB);
  CHECK_EQ(Calls(*p, Call::create), 1u);
  CHECK_EQ(p->check(), std::string());
}

TEST(torch_large_pool_segments_and_split_rule) {
  auto p = Make("torch");
  // 5 MiB (< 10 MiB): a 20 MiB segment, split (15 MiB > 1 MiB left).
  const std::uintptr_t a = Alloc(*p, 5 * kMiB);
  CHECK_EQ(p->reserved(), 20 * kMiB);
  // 12 MiB: best fit is the 15 MiB rest; split again (3 MiB left).
  const std::uintptr_t b = Alloc(*p, 12 * kMiB);
  CHECK_EQ(b, a + 5 * kMiB);
  // 11 MiB (>= 10 MiB): a segment of the request rounded to 2 MiB: 12 MiB.
  Alloc(*p, 11 * kMiB);
  CHECK_EQ(p->reserved(), 32 * kMiB);
  p->free(a, 0);
  p->free(b, 0);  // the 20 MiB segment is whole and free again
  // 18.5 MiB leaves 1.5 MiB (> 1 MiB): split; 1.5 MiB fits behind it.
  const std::uintptr_t c = Alloc(*p, 18 * kMiB + 512 * 1024);
  CHECK_EQ(c, a);
  CHECK_EQ(Alloc(*p, 1 * kMiB + 512 * 1024), a + 18 * kMiB + 512 * 1024);
  CHECK_EQ(p->reserved(), 32 * kMiB);
  CHECK_EQ(p->check(), std::string());
}

TEST(torch_blocks_stay_with_their_stream) {
  auto p = Make("torch");
  const std::uintptr_t a = Alloc(*p, 5 * kMiB, 0);
  p->free(a, 0);
  Alloc(*p, 5 * kMiB, 1);  // stream 1 cannot use stream 0's free segment
  CHECK_EQ(p->reserved(), 40 * kMiB);
  CHECK_EQ(Alloc(*p, 5 * kMiB, 0), a);
}

TEST(torch_frees_cached_segments_only_on_oom_retry) {
  auto p = Make("torch", Cap(40 * kMiB));
  const std::uintptr_t a = Alloc(*p, 5 * kMiB, 0);  // 20 MiB segment
  p->free(a, 0);
  // 30 MiB on stream 1: 20 + 30 > 40, cudaMalloc fails; the free 20 MiB
  // segment is cudaFree'd and the retry succeeds.
  Alloc(*p, 30 * kMiB, 1);
  CHECK_EQ(p->reserved(), 30 * kMiB);
  CHECK_EQ(Calls(*p, Call::create), 3u);  // 20, 30 (failed), 30
  CHECK_EQ(Calls(*p, Call::map), 2u);
  CHECK_EQ(Calls(*p, Call::unmap), 1u);
  CHECK_EQ(Calls(*p, Call::release), 1u);
  CHECK_EQ(Counter(*p, "reclaims"), 1u);
  std::uintptr_t x;
  CHECK(!p->allocate(12 * kMiB, 1, &x));  // 30 + 12 > 40 even after retry
  CHECK_EQ(Counter(*p, "reclaims"), 2u);
  CHECK_EQ(p->check(), std::string());
}

TEST(torch_max_split_size_keeps_oversize_blocks_whole) {
  PolicyOptions o;
  o.torch_max_split_size = 16 * kMiB;
  auto p = Make("torch", o);
  const std::uintptr_t a = Alloc(*p, 40 * kMiB);  // 40 MiB segment
  p->free(a, 0);
  // 8 MiB < max_split_size may not take the 40 MiB (oversize) block.
  const std::uintptr_t b = Alloc(*p, 8 * kMiB);
  CHECK(b != a);
  CHECK_EQ(p->reserved(), 60 * kMiB);
  // 30 MiB (oversize) takes it, unsplit (40 < 30 + 20).
  CHECK_EQ(Alloc(*p, 30 * kMiB), a);
  CHECK_EQ(p->check(), std::string());
}

// ---- PyTorch expandable segments ---------------------------------------------

TEST(expandable_maps_20mib_pages_at_the_lowest_free_address) {
  auto p = Make("torch-expandable");
  const std::uintptr_t a = Alloc(*p, 5 * kMiB);
  CHECK_EQ(p->reserved(), 20 * kMiB);
  CHECK_EQ(Calls(*p, Call::reserve), 1u);
  CHECK_EQ(Calls(*p, Call::create), 1u);
  CHECK_EQ(Calls(*p, Call::map), 1u);
  CHECK_EQ(Calls(*p, Call::set_access), 1u);
  // 25 MiB: the free 15 MiB behind `a` plus one more page, contiguous.
  const std::uintptr_t b = Alloc(*p, 25 * kMiB);
  CHECK_EQ(b, a + 5 * kMiB);
  CHECK_EQ(p->reserved(), 40 * kMiB);
  CHECK_EQ(Calls(*p, Call::map), 2u);
  CHECK_EQ(Calls(*p, Call::set_access), 2u);
  p->free(a, 0);
  p->free(b, 0);
  // Everything is one free mapped 40 MiB block again.
  CHECK_EQ(Alloc(*p, 40 * kMiB), a);
  CHECK_EQ(p->reserved(), 40 * kMiB);
  // Small requests get their own range, in 2 MiB pages.
  Alloc(*p, 1000);
  CHECK_EQ(p->reserved(), 42 * kMiB);
  CHECK_EQ(Calls(*p, Call::reserve), 2u);
  CHECK_EQ(p->check(), std::string());
}

TEST(expandable_unmaps_free_pages_on_oom_retry) {
  auto p = Make("torch-expandable", Cap(60 * kMiB));
  const std::uintptr_t a = Alloc(*p, 30 * kMiB, 0);  // 2 pages
  p->free(a, 0);
  // Stream 1 has its own range; 40 + 40 > 60: mapping fails after one
  // page, then stream 0's free pages are unmapped (its range is freed,
  // nothing being left mapped in it) and the retry maps two pages.
  Alloc(*p, 30 * kMiB, 1);
  CHECK_EQ(p->reserved(), 40 * kMiB);
  CHECK_EQ(Calls(*p, Call::reserve), 2u);
  CHECK_EQ(Calls(*p, Call::create), 6u);   // 2 + (1 made, 1 failed) + 2
  CHECK_EQ(Calls(*p, Call::release), 3u);  // the 1 made, 2 unmapped pages
  CHECK_EQ(Calls(*p, Call::unmap), 2u);
  CHECK_EQ(Calls(*p, Call::map), 4u);
  CHECK_EQ(Calls(*p, Call::address_free), 1u);
  CHECK_EQ(Counter(*p, "reclaims"), 1u);
  CHECK_EQ(p->check(), std::string());
}

// ---- GMLake --------------------------------------------------------------------

TEST(gmlake_maps_one_chunk_per_call) {
  auto p = Make("gmlake");
  Alloc(*p, 1000);  // the small pool: one 2 MiB cudaMalloc
  CHECK_EQ(Calls(*p, Call::create), 1u);
  CHECK_EQ(Calls(*p, Call::map), 1u);
  CHECK_EQ(Calls(*p, Call::set_access), 1u);  // its memory is accessible
  // 3 MiB -> 4 MiB (2 chunks) in a 20 MiB segment of 10 chunks, each
  // created, mapped and given access on its own.
  const std::uintptr_t a = Alloc(*p, 3 * kMiB);
  CHECK_EQ(p->reserved(), 22 * kMiB);
  CHECK_EQ(Calls(*p, Call::create), 11u);
  CHECK_EQ(Calls(*p, Call::map), 11u);
  CHECK_EQ(Calls(*p, Call::set_access), 11u);
  CHECK_EQ(Calls(*p, Call::reserve), 1u);
  // 6 MiB: split from the 8 chunks left.
  CHECK_EQ(Alloc(*p, 6 * kMiB), a + 4 * kMiB);
  CHECK_EQ(p->reserved(), 22 * kMiB);
  CHECK_EQ(p->check(), std::string());
}

TEST(gmlake_stitches_only_at_or_above_frag_limit) {
  auto p = Make("gmlake");  // frag_limit 512 MiB
  const std::uintptr_t a = Alloc(*p, 100 * kMiB);
  Alloc(*p, 100 * kMiB);
  const std::uintptr_t c = Alloc(*p, 100 * kMiB);
  p->free(a, 0);
  p->free(c, 0);
  Alloc(*p, 200 * kMiB);  // below 512 MiB: grows instead of stitching
  CHECK_EQ(p->reserved(), 500 * kMiB);
  CHECK_EQ(Counter(*p, "stitches"), 0u);
}

TEST(gmlake_stitch_reuse_and_busy_chunks) {
  PolicyOptions o;
  o.gmlake_frag_limit = 4 * kMiB;
  auto p = Make("gmlake", o);
  // Three segments of 5 chunks (10 MiB >= 10 MiB: no 20 MiB rounding).
  const std::uintptr_t a = Alloc(*p, 10 * kMiB);
  Alloc(*p, 10 * kMiB);
  const std::uintptr_t c = Alloc(*p, 10 * kMiB);
  p->free(a, 0);
  p->free(c, 0);
  const auto maps = Calls(*p, Call::map);
  // 20 MiB: no single free run; two runs of 5 chunks are stitched.
  const std::uintptr_t s = Alloc(*p, 20 * kMiB);
  CHECK_EQ(Counter(*p, "stitches"), 1u);
  CHECK_EQ(Calls(*p, Call::map), maps + 10);  // one map per chunk
  CHECK_EQ(p->reserved(), 30 * kMiB);
  p->free(s, 0);
  // Again: the cached stitched block is reused, no new mapping.
  CHECK_EQ(Alloc(*p, 20 * kMiB), s);
  CHECK_EQ(Counter(*p, "stitch_reuses"), 1u);
  CHECK_EQ(Calls(*p, Call::map), maps + 10);
  p->free(s, 0);
  // A 10 MiB request takes segment A's run (best fit, lowest segment),
  // which the stitched block maps: it is no longer reusable, a single run
  // cannot be stitched, so 20 MiB grows a new segment.
  CHECK_EQ(Alloc(*p, 10 * kMiB), a);
  Alloc(*p, 20 * kMiB);
  CHECK_EQ(p->reserved(), 50 * kMiB);
  CHECK_EQ(Counter(*p, "stitch_reuses"), 1u);
  CHECK_EQ(p->check(), std::string());
}

TEST(gmlake_reclaims_under_pressure) {
  PolicyOptions o;
  o.gmlake_frag_limit = 4 * kMiB;
  o.capacity = 30 * kMiB;
  auto p = Make("gmlake", o);
  const std::uintptr_t a = Alloc(*p, 10 * kMiB);
  Alloc(*p, 10 * kMiB);
  const std::uintptr_t c = Alloc(*p, 10 * kMiB);
  p->free(a, 0);
  p->free(c, 0);
  p->free(Alloc(*p, 20 * kMiB), 0);  // a cached stitched block
  // Stream 1 has nothing: growing fails, so the cached stitched block is
  // unmapped, segments A and C are released, and growing succeeds.
  Alloc(*p, 20 * kMiB, 1);
  CHECK_EQ(p->reserved(), 30 * kMiB);
  CHECK_EQ(Counter(*p, "reclaims"), 1u);
  CHECK_EQ(Counter(*p, "stitch_evictions"), 1u);
  CHECK_EQ(Calls(*p, Call::address_free), 3u);  // stitched, A, C
  CHECK_EQ(Calls(*p, Call::release), 10u);  // the chunks of A and C
  CHECK_EQ(p->check(), std::string());
}

TEST(gmlake_keeps_segments_a_live_stitched_block_maps) {
  PolicyOptions o;
  o.gmlake_frag_limit = 4 * kMiB;
  o.capacity = 44 * kMiB;
  auto p = Make("gmlake", o);
  // Segments X, Y (6 chunks), Z, W (5 chunks); W stays live.
  const std::uintptr_t x = Alloc(*p, 12 * kMiB);
  const std::uintptr_t y = Alloc(*p, 12 * kMiB);
  const std::uintptr_t z = Alloc(*p, 10 * kMiB);
  Alloc(*p, 10 * kMiB);
  p->free(x, 0);
  p->free(y, 0);
  p->free(z, 0);
  // 32 MiB = 16 chunks: stitched from Y (6), X (6) and 4 chunks of Z.
  p->free(Alloc(*p, 32 * kMiB), 0);
  CHECK_EQ(Counter(*p, "stitches"), 1u);
  // 14 MiB = 7 chunks: no run that long; the cached block is reused and
  // uses Y and one chunk of X. Z is wholly free but still mapped by it.
  Alloc(*p, 14 * kMiB);
  CHECK_EQ(Counter(*p, "stitch_reuses"), 1u);
  // Under pressure Z cannot be released: stream 1 runs out of memory.
  std::uintptr_t a;
  CHECK(!p->allocate(10 * kMiB, 1, &a));
  CHECK_EQ(p->reserved(), 44 * kMiB);
  CHECK_EQ(p->check(), std::string());
}

// ---- jaxlake (the real lake) -------------------------------------------------

TEST(jaxlake_policy_stitches_scattered_free_memory) {
  auto p = Make("jaxlake");
  std::vector<std::uintptr_t> blocks;
  for (int i = 0; i < 8; ++i) blocks.push_back(Alloc(*p, 8 * kMiB));
  const std::size_t reserved = p->reserved();
  CHECK_EQ(reserved, 64 * kMiB);
  for (int i = 0; i < 8; i += 2) p->free(blocks[i], 0);
  Alloc(*p, 24 * kMiB);
  CHECK_EQ(p->reserved(), reserved);  // stitched, no new memory
  CHECK_EQ(Counter(*p, "stitches"), 1u);
  CHECK_EQ(p->check(), std::string());
}

// ---- the engine --------------------------------------------------------------

// Live bytes: 3 MiB, 3 MiB + 1000, then 1000, 1000 + 5 MiB.
Trace FourEvents() {
  return Jsonl(
      "{\"t\":0,\"op\":\"alloc\",\"id\":1,\"size\":3145728}\n"
      "{\"t\":1,\"op\":\"alloc\",\"id\":2,\"size\":1000}\n"
      "{\"t\":2,\"op\":\"free\",\"id\":1}\n"
      "{\"t\":3,\"op\":\"alloc\",\"id\":3,\"size\":5242880}\n");
}

TEST(engine_measures_utilisation_waste_and_calls) {
  // BFC: 3 MiB -> a 4 MiB region (2 MiB raised to 4), not split (4 < 6);
  // 1000 B -> a second 4 MiB region; after the free, 5 MiB fits no free
  // chunk -> an 8 MiB region. Peak reserved 16 MiB, peak live 5 MiB + 1000.
  const Trace t = FourEvents();
  REQUIRE(t.ok());
  auto p = Make("bfc");
  ReplayOptions ro;
  ro.check_every = 1;
  const ReplayResult r = Replay(t, *p, ro);
  CHECK_EQ(r.check_error, std::string());
  CHECK_EQ(r.events, 4u);
  CHECK_EQ(r.allocs, 3u);
  CHECK_EQ(r.frees, 1u);
  CHECK_EQ(r.peak_live, 5242880u + 1000u);
  CHECK_EQ(r.peak_reserved, 16 * kMiB);
  CHECK_EQ(r.waste, static_cast<std::int64_t>(16 * kMiB - 5242880 - 1000));
  CHECK(r.utilisation > 0.31255 && r.utilisation < 0.31257);
  CHECK_EQ(r.calls[static_cast<int>(Call::create)], 3u);
  CHECK(!r.oom);
  CHECK_EQ(r.alloc_times.count, 3u);
  CHECK_EQ(r.free_times.count, 1u);
  CHECK_EQ(r.timeline_event.size(), 4u);  // fewer events than points
  CHECK_EQ(r.timeline_reserved.back(), 16 * kMiB);
  CHECK_EQ(r.timeline_live[2], 1000u);
}

// Timing rounds: each round replays with a fresh policy from the factory;
// the call times of all rounds are pooled, every other figure is the first
// round's, and the clock that times calls costs a sane amount.
TEST(engine_pools_the_call_times_of_several_rounds) {
  const Trace t = FourEvents();
  REQUIRE(t.ok());
  int made = 0;
  const PolicyFactory make = [&] {
    ++made;
    return Make("bfc");
  };
  ReplayOptions ro;
  ro.timing_rounds = 5;
  ro.check_every = 1;
  const ReplayResult r = Replay(t, make, ro);
  CHECK_EQ(made, 5);
  CHECK_EQ(r.timing_rounds, 5);
  CHECK_EQ(r.check_error, std::string());
  CHECK_EQ(r.alloc_times.count, 15u);
  CHECK_EQ(r.free_times.count, 5u);
  CHECK_EQ(r.allocs, 3u);  // the first round's figures, not summed
  CHECK_EQ(r.calls[static_cast<int>(Call::create)], 3u);
  CHECK_EQ(r.peak_reserved, 16 * kMiB);
  CHECK(r.median_ns >= 0 && r.alloc_times.p99_ns >= r.alloc_times.p50_ns);
  CHECK(r.clock_overhead_ns > 0 && r.clock_overhead_ns < 10000);
  // Without timing there is one replay.
  ro.timing = false;
  made = 0;
  const ReplayResult u = Replay(t, make, ro);
  CHECK_EQ(made, 1);
  CHECK_EQ(u.alloc_times.count, 0u);
  CHECK_EQ(u.timing_rounds, 1);
}

TEST(latency_model_interpolates_and_extrapolates) {
  jaxlake::vmm::LatencyModel m = jaxlake::vmm::LatencyModel::Zero();
  CHECK_EQ(m.us(Call::map, 2 * kMiB), 0.0);
  CHECK_EQ(m.set(Call::map, {{2 * kMiB, 10}, {6 * kMiB, 30}}), std::string());
  CHECK_EQ(m.us(Call::map, kMiB), 10.0);       // below: the first point
  CHECK_EQ(m.us(Call::map, 4 * kMiB), 20.0);   // between: linear
  CHECK_EQ(m.us(Call::map, 10 * kMiB), 50.0);  // above: the last two points
  CHECK_EQ(m.set(Call::unmap, {{2 * kMiB, 7}}), std::string());
  CHECK_EQ(m.us(Call::unmap, 64 * kMiB), 7.0);  // one point: constant
  // Bad points are refused with the kind named; the model is unchanged.
  const std::string e = m.set(Call::map, {{4 * kMiB, 1}, {2 * kMiB, 2}});
  CHECK(e.find("map") != std::string::npos);
  CHECK(!m.set(Call::map, {{0, 1}}).empty());
  CHECK(!m.set(Call::map, {{kMiB, -1}}).empty());
  CHECK_EQ(m.us(Call::map, 4 * kMiB), 20.0);
  // The defaults: kvcached's A100 figures at 2 MiB (latency.cc).
  const jaxlake::vmm::LatencyModel d;
  CHECK_EQ(d.us(Call::map, 2 * kMiB), 1.45);
  CHECK_EQ(d.us(Call::unmap, 2 * kMiB), 25.6);
  CHECK_EQ(d.us(Call::set_access, 2 * kMiB), 36.0);
  CHECK_EQ(d.devices(), 1);
}

TEST(latency_model_charges_per_handle_per_device_and_first_grant) {
  using jaxlake::vmm::DriverClock;
  using jaxlake::vmm::LatencyModel;
  LatencyModel m = LatencyModel::Zero();
  CHECK_EQ(m.set(Call::map, {{2 * kMiB, 2}, {4 * kMiB, 3}}), std::string());
  CHECK_EQ(m.set(Call::unmap, {{2 * kMiB, 5}}), std::string());
  CHECK_EQ(m.set(Call::set_access, {{2 * kMiB, 10}}), std::string());
  CHECK_EQ(m.set(Call::create, {{2 * kMiB, 7}, {4 * kMiB, 9}}),
           std::string());
  // Map and unmap: per handle, each handle of bytes / handles.
  CHECK_EQ(m.call_us(Call::map, 8 * kMiB, 4), 4 * 2.0);
  CHECK_EQ(m.call_us(Call::map, 8 * kMiB, 2), 2 * 3.0);
  CHECK_EQ(m.call_us(Call::unmap, 64 * kMiB, 3), 15.0);
  // Other kinds ignore the handles.
  CHECK_EQ(m.call_us(Call::create, 4 * kMiB, 2), 9.0);
  // Access: the points plus peer_us per device after the first.
  CHECK_EQ(m.call_us(Call::set_access, 2 * kMiB), 10.0);
  CHECK_EQ(m.set_term("devices", 8), std::string());
  CHECK_EQ(m.set_term("peer_us", 4), std::string());
  CHECK_EQ(m.call_us(Call::set_access, 2 * kMiB), 10.0 + 7 * 4.0);
  // Bad terms are refused by name, the model unchanged.
  CHECK(m.set_term("devices", 0).find("devices") != std::string::npos);
  CHECK(m.set_term("devices", 2.5).find("devices") != std::string::npos);
  CHECK(m.set_term("peer_us", -1).find("peer_us") != std::string::npos);
  CHECK(m.set_term("peers", 1).find("unknown") != std::string::npos);
  CHECK_EQ(m.devices(), 8);
  // The first grant's extra time is charged once per clock.
  CHECK_EQ(m.set_term("first_set_access_us", 100), std::string());
  DriverClock clock(m);
  clock.charge(Call::set_access, 2 * kMiB);
  clock.charge(Call::set_access, 2 * kMiB, 2);
  CHECK_EQ(clock.times()[static_cast<int>(Call::set_access)],
           100 + 3 * 38.0);
  clock.charge(Call::unmap, 6 * kMiB, 1, 3);
  CHECK_EQ(clock.times()[static_cast<int>(Call::unmap)], 15.0);
}

TEST(sim_driver_charges_an_unmap_per_mapping) {
  // One unmap over three adjacent mappings of three handles costs three
  // handles' time (PyTorch pull request 96995: per handle, not per byte).
  jaxlake::vmm::SimOptions so;
  so.latency = jaxlake::vmm::LatencyModel::Zero();
  CHECK_EQ(so.latency.set(Call::unmap, {{2 * kMiB, 5}}), std::string());
  jaxlake::vmm::SimDriver d(so);
  std::uintptr_t va = 0;
  REQUIRE(d.reserve(6 * kMiB, &va) == jaxlake::vmm::Status::kOk);
  for (int i = 0; i < 3; ++i) {
    jaxlake::vmm::Handle h = 0;
    REQUIRE(d.create(2 * kMiB, &h) == jaxlake::vmm::Status::kOk);
    REQUIRE(d.map(va + i * 2 * kMiB, 2 * kMiB, 0, h) ==
            jaxlake::vmm::Status::kOk);
    REQUIRE(d.release(h) == jaxlake::vmm::Status::kOk);
  }
  REQUIRE(d.unmap(va, 6 * kMiB) == jaxlake::vmm::Status::kOk);
  CHECK_EQ(d.driver_us()[static_cast<int>(Call::unmap)], 15.0);
  CHECK_EQ(d.calls()[static_cast<int>(Call::unmap)], 1u);
}

TEST(every_policy_is_charged_by_the_same_model) {
  // A model charging 1 us per call of any memory kind but unmap, whatever
  // the size: then each policy's driver time is its number of memory calls
  // but unmaps (which are charged per handle, not per call).
  PolicyOptions o;
  o.latency = jaxlake::vmm::LatencyModel::Zero();
  for (Call c : {Call::reserve, Call::address_free, Call::create,
                 Call::release, Call::map, Call::set_access})
    CHECK_EQ(o.latency.set(c, {{1, 1.0}}), std::string());
  for (const std::string& name : jaxlake::replay::PolicyNames()) {
    auto p = Make(name, o);
    std::vector<std::uintptr_t> live;
    for (int i = 0; i < 40; ++i) live.push_back(Alloc(*p, (i % 9 + 1) * kMiB));
    for (std::size_t i = 0; i < live.size(); i += 2) p->free(live[i], 0);
    for (int i = 0; i < 10; ++i) Alloc(*p, 30 * kMiB);
    const auto calls = p->calls();
    const auto us = p->driver_us();
    double total = 0;
    std::uint64_t memory = 0;
    for (int k = 0; k < jaxlake::vmm::kNumCalls; ++k) total += us[k];
    for (Call c : {Call::reserve, Call::address_free, Call::create,
                   Call::release, Call::map, Call::set_access})
      memory += calls[static_cast<int>(c)];
    CHECK(memory > 0);
    CHECK_EQ(total, static_cast<double>(memory));
  }
  // Sizes matter: a 64 MiB cudaMalloc costs more than a 2 MiB one.
  PolicyOptions sized;
  sized.latency = jaxlake::vmm::LatencyModel::Zero();
  CHECK_EQ(sized.latency.set(Call::create, {{2 * kMiB, 1}, {4 * kMiB, 2}}),
           std::string());
  auto small = Make("bfc", sized);
  Alloc(*small, 1000);  // the first region: 2 MiB
  auto big = Make("bfc", sized);
  Alloc(*big, 60 * kMiB);  // one region of at least 60 MiB
  CHECK_EQ(small->driver_us()[static_cast<int>(Call::create)], 1.0);
  const double region = static_cast<double>(Counter(*big, "region_bytes"));
  CHECK(region >= 60.0 * kMiB);
  CHECK_EQ(big->driver_us()[static_cast<int>(Call::create)],
           region / (2.0 * kMiB));
}

TEST(engine_counts_the_calls_of_the_second_half) {
  // Two identical steps of 4 events each: the second half (from event 4)
  // reuses what the first made, so jaxlake makes no driver call in it.
  const Trace t = Jsonl(
      "{\"t\":0,\"op\":\"alloc\",\"id\":1,\"size\":9437184}\n"
      "{\"t\":1,\"op\":\"alloc\",\"id\":2,\"size\":2359296}\n"
      "{\"t\":2,\"op\":\"free\",\"id\":1}\n"
      "{\"t\":3,\"op\":\"free\",\"id\":2}\n"
      "{\"t\":4,\"op\":\"alloc\",\"id\":3,\"size\":9437184}\n"
      "{\"t\":5,\"op\":\"alloc\",\"id\":4,\"size\":2359296}\n"
      "{\"t\":6,\"op\":\"free\",\"id\":3}\n"
      "{\"t\":7,\"op\":\"free\",\"id\":4}\n");
  REQUIRE(t.ok());
  auto p = Make("jaxlake");
  const ReplayResult r = Replay(t, *p, ReplayOptions{});
  CHECK_EQ(r.half_event, 4u);
  std::uint64_t all = 0, second = 0;
  double us = 0, us_second = 0;
  for (int k = 0; k < jaxlake::vmm::kNumCalls; ++k) {
    all += r.calls[k];
    second += r.calls_second_half[k];
    us += r.driver_us[k];
    us_second += r.driver_us_second_half[k];
  }
  CHECK(all > 0);
  CHECK(us > 0);
  CHECK_EQ(second, 0u);
  CHECK_EQ(us_second, 0.0);
  // A policy that frees its memory at once calls the driver again: BFC
  // does not, but a trace that grows in its second half does.
  const Trace g = Jsonl(
      "{\"t\":0,\"op\":\"alloc\",\"id\":1,\"size\":1048576}\n"
      "{\"t\":1,\"op\":\"alloc\",\"id\":2,\"size\":104857600}\n");
  REQUIRE(g.ok());
  auto b = Make("bfc");
  const ReplayResult rg = Replay(g, *b, ReplayOptions{});
  CHECK_EQ(rg.half_event, 1u);
  CHECK(rg.calls_second_half[static_cast<int>(Call::create)] >= 1u);
}

TEST(engine_reports_the_event_that_runs_out_of_memory) {
  const Trace t = Jsonl(
      "{\"t\":0,\"op\":\"alloc\",\"id\":1,\"size\":5242880}\n"
      "{\"t\":1,\"op\":\"free\",\"id\":1}\n"
      "{\"t\":2,\"op\":\"alloc\",\"id\":2,\"size\":5242880,\"stream\":1}\n"
      "{\"t\":3,\"op\":\"alloc\",\"id\":3,\"size\":5242880,\"stream\":1}\n");
  REQUIRE(t.ok());
  // BFC with 10 MiB: an 8 MiB region serves 1 and then 2 (BFC ignores
  // streams); 3 needs 8 MiB more: out of memory at event 3, line 5.
  auto bfc = Make("bfc", Cap(10 * kMiB));
  const ReplayResult r = Replay(t, *bfc, {});
  CHECK(r.oom);
  CHECK_EQ(r.oom_event, 3u);
  CHECK_EQ(r.oom_line, 5u);
  CHECK_EQ(r.oom_size, 5242880u);
  CHECK_EQ(r.oom_stream, 1u);
  CHECK_EQ(r.oom_live, 5242880u);
  CHECK_EQ(r.oom_reserved, 8 * kMiB);
  CHECK_EQ(r.events, 3u);  // replayed before it
  // torch with 40 MiB serves all of it (20 MiB segments on two streams).
  auto torch = Make("torch", Cap(40 * kMiB));
  CHECK(!Replay(t, *torch, {}).oom);
}

TEST(engine_replays_one_device) {
  const std::string header =
      "{\"format\":\"jaxlake-trace\",\"version\":1,\"devices\":2}\n";
  const Trace t = Jsonl(
      "{\"t\":0,\"op\":\"alloc\",\"id\":1,\"dev\":0,\"size\":1000}\n"
      "{\"t\":0,\"op\":\"alloc\",\"id\":1,\"dev\":1,\"size\":3000}\n"
      "{\"t\":1,\"op\":\"free\",\"id\":1,\"dev\":1}\n",
      false, header);
  REQUIRE(t.ok());
  auto p = Make("torch");
  ReplayOptions ro;
  ro.device = 1;
  const ReplayResult r = Replay(t, *p, ro);
  CHECK_EQ(r.events, 2u);
  CHECK_EQ(r.peak_live, 3000u);
}

// Every policy on a random trace of mixed sizes and streams, its
// invariants checked as it goes, with and without a tight capacity.
TEST(every_policy_keeps_its_invariants_on_a_random_trace) {
  std::mt19937_64 rng(7);
  std::string body;
  std::vector<std::uint64_t> live;
  std::uint64_t next_id = 1;
  for (int i = 0; i < 6000; ++i) {
    const bool alloc = live.empty() || (live.size() < 300 && rng() % 100 < 55);
    if (alloc) {
      std::uint64_t size;
      switch (rng() % 4) {
        case 0: size = 1 + rng() % 4096; break;
        case 1: size = 4096 + rng() % (1u << 20); break;
        case 2: size = (1u << 20) + rng() % (16u << 20); break;
        default: size = (16u << 20) + rng() % (200u << 20); break;
      }
      const std::uint64_t id = next_id++;
      live.push_back(id);
      body += "{\"t\":" + std::to_string(i) + ",\"op\":\"alloc\",\"id\":" +
              std::to_string(id) + ",\"size\":" + std::to_string(size) +
              ",\"stream\":" + std::to_string(rng() % 5 == 0 ? 1 : 0) + "}\n";
    } else {
      const std::size_t k = rng() % live.size();
      body += "{\"t\":" + std::to_string(i) + ",\"op\":\"free\",\"id\":" +
              std::to_string(live[k]) + "}\n";
      live[k] = live.back();
      live.pop_back();
    }
  }
  const Trace t = Jsonl(body);
  REQUIRE(t.ok());
  for (const std::string& name : jaxlake::replay::PolicyNames()) {
    for (std::size_t cap : {std::size_t{80} << 30, std::size_t{6} << 30}) {
      PolicyOptions o = Cap(cap);
      o.gmlake_frag_limit = 32 * kMiB;  // make GMLake stitch here
      auto p = Make(name, o);
      ReplayOptions ro;
      ro.check_every = 97;
      const ReplayResult r = Replay(t, *p, ro);
      if (!r.check_error.empty()) CHECK_EQ(name + ": " + r.check_error, name);
      CHECK(r.peak_reserved >= r.peak_live);
      if (!r.oom) CHECK_EQ(r.events, t.events.size());
      if (cap > (std::size_t{10} << 30)) CHECK(!r.oom);
    }
  }
}

}  // namespace

int main(int argc, char** argv) { return jaxlake::check::RunAll(argc, argv); }
