// jaxlake: the model of XLA's BFC allocator (bfc.cc) as a class, so that
// the growing variant (bfc_growth.cc) shares its chunks, bins, splitting
// and coalescing and replaces only how the allocator grows.
#ifndef JAXLAKE_REPLAY_BFC_H_
#define JAXLAKE_REPLAY_BFC_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "cc/replay/model.h"
#include "cc/replay/policy.h"

namespace jaxlake::replay {


inline constexpr std::size_t kBfcMinAlloc = 256;
inline constexpr int kBfcBins = 21;

inline std::size_t BfcRounded(std::size_t n) {
  return n < kBfcMinAlloc ? kBfcMinAlloc : RoundUp(n, kBfcMinAlloc);
}

inline int BinFor(std::size_t size) {
  std::size_t v = size >> 8;
  int log2 = -1;
  while (v != 0) {
    v >>= 1;
    ++log2;
  }
  return log2 < 0 ? 0 : (log2 < kBfcBins - 1 ? log2 : kBfcBins - 1);
}

class BfcPolicy : public Policy {
 public:
  explicit BfcPolicy(const PolicyOptions& o)
      : device_(o.capacity, o.granularity, o.latency),
        limit_((o.bfc_limit != 0 ? o.bfc_limit : o.capacity) / kBfcMinAlloc *
               kBfcMinAlloc),
        max_frag_(o.bfc_max_internal_fragmentation),
        region_size_(BfcRounded(std::min(limit_, o.bfc_initial_region))) {}

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

 protected:
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
    if (b == tail_) tail_ = a;
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
        if (c == tail_) tail_ = rest;
        insert_free(rest);
      }
      return c;
    }
    return -1;
  }

  // Adds memory that can hold a chunk of `rounded` bytes (false: out of
  // memory). BFC adds a region; the growing variant extends its range.
  virtual bool extend(std::size_t rounded) {
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
  // The highest-addressed chunk of a single growing range (bfc_growth.cc;
  // -1 for BFC's separate regions).
  std::int32_t tail_ = -1;
  std::uint64_t regions_ = 0;
  std::uint64_t region_bytes_ = 0;
};

}  // namespace jaxlake::replay

#endif  // JAXLAKE_REPLAY_BFC_H_
