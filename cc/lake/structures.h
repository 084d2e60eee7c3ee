// jaxlake: the lake's data structures (blocks, segments, stitched ranges,
// slabs, the node pool and the segment and live tables), private to
// cc/lake/ like lake_impl.h, which holds the lake's state (Lake::Impl)
// built from them; not installed. See docs/design.md, "Structures".
#ifndef JAXLAKE_CC_LAKE_STRUCTURES_H_
#define JAXLAKE_CC_LAKE_STRUCTURES_H_

#include "cc/lake/lake.h"

#include <cassert>
#include <cstdint>
#include <cstdio>
#include <list>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

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
    return NewNode((c + 1) * 8);
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
  void* NewNode(std::size_t size) {
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
  // The growth range its VA lies in (the range's base address): segments
  // are placed back to back in it and do not own their VA.
  std::uintptr_t range = 0;
  BlockMap blocks;  // start unit -> block
  // Listed in the lake's open_ends (lake_impl.h).
  bool open_end = false;
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
  // Its pieces lie back to back at their segments' own addresses in one
  // growth range: va is the first piece's primary address and nothing is
  // reserved or mapped for it.
  bool alias = false;
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

// A stitch's last piece when it is a free head: the chunk that starts at
// unit `start` of segment `seg`, whose first `use` units (free) end the
// request; use == 0: none (docs/design.md, "One pool").
struct Head {
  std::uint64_t seg = 0, start = 0, use = 0;
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

// One virtual reservation that new segments are placed in back to back
// (Lake::Impl::ranges), so that a segment made to grow the lake starts
// where the previous one ends. Its VA is freed with its last segment.
struct GrowthRange {
  std::size_t bytes = 0;      // reserved
  std::size_t next = 0;       // offset of the next segment's VA
  std::uint64_t segments = 0; // segments placed in it, live or being made
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
}  // namespace jaxlake

#endif  // JAXLAKE_CC_LAKE_STRUCTURES_H_
