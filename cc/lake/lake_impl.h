// jaxlake: the lake's private state (Lake::Impl), shared by the files of
// cc/lake/ that implement it; not installed. Impl holds the lock, the
// statistics, the segments and blocks and the allocation path, and owns
// the components: the stream clock (stream_clock.h), the stitch cache
// (stitch_cache.h) and the small pool (small_pool.h). The allocation order
// is in lake.cc, the data structures in structures.h, the lock's
// annotations in thread_annotations.h; see docs/design.md for the
// invariants.
#ifndef JAXLAKE_CC_LAKE_LAKE_IMPL_H_
#define JAXLAKE_CC_LAKE_LAKE_IMPL_H_

#include "cc/lake/lake.h"
#include "cc/lake/small_pool.h"
#include "cc/lake/stitch_cache.h"
#include "cc/lake/stream_clock.h"
#include "cc/lake/structures.h"
#include "cc/lake/thread_annotations.h"

#include <algorithm>
#include <cassert>
#include <chrono>
#include <condition_variable>
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

using namespace detail;  // NOLINT(build/namespaces): private header

struct Lake::Impl {
  vmm::Driver& drv;
  LakeOptions opt;
  std::size_t gran;
  std::size_t unit;   // bytes per unit (the alignment, a power of two)
  int unit_shift;     // log2(unit)
  std::uint64_t chunk_units;  // units per chunk
  std::size_t capacity;
  std::size_t max_request;  // the most bytes of whole chunks in capacity
  std::size_t slab_bytes;
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();

  mutable Mutex mu;
  // Before the containers that use it.
  NodePool nodes JAXLAKE_GUARDED_BY(mu);
  SegmentTable segs JAXLAKE_GUARDED_BY(mu);
  // By (units, seg, start).
  FreeIndex free_index JAXLAKE_GUARDED_BY(mu){NodeAlloc<FreeKey>(&nodes)};
  // Stitched ranges, live or cached (stitch_cache.h).
  StitchCache stitches JAXLAKE_GUARDED_BY(mu);
  // Growth ranges by base address; new segments go into `current_range`
  // (0: none yet), back to back (docs/design.md, "Growth").
  std::map<std::uintptr_t, GrowthRange> ranges JAXLAKE_GUARDED_BY(mu);
  // Segments by primary address: the neighbours of a segment in its growth
  // range, for free runs that cross segment boundaries.
  std::map<std::uintptr_t, std::uint64_t> seg_by_va JAXLAKE_GUARDED_BY(mu);
  // Segments by the address right after them (EndOf), among them every
  // segment whose last block is free: where a free run across a segment
  // boundary can start (FindSpan). IndexAdd, which every free block passes
  // through, lists a segment (Segment::open_end) when its last block
  // becomes free; FindSpan drops those whose last block is no longer
  // free, and a released segment leaves it.
  std::map<std::uintptr_t, std::uint64_t> open_ends JAXLAKE_GUARDED_BY(mu);
  std::uintptr_t current_range JAXLAKE_GUARDED_BY(mu) = 0;
  // Slabs and their small ranges (small_pool.h).
  SmallPool small JAXLAKE_GUARDED_BY(mu);
  std::uint64_t next_id JAXLAKE_GUARDED_BY(mu) = 1;
  // Room for 1,536 live allocations before the table first grows (a
  // growth moves every entry, inside a timed allocation).
  LiveTable live JAXLAKE_GUARDED_BY(mu){2048};
  // Physical bytes being created right now.
  std::size_t pending_bytes JAXLAKE_GUARDED_BY(mu) = 0;
  // Segment creations finished (whether they succeeded or not), and the
  // signal of each: a request refused while others' creations hold the
  // capacity waits for one to finish (WithReclaim).
  std::uint64_t creations JAXLAKE_GUARDED_BY(mu) = 0;
  // Rounds of segment releases finished (ReleaseFreeSegments), signalled
  // the same way: a request refused while others' releases still hold the
  // capacity (releasing_bytes) waits for them too.
  std::uint64_t releases JAXLAKE_GUARDED_BY(mu) = 0;
  std::condition_variable created;
  // preallocate: the first growth takes the whole capacity; it is tried
  // once (a refusal falls back to growth on demand).
  bool prealloc_pending JAXLAKE_GUARDED_BY(mu) = false;
  // Something was freed since the lake last claimed memory to grow. While
  // nothing was, the program is only building up state, and a stitch's
  // shortfall is sized as a growth (TryStitch).
  bool freed_since_growth JAXLAKE_GUARDED_BY(mu) = false;
  // The most physical memory the lake held since it last started over
  // (Restart) or released its free segments (empty_cache): when it
  // empties after coming within 1/16 of the capacity, holding more than
  // one segment, the next allocation first starts over (restart_pending).
  std::size_t held_high JAXLAKE_GUARDED_BY(mu) = 0;
  bool restart_pending JAXLAKE_GUARDED_BY(mu) = false;
  // Physical bytes of segments being released right now (lock released):
  // still held by the driver, so they still count against the capacity.
  std::size_t releasing_bytes JAXLAKE_GUARDED_BY(mu) = 0;
  // Counts the changes that can let a refused request succeed (memory
  // freed or released, frees completed). The reclaim loop compares it
  // before and after its steps that release the lock, so that it sees what
  // other threads did meanwhile.
  std::uint64_t changes JAXLAKE_GUARDED_BY(mu) = 0;
  Stats st JAXLAKE_GUARDED_BY(mu);
  // Per-stream free tags and events (after `changes` and `st`, which it
  // counts into).
  StreamClock clock JAXLAKE_GUARDED_BY(mu){
      drv, {&changes, &st.driver_errors, &st.event_waits}};
  std::vector<Unreleased> unreleased JAXLAKE_GUARDED_BY(mu);
  // Entries taken out of `unreleased` by a retry in progress (lock
  // released): still counted by the gauges.
  std::size_t retrying JAXLAKE_GUARDED_BY(mu) = 0;
  std::size_t retrying_held JAXLAKE_GUARDED_BY(mu) = 0;
  std::vector<TraceEvent> trace JAXLAKE_GUARDED_BY(mu);
  std::string last_error JAXLAKE_GUARDED_BY(mu);

  Impl(vmm::Driver& d, const LakeOptions& o)
      : drv(d),
        opt(o),
        gran(d.granularity()),
        unit(o.alignment),
        unit_shift(Log2(o.alignment)),
        chunk_units(static_cast<std::uint64_t>(d.granularity() / o.alignment)),
        capacity(o.capacity ? o.capacity : d.total_memory()),
        max_request(capacity / gran * gran),
        slab_bytes(o.small_slab ? o.small_slab : d.granularity()),
        prealloc_pending(o.preallocate) {
  }

  // Release the lock inside a JAXLAKE_MAY_UNLOCK method, and take it again
  // (the analysis sees `mu` released and retaken; see
  // thread_annotations.h).
  void Unlock(MutexLock& lk) JAXLAKE_RELEASE(mu)
      JAXLAKE_NO_THREAD_SAFETY_ANALYSIS {
    lk.unlock();
  }
  void Relock(MutexLock& lk) JAXLAKE_ACQUIRE(mu)
      JAXLAKE_NO_THREAD_SAFETY_ANALYSIS {
    lk.lock();
  }

  // ---- stream ordering (stream_clock.h) ----------------------------------
  // Waits (lock released) for every pending stream event; true if some
  // frees completed (reclaim.cc).
  bool WaitStreams(MutexLock& lk) JAXLAKE_MAY_UNLOCK(mu);

  // ---- blocks, gauges and segments (arena.cc) --------------------------
  void IndexAdd(std::uint64_t seg, std::uint64_t start, Block& b)
      JAXLAKE_REQUIRES(mu) {
    b.idx = free_index.emplace(b.end - start, seg, start).first;
    Segment& sg = segs.at(seg);
    if (!sg.open_end && b.end == sg.nchunks * chunk_units) {
      open_ends.emplace(EndOf(sg), seg);
      sg.open_end = true;
    }
  }
  void IndexRemove(std::uint64_t, std::uint64_t, const Block& b)
      JAXLAKE_REQUIRES(mu) {
    free_index.erase(b.idx);
  }

  // The block holding unit u of a segment.
  const Block& BlockAt(std::uint64_t seg_id, std::uint64_t u) const
      JAXLAKE_REQUIRES(mu) {
    const Segment& seg = segs.at(seg_id);
    return std::prev(seg.blocks.upper_bound(u))->second;
  }
  std::uint64_t ChunkDown(std::uint64_t u) const { return u - u % chunk_units; }
  std::uint64_t ChunkUp(std::uint64_t u) const {
    return u % chunk_units ? u - u % chunk_units + chunk_units : u;
  }
  void Carve(std::uint64_t seg_id, std::uint64_t start, std::uint64_t n,
             BlockState state, std::uint64_t owner) JAXLAKE_REQUIRES(mu);
  bool MergeTags(const Tag& a, const Tag& b, Tag* out) const
      JAXLAKE_REQUIRES(mu);
  void MakeFree(std::uint64_t seg_id, std::uint64_t start, Tag tag)
      JAXLAKE_REQUIRES(mu);
  void Coalesce() JAXLAKE_REQUIRES(mu);
  bool RangeFree(std::uint64_t seg_id, std::uint64_t start, std::uint64_t n,
                 Stream s) const JAXLAKE_REQUIRES(mu);
  // Appends to the trace when it is on (the check is inline: the trace is
  // off by default and every allocation and free passes here).
  void Record(bool allocate, std::uintptr_t addr, std::size_t size, Stream s,
              AllocState state) JAXLAKE_REQUIRES(mu) {
    if (opt.record_trace) RecordEvent(allocate, addr, size, s, state);
  }
  void RecordEvent(bool allocate, std::uintptr_t addr, std::size_t size,
                   Stream s, AllocState state) JAXLAKE_REQUIRES(mu);
  void OnAllocated(std::uintptr_t addr, const Alloc& a, AllocState state)
      JAXLAKE_REQUIRES(mu);
  Status CreateSegment(MutexLock& lk, std::uint64_t n,
                       std::uint64_t* seg_out) JAXLAKE_MAY_UNLOCK(mu);
  // Bytes of a new growth range for a segment of `bytes`.
  std::size_t RangeBytes(std::size_t bytes) const {
    return std::max(bytes, max_request);
  }
  // A segment leaves its growth range (once it is unmapped); when it was
  // the range's last, the range is gone and *va / *va_bytes (else 0) name
  // the reservation to free.
  void LeaveRange(const Segment& seg, std::uintptr_t* va,
                  std::size_t* va_bytes) JAXLAKE_REQUIRES(mu);
  // True when the pieces lie back to back at their primary addresses in
  // one growth range (a stitched range over them needs no mapping).
  bool BackToBack(const std::vector<Piece>& pieces) const JAXLAKE_REQUIRES(mu);
  // While nothing was freed since the last growth, a new segment holds at
  // least 1/kGrowAhead of the memory held, where the capacity left allows
  // (docs/design.md, "Growth").
  static constexpr std::uint64_t kGrowAhead = 16;
  bool ClaimCapacity(std::uint64_t n) JAXLAKE_REQUIRES(mu);
  std::uint64_t ClaimGrowth(std::uint64_t need,
                            std::uint64_t most = ~std::uint64_t{0})
      JAXLAKE_REQUIRES(mu);
  // Physical bytes held or claimed (what the capacity is checked against).
  std::size_t HeldBytes() const JAXLAKE_REQUIRES(mu);
  bool FindFit(std::uint64_t n, Stream s, FreeKey* out) const
      JAXLAKE_REQUIRES(mu);
  // Whether the largest free tail below a chunk usable by s is larger than
  // every such free head (ClaimPrimary places a growth of less than a
  // chunk at its chunk's end then).
  bool TailOutgrowsHeads(Stream s) const JAXLAKE_REQUIRES(mu);
  Status ClaimPrimary(MutexLock& lk, std::uint64_t n, Stream s,
                      BlockState state, std::uint64_t owner,
                      std::uint64_t* seg_out, std::uint64_t* start_out,
                      AllocState* how, const FreeKey* found = nullptr)
      JAXLAKE_MAY_UNLOCK(mu);

  // ---- reclaim and releasing driver resources (reclaim.cc) ---------
  Status Teardown(Unreleased& u, const char** what);
  void Keep(Unreleased&& u) JAXLAKE_REQUIRES(mu);
  std::size_t RetryUnreleased(MutexLock& lk, Status* status, std::string* error)
      JAXLAKE_MAY_UNLOCK(mu);
  void Report(Status s, const char* what, Status* status,
              std::string* error) JAXLAKE_REQUIRES(mu);
  std::size_t ReleaseFreeSegments(MutexLock& lk, Status* status = nullptr,
                                  std::string* error = nullptr)
      JAXLAKE_MAY_UNLOCK(mu);

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
  Status WithReclaim(MutexLock& lk, F&& attempt) JAXLAKE_MAY_UNLOCK(mu) {
    std::uint64_t seen = changes;
    Status r = attempt();
    if (r != Status::kOutOfMemory) return r;
    ++st.reclaims;
    // Capacity claimed by other threads' segment creations in flight, or
    // held by segments other threads are releasing (lock released), is not
    // lost: wait for them to finish, then try again, before reclaiming
    // anything. (This thread's own claims and releases are settled when an
    // attempt or a reclaim step returns.)
    while (r == Status::kOutOfMemory &&
           (pending_bytes > 0 || releasing_bytes > 0)) {
      const std::uint64_t gen = creations, rel = releases;
      created.wait(lk.native(), [&] {
        mu.AssertHeld();
        return creations != gen || releases != rel;
      });
      seen = changes;
      r = attempt();
    }
    if (r != Status::kOutOfMemory) return r;
    for (int restart = 0;; ++restart) {
      for (int round = 0; round < 3; ++round) {
        bool progress = false;
        if (round == 0) {
          progress = clock.Advance();
        } else if (round == 1) {
          progress = WaitStreams(lk);
        } else {
          const std::size_t cached = stitches.cached();
          progress = RetryUnreleased(lk, nullptr, nullptr) > 0;
          TrimCache(lk, 0);
          progress = ReleaseFreeSegments(lk) > 0 || progress ||
                     stitches.cached() != cached;
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
  void StitchRefs(const Stitched& r, int delta) JAXLAKE_REQUIRES(mu);

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
  Status DropStitched(MutexLock& lk, std::uint64_t id,
                      const char** what = nullptr) JAXLAKE_MAY_UNLOCK(mu);
  void TrimCache(MutexLock& lk, std::size_t keep, Status* status = nullptr,
                 std::string* error = nullptr) JAXLAKE_MAY_UNLOCK(mu);
  Alloc StitchedAlloc(std::uint64_t id, std::size_t size, Stream s) const
      JAXLAKE_REQUIRES(mu);
  std::uintptr_t StitchedAddress(const Stitched& r) const {
    return r.va + std::size_t{r.lead} * unit;
  }

  // Cached ranges large enough for a request whose units are checked, most
  // recently freed first: a bound on the cost of a miss (a training step
  // reuses the ranges its previous step freed, which come first).
  static constexpr int kReuseCandidates = 8;
  bool TryReuse(std::uint64_t n, Stream s, std::size_t size,
                std::uintptr_t* addr) JAXLAKE_REQUIRES(mu);

  // Free blocks of less than a chunk checked as the lead of a stitch.
  static constexpr int kLeadCandidates = 16;
  // Free blocks checked for the largest tail and for a head (PlanStitch).
  static constexpr int kEndCandidates = 64;
  // (Both bounds are lifted by `wide`: the last try before out of memory,
  // in Lake::allocate.)
  // A free head usable by s of at least `units` (the smallest among the
  // first candidates, or all with `wide`), in another chunk than unit
  // `avoid` of segment `avoid_seg` (the tail's; with `wide`, in any
  // chunk: the range then maps the tail's chunk twice, first and last);
  // false when there is none.
  bool FindHead(std::uint64_t units, Stream s, std::uint64_t avoid_seg,
                std::uint64_t avoid, bool wide, Head* head) const
      JAXLAKE_REQUIRES(mu);
  std::uint64_t PlanStitch(std::uint64_t n, Stream s, bool wide,
                           std::vector<Piece>* plan, std::uint64_t* lead,
                           Head* head) JAXLAKE_REQUIRES(mu);
  Status MapStitched(MutexLock& lk, std::uint64_t id) JAXLAKE_MAY_UNLOCK(mu);
  void AbandonStitched(std::uint64_t id, const std::vector<Tag>& tags)
      JAXLAKE_REQUIRES(mu);
  Status TryStitch(MutexLock& lk, std::uint64_t n,
                   Stream s, std::size_t size, std::uintptr_t* addr,
                   AllocState* state, bool wide = false)
      JAXLAKE_MAY_UNLOCK(mu);
  Status StitchPlan(MutexLock& lk, std::vector<Piece> plan,
                    std::uint64_t lead, std::uint64_t got, std::uint64_t n,
                    Stream s, std::size_t size, std::uintptr_t* addr,
                    AllocState* state, bool grow_ahead,
                    std::uint64_t most = ~std::uint64_t{0},
                    const Head& head = Head{}) JAXLAKE_MAY_UNLOCK(mu);

  // ---- free runs across back-to-back segments (span.cc) ----------------
  // The address right after seg's chunks (where a back-to-back neighbour
  // starts).
  std::uintptr_t EndOf(const Segment& seg) const {
    return seg.va + std::size_t{seg.nchunks} * gran;
  }
  // The segment right after seg_id in its growth range (0: none).
  std::uint64_t NextInRange(std::uint64_t seg_id) const JAXLAKE_REQUIRES(mu);
  // The segment right before seg_id in its growth range (0: none).
  std::uint64_t PrevInRange(std::uint64_t seg_id) const JAXLAKE_REQUIRES(mu);
  // The start of seg_id's last block when it is free and usable by s.
  bool LastFree(std::uint64_t seg_id, Stream s, std::uint64_t* start) const
      JAXLAKE_REQUIRES(mu);
  // Whether the segment right before seg_id in its growth range ends in a
  // free block usable by s.
  bool PrevEndsFree(std::uint64_t seg_id, Stream s) const
      JAXLAKE_REQUIRES(mu);
  // The end of seg_id's first block when it is free and usable by s.
  bool FirstFree(std::uint64_t seg_id, Stream s, std::uint64_t* end) const
      JAXLAKE_REQUIRES(mu);
  // The plan of a run starting at unit `start` of seg_id, covering up to n
  // units across the following segments; returns the units covered.
  std::uint64_t PlanRun(std::uint64_t seg_id, std::uint64_t start,
                        std::uint64_t n, Stream s, std::vector<Piece>* plan,
                        std::uint64_t* lead) const JAXLAKE_REQUIRES(mu);
  // The smallest free run of at least n units usable by s that crosses a
  // segment boundary (its length in *len_out, if given); false when there
  // is none.
  bool FindSpan(std::uint64_t n, Stream s, std::uint64_t* seg_out,
                std::uint64_t* start_out,
                std::uint64_t* len_out = nullptr) JAXLAKE_REQUIRES(mu);
  // Whether the free block of len units at unit `start` of seg_id runs on
  // into a free block of a back-to-back neighbour, usable by s.
  bool InRun(std::uint64_t seg_id, std::uint64_t start, std::uint64_t len,
             Stream s) const JAXLAKE_REQUIRES(mu);
  // Requests of at least this many chunks are placed by FindRegionFit.
  static constexpr std::uint64_t kRegionFitChunks = 4;
  // Blocks that fit passed over as parts of runs before FindRegionFit
  // looks at the smallest run.
  static constexpr int kRunSkips = 8;
  // Best fit for n units over the free space as one growing region sees
  // it: a free run across back-to-back segments is one block, and its parts
  // are no candidates of their own (docs/design.md, "Best fit over free
  // runs"). Returns kRun with *seg_out/*start_out the run's start, kBlock
  // with *fit a single free block, or kNone.
  enum class RegionFit { kNone, kBlock, kRun };
  RegionFit FindRegionFit(std::uint64_t n, Stream s, FreeKey* fit,
                          std::uint64_t* seg_out,
                          std::uint64_t* start_out) JAXLAKE_REQUIRES(mu);
  // The free run that ends at the current growth range's edge (the end of
  // its newest segment), where a new segment would be placed.
  bool EdgeRun(Stream s, std::uint64_t* seg_out,
               std::uint64_t* start_out) const JAXLAKE_REQUIRES(mu);
  Status TrySpan(MutexLock& lk, std::uint64_t n, Stream s, std::size_t size,
                 std::uintptr_t* addr, AllocState* state)
      JAXLAKE_MAY_UNLOCK(mu);
  Status ServeRun(MutexLock& lk, std::uint64_t seg_id, std::uint64_t start,
                  std::uint64_t n, Stream s, std::size_t size,
                  std::uintptr_t* addr, AllocState* state)
      JAXLAKE_MAY_UNLOCK(mu);
  Status TryEdgeGrow(MutexLock& lk, std::uint64_t n,
                     Stream s, std::size_t size, std::uintptr_t* addr,
                     AllocState* state) JAXLAKE_MAY_UNLOCK(mu);

  // ---- the large-request states in allocation order (lake.cc) ----------
  Status LargeOnce(MutexLock& lk, std::uint64_t n,
                   Stream s, std::size_t size, std::uintptr_t* addr,
                   AllocState* state) JAXLAKE_MAY_UNLOCK(mu);

  // ---- small requests (small_pool.cc) ----------------------------------
  Status NewSlab(MutexLock& lk, Stream s,
                 std::uint64_t* slab_id) JAXLAKE_MAY_UNLOCK(mu);
  bool SmallFromPool(std::size_t size, std::size_t len, Stream s,
                     std::uintptr_t* addr) JAXLAKE_REQUIRES(mu);
  void ReturnSmall(std::uint64_t slab_id, std::size_t off, std::size_t len)
      JAXLAKE_REQUIRES(mu);
  void DropEmptySlab(std::uint64_t slab_id) JAXLAKE_REQUIRES(mu);

  void FreeSmall(std::uintptr_t addr, const Alloc& a, Stream s)
      JAXLAKE_REQUIRES(mu);
  void FlushDeferredSmall() JAXLAKE_REQUIRES(mu);
  // Advances every stream's clock, brings back the small ranges freed on
  // other streams whose frees completed, and advances again to fence the
  // frees that made (empty_cache, release_cached).
  void FenceFrees() JAXLAKE_REQUIRES(mu);
  // After the last live allocation was freed near the capacity: waits for
  // the streams' pending frees and releases what is free (cached stitched
  // ranges, free segments) so that the lake starts over as a fresh one
  // (reclaim.cc).
  void Restart(MutexLock& lk) JAXLAKE_MAY_UNLOCK(mu);
  Status Small(MutexLock& lk, std::size_t size, Stream s,
               std::uintptr_t* addr) JAXLAKE_MAY_UNLOCK(mu);

  // ---- check and describe (check.cc) -----------------------------------
  std::string Check() const JAXLAKE_REQUIRES(mu);
  // Debug builds: Check() after every operation, aborting on a broken
  // invariant. Release builds: nothing.
  void DebugCheck() const JAXLAKE_REQUIRES(mu) {
#if defined(JAXLAKE_DEBUG) && JAXLAKE_DEBUG
    FailOnBrokenInvariant();
#endif
  }
  void FailOnBrokenInvariant() const JAXLAKE_REQUIRES(mu);
  std::string Describe() const JAXLAKE_REQUIRES(mu);
};

}  // namespace jaxlake

#endif  // JAXLAKE_CC_LAKE_LAKE_IMPL_H_
