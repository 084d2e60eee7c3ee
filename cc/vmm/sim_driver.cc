// jaxlake: the simulated driver (rule checks, bookkeeping, streams, events).
//
// All state lives in State behind one mutex. Each entry point checks the
// rules of driver.h first, then calls the os_* hook of the backend, and only
// when that succeeded updates the bookkeeping, so a failing backend leaves
// the driver as it was.
//
// Status choices where driver.h leaves room:
//   * a misaligned or zero size, address or offset, a null output pointer,
//     an unknown or released handle, and a range that leaves its reservation
//     are kInvalidValue;
//   * unmap() of a range that is not exactly a run of whole, contiguous
//     mappings (a partial cover, a gap, a range starting or ending inside a
//     mapping) is kNotMapped, and so is set_access() of a range with any
//     unmapped byte;
//   * an event never recorded is complete.
#include "cc/vmm/sim_driver.h"

#include <algorithm>
#include <iterator>
#include <limits>
#include <utility>

namespace jaxlake::vmm {
namespace {

// First simulated reservation address: far above anything a test touches.
constexpr std::uintptr_t kSimBase = std::uintptr_t{1} << 44;

// Disjoint, coalesced half-open intervals [start, end), keyed by start.
using IntervalSet = std::map<std::uintptr_t, std::uintptr_t>;

void AddInterval(IntervalSet& set, std::uintptr_t start, std::uintptr_t end) {
  auto it = set.upper_bound(start);
  if (it != set.begin()) {
    auto prev = std::prev(it);
    if (prev->second >= start) {  // overlaps or touches: absorb it
      start = prev->first;
      end = std::max(end, prev->second);
      set.erase(prev);
    }
  }
  while (it != set.end() && it->first <= end) {
    end = std::max(end, it->second);
    it = set.erase(it);
  }
  set.emplace(start, end);
}

void RemoveInterval(IntervalSet& set, std::uintptr_t start,
                    std::uintptr_t end) {
  auto it = set.lower_bound(start);
  if (it != set.begin()) {
    auto prev = std::prev(it);  // prev->first < start
    if (prev->second > start) {
      const std::uintptr_t prev_end = prev->second;
      prev->second = start;
      if (prev_end > end) {
        set.emplace(end, prev_end);
        return;
      }
    }
  }
  while (it != set.end() && it->first < end) {
    if (it->second > end) {
      const std::uintptr_t tail_end = it->second;
      set.erase(it);
      set.emplace(end, tail_end);
      return;
    }
    it = set.erase(it);
  }
}

bool CoversInterval(const IntervalSet& set, std::uintptr_t start,
                    std::uintptr_t end) {
  auto it = set.upper_bound(start);
  if (it == set.begin()) return false;
  --it;
  return it->first <= start && it->second >= end;
}

}  // namespace

struct SimDriver::State {
  struct Mapping {
    std::size_t size = 0;
    std::size_t offset = 0;
    Handle handle = 0;
  };
  struct HandleInfo {
    std::size_t size = 0;
    std::size_t mappings = 0;  // live mappings of this handle
    bool released = false;
  };
  struct EventInfo {
    bool recorded = false;
    Stream stream = 0;
    std::uint64_t seq = 0;
  };
  struct StreamInfo {
    std::uint64_t recorded = 0;
    std::uint64_t completed = 0;
    bool held = false;
    bool until_waited = false;  // synchronize releases the hold
    std::uint64_t releases = 0;  // holds ended so far
  };

  explicit State(const SimOptions& o) : options(o), clock(o.latency) {}

  bool Aligned(std::uintptr_t x) const {
    return (x & (options.granularity - 1)) == 0;
  }
  bool GoodSize(std::size_t size) const { return size > 0 && Aligned(size); }
  // [va, va+size) does not wrap around the address space.
  static bool NoWrap(std::uintptr_t va, std::size_t size) {
    return size <= std::numeric_limits<std::uintptr_t>::max() - va;
  }
  // The reservation holding all of [va, end), or reservations.end().
  std::map<std::uintptr_t, std::size_t>::const_iterator ReservationOf(
      std::uintptr_t va, std::uintptr_t end) const {
    auto it = reservations.upper_bound(va);
    if (it == reservations.begin()) return reservations.end();
    --it;
    if (va < it->first || end > it->first + it->second)
      return reservations.end();
    return it;
  }
  // True when any mapping intersects [va, end).
  bool AnyMappingIn(std::uintptr_t va, std::uintptr_t end) const {
    auto it = mappings.lower_bound(va);
    if (it != mappings.end() && it->first < end) return true;
    if (it != mappings.begin()) {
      auto prev = std::prev(it);
      if (prev->first + prev->second.size > va) return true;
    }
    return false;
  }
  // True when every byte of [va, end) lies in some mapping.
  bool FullyMapped(std::uintptr_t va, std::uintptr_t end) const {
    auto it = mappings.upper_bound(va);
    if (it == mappings.begin()) return false;
    --it;
    std::uintptr_t covered = it->first;
    for (; it != mappings.end() && it->first == covered && covered < end;
         ++it) {
      covered += it->second.size;
    }
    return covered >= end && covered > va;
  }
  bool EventComplete(const EventInfo& e) const {
    if (!e.recorded) return true;
    auto it = streams.find(e.stream);
    return it != streams.end() && it->second.completed >= e.seq;
  }

  const SimOptions options;
  mutable std::mutex mu;
  std::condition_variable cv;  // signalled when a stream completes work

  std::uintptr_t next_va = kSimBase;  // simulated reservations only
  Handle next_handle = 1;
  Event next_event = 1;

  std::map<std::uintptr_t, std::size_t> reservations;  // start -> size
  std::map<std::uintptr_t, Mapping> mappings;          // start -> mapping
  IntervalSet access;  // ranges with access set (always inside mappings)
  std::unordered_map<Handle, HandleInfo> handles;  // memory still alive
  std::unordered_map<Event, EventInfo> events;
  std::unordered_map<Stream, StreamInfo> streams;

  std::size_t physical_bytes = 0;
  std::size_t mapped_bytes = 0;
  std::size_t reserved_bytes = 0;
  std::size_t live_handles = 0;
  DriverClock clock;  // modelled time of the calls (guarded by mu)
};

SimDriver::SimDriver(const SimOptions& options)
    : state_(std::make_unique<State>(options)) {}

SimDriver::~SimDriver() = default;

std::size_t SimDriver::granularity() const {
  return state_->options.granularity;
}

std::size_t SimDriver::total_memory() const {
  return state_->options.device_bytes;
}

// ---- address space ---------------------------------------------------------

Status SimDriver::do_reserve(std::size_t size, std::uintptr_t* va) {
  State& s = *state_;
  if (va == nullptr || !s.GoodSize(size)) return Status::kInvalidValue;
  std::lock_guard<std::mutex> lock(s.mu);
  s.clock.charge(Call::reserve, size);
  std::uintptr_t start = 0;
  const Status st = os_reserve(size, &start);
  if (st != Status::kOk) return st;
  s.reservations.emplace(start, size);
  s.reserved_bytes += size;
  *va = start;
  return Status::kOk;
}

Status SimDriver::do_address_free(std::uintptr_t va, std::size_t size) {
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mu);
  s.clock.charge(Call::address_free, size);
  auto it = s.reservations.find(va);
  if (it == s.reservations.end() || it->second != size)
    return Status::kInvalidValue;
  if (s.AnyMappingIn(va, va + size)) return Status::kBusy;
  const Status st = os_address_free(va, size);
  if (st != Status::kOk) return st;
  s.reservations.erase(it);
  s.reserved_bytes -= size;
  return Status::kOk;
}

// ---- physical memory -------------------------------------------------------

Status SimDriver::do_create(std::size_t size, Handle* handle) {
  State& s = *state_;
  if (handle == nullptr || !s.GoodSize(size)) return Status::kInvalidValue;
  std::lock_guard<std::mutex> lock(s.mu);
  s.clock.charge(Call::create, size);
  if (size > s.options.device_bytes - std::min(s.physical_bytes,
                                               s.options.device_bytes))
    return Status::kOutOfMemory;
  const Handle h = s.next_handle++;
  const Status st = os_create(size, h);
  if (st != Status::kOk) return st;
  s.handles.emplace(h, State::HandleInfo{size, 0, false});
  s.physical_bytes += size;
  ++s.live_handles;
  *handle = h;
  return Status::kOk;
}

Status SimDriver::do_release(Handle handle) {
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.handles.find(handle);
  s.clock.charge(Call::release,
                 it == s.handles.end() ? 0 : it->second.size);
  if (it == s.handles.end() || it->second.released)
    return Status::kInvalidValue;
  os_release_handle(handle);
  it->second.released = true;
  --s.live_handles;
  if (it->second.mappings == 0) {
    os_release_memory(handle);
    s.physical_bytes -= it->second.size;
    s.handles.erase(it);
  }
  return Status::kOk;
}

// ---- mappings --------------------------------------------------------------

Status SimDriver::do_map(std::uintptr_t va, std::size_t size,
                         std::size_t offset, Handle handle) {
  State& s = *state_;
  if (!s.Aligned(va) || !s.GoodSize(size) || !s.Aligned(offset) ||
      !State::NoWrap(va, size))
    return Status::kInvalidValue;
  std::lock_guard<std::mutex> lock(s.mu);
  s.clock.charge(Call::map, size);
  auto h = s.handles.find(handle);
  if (h == s.handles.end() || h->second.released ||
      offset > h->second.size || size > h->second.size - offset)
    return Status::kInvalidValue;
  const std::uintptr_t end = va + size;
  if (s.ReservationOf(va, end) == s.reservations.end())
    return Status::kInvalidValue;
  if (s.AnyMappingIn(va, end)) return Status::kAlreadyMapped;
  const Status st = os_map(va, size, offset, handle);
  if (st != Status::kOk) return st;
  s.mappings.emplace(va, State::Mapping{size, offset, handle});
  ++h->second.mappings;
  s.mapped_bytes += size;
  return Status::kOk;
}

Status SimDriver::do_unmap(std::uintptr_t va, std::size_t size) {
  State& s = *state_;
  if (!s.Aligned(va) || !s.GoodSize(size) || !State::NoWrap(va, size))
    return Status::kInvalidValue;
  std::lock_guard<std::mutex> lock(s.mu);
  const std::uintptr_t end = va + size;
  // The range must be a run of whole mappings, the first starting at va and
  // the last ending at end, with no gap between them.
  auto first = s.mappings.find(va);
  if (first == s.mappings.end()) {
    s.clock.charge(Call::unmap, size);
    return Status::kNotMapped;
  }
  auto last = first;
  std::uintptr_t covered = va;
  std::uint64_t handles = 0;
  while (last != s.mappings.end() && last->first == covered &&
         covered < end) {
    covered += last->second.size;
    ++handles;
    ++last;
  }
  // Unmapping costs per handle (latency.h): one charge per mapping.
  s.clock.charge(Call::unmap, size, 1, covered == end ? handles : 1);
  if (covered != end) return Status::kNotMapped;
  const Status st = os_unmap(va, size);
  if (st != Status::kOk) return st;
  for (auto it = first; it != last;) {
    auto h = s.handles.find(it->second.handle);
    if (h != s.handles.end() && --h->second.mappings == 0 &&
        h->second.released) {
      os_release_memory(h->first);
      s.physical_bytes -= h->second.size;
      s.handles.erase(h);
    }
    s.mapped_bytes -= it->second.size;
    it = s.mappings.erase(it);
  }
  RemoveInterval(s.access, va, end);
  return Status::kOk;
}

Status SimDriver::do_set_access(std::uintptr_t va, std::size_t size) {
  State& s = *state_;
  if (!s.Aligned(va) || !s.GoodSize(size) || !State::NoWrap(va, size))
    return Status::kInvalidValue;
  std::lock_guard<std::mutex> lock(s.mu);
  s.clock.charge(Call::set_access, size);
  const std::uintptr_t end = va + size;
  if (!s.FullyMapped(va, end)) return Status::kNotMapped;
  const Status st = os_set_access(va, size);
  if (st != Status::kOk) return st;
  AddInterval(s.access, va, end);
  return Status::kOk;
}

// ---- streams and events ----------------------------------------------------

Status SimDriver::do_event_create(Event* event) {
  State& s = *state_;
  if (event == nullptr) return Status::kInvalidValue;
  std::lock_guard<std::mutex> lock(s.mu);
  s.clock.charge(Call::event_create, 0);
  const Event e = s.next_event++;
  s.events.emplace(e, State::EventInfo{});
  *event = e;
  return Status::kOk;
}

Status SimDriver::do_event_destroy(Event event) {
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mu);
  s.clock.charge(Call::event_destroy, 0);
  return s.events.erase(event) == 1 ? Status::kOk : Status::kInvalidValue;
}

Status SimDriver::do_event_record(Event event, Stream stream) {
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mu);
  s.clock.charge(Call::event_record, 0);
  auto e = s.events.find(event);
  if (e == s.events.end()) return Status::kInvalidValue;
  State::StreamInfo& st = s.streams[stream];
  e->second.recorded = true;
  e->second.stream = stream;
  e->second.seq = ++st.recorded;
  if (!st.held) st.completed = st.recorded;
  return Status::kOk;
}

Status SimDriver::do_event_query(Event event) {
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mu);
  s.clock.charge(Call::event_query, 0);
  auto e = s.events.find(event);
  if (e == s.events.end()) return Status::kInvalidValue;
  return s.EventComplete(e->second) ? Status::kOk : Status::kNotReady;
}

Status SimDriver::do_event_synchronize(Event event) {
  State& s = *state_;
  std::unique_lock<std::mutex> lock(s.mu);
  s.clock.charge(Call::event_synchronize, 0);
  auto e = s.events.find(event);
  if (e == s.events.end()) return Status::kInvalidValue;
  // Wait for what the event stands for now: destroying or re-recording the
  // event while this thread waits does not change the target.
  const State::EventInfo target = e->second;
  if (!s.EventComplete(target)) {
    State::StreamInfo& st = s.streams[target.stream];
    if (st.held && st.until_waited) {
      st.held = st.until_waited = false;
      ++st.releases;
      st.completed = st.recorded;
      s.cv.notify_all();
      return Status::kOk;
    }
  }
  s.cv.wait(lock, [&] { return s.EventComplete(target); });
  return Status::kOk;
}

void SimDriver::hold_stream(Stream stream, bool until_waited) {
  std::lock_guard<std::mutex> lock(state_->mu);
  State::StreamInfo& st = state_->streams[stream];
  st.held = true;
  st.until_waited = until_waited;
}

std::uint64_t SimDriver::stream_releases(Stream stream, bool* held) const {
  std::lock_guard<std::mutex> lock(state_->mu);
  auto it = state_->streams.find(stream);
  if (held) *held = it != state_->streams.end() && it->second.held;
  return it == state_->streams.end() ? 0 : it->second.releases;
}

bool SimDriver::stream_held(Stream stream) const {
  std::lock_guard<std::mutex> lock(state_->mu);
  auto it = state_->streams.find(stream);
  return it != state_->streams.end() && it->second.held;
}

void SimDriver::release_stream(Stream stream) {
  State& s = *state_;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    State::StreamInfo& st = s.streams[stream];
    if (st.held) ++st.releases;
    st.held = st.until_waited = false;
    st.completed = st.recorded;
  }
  s.cv.notify_all();
}

// ---- introspection ---------------------------------------------------------

CallTimes SimDriver::driver_us() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->clock.times();
}

std::size_t SimDriver::physical_bytes() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->physical_bytes;
}

std::size_t SimDriver::mapped_bytes() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->mapped_bytes;
}

std::size_t SimDriver::reserved_bytes() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->reserved_bytes;
}

std::size_t SimDriver::live_handles() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->live_handles;
}

std::size_t SimDriver::live_events() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->events.size();
}

bool SimDriver::accessible(std::uintptr_t va, std::size_t size) const {
  if (size == 0 || !State::NoWrap(va, size)) return false;
  std::lock_guard<std::mutex> lock(state_->mu);
  // Access is only ever set inside mappings and dropped by unmap, so covered
  // by the access set means mapped as well.
  return CoversInterval(state_->access, va, va + size);
}

// ---- default hooks: address bookkeeping only -------------------------------

Status SimDriver::os_reserve(std::size_t size, std::uintptr_t* va) {
  State& s = *state_;
  const std::uintptr_t g = s.options.granularity;
  if (s.next_va > std::numeric_limits<std::uintptr_t>::max() - (g - 1))
    return Status::kOutOfMemory;
  const std::uintptr_t start = (s.next_va + (g - 1)) & ~(g - 1);
  if (!State::NoWrap(start, size)) return Status::kOutOfMemory;
  s.next_va = start + size;
  *va = start;
  return Status::kOk;
}

Status SimDriver::os_address_free(std::uintptr_t, std::size_t) {
  return Status::kOk;
}

Status SimDriver::os_create(std::size_t, Handle) { return Status::kOk; }

void SimDriver::os_release_memory(Handle) {}

void SimDriver::os_release_handle(Handle) {}

Status SimDriver::os_map(std::uintptr_t, std::size_t, std::size_t, Handle) {
  return Status::kOk;
}

Status SimDriver::os_unmap(std::uintptr_t, std::size_t) { return Status::kOk; }

Status SimDriver::os_set_access(std::uintptr_t, std::size_t) {
  return Status::kOk;
}

}  // namespace jaxlake::vmm
