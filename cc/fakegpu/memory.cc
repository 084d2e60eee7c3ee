// The fake driver's memory: VMM on memfd-backed host memory (jaxlake's
// HostDriver), sharing and export, the work in flight on each range,
// pointer attributes, and copies and memsets in stream order. Plain, host
// and pool allocations are in memory_alloc.cc.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <mutex>
#include <utility>
#include <vector>

#include "cc/fakegpu/driver.h"
#include "cc/fakegpu/fakegpu.h"
#include "cc/vmm/cuda_types.h"

using namespace jaxlake::cuda;            // NOLINT: the driver's vocabulary
using namespace jaxlake::fakegpu::driver;  // NOLINT: its shared state
namespace fg = jaxlake::fakegpu;

namespace {

constexpr CUresult kIllegalAddress = 700;  // CUDA_ERROR_ILLEGAL_ADDRESS

CUresult FromStatus(jaxlake::vmm::Status s) {
  using jaxlake::vmm::Status;
  switch (s) {
    case Status::kOk:
      return CUDA_SUCCESS;
    case Status::kOutOfMemory:
      return CUDA_ERROR_OUT_OF_MEMORY;
    case Status::kNotReady:
      return CUDA_ERROR_NOT_READY;
    case Status::kNotSupported:
      return CUDA_ERROR_NOT_SUPPORTED;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}

// Whether [p, p+n) is memory the device may run a copy on later: device
// memory and pinned host memory. Other (pageable) host memory is copied at
// the call, as the driver stages it.
bool Pinned(const void* p) {
  fg::Range r;
  return fg::FindRange(reinterpret_cast<std::uintptr_t>(p), &r);
}

// Whether `device` may touch [p, p+n) as far as VMM mappings go: every
// mapping of another device's memory in the range must have granted it
// access (cuMemSetAccess). Access from a device to its own mappings, and
// memory outside the mappings, are not checked here. Peer access enabled
// for contexts (cuCtxEnablePeerAccess) does not cover VMM memory.
bool PeerGranted(int device, const void* p, std::size_t n) {
  const auto a = reinterpret_cast<CUdeviceptr>(p);
  Driver& d = D();
  std::lock_guard<std::mutex> lock(d.mu);
  auto it = d.mappings.upper_bound(a);
  if (it != d.mappings.begin()) --it;
  for (; it != d.mappings.end() && it->first < a + n; ++it) {
    if (it->first + it->second.size <= a) continue;
    if (it->second.device == device || device < 0 || device >= 64) continue;
    if ((it->second.access & (std::uint64_t{1} << device)) == 0) return false;
  }
  return true;
}

// A copy that `device` runs touching VMM memory of another device that
// was not granted to it: the device faults on it, and the fake refuses the
// copy with the driver's error for that fault, naming it in the log.
CUresult CheckPeers(int device, void* dst, const void* src, std::size_t n) {
  if (PeerGranted(device, dst, n) && PeerGranted(device, src, n))
    return CUDA_SUCCESS;
  std::fprintf(stderr,
               "jaxlake fake GPU: device %d copied %zu bytes from %p to %p, "
               "VMM memory of another device that was not granted to it "
               "(cuMemSetAccess): CUDA_ERROR_ILLEGAL_ADDRESS\n",
               device, n, src, dst);
  return kIllegalAddress;
}

// A copy in stream order; from or to pageable memory it completes before
// the call returns, after the work before it.
CUresult Copy(void* dst, const void* src, std::size_t n, CUstream stream) {
  fg::Stream* s = StreamFor(stream);
  if (s == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (n == 0) return CUDA_SUCCESS;
  if (CUresult r = CheckPeers(s->device(), dst, src, n); r != CUDA_SUCCESS)
    return r;
  if (CUresult r = 0; CaptureCopy(stream, dst, src, n, &r)) return r;
  if (Pinned(dst) && Pinned(src)) {
    EnqueueTouching(s,
                    {{reinterpret_cast<CUdeviceptr>(dst), n},
                     {reinterpret_cast<CUdeviceptr>(src), n}},
                    [dst, src, n] {
                      fg::Move(dst, src, n);
                      fg::ReadLoopGuard(dst, src, n);
                    });
  } else {
    s->Synchronize();
    if (CUresult r = Sticky(s->device()); r != CUDA_SUCCESS) return r;
    fg::Move(dst, src, n);
    fg::ReadLoopGuard(dst, src, n);
  }
  return CUDA_SUCCESS;
}

// A synchronous copy: after all work of the device, before the return.
CUresult CopySync(void* dst, const void* src, std::size_t n) {
  int dev = 0;
  if (CUresult r = NeedContext(&dev); r != CUDA_SUCCESS) return r;
  if (CUresult r = CheckUnsafe(); r != CUDA_SUCCESS) return r;
  if (CUresult r = CheckPeers(dev, dst, src, n); r != CUDA_SUCCESS) return r;
  for (fg::Stream* s : fg::StreamsOf(dev)) s->Synchronize();
  if (CUresult r = Sticky(dev); r != CUDA_SUCCESS) return r;
  if (n != 0) {
    fg::Move(dst, src, n);
    fg::ReadLoopGuard(dst, src, n);
  }
  return CUDA_SUCCESS;
}

template <typename T>
CUresult Memset(CUdeviceptr dst, T value, std::size_t count, CUstream stream,
                bool sync) {
  if (CUresult r = NeedContext(); r != CUDA_SUCCESS) return r;
  fg::Stream* s = StreamFor(stream);
  if (s == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (sync) {
    if (CUresult r = CheckUnsafe(); r != CUDA_SUCCESS) return r;
  } else if (CUresult r = 0; CaptureMemset(stream, dst, value, sizeof(T),
                                           count, &r)) {
    return r;
  }
  EnqueueTouching(s, {{dst, count * sizeof(T)}}, [dst, value, count] {
    fg::Fill<T>(reinterpret_cast<void*>(dst), value, count);
  });
  if (sync) {
    s->Synchronize();
    return Sticky(s->device());
  }
  return CUDA_SUCCESS;
}

}  // namespace

namespace jaxlake::fakegpu::driver {

namespace {
// The work in flight that touches device ranges, by ticket, and the
// devices whose work faulted. Never destroyed: stream threads may run work
// while the process exits.
struct InFlight {
  struct Work {
    int device;
    std::vector<Touch> touches;
    bool running = false;
    bool faulted = false;
  };
  std::mutex mu;
  std::condition_variable done;
  std::map<std::uint64_t, Work> work;
  std::uint64_t next = 1;
  std::atomic<std::uint64_t> faulted_devices{0};  // a bit per ordinal
};
InFlight& F() {
  static InFlight* const f = new InFlight();
  return *f;
}
bool Overlaps(const Touch& t, CUdeviceptr va, std::size_t size) {
  return t.second != 0 && t.first < va + size && va < t.first + t.second;
}
}  // namespace

void EnqueueTouching(fg::Stream* s, std::vector<Touch> touches,
                     std::function<void()> work) {
  InFlight& f = F();
  std::uint64_t ticket = 0;
  {
    std::lock_guard<std::mutex> lock(f.mu);
    ticket = f.next++;
    f.work[ticket] = InFlight::Work{s->device(), std::move(touches)};
  }
  s->Enqueue([ticket, work = std::move(work)] {
    InFlight& g = F();
    {
      std::lock_guard<std::mutex> lock(g.mu);
      auto it = g.work.find(ticket);
      if (it->second.faulted) {  // its memory was unmapped: it faults
        g.work.erase(it);
        g.done.notify_all();
        return;
      }
      it->second.running = true;
    }
    work();
    std::lock_guard<std::mutex> lock(g.mu);
    g.work.erase(ticket);
    g.done.notify_all();
  });
}

std::size_t WorkInFlight(CUdeviceptr va, std::size_t size) {
  InFlight& f = F();
  std::unique_lock<std::mutex> lock(f.mu);
  std::size_t faults = 0;
  for (auto& [ticket, w] : f.work) {
    if (w.faulted) continue;
    for (const Touch& t : w.touches) {
      if (!Overlaps(t, va, size)) continue;
      if (faults++ == 0)
        std::fprintf(stderr,
                     "jaxlake fake GPU: cuMemUnmap of [%#llx, +%zu) while "
                     "work enqueued on a stream of device %d still uses "
                     "[%#llx, +%zu): the work faults, "
                     "CUDA_ERROR_ILLEGAL_ADDRESS\n",
                     static_cast<unsigned long long>(va), size, w.device,
                     static_cast<unsigned long long>(t.first), t.second);
      w.faulted = true;
      if (w.device >= 0 && w.device < 64)
        f.faulted_devices.fetch_or(std::uint64_t{1} << w.device);
      break;
    }
  }
  // Work that was already running on the range finishes first.
  f.done.wait(lock, [&] {
    for (const auto& [ticket, w] : f.work) {
      if (!w.running) continue;
      for (const Touch& t : w.touches)
        if (Overlaps(t, va, size)) return false;
    }
    return true;
  });
  return faults;
}

void Fault(int device) {
  if (device >= 0 && device < 64)
    F().faulted_devices.fetch_or(std::uint64_t{1} << device);
}

std::vector<Backing> BackingOf(CUdeviceptr va, std::size_t size) {
  std::vector<Backing> out;
  if (size == 0) return out;
  Driver& d = D();
  std::lock_guard<std::mutex> lock(d.mu);
  auto it = d.mappings.upper_bound(va);
  if (it != d.mappings.begin()) --it;
  for (; it != d.mappings.end() && it->first < va + size; ++it) {
    if (it->first + it->second.size <= va) continue;
    out.push_back(Backing{it->first, it->second.size, it->second.handle,
                          it->second.offset});
  }
  return out;
}

CUresult Sticky(int device) {
  const std::uint64_t bits = F().faulted_devices.load();
  if (device < 0) return bits != 0 ? kIllegalAddress : CUDA_SUCCESS;
  if (device >= 64) return CUDA_SUCCESS;
  return (bits >> device) & 1 ? kIllegalAddress : CUDA_SUCCESS;
}

bool FindMapping(CUdeviceptr p, CUdeviceptr* base, Driver::Mapping* out) {
  Driver& d = D();
  std::lock_guard<std::mutex> lock(d.mu);
  auto it = d.mappings.upper_bound(p);
  if (it == d.mappings.begin()) return false;
  --it;
  if (p - it->first >= it->second.size) return false;
  *base = it->first;
  *out = it->second;
  return true;
}

}  // namespace jaxlake::fakegpu::driver

extern "C" {

// ---- virtual memory management ----------------------------------------------

FAKE cuMemGetAllocationGranularity(std::size_t* granularity,
                                   const CUmemAllocationProp* prop,
                                   int option) {
  ENTER();
  if (CUresult r = NeedInit(); r != CUDA_SUCCESS) return r;
  if (granularity == nullptr || prop == nullptr ||
      prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
      prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
      !ValidDevice(prop->location.id) || option < 0 || option > 1)
    return CUDA_ERROR_INVALID_VALUE;
  *granularity = kGranularity;
  return CUDA_SUCCESS;
}

FAKE cuMemAddressReserve(CUdeviceptr* ptr, std::size_t size,
                         std::size_t alignment, CUdeviceptr /*addr*/,
                         unsigned long long flags) {
  ENTER();
  if (CUresult r = NeedInit(); r != CUDA_SUCCESS) return r;
  if (ptr == nullptr || flags != 0 || (alignment & (alignment - 1)) != 0)
    return CUDA_ERROR_INVALID_VALUE;
  std::uintptr_t va = 0;
  const auto s = fg::Host().reserve(size, &va);
  if (s != jaxlake::vmm::Status::kOk) return FromStatus(s);
  *ptr = va;
  fg::CountVmm(static_cast<std::int64_t>(size), 0);
  const int dev = fg::CurrentDevice();
  fg::AddRange({va, size, dev < 0 ? 0 : dev, fg::Kind::kReserved});
  return CUDA_SUCCESS;
}

FAKE cuMemAddressFree(CUdeviceptr ptr, std::size_t size) {
  ENTER();
  if (CUresult r = NeedInit(); r != CUDA_SUCCESS) return r;
  const auto s = fg::Host().address_free(ptr, size);
  if (s == jaxlake::vmm::Status::kOk) {
    fg::RemoveRange(ptr);
    fg::CountVmm(-static_cast<std::int64_t>(size), 0);
  }
  return FromStatus(s);
}

FAKE cuMemCreate(CUmemGenericAllocationHandle* handle, std::size_t size,
                 const CUmemAllocationProp* prop, unsigned long long flags) {
  ENTER();
  if (CUresult r = NeedInit(); r != CUDA_SUCCESS) return r;
  if (handle == nullptr || prop == nullptr || flags != 0 ||
      prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
      prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
      !ValidDevice(prop->location.id) || size == 0 ||
      size % kGranularity != 0)
    return CUDA_ERROR_INVALID_VALUE;
  const int dev = prop->location.id;
  if (!fg::Charge(dev, size)) return CUDA_ERROR_OUT_OF_MEMORY;
  jaxlake::vmm::Handle h = 0;
  const auto s = fg::Host().create(size, &h);
  if (s != jaxlake::vmm::Status::kOk) {
    fg::Uncharge(dev, size);
    return FromStatus(s);
  }
  Driver& d = D();
  std::lock_guard<std::mutex> lock(d.mu);
  d.handles[h] = Driver::Handle{dev, size, prop->requestedHandleTypes};
  *handle = h;
  return CUDA_SUCCESS;
}

FAKE cuMemRelease(CUmemGenericAllocationHandle handle) {
  ENTER();
  if (CUresult r = NeedInit(); r != CUDA_SUCCESS) return r;
  {
    // A handle retained (cuMemRetainAllocationHandle) is released once per
    // retain before its creation's reference goes.
    Driver& d = D();
    std::lock_guard<std::mutex> lock(d.mu);
    auto it = d.handles.find(handle);
    if (it != d.handles.end() && it->second.retains > 0) {
      --it->second.retains;
      return CUDA_SUCCESS;
    }
  }
  const auto s = fg::Host().release(handle);
  if (s != jaxlake::vmm::Status::kOk) return FromStatus(s);
  Driver& d = D();
  std::lock_guard<std::mutex> lock(d.mu);
  auto it = d.handles.find(handle);
  if (it != d.handles.end()) {
    fg::Uncharge(it->second.device, it->second.size);
    d.handles.erase(it);
  }
  return CUDA_SUCCESS;
}

FAKE cuMemMap(CUdeviceptr ptr, std::size_t size, std::size_t offset,
              CUmemGenericAllocationHandle handle, unsigned long long flags) {
  ENTER();
  if (CUresult r = NeedInit(); r != CUDA_SUCCESS) return r;
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  const CUresult r = FromStatus(fg::Host().map(ptr, size, offset, handle));
  if (r != CUDA_SUCCESS) return r;
  Driver& d = D();
  std::lock_guard<std::mutex> lock(d.mu);
  auto it = d.handles.find(handle);
  d.mappings[ptr] = Driver::Mapping{
      size, it != d.handles.end() ? it->second.device : 0, 0, handle, offset};
  fg::CountVmm(0, 1);
  return CUDA_SUCCESS;
}

FAKE cuMemUnmap(CUdeviceptr ptr, std::size_t size) {
  ENTER();
  if (CUresult r = NeedInit(); r != CUDA_SUCCESS) return r;
  {
    // The unmap does not wait for the GPU: stream work still to touch the
    // memory faults (checked only for an unmap that starts at a mapping).
    Driver& d = D();
    std::unique_lock<std::mutex> lock(d.mu);
    const bool mapped = d.mappings.count(ptr) != 0;
    lock.unlock();
    if (mapped) WorkInFlight(ptr, size);
  }
  const CUresult r = FromStatus(fg::Host().unmap(ptr, size));
  if (r != CUDA_SUCCESS) return r;
  Driver& d = D();
  std::lock_guard<std::mutex> lock(d.mu);
  const auto first = d.mappings.lower_bound(ptr);
  const auto last = d.mappings.lower_bound(ptr + size);
  fg::CountVmm(0, -static_cast<std::int64_t>(std::distance(first, last)));
  d.mappings.erase(first, last);
  return CUDA_SUCCESS;
}

FAKE cuMemSetAccess(CUdeviceptr ptr, std::size_t size,
                    const CUmemAccessDesc* desc, std::size_t count) {
  ENTER();
  if (CUresult r = NeedInit(); r != CUDA_SUCCESS) return r;
  if (desc == nullptr || count == 0) return CUDA_ERROR_INVALID_VALUE;
  for (std::size_t i = 0; i < count; ++i) {
    if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
        !ValidDevice(desc[i].location.id))
      return CUDA_ERROR_INVALID_VALUE;
  }
  const CUresult r = FromStatus(fg::Host().set_access(ptr, size));
  if (r != CUDA_SUCCESS) return r;
  // The grants: each mapping in the range is accessible from the devices
  // named with read-write access, and no longer from those named with none.
  Driver& d = D();
  std::lock_guard<std::mutex> lock(d.mu);
  for (auto it = d.mappings.lower_bound(ptr);
       it != d.mappings.end() && it->first < ptr + size; ++it) {
    for (std::size_t i = 0; i < count; ++i) {
      if (desc[i].location.id >= 64) continue;
      const std::uint64_t bit = std::uint64_t{1} << desc[i].location.id;
      if (desc[i].flags != 0) {
        it->second.access |= bit;
      } else {
        it->second.access &= ~bit;
      }
    }
  }
  return CUDA_SUCCESS;
}

// ---- sharing and export -----------------------------------------------------

// The handle mapped at any address of a mapping, retained: each retain is
// released by one more cuMemRelease.
FAKE cuMemRetainAllocationHandle(CUmemGenericAllocationHandle* handle,
                                 void* addr) {
  ENTER();
  if (CUresult r = NeedInit(); r != CUDA_SUCCESS) return r;
  if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUdeviceptr base = 0;
  Driver::Mapping m{};
  if (!FindMapping(reinterpret_cast<CUdeviceptr>(addr), &base, &m))
    return CUDA_ERROR_INVALID_VALUE;
  Driver& d = D();
  std::lock_guard<std::mutex> lock(d.mu);
  auto it = d.handles.find(m.handle);
  if (it == d.handles.end()) return CUDA_ERROR_INVALID_VALUE;
  ++it->second.retains;
  *handle = m.handle;
  return CUDA_SUCCESS;
}

// A handle exports only to a shareable handle type its cuMemCreate asked
// for (CUmemAllocationProp::requestedHandleTypes); asked for none, it is
// CUDA_ERROR_INVALID_VALUE. The fake shares no memory between processes,
// so a type that was asked for is not supported.
FAKE cuMemExportToShareableHandle(void* shareable,
                                  CUmemGenericAllocationHandle handle,
                                  int type, unsigned long long flags) {
  ENTER();
  if (CUresult r = NeedInit(); r != CUDA_SUCCESS) return r;
  if (shareable == nullptr || flags != 0 || type == 0)
    return CUDA_ERROR_INVALID_VALUE;
  {
    Driver& d = D();
    std::lock_guard<std::mutex> lock(d.mu);
    auto it = d.handles.find(handle);
    if (it == d.handles.end() || (it->second.types & type) == 0)
      return CUDA_ERROR_INVALID_VALUE;
  }
  return fg::Unsupported("driver", "cuMemExportToShareableHandle",
                         CUDA_ERROR_NOT_SUPPORTED);
}

// Legacy IPC covers cuMemAlloc memory only: VMM mappings and the
// stream-ordered pool's memory are CUDA_ERROR_INVALID_VALUE. The fake
// shares no memory between processes: cuMemAlloc memory answers a handle
// that no other process can open.
struct IpcMemHandle {  // CUipcMemHandle
  char reserved[64];
};
FAKE cuIpcGetMemHandle(IpcMemHandle* handle, CUdeviceptr p) {
  ENTER();
  if (CUresult r = NeedInit(); r != CUDA_SUCCESS) return r;
  if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = D();
  std::lock_guard<std::mutex> lock(d.mu);
  auto it = d.allocs.find(p);
  if (it == d.allocs.end() || it->second.pool) return CUDA_ERROR_INVALID_VALUE;
  std::memset(handle->reserved, 0, sizeof(handle->reserved));
  std::memcpy(handle->reserved, &p, sizeof(p));
  return CUDA_SUCCESS;
}

// The devices have no multicast (CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED is
// 0): the granularity query answers CUDA_ERROR_NOT_SUPPORTED, one of its
// documented errors, once its arguments are valid.
struct MulticastProp {  // CUmulticastObjectProp
  unsigned int numDevices;
  std::size_t size;
  unsigned long long handleTypes;
  unsigned long long flags;
};
FAKE cuMulticastGetGranularity(std::size_t* granularity,
                               const MulticastProp* prop, int option) {
  ENTER();
  if (CUresult r = NeedInit(); r != CUDA_SUCCESS) return r;
  if (granularity == nullptr || prop == nullptr || option < 0 || option > 1)
    return CUDA_ERROR_INVALID_VALUE;
  return CUDA_ERROR_NOT_SUPPORTED;
}

namespace {
// The range an address query reports for `p`: the allocation it lies in,
// and for VMM memory the one mapping it lies in (as the driver does: a
// buffer mapped from several handles is several ranges). False for an
// address in no allocation or in no mapping of a reservation.
bool QueryRange(CUdeviceptr p, fg::Range* r) {
  if (!fg::FindRange(p, r)) return false;
  if (r->kind != fg::Kind::kReserved) return true;
  CUdeviceptr base = 0;
  Driver::Mapping m{};
  if (!FindMapping(p, &base, &m)) return false;
  r->base = base;
  r->size = m.size;
  r->device = m.device;
  return true;
}
}  // namespace

FAKE cuMemGetAddressRange_v2(CUdeviceptr* base, std::size_t* size,
                             CUdeviceptr p) {
  ENTER();
  fg::Range r;
  if (!QueryRange(p, &r)) return CUDA_ERROR_NOT_FOUND;
  if (base != nullptr) *base = r.base;
  if (size != nullptr) *size = r.size;
  return CUDA_SUCCESS;
}

namespace {
// One pointer attribute (CUpointer_attribute) of `p`.
CUresult PointerAttribute(void* data, int attribute, CUdeviceptr p,
                          bool lenient) {
  fg::Range r;
  const bool known = QueryRange(p, &r);
  if (!known && !lenient) return CUDA_ERROR_INVALID_VALUE;
  const bool device = known && r.kind != fg::Kind::kHost;
  switch (attribute) {
    case 1:  // CONTEXT
      *static_cast<CUcontext*>(data) = known ? ContextOf(r.device) : nullptr;
      break;
    case 2:  // MEMORY_TYPE: 0 unknown, 1 host, 2 device
      *static_cast<unsigned*>(data) = !known ? 0 : device ? 2 : 1;
      break;
    case 3:  // DEVICE_POINTER
    case 4:  // HOST_POINTER
      *static_cast<CUdeviceptr*>(data) = known ? p : 0;
      break;
    case 6:   // SYNC_MEMOPS
    case 8:   // IS_MANAGED
    case 10:  // IS_LEGACY_CUDA_IPC_CAPABLE
    case 15:  // IS_GPU_DIRECT_RDMA_CAPABLE
      *static_cast<int*>(data) = 0;
      break;
    case 13:  // MAPPED
      *static_cast<int*>(data) = known ? 1 : 0;
      break;
    case 7:   // BUFFER_ID
    case 20:  // MEMORY_BLOCK_ID
      *static_cast<unsigned long long*>(data) = known ? r.base : 0;
      break;
    case 9:  // DEVICE_ORDINAL
      *static_cast<int*>(data) = known ? r.device : -2;
      break;
    case 11:  // RANGE_START_ADDR
    case 19:  // MAPPING_BASE_ADDR
      *static_cast<CUdeviceptr*>(data) = known ? r.base : 0;
      break;
    case 12:  // RANGE_SIZE
    case 18:  // MAPPING_SIZE
      *static_cast<std::size_t*>(data) = known ? r.size : 0;
      break;
    case 16:  // ACCESS_FLAGS: PROT_READWRITE
      *static_cast<int*>(data) = known ? 3 : 0;
      break;
    case 14:  // ALLOWED_HANDLE_TYPES
      *static_cast<unsigned long long*>(data) = 0;
      break;
    case 17:  // MEMPOOL_HANDLE
      *static_cast<void**>(data) = nullptr;
      break;
    default:
      if (!lenient) return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}
}  // namespace

FAKE cuPointerGetAttribute(void* data, int attribute, CUdeviceptr p) {
  ENTER();
  if (data == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return PointerAttribute(data, attribute, p, false);
}

FAKE cuPointerGetAttributes(unsigned int n, int* attributes, void** data,
                            CUdeviceptr p) {
  ENTER();
  if (attributes == nullptr || data == nullptr) return CUDA_ERROR_INVALID_VALUE;
  for (unsigned i = 0; i < n; ++i)
    if (data[i] != nullptr) PointerAttribute(data[i], attributes[i], p, true);
  return CUDA_SUCCESS;
}

// ---- copies and memsets -----------------------------------------------------

FAKE cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, std::size_t n) {
  ENTER();
  return CopySync(reinterpret_cast<void*>(dst), src, n);
}
FAKE cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, std::size_t n) {
  ENTER();
  return CopySync(dst, reinterpret_cast<const void*>(src), n);
}
FAKE cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, std::size_t n) {
  ENTER();
  return CopySync(reinterpret_cast<void*>(dst),
                  reinterpret_cast<const void*>(src), n);
}
FAKE cuMemcpy(CUdeviceptr dst, CUdeviceptr src, std::size_t n) {
  ENTER();
  return CopySync(reinterpret_cast<void*>(dst),
                  reinterpret_cast<const void*>(src), n);
}

FAKE cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, std::size_t n,
                          CUstream s) {
  ENTER();
  if (CUresult r = NeedContext(); r != CUDA_SUCCESS) return r;
  return Copy(reinterpret_cast<void*>(dst), src, n, s);
}
FAKE cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, std::size_t n,
                          CUstream s) {
  ENTER();
  if (CUresult r = NeedContext(); r != CUDA_SUCCESS) return r;
  return Copy(dst, reinterpret_cast<const void*>(src), n, s);
}
FAKE cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, std::size_t n,
                          CUstream s) {
  ENTER();
  if (CUresult r = NeedContext(); r != CUDA_SUCCESS) return r;
  return Copy(reinterpret_cast<void*>(dst),
              reinterpret_cast<const void*>(src), n, s);
}
FAKE cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, std::size_t n,
                   CUstream s) {
  ENTER();
  if (CUresult r = NeedContext(); r != CUDA_SUCCESS) return r;
  return Copy(reinterpret_cast<void*>(dst),
              reinterpret_cast<const void*>(src), n, s);
}
FAKE cuMemcpyPeerAsync(CUdeviceptr dst, CUcontext /*dst_ctx*/, CUdeviceptr src,
                       CUcontext /*src_ctx*/, std::size_t n, CUstream s) {
  ENTER();
  if (CUresult r = NeedContext(); r != CUDA_SUCCESS) return r;
  return Copy(reinterpret_cast<void*>(dst),
              reinterpret_cast<const void*>(src), n, s);
}
FAKE cuMemcpyPeer(CUdeviceptr dst, CUcontext /*dst_ctx*/, CUdeviceptr src,
                  CUcontext /*src_ctx*/, std::size_t n) {
  ENTER();
  return CopySync(reinterpret_cast<void*>(dst),
                  reinterpret_cast<const void*>(src), n);
}

FAKE cuMemsetD8Async(CUdeviceptr dst, unsigned char v, std::size_t n,
                     CUstream s) {
  ENTER();
  return Memset<unsigned char>(dst, v, n, s, false);
}
FAKE cuMemsetD16Async(CUdeviceptr dst, unsigned short v, std::size_t n,
                      CUstream s) {
  ENTER();
  return Memset<unsigned short>(dst, v, n, s, false);
}
FAKE cuMemsetD32Async(CUdeviceptr dst, unsigned int v, std::size_t n,
                      CUstream s) {
  ENTER();
  return Memset<unsigned int>(dst, v, n, s, false);
}
FAKE cuMemsetD8_v2(CUdeviceptr dst, unsigned char v, std::size_t n) {
  ENTER();
  return Memset<unsigned char>(dst, v, n, nullptr, true);
}
FAKE cuMemsetD16_v2(CUdeviceptr dst, unsigned short v, std::size_t n) {
  ENTER();
  return Memset<unsigned short>(dst, v, n, nullptr, true);
}
FAKE cuMemsetD32_v2(CUdeviceptr dst, unsigned int v, std::size_t n) {
  ENTER();
  return Memset<unsigned int>(dst, v, n, nullptr, true);
}

}  // extern "C"
