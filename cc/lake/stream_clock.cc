// jaxlake: the stream clock (stream_clock.h): free tags and the events
// that fence them.
#include "cc/lake/stream_clock.h"

#include <sstream>

namespace jaxlake {
namespace detail {

// A workload on one stream never gets here with anything to do, so it
// records no events at all.
bool StreamClock::Advance(std::optional<Stream> except) {
  bool progress = false;
  for (auto& [s, ss] : streams_) {
    if (except && *except == s) continue;
    // Twice: a completed event may leave later frees to fence.
    for (int i = 0; i < 2 && ss.completed < ss.free_seq; ++i) {
      if (!ss.pending) {
        if (ss.event == 0 && drv_.event_create(&ss.event) != Status::kOk) {
          ss.event = 0;
          ++*counters_.driver_errors;
          break;
        }
        if (drv_.event_record(ss.event, s) != Status::kOk) {
          ++*counters_.driver_errors;
          break;
        }
        ss.pending = true;
        ss.event_seq = ss.free_seq;
        ++ss.records;
      }
      if (drv_.event_query(ss.event) != Status::kOk) break;
      ss.pending = false;
      Complete(ss, ss.event_seq);
      progress = true;
    }
  }
  return progress;
}

// Each wait completes only the frees its event covered when the wait
// began (event_seq of that record): while the owner's lock is released,
// another call may see the event complete and record it again for newer
// frees, which this wait says nothing about. Synchronizing an event waits
// for its latest record, which covers at least the frees of the earlier
// one.
std::vector<StreamClock::Wait> StreamClock::PendingWaits() {
  Advance();
  std::vector<Wait> waits;
  for (auto& [s, ss] : streams_)
    if (ss.pending)
      waits.push_back(Wait{s, ss.event, ss.event_seq, ss.records});
  return waits;
}

void StreamClock::Synchronize(vmm::Driver& drv, std::vector<Wait>* waits) {
  for (Wait& w : *waits) w.ok = drv.event_synchronize(w.event) == Status::kOk;
}

bool StreamClock::FinishWaits(const std::vector<Wait>& waits) {
  bool progress = false;
  for (const Wait& w : waits) {
    ++*counters_.event_waits;
    if (!w.ok) {
      ++*counters_.driver_errors;
      continue;
    }
    StreamState& ss = streams_[w.stream];
    if (ss.event != w.event) continue;
    if (w.seq > ss.completed) progress = true;
    Complete(ss, w.seq);
    // The record waited for is the pending one only if nobody recorded
    // the event again meanwhile; a newer record stays pending.
    if (ss.pending && ss.records == w.records) ss.pending = false;
  }
  return progress;
}

void StreamClock::DestroyEvents() {
  for (auto& [s, ss] : streams_)
    if (ss.event && drv_.event_destroy(ss.event) != Status::kOk)
      drv_.event_destroy(ss.event);
}

std::string StreamClock::CheckInvariants() const {
  std::ostringstream e;
  for (const auto& [s, ss] : streams_) {
    if (ss.completed > ss.free_seq || ss.event_seq > ss.free_seq) {
      e << "stream " << s << " has " << ss.completed << " frees complete and "
        << ss.event_seq << " fenced of " << ss.free_seq;
      return e.str();
    }
    if (ss.pending && (ss.event == 0 || ss.records == 0)) {
      e << "stream " << s << " waits for an event never recorded";
      return e.str();
    }
  }
  if (last_state_ != nullptr && (!streams_.count(last_stream_) ||
                                 &streams_.at(last_stream_) != last_state_)) {
    e << "stream clock's last state is not stream " << last_stream_ << "'s";
    return e.str();
  }
  return e.str();
}

}  // namespace detail
}  // namespace jaxlake
