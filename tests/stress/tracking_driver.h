// jaxlake stress harness: a driver that tracks where memory lives.
//
// TrackingDriver forwards every call to an inner driver and remembers each
// successful mapping (address range -> handle and offset). Resolve() turns a
// range of addresses into the physical (handle, offset) ranges behind it, so
// the harness can see two live allocations share memory even when they use
// different virtual addresses (a stitched range and a primary block map the
// same chunks).
//
// Tracker keeps the physical ranges of the live allocations and of memory
// freed on a stream whose work is still in flight, and reports
//   * an overlap: a new allocation shares memory with a live one;
//   * a cross-stream reuse: a new allocation on stream s shares memory freed
//     on stream t != s while t's work is still in flight.
// Work is in flight while the stream is held in the SimDriver: memory freed
// on a held stream is still in use until that hold ends
// (SimDriver::stream_releases counts the holds that ended). An allocation
// on the freeing stream itself takes such memory over: its work is ordered
// after the old work on that stream.
#ifndef JAXLAKE_TESTS_STRESS_TRACKING_DRIVER_H_
#define JAXLAKE_TESTS_STRESS_TRACKING_DRIVER_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "cc/vmm/driver.h"
#include "cc/vmm/sim_driver.h"

namespace jaxlake::stress {

using vmm::Event;
using vmm::Handle;
using vmm::Status;
using vmm::Stream;

struct PhysRange {
  Handle handle;
  std::size_t begin, end;  // byte offsets in the handle
};

class TrackingDriver : public vmm::Driver {
 public:
  explicit TrackingDriver(vmm::Driver& inner) : inner_(inner) {}
  const char* name() const override { return "tracking"; }
  std::size_t granularity() const override { return inner_.granularity(); }
  std::size_t total_memory() const override { return inner_.total_memory(); }

  // The physical ranges behind [va, va+size), in address order; false if
  // some byte of it is not mapped.
  bool Resolve(std::uintptr_t va, std::size_t size,
               std::vector<PhysRange>* out) const {
    std::lock_guard<std::mutex> lock(mu_);
    const std::uintptr_t end = va + size;
    auto it = maps_.upper_bound(va);
    if (it == maps_.begin()) return false;
    --it;
    std::uintptr_t at = va;
    while (at < end) {
      if (it == maps_.end() || it->first > at ||
          it->first + it->second.size <= at)
        return false;
      const std::uintptr_t stop = std::min(end, it->first + it->second.size);
      const std::size_t off = it->second.offset + (at - it->first);
      out->push_back(PhysRange{it->second.handle, off, off + (stop - at)});
      at = stop;
      ++it;
    }
    return true;
  }

  std::size_t mappings() const {
    std::lock_guard<std::mutex> lock(mu_);
    return maps_.size();
  }

 protected:
  Status do_reserve(std::size_t size, std::uintptr_t* va) override {
    return inner_.reserve(size, va);
  }
  Status do_address_free(std::uintptr_t va, std::size_t size) override {
    return inner_.address_free(va, size);
  }
  Status do_create(std::size_t size, Handle* handle) override {
    return inner_.create(size, handle);
  }
  Status do_release(Handle handle) override { return inner_.release(handle); }
  Status do_map(std::uintptr_t va, std::size_t size, std::size_t offset,
                Handle handle) override {
    const Status s = inner_.map(va, size, offset, handle);
    if (s == Status::kOk) {
      std::lock_guard<std::mutex> lock(mu_);
      maps_[va] = Mapping{size, offset, handle};
    }
    return s;
  }
  Status do_unmap(std::uintptr_t va, std::size_t size) override {
    const Status s = inner_.unmap(va, size);
    if (s == Status::kOk) {
      std::lock_guard<std::mutex> lock(mu_);
      // unmap covers whole mappings (driver.h).
      auto it = maps_.lower_bound(va);
      while (it != maps_.end() && it->first < va + size) it = maps_.erase(it);
    }
    return s;
  }
  Status do_set_access(std::uintptr_t va, std::size_t size) override {
    return inner_.set_access(va, size);
  }
  Status do_event_create(Event* event) override {
    return inner_.event_create(event);
  }
  Status do_event_destroy(Event event) override {
    return inner_.event_destroy(event);
  }
  Status do_event_record(Event event, Stream stream) override {
    return inner_.event_record(event, stream);
  }
  Status do_event_query(Event event) override {
    return inner_.event_query(event);
  }
  Status do_event_synchronize(Event event) override {
    return inner_.event_synchronize(event);
  }

 private:
  struct Mapping {
    std::size_t size, offset;
    Handle handle;
  };
  vmm::Driver& inner_;
  mutable std::mutex mu_;
  std::map<std::uintptr_t, Mapping> maps_;
};

// The live and in-flight physical ranges, and the checks on them.
class Tracker {
 public:
  explicit Tracker(const vmm::SimDriver& sim) : sim_(sim) {}

  // A new allocation `id` on `stream` occupies `ranges`. Returns "" or what
  // is wrong (an overlap or a cross-stream reuse).
  // `held` are the ranges the lake actually handed out (the request rounded
  // up as the lake rounds it): the same stream takes all of them over.
  std::string Allocated(std::uint64_t id, Stream stream,
                        const std::vector<PhysRange>& ranges,
                        const std::vector<PhysRange>& held) {
    std::lock_guard<std::mutex> lock(mu_);
    std::string error;
    for (const PhysRange& r : ranges) {
      auto& live = live_[r.handle];
      auto it = live.upper_bound(r.begin);
      if (it != live.begin()) {
        auto prev = std::prev(it);
        if (prev->second.end > r.begin) error = Overlap(id, prev->second.id);
      }
      if (it != live.end() && it->first < r.end)
        error = Overlap(id, it->second.id);
      if (!error.empty()) return error;
    }
    for (const PhysRange& r : held) {
      auto fit = freed_.find(r.handle);
      if (fit == freed_.end()) continue;
      auto& list = fit->second;
      for (std::size_t i = 0; i < list.size();) {
        const Freed& f = list[i];
        bool held = false;
        if (sim_.stream_releases(f.stream, &held) != f.releases) {
          list[i] = list.back();  // its work is complete: forget it
          list.pop_back();
          continue;
        }
        if (f.begin >= r.end || r.begin >= f.end) {
          ++i;
          continue;
        }
        if (f.stream != stream && Touches(f, ranges)) {
          return "allocation " + std::to_string(id) + " on stream " +
                 std::to_string(stream) + " reuses memory freed on stream " +
                 std::to_string(f.stream) + " (allocation " +
                 std::to_string(f.id) + ") whose work is still in flight";
        }
        if (f.stream != stream) {  // only the rounding reaches it
          ++i;
          continue;
        }
        // The same stream takes the memory back: its new work is ordered
        // after the old, and whoever uses it elsewhere later must wait for
        // this stream. Only the parts outside the new range stay in flight.
        Freed left = f, right = f;
        left.end = r.begin;
        right.begin = r.end;
        list[i] = list.back();
        list.pop_back();
        if (left.begin < left.end) list.push_back(left);
        if (right.begin < right.end) list.push_back(right);
      }
    }
    for (const PhysRange& r : ranges)
      live_[r.handle].emplace(r.begin, Live{r.end, id});
    return "";
  }

  // Before the lake frees allocation `id` on `stream`: its ranges leave the
  // live set; if the stream is held, they stay in flight until that hold
  // ends. Call it before Lake::free (see stress.cc for why).
  void Freeing(std::uint64_t id, Stream stream,
               const std::vector<PhysRange>& ranges) {
    bool held = false;
    const std::uint64_t releases = sim_.stream_releases(stream, &held);
    std::lock_guard<std::mutex> lock(mu_);
    for (const PhysRange& r : ranges) {
      auto& live = live_[r.handle];
      live.erase(r.begin);
      if (live.empty()) live_.erase(r.handle);
      if (held)
        freed_[r.handle].push_back(
            Freed{r.handle, r.begin, r.end, stream, releases, id});
    }
  }

  // Forgets in-flight ranges whose work has completed.
  void Prune() {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = freed_.begin(); it != freed_.end();) {
      auto& list = it->second;
      for (std::size_t i = 0; i < list.size();) {
        bool held = false;
        if (sim_.stream_releases(list[i].stream, &held) != list[i].releases) {
          list[i] = list.back();
          list.pop_back();
        } else {
          ++i;
        }
      }
      it = list.empty() ? freed_.erase(it) : std::next(it);
    }
  }

  std::size_t live_ranges() const {
    std::lock_guard<std::mutex> lock(mu_);
    std::size_t n = 0;
    for (const auto& [h, m] : live_) n += m.size();
    return n;
  }

 private:
  struct Freed;
  static bool Touches(const Freed& f, const std::vector<PhysRange>& ranges) {
    for (const PhysRange& r : ranges)
      if (r.handle == f.handle && f.begin < r.end && r.begin < f.end)
        return true;
    return false;
  }
  static std::string Overlap(std::uint64_t a, std::uint64_t b) {
    return "allocation " + std::to_string(a) +
           " shares physical memory with live allocation " +
           std::to_string(b);
  }
  struct Live {
    std::size_t end;
    std::uint64_t id;
  };
  struct Freed {
    Handle handle;
    std::size_t begin, end;
    Stream stream;
    std::uint64_t releases;  // holds of `stream` ended when it was freed
    std::uint64_t id;
  };
  const vmm::SimDriver& sim_;
  mutable std::mutex mu_;
  std::map<Handle, std::map<std::size_t, Live>> live_;
  std::map<Handle, std::vector<Freed>> freed_;
};

}  // namespace jaxlake::stress

#endif  // JAXLAKE_TESTS_STRESS_TRACKING_DRIVER_H_
