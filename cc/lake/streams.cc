// jaxlake: stream ordering: free tags and the events that fence them.
#include "cc/lake/lake_impl.h"

namespace jaxlake {

// Records (if needed) and queries one event per stream with unfenced
// frees, skipping stream `except` (its own frees are usable by it at
// once). Never blocks. Returns true if any stream made progress. A
// workload on one stream never gets here with anything to do, so it
// records no events at all.
bool Lake::Impl::AdvanceStreams(std::optional<Stream> except) {
  bool progress = false;
  for (auto& [s, ss] : streams) {
    if (except && *except == s) continue;
    // Twice: a completed event may leave later frees to fence.
    for (int i = 0; i < 2 && ss.completed < ss.free_seq; ++i) {
      if (!ss.pending) {
        if (ss.event == 0 && drv.event_create(&ss.event) != Status::kOk) {
          ss.event = 0;
          ++st.driver_errors;
          break;
        }
        if (drv.event_record(ss.event, s) != Status::kOk) {
          ++st.driver_errors;
          break;
        }
        ss.pending = true;
        ss.event_seq = ss.free_seq;
        ++ss.records;
      }
      if (drv.event_query(ss.event) != Status::kOk) break;
      ss.pending = false;
      Complete(ss, ss.event_seq);
      progress = true;
    }
  }
  return progress;
}

// Waits (lock released) for every pending stream event. Returns true if
// something completed.
//
// Each wait completes only the frees its event covered when the wait
// began (event_seq of that record): while the lock is released, another
// call may see the event complete and record it again for newer frees,
// which this wait says nothing about. Synchronizing an event waits for
// its latest record, which covers at least the frees of the earlier one.
bool Lake::Impl::WaitStreams(std::unique_lock<std::mutex>& lk) {
  AdvanceStreams();
  struct Wait {
    Stream stream;
    Event event;
    std::uint64_t seq;      // frees covered by the record waited for
    std::uint64_t records;  // which record that was
  };
  std::vector<Wait> waits;
  for (auto& [s, ss] : streams)
    if (ss.pending) waits.push_back(Wait{s, ss.event, ss.event_seq,
                                         ss.records});
  if (waits.empty()) return false;
  lk.unlock();
  std::vector<bool> ok(waits.size());
  for (std::size_t i = 0; i < waits.size(); ++i)
    ok[i] = drv.event_synchronize(waits[i].event) == Status::kOk;
  lk.lock();
  bool progress = false;
  for (std::size_t i = 0; i < waits.size(); ++i) {
    ++st.event_waits;
    if (!ok[i]) {
      ++st.driver_errors;
      continue;
    }
    StreamState& ss = streams[waits[i].stream];
    if (ss.event != waits[i].event) continue;
    if (waits[i].seq > ss.completed) progress = true;
    Complete(ss, waits[i].seq);
    // The record waited for is the pending one only if nobody recorded
    // the event again meanwhile; a newer record stays pending.
    if (ss.pending && ss.records == waits[i].records) ss.pending = false;
  }
  return progress;
}

}  // namespace jaxlake
