// jaxlake: the stream clock: per-stream free sequences and the events that
// fence them, which decide when a block freed on one stream may be reused
// by another (docs/design.md, "Stream safety"). Private to cc/lake/; not
// installed.
//
// Every free on stream s takes a tag (s, seq), seq counting s's frees. A
// tag is safe once the device is known to have run s's work up to that
// free: one event per stream, recorded after its latest free and queried
// (Advance) or waited for (PendingWaits, Synchronize, FinishWaits). A tag
// is usable by its own stream at once, by any other once it is safe.
//
// The clock does no locking: its owner (Lake::Impl) guards it with its
// lock, and calls Synchronize, the only call that may block, with the lock
// released.
#ifndef JAXLAKE_CC_LAKE_STREAM_CLOCK_H_
#define JAXLAKE_CC_LAKE_STREAM_CLOCK_H_

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "cc/lake/structures.h"
#include "cc/vmm/driver.h"

namespace jaxlake {
namespace detail {

class StreamClock {
 public:
  // What the clock adds to its owner's books: `changes` counts the events
  // that can let a refused request succeed (here: frees found complete),
  // `driver_errors` and `event_waits` are the lake's statistics.
  struct Counters {
    std::uint64_t* changes;
    std::uint64_t* driver_errors;
    std::uint64_t* event_waits;
  };

  StreamClock(vmm::Driver& drv, Counters counters)
      : drv_(drv), counters_(counters) {}
  StreamClock(const StreamClock&) = delete;
  StreamClock& operator=(const StreamClock&) = delete;

  // The tag of a new free on stream s.
  Tag FreeTag(Stream s) { return Tag{s, ++StateOf(s).free_seq}; }
  // True once the free tagged t is known complete on the device (a tag
  // never used, seq 0, is always safe).
  bool Safe(const Tag& t) const {
    if (t.seq == 0) return true;
    auto it = streams_.find(t.stream);
    return it != streams_.end() && it->second.completed >= t.seq;
  }
  // True when stream s may reuse what was freed with tag t.
  bool Usable(const Tag& t, Stream s) const {
    return t.stream == s || Safe(t);
  }
  // True when no stream but s has ever freed anything: then every tag is
  // s's own or never used, and every free block is usable by s.
  bool OnlyStream(Stream s) const {
    return streams_.empty() ||
           (streams_.size() == 1 && streams_.begin()->first == s);
  }

  // Records (if needed) and queries one event per stream with unfenced
  // frees, skipping stream `except`. Never blocks. True if any stream made
  // progress.
  bool Advance(std::optional<Stream> except = std::nullopt);

  // A wait for one stream's pending event, made with the owner's lock
  // released: it completes only the frees its record covered.
  struct Wait {
    Stream stream;
    Event event;
    std::uint64_t seq;      // frees covered by the record waited for
    std::uint64_t records;  // which record that was
    bool ok = false;        // set by Synchronize
  };
  // Advances, then lists the streams whose event is still pending.
  std::vector<Wait> PendingWaits();
  // Waits for each event (blocking; static: it touches no clock, so the
  // owner calls it with its lock released).
  static void Synchronize(vmm::Driver& drv, std::vector<Wait>* waits);
  // Applies finished waits; true if some frees completed.
  bool FinishWaits(const std::vector<Wait>& waits);

  // Destroys the events (the owner's destructor).
  void DestroyEvents();

  // The clock's own invariants; "" when they hold, else the first broken.
  std::string CheckInvariants() const;

 private:
  // The state of stream s, made on first use. The last one used is kept at
  // hand: most frees in a row come from one stream. (Entries are never
  // erased, and an unordered_map's elements do not move.)
  StreamState& StateOf(Stream s) {
    if (last_state_ == nullptr || last_stream_ != s) {
      last_state_ = &streams_[s];
      last_stream_ = s;
    }
    return *last_state_;
  }
  // Marks the frees of a stream up to `seq` complete.
  void Complete(StreamState& ss, std::uint64_t seq) {
    if (seq > ss.completed) {
      ss.completed = seq;
      ++*counters_.changes;
    }
  }

  vmm::Driver& drv_;
  Counters counters_;
  std::unordered_map<Stream, StreamState> streams_;
  Stream last_stream_ = 0;
  StreamState* last_state_ = nullptr;
};

}  // namespace detail
}  // namespace jaxlake

#endif  // JAXLAKE_CC_LAKE_STREAM_CLOCK_H_
