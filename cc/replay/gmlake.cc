// jaxlake: a model of GMLake as published (GLake's patched PyTorch caching
// allocator, default settings: vmmDefragment=1, fragLimit=512 MiB,
// reuseLimit=10, defragLevel=0).
//
// Requests of at most 1 MiB (after 512-byte rounding) use PyTorch's small
// pool unchanged (2 MiB cudaMalloc segments, see torch.h). Larger requests
// are rounded up to whole 2 MiB chunks and served, on their own stream, by:
//   1. fit/split: the best-fitting free run of chunks of a segment
//      (smallest, then lowest address), split when a chunk or more is left;
//   2. stitch reuse: the smallest cached stitched block whose chunks are all
//      free, if it is at most reuseLimit times the request; the request
//      takes its first chunks;
//   3. stitch (requests >= fragLimit only, and at least two free runs):
//      free runs taken largest first until they cover the request, the last
//      one split, mapped into a new virtual range one chunk at a time;
//   4. grow: a new segment of 20 MiB (requests below 10 MiB) or of the
//      request, one cuMemCreate, cuMemMap and cuMemSetAccess per chunk;
//   5. under pressure: unmap every cached stitched block, release every
//      whole free segment (and the small pool's), grow again, stitch
//      again; then out of memory.
// Free returns the chunks to their segments' runs (merging neighbours); a
// freed stitched block stays mapped in a cache, reusable again once all its
// chunks are free. Stitch+allocate (GLake's reAlloc) is off by default and
// not modelled.
#include <algorithm>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "cc/replay/model.h"
#include "cc/replay/policy.h"
#include "cc/replay/torch.h"

namespace jaxlake::replay {

namespace {

class GmlakePolicy final : public Policy {
 public:
  explicit GmlakePolicy(const PolicyOptions& o)
      : device_(o.capacity, o.granularity, o.latency),
        small_(&device_, false, 0),
        gran_(o.granularity),
        frag_limit_(o.gmlake_frag_limit),
        reuse_limit_(o.gmlake_reuse_limit) {}

  const char* name() const override { return "gmlake"; }

  bool allocate(std::size_t nbytes, std::uint64_t stream,
                std::uintptr_t* address) override {
    const std::size_t rounded = TorchAllocator::RoundSize(nbytes);
    if (rounded <= kTorchSmallSize) {
      if (small_.try_malloc(nbytes, stream, address) ||
          (reclaim(), small_.try_malloc(nbytes, stream, address))) {
        live_[*address] = Alloc{Kind::kSmall, 0, 0, 0, 0};
        return true;
      }
      return false;
    }
    const auto n = static_cast<std::uint32_t>(RoundUp(rounded, gran_) / gran_);
    if (fit(stream, n, address) || reuse(stream, n, address) ||
        stitch(stream, n, address) || grow(stream, rounded, n, address))
      return true;
    reclaim();
    return grow(stream, rounded, n, address) || stitch(stream, n, address);
  }

  void free(std::uintptr_t address, std::uint64_t) override {
    auto it = live_.find(address);
    if (it == live_.end()) return;
    const Alloc a = it->second;
    live_.erase(it);
    if (a.kind == Kind::kSmall) {
      small_.free(address);
    } else if (a.kind == Kind::kPrimary) {
      give(a.seg, a.start, a.n);
    } else {
      Stitched& s = stitched_[a.stitched];
      std::uint32_t left = s.used;
      for (const Piece& p : s.pieces) {
        if (left == 0) break;
        const std::uint32_t k = std::min(left, p.n);
        give(p.seg, p.start, k);
        left -= k;
      }
      s.live = false;
      s.used = 0;
      s.seq = ++seq_;
      cache_.emplace(s.seq, a.stitched);
      if (s.busy == 0) reusable_.emplace(s.stream, s.nchunks, a.stitched);
    }
  }

  std::size_t reserved() const override { return device_.reserved(); }
  vmm::CallCounts calls() const override { return device_.calls(); }
  vmm::CallTimes driver_us() const override { return device_.driver_us(); }
  Counters counters() const override {
    return {{"stitches", stitches_},
            {"stitched_bytes", stitched_bytes_},
            {"stitch_reuses", stitch_reuses_},
            {"reclaims", reclaims_},
            {"segments", segments_created_ + small_.segments_created()},
            {"stitch_evictions", evictions_}};
  }
  std::string check() const override;

 private:
  enum class Kind : std::uint8_t { kSmall, kPrimary, kStitched };
  struct Alloc {
    Kind kind;
    std::uint32_t seg;
    std::uint32_t start;
    std::uint32_t n;
    std::uint32_t stitched;
  };
  struct Segment {
    std::uint64_t stream = 0;
    std::uintptr_t va = 0;
    std::uint32_t nchunks = 0;
    bool alive = false;
    std::map<std::uint32_t, std::uint32_t> runs;  // free: start -> length
    // Stitched blocks mapping each chunk (sized on the first stitch), and
    // how many such mappings there are in all.
    std::vector<std::vector<std::uint32_t>> refs;
    std::uint64_t nrefs = 0;
  };
  struct Piece {
    std::uint32_t seg;
    std::uint32_t start;
    std::uint32_t n;
  };
  struct Stitched {
    std::uint64_t stream = 0;
    std::uintptr_t va = 0;
    std::uint32_t nchunks = 0;
    std::vector<Piece> pieces;
    std::uint32_t busy = 0;  // its chunks not free (used by anyone)
    std::uint32_t used = 0;  // leading chunks used by its live allocation
    std::uint64_t seq = 0;   // cache order (older first)
    bool live = false;
    bool alive = false;
  };
  // (stream, length, segment, start): best fit, and largest first.
  using RunKey = std::tuple<std::uint64_t, std::uint32_t, std::uint32_t,
                            std::uint32_t>;

  std::uintptr_t address_of(std::uint32_t seg, std::uint32_t start) const {
    return segs_[seg].va + std::uintptr_t{start} * gran_;
  }

  void add_run(std::uint32_t seg, std::uint32_t start, std::uint32_t len) {
    segs_[seg].runs.emplace(start, len);
    runs_.emplace(segs_[seg].stream, len, seg, start);
  }
  void erase_run(std::uint32_t seg, std::uint32_t start, std::uint32_t len) {
    segs_[seg].runs.erase(start);
    runs_.erase(RunKey{segs_[seg].stream, len, seg, start});
  }

  // Chunks [start, start+n) of a segment change state: adjust the busy
  // counts of the stitched blocks that map them.
  void touch(std::uint32_t seg, std::uint32_t start, std::uint32_t n,
             bool taken) {
    Segment& s = segs_[seg];
    if (s.refs.empty()) return;
    for (std::uint32_t c = start; c < start + n; ++c) {
      for (std::uint32_t id : s.refs[c]) {
        Stitched& st = stitched_[id];
        if (taken) {
          if (st.busy++ == 0 && !st.live)
            reusable_.erase(std::make_tuple(st.stream, st.nchunks, id));
        } else if (--st.busy == 0 && !st.live) {
          reusable_.emplace(st.stream, st.nchunks, id);
        }
      }
    }
  }

  // Takes free chunks [start, start+n), which lie inside one free run.
  void take(std::uint32_t seg, std::uint32_t start, std::uint32_t n) {
    auto it = segs_[seg].runs.upper_bound(start);
    --it;
    const std::uint32_t run_start = it->first;
    const std::uint32_t run_len = it->second;
    erase_run(seg, run_start, run_len);
    if (start > run_start) add_run(seg, run_start, start - run_start);
    const std::uint32_t end = start + n;
    if (end < run_start + run_len) add_run(seg, end, run_start + run_len - end);
    touch(seg, start, n, true);
  }

  // Gives chunks back, merging with the free runs around them.
  void give(std::uint32_t seg, std::uint32_t start, std::uint32_t n) {
    touch(seg, start, n, false);
    auto& runs = segs_[seg].runs;
    std::uint32_t s = start;
    std::uint32_t e = start + n;
    auto next = runs.lower_bound(e);
    if (next != runs.end() && next->first == e) {
      e += next->second;
      erase_run(seg, next->first, next->second);
    }
    auto after = runs.lower_bound(s);
    if (after != runs.begin()) {
      auto prev = std::prev(after);
      if (prev->first + prev->second == s) {
        s = prev->first;
        erase_run(seg, prev->first, prev->second);
      }
    }
    add_run(seg, s, e - s);
  }

  bool fit(std::uint64_t stream, std::uint32_t n, std::uintptr_t* address) {
    auto it = runs_.lower_bound(RunKey{stream, n, 0, 0});
    if (it == runs_.end() || std::get<0>(*it) != stream) return false;
    const std::uint32_t seg = std::get<2>(*it);
    const std::uint32_t start = std::get<3>(*it);
    take(seg, start, n);
    *address = address_of(seg, start);
    live_[*address] = Alloc{Kind::kPrimary, seg, start, n, 0};
    return true;
  }

  bool reuse(std::uint64_t stream, std::uint32_t n, std::uintptr_t* address) {
    auto it = reusable_.lower_bound(std::make_tuple(stream, n, 0u));
    if (it == reusable_.end() || std::get<0>(*it) != stream) return false;
    if (static_cast<double>(std::get<1>(*it)) >
        static_cast<double>(n) * reuse_limit_)
      return false;
    const std::uint32_t id = std::get<2>(*it);
    reusable_.erase(it);
    Stitched& s = stitched_[id];
    cache_.erase(s.seq);
    s.live = true;
    s.used = n;
    std::uint32_t left = n;
    for (const Piece& p : stitched_[id].pieces) {
      if (left == 0) break;
      const std::uint32_t k = std::min(left, p.n);
      take(p.seg, p.start, k);
      left -= k;
    }
    ++stitch_reuses_;
    *address = stitched_[id].va;
    live_[*address] = Alloc{Kind::kStitched, 0, 0, n, id};
    return true;
  }

  bool stitch(std::uint64_t stream, std::uint32_t n, std::uintptr_t* address) {
    if (std::size_t{n} * gran_ < frag_limit_) return false;
    auto lo = runs_.lower_bound(RunKey{stream, 0, 0, 0});
    auto hi = runs_.lower_bound(
        RunKey{stream, std::numeric_limits<std::uint32_t>::max(),
               std::numeric_limits<std::uint32_t>::max(),
               std::numeric_limits<std::uint32_t>::max()});
    if (lo == hi || std::next(lo) == hi) return false;  // needs two runs
    std::vector<Piece> pieces;
    std::uint32_t covered = 0;
    for (auto it = hi; it != lo && covered < n;) {
      --it;
      const std::uint32_t len = std::get<1>(*it);
      const std::uint32_t k = std::min(len, n - covered);
      pieces.push_back({std::get<2>(*it), std::get<3>(*it), k});
      covered += k;
    }
    if (covered < n) return false;
    for (const Piece& p : pieces) take(p.seg, p.start, p.n);
    const auto id = static_cast<std::uint32_t>(stitched_.size());
    Stitched s;
    s.stream = stream;
    s.va = device_.reserve_va(std::size_t{n} * gran_);
    s.nchunks = n;
    s.pieces = pieces;
    s.busy = n;
    s.used = n;
    s.live = true;
    s.alive = true;
    device_.count(vmm::Call::reserve, 1, std::size_t{n} * gran_);
    device_.count(vmm::Call::map, n, gran_);  // one cuMemMap per chunk
    device_.count(vmm::Call::set_access, n, gran_);  // and cuMemSetAccess
    for (const Piece& p : pieces) {
      Segment& seg = segs_[p.seg];
      if (seg.refs.empty()) seg.refs.resize(seg.nchunks);
      for (std::uint32_t c = p.start; c < p.start + p.n; ++c)
        seg.refs[c].push_back(id);
      seg.nrefs += p.n;
    }
    stitched_.push_back(std::move(s));
    ++stitches_;
    stitched_bytes_ += std::uint64_t{n} * gran_;
    *address = stitched_[id].va;
    live_[*address] = Alloc{Kind::kStitched, 0, 0, n, id};
    return true;
  }

  bool grow(std::uint64_t stream, std::size_t rounded, std::uint32_t n,
            std::uintptr_t* address) {
    const std::size_t bytes =
        RoundUp(TorchAllocator::AllocationSize(rounded), gran_);
    const auto chunks = static_cast<std::uint32_t>(bytes / gran_);
    if (!device_.take(bytes)) {
      // cuMemCreate chunk by chunk until one fails, then release them.
      const std::size_t made = device_.available() / gran_;
      device_.count(vmm::Call::create, made + 1, gran_);
      device_.count(vmm::Call::release, made, gran_);
      return false;
    }
    device_.count(vmm::Call::create, chunks, gran_);
    device_.count(vmm::Call::reserve, 1, bytes);
    device_.count(vmm::Call::map, chunks, gran_);
    device_.count(vmm::Call::set_access, chunks, gran_);
    ++segments_created_;
    Segment seg;
    seg.stream = stream;
    seg.va = device_.reserve_va(bytes);
    seg.nchunks = chunks;
    seg.alive = true;
    const auto index = static_cast<std::uint32_t>(segs_.size());
    segs_.push_back(std::move(seg));
    add_run(index, 0, chunks);
    take(index, 0, n);
    *address = address_of(index, 0);
    live_[*address] = Alloc{Kind::kPrimary, index, 0, n, 0};
    return true;
  }

  void reclaim() {
    ++reclaims_;
    // Cached stitched blocks first (their mappings pin nothing, but a
    // segment cannot be released while a stitched range maps it).
    for (const auto& [seq, id] : cache_) {
      Stitched& s = stitched_[id];
      if (s.busy == 0) reusable_.erase(std::make_tuple(s.stream, s.nchunks, id));
      for (const Piece& p : s.pieces) {
        Segment& seg = segs_[p.seg];
        for (std::uint32_t c = p.start; c < p.start + p.n; ++c) {
          auto& r = seg.refs[c];
          r.erase(std::find(r.begin(), r.end(), id));
        }
        seg.nrefs -= p.n;
      }
      s.alive = false;
      s.pieces.clear();
      s.pieces.shrink_to_fit();
      // One call over nchunks handles (a chunk is a handle): charged per
      // handle.
      device_.count(vmm::Call::unmap, 1, std::size_t{s.nchunks} * gran_,
                    s.nchunks);
      device_.count(vmm::Call::address_free, 1,
                    std::size_t{s.nchunks} * gran_);
      ++evictions_;
    }
    cache_.clear();
    // Then every whole free segment that no live stitched block maps (a
    // reused stitched block may map free chunks past those it uses; their
    // memory lives as long as that mapping).
    for (std::uint32_t i = 0; i < segs_.size(); ++i) {
      Segment& s = segs_[i];
      if (!s.alive || s.runs.size() != 1 || s.nrefs != 0) continue;
      if (s.runs.begin()->first != 0 || s.runs.begin()->second != s.nchunks)
        continue;
      erase_run(i, 0, s.nchunks);
      s.alive = false;
      s.refs.clear();
      // One call over nchunks handles (a chunk is a handle): charged per
      // handle.
      device_.count(vmm::Call::unmap, 1, std::size_t{s.nchunks} * gran_,
                    s.nchunks);
      device_.count(vmm::Call::address_free, 1,
                    std::size_t{s.nchunks} * gran_);
      device_.count(vmm::Call::release, s.nchunks, gran_);
      device_.give(std::size_t{s.nchunks} * gran_);
    }
    small_.release_cached();
  }

  SimDevice device_;
  TorchAllocator small_;
  std::size_t gran_;
  std::size_t frag_limit_;
  double reuse_limit_;
  std::vector<Segment> segs_;
  std::set<RunKey> runs_;
  std::vector<Stitched> stitched_;
  // Cached (freed, still mapped) stitched blocks, by age, and those of
  // them whose chunks are all free: (stream, chunks, id).
  std::map<std::uint64_t, std::uint32_t> cache_;
  std::set<std::tuple<std::uint64_t, std::uint32_t, std::uint32_t>> reusable_;
  std::unordered_map<std::uintptr_t, Alloc> live_;
  std::uint64_t seq_ = 0;
  std::uint64_t stitches_ = 0;
  std::uint64_t stitched_bytes_ = 0;
  std::uint64_t stitch_reuses_ = 0;
  std::uint64_t reclaims_ = 0;
  std::uint64_t segments_created_ = 0;
  std::uint64_t evictions_ = 0;
};

std::string GmlakePolicy::check() const {
  std::ostringstream err;
  std::size_t indexed = 0;
  std::vector<std::vector<bool>> free(segs_.size());
  for (std::uint32_t i = 0; i < segs_.size(); ++i) {
    const Segment& s = segs_[i];
    if (!s.alive) continue;
    free[i].assign(s.nchunks, false);
    std::uint32_t last_end = 0;
    bool first = true;
    for (const auto& [start, len] : s.runs) {
      ++indexed;
      if (!runs_.count(RunKey{s.stream, len, i, start}))
        err << "run " << i << ":" << start << " missing from the index; ";
      if (!first && start <= last_end)
        err << "runs of segment " << i << " touch or overlap at " << start
            << "; ";
      first = false;
      last_end = start + len;
      if (last_end > s.nchunks) err << "run past segment " << i << "; ";
      for (std::uint32_t c = start; c < start + len && c < s.nchunks; ++c)
        free[i][c] = true;
    }
  }
  if (indexed != runs_.size())
    err << "index holds " << runs_.size() << " runs, segments " << indexed
        << "; ";
  for (std::uint32_t id = 0; id < stitched_.size(); ++id) {
    const Stitched& s = stitched_[id];
    if (!s.alive) continue;
    std::uint32_t busy = 0;
    for (const Piece& p : s.pieces)
      for (std::uint32_t c = p.start; c < p.start + p.n; ++c)
        busy += (free[p.seg].empty() || free[p.seg][c]) ? 0 : 1;
    if (busy != s.busy)
      err << "stitched " << id << " busy " << s.busy << ", counted " << busy
          << "; ";
    const bool listed =
        reusable_.count(std::make_tuple(s.stream, s.nchunks, id)) != 0;
    if (listed != (!s.live && s.busy == 0))
      err << "stitched " << id << " reusable listing is wrong; ";
    for (const Piece& p : s.pieces)
      if (!segs_[p.seg].alive)
        err << "stitched " << id << " maps released segment " << p.seg
            << "; ";
  }
  const std::string small = small_.check();
  if (!small.empty()) err << "small pool: " << small;
  return err.str();
}

}  // namespace

std::unique_ptr<Policy> MakeGmlakePolicy(const PolicyOptions& o) {
  return std::make_unique<GmlakePolicy>(o);
}

}  // namespace jaxlake::replay
