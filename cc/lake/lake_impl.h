// jaxlake: the lake's private state (Lake::Impl), shared by the files of
// cc/lake/ that implement it; not installed. The allocation order is in
// lake.cc; see docs/design.md for the data structures and invariants.
#ifndef JAXLAKE_CC_LAKE_LAKE_IMPL_H_
#define JAXLAKE_CC_LAKE_LAKE_IMPL_H_

#include "cc/lake/lake.h"

#include <algorithm>
#include <cassert>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <tuple>
#include <unordered_map>
#include <utility>

namespace jaxlake {
namespace detail {

using vmm::Event;
using vmm::Handle;
using vmm::Status;
using vmm::Stream;

inline bool IsPow2(std::size_t x) { return x != 0 && (x & (x - 1)) == 0; }
inline int Log2(std::size_t pow2) {
  int k = 0;
  while ((std::size_t{1} << k) < pow2) ++k;
  return k;
}
inline std::size_t RoundUp(std::size_t x, std::size_t to) {
  return (x + to - 1) / to * to;
}

inline std::string Bytes(std::size_t b) {
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

// ---------------------------------------------------------------------------
// Data structures.

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
// back without malloc. New nodes are carved from 4 KiB blocks, so that a
// lake's warm-up (every allocation a first-time node) calls malloc once per
// block, not once per node. Blocks go back only with the pool. Guarded by
// the lake's mutex like the containers.
class NodePool {
 public:
  NodePool() = default;
  NodePool(const NodePool&) = delete;
  NodePool& operator=(const NodePool&) = delete;
  ~NodePool() {
    for (void* b : blocks_) ::operator delete(b);
  }
  void* get(std::size_t bytes) {
    const std::size_t c = Class(bytes);
    if (c >= kClasses) return ::operator new(bytes);
    if (void* p = free_[c]) {
      free_[c] = *static_cast<void**>(p);
      return p;
    }
    return Carve((c + 1) * 8);
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
  static constexpr std::size_t kBlock = 4096;
  static std::size_t Class(std::size_t bytes) { return (bytes + 7) / 8 - 1; }
  // A new node of `size` bytes from the current block (a new one when it
  // has no room left; what the old one had left is not used).
  void* Carve(std::size_t size) {
    if (left_ < size) {
      blocks_.push_back(::operator new(kBlock));
      next_ = static_cast<char*>(blocks_.back());
      left_ = kBlock;
    }
    void* p = next_;
    next_ += size;
    left_ -= size;
    return p;
  }
  void* free_[kClasses] = {};
  std::vector<void*> blocks_;
  char* next_ = nullptr;
  std::size_t left_ = 0;
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
    static_assert(alignof(T) <= 8, "NodePool nodes are 8-byte aligned");
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

// The segments by id. Ids grow from 1 and are never reused (snapshots and
// the trace name segments by id), so a lookup is an index into a vector,
// not a hash: every split and free looks its segment up. The vector starts
// at the oldest live id; it holds one pointer per segment created since,
// live or not (released ones are null), and drops its leading nulls once
// they are half of it.
class SegmentTable {
 public:
  SegmentTable() = default;
  SegmentTable(const SegmentTable&) = delete;
  SegmentTable& operator=(const SegmentTable&) = delete;

  // A new segment and its id.
  std::pair<std::uint64_t, Segment*> add(NodePool* nodes) {
    if (slots_.empty()) first_ = next_;
    slots_.push_back(std::make_unique<Segment>(nodes));
    ++count_;
    return {next_++, slots_.back().get()};
  }
  Segment* find(std::uint64_t id) {
    return id >= first_ && id - first_ < slots_.size()
               ? slots_[id - first_].get()
               : nullptr;
  }
  const Segment* find(std::uint64_t id) const {
    return const_cast<SegmentTable*>(this)->find(id);
  }
  // The segment with this id, which must exist.
  Segment& at(std::uint64_t id) {
    Segment* s = find(id);
    assert(s != nullptr);
    return *s;
  }
  const Segment& at(std::uint64_t id) const {
    return const_cast<SegmentTable*>(this)->at(id);
  }
  bool contains(std::uint64_t id) const { return find(id) != nullptr; }
  // Takes the segment out of the table.
  std::unique_ptr<Segment> remove(std::uint64_t id) {
    std::unique_ptr<Segment> out = std::move(slots_[id - first_]);
    assert(out != nullptr);
    --count_;
    while (lead_ < slots_.size() && slots_[lead_] == nullptr) ++lead_;
    if (lead_ == slots_.size()) {
      slots_.clear();
      lead_ = 0;
    } else if (2 * lead_ >= slots_.size()) {
      slots_.erase(slots_.begin(),
                   slots_.begin() + static_cast<std::ptrdiff_t>(lead_));
      first_ += lead_;
      lead_ = 0;
    }
    return out;
  }
  std::size_t size() const { return count_; }
  void clear() {
    slots_.clear();
    count_ = 0;
    lead_ = 0;
  }
  // Iteration in id order yields (id, segment&) pairs by value:
  //   for (auto [id, seg] : segs) ...
  template <typename S>
  class Iter {
   public:
    Iter(const SegmentTable* t, std::size_t i) : t_(t), i_(i) { skip(); }
    std::pair<std::uint64_t, S&> operator*() const {
      return {t_->first_ + i_, *t_->slots_[i_]};
    }
    Iter& operator++() {
      ++i_;
      skip();
      return *this;
    }
    bool operator!=(const Iter& o) const { return i_ != o.i_; }

   private:
    void skip() {
      while (i_ < t_->slots_.size() && t_->slots_[i_] == nullptr) ++i_;
    }
    const SegmentTable* t_;
    std::size_t i_;
  };
  Iter<Segment> begin() { return {this, 0}; }
  Iter<Segment> end() { return {this, slots_.size()}; }
  Iter<const Segment> begin() const { return {this, 0}; }
  Iter<const Segment> end() const { return {this, slots_.size()}; }

 private:
  std::vector<std::unique_ptr<Segment>> slots_;  // slots_[i]: id first_ + i
  std::uint64_t first_ = 1;
  std::uint64_t next_ = 1;
  std::size_t count_ = 0;
  std::size_t lead_ = 0;  // leading null slots
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

// Live allocations by address. Open addressing with linear probing in a
// power-of-two table kept at most three quarters full (64-byte slots: a
// million live allocations take 128 MiB, against about 80 MiB of nodes and
// buckets in a std::unordered_map); address 0 (never an
// allocation's) marks an empty slot, and erase shifts the entries after it
// back, so there are no tombstones. Every allocation inserts and every free
// finds and erases: unlike std::unordered_map, no node is allocated and no
// division is made.
class LiveTable {
 public:
  struct Entry {
    std::uintptr_t first = 0;  // the address; 0: empty slot
    Alloc second;
  };
  explicit LiveTable(std::size_t slots) { Resize(slots); }
  LiveTable(const LiveTable&) = delete;
  LiveTable& operator=(const LiveTable&) = delete;

  Entry* find(std::uintptr_t addr) {
    if (addr == 0) return nullptr;
    for (std::size_t i = Home(addr);; i = (i + 1) & mask_) {
      if (slots_[i].first == addr) return &slots_[i];
      if (slots_[i].first == 0) return nullptr;
    }
  }
  const Entry* find(std::uintptr_t addr) const {
    return const_cast<LiveTable*>(this)->find(addr);
  }
  // addr must not be 0 nor already in the table.
  void insert(std::uintptr_t addr, const Alloc& a) {
    assert(addr != 0 && find(addr) == nullptr);
    if (4 * (size_ + 1) > 3 * slots_.size()) Resize(2 * slots_.size());
    std::size_t i = Home(addr);
    while (slots_[i].first != 0) i = (i + 1) & mask_;
    slots_[i].first = addr;
    slots_[i].second = a;
    ++size_;
  }
  // e must come from find().
  void erase(Entry* e) {
    std::size_t i = static_cast<std::size_t>(e - slots_.data());
    slots_[i].first = 0;
    --size_;
    // Moves back each following entry whose home is not in (i, j].
    for (std::size_t j = (i + 1) & mask_; slots_[j].first != 0;
         j = (j + 1) & mask_) {
      const std::size_t k = Home(slots_[j].first);
      const bool stays = i <= j ? (i < k && k <= j) : (i < k || k <= j);
      if (stays) continue;
      slots_[i] = slots_[j];
      slots_[j].first = 0;
      i = j;
    }
  }
  std::size_t size() const { return size_; }

  // Iteration over the entries (for (const auto& [addr, a] : live)).
  class Iter {
   public:
    Iter(const Entry* p, const Entry* end) : p_(p), end_(end) { skip(); }
    const Entry& operator*() const { return *p_; }
    Iter& operator++() {
      ++p_;
      skip();
      return *this;
    }
    bool operator!=(const Iter& o) const { return p_ != o.p_; }

   private:
    void skip() {
      while (p_ != end_ && p_->first == 0) ++p_;
    }
    const Entry* p_;
    const Entry* end_;
  };
  Iter begin() const {
    return {slots_.data(), slots_.data() + slots_.size()};
  }
  Iter end() const {
    return {slots_.data() + slots_.size(), slots_.data() + slots_.size()};
  }

 private:
  // Fibonacci hashing: the top bits of the address times 2^64 / phi.
  std::size_t Home(std::uintptr_t addr) const {
    return static_cast<std::size_t>(
        (static_cast<std::uint64_t>(addr) * 0x9E3779B97F4A7C15ull) >> shift_);
  }
  void Resize(std::size_t slots) {
    std::vector<Entry> old;
    old.swap(slots_);
    slots_.resize(slots);
    mask_ = slots - 1;
    shift_ = 64 - Log2(slots);
    size_ = 0;
    for (const Entry& e : old)
      if (e.first != 0) insert(e.first, e.second);
  }
  std::vector<Entry> slots_;
  std::size_t mask_ = 0;
  int shift_ = 64;
  std::size_t size_ = 0;
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

}  // namespace detail

using namespace detail;  // NOLINT(build/namespaces): private header

struct Lake::Impl {
  vmm::Driver& drv;
  LakeOptions opt;
  std::size_t gran;
  std::size_t unit;   // bytes per unit (the alignment, a power of two)
  int unit_shift;     // log2(unit)
  std::uint64_t cu;   // units per chunk
  std::size_t capacity;
  std::size_t max_request;  // the most bytes of whole chunks in capacity
  std::size_t slab_bytes;
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();

  mutable std::mutex mu;
  NodePool nodes;  // before the containers that use it
  SegmentTable segs;
  FreeIndex free_index{NodeAlloc<FreeKey>(&nodes)};  // by (units, seg, start)
  std::unordered_map<std::uint64_t, Stitched> stitched;
  std::list<std::uint64_t> lru;  // cached stitched ids, most recent first
  std::unordered_map<std::uint64_t, Slab> slabs;
  std::map<std::uintptr_t, std::uint64_t> slab_by_base;
  // Per stream: free small ranges as (length, address).
  std::unordered_map<Stream, std::set<std::pair<std::size_t, std::uintptr_t>>>
      small_free;
  std::uint64_t next_id = 1;
  // Room for 1,536 live allocations before the table first grows (a
  // growth moves every entry, inside a timed allocation).
  LiveTable live{2048};
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
        unit_shift(Log2(o.alignment)),
        cu(static_cast<std::uint64_t>(d.granularity() / o.alignment)),
        capacity(o.capacity ? o.capacity : d.total_memory()),
        max_request(capacity / gran * gran),
        slab_bytes(o.small_slab ? o.small_slab : d.granularity()) {
  }

  // ---- stream ordering and events (streams.cc) -------------------------
  // The state of stream s, made on first use. The last one used is kept
  // at hand: most frees in a row come from one stream. (Entries are never
  // erased, and an unordered_map's elements do not move.)
  StreamState& StreamOf(Stream s) {
    if (last_state_ == nullptr || last_stream_ != s) {
      last_state_ = &streams[s];
      last_stream_ = s;
    }
    return *last_state_;
  }
  Stream last_stream_ = 0;
  StreamState* last_state_ = nullptr;
  Tag FreeTag(Stream s) { return Tag{s, ++StreamOf(s).free_seq}; }
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
  bool AdvanceStreams(std::optional<Stream> except = std::nullopt);

  // Marks the frees of a stream up to `seq` complete.
  void Complete(StreamState& ss, std::uint64_t seq) {
    if (seq > ss.completed) {
      ss.completed = seq;
      ++changes;
    }
  }
  bool WaitStreams(std::unique_lock<std::mutex>& lk);

  // ---- blocks, gauges and segments (arena.cc) --------------------------
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
  void Carve(std::uint64_t seg_id, std::uint64_t start, std::uint64_t n,
             BlockState state, std::uint64_t owner);
  bool MergeTags(const Tag& a, const Tag& b, Tag* out) const;
  void MakeFree(std::uint64_t seg_id, std::uint64_t start, Tag tag);
  void Coalesce();
  bool RangeFree(std::uint64_t seg_id, std::uint64_t start, std::uint64_t n,
                 Stream s) const;
  // Appends to the trace when it is on (the check is inline: the trace is
  // off by default and every allocation and free passes here).
  void Record(bool allocate, std::uintptr_t addr, std::size_t size, Stream s,
              AllocState state) {
    if (opt.record_trace) RecordEvent(allocate, addr, size, s, state);
  }
  void RecordEvent(bool allocate, std::uintptr_t addr, std::size_t size,
                   Stream s, AllocState state);
  void OnAllocated(std::uintptr_t addr, const Alloc& a, AllocState state);
  Status CreateSegment(std::unique_lock<std::mutex>& lk, std::uint64_t n,
                       std::uint64_t* seg_out);
  bool ClaimCapacity(std::uint64_t n);
  bool FindFit(std::uint64_t n, Stream s, FreeKey* out) const;
  Status ClaimPrimary(std::unique_lock<std::mutex>& lk, std::uint64_t n,
                      Stream s, BlockState state, std::uint64_t owner,
                      std::uint64_t* seg_out, std::uint64_t* start_out,
                      AllocState* how, const FreeKey* found = nullptr);

  // ---- reclaim and releasing driver resources (reclaim.cc) ---------
  Status Teardown(Unreleased& u, const char** what);
  void Keep(Unreleased&& u);
  std::size_t RetryUnreleased(std::unique_lock<std::mutex>& lk,
                              Status* status, std::string* error);
  void Report(Status s, const char* what, Status* status,
              std::string* error);
  std::size_t ReleaseFreeSegments(std::unique_lock<std::mutex>& lk,
                                  Status* status = nullptr,
                                  std::string* error = nullptr);

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

  // ---- stitched ranges and their cache (stitch.cc) ---------------------
  void StitchRefs(const Stitched& r, int delta);

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
  Status DropStitched(std::unique_lock<std::mutex>& lk, std::uint64_t id,
                      const char** what = nullptr);
  void TrimCache(std::unique_lock<std::mutex>& lk, std::size_t keep,
                 Status* status = nullptr, std::string* error = nullptr);
  Alloc StitchedAlloc(std::uint64_t id, std::size_t size, Stream s) const;
  std::uintptr_t StitchedAddress(const Stitched& r) const {
    return r.va + std::size_t{r.lead} * unit;
  }

  // Cached ranges large enough for a request whose units are checked, most
  // recently freed first: a bound on the cost of a miss (a training step
  // reuses the ranges its previous step freed, which come first).
  static constexpr int kReuseCandidates = 8;
  bool TryReuse(std::uint64_t n, Stream s, std::size_t size,
                std::uintptr_t* addr);

  // Free blocks of less than a chunk checked as the lead of a stitch.
  static constexpr int kLeadCandidates = 16;
  std::uint64_t PlanStitch(std::uint64_t n, Stream s,
                           std::vector<Piece>* plan, std::uint64_t* lead);
  Status MapStitched(std::unique_lock<std::mutex>& lk, std::uint64_t id);
  void AbandonStitched(std::uint64_t id, const std::vector<Tag>& tags);
  Status TryStitch(std::unique_lock<std::mutex>& lk, std::uint64_t n,
                   Stream s, std::size_t size, std::uintptr_t* addr,
                   AllocState* state);

  // ---- the large-request states in allocation order (lake.cc) ----------
  Status LargeOnce(std::unique_lock<std::mutex>& lk, std::uint64_t n,
                   Stream s, std::size_t size, std::uintptr_t* addr,
                   AllocState* state);

  // ---- small requests (small_pool.cc) ----------------------------------
  Status NewSlab(std::unique_lock<std::mutex>& lk, Stream s,
                 std::uint64_t* slab_id);
  bool SmallFromPool(std::size_t size, std::size_t len, Stream s,
                     std::uintptr_t* addr);
  void ReturnSmall(std::uint64_t slab_id, std::size_t off, std::size_t len);
  void DropEmptySlab(std::uint64_t slab_id);

  // A small range freed on another stream than its slab's waits here until
  // that free is complete; only then may the slab's stream reuse it.
  struct Deferred {
    Tag tag;
    std::uint64_t slab;
    std::size_t off, len;
  };
  std::vector<Deferred> deferred_small;
  void FreeSmall(std::uintptr_t addr, const Alloc& a, Stream s);
  void FlushDeferredSmall();
  Status Small(std::unique_lock<std::mutex>& lk, std::size_t size, Stream s,
               std::uintptr_t* addr);

  // ---- check and describe (check.cc) -----------------------------------
  std::string Check() const;
  // Debug builds: Check() after every operation, aborting on a broken
  // invariant. Release builds: nothing.
  void DebugCheck() const {
#if defined(JAXLAKE_DEBUG) && JAXLAKE_DEBUG
    FailOnBrokenInvariant();
#endif
  }
  void FailOnBrokenInvariant() const;
  std::string Describe() const;
};

}  // namespace jaxlake

#endif  // JAXLAKE_CC_LAKE_LAKE_IMPL_H_
