// jaxlake: a model of XLA's BFC allocator (tsl::BFCAllocator) with
// allow_growth, the default of a GPU client that does not preallocate.
//
//   * requests are rounded up to 256 bytes;
//   * free chunks sit in 21 bins by size: bin i holds [256 << i,
//     256 << (i+1)), the last bin everything larger; within a bin by size
//     then address;
//   * a request searches from its own bin upwards and takes the first
//     (smallest, then lowest-addressed) free chunk that is large enough;
//   * the chunk is split when it is at least twice the request or the rest
//     is at least 128 MiB (max_internal_fragmentation);
//   * free coalesces a chunk with its free neighbours in the same region;
//   * when no chunk fits, the allocator grows by a new region (a cudaMalloc
//     that is never given back): the region size starts at 2 MiB, doubles
//     until it holds the request, is cut to the memory left under the
//     limit, and the next region size doubles after a region made without
//     raising it. A region that the device cannot hold is retried at 90%
//     of its size while that still holds the request. Regions never merge.
// With no region left to add, the request is out of memory (no garbage
// collection: XLA does not enable it).
#include <array>
#include <memory>
#include <set>
#include <sstream>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "cc/replay/model.h"
#include "cc/replay/policy.h"

namespace jaxlake::replay {

namespace {

constexpr std::size_t kBfcMinAlloc = 256;
constexpr int kBfcBins = 21;

std::size_t BfcRounded(std::size_t n) {
  return n < kBfcMinAlloc ? kBfcMinAlloc : RoundUp(n, kBfcMinAlloc);
}

int BinFor(std::size_t size) {
  std::size_t v = size >> 8;
  int log2 = -1;
  while (v != 0) {
    v >>= 1;
    ++log2;
  }
  return log2 < 0 ? 0 : (log2 < kBfcBins - 1 ? log2 : kBfcBins - 1);
}

class BfcPolicy final : public Policy {
 public:
  explicit BfcPolicy(const PolicyOptions& o)
      : device_(o.capacity, o.granularity, o.latency),
        limit_(o.capacity / kBfcMinAlloc * kBfcMinAlloc),
        max_frag_(o.bfc_max_internal_fragmentation),
        region_size_(BfcRounded(std::min(o.capacity, o.bfc_initial_region))) {}

  const char* name() const override { return "bfc"; }

  bool allocate(std::size_t nbytes, std::uint64_t,
                std::uintptr_t* address) override {
    const std::size_t rounded = BfcRounded(nbytes);
    std::int32_t c = find(rounded);
    if (c < 0) {
      if (!extend(rounded)) return false;
      c = find(rounded);
      if (c < 0) return false;  // cannot happen: the new region fits it
    }
    Chunk& ch = chunks_[c];
    ch.in_use = true;
    live_[ch.ptr] = c;
    *address = ch.ptr;
    return true;
  }

  void free(std::uintptr_t address, std::uint64_t) override {
    auto it = live_.find(address);
    if (it == live_.end()) return;
    std::int32_t c = it->second;
    live_.erase(it);
    chunks_[c].in_use = false;
    const std::int32_t next = chunks_[c].next;
    if (next >= 0 && !chunks_[next].in_use) {
      erase_free(next);
      merge(c, next);
    }
    const std::int32_t prev = chunks_[c].prev;
    if (prev >= 0 && !chunks_[prev].in_use) {
      erase_free(prev);
      merge(prev, c);
      c = prev;
    }
    insert_free(c);
  }

  std::size_t reserved() const override { return device_.reserved(); }
  vmm::CallCounts calls() const override { return device_.calls(); }
  vmm::CallTimes driver_us() const override { return device_.driver_us(); }
  Counters counters() const override {
    return {{"stitches", 0},
            {"stitched_bytes", 0},
            {"stitch_reuses", 0},
            {"reclaims", 0},
            {"regions", regions_},
            {"region_bytes", region_bytes_}};
  }
  std::string check() const override;

 private:
  struct Chunk {
    std::uintptr_t ptr = 0;
    std::size_t size = 0;
    std::int32_t prev = -1;  // neighbours in the same region
    std::int32_t next = -1;
    bool in_use = false;
  };
  using BinKey = std::tuple<std::size_t, std::uintptr_t, std::int32_t>;

  std::int32_t new_chunk() {
    if (!free_ids_.empty()) {
      const std::int32_t id = free_ids_.back();
      free_ids_.pop_back();
      chunks_[id] = Chunk{};
      return id;
    }
    chunks_.emplace_back();
    return static_cast<std::int32_t>(chunks_.size() - 1);
  }

  void insert_free(std::int32_t c) {
    const Chunk& ch = chunks_[c];
    bins_[BinFor(ch.size)].emplace(ch.size, ch.ptr, c);
  }
  void erase_free(std::int32_t c) {
    const Chunk& ch = chunks_[c];
    bins_[BinFor(ch.size)].erase(BinKey{ch.size, ch.ptr, c});
  }

  // Merges chunk b (the next of a) into a; neither is in a bin.
  void merge(std::int32_t a, std::int32_t b) {
    Chunk& ca = chunks_[a];
    Chunk& cb = chunks_[b];
    ca.size += cb.size;
    ca.next = cb.next;
    if (ca.next >= 0) chunks_[ca.next].prev = a;
    cb.size = 0;
    free_ids_.push_back(b);
  }
  bool binned(std::int32_t c) const {
    const Chunk& ch = chunks_[c];
    return bins_[BinFor(ch.size)].count(BinKey{ch.size, ch.ptr, c}) != 0;
  }

  std::int32_t find(std::size_t rounded) {
    for (int b = BinFor(rounded); b < kBfcBins; ++b) {
      auto it = bins_[b].lower_bound(BinKey{rounded, 0, -1});
      if (it == bins_[b].end()) continue;
      const std::int32_t c = std::get<2>(*it);
      bins_[b].erase(it);
      const std::size_t size = chunks_[c].size;
      if (size >= rounded * 2 || size - rounded >= max_frag_) {
        const std::int32_t rest = new_chunk();
        Chunk& ch = chunks_[c];
        Chunk& r = chunks_[rest];
        r.ptr = ch.ptr + rounded;
        r.size = ch.size - rounded;
        r.prev = c;
        r.next = ch.next;
        if (ch.next >= 0) chunks_[ch.next].prev = rest;
        ch.next = rest;
        ch.size = rounded;
        insert_free(rest);
      }
      return c;
    }
    return -1;
  }

  bool extend(std::size_t rounded) {
    const std::size_t available = (limit_ - region_bytes_) / kBfcMinAlloc *
                                  kBfcMinAlloc;
    if (rounded > available) return false;
    bool increased = false;
    while (rounded > region_size_) {
      region_size_ *= 2;
      increased = true;
    }
    std::size_t bytes = std::min(region_size_, available);
    while (!device_.cuda_malloc(bytes)) {
      bytes = BfcRounded(static_cast<std::size_t>(static_cast<double>(bytes) *
                                                  0.9));
      if (bytes < rounded) return false;
    }
    if (!increased) region_size_ *= 2;
    ++regions_;
    region_bytes_ += bytes;
    const std::int32_t c = new_chunk();
    chunks_[c].ptr = device_.reserve_va(bytes);
    chunks_[c].size = bytes;
    insert_free(c);
    return true;
  }

  SimDevice device_;
  std::size_t limit_;
  std::size_t max_frag_;
  std::size_t region_size_;
  std::vector<Chunk> chunks_;
  std::vector<std::int32_t> free_ids_;
  std::array<std::set<BinKey>, kBfcBins> bins_;
  std::unordered_map<std::uintptr_t, std::int32_t> live_;
  std::uint64_t regions_ = 0;
  std::uint64_t region_bytes_ = 0;
};

std::string BfcPolicy::check() const {
  std::ostringstream err;
  std::size_t free_chunks = 0;
  std::size_t total = 0;
  for (std::size_t i = 0; i < chunks_.size(); ++i) {
    const Chunk& c = chunks_[i];
    if (c.size == 0) continue;
    total += c.size;
    const auto id = static_cast<std::int32_t>(i);
    if (c.next >= 0 && (chunks_[c.next].prev != id ||
                        chunks_[c.next].ptr != c.ptr + c.size))
      err << "chunk " << i << " and its next are not adjacent; ";
    if (!c.in_use) {
      ++free_chunks;
      if (!binned(id)) err << "free chunk " << i << " is in no bin; ";
      if (c.next >= 0 && !chunks_[c.next].in_use)
        err << "free chunks " << i << " and " << c.next << " not merged; ";
    }
  }
  std::size_t in_bins = 0;
  for (const auto& bin : bins_) in_bins += bin.size();
  if (in_bins != free_chunks)
    err << "bins hold " << in_bins << " chunks, " << free_chunks
        << " are free; ";
  if (total != region_bytes_)
    err << "chunks cover " << total << " bytes, regions " << region_bytes_
        << "; ";
  return err.str();
}

}  // namespace

std::unique_ptr<Policy> MakeBfcPolicy(const PolicyOptions& o) {
  return std::make_unique<BfcPolicy>(o);
}

}  // namespace jaxlake::replay
