// jaxlake: the stitching allocator (the policy engine).
//
// The lake serves device-memory requests from physical handles obtained
// through a vmm::Driver. It knows nothing else about the device.
//
// Vocabulary (see docs/design.md for the full picture):
//   chunk     one granule of physical memory (driver granularity, 2 MiB)
//   segment   one physical handle of N chunks, mapped once at its own
//             (primary) virtual range; its chunks form primary blocks
//   block     a run of units of one segment: free, live, or lent to a
//             stitched range
//   stitched  a separate virtual range onto which runs of whole chunks from
//             several segments are mapped in order; it adds no physical
//             memory
//   unit      the alignment (256 B): blocks are split at units inside
//             segments, so a request holds at most one unit more than it
//             asked for; maps and stitches still work in whole chunks
//   small     requests <= small_limit (0 by default: none) are carved out of
//             per-stream slabs instead of the shared blocks
//
// Allocation order for a request of n units on stream s:
//   fit/split     a free block usable by s with >= n units (best fit),
//                 from its start
//   stitch reuse  a cached stitched range whose n units are all free
//   span          a free run across back-to-back segments (tail of one,
//                 wholly free ones, head of the next): an alias, no call
//   stitch        the whole free chunks of free blocks, largest first,
//                 mapped into a new range; a free tail (free units up to a
//                 chunk's end) may lead it and a free head (free units
//                 from a chunk's start) end it, where that saves whole
//                 chunks
//   stitch grow   as above, creating the shortfall as a new segment
//                 (placed after the newest segment: a free tail at the
//                 growth edge and the shortfall need no stitched mapping),
//                 sized as a growth while nothing was freed since the
//                 last growth
//   edge grow     a new segment right after the free run at the growth
//                 edge, spanned with it, when that saves a chunk
//   grow          a new segment of the whole chunks n units need, and,
//                 while nothing was freed since the last growth, at least
//                 1/16 of what the lake holds where the capacity left
//                 allows (the rest stays free)
// New segments lie back to back in one growing virtual reservation
// (docs/design.md, "Growth").
//   reclaim       wait for pending events, retry failed releases, drop
//                 cached stitched ranges, release free segments, retry
//                 (also after changes other threads made meanwhile)
//   wide stitch   the stitch planned again with its ends looked for among
//                 every free block (a head may share the tail's chunk,
//                 mapped twice); then out of memory.
//
// Thread safety: all public methods may be called concurrently. One mutex
// guards the bookkeeping; driver calls that create, map or unmap memory are
// made with it released, after the pieces involved have been claimed.
#ifndef JAXLAKE_LAKE_LAKE_H_
#define JAXLAKE_LAKE_LAKE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cc/stats/stats.h"
#include "cc/vmm/driver.h"

namespace jaxlake {

// The lake's options: one field per row of options.inc (type, name, default
// and meaning are there).
struct LakeOptions {
#define JAXLAKE_LAKE_OPTION(type, field, default_value, help) \
  type field = default_value;
#include "cc/lake/options.inc"
#undef JAXLAKE_LAKE_OPTION
};

// How an allocation was served. Order matches the policy above.
#define JAXLAKE_ALLOC_STATES(X) \
  X(small)                      \
  X(fit)                        \
  X(split)                      \
  X(stitch_reuse)               \
  X(stitch)                     \
  X(stitch_grow)                \
  X(grow)

enum class AllocState : std::uint8_t {
#define JAXLAKE_X(name) name,
  JAXLAKE_ALLOC_STATES(JAXLAKE_X)
#undef JAXLAKE_X
};
const char* AllocStateName(AllocState s);

// Checks options against a driver. Returns an empty string when they are
// valid, else a message naming the option, its value and what is expected.
// The Lake constructor requires valid options.
std::string ValidateOptions(const LakeOptions& options,
                            const vmm::Driver& driver);

struct TraceEvent {
  std::uint64_t time_ns;   // steady clock, from the lake's creation
  bool allocate;           // true: allocate, false: free
  std::uintptr_t address;
  std::size_t size;        // requested bytes
  vmm::Stream stream;
  AllocState state;        // how it was served (allocations only)
};

// A copy of the lake's layout at one moment (Lake::snapshot()), in plain
// structs, for viewers and tests; never used on the allocation path.
// Each segment is tiled by runs of chunks in one state. Blocks are split
// at the alignment, so one chunk may hold units in several states: it shows
// lent if any unit is lent (owner: the first such range), else live (the
// first live block's address), else slab, and free only when all its units
// are free (the chunks a stitch can take).
enum class ChunkState : std::uint8_t {
  kFree,  // in the free pool (stitchable)
  kLive,  // a primary allocation (address = its address)
  kLent,  // lent to a stitched range (owner = the range's id)
  kSlab,  // a small-pool slab (owner = the slab's id)
};

struct SnapshotRun {
  std::uint64_t start = 0;  // first chunk
  std::uint64_t end = 0;    // one past the last chunk
  ChunkState state = ChunkState::kFree;
  std::uint64_t owner = 0;
  std::uintptr_t address = 0;
  // kFree: freed on a stream whose free is not yet known complete, so only
  // that stream may use it now.
  bool pending = false;
};

struct SnapshotSegment {
  std::uint64_t id = 0;
  std::uintptr_t va = 0;
  std::uint64_t nchunks = 0;
  std::vector<SnapshotRun> runs;  // in chunk order, tiling the segment
};

struct SnapshotPiece {
  std::uint64_t segment = 0;
  std::uint64_t start = 0;
  std::uint64_t nchunks = 0;
};

struct SnapshotStitched {
  std::uint64_t id = 0;
  std::uintptr_t va = 0;     // 0 while being mapped
  std::uint64_t nchunks = 0;
  std::uint64_t used = 0;    // chunks shown lent to it (see above); 0
                             // while it is being mapped
  std::uintptr_t address = 0;  // its live allocation's address (va, or
                               // past a free tail that leads the range);
                               // 0 when none
  bool cached = false;       // freed and kept mapped for reuse
  bool busy = false;         // being mapped or unmapped right now
  std::vector<SnapshotPiece> pieces;  // in address order
};

struct SnapshotSlab {
  std::uint64_t id = 0;
  std::uint64_t segment = 0;
  std::uint64_t start = 0;
  std::uint64_t nchunks = 0;
  std::uintptr_t base = 0;
  std::size_t bytes = 0;
  std::size_t used = 0;      // bytes handed out
  vmm::Stream stream = 0;
};

// Where the physical bytes the lake holds go, in bytes (LakeSnapshot::held;
// benchmarks/traces/why_over.py prints it at a trace's fit capacity). The
// parts add up to `held`. Free units are sorted by where they lie in their
// chunk, since a stitch maps whole chunks: a wholly free chunk can go
// anywhere in a stitched range; free units in a chunk that also holds
// other units only at a range's ends (a free tail, ending at the chunk's
// end, as its first piece; a free head, starting at the chunk's start, as
// its last), or inside it (touching neither end) only by a request that
// fits there.
struct HeldBreakdown {
  std::size_t held = 0;         // physical bytes of the segments
  std::size_t live = 0;         // requested bytes of live allocations
  std::size_t rounding = 0;     // held by live allocations past their request
  std::size_t free_chunks = 0;  // wholly free chunks
  std::size_t free_tails = 0;   // free units ending a partly used chunk
  std::size_t free_heads = 0;   // free units starting a partly used chunk
  std::size_t free_inner = 0;   // free units touching neither end of theirs
  std::size_t slab_free = 0;    // small-pool slab bytes not handed out
  std::size_t largest_tail = 0;
  std::size_t largest_head = 0;
  std::size_t stitched_cached = 0;  // VA bytes of cached stitched ranges
                                    // (no physical memory of their own)
};

struct LakeSnapshot {
  std::size_t granularity = 0;
  std::size_t capacity = 0;
  HeldBreakdown held;
  std::vector<SnapshotSegment> segments;   // by id
  std::vector<SnapshotStitched> stitched;  // by id
  std::vector<SnapshotSlab> slabs;         // by id
  std::size_t free_chunks = 0;     // chunks in the free pool
  std::size_t largest_free = 0;    // chunks of the largest free block
};

class Lake {
 public:
  // The driver must outlive the lake.
  Lake(vmm::Driver& driver, const LakeOptions& options);
  // Unmaps and releases everything (live allocations too), once the events
  // of pending frees completed: it waits for the streams' work first.
  ~Lake();
  Lake(const Lake&) = delete;
  Lake& operator=(const Lake&) = delete;

  // kOk and *address set; kInvalidValue for nbytes == 0; kOutOfMemory when
  // the request cannot be served even after reclaiming; other statuses are
  // driver failures (the lake stays consistent and usable after any).
  vmm::Status allocate(std::size_t nbytes, vmm::Stream stream,
                       std::uintptr_t* address, AllocState* state = nullptr);
  // kInvalidValue if address is not a live allocation of this lake.
  vmm::Status free(std::uintptr_t address, vmm::Stream stream);

  // Requested size of a live allocation, 0 if address is not live.
  std::size_t allocation_size(std::uintptr_t address) const;

  // Drops cached stitched ranges and releases every free segment whose
  // last use is complete; first retries the releases the driver refused
  // earlier. Returns the physical bytes the driver gave back. *status (when
  // given) is kOk, or the first driver failure: what failed is kept, counted
  // in the stats (unreleased, bytes_unreleased) and retried by the next
  // empty_cache(), under memory pressure and at destruction; last_error()
  // tells what failed.
  std::size_t empty_cache(vmm::Status* status = nullptr);
  // empty_cache() once the streams' pending frees are known complete: it
  // first records an event after every stream's frees and waits for them
  // (lock released), as the lake's own reclaim does, so that memory freed
  // on a stream whose queued work has not been seen to finish is released
  // too. Blocks until that work ran. For memory pressure from outside the
  // lake (the shim, when another allocation finds the device full).
  std::size_t release_cached();

  // Validates every invariant. Returns an empty string when all hold, else a
  // description of the first broken one.
  std::string check() const;

  Stats stats() const;
  std::vector<TraceEvent> trace() const;
  // A readable summary of the lake's figures (used in out-of-memory errors).
  std::string describe() const;
  // The message for the last kOutOfMemory or driver failure of allocate(),
  // or for the last driver failure of empty_cache().
  std::string last_error() const;

  const LakeOptions& options() const;
  std::size_t granularity() const;
  std::size_t capacity() const;
  vmm::Driver& driver() const;

  // A copy of the layout (segments, stitched ranges, slabs) under the lock.
  LakeSnapshot snapshot() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace jaxlake

#endif  // JAXLAKE_LAKE_LAKE_H_
