// The fake driver's allocations: plain device memory (cuMemAlloc), host
// memory (allocated or registered), and the driver's own stream-ordered
// pool, which keeps freed memory until a synchronisation trims it to its
// release threshold. VMM, copies and pointer queries are in memory.cc.
#include <algorithm>
#include <cstdint>
#include <mutex>

#include "cc/fakegpu/driver.h"
#include "cc/fakegpu/fakegpu.h"
#include "cc/vmm/cuda_types.h"

using namespace jaxlake::cuda;            // NOLINT: the driver's vocabulary
using namespace jaxlake::fakegpu::driver;  // NOLINT: its shared state
namespace fg = jaxlake::fakegpu;

namespace jaxlake::fakegpu::driver {

// Gives `dev`'s kept pool memory back to the device until the pool
// reserves no more than `keep` (or keeps nothing).
void TrimPool(int dev, std::uint64_t keep) {
  std::uint64_t release = 0;
  {
    Driver& d = D();
    std::lock_guard<std::mutex> lock(d.mu);
    const std::uint64_t reserved =
        d.pool_used[dev] + d.pool_freeing[dev] + d.pool_cached[dev];
    if (reserved <= keep) return;
    release = std::min(d.pool_cached[dev], reserved - keep);
    d.pool_cached[dev] -= release;
  }
  fg::Uncharge(dev, release);
}

void TrimPools() {
  for (int dev = 0; dev < Count(); ++dev) {
    std::uint64_t threshold = 0;
    {
      Driver& d = D();
      std::lock_guard<std::mutex> lock(d.mu);
      threshold = d.release_threshold[dev];
    }
    TrimPool(dev, threshold);
  }
}

}  // namespace jaxlake::fakegpu::driver

namespace {
// f(the driver's state, the pool's device) under the driver's lock, for a
// pool the driver made and an attribute value; else
// CUDA_ERROR_INVALID_VALUE.
template <typename F>
CUresult WithPool(CUmemoryPool pool, void* value, F f) {
  const int dev = DeviceOfPool(pool);
  if (dev < 0 || value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = D();
  std::lock_guard<std::mutex> lock(d.mu);
  return f(d, dev);
}
}  // namespace

extern "C" {

// ---- plain allocations ------------------------------------------------------

namespace {
// `bytes` of device memory on `dev` (cuMemAlloc's, or the driver pool's when
// `pool`): charged to the device, mapped lazily, and recorded.
CUresult NewAllocation(int dev, std::size_t bytes, bool pool,
                       CUdeviceptr* dptr) {
  // A pool allocation first takes the memory its pool kept (PoolFree), and
  // charges the device only for the rest.
  std::size_t kept = 0;
  if (pool) {
    Driver& d = D();
    std::lock_guard<std::mutex> lock(d.mu);
    kept = std::min<std::size_t>(bytes, d.pool_cached[dev]);
    d.pool_cached[dev] -= kept;
  }
  const auto give_back = [&] {
    if (kept == 0) return;
    Driver& d = D();
    std::lock_guard<std::mutex> lock(d.mu);
    d.pool_cached[dev] += kept;
  };
  if (!fg::Charge(dev, bytes - kept)) {
    give_back();
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  void* p = fg::MapAnonymous(bytes);
  if (p == nullptr) {
    fg::Uncharge(dev, bytes - kept);
    give_back();
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  const auto v = reinterpret_cast<CUdeviceptr>(p);
  fg::AddRange({v, bytes, dev, fg::Kind::kDevice, true});
  Driver& d = D();
  std::lock_guard<std::mutex> lock(d.mu);
  d.allocs[v] = Driver::Alloc{dev, bytes, pool};
  if (pool) {
    d.pool_used[dev] += bytes;
    d.pool_high[dev] = std::max(d.pool_high[dev], d.pool_used[dev]);
    d.pool_reserved_high[dev] = std::max(
        d.pool_reserved_high[dev],
        d.pool_used[dev] + d.pool_freeing[dev] + d.pool_cached[dev]);
  }
  *dptr = v;
  return CUDA_SUCCESS;
}

// What TakeAllocation found at an address.
enum class Taken { kTaken, kNotTheDrivers, kOtherKind };

// Takes the allocation at `dptr` out of the driver's books when it is a
// plain one (`pool` false) or a pool one: kTaken with *out set (a pool
// allocation's bytes then count as being freed), kOtherKind for one of the
// other kind, kNotTheDrivers when the driver made none there (a graph's
// allocation, perhaps: the graphs' lock is taken before the driver's
// elsewhere, so the caller asks graph_capture.cc after this returns).
Taken TakeAllocation(CUdeviceptr dptr, bool pool, Driver::Alloc* out) {
  Driver& d = D();
  std::lock_guard<std::mutex> lock(d.mu);
  auto it = d.allocs.find(dptr);
  if (it == d.allocs.end()) return Taken::kNotTheDrivers;
  if (it->second.pool != pool) return Taken::kOtherKind;
  *out = it->second;
  d.allocs.erase(it);
  if (pool) {
    d.pool_used[out->device] -= out->size;
    d.pool_freeing[out->device] += out->size;
  }
  return Taken::kTaken;
}
}  // namespace

FAKE cuMemAlloc_v2(CUdeviceptr* dptr, std::size_t size) {
  ENTER();
  int dev = 0;
  if (CUresult r = NeedContext(&dev); r != CUDA_SUCCESS) return r;
  if (dptr == nullptr || size == 0) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = CheckUnsafe(); r != CUDA_SUCCESS) return r;
  return NewAllocation(dev, (size + kGranularity - 1) / kGranularity *
                                kGranularity, false, dptr);
}

FAKE cuMemFree_v2(CUdeviceptr dptr) {
  ENTER();
  if (CUresult r = NeedInit(); r != CUDA_SUCCESS) return r;
  if (dptr == 0) return CUDA_SUCCESS;
  if (CUresult r = CheckUnsafe(); r != CUDA_SUCCESS) return r;
  Driver::Alloc a{};
  switch (TakeAllocation(dptr, false, &a)) {
    case Taken::kOtherKind:
      return CUDA_ERROR_INVALID_VALUE;
    case Taken::kNotTheDrivers: {
      // A graph's allocation: freed in the device's order.
      if (!FreeGraphAllocation(dptr, nullptr)) return CUDA_ERROR_INVALID_VALUE;
      const int dev = fg::CurrentDevice();
      for (fg::Stream* s : fg::StreamsOf(dev < 0 ? 0 : dev)) s->Synchronize();
      return CUDA_SUCCESS;
    }
    case Taken::kTaken:
      break;
  }
  // The driver synchronises the device before freeing.
  for (fg::Stream* s : fg::StreamsOf(a.device)) s->Synchronize();
  fg::RemoveRange(dptr);
  fg::UnmapAnonymous(reinterpret_cast<void*>(dptr), a.size);
  fg::Uncharge(a.device, a.size);
  return CUDA_SUCCESS;
}

FAKE cuMemHostAlloc(void** pp, std::size_t size, unsigned int /*flags*/) {
  ENTER();
  if (CUresult r = NeedInit(); r != CUDA_SUCCESS) return r;
  if (pp == nullptr || size == 0) return CUDA_ERROR_INVALID_VALUE;
  void* p = fg::MapAnonymous(size);
  if (p == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
  const auto v = reinterpret_cast<std::uintptr_t>(p);
  fg::AddRange({v, size, 0, fg::Kind::kHost, true});
  Driver& d = D();
  std::lock_guard<std::mutex> lock(d.mu);
  d.host_allocs[v] = size;
  fg::CountHostAlloc(static_cast<std::int64_t>(size));
  *pp = p;
  return CUDA_SUCCESS;
}

FAKE cuMemAllocHost_v2(void** pp, std::size_t size) {
  return cuMemHostAlloc(pp, size, 0);
}

FAKE cuMemFreeHost(void* p) {
  ENTER();
  std::size_t size = 0;
  {
    Driver& d = D();
    std::lock_guard<std::mutex> lock(d.mu);
    auto it = d.host_allocs.find(reinterpret_cast<std::uintptr_t>(p));
    if (it == d.host_allocs.end()) return CUDA_ERROR_INVALID_VALUE;
    size = it->second;
    d.host_allocs.erase(it);
  }
  fg::CountHostAlloc(-static_cast<std::int64_t>(size));
  fg::RemoveRange(reinterpret_cast<std::uintptr_t>(p));
  fg::UnmapAnonymous(p, size);
  return CUDA_SUCCESS;
}

FAKE cuMemHostGetDevicePointer_v2(CUdeviceptr* dptr, void* p,
                                  unsigned int flags) {
  ENTER();
  if (dptr == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  *dptr = reinterpret_cast<CUdeviceptr>(p);  // one address space
  return CUDA_SUCCESS;
}

FAKE cuMemHostRegister_v2(void* p, std::size_t size, unsigned int /*flags*/) {
  ENTER();
  if (p == nullptr || size == 0) return CUDA_ERROR_INVALID_VALUE;
  fg::AddRange({reinterpret_cast<std::uintptr_t>(p), size, 0,
                fg::Kind::kHost});
  return CUDA_SUCCESS;
}

FAKE cuMemHostUnregister(void* p) {
  ENTER();
  fg::RemoveRange(reinterpret_cast<std::uintptr_t>(p));
  return CUDA_SUCCESS;
}

// ---- the driver's own stream-ordered pool -----------------------------------

FAKE cuDeviceGetDefaultMemPool(CUmemoryPool* pool, CUdevice device) {
  ENTER();
  if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDevice(device)) return CUDA_ERROR_INVALID_DEVICE;
  *pool = PoolOf(device);
  return CUDA_SUCCESS;
}

FAKE cuDeviceGetMemPool(CUmemoryPool* pool, CUdevice device) {
  return cuDeviceGetDefaultMemPool(pool, device);
}

namespace {
CUresult PoolAlloc(CUdeviceptr* dptr, std::size_t size, CUmemoryPool pool,
                   CUstream stream) {
  if (CUresult r = NeedContext(); r != CUDA_SUCCESS) return r;
  const int dev = DeviceOfPool(pool);
  if (dptr == nullptr || size == 0 || dev < 0) return CUDA_ERROR_INVALID_VALUE;
  if (StreamFor(stream) == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  // Under capture: a memory alloc node of the capture's graph.
  if (CUresult r = 0; CaptureAlloc(stream, dev, size, dptr, &r)) return r;
  return NewAllocation(dev, (size + 511) / 512 * 512, true, dptr);
}

CUresult PoolFree(CUdeviceptr dptr, CUstream stream) {
  if (CUresult r = NeedInit(); r != CUDA_SUCCESS) return r;
  fg::Stream* s = StreamFor(stream);
  if (s == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  // Under capture: a memory free node (of a graph allocation only).
  if (CUresult r = 0; CaptureFree(stream, dptr, &r)) return r;
  Driver::Alloc a{};
  switch (TakeAllocation(dptr, true, &a)) {
    case Taken::kOtherKind:
      return CUDA_ERROR_INVALID_VALUE;
    case Taken::kNotTheDrivers:
      return FreeGraphAllocation(dptr, stream) ? CUDA_SUCCESS
                                               : CUDA_ERROR_INVALID_VALUE;
    case Taken::kTaken:
      break;
  }
  fg::RemoveRange(dptr);
  // The memory goes back to the pool once the stream's work before the free
  // has run; the pool keeps it (charged) until a synchronisation trims it.
  s->Enqueue([dptr, a] {
    fg::UnmapAnonymous(reinterpret_cast<void*>(dptr), a.size);
    Driver& d = D();
    std::lock_guard<std::mutex> lock(d.mu);
    d.pool_freeing[a.device] -= a.size;
    d.pool_cached[a.device] += a.size;
  });
  return CUDA_SUCCESS;
}
}  // namespace

FAKE cuMemAllocFromPoolAsync(CUdeviceptr* dptr, std::size_t size,
                             CUmemoryPool pool, CUstream stream) {
  ENTER();
  return PoolAlloc(dptr, size, pool, stream);
}
FAKE cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, std::size_t size,
                                  CUmemoryPool pool, CUstream stream) {
  ENTER();
  return PoolAlloc(dptr, size, pool, stream);
}
FAKE cuMemAllocAsync(CUdeviceptr* dptr, std::size_t size, CUstream stream) {
  ENTER();
  fg::Stream* s = StreamFor(stream);
  if (s == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  return PoolAlloc(dptr, size, PoolOf(s->device()), stream);
}
FAKE cuMemFreeAsync(CUdeviceptr dptr, CUstream stream) {
  ENTER();
  return PoolFree(dptr, stream);
}
FAKE cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream) {
  ENTER();
  return PoolFree(dptr, stream);
}

// The pool's reuse policies (CU_MEMPOOL_ATTR_REUSE_*): the fake's pool
// always reuses, so they read 1 and a write changes nothing.
static bool IsReuseAttr(int attr) {
  return attr == CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES ||
         attr == CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC ||
         attr == CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES;
}

FAKE cuMemPoolGetAttribute(CUmemoryPool pool, int attr, void* value) {
  ENTER();
  return WithPool(pool, value, [&](Driver& d, int dev) -> CUresult {
    auto* out = static_cast<cuuint64_t*>(value);
    if (IsReuseAttr(attr)) {  // every reuse policy on
      *static_cast<int*>(value) = 1;
      return CUDA_SUCCESS;
    }
    switch (attr) {
      case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
        *out = d.release_threshold[dev];
        return CUDA_SUCCESS;
      case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
        *out = d.pool_used[dev] + d.pool_freeing[dev] + d.pool_cached[dev];
        return CUDA_SUCCESS;
      case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
        *out = d.pool_used[dev];
        return CUDA_SUCCESS;
      case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
        *out = d.pool_reserved_high[dev];
        return CUDA_SUCCESS;
      case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
        *out = d.pool_high[dev];
        return CUDA_SUCCESS;
      default:
        return CUDA_ERROR_INVALID_VALUE;
    }
  });
}

FAKE cuMemPoolSetAttribute(CUmemoryPool pool, int attr, void* value) {
  ENTER();
  return WithPool(pool, value, [&](Driver& d, int dev) -> CUresult {
    if (IsReuseAttr(attr)) return CUDA_SUCCESS;  // taken, always on
    switch (attr) {
      case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
        d.release_threshold[dev] = *static_cast<const cuuint64_t*>(value);
        return CUDA_SUCCESS;
      case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
        d.pool_reserved_high[dev] =
            d.pool_used[dev] + d.pool_freeing[dev] + d.pool_cached[dev];
        return CUDA_SUCCESS;
      case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
        d.pool_high[dev] = d.pool_used[dev];
        return CUDA_SUCCESS;
      default:
        return CUDA_ERROR_INVALID_VALUE;
    }
  });
}

FAKE cuMemPoolTrimTo(CUmemoryPool pool, std::size_t keep) {
  ENTER();
  const int dev = DeviceOfPool(pool);
  if (dev < 0) return CUDA_ERROR_INVALID_VALUE;
  TrimPool(dev, keep);
  return CUDA_SUCCESS;
}

FAKE cuMemPoolSetAccess(CUmemoryPool pool, const CUmemAccessDesc* desc,
                        std::size_t count) {
  ENTER();
  if (DeviceOfPool(pool) < 0 || (desc == nullptr && count != 0))
    return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;
}

}  // extern "C"
