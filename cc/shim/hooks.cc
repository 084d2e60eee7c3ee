// jaxlake shim: the hooked driver entry points.
//
// XLA's cuda_async allocator gets every device buffer with
// cuMemAllocFromPoolAsync(&ptr, size, pool, stream) from the device's default
// pool and gives it back with cuMemFreeAsync(ptr, stream). Here the lake of
// that device serves both. These go to the real driver instead:
//   - every call while the shim is inactive, other pools, devices without a
//     lake;
//   - requests made under stream capture: the stream is being captured, or
//     the calling thread has an open capture of its own (global or
//     thread-local mode), or another thread has an open global-mode capture
//     and this thread's capture mode (cuThreadExchangeStreamCaptureMode) is
//     not relaxed. A pool allocation made then becomes a graph node, and the
//     lake's own driver calls (events, map, unmap) would be prohibited. The
//     shim sees captures begin and end through its cuStreamBeginCapture* and
//     cuStreamEndCapture hooks;
//   - requests on the calling thread's per-thread default stream: each
//     thread has its own, and the lake keys reuse by stream;
//   - frees of addresses outside every lake's reserved ranges.
// A free of a lake address never reaches the driver's pool (made under
// capture it fails with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED), and the
// lake never sees an address of the driver's pool.
//
// Device memory the program takes outside the lakes is counted (the
// OutsideLedger of lakes.h, the peak of which goes into the trace header):
// the successful forwarded cuMemAllocFromPoolAsync calls, and the hooked
// cuMemAlloc_v2, cuMemAllocPitch_v2, cuMemAllocManaged, cuMemAllocAsync and
// cuMemCreate (device locations only), which are always forwarded; their
// frees (cuMemFree_v2, cuMemFreeAsync, cuMemRelease) take them off. The
// lakes' own cuMemCreate calls go to the driver directly and are not
// counted.
//
// Pool attributes of a default pool whose device has a lake (the lake is
// never created by a query): RESERVED/USED_MEM_CURRENT and _HIGH are the
// driver's figure plus the lake's (reserved: physical bytes it holds; used:
// live allocations rounded as handed out; _HIGH: the sum of the two peaks);
// every other attribute, and every set (release threshold, reuse flags,
// high-watermark resets) is the driver's: it concerns the memory of the
// driver's pool, while the lake keeps its cached memory up to its capacity
// whatever the release threshold and cannot reset its peaks.
// cuMemPoolTrimTo trims the driver's pool and then, when the lake holds more
// than the bytes to keep, releases the lake's cached memory (empty_cache).
// Range queries (cuMemGetAddressRange_v2, cuPointerGetAttribute and
// cuPointerGetAttributes' RANGE_START_ADDR and RANGE_SIZE) of an address
// inside a live lake allocation answer with that whole allocation; the
// driver would report the one mapping the address lies in, a piece of a
// stitched buffer. Everything else about an address is the driver's.
// cuGetProcAddress hands out these functions for the hooked names, so
// callers that look entry points up by name (cudart, cuBLAS, NCCL) reach
// them too.
//
// Memory pressure. A forwarded device allocation the driver refuses with
// CUDA_ERROR_OUT_OF_MEMORY (cuMemAlloc_v2, cuMemAllocPitch_v2,
// cuMemAllocAsync, cuMemCreate of device memory, a forwarded
// cuMemAllocFromPoolAsync) makes the lake of its device (the pool's, the
// location's, else the current context's; every lake's when none can be
// told) release its cached memory, what empty_cache() releases and never
// live memory, once the frees of that memory are complete on their streams
// (Lake::release_cached waits for them), and is tried once more when that
// gave bytes back. A lake may hold the whole device (options.h), so
// cuBLAS, cuDNN, NCCL and other pools of the process get back the room the
// lake keeps cached. Not under stream capture (the calling thread's, or
// the request's stream), where the lake's own driver calls are
// prohibited. Counted per hook as `pressure`, `pressure_ok` and
// `pressure_bytes`.
//
// No C++ exception leaves these functions: each body runs inside a
// catch-all that turns one into CUDA_ERROR_UNKNOWN.
#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <utility>

#include "cc/shim/lakes.h"
#include "cc/shim/loader.h"
#include "cc/vmm/cuda_types.h"

#include "cc/shim/hooks.h"

namespace jaxlake::shim {
namespace {

namespace cu = jaxlake::cuda;

// The stream as the lake sees it. The null stream means the legacy default
// stream in the plain entry points and the calling thread's default stream
// in the _ptsz ones; the legacy handle (0x1) is the legacy stream as well.
vmm::Stream LakeStream(CUstream stream, bool per_thread) {
  const auto s = reinterpret_cast<std::uintptr_t>(stream);
  if (s == 0) return per_thread ? cu::kStreamPerThread : 0;
  if (s == cu::kStreamLegacy) return 0;
  return s;
}

CUresult ToCu(vmm::Status s) {
  switch (s) {
    case vmm::Status::kOk:
      return cu::CUDA_SUCCESS;
    case vmm::Status::kOutOfMemory:
      return cu::CUDA_ERROR_OUT_OF_MEMORY;
    case vmm::Status::kInvalidValue:
      return cu::CUDA_ERROR_INVALID_VALUE;
    case vmm::Status::kNotSupported:
      return cu::CUDA_ERROR_NOT_SUPPORTED;
    default:
      return cu::CUDA_ERROR_UNKNOWN;
  }
}

template <typename F, typename... Args>
CUresult Forward(Hook hook, F* fn, Args... args) {
  return Done(hook, false,
              fn != nullptr ? fn(args...) : cu::CUDA_ERROR_NOT_FOUND);
}

// Where a refused allocation asks for memory back: the device (-1: not
// known) and whether the lakes must not give any back for it (a capture
// forbids their driver calls, or the memory is not the device's).
struct Pressure {
  int device = -1;
  bool barred = false;
};

// A request no lake's memory can help: host or managed memory.
Pressure NoGiveBack() { return Pressure{-1, true}; }

bool UnderCapture(CUstream stream, bool per_thread);
bool ThreadCapturing();

// Releases the cached memory of `p.device`'s lake (every lake's when the
// device is not known), unless `p` bars it. Returns the bytes the lakes
// gave back.
std::size_t GiveBack(const Pressure& p) {
  if (p.barred) return 0;
  Lakes& lakes = Lakes::Get();
  std::size_t released = 0;
  for (int d : lakes.Devices()) {
    if (p.device >= 0 && d != p.device) continue;
    if (Lake* lake = lakes.Existing(d)) released += lake->release_cached();
  }
  return released;
}

// Forward() for an allocating entry point: a refusal for lack of memory
// gives the lakes' cached memory back (GiveBack, with the Pressure
// `where()` names, asked only then) and, when that released bytes, tries
// once more.
template <typename Where, typename F, typename... Args>
CUresult ForwardAlloc(Hook hook, Where where, F* fn, Args... args) {
  if (fn == nullptr) return Done(hook, false, cu::CUDA_ERROR_NOT_FOUND);
  CUresult r = fn(args...);
  if (r == cu::CUDA_ERROR_OUT_OF_MEMORY) {
    const std::size_t released = GiveBack(where());
    if (released > 0) {
      HookCounter& c = Lakes::Get().counter(hook);
      c.pressure.fetch_add(1, std::memory_order_relaxed);
      c.pressure_bytes.fetch_add(released, std::memory_order_relaxed);
      r = fn(args...);
      if (r == cu::CUDA_SUCCESS)
        c.pressure_ok.fetch_add(1, std::memory_order_relaxed);
    }
  }
  return Done(hook, false, r);
}

// The Pressure of a request on `stream` made with the current context.
auto OnStream(CUstream stream, bool per_thread) {
  return [stream, per_thread] {
    return Pressure{Lakes::Get().CurrentDevice(),
                    UnderCapture(stream, per_thread)};
  };
}

// The Pressure of a request with no stream, made with the current context.
Pressure InContext() {
  return Pressure{Lakes::Get().CurrentDevice(), ThreadCapturing()};
}

// Counts `bytes` of device memory taken outside every lake, known by `id`
// (an address or a physical handle, as `key` says).
void CountOutside(Hook hook, OutsideLedger::Key key, std::uintptr_t id,
                  std::size_t bytes) {
  Lakes& lakes = Lakes::Get();
  lakes.counter(hook).forwarded_bytes.fetch_add(bytes,
                                                std::memory_order_relaxed);
  lakes.outside().Add(key, id, bytes);
}

// Takes off what CountOutside counted under `id`, once its free `r`
// succeeded.
CUresult UncountOutside(CUresult r, OutsideLedger::Key key,
                        std::uintptr_t id) {
  if (r == cu::CUDA_SUCCESS) Lakes::Get().outside().Remove(key, id);
  return r;
}

// Counts the device memory of a forwarded allocation `r` made: `bytes` at
// *dptr, outside every lake.
CUresult Outside(Hook hook, CUresult r, const CUdeviceptr* dptr,
                 std::size_t bytes) {
  if (r != cu::CUDA_SUCCESS || dptr == nullptr || *dptr == 0 || bytes == 0)
    return r;
  CountOutside(hook, OutsideLedger::Key::kAddress,
               static_cast<std::uintptr_t>(*dptr), bytes);
  return r;
}


void CountCaptured(Hook hook) {
  Lakes::Get().counter(hook).captured.fetch_add(1, std::memory_order_relaxed);
}

// ---- stream capture -----------------------------------------------------------

// The captures begun through the shim and not yet ended: stream -> the
// beginning thread and the capture mode. `g_open` mirrors the map's size so
// that the common case (no capture) costs one atomic load.
struct OpenCapture {
  std::thread::id thread;
  int mode;
};
// The key of a capture: its stream, and for a per-thread default stream
// (one per thread, with one handle value) the thread as well.
using CaptureKey = std::pair<std::uintptr_t, std::thread::id>;
std::mutex g_capture_mu;
std::map<CaptureKey, OpenCapture>& Captures() {
  static auto* const captures = new std::map<CaptureKey, OpenCapture>;
  return *captures;
}
std::atomic<int> g_open{0};

CaptureKey KeyOf(CUstream stream, bool per_thread) {
  const auto s = static_cast<std::uintptr_t>(LakeStream(stream, per_thread));
  return {s, s == cu::kStreamPerThread ? std::this_thread::get_id()
                                       : std::thread::id()};
}

void CaptureBegun(CUstream stream, bool per_thread, int mode) {
  std::lock_guard<std::mutex> lock(g_capture_mu);
  Captures()[KeyOf(stream, per_thread)] =
      OpenCapture{std::this_thread::get_id(), mode};
  g_open.store(static_cast<int>(Captures().size()), std::memory_order_release);
}

void CaptureEnded(CUstream stream, bool per_thread) {
  std::lock_guard<std::mutex> lock(g_capture_mu);
  Captures().erase(KeyOf(stream, per_thread));
  g_open.store(static_cast<int>(Captures().size()), std::memory_order_release);
}

// The calling thread's capture mode (CU_STREAM_CAPTURE_MODE_*), read by
// exchanging it and putting it back; global (the default) when the driver
// cannot say.
int ThreadCaptureMode() {
  auto* exchange = Real().api.ThreadExchangeStreamCaptureMode;
  int mode = cu::CU_STREAM_CAPTURE_MODE_RELAXED;
  if (exchange == nullptr || exchange(&mode) != cu::CUDA_SUCCESS)
    return cu::CU_STREAM_CAPTURE_MODE_GLOBAL;
  int relaxed = mode;
  exchange(&relaxed);  // restores the thread's own mode
  return mode;
}

// True when the calling thread may not make the lake's driver calls: it
// has an open capture of its own in global or thread-local mode, or any
// thread has one in global mode and this thread's mode is not relaxed.
bool ThreadCapturing() {
  if (g_open.load(std::memory_order_acquire) == 0) return false;
  bool own = false, global = false;
  {
    std::lock_guard<std::mutex> lock(g_capture_mu);
    const std::thread::id me = std::this_thread::get_id();
    for (const auto& [key, c] : Captures()) {
      if (c.mode == cu::CU_STREAM_CAPTURE_MODE_RELAXED) continue;
      if (c.thread == me) own = true;
      if (c.mode == cu::CU_STREAM_CAPTURE_MODE_GLOBAL) global = true;
    }
  }
  if (!own && !global) return false;
  return ThreadCaptureMode() != cu::CU_STREAM_CAPTURE_MODE_RELAXED;
}

// True when `stream` is being captured (or its capture was invalidated), as
// the driver says; the legacy stream while a capture forbids its use counts
// too.
bool StreamCapturing(CUstream stream, bool per_thread) {
  const RealApi& real = Real().api;
  auto* query =
      per_thread ? real.StreamIsCapturing_ptsz : real.StreamIsCapturing;
  if (query == nullptr) return false;
  int status = cu::CU_STREAM_CAPTURE_STATUS_NONE;
  const CUresult r = query(stream, &status);
  if (r == cu::CUDA_ERROR_STREAM_CAPTURE_IMPLICIT) return true;
  return r == cu::CUDA_SUCCESS && status != cu::CU_STREAM_CAPTURE_STATUS_NONE;
}

bool UnderCapture(CUstream stream, bool per_thread) {
  return StreamCapturing(stream, per_thread) || ThreadCapturing();
}

template <typename F, typename... Args>
CUresult BeginCapture(Hook hook, F* fn, bool per_thread, int mode,
                      CUstream stream, Args... args) {
  Called(hook);
  if (fn == nullptr) return Done(hook, false, cu::CUDA_ERROR_NOT_FOUND);
  const CUresult r = fn(stream, args...);
  if (r == cu::CUDA_SUCCESS) CaptureBegun(stream, per_thread, mode);
  return Done(hook, false, r);
}

CUresult EndCapture(Hook hook, bool per_thread, CUstream stream,
                    void** graph) {
  Called(hook);
  const RealApi& real = Real().api;
  auto* fn = per_thread ? real.StreamEndCapture_ptsz : real.StreamEndCapture;
  if (fn == nullptr) return Done(hook, false, cu::CUDA_ERROR_NOT_FOUND);
  const CUresult r = fn(stream, graph);
  // The capture is over whatever the result (an invalidated capture ends
  // with an error), unless the stream is still capturing.
  if (!StreamCapturing(stream, per_thread)) CaptureEnded(stream, per_thread);
  return Done(hook, false, r);
}

// ---- allocation and free --------------------------------------------------------

CUresult AllocFromPool(bool per_thread, CUdeviceptr* dptr, std::size_t size,
                       CUmemoryPool pool, CUstream stream) {
  const Hook hook = per_thread ? Hook::cuMemAllocFromPoolAsync_ptsz
                               : Hook::cuMemAllocFromPoolAsync;
  Called(hook);
  Lakes& lakes = Lakes::Get();
  const RealApi& real = Real().api;
  auto* forward = per_thread ? real.MemAllocFromPoolAsync_ptsz
                             : real.MemAllocFromPoolAsync;
  // Zero-byte and null-output requests keep the driver's own answer.
  const bool request = dptr != nullptr && size != 0;
  // The device of a default pool, counted per device (also when the shim
  // is inactive, for the exit report).
  const int device = request ? lakes.DeviceOfPool(pool) : -1;
  DeviceCounter* per_device = lakes.device_counter(device);
  // Known to be made under capture (no memory back under pressure then).
  bool captured = false;
  auto forwarded = [&] {
    if (per_device != nullptr)
      per_device->forwarded.fetch_add(1, std::memory_order_relaxed);
    auto where = [&] {
      return Pressure{device >= 0 ? device : lakes.CurrentDevice(),
                      captured || UnderCapture(stream, per_thread)};
    };
    return Outside(hook,
                   ForwardAlloc(hook, where, forward, dptr, size, pool,
                                stream),
                   dptr, size);
  };
  if (!lakes.active() || !request) return forwarded();
  Lake* lake = device >= 0 ? lakes.LakeFor(device) : nullptr;
  if (lake == nullptr) return forwarded();
  // A request made under capture becomes a graph allocation node: that
  // stays with the driver.
  if (UnderCapture(stream, per_thread)) {
    CountCaptured(hook);
    per_device->captured.fetch_add(1, std::memory_order_relaxed);
    captured = true;
    return forwarded();
  }
  const vmm::Stream s = LakeStream(stream, per_thread);
  // Every thread has its own per-thread default stream, which the lake
  // could not tell apart: the driver's pool serves them.
  if (s == cu::kStreamPerThread) return forwarded();
  std::uintptr_t address = 0;
  const vmm::Status st = lake->allocate(size, s, &address);
  if (st == vmm::Status::kOk) {
    *dptr = static_cast<CUdeviceptr>(address);
    lakes.Served(device, address, size);
    lakes.trace().Alloc(device, address, size, s);
  } else if (st == vmm::Status::kOutOfMemory) {
    std::fprintf(stderr, "jaxlake: device %d: %s\n", device,
                 lake->last_error().c_str());
  }
  per_device->served.fetch_add(1, std::memory_order_relaxed);
  return Done(hook, true, ToCu(st));
}

CUresult FreeAsync(bool per_thread, CUdeviceptr dptr, CUstream stream) {
  const Hook hook =
      per_thread ? Hook::cuMemFreeAsync_ptsz : Hook::cuMemFreeAsync;
  Called(hook);
  Lakes& lakes = Lakes::Get();
  const auto ptr = static_cast<std::uintptr_t>(dptr);
  const int device = ptr != 0 ? lakes.AddressOwner(ptr) : -1;
  if (device < 0) {
    // Not a lake's address: the driver's pool (or its error) answers.
    if (UnderCapture(stream, per_thread)) CountCaptured(hook);
    const RealApi& real = Real().api;
    return UncountOutside(
        Forward(hook, per_thread ? real.MemFreeAsync_ptsz : real.MemFreeAsync,
                dptr, stream),
        OutsideLedger::Key::kAddress, ptr);
  }
  // A lake address: never the driver's pool's business. Under capture the
  // free would become a graph node the lake cannot honour.
  if (UnderCapture(stream, per_thread)) {
    CountCaptured(hook);
    std::fprintf(stderr,
                 "jaxlake: cuMemFreeAsync of lake memory (device %d) under "
                 "stream capture is not supported\n",
                 device);
    return Done(hook, true, cu::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  }
  const vmm::Stream s = LakeStream(stream, per_thread);
  Lake* lake = lakes.Existing(device);
  // The free is traced while the address is still live, so that no other
  // thread's new allocation at the same address comes before it.
  if (lakes.trace().active() && lake->allocation_size(ptr) != 0)
    lakes.trace().Free(device, ptr, s);
  // Forgotten before the lake frees it, so that no other thread's new
  // allocation at the same address is forgotten instead.
  lakes.Freed(device, ptr);
  return Done(hook, true, ToCu(lake->free(ptr, s)));
}

// ---- address-range queries ------------------------------------------------------

// The driver reports the range of the one mapping an address of VMM memory
// lies in. A lake allocation may be stitched from several mappings, and a
// caller that registers "the buffer" by its range (NCCL user buffers, RDMA,
// cuFile) would cover only one piece of it; so for an address inside a live
// lake allocation the range is the allocation's: its address and requested
// size. Other addresses, and every other attribute, are the driver's.
constexpr int kRangeStartAddr = 11;  // CU_POINTER_ATTRIBUTE_RANGE_START_ADDR
constexpr int kRangeSize = 12;       // CU_POINTER_ATTRIBUTE_RANGE_SIZE

bool LiveRange(CUdeviceptr p, std::uintptr_t* base, std::size_t* bytes) {
  Lakes& lakes = Lakes::Get();
  return p != 0 && lakes.FindLive(static_cast<std::uintptr_t>(p), base, bytes);
}

// Writes the lake's answer for a range attribute into `data`; false for
// other attributes.
bool RangeAttribute(int attribute, void* data, std::uintptr_t base,
                    std::size_t bytes) {
  if (attribute == kRangeStartAddr) {
    *static_cast<CUdeviceptr*>(data) = static_cast<CUdeviceptr>(base);
    return true;
  }
  if (attribute == kRangeSize) {
    *static_cast<std::size_t*>(data) = bytes;
    return true;
  }
  return false;
}

CUresult GetAddressRange(CUdeviceptr* base, std::size_t* size,
                         CUdeviceptr p) {
  const Hook hook = Hook::cuMemGetAddressRange_v2;
  Called(hook);
  std::uintptr_t b = 0;
  std::size_t n = 0;
  if (!LiveRange(p, &b, &n))
    return Forward(hook, Real().api.MemGetAddressRange_v2, base, size, p);
  if (base != nullptr) *base = static_cast<CUdeviceptr>(b);
  if (size != nullptr) *size = n;
  return Done(hook, true, cu::CUDA_SUCCESS);
}

CUresult GetPointerAttribute(void* data, int attribute, CUdeviceptr p) {
  const Hook hook = Hook::cuPointerGetAttribute;
  Called(hook);
  std::uintptr_t b = 0;
  std::size_t n = 0;
  if ((attribute != kRangeStartAddr && attribute != kRangeSize) ||
      data == nullptr || !LiveRange(p, &b, &n))
    return Forward(hook, Real().api.PointerGetAttribute, data, attribute, p);
  RangeAttribute(attribute, data, b, n);
  return Done(hook, true, cu::CUDA_SUCCESS);
}

CUresult GetPointerAttributes(unsigned int count, int* attributes,
                              void** data, CUdeviceptr p) {
  const Hook hook = Hook::cuPointerGetAttributes;
  Called(hook);
  auto* fn = Real().api.PointerGetAttributes;
  const CUresult r =
      fn != nullptr ? fn(count, attributes, data, p) : cu::CUDA_ERROR_NOT_FOUND;
  std::uintptr_t b = 0;
  std::size_t n = 0;
  if (r != cu::CUDA_SUCCESS || attributes == nullptr || data == nullptr ||
      !LiveRange(p, &b, &n))
    return Done(hook, false, r);
  bool answered = false;
  for (unsigned int i = 0; i < count; ++i) {
    if (data[i] != nullptr)
      answered |= RangeAttribute(attributes[i], data[i], b, n);
  }
  return Done(hook, answered, r);
}

// ---- allocations outside the pools ------------------------------------------------

// cuMemAlloc_v2, cuMemAllocAsync (memory back under pressure, `where`) and
// cuMemAllocManaged (NoGiveBack: managed memory is not held on the device
// the way a lake's is).
template <typename Where, typename F, typename... Args>
CUresult AllocOutside(Hook hook, Where where, F* fn, CUdeviceptr* dptr,
                      std::size_t bytes, Args... args) {
  Called(hook);
  return Outside(hook, ForwardAlloc(hook, where, fn, dptr, bytes, args...),
                 dptr, bytes);
}

CUresult AllocPitch(CUdeviceptr* dptr, std::size_t* pitch, std::size_t width,
                    std::size_t height, unsigned int element) {
  const Hook hook = Hook::cuMemAllocPitch_v2;
  Called(hook);
  const CUresult r = ForwardAlloc(hook, InContext, Real().api.MemAllocPitch_v2,
                                  dptr, pitch, width, height, element);
  return Outside(hook, r, dptr, pitch != nullptr ? *pitch * height : 0);
}

CUresult FreeOutside(CUdeviceptr dptr) {
  const Hook hook = Hook::cuMemFree_v2;
  Called(hook);
  return UncountOutside(Forward(hook, Real().api.MemFree_v2, dptr),
                        OutsideLedger::Key::kAddress,
                        static_cast<std::uintptr_t>(dptr));
}

CUresult Create(cu::CUmemGenericAllocationHandle* handle, std::size_t size,
                const cu::CUmemAllocationProp* prop, unsigned long long flags) {
  const Hook hook = Hook::cuMemCreate;
  Called(hook);
  // Physical memory on a device (not pinned host memory).
  const bool on_device =
      prop != nullptr && prop->location.type == cu::CU_MEM_LOCATION_TYPE_DEVICE;
  auto where = [&] {
    // Host memory: nothing a lake holds would help.
    return on_device ? Pressure{prop->location.id, ThreadCapturing()}
                     : NoGiveBack();
  };
  const CUresult r =
      ForwardAlloc(hook, where, Real().api.MemCreate, handle, size, prop,
                   flags);
  if (r == cu::CUDA_SUCCESS && handle != nullptr && on_device && size > 0)
    CountOutside(hook, OutsideLedger::Key::kHandle,
                 static_cast<std::uintptr_t>(*handle), size);
  return r;
}

CUresult Release(cu::CUmemGenericAllocationHandle handle) {
  const Hook hook = Hook::cuMemRelease;
  Called(hook);
  return UncountOutside(Forward(hook, Real().api.MemRelease, handle),
                        OutsideLedger::Key::kHandle,
                        static_cast<std::uintptr_t>(handle));
}

// ---- pools ------------------------------------------------------------------------

// The lake of the device whose default pool is `pool`, if it exists (never
// created here), and its device.
Lake* ExistingLakeOfPool(CUmemoryPool pool, int* device) {
  Lakes& lakes = Lakes::Get();
  *device = lakes.DeviceOfPool(pool);
  return *device >= 0 ? lakes.Existing(*device) : nullptr;
}

CUresult PoolGetAttribute(CUmemoryPool pool, int attr, void* value) {
  const Hook hook = Hook::cuMemPoolGetAttribute;
  Called(hook);
  const RealApi& real = Real().api;
  const bool memory = attr == cu::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT ||
                      attr == cu::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH ||
                      attr == cu::CU_MEMPOOL_ATTR_USED_MEM_CURRENT ||
                      attr == cu::CU_MEMPOOL_ATTR_USED_MEM_HIGH;
  int device = -1;
  Lake* lake = memory && value != nullptr ? ExistingLakeOfPool(pool, &device)
                                          : nullptr;
  if (lake == nullptr)
    return Forward(hook, real.MemPoolGetAttribute, pool, attr, value);
  cuuint64_t driver_part = 0;
  if (real.MemPoolGetAttribute != nullptr) {
    const CUresult r = real.MemPoolGetAttribute(pool, attr, &driver_part);
    if (r != cu::CUDA_SUCCESS) return Done(hook, true, r);
  }
  // Reserved: physical bytes the lake holds. Used: bytes of live
  // allocations as handed out (after rounding).
  const Stats st = lake->stats();
  std::int64_t v = 0;
  switch (attr) {
    case cu::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
      v = st.bytes_reserved.current;
      break;
    case cu::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
      v = st.bytes_reserved.peak;
      break;
    case cu::CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
      v = st.bytes_in_use_rounded.current;
      break;
    default:
      v = st.bytes_in_use_rounded.peak;
      break;
  }
  *static_cast<cuuint64_t*>(value) =
      driver_part + static_cast<cuuint64_t>(v < 0 ? 0 : v);
  return Done(hook, true, cu::CUDA_SUCCESS);
}

CUresult PoolTrimTo(CUmemoryPool pool, std::size_t keep) {
  const Hook hook = Hook::cuMemPoolTrimTo;
  Called(hook);
  const RealApi& real = Real().api;
  const CUresult r = real.MemPoolTrimTo != nullptr
                         ? real.MemPoolTrimTo(pool, keep)
                         : cu::CUDA_ERROR_NOT_FOUND;
  int device = -1;
  Lake* lake = r == cu::CUDA_SUCCESS ? ExistingLakeOfPool(pool, &device)
                                     : nullptr;
  if (lake == nullptr) return Done(hook, false, r);
  const Stats st = lake->stats();
  if (st.bytes_reserved.current > static_cast<std::int64_t>(keep))
    lake->empty_cache();
  return Done(hook, true, r);
}

}  // namespace
}  // namespace jaxlake::shim

// ---- the exported entry points ----------------------------------------------

#define JAXLAKE_SHIM_GUARD(expr) \
  try {                          \
    return expr;                 \
  } catch (...) {                \
    return jaxlake::cuda::CUDA_ERROR_UNKNOWN; \
  }

CUresult cuMemAllocFromPoolAsync(CUdeviceptr* dptr, std::size_t bytesize,
                                 CUmemoryPool pool, CUstream stream) {
  JAXLAKE_SHIM_GUARD(
      jaxlake::shim::AllocFromPool(false, dptr, bytesize, pool, stream))
}

CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, std::size_t bytesize,
                                      CUmemoryPool pool, CUstream stream) {
  JAXLAKE_SHIM_GUARD(
      jaxlake::shim::AllocFromPool(true, dptr, bytesize, pool, stream))
}

CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream) {
  JAXLAKE_SHIM_GUARD(jaxlake::shim::FreeAsync(false, dptr, stream))
}

CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream) {
  JAXLAKE_SHIM_GUARD(jaxlake::shim::FreeAsync(true, dptr, stream))
}

CUresult cuMemPoolGetAttribute(CUmemoryPool pool, int attr, void* value) {
  JAXLAKE_SHIM_GUARD(jaxlake::shim::PoolGetAttribute(pool, attr, value))
}

CUresult cuMemPoolTrimTo(CUmemoryPool pool, std::size_t keep) {
  JAXLAKE_SHIM_GUARD(jaxlake::shim::PoolTrimTo(pool, keep))
}

CUresult cuStreamBeginCapture(CUstream stream) {
  JAXLAKE_SHIM_GUARD(jaxlake::shim::BeginCapture(
      jaxlake::shim::Hook::cuStreamBeginCapture,
      jaxlake::shim::Real().api.StreamBeginCapture, false,
      jaxlake::cuda::CU_STREAM_CAPTURE_MODE_GLOBAL, stream))
}

CUresult cuStreamBeginCapture_ptsz(CUstream stream) {
  JAXLAKE_SHIM_GUARD(jaxlake::shim::BeginCapture(
      jaxlake::shim::Hook::cuStreamBeginCapture_ptsz,
      jaxlake::shim::Real().api.StreamBeginCapture_ptsz, true,
      jaxlake::cuda::CU_STREAM_CAPTURE_MODE_GLOBAL, stream))
}

CUresult cuStreamBeginCapture_v2(CUstream stream, int mode) {
  JAXLAKE_SHIM_GUARD(jaxlake::shim::BeginCapture(
      jaxlake::shim::Hook::cuStreamBeginCapture_v2,
      jaxlake::shim::Real().api.StreamBeginCapture_v2, false, mode, stream,
      mode))
}

CUresult cuStreamBeginCapture_v2_ptsz(CUstream stream, int mode) {
  JAXLAKE_SHIM_GUARD(jaxlake::shim::BeginCapture(
      jaxlake::shim::Hook::cuStreamBeginCapture_v2_ptsz,
      jaxlake::shim::Real().api.StreamBeginCapture_v2_ptsz, true, mode,
      stream, mode))
}

CUresult cuStreamBeginCaptureToGraph(CUstream stream, void* graph,
                                     const void* deps, const void* edges,
                                     std::size_t count, int mode) {
  JAXLAKE_SHIM_GUARD(jaxlake::shim::BeginCapture(
      jaxlake::shim::Hook::cuStreamBeginCaptureToGraph,
      jaxlake::shim::Real().api.StreamBeginCaptureToGraph, false, mode,
      stream, graph, deps, edges, count, mode))
}

CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream stream, void* graph,
                                          const void* deps, const void* edges,
                                          std::size_t count, int mode) {
  JAXLAKE_SHIM_GUARD(jaxlake::shim::BeginCapture(
      jaxlake::shim::Hook::cuStreamBeginCaptureToGraph_ptsz,
      jaxlake::shim::Real().api.StreamBeginCaptureToGraph_ptsz, true, mode,
      stream, graph, deps, edges, count, mode))
}

CUresult cuStreamEndCapture(CUstream stream, void** graph) {
  JAXLAKE_SHIM_GUARD(jaxlake::shim::EndCapture(
      jaxlake::shim::Hook::cuStreamEndCapture, false, stream, graph))
}

CUresult cuStreamEndCapture_ptsz(CUstream stream, void** graph) {
  JAXLAKE_SHIM_GUARD(jaxlake::shim::EndCapture(
      jaxlake::shim::Hook::cuStreamEndCapture_ptsz, true, stream, graph))
}

CUresult cuGetProcAddress(const char* symbol, void** pfn, int cuda_version,
                          cuuint64_t flags) {
  JAXLAKE_SHIM_GUARD(jaxlake::shim::GetProcAddress(
      jaxlake::shim::Hook::cuGetProcAddress, symbol, pfn, cuda_version, flags,
      nullptr))
}

CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int cuda_version,
                             cuuint64_t flags, int* symbol_status) {
  JAXLAKE_SHIM_GUARD(jaxlake::shim::GetProcAddress(
      jaxlake::shim::Hook::cuGetProcAddress_v2, symbol, pfn, cuda_version,
      flags, symbol_status))
}

CUresult cuMemAlloc_v2(CUdeviceptr* dptr, std::size_t bytesize) {
  JAXLAKE_SHIM_GUARD(jaxlake::shim::AllocOutside(
      jaxlake::shim::Hook::cuMemAlloc_v2, jaxlake::shim::InContext,
      jaxlake::shim::Real().api.MemAlloc_v2, dptr, bytesize))
}

CUresult cuMemAllocPitch_v2(CUdeviceptr* dptr, std::size_t* pitch,
                            std::size_t width, std::size_t height,
                            unsigned int element) {
  JAXLAKE_SHIM_GUARD(
      jaxlake::shim::AllocPitch(dptr, pitch, width, height, element))
}

CUresult cuMemAllocManaged(CUdeviceptr* dptr, std::size_t bytesize,
                           unsigned int flags) {
  JAXLAKE_SHIM_GUARD(jaxlake::shim::AllocOutside(
      jaxlake::shim::Hook::cuMemAllocManaged, jaxlake::shim::NoGiveBack,
      jaxlake::shim::Real().api.MemAllocManaged, dptr, bytesize, flags))
}

CUresult cuMemAllocAsync(CUdeviceptr* dptr, std::size_t bytesize,
                         CUstream stream) {
  JAXLAKE_SHIM_GUARD(jaxlake::shim::AllocOutside(
      jaxlake::shim::Hook::cuMemAllocAsync,
      jaxlake::shim::OnStream(stream, false),
      jaxlake::shim::Real().api.MemAllocAsync, dptr, bytesize, stream))
}

CUresult cuMemAllocAsync_ptsz(CUdeviceptr* dptr, std::size_t bytesize,
                              CUstream stream) {
  JAXLAKE_SHIM_GUARD(jaxlake::shim::AllocOutside(
      jaxlake::shim::Hook::cuMemAllocAsync_ptsz,
      jaxlake::shim::OnStream(stream, true),
      jaxlake::shim::Real().api.MemAllocAsync_ptsz, dptr, bytesize, stream))
}

CUresult cuMemFree_v2(CUdeviceptr dptr) {
  JAXLAKE_SHIM_GUARD(jaxlake::shim::FreeOutside(dptr))
}

CUresult cuMemCreate(jaxlake::cuda::CUmemGenericAllocationHandle* handle,
                     std::size_t size,
                     const jaxlake::cuda::CUmemAllocationProp* prop,
                     unsigned long long flags) {
  JAXLAKE_SHIM_GUARD(jaxlake::shim::Create(handle, size, prop, flags))
}

CUresult cuMemRelease(jaxlake::cuda::CUmemGenericAllocationHandle handle) {
  JAXLAKE_SHIM_GUARD(jaxlake::shim::Release(handle))
}

CUresult cuMemGetAddressRange_v2(CUdeviceptr* base, std::size_t* size,
                                 CUdeviceptr dptr) {
  JAXLAKE_SHIM_GUARD(jaxlake::shim::GetAddressRange(base, size, dptr))
}

CUresult cuPointerGetAttribute(void* data, int attribute, CUdeviceptr ptr) {
  JAXLAKE_SHIM_GUARD(jaxlake::shim::GetPointerAttribute(data, attribute, ptr))
}

CUresult cuPointerGetAttributes(unsigned int count, int* attributes,
                                void** data, CUdeviceptr ptr) {
  JAXLAKE_SHIM_GUARD(
      jaxlake::shim::GetPointerAttributes(count, attributes, data, ptr))
}
