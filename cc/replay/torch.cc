// jaxlake: the PyTorch caching allocator model (see torch.h) and the two
// policies over it, "torch" and "torch-expandable".
#include "cc/replay/torch.h"

#include <limits>
#include <memory>
#include <sstream>

namespace jaxlake::replay {

TorchAllocator::TorchAllocator(SimDevice* device, bool expandable,
                               std::size_t max_split_size)
    : device_(device),
      expandable_(expandable),
      max_split_(max_split_size ? max_split_size
                                : std::numeric_limits<std::size_t>::max()) {}

std::size_t TorchAllocator::RoundSize(std::size_t n) {
  return n < kTorchMinBlock ? kTorchMinBlock : RoundUp(n, kTorchMinBlock);
}

std::size_t TorchAllocator::AllocationSize(std::size_t rounded) {
  if (rounded <= kTorchSmallSize) return kTorchSmallBuffer;
  if (rounded < kTorchMinLargeAlloc) return kTorchLargeBuffer;
  return RoundUp(rounded, kTorchRoundLarge);
}

std::int32_t TorchAllocator::new_block() {
  if (!free_ids_.empty()) {
    const std::int32_t id = free_ids_.back();
    free_ids_.pop_back();
    blocks_[id] = Block{};
    return id;
  }
  blocks_.emplace_back();
  return static_cast<std::int32_t>(blocks_.size() - 1);
}

void TorchAllocator::drop_block(std::int32_t id) {
  blocks_[id].size = 0;
  free_ids_.push_back(id);
}

void TorchAllocator::insert_free(std::int32_t id) {
  const Block& b = blocks_[id];
  Pool& pool = pool_of(b);
  if (b.mapped) {
    pool.blocks.emplace(b.stream, b.size, b.ptr, id);
  } else {
    pool.unmapped.emplace(b.stream, b.ptr, id);
  }
}

void TorchAllocator::erase_free(std::int32_t id) {
  const Block& b = blocks_[id];
  Pool& pool = pool_of(b);
  if (b.mapped) {
    pool.blocks.erase(SizeKey{b.stream, b.size, b.ptr, id});
  } else {
    pool.unmapped.erase(AddrKey{b.stream, b.ptr, id});
  }
}

std::int32_t TorchAllocator::get_free_block(Pool& pool, bool,
                                            std::uint64_t stream,
                                            std::size_t size) {
  auto it = pool.blocks.lower_bound(SizeKey{stream, size, 0, -1});
  if (it == pool.blocks.end() || std::get<0>(*it) != stream) return -1;
  const std::size_t found = std::get<1>(*it);
  // Do not hand an oversize block to a request below max_split_size, nor
  // a much larger oversize block to an oversize request.
  if (size < max_split_ && found >= max_split_) return -1;
  if (size >= max_split_ && found >= size + kTorchLargeBuffer) return -1;
  const std::int32_t id = std::get<3>(*it);
  pool.blocks.erase(it);
  return id;
}

bool TorchAllocator::should_split(const Block& b, std::size_t size) const {
  const std::size_t remaining = b.size - size;
  if (b.small || expandable_) return remaining >= kTorchMinBlock;
  return size < max_split_ && remaining > kTorchSmallSize;
}

// Takes block `id` (already out of the free sets) for a request of `size`
// rounded bytes, splitting off the rest when the rules allow.
void TorchAllocator::use_block(std::int32_t id, std::size_t size,
                               std::uintptr_t* address) {
  if (should_split(blocks_[id], size)) {
    const std::int32_t rest = new_block();
    Block& b = blocks_[id];
    Block& r = blocks_[rest];
    r.ptr = b.ptr + size;
    r.size = b.size - size;
    r.stream = b.stream;
    r.segment = b.segment;
    r.small = b.small;
    r.mapped = true;
    r.prev = id;
    r.next = b.next;
    if (b.next >= 0) blocks_[b.next].prev = rest;
    b.next = rest;
    b.size = size;
    insert_free(rest);
  }
  Block& b = blocks_[id];
  b.allocated = true;
  live_[b.ptr] = id;
  *address = b.ptr;
}

// Merges free block `src` into its neighbour `dst` (dst survives). dst is
// not in a free set while this runs.
void TorchAllocator::try_merge(std::int32_t dst, std::int32_t src) {
  if (src < 0) return;
  Block& s = blocks_[src];
  Block& d = blocks_[dst];
  if (s.allocated || s.mapped != d.mapped) return;
  erase_free(src);
  if (d.prev == src) {
    d.ptr = s.ptr;
    d.prev = s.prev;
    if (d.prev >= 0) blocks_[d.prev].next = dst;
  } else {
    d.next = s.next;
    if (d.next >= 0) blocks_[d.next].prev = dst;
  }
  d.size += s.size;
  drop_block(src);
}

// A new cudaMalloc segment of AllocationSize(size) bytes, as one block
// (not in a free set); -1 when the device is full.
std::int32_t TorchAllocator::alloc_segment(bool small, std::uint64_t stream,
                                           std::size_t size) {
  const std::size_t bytes = AllocationSize(size);
  if (!device_->cuda_malloc(bytes)) return -1;
  ++segments_created_;
  const std::int32_t id = new_block();
  Block& b = blocks_[id];
  b.ptr = device_->reserve_va(bytes);
  b.size = bytes;
  b.stream = stream;
  b.small = small;
  return id;
}

bool TorchAllocator::try_malloc(std::size_t nbytes, std::uint64_t stream,
                                std::uintptr_t* address) {
  const std::size_t size = RoundSize(nbytes);
  const bool small = size <= kTorchSmallSize;
  Pool& pool = small ? small_ : large_;
  std::int32_t id = get_free_block(pool, small, stream, size);
  if (id < 0) {
    id = expandable_ ? try_expandable(pool, small, stream, size)
                     : alloc_segment(small, stream, size);
  }
  if (id < 0) return false;
  use_block(id, size, address);
  return true;
}

bool TorchAllocator::malloc(std::size_t nbytes, std::uint64_t stream,
                            std::uintptr_t* address) {
  if (try_malloc(nbytes, stream, address)) return true;
  release_cached();
  return try_malloc(nbytes, stream, address);
}

bool TorchAllocator::free(std::uintptr_t address) {
  auto it = live_.find(address);
  if (it == live_.end()) return false;
  std::int32_t id = it->second;
  live_.erase(it);
  blocks_[id].allocated = false;
  try_merge(id, blocks_[id].prev);
  try_merge(id, blocks_[id].next);
  insert_free(id);
  return true;
}

std::size_t TorchAllocator::release_cached() {
  ++releases_;
  const std::size_t before = device_->reserved();
  for (Pool* pool : {&large_, &small_}) {
    std::vector<std::int32_t> ids;
    for (const SizeKey& k : pool->blocks) ids.push_back(std::get<3>(k));
    for (std::int32_t id : ids) {
      if (expandable_) {
        // The block may have been merged into an unmapped neighbour by an
        // earlier unmap; it is then gone (size 0) or no longer mapped.
        if (blocks_[id].size == 0 || !blocks_[id].mapped ||
            blocks_[id].allocated)
          continue;
        unmap_block(id);
      } else if (blocks_[id].prev < 0 && blocks_[id].next < 0) {
        erase_free(id);
        device_->cuda_free(blocks_[id].size);
        drop_block(id);
      }
    }
  }
  return before - device_->reserved();
}

// -- expandable segments -----------------------------------------------------

std::int32_t TorchAllocator::find_expandable(Pool& pool, bool small,
                                             std::uint64_t stream,
                                             std::size_t size) {
  auto enough = [&](std::int32_t c) {
    std::size_t bytes = 0;
    while (bytes < size && c >= 0 && !blocks_[c].allocated) {
      bytes += blocks_[c].size;
      c = blocks_[c].next;
    }
    return bytes >= size;
  };
  for (auto it = pool.unmapped.lower_bound(AddrKey{stream, 0, -1});
       it != pool.unmapped.end() && std::get<0>(*it) == stream; ++it) {
    std::int32_t c = std::get<2>(*it);
    const std::int32_t prev = blocks_[c].prev;
    if (prev >= 0 && !blocks_[prev].allocated) c = prev;
    if (enough(c)) return c;
  }
  // A new segment: address space for 9/8 of the device, nothing mapped.
  const std::size_t page = small ? kTorchSmallBuffer : kTorchLargeBuffer;
  const std::size_t capacity = device_->capacity();
  Segment seg;
  seg.page = page;
  seg.size = (capacity + capacity / 8) / page * page;
  if (seg.size == 0) seg.size = page;
  // A request larger than a whole segment (9/8 of the device) cannot be
  // mapped in one: out of memory, with no reservation made.
  if (size > seg.size) return -1;
  seg.base = device_->reserve_va(seg.size);
  seg.mapped.assign(seg.size / page, false);
  device_->count(vmm::Call::reserve, 1, seg.size);
  ++segments_created_;
  segments_.push_back(seg);
  const std::int32_t id = new_block();
  Block& b = blocks_[id];
  b.ptr = seg.base;
  b.size = seg.size;
  b.stream = stream;
  b.small = small;
  b.mapped = false;
  b.segment = static_cast<std::int32_t>(segments_.size() - 1);
  insert_free(id);
  return id;
}

std::int32_t TorchAllocator::try_expandable(Pool& pool, bool small,
                                            std::uint64_t stream,
                                            std::size_t size) {
  std::int32_t c = find_expandable(pool, small, stream, size);
  if (c < 0) return -1;
  if (!blocks_[c].mapped &&
      !map_block(c, std::min(blocks_[c].size, size)))
    return -1;
  while (blocks_[c].size < size) {
    const std::size_t remaining = size - blocks_[c].size;
    const std::int32_t next = blocks_[c].next;
    if (!map_block(next, std::min(remaining, blocks_[next].size))) return -1;
    c = next;  // map_block merged c into next
  }
  erase_free(c);
  return c;
}

bool TorchAllocator::map_block(std::int32_t id, std::size_t size) {
  Segment& seg = segments_[blocks_[id].segment];
  const std::size_t first = (blocks_[id].ptr - seg.base) / seg.page;
  const std::size_t last = (blocks_[id].ptr + size - seg.base + seg.page - 1) /
                           seg.page;
  const std::size_t pages = last - first;
  if (!device_->take(pages * seg.page)) {
    // cuMemCreate page by page until one fails, then release those made.
    const std::size_t made = device_->available() / seg.page;
    device_->count(vmm::Call::create, made + 1, seg.page);
    device_->count(vmm::Call::release, made, seg.page);
    return false;
  }
  device_->count(vmm::Call::create, pages, seg.page);
  device_->count(vmm::Call::map, pages, seg.page);
  device_->count(vmm::Call::set_access, 1, pages * seg.page);
  for (std::size_t p = first; p < last; ++p) seg.mapped[p] = true;
  erase_free(id);
  const std::size_t mapped = pages * seg.page;
  if (mapped < blocks_[id].size) {
    const std::int32_t rest = new_block();
    Block& b = blocks_[id];
    Block& r = blocks_[rest];
    r.ptr = b.ptr + mapped;
    r.size = b.size - mapped;
    r.stream = b.stream;
    r.segment = b.segment;
    r.small = b.small;
    r.mapped = false;
    r.prev = id;
    r.next = b.next;
    if (b.next >= 0) blocks_[b.next].prev = rest;
    b.next = rest;
    b.size = mapped;
    insert_free(rest);
  }
  blocks_[id].mapped = true;
  try_merge(id, blocks_[id].prev);
  try_merge(id, blocks_[id].next);
  insert_free(id);
  return true;
}

// Unmaps the pages wholly inside free block `id`; frees the segment when
// nothing in it stays mapped.
void TorchAllocator::unmap_block(std::int32_t id) {
  const std::int32_t seg_index = blocks_[id].segment;
  Segment& seg = segments_[seg_index];
  const std::uintptr_t ptr = blocks_[id].ptr;
  const std::size_t size = blocks_[id].size;
  const std::size_t first = (ptr - seg.base + seg.page - 1) / seg.page;
  const std::size_t last = (ptr + size - seg.base) / seg.page;
  if (first >= last) return;
  const std::size_t pages = last - first;
  device_->count(vmm::Call::unmap, pages, seg.page);
  device_->count(vmm::Call::release, pages, seg.page);
  device_->give(pages * seg.page);
  for (std::size_t p = first; p < last; ++p) seg.mapped[p] = false;
  erase_free(id);
  const std::uintptr_t begin = seg.base + first * seg.page;
  const std::uintptr_t end = seg.base + last * seg.page;
  if (begin > ptr) {  // a mapped free piece before the unmapped pages
    const std::int32_t before = new_block();
    Block& b = blocks_[id];
    Block& f = blocks_[before];
    f = b;
    f.size = begin - ptr;
    f.next = id;
    if (b.prev >= 0) blocks_[b.prev].next = before;
    b.prev = before;
    insert_free(before);
  }
  if (end < ptr + size) {  // and one after them
    const std::int32_t after = new_block();
    Block& b = blocks_[id];
    Block& f = blocks_[after];
    f = b;
    f.ptr = end;
    f.size = ptr + size - end;
    f.prev = id;
    if (b.next >= 0) blocks_[b.next].prev = after;
    b.next = after;
    insert_free(after);
  }
  Block& b = blocks_[id];
  b.ptr = begin;
  b.size = end - begin;
  b.mapped = false;
  try_merge(id, blocks_[id].prev);
  try_merge(id, blocks_[id].next);
  if (blocks_[id].prev < 0 && blocks_[id].next < 0) {
    // Nothing left mapped in the segment: cuMemAddressFree it.
    device_->count(vmm::Call::address_free, 1, seg.size);
    seg.alive = false;
    drop_block(id);
    return;
  }
  insert_free(id);
}

std::string TorchAllocator::check() const {
  std::ostringstream err;
  std::size_t mapped_pages_bytes = 0;
  for (const Segment& s : segments_) {
    if (!s.alive) continue;
    for (bool m : s.mapped) mapped_pages_bytes += m ? s.page : 0;
  }
  std::size_t free_mapped = 0;
  std::size_t free_unmapped = 0;
  for (std::size_t i = 0; i < blocks_.size(); ++i) {
    const Block& b = blocks_[i];
    if (b.size == 0) continue;
    const auto id = static_cast<std::int32_t>(i);
    if (b.next >= 0 && (blocks_[b.next].prev != id ||
                        blocks_[b.next].ptr != b.ptr + b.size))
      err << "block " << i << " and its next are not adjacent; ";
    if (!b.allocated) {
      if (b.mapped) {
        ++free_mapped;
      } else {
        ++free_unmapped;
      }
      // Free neighbours of the same mapped state must have been merged.
      for (std::int32_t n : {b.prev, b.next})
        if (n >= 0 && !blocks_[n].allocated &&
            blocks_[n].mapped == b.mapped)
          err << "free blocks " << i << " and " << n << " not merged; ";
    } else if (!b.mapped) {
      err << "allocated block " << i << " is not mapped; ";
    }
  }
  const std::size_t in_sets = small_.blocks.size() + large_.blocks.size();
  const std::size_t in_unmapped =
      small_.unmapped.size() + large_.unmapped.size();
  if (in_sets != free_mapped)
    err << "free sets hold " << in_sets << " blocks, " << free_mapped
        << " free mapped blocks exist; ";
  if (in_unmapped != free_unmapped)
    err << "unmapped sets hold " << in_unmapped << " blocks, "
        << free_unmapped << " exist; ";
  if (expandable_ && mapped_pages_bytes != device_->reserved())
    err << "mapped pages " << mapped_pages_bytes << " != reserved "
        << device_->reserved() << "; ";
  return err.str();
}

namespace {

class TorchPolicy final : public Policy {
 public:
  TorchPolicy(const PolicyOptions& o, bool expandable)
      : device_(o.capacity, o.granularity, o.latency),
        torch_(&device_, expandable, o.torch_max_split_size),
        expandable_(expandable) {}

  const char* name() const override {
    return expandable_ ? "torch-expandable" : "torch";
  }
  bool allocate(std::size_t nbytes, std::uint64_t stream,
                std::uintptr_t* address) override {
    return torch_.malloc(nbytes, stream, address);
  }
  void free(std::uintptr_t address, std::uint64_t) override {
    torch_.free(address);
  }
  std::size_t reserved() const override { return device_.reserved(); }
  vmm::CallCounts calls() const override { return device_.calls(); }
  vmm::CallTimes driver_us() const override { return device_.driver_us(); }
  Counters counters() const override {
    return {{"stitches", 0},
            {"stitched_bytes", 0},
            {"stitch_reuses", 0},
            {"reclaims", torch_.releases()},
            {"segments", torch_.segments_created()}};
  }
  std::string check() const override { return torch_.check(); }

 private:
  SimDevice device_;
  TorchAllocator torch_;
  bool expandable_;
};

}  // namespace

std::unique_ptr<Policy> MakeTorchPolicy(const PolicyOptions& o) {
  return std::make_unique<TorchPolicy>(o, false);
}

std::unique_ptr<Policy> MakeExpandablePolicy(const PolicyOptions& o) {
  return std::make_unique<TorchPolicy>(o, true);
}

}  // namespace jaxlake::replay
