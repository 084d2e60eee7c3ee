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
#include "cc/replay/bfc.h"

#include <memory>
#include <sstream>

namespace jaxlake::replay {

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

std::unique_ptr<Policy> MakeBfcPolicy(const PolicyOptions& o) {
  return std::make_unique<BfcPolicy>(o);
}

}  // namespace jaxlake::replay
