// jaxlake: the stitching allocator. See lake.h for the policy and
// docs/design.md for the data structures and their invariants.
#include "cc/lake/lake.h"

#include <algorithm>
#include <cassert>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <list>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <tuple>
#include <unordered_map>
#include <utility>

namespace jaxlake {

using vmm::Event;
using vmm::Handle;
using vmm::Status;
using vmm::Stream;

const char* AllocStateName(AllocState s) {
  switch (s) {
#define JAXLAKE_X(name) \
  case AllocState::name: \
    return #name;
    JAXLAKE_ALLOC_STATES(JAXLAKE_X)
#undef JAXLAKE_X
  }
  return "unknown";
}

namespace {

bool IsPow2(std::size_t x) { return x != 0 && (x & (x - 1)) == 0; }
std::size_t RoundUp(std::size_t x, std::size_t to) {
  return (x + to - 1) / to * to;
}

std::string Bytes(std::size_t b) {
  char buf[64];
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%zu B", b);
  else
    std::snprintf(buf, sizeof buf, "%.2f %s", v, units[u]);
  return buf;
}

}  // namespace

std::string ValidateOptions(const LakeOptions& o, const vmm::Driver& driver) {
  const std::size_t gran = driver.granularity();
  std::ostringstream err;
  if (o.capacity != 0 && o.capacity < gran) {
    err << "capacity " << o.capacity << " is below one chunk (" << gran
        << " bytes): expected 0 (the whole device) or at least " << gran;
  } else if (!IsPow2(o.alignment) || o.alignment < 256 ||
             o.alignment > gran) {
    err << "alignment " << o.alignment
        << " is invalid: expected a power of two between 256 and " << gran;
  } else if (o.small_slab != 0 && o.small_slab % gran != 0) {
    err << "small_slab " << o.small_slab
        << " is invalid: expected 0 or a multiple of the granularity "
        << gran;
  } else if (o.small_slab >
             (o.capacity != 0 ? o.capacity : driver.total_memory())) {
    err << "small_slab " << o.small_slab << " exceeds the capacity ("
        << (o.capacity != 0 ? o.capacity : driver.total_memory())
        << " bytes): expected 0 or a multiple of the granularity at most "
           "the capacity";
  } else if (o.small_limit > (o.small_slab ? o.small_slab : gran)) {
    err << "small_limit " << o.small_limit
        << " is larger than one small slab ("
        << (o.small_slab ? o.small_slab : gran) << " bytes)";
  }
  return err.str();
}

// ---------------------------------------------------------------------------
// Data structures.

namespace {

// Where and when a free block was last used: the stream that freed it and
// that stream's free sequence number at the time. A block is usable at once
// by the same stream, and by any other stream (or by unmap/release) once an
// event recorded on `stream` after that free has completed.
struct Tag {
  Stream stream = 0;
  std::uint64_t seq = 0;  // 0: never used, safe for everyone
};

enum class BlockState : std::uint8_t {
  kFree,  // in the free index
  kLive,  // a primary allocation
  kLent,  // lent to a stitched range (owner = stitched id)
  kSlab,  // a small-pool slab (owner = slab id)
};

// Recycles the nodes of the lake's trees and tables: most operations free
// one node and make another of the same size, and a free list hands it
// back without malloc. Guarded by the lake's mutex like the containers.
class NodePool {
 public:
  NodePool() = default;
  NodePool(const NodePool&) = delete;
  NodePool& operator=(const NodePool&) = delete;
  ~NodePool() {
    for (void* head : free_)
      while (head) {
        void* next = *static_cast<void**>(head);
        ::operator delete(head);
        head = next;
      }
  }
  void* get(std::size_t bytes) {
    const std::size_t c = Class(bytes);
    if (c >= kClasses) return ::operator new(bytes);
    if (void* p = free_[c]) {
      free_[c] = *static_cast<void**>(p);
      return p;
    }
    return ::operator new((c + 1) * 8);
  }
  void put(void* p, std::size_t bytes) {
    const std::size_t c = Class(bytes);
    if (c >= kClasses) {
      ::operator delete(p);
      return;
    }
    *static_cast<void**>(p) = free_[c];
    free_[c] = p;
  }

 private:
  static constexpr std::size_t kClasses = 16;  // nodes up to 128 bytes
  static std::size_t Class(std::size_t bytes) { return (bytes + 7) / 8 - 1; }
  void* free_[kClasses] = {};
};

// An allocator of single nodes from a NodePool (arrays, such as hash
// buckets, come from operator new).
template <typename T>
struct NodeAlloc {
  using value_type = T;
  NodePool* pool;
  explicit NodeAlloc(NodePool* p) : pool(p) {}
  template <typename U>
  NodeAlloc(const NodeAlloc<U>& o) : pool(o.pool) {}  // NOLINT
  T* allocate(std::size_t n) {
    if (n != 1) return static_cast<T*>(::operator new(n * sizeof(T)));
    return static_cast<T*>(pool->get(sizeof(T)));
  }
  void deallocate(T* p, std::size_t n) {
    if (n != 1) return ::operator delete(p);
    pool->put(p, sizeof(T));
  }
  template <typename U>
  bool operator==(const NodeAlloc<U>& o) const { return pool == o.pool; }
  template <typename U>
  bool operator!=(const NodeAlloc<U>& o) const { return pool != o.pool; }
};

// (units, segment, start unit) of a free block: the free index's key, so
// best fit is a lower_bound.
using FreeKey = std::tuple<std::uint64_t, std::uint64_t, std::uint64_t>;
using FreeIndex =
    std::set<FreeKey, std::less<FreeKey>, NodeAlloc<FreeKey>>;

struct Block {
  std::uint64_t end = 0;  // one past the last unit
  BlockState state = BlockState::kFree;
  std::uint64_t owner = 0;
  Tag tag;
  FreeIndex::iterator idx{};  // its free index entry, while kFree
};

// Offsets and lengths inside segments are in units of the alignment (256 B
// by default): blocks are split at the alignment, so a request above
// small_limit holds at most one alignment more than it asked for. Maps,
// unmaps and stitched pieces work in whole chunks (chunk = granularity).
using BlockMap =
    std::map<std::uint64_t, Block, std::less<std::uint64_t>,
             NodeAlloc<std::pair<const std::uint64_t, Block>>>;

struct Segment {
  explicit Segment(NodePool* nodes) : blocks(NodeAlloc<int>(nodes)) {}
  Handle handle = 0;
  std::uintptr_t va = 0;
  std::uint64_t nchunks = 0;
  std::uint64_t stitch_refs = 0;  // stitched ranges mapping its chunks
  BlockMap blocks;  // start unit -> block
};

// A run of whole chunks of one segment (start and n in units, both
// multiples of the units per chunk).
struct Piece {
  std::uint64_t seg;
  std::uint64_t start;
  std::uint64_t n;
};

// A stitched range maps its pieces in order. Its allocation begins `lead`
// units into the first piece (a free tail that ends at a chunk boundary can
// lead a range; the units before it belong to other blocks) and spans
// `used` units; the rest of the last piece stays free for anyone.
struct Stitched {
  std::uintptr_t va = 0;
  std::uint64_t nunits = 0;       // units mapped (VA size / alignment)
  std::uint64_t lead = 0;         // units of the first piece before the block
  std::uint64_t used = 0;         // units lent to the live block
  std::vector<Piece> pieces;      // in address order
  bool mapping = false;           // claimed, being mapped right now
  bool dropping = false;          // being unmapped right now
  bool cached = false;            // in the LRU cache
  Tag tag;                        // last free
  std::list<std::uint64_t>::iterator lru;
};

struct Slab {
  std::uint64_t seg = 0;
  std::uint64_t start = 0;   // units
  std::uint64_t nunits = 0;
  std::uintptr_t base = 0;
  std::size_t bytes = 0;
  std::size_t used = 0;                     // bytes handed out
  Stream stream = 0;
  std::map<std::size_t, std::size_t> free;  // offset -> length
};

enum class Kind : std::uint8_t { kPrimary, kStitched, kSmall };

struct Alloc {
  std::size_t size = 0;     // requested
  std::size_t rounded = 0;  // held
  Stream stream = 0;
  Kind kind = Kind::kPrimary;
  std::uint64_t seg = 0;    // primary
  std::uint64_t start = 0;  // primary (unit)
  std::uint64_t owner = 0;  // stitched or slab id
};

struct StreamState {
  std::uint64_t free_seq = 0;   // frees so far on this stream
  std::uint64_t completed = 0;  // frees known complete on the device
  Event event = 0;              // 0: none created yet
  std::uint64_t event_seq = 0;  // free_seq covered by the pending event
  // Records of `event` so far. A wait made with the lock released completes
  // only the record it was started for: the event may be recorded again
  // (for newer frees) before the waiter retakes the lock.
  std::uint64_t records = 0;
  bool pending = false;
};

// Driver resources the lake has given up but the driver failed to release
// (a failed unmap, release or address_free). They are kept and retried on
// the next empty_cache(), under memory pressure and at destruction, in
// order: unmap every mapping, release the handle, free the reservation.
struct Unreleased {
  std::vector<std::pair<std::uintptr_t, std::size_t>> maps;  // still mapped
  Handle handle = 0;       // still to release; 0: done or none
  std::uintptr_t va = 0;   // reservation still to free; 0: done
  std::size_t va_bytes = 0;
  std::size_t phys = 0;    // physical bytes of a segment (0: stitched range)
  bool done() const { return maps.empty() && handle == 0 && va == 0; }
  // Physical memory the driver still holds for it.
  std::size_t held() const {
    return handle != 0 || !maps.empty() ? phys : 0;
  }
};

}  // namespace

struct Lake::Impl {
  vmm::Driver& drv;
  LakeOptions opt;
  std::size_t gran;
  std::size_t unit;   // bytes per unit (the alignment)
  std::uint64_t cu;   // units per chunk
  std::size_t capacity;
  std::size_t slab_bytes;
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();

  mutable std::mutex mu;
  NodePool nodes;  // before the containers that use it
  std::unordered_map<std::uint64_t, Segment> segs;
  std::uint64_t next_seg = 1;
  FreeIndex free_index{NodeAlloc<FreeKey>(&nodes)};  // by (units, seg, start)
  std::unordered_map<std::uint64_t, Stitched> stitched;
  std::list<std::uint64_t> lru;  // cached stitched ids, most recent first
  std::unordered_map<std::uint64_t, Slab> slabs;
  std::map<std::uintptr_t, std::uint64_t> slab_by_base;
  // Per stream: free small ranges as (length, address).
  std::unordered_map<Stream, std::set<std::pair<std::size_t, std::uintptr_t>>>
      small_free;
  std::uint64_t next_id = 1;
  std::unordered_map<std::uintptr_t, Alloc, std::hash<std::uintptr_t>,
                     std::equal_to<std::uintptr_t>,
                     NodeAlloc<std::pair<const std::uintptr_t, Alloc>>>
      live{16, std::hash<std::uintptr_t>(), std::equal_to<std::uintptr_t>(),
           NodeAlloc<std::pair<const std::uintptr_t, Alloc>>(&nodes)};
  std::unordered_map<Stream, StreamState> streams;
  std::size_t pending_bytes = 0;  // physical bytes being created right now
  // Physical bytes of segments being released right now (lock released):
  // still held by the driver, so they still count against the capacity.
  std::size_t releasing_bytes = 0;
  // Counts the changes that can let a refused request succeed (memory
  // freed or released, frees completed). The reclaim loop compares it
  // before and after its steps that release the lock, so that it sees what
  // other threads did meanwhile.
  std::uint64_t changes = 0;
  Stats st;
  std::vector<Unreleased> unreleased;
  // Entries taken out of `unreleased` by a retry in progress (lock
  // released): still counted by the gauges.
  std::size_t retrying = 0, retrying_held = 0;
  std::vector<TraceEvent> trace;
  std::string last_error;

  Impl(vmm::Driver& d, const LakeOptions& o)
      : drv(d),
        opt(o),
        gran(d.granularity()),
        unit(o.alignment),
        cu(static_cast<std::uint64_t>(d.granularity() / o.alignment)),
        capacity(o.capacity ? o.capacity : d.total_memory()),
        slab_bytes(o.small_slab ? o.small_slab : d.granularity()) {}

  // ---- tags and streams ----------------------------------------------------

  Tag FreeTag(Stream s) { return Tag{s, ++streams[s].free_seq}; }

  bool Safe(const Tag& t) const {
    if (t.seq == 0) return true;
    auto it = streams.find(t.stream);
    return it != streams.end() && it->second.completed >= t.seq;
  }
  bool Usable(const Tag& t, Stream s) const {
    return t.stream == s || Safe(t);
  }
  // True when no stream but s has ever freed anything: then every tag is
  // s's own or never used, and every free block is usable by s.
  bool OnlyStream(Stream s) const {
    return streams.empty() ||
           (streams.size() == 1 && streams.begin()->first == s);
  }

  // Records (if needed) and queries one event per stream with unfenced
  // frees, skipping stream `except` (its own frees are usable by it at
  // once). Never blocks. Returns true if any stream made progress. A
  // workload on one stream never gets here with anything to do, so it
  // records no events at all.
  bool AdvanceStreams(std::optional<Stream> except = std::nullopt) {
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

  // Marks the frees of a stream up to `seq` complete.
  void Complete(StreamState& ss, std::uint64_t seq) {
    if (seq > ss.completed) {
      ss.completed = seq;
      ++changes;
    }
  }

  // Waits (lock released) for every pending stream event. Returns true if
  // something completed.
  //
  // Each wait completes only the frees its event covered when the wait
  // began (event_seq of that record): while the lock is released, another
  // call may see the event complete and record it again for newer frees,
  // which this wait says nothing about. Synchronizing an event waits for
  // its latest record, which covers at least the frees of the earlier one.
  bool WaitStreams(std::unique_lock<std::mutex>& lk) {
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

  // ---- blocks ----------------------------------------------------------------

  void IndexAdd(std::uint64_t seg, std::uint64_t start, Block& b) {
    b.idx = free_index.emplace(b.end - start, seg, start).first;
  }
  void IndexRemove(std::uint64_t, std::uint64_t, const Block& b) {
    free_index.erase(b.idx);
  }

  // The block holding unit u of a segment.
  const Block& BlockAt(std::uint64_t seg_id, std::uint64_t u) const {
    const Segment& seg = segs.at(seg_id);
    return std::prev(seg.blocks.upper_bound(u))->second;
  }

  std::uint64_t ChunkDown(std::uint64_t u) const { return u - u % cu; }
  std::uint64_t ChunkUp(std::uint64_t u) const {
    return u % cu ? u - u % cu + cu : u;
  }

  // Marks [start, start+n) of segment `seg`, which must lie inside one free
  // block, with `state`/`owner`. The rest of that free block stays free.
  void Carve(std::uint64_t seg_id, std::uint64_t start, std::uint64_t n,
             BlockState state, std::uint64_t owner) {
    Segment& seg = segs.at(seg_id);
    auto it = std::prev(seg.blocks.upper_bound(start));
    const std::uint64_t bstart = it->first;
    const Block b = it->second;
    assert(b.state == BlockState::kFree && b.end >= start + n);
    IndexRemove(seg_id, bstart, b);
    // The free block's node becomes the left part, or the carved block
    // itself when it starts there (no node is freed and made again).
    auto hint = std::next(it);
    if (bstart < start) {
      it->second.end = start;
      IndexAdd(seg_id, bstart, it->second);
      it = seg.blocks.emplace_hint(hint, start, Block{});
    }
    Block& mid = it->second;
    mid.end = start + n;
    mid.state = state;
    mid.owner = owner;
    mid.tag = b.tag;
    if (start + n < b.end) {
      auto r = seg.blocks.emplace_hint(hint, start + n, b);
      IndexAdd(seg_id, start + n, r->second);
    }
  }

  // Two free neighbours merge when they share a stream or one of them is
  // safe for everyone; the merged block keeps the tag that still matters.
  bool MergeTags(const Tag& a, const Tag& b, Tag* out) const {
    if (a.stream == b.stream) {
      *out = a.seq >= b.seq ? a : b;
      return true;
    }
    if (Safe(a)) {
      *out = b;
      return true;
    }
    if (Safe(b)) {
      *out = a;
      return true;
    }
    return false;
  }

  // Makes [start, end) of a segment a free block with `tag`, merging with
  // free neighbours where allowed.
  void MakeFree(std::uint64_t seg_id, std::uint64_t start, Tag tag) {
    ++changes;
    Segment& seg = segs.at(seg_id);
    auto it = seg.blocks.find(start);
    assert(it != seg.blocks.end());
    it->second.state = BlockState::kFree;
    it->second.owner = 0;
    it->second.tag = tag;
    // Merge with the right neighbour.
    auto next = std::next(it);
    Tag merged;
    if (next != seg.blocks.end() && next->second.state == BlockState::kFree &&
        MergeTags(it->second.tag, next->second.tag, &merged)) {
      IndexRemove(seg_id, next->first, next->second);
      it->second.end = next->second.end;
      it->second.tag = merged;
      seg.blocks.erase(next);
    }
    // Merge with the left neighbour.
    if (it != seg.blocks.begin()) {
      auto prev = std::prev(it);
      if (prev->second.state == BlockState::kFree &&
          MergeTags(prev->second.tag, it->second.tag, &merged)) {
        IndexRemove(seg_id, prev->first, prev->second);
        prev->second.end = it->second.end;
        prev->second.tag = merged;
        seg.blocks.erase(it);
        it = prev;
      }
    }
    IndexAdd(seg_id, it->first, it->second);
  }

  // Merges free neighbours that were kept apart by pending events.
  void Coalesce() {
    for (auto& [id, seg] : segs) {
      for (auto it = seg.blocks.begin(); it != seg.blocks.end();) {
        auto next = std::next(it);
        Tag merged;
        if (next != seg.blocks.end() && it->second.state == BlockState::kFree &&
            next->second.state == BlockState::kFree &&
            MergeTags(it->second.tag, next->second.tag, &merged)) {
          IndexRemove(id, it->first, it->second);
          IndexRemove(id, next->first, next->second);
          it->second.end = next->second.end;
          it->second.tag = merged;
          seg.blocks.erase(next);
          IndexAdd(id, it->first, it->second);
          continue;  // try to merge further right
        }
        it = next;
      }
    }
  }

  // True when [start, start+n) of a segment lies in one free block usable by
  // stream s.
  bool RangeFree(std::uint64_t seg_id, std::uint64_t start, std::uint64_t n,
                 Stream s) const {
    auto sit = segs.find(seg_id);
    if (sit == segs.end()) return false;
    const Segment& seg = sit->second;
    auto it = seg.blocks.upper_bound(start);
    if (it == seg.blocks.begin()) return false;
    --it;
    const Block& b = it->second;
    return b.state == BlockState::kFree && b.end >= start + n &&
           Usable(b.tag, s);
  }

  // ---- gauges ----------------------------------------------------------------

  void Record(bool allocate, std::uintptr_t addr, std::size_t size, Stream s,
              AllocState state) {
    if (!opt.record_trace) return;
    auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                  std::chrono::steady_clock::now() - t0)
                  .count();
    trace.push_back(TraceEvent{static_cast<std::uint64_t>(ns), allocate, addr,
                               size, s, state});
  }

  void OnAllocated(std::uintptr_t addr, const Alloc& a, AllocState state) {
    live.emplace(addr, a);
    st.bytes_in_use.add(static_cast<std::int64_t>(a.size));
    st.bytes_in_use_rounded.add(static_cast<std::int64_t>(a.rounded));
    st.live_allocations.add(1);
    ++st.allocs;
    switch (state) {
#define JAXLAKE_X(name)  \
  case AllocState::name: \
    ++st.alloc_##name;   \
    break;
      JAXLAKE_ALLOC_STATES(JAXLAKE_X)
#undef JAXLAKE_X
    }
    Record(true, addr, a.size, a.stream, state);
  }

  // ---- releasing driver resources ------------------------------------------

  // Calls the driver (lock released) for what is left of `u`, in order, and
  // keeps in `u` what still failed. Returns kOk or the first failure, whose
  // call is named in *what.
  Status Teardown(Unreleased& u, const char** what) {
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
  void Keep(Unreleased&& u) {
    if (u.done()) return;
    st.bytes_unreleased.add(static_cast<std::int64_t>(u.held()));
    st.unreleased.add(1);
    unreleased.push_back(std::move(u));
  }

  // Retries every kept resource (lock released meanwhile). Returns the
  // physical bytes the driver gave back. On a failure, *status (if kOk) and
  // *error (if empty) take the first one.
  std::size_t RetryUnreleased(std::unique_lock<std::mutex>& lk,
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
    lk.unlock();
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
    lk.lock();
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
  void Report(Status s, const char* what, Status* status,
              std::string* error) {
    if (status && *status == Status::kOk) *status = s;
    if (error && error->empty())
      *error = std::string("driver call ") + what + " failed (" +
               vmm::StatusName(s) + ")";
  }

  // ---- segments --------------------------------------------------------------

  // Creates a segment of n chunks (lock released during driver calls).
  // Capacity must have been claimed in pending_bytes by the caller.
  Status CreateSegment(std::unique_lock<std::mutex>& lk, std::uint64_t n,
                       std::uint64_t* seg_out) {
    const std::size_t bytes = std::size_t{n} * gran;
    lk.unlock();
    std::uintptr_t va = 0;
    Handle h = 0;
    Status s = drv.reserve(bytes, &va);
    Unreleased undo;  // what a failure must give back
    Status us = Status::kOk;
    if (s == Status::kOk) {
      undo.va = va;
      undo.va_bytes = bytes;
      s = drv.create(bytes, &h);
      if (s == Status::kOk) {
        undo.handle = h;
        undo.phys = bytes;
        s = drv.map(va, bytes, 0, h);
        if (s == Status::kOk) {
          undo.maps.emplace_back(va, bytes);
          s = drv.set_access(va, bytes);
        }
      }
      if (s != Status::kOk) us = Teardown(undo, nullptr);
    }
    lk.lock();
    pending_bytes -= bytes;
    if (s != Status::kOk) {
      ++changes;  // the claimed capacity is free again
      if (s != Status::kOutOfMemory) ++st.driver_errors;
      if (us != Status::kOk) {
        ++st.driver_errors;
        Keep(std::move(undo));
      }
      return s;
    }
    const std::uint64_t id = next_seg++;
    Segment& seg = segs.try_emplace(id, &nodes).first->second;
    seg.handle = h;
    seg.va = va;
    seg.nchunks = n;
    Block b;
    b.end = n * cu;
    IndexAdd(id, 0, seg.blocks.emplace(0, b).first->second);
    st.bytes_reserved.add(static_cast<std::int64_t>(bytes));
    st.segments.add(1);
    *seg_out = id;
    return Status::kOk;
  }

  // Claims capacity for n new chunks; false if the capacity forbids it.
  // Memory the driver failed to release still counts against it.
  bool ClaimCapacity(std::uint64_t n) {
    const std::size_t bytes = std::size_t{n} * gran;
    const std::size_t held =
        static_cast<std::size_t>(st.bytes_reserved.current) + pending_bytes +
        releasing_bytes +
        static_cast<std::size_t>(st.bytes_unreleased.current);
    if (n > capacity / gran || held + bytes > capacity) return false;
    pending_bytes += bytes;
    return true;
  }

  // Releases every segment that is wholly free, safe and not mapped by a
  // stitched range (merging free neighbours first). Returns the bytes the
  // driver gave back; a driver failure keeps the rest for a retry and is
  // passed to *status / *error when given.
  std::size_t ReleaseFreeSegments(std::unique_lock<std::mutex>& lk,
                                  Status* status = nullptr,
                                  std::string* error = nullptr) {
    Coalesce();
    std::vector<Segment> doomed;
    for (auto it = segs.begin(); it != segs.end();) {
      Segment& seg = it->second;
      const Block& first = seg.blocks.begin()->second;
      if (seg.stitch_refs == 0 && seg.blocks.size() == 1 &&
          first.state == BlockState::kFree && Safe(first.tag)) {
        IndexRemove(it->first, 0, first);
        doomed.push_back(std::move(seg));
        it = segs.erase(it);
      } else {
        ++it;
      }
    }
    if (doomed.empty()) return 0;
    std::vector<Unreleased> undo(doomed.size());
    for (std::size_t i = 0; i < doomed.size(); ++i) {
      const Segment& seg = doomed[i];
      const std::size_t bytes = std::size_t{seg.nchunks} * gran;
      st.bytes_reserved.add(-static_cast<std::int64_t>(bytes));
      st.segments.add(-1);
      ++st.segments_released;
      undo[i].maps.emplace_back(seg.va, bytes);
      undo[i].handle = seg.handle;
      undo[i].va = seg.va;
      undo[i].va_bytes = bytes;
      undo[i].phys = bytes;
    }
    // Whatever fails below stays counted (bytes_unreleased) until a retry
    // succeeds; only what the driver gave back is reported released. Until
    // the driver answers, the bytes still count against the capacity.
    std::size_t releasing = 0;
    for (const Unreleased& u : undo) releasing += u.phys;
    releasing_bytes += releasing;
    lk.unlock();
    std::vector<Status> result(doomed.size());
    const char* what = "";
    for (std::size_t i = 0; i < doomed.size(); ++i) {
      const char* w = "";
      result[i] = Teardown(undo[i], &w);
      if (result[i] != Status::kOk && *what == '\0') what = w;
    }
    lk.lock();
    releasing_bytes -= releasing;
    ++changes;
    std::size_t released = 0;
    Status first = Status::kOk;
    for (std::size_t i = 0; i < doomed.size(); ++i) {
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
    return released;
  }

  // ---- stitched ranges -------------------------------------------------------

  void StitchRefs(const Stitched& r, int delta) {
    std::set<std::uint64_t> seen;
    for (const Piece& p : r.pieces)
      if (seen.insert(p.seg).second)
        segs.at(p.seg).stitch_refs += static_cast<std::uint64_t>(delta);
  }

  // Calls f(seg, start, n) for each run of the first `used` units of the
  // range's block (after its lead), one run per piece, in order.
  template <typename F>
  static void ForUsed(const Stitched& r, std::uint64_t used, F&& f) {
    std::uint64_t skip = r.lead;
    for (const Piece& p : r.pieces) {
      if (used == 0) break;
      const std::uint64_t d = std::min(skip, p.n);
      skip -= d;
      if (d == p.n) continue;
      const std::uint64_t k = std::min(used, p.n - d);
      f(p.seg, p.start + d, k);
      used -= k;
    }
  }

  // Unmaps a stitched range that is not in use (lock released meanwhile).
  // A driver failure keeps what is left for a retry; kOk or that failure.
  Status DropStitched(std::unique_lock<std::mutex>& lk, std::uint64_t id,
                      const char** what = nullptr) {
    Stitched& r = stitched.at(id);
    if (r.cached) {
      lru.erase(r.lru);
      r.cached = false;
    }
    r.dropping = true;
    Unreleased undo;
    undo.va = r.va;
    std::uintptr_t at = r.va;
    for (const Piece& p : r.pieces) {
      undo.maps.emplace_back(at, std::size_t{p.n} * unit);
      at += std::size_t{p.n} * unit;
    }
    undo.va_bytes = at - r.va;
    const std::size_t bytes = undo.va_bytes;
    lk.unlock();
    const Status s = Teardown(undo, what);
    lk.lock();
    Stitched& r2 = stitched.at(id);
    StitchRefs(r2, -1);
    st.stitched_bytes.add(-static_cast<std::int64_t>(bytes));
    ++st.stitch_evictions;
    stitched.erase(id);
    ++changes;
    if (s != Status::kOk) {
      ++st.driver_errors;
      Keep(std::move(undo));
    }
    return s;
  }

  // Drops cached stitched ranges, oldest first, while `keep` is exceeded.
  // A range is unmapped only once its last use is complete. Frees on one
  // stream record no events by themselves, so when no cached range is known
  // to be safe, the streams' events are advanced (recorded and queried,
  // never waited for) once before giving up.
  void TrimCache(std::unique_lock<std::mutex>& lk, std::size_t keep,
                 Status* status = nullptr, std::string* error = nullptr) {
    bool advanced = false;
    while (lru.size() > keep) {
      std::uint64_t victim = 0;
      for (auto it = lru.rbegin(); it != lru.rend(); ++it)
        if (Safe(stitched.at(*it).tag)) {
          victim = *it;
          break;
        }
      if (victim == 0) {
        if (advanced || !AdvanceStreams()) return;  // all still in flight
        advanced = true;
        continue;
      }
      const char* what = "";
      const Status s = DropStitched(lk, victim, &what);
      if (s != Status::kOk) Report(s, what, status, error);
    }
  }

  // ---- the allocation states -------------------------------------------------

  // A free block of >= n chunks usable by stream s (best fit), or false.
  bool FindFit(std::uint64_t n, Stream s, FreeKey* out) const {
    auto it = free_index.lower_bound(FreeKey(n, 0, 0));
    if (OnlyStream(s)) {  // every free block is usable: no tag to look at
      if (it == free_index.end()) return false;
      *out = *it;
      return true;
    }
    for (; it != free_index.end(); ++it) {
      const auto [len, seg_id, start] = *it;
      if (Usable(segs.at(seg_id).blocks.at(start).tag, s)) {
        *out = *it;
        return true;
      }
    }
    return false;
  }

  // Claims n units of one primary block for `state`/`owner`: best fit, else
  // a new segment of whole chunks (the rest of its last chunk stays free).
  // kOutOfMemory when neither is possible; *how tells which.
  // `found`: a fit the caller already found (FindFit), if any.
  Status ClaimPrimary(std::unique_lock<std::mutex>& lk, std::uint64_t n,
                      Stream s, BlockState state, std::uint64_t owner,
                      std::uint64_t* seg_out, std::uint64_t* start_out,
                      AllocState* how, const FreeKey* found = nullptr) {
    FreeKey fit;
    if (found != nullptr ? (fit = *found, true) : FindFit(n, s, &fit)) {
      const auto [len, seg_id, start] = fit;
      Carve(seg_id, start, n, state, owner);
      *seg_out = seg_id;
      *start_out = start;
      *how = len == n ? AllocState::fit : AllocState::split;
      return Status::kOk;
    }
    const std::uint64_t chunks = ChunkUp(n) / cu;
    if (!ClaimCapacity(chunks)) return Status::kOutOfMemory;
    Status cs = CreateSegment(lk, chunks, seg_out);
    if (cs != Status::kOk) return cs;
    Carve(*seg_out, 0, n, state, owner);
    *start_out = 0;
    *how = AllocState::grow;
    return Status::kOk;
  }

  // Runs `attempt` (returning kOutOfMemory when memory is short) and, while
  // it fails for lack of memory, reclaims in rising cost: query stream
  // events, wait for them, then retry failed releases, drop cached stitched
  // ranges and release free segments. Each step may release the lock; the
  // attempt is retried after a step that made progress and also after any
  // change made meanwhile by other threads (frees, releases, completed
  // events: the `changes` count), and the steps start over (a bounded number
  // of times) while such changes keep coming.
  static constexpr int kReclaimRestarts = 2;

  template <typename F>
  Status WithReclaim(std::unique_lock<std::mutex>& lk, F&& attempt) {
    std::uint64_t seen = changes;
    Status r = attempt();
    if (r != Status::kOutOfMemory) return r;
    ++st.reclaims;
    for (int restart = 0;; ++restart) {
      for (int round = 0; round < 3; ++round) {
        bool progress = false;
        if (round == 0) {
          progress = AdvanceStreams();
        } else if (round == 1) {
          progress = WaitStreams(lk);
        } else {
          const std::size_t cached = lru.size();
          progress = RetryUnreleased(lk, nullptr, nullptr) > 0;
          TrimCache(lk, 0);
          progress = ReleaseFreeSegments(lk) > 0 || progress ||
                     lru.size() != cached;
        }
        if (!progress && changes == seen) continue;
        Coalesce();
        FlushDeferredSmall();
        seen = changes;
        r = attempt();
        if (r != Status::kOutOfMemory) return r;
      }
      if (changes == seen || restart >= kReclaimRestarts) return r;
    }
  }

  Alloc StitchedAlloc(std::uint64_t id, std::size_t size, Stream s) const {
    Alloc a;
    a.size = size;
    a.rounded = std::size_t{stitched.at(id).used} * unit;
    a.stream = s;
    a.kind = Kind::kStitched;
    a.owner = id;
    return a;
  }

  std::uintptr_t StitchedAddress(const Stitched& r) const {
    return r.va + std::size_t{r.lead} * unit;
  }

  // Cached ranges large enough for a request whose units are checked, most
  // recently freed first: a bound on the cost of a miss (a training step
  // reuses the ranges its previous step freed, which come first).
  static constexpr int kReuseCandidates = 8;

  bool TryReuse(std::uint64_t n, Stream s, std::size_t size,
                std::uintptr_t* addr) {
    int candidates = 0;
    for (auto it = lru.begin(); it != lru.end(); ++it) {
      Stitched& r = stitched.at(*it);
      if (r.nunits - r.lead < n) continue;
      if (++candidates > kReuseCandidates) break;
      // Reusing the range's VA from another stream needs its last use done.
      if (!Usable(r.tag, s)) continue;
      bool ok = true;
      ForUsed(r, n, [&](std::uint64_t seg, std::uint64_t start,
                        std::uint64_t k) {
        ok = ok && RangeFree(seg, start, k, s);
      });
      if (!ok) continue;
      const std::uint64_t id = *it;
      lru.erase(it);
      r.cached = false;
      r.used = n;
      ForUsed(r, n, [&](std::uint64_t seg, std::uint64_t start,
                        std::uint64_t k) {
        Carve(seg, start, k, BlockState::kLent, id);
      });
      *addr = StitchedAddress(r);
      OnAllocated(*addr, StitchedAlloc(id, size, s), AllocState::stitch_reuse);
      return true;
    }
    return false;
  }

  // Free blocks of less than a chunk checked as the lead of a stitch.
  static constexpr int kLeadCandidates = 16;

  // Plans a stitched range for n units on stream s. Pieces: the whole free
  // chunks of free blocks usable by s, largest block first. When they fall
  // short, a free block smaller than a chunk that ends at a chunk boundary
  // may lead the range (*lead: the units of its chunk before it) when it
  // saves a chunk of the shortfall (best fit among those). Returns the
  // units the plan covers after the lead.
  std::uint64_t PlanStitch(std::uint64_t n, Stream s,
                           std::vector<Piece>* plan, std::uint64_t* lead) {
    std::uint64_t got = 0;
    *lead = 0;
    for (auto it = free_index.rbegin(); it != free_index.rend() && got < n;
         ++it) {
      auto [len, seg_id, start] = *it;
      if (len < cu) break;  // no whole chunk in this block or any after it
      const std::uint64_t a = ChunkUp(start);
      const std::uint64_t b = ChunkDown(start + len);
      if (b <= a) continue;
      if (!Usable(segs.at(seg_id).blocks.at(start).tag, s)) continue;
      const std::uint64_t k = std::min(b - a, ChunkUp(n - got));
      plan->push_back(Piece{seg_id, a, k});
      got += k;
      if (opt.max_pieces && plan->size() >= opt.max_pieces) break;
    }
    if (got < n) {
      const std::uint64_t need = n - got;
      const std::uint64_t rem = need - (ChunkUp(need) - cu);  // 1..cu
      const bool room = !opt.max_pieces || plan->size() + 2 <= opt.max_pieces;
      int seen = 0;
      for (auto it = free_index.lower_bound(FreeKey(rem, 0, 0));
           room && it != free_index.end() && seen < kLeadCandidates; ++it) {
        auto [len, seg_id, start] = *it;
        if (len >= cu) break;
        if ((start + len) % cu != 0) continue;
        ++seen;
        if (!Usable(segs.at(seg_id).blocks.at(start).tag, s)) continue;
        const std::uint64_t c = start + len - cu;
        plan->insert(plan->begin(), Piece{seg_id, c, cu});
        *lead = start - c;
        got += len;
        break;
      }
    }
    // A shortfall segment needs a piece of its own.
    if (got < n && opt.max_pieces) {
      while (!plan->empty() && plan->size() + 1 > opt.max_pieces) {
        got -= plan->back().n - (plan->size() == 1 ? *lead : 0);
        plan->pop_back();
      }
      if (plan->empty()) *lead = 0;
    }
    return std::min(got, n);
  }

  // Maps the pieces of range `id` into a new reservation (lock released
  // meanwhile); the range's used units must already be lent to it.
  Status MapStitched(std::unique_lock<std::mutex>& lk, std::uint64_t id) {
    const std::vector<Piece> pieces = stitched.at(id).pieces;
    std::vector<std::pair<Handle, std::size_t>> src;  // handle, byte offset
    std::size_t bytes = 0;
    for (const Piece& p : pieces) {
      const Segment& seg = segs.at(p.seg);
      src.emplace_back(seg.handle, std::size_t{p.start} * unit);
      bytes += std::size_t{p.n} * unit;
    }
    lk.unlock();
    std::uintptr_t va = 0;
    Status s = drv.reserve(bytes, &va);
    std::size_t mapped = 0;
    std::size_t done_bytes = 0;
    if (s == Status::kOk) {
      for (; mapped < pieces.size(); ++mapped) {
        const std::size_t pb = std::size_t{pieces[mapped].n} * unit;
        s = drv.map(va + done_bytes, pb, src[mapped].second,
                    src[mapped].first);
        if (s != Status::kOk) break;
        done_bytes += pb;
      }
      if (s == Status::kOk) s = drv.set_access(va, bytes);
    }
    Unreleased undo;
    Status us = Status::kOk;
    if (s != Status::kOk && va != 0) {
      undo.va = va;
      undo.va_bytes = bytes;
      std::uintptr_t at = va;
      for (std::size_t i = 0; i < mapped; ++i) {
        undo.maps.emplace_back(at, std::size_t{pieces[i].n} * unit);
        at += std::size_t{pieces[i].n} * unit;
      }
      us = Teardown(undo, nullptr);
    }
    lk.lock();
    Stitched& r = stitched.at(id);
    r.mapping = false;
    if (us != Status::kOk) {
      ++st.driver_errors;
      Keep(std::move(undo));
    }
    if (s != Status::kOk) return s;
    r.va = va;
    st.stitched_bytes.add(static_cast<std::int64_t>(bytes));
    st.stitch_pieces += pieces.size();
    st.stitched_bytes_total += bytes;
    return Status::kOk;
  }

  // Undoes a failed stitch: returns the lent runs to the free pool with the
  // tags they had (one per run, in order).
  void AbandonStitched(std::uint64_t id, const std::vector<Tag>& tags) {
    Stitched& r = stitched.at(id);
    StitchRefs(r, -1);
    std::vector<Piece> runs;
    ForUsed(r, r.used, [&](std::uint64_t seg, std::uint64_t start,
                           std::uint64_t k) {
      runs.push_back(Piece{seg, start, k});
    });
    for (std::size_t i = 0; i < runs.size(); ++i)
      MakeFree(runs[i].seg, runs[i].start, tags[i]);
    stitched.erase(id);
  }

  // Stitches free chunks (plus, if allowed, a new segment for the
  // shortfall) into a range for n units. Returns kOk and sets *addr on
  // success; kOutOfMemory if stitching cannot serve the request (nothing
  // changed).
  Status TryStitch(std::unique_lock<std::mutex>& lk, std::uint64_t n,
                   Stream s, std::size_t size, std::uintptr_t* addr,
                   AllocState* state) {
    if (!opt.stitch || size < opt.stitch_min) return Status::kOutOfMemory;
    std::vector<Piece> plan;
    std::uint64_t lead = 0;
    const std::uint64_t got = PlanStitch(n, s, &plan, &lead);
    if (plan.empty()) return Status::kOutOfMemory;
    const std::uint64_t shortfall = got < n ? ChunkUp(n - got) / cu : 0;
    if (shortfall > 0 && (!opt.stitch_grow || !ClaimCapacity(shortfall)))
      return Status::kOutOfMemory;
    bool grew = false;
    const std::uint64_t id = next_id++;
    Stitched& r0 = stitched[id];
    r0.pieces = plan;
    r0.lead = lead;
    r0.mapping = true;
    for (const Piece& p : plan) r0.nunits += p.n;
    r0.used = got;
    // Claim the planned units before releasing the lock.
    std::vector<Tag> tags;
    ForUsed(r0, got, [&](std::uint64_t seg, std::uint64_t start,
                         std::uint64_t k) {
      tags.push_back(BlockAt(seg, start).tag);
      Carve(seg, start, k, BlockState::kLent, id);
    });
    StitchRefs(r0, +1);
    if (shortfall > 0) {
      std::uint64_t seg_id = 0;
      Status cs = CreateSegment(lk, shortfall, &seg_id);
      if (cs != Status::kOk) {
        AbandonStitched(id, tags);
        return cs;
      }
      Carve(seg_id, 0, n - got, BlockState::kLent, id);
      Stitched& r = stitched.at(id);
      r.pieces.push_back(Piece{seg_id, 0, shortfall * cu});
      r.nunits += shortfall * cu;
      r.used = n;
      tags.push_back(Tag{});
      segs.at(seg_id).stitch_refs += 1;
      grew = true;
    }
    Status ms = MapStitched(lk, id);
    if (ms != Status::kOk) {
      ++st.driver_errors;
      AbandonStitched(id, tags);
      return ms;
    }
    Stitched& r = stitched.at(id);
    *addr = StitchedAddress(r);
    *state = grew ? AllocState::stitch_grow : AllocState::stitch;
    OnAllocated(*addr, StitchedAlloc(id, size, s), *state);
    return Status::kOk;
  }

  // One pass of the large-request states for n units. kOutOfMemory:
  // nothing fit.
  Status LargeOnce(std::unique_lock<std::mutex>& lk, std::uint64_t n,
                   Stream s, std::size_t size, std::uintptr_t* addr,
                   AllocState* state) {
    FreeKey fit;
    bool found = FindFit(n, s, &fit);
    if (!found && TryReuse(n, s, size, addr)) {
      *state = AllocState::stitch_reuse;
      return Status::kOk;
    }
    // Before mapping or creating anything, see whether frees of other
    // streams have completed meanwhile (an event query each, no wait).
    if (!found && AdvanceStreams(s)) {
      Coalesce();
      FlushDeferredSmall();
      found = FindFit(n, s, &fit);
      if (!found && TryReuse(n, s, size, addr)) {
        *state = AllocState::stitch_reuse;
        return Status::kOk;
      }
    }
    if (!found) {
      Status r = TryStitch(lk, n, s, size, addr, state);
      if (r != Status::kOutOfMemory) return r;
    }
    std::uint64_t seg = 0, start = 0;
    Status r = ClaimPrimary(lk, n, s, BlockState::kLive, 0, &seg, &start,
                            state, found ? &fit : nullptr);
    if (r != Status::kOk) return r;
    Alloc a;
    a.size = size;
    a.rounded = std::size_t{n} * unit;
    a.stream = s;
    a.kind = Kind::kPrimary;
    a.seg = seg;
    a.start = start;
    *addr = segs.at(seg).va + std::size_t{start} * unit;
    OnAllocated(*addr, a, *state);
    return Status::kOk;
  }

  // ---- small requests --------------------------------------------------------

  // A new slab for stream s: one primary block (never a stitch, which would
  // tie a stitched range to the long-lived small pool).
  Status NewSlab(std::unique_lock<std::mutex>& lk, Stream s,
                 std::uint64_t* slab_id) {
    const auto n = static_cast<std::uint64_t>(slab_bytes / unit);
    const std::uint64_t id = next_id++;
    *slab_id = id;
    std::uint64_t seg = 0, start = 0;
    AllocState how;
    Status r =
        ClaimPrimary(lk, n, s, BlockState::kSlab, id, &seg, &start, &how);
    if (r != Status::kOk) return r;
    Slab& sl = slabs[id];
    sl.seg = seg;
    sl.start = start;
    sl.nunits = n;
    sl.base = segs.at(seg).va + std::size_t{start} * unit;
    sl.bytes = slab_bytes;
    sl.stream = s;
    sl.free.emplace(0, slab_bytes);
    slab_by_base.emplace(sl.base, id);
    small_free[s].emplace(slab_bytes, sl.base);
    st.bytes_small_reserved.add(static_cast<std::int64_t>(slab_bytes));
    return Status::kOk;
  }

  // Serves a small request from stream s's slabs; false if none has room.
  bool SmallFromPool(std::size_t size, std::size_t len, Stream s,
                     std::uintptr_t* addr) {
    auto& pool = small_free[s];
    auto it = pool.lower_bound({len, 0});
    if (it == pool.end()) return false;
    const auto [flen, faddr] = *it;
    pool.erase(it);
    const std::uint64_t id =
        std::prev(slab_by_base.upper_bound(faddr))->second;
    Slab& sl = slabs.at(id);
    const std::size_t off = faddr - sl.base;
    sl.free.erase(off);
    if (flen > len) {
      sl.free.emplace(off + len, flen - len);
      pool.emplace(flen - len, faddr + len);
    }
    sl.used += len;
    Alloc a;
    a.size = size;
    a.rounded = len;
    a.stream = s;
    a.kind = Kind::kSmall;
    a.owner = id;
    *addr = faddr;
    OnAllocated(faddr, a, AllocState::small);
    return true;
  }

  // Returns a small range to its slab, merging neighbours; an empty slab
  // goes back to the large pool.
  void ReturnSmall(std::uint64_t slab_id, std::size_t off, std::size_t len) {
    ++changes;
    Slab& sl = slabs.at(slab_id);
    auto& pool = small_free[sl.stream];
    sl.used -= len;
    auto next = sl.free.lower_bound(off);
    if (next != sl.free.end() && next->first == off + len) {
      pool.erase({next->second, sl.base + next->first});
      len += next->second;
      next = sl.free.erase(next);
    }
    if (next != sl.free.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == off) {
        pool.erase({prev->second, sl.base + prev->first});
        off = prev->first;
        len += prev->second;
        sl.free.erase(prev);
      }
    }
    sl.free.emplace(off, len);
    pool.emplace(len, sl.base + off);
    if (sl.used == 0) DropEmptySlab(slab_id);
  }

  // An empty slab's chunks go back to the large pool, tagged with the
  // stream the slab served (its last uses were all ordered on it).
  void DropEmptySlab(std::uint64_t slab_id) {
    Slab& sl = slabs.at(slab_id);
    assert(sl.used == 0 && sl.free.size() == 1);
    small_free[sl.stream].erase({sl.bytes, sl.base});
    sl.free.clear();
    slab_by_base.erase(sl.base);
    st.bytes_small_reserved.add(-static_cast<std::int64_t>(sl.bytes));
    const std::uint64_t seg = sl.seg, start = sl.start;
    const Stream owner_stream = sl.stream;
    slabs.erase(slab_id);
    MakeFree(seg, start, FreeTag(owner_stream));
  }

  // A small range freed on another stream than its slab's waits here until
  // that free is complete; only then may the slab's stream reuse it.
  struct Deferred {
    Tag tag;
    std::uint64_t slab;
    std::size_t off, len;
  };
  std::vector<Deferred> deferred_small;

  void FreeSmall(std::uintptr_t addr, const Alloc& a, Stream s) {
    const Slab& sl = slabs.at(a.owner);
    const std::size_t off = addr - sl.base;
    if (s != sl.stream) {
      deferred_small.push_back(Deferred{FreeTag(s), a.owner, off, a.rounded});
      return;
    }
    ReturnSmall(a.owner, off, a.rounded);
  }

  void FlushDeferredSmall() {
    if (deferred_small.empty()) return;
    std::size_t keep = 0;
    for (std::size_t i = 0; i < deferred_small.size(); ++i) {
      const Deferred d = deferred_small[i];
      if (Safe(d.tag))
        ReturnSmall(d.slab, d.off, d.len);
      else
        deferred_small[keep++] = d;
    }
    deferred_small.resize(keep);
  }

  Status Small(std::unique_lock<std::mutex>& lk, std::size_t size, Stream s,
               std::uintptr_t* addr) {
    const std::size_t len = RoundUp(size, opt.alignment);
    if (SmallFromPool(size, len, s, addr)) return Status::kOk;
    // Ranges freed on other streams come back once those frees are
    // complete, whoever saw them complete (another call may have advanced
    // the streams already).
    if (!deferred_small.empty()) {
      AdvanceStreams();
      FlushDeferredSmall();
      if (SmallFromPool(size, len, s, addr)) return Status::kOk;
    }
    std::uint64_t slab = 0;
    Status r = WithReclaim(lk, [&] { return NewSlab(lk, s, &slab); });
    if (r != Status::kOk) return r;
    SmallFromPool(size, len, s, addr);
    // While NewSlab had the lock released, another call may have freed a
    // range of stream s's older slabs that fits better: then the new slab
    // served nothing, and an empty slab is never freed again, so it goes
    // back to the large pool now.
    if (slabs.at(slab).used == 0) DropEmptySlab(slab);
    return Status::kOk;
  }

  // ---- check -----------------------------------------------------------------

  std::string Check() const {
    std::ostringstream e;
    std::size_t reserved = 0, free_blocks = 0;
    std::unordered_map<std::uint64_t, std::uint64_t> lent_by;  // id -> chunks
    std::unordered_map<std::uint64_t, std::uint64_t> refs;
    for (const auto& [id, r] : stitched) {
      std::set<std::uint64_t> seen;
      std::uint64_t total = 0;
      for (const Piece& p : r.pieces) {
        if (!segs.count(p.seg)) {
          e << "stitched range " << id << " maps missing segment " << p.seg;
          return e.str();
        }
        if (p.start + p.n > segs.at(p.seg).nchunks * cu || p.start % cu ||
            p.n % cu || p.n == 0) {
          e << "stitched range " << id
            << " maps past segment or not whole chunks of " << p.seg;
          return e.str();
        }
        if (seen.insert(p.seg).second) ++refs[p.seg];
        total += p.n;
      }
      if (total != r.nunits) {
        e << "stitched range " << id << " pieces cover " << total
          << " units, expected " << r.nunits;
        return e.str();
      }
      if (r.lead >= cu || r.lead + r.used > r.nunits) {
        e << "stitched range " << id << " lends more chunks than it maps";
        return e.str();
      }
    }
    for (const auto& [id, seg] : segs) {
      reserved += std::size_t{seg.nchunks} * gran;
      std::uint64_t at = 0;
      for (const auto& [start, b] : seg.blocks) {
        if (start != at || b.end <= start || b.end > seg.nchunks * cu) {
          e << "segment " << id << " blocks do not tile it at chunk " << start;
          return e.str();
        }
        at = b.end;
        const std::uint64_t n = b.end - start;
        if (b.state == BlockState::kFree) {
          ++free_blocks;
          if (!free_index.count(FreeKey(n, id, start))) {
            e << "free block " << id << ":" << start << " not indexed";
            return e.str();
          }
        } else if (b.state == BlockState::kLent) {
          auto rit = stitched.find(b.owner);
          if (rit == stitched.end()) {
            e << "block " << id << ":" << start << " lent to missing range";
            return e.str();
          }
          // The block must lie within the lent prefix of its range.
          bool inside = false;
          const Stitched& r = rit->second;
          ForUsed(r, r.used,
                  [&](std::uint64_t sg, std::uint64_t s0, std::uint64_t k) {
                    if (sg == id && start >= s0 && b.end <= s0 + k)
                      inside = true;
                  });
          if (!inside) {
            e << "block " << id << ":" << start
              << " is lent outside its range's live chunks";
            return e.str();
          }
          lent_by[b.owner] += n;
        } else if (b.state == BlockState::kSlab) {
          auto sit = slabs.find(b.owner);
          if (sit == slabs.end() || sit->second.seg != id ||
              sit->second.start != start || sit->second.nunits != n) {
            e << "slab block " << id << ":" << start << " has no slab";
            return e.str();
          }
        } else if (b.state == BlockState::kLive) {
          auto lit = live.find(seg.va + std::size_t{start} * unit);
          if (lit == live.end() || lit->second.kind != Kind::kPrimary ||
              lit->second.rounded != std::size_t{n} * unit) {
            e << "live block " << id << ":" << start << " has no allocation";
            return e.str();
          }
        }
      }
      if (at != seg.nchunks * cu) {
        e << "segment " << id << " blocks end at unit " << at << " of "
          << seg.nchunks * cu;
        return e.str();
      }
      const std::uint64_t want = refs.count(id) ? refs.at(id) : 0;
      if (seg.stitch_refs != want) {
        e << "segment " << id << " stitch_refs " << seg.stitch_refs
          << ", expected " << want;
        return e.str();
      }
    }
    if (free_blocks != free_index.size()) {
      e << "free index has " << free_index.size() << " entries for "
        << free_blocks << " free blocks";
      return e.str();
    }
    std::size_t stitched_va = 0, cached = 0;
    for (const auto& [id, r] : stitched) {
      if (!r.mapping) stitched_va += std::size_t{r.nunits} * unit;
      const std::uint64_t lent = lent_by.count(id) ? lent_by.at(id) : 0;
      const std::uint64_t want = r.used;
      if (lent != want) {
        e << "stitched range " << id << " has " << lent
          << " chunks lent, expected " << want;
        return e.str();
      }
      if (r.cached) ++cached;
      if (r.cached == (r.used > 0) && !r.mapping && !r.dropping) {
        e << "stitched range " << id << " is both live and cached or neither";
        return e.str();
      }
    }
    if (cached != lru.size()) {
      e << "stitch cache holds " << lru.size() << " ids for " << cached
        << " cached ranges";
      return e.str();
    }
    std::size_t in_use = 0, rounded = 0, small_reserved = 0;
    for (const auto& [addr, a] : live) {
      in_use += a.size;
      rounded += a.rounded;
      if (a.size > a.rounded || addr % opt.alignment != 0) {
        e << "allocation " << addr << " is misaligned or over its size";
        return e.str();
      }
      if (a.kind == Kind::kStitched) {
        auto rit = stitched.find(a.owner);
        if (rit == stitched.end() || StitchedAddress(rit->second) != addr ||
            std::size_t{rit->second.used} * unit != a.rounded) {
          e << "stitched allocation " << addr << " does not match its range";
          return e.str();
        }
      }
    }
    for (const auto& [id, sl] : slabs) {
      small_reserved += sl.bytes;
      std::size_t free_bytes = 0;
      for (const auto& [off, len] : sl.free) {
        free_bytes += len;
        auto pit = small_free.find(sl.stream);
        if (pit == small_free.end() || !pit->second.count({len, sl.base + off})) {
          e << "small range at slab " << id << "+" << off << " not indexed";
          return e.str();
        }
      }
      if (free_bytes + sl.used != sl.bytes) {
        e << "slab " << id << " accounts " << free_bytes + sl.used << " of "
          << sl.bytes << " bytes";
        return e.str();
      }
    }
    auto gauge = [&](const char* name, std::int64_t have, std::size_t want) {
      if (e.tellp() == 0 && have != static_cast<std::int64_t>(want))
        e << "gauge " << name << " is " << have << ", expected " << want;
    };
    gauge("bytes_reserved", st.bytes_reserved.current, reserved);
    gauge("bytes_in_use", st.bytes_in_use.current, in_use);
    gauge("bytes_in_use_rounded", st.bytes_in_use_rounded.current, rounded);
    gauge("bytes_small_reserved", st.bytes_small_reserved.current,
          small_reserved);
    gauge("stitched_bytes", st.stitched_bytes.current, stitched_va);
    gauge("segments", st.segments.current, segs.size());
    gauge("live_allocations", st.live_allocations.current, live.size());
    std::size_t held = retrying_held;
    for (const Unreleased& u : unreleased) {
      held += u.held();
      if (u.done()) {
        e << "a released resource is still in the unreleased list";
        return e.str();
      }
    }
    gauge("unreleased", st.unreleased.current, unreleased.size() + retrying);
    gauge("bytes_unreleased", st.bytes_unreleased.current, held);
    if (e.tellp() == 0 &&
        reserved + pending_bytes + releasing_bytes + held > capacity)
      e << "reserved " << reserved << " bytes (and " << held
        << " unreleased) exceed capacity " << capacity;
    return e.str();
  }

  void DebugCheck() const {
#if defined(JAXLAKE_DEBUG) && JAXLAKE_DEBUG
    std::string err = Check();
    if (!err.empty()) {
      std::fprintf(stderr, "jaxlake: invariant broken: %s\n", err.c_str());
      std::abort();
    }
#endif
  }

  std::string Describe() const {
    std::size_t largest = 0, free_chunks = 0;
    if (!free_index.empty()) largest = std::get<0>(*free_index.rbegin());
    for (const auto& k : free_index) free_chunks += std::get<0>(k);
    std::ostringstream o;
    o << "in use " << Bytes(st.bytes_in_use.current) << " (peak "
      << Bytes(st.bytes_in_use.peak) << "), reserved "
      << Bytes(st.bytes_reserved.current) << " (peak "
      << Bytes(st.bytes_reserved.peak) << ") of capacity " << Bytes(capacity)
      << ", free " << Bytes(free_chunks * unit) << " in "
      << free_index.size() << " blocks (largest " << Bytes(largest * unit)
      << "), small pool " << Bytes(st.bytes_small_reserved.current)
      << ", cached stitched ranges " << lru.size() << ", live allocations "
      << live.size();
    return o.str();
  }
};

// ---------------------------------------------------------------------------

Lake::Lake(vmm::Driver& driver, const LakeOptions& options)
    : impl_(std::make_unique<Impl>(driver, options)) {
  assert(ValidateOptions(options, driver).empty());
}

Lake::~Lake() {
  Impl& m = *impl_;
  std::unique_lock<std::mutex> lk(m.mu);
  std::vector<std::uint64_t> ids;
  for (const auto& [id, r] : m.stitched) ids.push_back(id);
  for (std::uint64_t id : ids) m.DropStitched(lk, id);
  for (auto& [id, seg] : m.segs) {
    const std::size_t bytes = std::size_t{seg.nchunks} * m.gran;
    Unreleased u;
    u.maps.emplace_back(seg.va, bytes);
    u.handle = seg.handle;
    u.va = seg.va;
    u.va_bytes = bytes;
    u.phys = bytes;
    if (m.Teardown(u, nullptr) != Status::kOk) m.Keep(std::move(u));
  }
  m.segs.clear();
  // What failed before, and just now, is retried twice more; what still
  // fails is lost (the lake is gone).
  for (int attempt = 0; attempt < 2; ++attempt)
    for (Unreleased& u : m.unreleased)
      if (!u.done()) m.Teardown(u, nullptr);
  for (auto& [s, ss] : m.streams)
    if (ss.event && m.drv.event_destroy(ss.event) != Status::kOk)
      m.drv.event_destroy(ss.event);
}

Status Lake::allocate(std::size_t nbytes, Stream stream,
                      std::uintptr_t* address, AllocState* state) {
  Impl& m = *impl_;
  AllocState dummy;
  if (!state) state = &dummy;
  if (nbytes == 0 || address == nullptr) return Status::kInvalidValue;
  std::unique_lock<std::mutex> lk(m.mu);
  Status r;
  if (nbytes <= m.opt.small_limit) {
    r = m.Small(lk, nbytes, stream, address);
    if (r == Status::kOk) *state = AllocState::small;
  } else {
    const std::size_t chunks = nbytes / m.gran + (nbytes % m.gran != 0);
    if (chunks > m.capacity / m.gran) {
      r = Status::kOutOfMemory;
    } else {
      const auto n = static_cast<std::uint64_t>(RoundUp(nbytes, m.unit) /
                                                m.unit);
      r = m.WithReclaim(lk, [&] {
        return m.LargeOnce(lk, n, stream, nbytes, address, state);
      });
    }
  }
  if (r == Status::kOutOfMemory) {
    ++m.st.ooms;
    m.last_error = "out of memory allocating " + Bytes(nbytes) + " (" +
                   std::to_string(nbytes) + " bytes) on stream " +
                   std::to_string(stream) + ": " + m.Describe();
  } else if (r != Status::kOk) {
    m.last_error = std::string("driver error ") + vmm::StatusName(r) +
                   " allocating " + std::to_string(nbytes) + " bytes: " +
                   m.Describe();
  }
  m.DebugCheck();
  return r;
}

Status Lake::free(std::uintptr_t address, Stream stream) {
  Impl& m = *impl_;
  std::unique_lock<std::mutex> lk(m.mu);
  auto it = m.live.find(address);
  if (it == m.live.end()) return Status::kInvalidValue;
  const Alloc a = it->second;
  m.live.erase(it);
  m.st.bytes_in_use.add(-static_cast<std::int64_t>(a.size));
  m.st.bytes_in_use_rounded.add(-static_cast<std::int64_t>(a.rounded));
  m.st.live_allocations.add(-1);
  ++m.st.frees;
  m.Record(false, address, a.size, stream, AllocState::small);
  switch (a.kind) {
    case Kind::kSmall:
      m.FreeSmall(address, a, stream);
      break;
    case Kind::kPrimary:
      m.MakeFree(a.seg, a.start, m.FreeTag(stream));
      break;
    case Kind::kStitched: {
      const Tag tag = m.FreeTag(stream);
      Stitched& r = m.stitched.at(a.owner);
      std::vector<Piece> used;
      Impl::ForUsed(r, r.used, [&](std::uint64_t seg, std::uint64_t start,
                                   std::uint64_t k) {
        used.push_back(Piece{seg, start, k});
      });
      r.used = 0;
      r.tag = tag;
      r.cached = true;
      m.lru.push_front(a.owner);
      r.lru = m.lru.begin();
      for (const Piece& p : used) m.MakeFree(p.seg, p.start, tag);
      m.TrimCache(lk, m.opt.stitch_cache);
      break;
    }
  }
  m.DebugCheck();
  return Status::kOk;
}

std::size_t Lake::allocation_size(std::uintptr_t address) const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  auto it = impl_->live.find(address);
  return it == impl_->live.end() ? 0 : it->second.size;
}

std::size_t Lake::empty_cache(Status* status) {
  Impl& m = *impl_;
  std::unique_lock<std::mutex> lk(m.mu);
  Status first = Status::kOk;
  std::string error;
  // Whatever the streams' state (another call may have advanced them
  // already): bring back small ranges freed on other streams, then fence
  // the frees that made (and the slabs they emptied).
  m.AdvanceStreams();
  if (!m.deferred_small.empty()) {
    m.FlushDeferredSmall();
    m.AdvanceStreams();
  }
  std::size_t released = m.RetryUnreleased(lk, &first, &error);
  m.TrimCache(lk, 0, &first, &error);
  released += m.ReleaseFreeSegments(lk, &first, &error);  // merges first
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

std::string Lake::check() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return impl_->Check();
}

Stats Lake::stats() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  Stats s = impl_->st;
  s.driver_calls = impl_->drv.calls();
  return s;
}

std::vector<TraceEvent> Lake::trace() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return impl_->trace;
}

std::string Lake::describe() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return impl_->Describe();
}

std::string Lake::last_error() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return impl_->last_error;
}

const LakeOptions& Lake::options() const { return impl_->opt; }
std::size_t Lake::granularity() const { return impl_->gran; }
std::size_t Lake::capacity() const { return impl_->capacity; }
vmm::Driver& Lake::driver() const { return impl_->drv; }


LakeSnapshot Lake::snapshot() const {
  const Impl& m = *impl_;
  std::lock_guard<std::mutex> lk(m.mu);
  LakeSnapshot out;
  out.granularity = m.gran;
  out.capacity = m.capacity;
  // Blocks are split at the alignment; the snapshot shows whole chunks.
  // A chunk takes the state of the units that matter most in it: lent,
  // else live, else slab; it is free only when all its units are free
  // (the chunks stitching can take), and pending when any of them is.
  std::unordered_map<std::uint64_t, std::uint64_t> lent_chunks;
  for (const auto& [id, seg] : m.segs) {
    SnapshotSegment s;
    s.id = id;
    s.va = seg.va;
    s.nchunks = seg.nchunks;
    auto it = seg.blocks.begin();
    for (std::uint64_t c = 0; c < seg.nchunks; ++c) {
      const std::uint64_t lo = c * m.cu, hi = lo + m.cu;
      while (it != seg.blocks.end() && it->second.end <= lo) ++it;
      SnapshotRun r;
      r.start = c;
      r.end = c + 1;
      int rank = 0;  // 0 free, 1 slab, 2 live, 3 lent
      for (auto b = it; b != seg.blocks.end() && b->first < hi; ++b) {
        const Block& blk = b->second;
        int k = 0;
        if (blk.state == BlockState::kLent) k = 3;
        else if (blk.state == BlockState::kLive) k = 2;
        else if (blk.state == BlockState::kSlab) k = 1;
        if (k == 0 && !m.Safe(blk.tag)) r.pending = true;
        if (k <= rank) continue;
        rank = k;
        r.owner = blk.owner;
        r.address = k == 2 ? seg.va + std::size_t{b->first} * m.unit : 0;
      }
      r.state = rank == 3   ? ChunkState::kLent
                : rank == 2 ? ChunkState::kLive
                : rank == 1 ? ChunkState::kSlab
                            : ChunkState::kFree;
      if (rank != 0) r.pending = false;
      if (rank == 3) ++lent_chunks[r.owner];
      SnapshotRun* last = s.runs.empty() ? nullptr : &s.runs.back();
      if (last && last->state == r.state && last->owner == r.owner &&
          last->address == r.address && last->pending == r.pending) {
        last->end = r.end;
      } else {
        s.runs.push_back(r);
      }
    }
    for (const SnapshotRun& r : s.runs) {
      if (r.state != ChunkState::kFree) continue;
      out.free_chunks += r.end - r.start;
      out.largest_free =
          std::max<std::size_t>(out.largest_free, r.end - r.start);
    }
    out.segments.push_back(std::move(s));
  }
  for (const auto& [id, r] : m.stitched) {
    SnapshotStitched s;
    s.id = id;
    s.va = r.va;
    s.nchunks = r.nunits / m.cu;
    auto lc = lent_chunks.find(id);
    s.used = r.mapping || lc == lent_chunks.end() ? 0 : lc->second;
    s.cached = r.cached;
    s.busy = r.mapping || r.dropping;
    for (const Piece& p : r.pieces)
      s.pieces.push_back(SnapshotPiece{p.seg, p.start / m.cu, p.n / m.cu});
    out.stitched.push_back(std::move(s));
  }
  for (const auto& [id, sl] : m.slabs)
    out.slabs.push_back(SnapshotSlab{id, sl.seg, sl.start / m.cu,
                                     sl.nunits / m.cu,
                                     sl.base, sl.bytes, sl.used, sl.stream});
  auto by_id = [](const auto& a, const auto& b) { return a.id < b.id; };
  std::sort(out.segments.begin(), out.segments.end(), by_id);
  std::sort(out.stitched.begin(), out.stitched.end(), by_id);
  std::sort(out.slabs.begin(), out.slabs.end(), by_id);
  return out;
}

}  // namespace jaxlake
