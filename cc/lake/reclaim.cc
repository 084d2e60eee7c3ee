// jaxlake: reclaim: releasing driver resources (and retrying failed
// releases), releasing free segments, empty_cache.
#include "cc/lake/lake_impl.h"

namespace jaxlake {

// Waits (lock released) for every pending stream event. Returns true if
// something completed (StreamClock::FinishWaits says which frees).
bool Lake::Impl::WaitStreams(MutexLock& lk) {
  std::vector<StreamClock::Wait> waits = clock.PendingWaits();
  if (waits.empty()) return false;
  Unlock(lk);
  StreamClock::Synchronize(drv, &waits);
  Relock(lk);
  return clock.FinishWaits(waits);
}

// Calls the driver (lock released) for what is left of `u`, in order, and
// keeps in `u` what still failed. Returns kOk or the first failure, whose
// call is named in *what.
Status Lake::Impl::Teardown(Unreleased& u, const char** what) {
  Status first = Status::kOk;
  auto fail = [&](Status s, const char* call) {
    if (first == Status::kOk) {
      first = s;
      if (what) *what = call;
    }
  };
  std::size_t keep = 0;
  for (std::size_t i = 0; i < u.maps.size(); ++i) {
    const Status s = drv.unmap(u.maps[i].first, u.maps[i].second);
    if (s != Status::kOk) {
      fail(s, "unmap");
      u.maps[keep++] = u.maps[i];
    }
  }
  u.maps.resize(keep);
  if (u.handle != 0) {
    const Status s = drv.release(u.handle);
    if (s == Status::kOk)
      u.handle = 0;
    else
      fail(s, "release");
  }
  if (u.va != 0 && u.maps.empty()) {
    const Status s = drv.address_free(u.va, u.va_bytes);
    if (s == Status::kOk)
      u.va = 0;
    else
      fail(s, "address_free");
  }
  return first;
}

// Keeps what a failed teardown left (lock held), to retry later.
void Lake::Impl::Keep(Unreleased&& u) {
  if (u.done()) return;
  st.bytes_unreleased.add(static_cast<std::int64_t>(u.held()));
  st.unreleased.add(1);
  unreleased.push_back(std::move(u));
}

// Retries every kept resource (lock released meanwhile). Returns the
// physical bytes the driver gave back. On a failure, *status (if kOk) and
// *error (if empty) take the first one.
std::size_t Lake::Impl::RetryUnreleased(MutexLock& lk,
                                        Status* status, std::string* error) {
  if (unreleased.empty()) return 0;
  std::vector<Unreleased> work = std::move(unreleased);
  unreleased.clear();
  std::vector<std::size_t> before;
  for (const Unreleased& u : work) before.push_back(u.held());
  std::size_t held_before = 0;
  for (std::size_t b : before) held_before += b;
  retrying += work.size();
  retrying_held += held_before;
  Unlock(lk);
  Status first = Status::kOk;
  const char* what = "";
  std::uint64_t failures = 0;
  for (Unreleased& u : work) {
    const char* w = "";
    const Status s = Teardown(u, &w);
    if (s == Status::kOk) continue;
    ++failures;
    if (first == Status::kOk) {
      first = s;
      what = w;
    }
  }
  Relock(lk);
  retrying -= work.size();
  retrying_held -= held_before;
  std::size_t freed = 0;
  for (std::size_t i = 0; i < work.size(); ++i) {
    const std::size_t after = work[i].held();
    freed += before[i] - after;
    st.bytes_unreleased.add(static_cast<std::int64_t>(after) -
                            static_cast<std::int64_t>(before[i]));
    if (work[i].done()) {
      st.unreleased.add(-1);
      ++changes;
    } else {
      if (after != before[i]) ++changes;
      unreleased.push_back(std::move(work[i]));
    }
  }
  st.driver_errors += failures;
  if (first != Status::kOk) Report(first, what, status, error);
  return freed;
}

// Passes a release failure to a caller that asked for the release.
void Lake::Impl::Report(Status s, const char* what, Status* status,
                        std::string* error) {
  if (status && *status == Status::kOk) *status = s;
  if (error && error->empty())
    *error = std::string("driver call ") + what + " failed (" +
             vmm::StatusName(s) + ")";
}

// Releases every segment that is wholly free, safe and not mapped by a
// stitched range (merging free neighbours first). Returns the bytes the
// driver gave back; a driver failure keeps the rest for a retry and is
// passed to *status / *error when given.
std::size_t Lake::Impl::ReleaseFreeSegments(MutexLock& lk,
                                            Status* status,
                                            std::string* error) {
  Coalesce();
  std::vector<std::uint64_t> ids;
  for (auto [id, seg] : segs) {
    const Block& first = seg.blocks.begin()->second;
    if (seg.stitch_refs == 0 && seg.blocks.size() == 1 &&
        first.state == BlockState::kFree && clock.Safe(first.tag)) {
      IndexRemove(id, 0, first);
      ids.push_back(id);
    }
  }
  std::vector<std::unique_ptr<Segment>> doomed;
  for (std::uint64_t id : ids) {
    doomed.push_back(segs.remove(id));
    seg_by_va.erase(doomed.back()->va);
    if (doomed.back()->open_end) open_ends.erase(EndOf(*doomed.back()));
  }
  // A growth range left with no segment (a failed growth emptied it) is
  // freed too.
  std::vector<std::pair<std::uintptr_t, std::size_t>> empty;
  for (auto it = ranges.begin(); it != ranges.end();) {
    if (it->second.segments != 0) {
      ++it;
      continue;
    }
    empty.emplace_back(it->first, it->second.bytes);
    if (current_range == it->first) current_range = 0;
    it = ranges.erase(it);
  }
  if (doomed.empty() && empty.empty()) return 0;
  std::vector<Unreleased> undo(doomed.size() + empty.size());
  for (std::size_t i = 0; i < doomed.size(); ++i) {
    const Segment& seg = *doomed[i];
    const std::size_t bytes = std::size_t{seg.nchunks} * gran;
    st.bytes_reserved.add(-static_cast<std::int64_t>(bytes));
    st.segments.add(-1);
    ++st.segments_released;
    undo[i].maps.emplace_back(seg.va, bytes);
    undo[i].handle = seg.handle;
    undo[i].phys = bytes;
  }
  for (std::size_t i = 0; i < empty.size(); ++i) {
    undo[doomed.size() + i].va = empty[i].first;
    undo[doomed.size() + i].va_bytes = empty[i].second;
  }
  // Whatever fails below stays counted (bytes_unreleased) until a retry
  // succeeds; only what the driver gave back is reported released. Until
  // the driver answers, the bytes still count against the capacity.
  std::size_t releasing = 0;
  for (const Unreleased& u : undo) releasing += u.phys;
  releasing_bytes += releasing;
  Unlock(lk);
  std::vector<Status> result(undo.size());
  const char* what = "";
  for (std::size_t i = 0; i < undo.size(); ++i) {
    const char* w = "";
    result[i] = Teardown(undo[i], &w);
    if (result[i] != Status::kOk && *what == '\0') what = w;
  }
  Relock(lk);
  releasing_bytes -= releasing;
  ++releases;
  created.notify_all();
  ++changes;
  // A segment leaves its growth range only now, after its unmap: another
  // thread may be unmapping a segment of the same range meanwhile, and the
  // range's reservation is freed only when the last of them is done (in a
  // second round, with the lock released again). When the last one's unmap
  // failed, its kept remains free the reservation after unmapping.
  std::vector<Unreleased> ranges_undo;
  for (std::size_t i = 0; i < doomed.size(); ++i) {
    if (doomed[i]->range == 0) continue;
    Unreleased u;
    LeaveRange(*doomed[i], &u.va, &u.va_bytes);
    if (u.va == 0) continue;
    if (undo[i].maps.empty()) {
      ranges_undo.push_back(std::move(u));
    } else {
      undo[i].va = u.va;
      undo[i].va_bytes = u.va_bytes;
    }
  }
  std::size_t released = 0;
  Status first = Status::kOk;
  for (std::size_t i = 0; i < undo.size(); ++i) {
    if (result[i] == Status::kOk) {
      released += undo[i].phys;
      continue;
    }
    ++st.driver_errors;
    if (first == Status::kOk) first = result[i];
    released += undo[i].phys - undo[i].held();
    Keep(std::move(undo[i]));
  }
  if (first != Status::kOk) Report(first, what, status, error);
  if (!ranges_undo.empty()) {
    Unlock(lk);
    std::vector<Status> rs(ranges_undo.size());
    const char* rwhat = "";
    for (std::size_t i = 0; i < ranges_undo.size(); ++i)
      rs[i] = Teardown(ranges_undo[i], &rwhat);
    Relock(lk);
    for (std::size_t i = 0; i < ranges_undo.size(); ++i) {
      if (rs[i] == Status::kOk) continue;
      ++st.driver_errors;
      Report(rs[i], rwhat, status, error);
      Keep(std::move(ranges_undo[i]));
    }
  }
  return released;
}

void Lake::Impl::FenceFrees() {
  // Whatever the streams' state (another call may have advanced them
  // already): bring back small ranges freed on other streams, then fence
  // the frees that made (and the slabs they emptied).
  clock.Advance();
  if (small.HasDeferred()) {
    FlushDeferredSmall();
    clock.Advance();
  }
}

// The lake emptied near its capacity (Lake::free): releases what is free,
// waiting for the streams' pending frees as reclaim does (the lock is
// released meanwhile), so that the next run grows as on a fresh lake.
void Lake::Impl::Restart(MutexLock& lk) {
  restart_pending = false;
  if (st.live_allocations.current != 0) return;
  FenceFrees();
  WaitStreams(lk);
  TrimCache(lk, 0);
  ReleaseFreeSegments(lk);  // merges first
  // What another thread took meanwhile stays, and so does what the driver
  // refused to release (kept and retried as always).
  held_high = static_cast<std::size_t>(st.bytes_reserved.current);
  if (st.live_allocations.current == 0) freed_since_growth = false;
}

std::size_t Lake::empty_cache(Status* status) {
  Impl& m = *impl_;
  MutexLock lk(m.mu);
  Status first = Status::kOk;
  std::string error;
  m.FenceFrees();
  std::size_t released = m.RetryUnreleased(lk, &first, &error);
  m.TrimCache(lk, 0, &first, &error);
  released += m.ReleaseFreeSegments(lk, &first, &error);  // merges first
  m.held_high = static_cast<std::size_t>(m.st.bytes_reserved.current);
  if (first != Status::kOk) {
    m.last_error = "empty_cache: " + error + "; " +
                   std::to_string(m.st.unreleased.current) +
                   " driver resources (" +
                   Bytes(static_cast<std::size_t>(
                       m.st.bytes_unreleased.current)) +
                   " of memory) are kept and retried by the next "
                   "empty_cache(): " +
                   m.Describe();
  }
  if (status) *status = first;
  m.DebugCheck();
  return released;
}

std::size_t Lake::release_cached() {
  Impl& m = *impl_;
  {
    MutexLock lk(m.mu);
    m.FenceFrees();
    m.WaitStreams(lk);
  }
  return empty_cache();
}

}  // namespace jaxlake
