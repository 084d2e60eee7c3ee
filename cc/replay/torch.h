// jaxlake: a model of PyTorch's CUDA caching allocator, in its two modes.
//
// Default mode ("torch"): requests are rounded up to 512 bytes; those of at
// most 1 MiB use the small pool, carved out of 2 MiB segments; larger ones
// use the large pool, whose segments are 20 MiB for requests below 10 MiB
// and the request rounded up to 2 MiB otherwise. Each segment is one
// cudaMalloc. A request takes the best-fitting free block of its stream
// and pool (smallest size, then lowest address), split when the rest is at
// least 512 bytes (small pool) or more than 1 MiB (large pool, and only
// for requests below max_split_size). Blocks larger than max_split_size
// are not handed to smaller requests, nor blocks at least 20 MiB larger
// than a request of at least max_split_size. Free merges a block with its
// free neighbours in the segment. When no block fits and cudaMalloc fails,
// every whole free segment (all streams) is cudaFree'd and cudaMalloc is
// tried once more; then out of memory.
//
// Expandable mode ("torch-expandable", expandable_segments:True): each
// stream and pool has one virtual range of 9/8 of the device, mapped in
// pages of 2 MiB (small pool) or 20 MiB (large pool), one cuMemCreate and
// one cuMemMap per page and one cuMemSetAccess per batch. A request that
// no mapped free block fits takes the lowest-addressed unmapped run of its
// stream (with the free block just before it) that is long enough, maps
// the pages it needs and merges them with that free block. Blocks split
// when the rest is at least 512 bytes. Under pressure, the pages wholly
// inside free blocks are unmapped and released (a range left with nothing
// mapped is freed) and the request is tried once more.
#ifndef JAXLAKE_REPLAY_TORCH_H_
#define JAXLAKE_REPLAY_TORCH_H_

#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "cc/replay/model.h"

namespace jaxlake::replay {

inline constexpr std::size_t kTorchMinBlock = 512;
inline constexpr std::size_t kTorchSmallSize = 1 * kMiB;
inline constexpr std::size_t kTorchSmallBuffer = 2 * kMiB;
inline constexpr std::size_t kTorchMinLargeAlloc = 10 * kMiB;
inline constexpr std::size_t kTorchLargeBuffer = 20 * kMiB;
inline constexpr std::size_t kTorchRoundLarge = 2 * kMiB;

class TorchAllocator {
 public:
  // max_split_size 0: unlimited (PyTorch's default).
  TorchAllocator(SimDevice* device, bool expandable,
                 std::size_t max_split_size);

  static std::size_t RoundSize(std::size_t n);
  static std::size_t AllocationSize(std::size_t rounded);

  // One try: a cached block, else new memory. No release on failure.
  bool try_malloc(std::size_t nbytes, std::uint64_t stream,
                  std::uintptr_t* address);
  // PyTorch's malloc: try, release cached memory, try again.
  bool malloc(std::size_t nbytes, std::uint64_t stream,
              std::uintptr_t* address);
  // Frees a live block; false if the address is not one.
  bool free(std::uintptr_t address);
  // release_cached_blocks: gives back what is cached; returns the bytes.
  std::size_t release_cached();

  std::uint64_t segments_created() const { return segments_created_; }
  std::uint64_t releases() const { return releases_; }
  std::string check() const;

 private:
  struct Block {
    std::uintptr_t ptr = 0;
    std::size_t size = 0;
    std::uint64_t stream = 0;
    std::int32_t prev = -1;
    std::int32_t next = -1;
    std::int32_t segment = -1;  // expandable segment index (-1: cudaMalloc)
    bool small = false;
    bool allocated = false;
    bool mapped = true;
  };
  // (stream, size, ptr, id): best fit within a stream.
  using SizeKey = std::tuple<std::uint64_t, std::size_t, std::uintptr_t,
                             std::int32_t>;
  // (stream, ptr, id): unmapped runs by address within a stream.
  using AddrKey = std::tuple<std::uint64_t, std::uintptr_t, std::int32_t>;
  struct Pool {
    std::set<SizeKey> blocks;    // free mapped blocks
    std::set<AddrKey> unmapped;  // free unmapped runs (expandable)
  };
  struct Segment {  // an expandable segment
    std::uintptr_t base = 0;
    std::size_t size = 0;  // virtual bytes
    std::size_t page = 0;
    std::vector<bool> mapped;
    bool alive = true;
  };

  Pool& pool_of(const Block& b) { return b.small ? small_ : large_; }
  std::int32_t new_block();
  void drop_block(std::int32_t id);
  void insert_free(std::int32_t id);
  void erase_free(std::int32_t id);
  std::int32_t get_free_block(Pool& pool, bool small, std::uint64_t stream,
                              std::size_t size);
  bool should_split(const Block& b, std::size_t size) const;
  void use_block(std::int32_t id, std::size_t size, std::uintptr_t* address);
  void try_merge(std::int32_t dst, std::int32_t src);
  std::int32_t alloc_segment(bool small, std::uint64_t stream,
                             std::size_t size);
  // Expandable mode.
  std::int32_t find_expandable(Pool& pool, bool small, std::uint64_t stream,
                               std::size_t size);
  std::int32_t try_expandable(Pool& pool, bool small, std::uint64_t stream,
                              std::size_t size);
  bool map_block(std::int32_t id, std::size_t size);
  void unmap_block(std::int32_t id);

  SimDevice* device_;
  bool expandable_;
  std::size_t max_split_;  // SIZE_MAX when unlimited
  std::vector<Block> blocks_;
  std::vector<std::int32_t> free_ids_;
  std::unordered_map<std::uintptr_t, std::int32_t> live_;
  Pool small_;
  Pool large_;
  std::vector<Segment> segments_;
  std::uint64_t segments_created_ = 0;
  std::uint64_t releases_ = 0;
};

}  // namespace jaxlake::replay

#endif  // JAXLAKE_REPLAY_TORCH_H_
