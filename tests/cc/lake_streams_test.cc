// Tests of stream ordering (cc/lake/stream_clock.h): reuse across streams
// waits for the free's event, waits complete only what they waited for,
// destruction waits for work in flight, and the StreamClock class on its
// own.
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "cc/lake/stream_clock.h"
#include "tests/cc/check.h"
#include "tests/cc/test_util.h"

// The tests live in jaxlake::testing, where the lake, its options and
// the helpers of test_util.h need no qualification.
namespace jaxlake::testing {
namespace {

TEST(cross_stream_reuse_waits_for_the_event) {
  jaxlake::vmm::SimDriver drv(SmallDevice());
  Lake lake(drv, Capped(64 * kMiB));
  auto a = FreedInFlight(drv, lake, 8 * kMiB);
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
  jaxlake::vmm::SimDriver drv(SmallDevice());
  Lake lake(drv, Capped(8 * kMiB));
  auto a = FreedInFlight(drv, lake, 8 * kMiB);
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
  UnmapWatch drv(SmallDevice());
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

TEST(release_cached_waits_for_work_in_flight) {
  // What empty_cache() leaves because its last use is queued,
  // release_cached() (memory pressure from outside the lake) releases once
  // that work ran, never while it is held.
  UnmapWatch drv(SmallDevice());
  Lake lake(drv, Capped(64 * kMiB));
  drv.hold_stream(1, /*until_waited=*/true);
  auto a = Alloc(lake, 8 * kMiB, nullptr, 1);
  CHECK(lake.free(a, 1) == Status::kOk);
  CHECK_EQ(lake.empty_cache(), 0u);
  CHECK(lake.release_cached() >= 8 * kMiB);
  CHECK(drv.unmaps >= 1);
  CHECK_EQ(drv.unmaps_while_held, 0);
  CHECK_EQ(drv.physical_bytes(), 0u);
  CHECK_EQ(lake.stats().bytes_reserved.current, 0);
  CHECK_EQ(lake.check(), std::string());
}

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

// ---- the StreamClock class on its own (cc/lake/stream_clock.h) -----------

// A clock over a sim driver, with the counters it adds to.
struct Clock {
  SimDriver drv{SmallDevice()};
  std::uint64_t changes = 0, driver_errors = 0, event_waits = 0;
  detail::StreamClock clock{drv, {&changes, &driver_errors, &event_waits}};
};

TEST(stream_clock_tags_count_each_streams_frees) {
  Clock c;
  CHECK(c.clock.OnlyStream(1));  // nothing freed yet
  const detail::Tag a = c.clock.FreeTag(1), b = c.clock.FreeTag(1);
  CHECK_EQ(a.stream, 1u);
  CHECK_EQ(a.seq, 1u);
  CHECK_EQ(b.seq, 2u);
  CHECK(c.clock.OnlyStream(1));
  CHECK(!c.clock.OnlyStream(2));
  const detail::Tag x = c.clock.FreeTag(2);
  CHECK_EQ(x.seq, 1u);  // a sequence per stream
  CHECK(!c.clock.OnlyStream(1));
  // A free is usable by its own stream at once, by another only once safe;
  // a tag never used (seq 0) is safe for everyone.
  CHECK(c.clock.Usable(a, 1));
  CHECK(!c.clock.Safe(a));
  CHECK(!c.clock.Usable(a, 2));
  CHECK(c.clock.Safe(detail::Tag{}));
  CHECK_EQ(c.drv.live_events(), 0u);  // tags alone make no event
  CHECK_EQ(c.clock.CheckInvariants(), std::string());
}

TEST(stream_clock_advance_records_one_event_and_never_blocks) {
  Clock c;
  c.drv.hold_stream(1);
  const detail::Tag a = c.clock.FreeTag(1);
  CHECK(!c.clock.Advance());  // recorded, queried: still in flight
  CHECK_EQ(c.drv.live_events(), 1u);
  CHECK(!c.clock.Safe(a));
  const detail::Tag b = c.clock.FreeTag(1);
  CHECK(!c.clock.Advance());  // the pending record covers a only
  CHECK_EQ(c.drv.calls(Call::event_record), 1u);
  CHECK_EQ(c.changes, 0u);
  c.drv.release_stream(1);
  CHECK(c.clock.Advance());  // a's record completes, b's is recorded
  CHECK(c.clock.Safe(a));
  CHECK(c.clock.Safe(b));
  CHECK_EQ(c.drv.calls(Call::event_record), 2u);
  CHECK_EQ(c.changes, 2u);
  // A stream that is skipped stays as it is.
  const detail::Tag d = c.clock.FreeTag(1);
  CHECK(!c.clock.Advance(1));
  CHECK(!c.clock.Safe(d));
  CHECK_EQ(c.driver_errors, 0u);
  CHECK_EQ(c.clock.CheckInvariants(), std::string());
  c.clock.DestroyEvents();
  CHECK_EQ(c.drv.live_events(), 0u);
}

TEST(stream_clock_wait_completes_only_the_record_waited_for) {
  Clock c;
  c.drv.hold_stream(1, /*until_waited=*/true);
  const detail::Tag a = c.clock.FreeTag(1);
  std::vector<detail::StreamClock::Wait> waits = c.clock.PendingWaits();
  CHECK_EQ(waits.size(), 1u);
  CHECK_EQ(waits[0].seq, a.seq);
  // Meanwhile (the owner's lock released) the stream frees again.
  const detail::Tag b = c.clock.FreeTag(1);
  detail::StreamClock::Synchronize(c.drv, &waits);
  CHECK(waits[0].ok);
  CHECK(c.clock.FinishWaits(waits));
  CHECK(c.clock.Safe(a));
  CHECK(!c.clock.Safe(b));  // not covered by the record waited for
  CHECK_EQ(c.event_waits, 1u);
  // The hold ended with the wait: the next advance completes b.
  CHECK(c.clock.PendingWaits().empty());
  CHECK(c.clock.Safe(b));
  CHECK_EQ(c.clock.CheckInvariants(), std::string());
  c.clock.DestroyEvents();
}

}  // namespace
}  // namespace jaxlake::testing

int main(int argc, char** argv) { return jaxlake::check::RunAll(argc, argv); }
