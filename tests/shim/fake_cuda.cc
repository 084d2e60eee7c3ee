// A fake CUDA driver for the shim tests (libfakecuda.so; not shipped).
//
// It implements on host memory the driver calls that the lake (through
// CudaDriver) and XLA's cuda_async allocator make, with the driver's names
// and ABI, so the shim can forward to it exactly as to the real driver:
//
//   devices      three: 0 and 1 support virtual memory management, 2 does
//                not (the shim must leave its pool alone); 1 GiB each
//   contexts     one primary context per device, retained and released;
//                the VMM and event calls need a current, retained context
//   VMM          jaxlake's HostDriver: memfd-backed mappings with the same
//                rule checks, so the bytes behind a stitched range are real
//   streams and  SimDriver semantics: work recorded on a stream completes at
//   events       once unless a test holds the stream (fakecuda_hold_stream)
//   pools        one default pool per device with a native
//                cuMemAllocFromPoolAsync/cuMemFreeAsync on malloc, so a test
//                can tell the shim's hook from the driver's own pool
//   lookup       cuGetProcAddress(_v2) answers with this library's
//                functions; cuGetExportTable refuses (no private
//                table is implemented), so a test sees it forwarded
//
//   capture      cuStreamBeginCapture(_v2)/cuStreamEndCapture open and close
//                captures (global, thread-local or relaxed mode), and
//                cuStreamIsCapturing reports them and what a test set
//                (fakecuda_set_capturing); cuThreadExchangeStreamCaptureMode
//                keeps a mode per thread. As in the real driver, the
//                "unsafe" calls (create, map, unmap, release, reserve,
//                address free, event synchronize and query) fail with
//                CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED from a thread that
//                has an open capture of its own, or while any thread has a
//                global one, unless the calling thread's mode is relaxed;
//                and an event recorded on a capturing stream fails too (the
//                lake must never do either)
//   pool         every CUmemPool_attribute, with sets of the release
//   attributes   threshold, the reuse flags and resets of the high marks;
//                cuMemPoolTrimTo counts its calls
//   arguments    cuLaunchKernel records its eleven arguments
//
// Test-only exports: fakecuda_calls(name) counts the calls of one entry
// point, fakecuda_hold_stream/fakecuda_release_stream, and a few figures.
#include <dlfcn.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>

#include "cc/vmm/cuda_types.h"
#include "cc/vmm/host_driver.h"

using namespace jaxlake::cuda;  // NOLINT: the driver's own vocabulary

namespace {

constexpr int kDevices = 3;
constexpr int kNoVmmDevice = 2;
constexpr std::size_t kGranularity = std::size_t{2} << 20;
constexpr std::size_t kDeviceBytes = std::size_t{1} << 30;
constexpr int kDriverVersion = 13000;
constexpr std::uintptr_t kContextBase = 0xC000;
constexpr std::uintptr_t kPoolBase = 0x9000;
constexpr std::uintptr_t kFirstStream = 0x10000;

using jaxlake::vmm::Status;

struct Fake {
  Fake() : host(Options()) {}
  static jaxlake::vmm::SimOptions Options() {
    jaxlake::vmm::SimOptions o;
    o.granularity = kGranularity;
    o.device_bytes = kDevices * kDeviceBytes;
    return o;
  }

  jaxlake::vmm::HostDriver host;  // thread-safe on its own
  std::mutex mu;                  // guards everything below
  bool initialized = false;
  int primary_refs[kDevices] = {};
  std::map<std::string, std::uint64_t> calls;
  struct HandleInfo {
    int device;
    std::size_t size;
  };
  std::unordered_map<CUmemGenericAllocationHandle, HandleInfo> handles;
  std::size_t created[kDevices] = {};
  struct PoolAlloc {
    int device;
    std::size_t size;
    void* memory;
  };
  std::unordered_map<CUdeviceptr, PoolAlloc> pool_allocs;
  std::uint64_t pool_used[kDevices] = {};
  std::unordered_map<CUdeviceptr, void*> plain_allocs;  // cuMemAlloc_v2
  std::uint64_t pool_high[kDevices] = {};
  std::uint64_t release_threshold[kDevices] = {};
  std::set<std::uintptr_t> streams;
  std::set<std::uintptr_t> capturing;
  struct Capture {
    std::uintptr_t thread;
    int mode;
  };
  std::map<std::uintptr_t, Capture> captures;  // stream -> open capture
  int reuse[kDevices][3] = {};
  std::uint64_t last_trim[kDevices] = {};
  std::uintptr_t next_stream = kFirstStream;
  std::size_t last_access_count = 0;
  unsigned long long last_launch[11] = {};
};

Fake& F() {
  static Fake* const fake = new Fake();  // lives as long as the process
  return *fake;
}

thread_local CUcontext t_current = nullptr;
thread_local int t_capture_mode = 0;  // CU_STREAM_CAPTURE_MODE_GLOBAL
thread_local char t_thread_tag;       // its address names the thread

std::uintptr_t ThisThread() {
  return reinterpret_cast<std::uintptr_t>(&t_thread_tag);
}

void Count(const char* name) {
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  ++f.calls[name];
}

CUresult FromStatus(Status s) {
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

bool ValidDevice(CUdevice d) { return d >= 0 && d < kDevices; }

CUcontext ContextOf(int device) {
  return reinterpret_cast<CUcontext>(kContextBase +
                                     static_cast<std::uintptr_t>(device));
}
// The device of a primary context handle, or -1.
int DeviceOfContext(CUcontext ctx) {
  const auto v = reinterpret_cast<std::uintptr_t>(ctx);
  return v >= kContextBase && v < kContextBase + kDevices
             ? static_cast<int>(v - kContextBase)
             : -1;
}
CUmemoryPool PoolOf(int device) {
  return reinterpret_cast<CUmemoryPool>(kPoolBase +
                                        static_cast<std::uintptr_t>(device));
}
int DeviceOfPool(CUmemoryPool pool) {
  const auto v = reinterpret_cast<std::uintptr_t>(pool);
  return v >= kPoolBase && v < kPoolBase + kDevices
             ? static_cast<int>(v - kPoolBase)
             : -1;
}

// CUDA_SUCCESS when the driver is initialised and the calling thread has a
// current context that is retained; *device is its device.
CUresult NeedContext(int* device = nullptr) {
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  if (!f.initialized) return CUDA_ERROR_NOT_INITIALIZED;
  const int d = DeviceOfContext(t_current);
  if (d < 0 || f.primary_refs[d] == 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (device != nullptr) *device = d;
  return CUDA_SUCCESS;
}

CUresult NeedInit() {
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  return f.initialized ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
}

// CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED when a "potentially unsafe" call
// is prohibited for the calling thread now (see the top of the file).
CUresult NeedNoCapture() {
  if (t_capture_mode == CU_STREAM_CAPTURE_MODE_RELAXED) return CUDA_SUCCESS;
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  for (const auto& [stream, c] : f.captures) {
    if (c.mode == CU_STREAM_CAPTURE_MODE_GLOBAL ||
        (c.mode == CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
         c.thread == ThisThread())) {
      ++f.calls["prohibited under capture"];
      return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
  }
  return CUDA_SUCCESS;
}

// The stream as the host driver sees it; false for an unknown handle. The
// null stream is the legacy stream (0), or the per-thread one (2) in the
// _ptsz entry points.
bool StreamId(CUstream s, bool per_thread, std::uint64_t* id) {
  const auto v = reinterpret_cast<std::uintptr_t>(s);
  if (v == 0) {
    *id = per_thread ? kStreamPerThread : 0;
    return true;
  }
  if (v == kStreamLegacy) {
    *id = 0;
    return true;
  }
  if (v == kStreamPerThread) {
    *id = v;
    return true;
  }
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  *id = v;
  return f.streams.count(v) != 0;
}

CUresult PoolAlloc(CUdeviceptr* dptr, std::size_t size, CUmemoryPool pool,
                   CUstream stream, bool per_thread) {
  if (CUresult r = NeedContext(); r != CUDA_SUCCESS) return r;
  const int d = DeviceOfPool(pool);
  std::uint64_t sid = 0;
  if (dptr == nullptr || size == 0 || d < 0) return CUDA_ERROR_INVALID_VALUE;
  if (!StreamId(stream, per_thread, &sid)) return CUDA_ERROR_INVALID_HANDLE;
  const std::size_t rounded = (size + 255) / 256 * 256;
  void* memory = std::aligned_alloc(256, rounded);
  if (memory == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  const auto ptr = reinterpret_cast<CUdeviceptr>(memory);
  f.pool_allocs[ptr] = Fake::PoolAlloc{d, rounded, memory};
  f.pool_used[d] += rounded;
  if (f.pool_used[d] > f.pool_high[d]) f.pool_high[d] = f.pool_used[d];
  *dptr = ptr;
  return CUDA_SUCCESS;
}

CUresult PoolFree(CUdeviceptr dptr, CUstream stream, bool per_thread) {
  if (CUresult r = NeedContext(); r != CUDA_SUCCESS) return r;
  std::uint64_t sid = 0;
  if (!StreamId(stream, per_thread, &sid)) return CUDA_ERROR_INVALID_HANDLE;
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  auto it = f.pool_allocs.find(dptr);
  if (it == f.pool_allocs.end()) return CUDA_ERROR_INVALID_VALUE;
  f.pool_used[it->second.device] -= it->second.size;
  std::free(it->second.memory);
  f.pool_allocs.erase(it);
  return CUDA_SUCCESS;
}

CUresult EventRecord(CUevent event, CUstream stream, bool per_thread) {
  if (CUresult r = NeedContext(); r != CUDA_SUCCESS) return r;
  std::uint64_t sid = 0;
  if (!StreamId(stream, per_thread, &sid)) return CUDA_ERROR_INVALID_HANDLE;
  {
    Fake& f = F();
    std::lock_guard<std::mutex> lock(f.mu);
    if (f.capturing.count(sid) != 0 || f.captures.count(sid) != 0) {
      ++f.calls["prohibited under capture"];
      return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
  }
  return FromStatus(
      F().host.event_record(reinterpret_cast<std::uintptr_t>(event), sid));
}

// This library's own handle (for cuGetProcAddress).
void* Self() {
  static void* const self = [] {
    Dl_info info{};
    ::dladdr(reinterpret_cast<void*>(&Self), &info);
    return ::dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD);
  }();
  return self;
}


}  // namespace

#define FAKE_EXPORT extern "C" __attribute__((visibility("default")))
#define FAKE_COUNT() Count(__func__)

// ---- initialisation and devices ---------------------------------------------

FAKE_EXPORT CUresult cuInit(unsigned int flags) {
  FAKE_COUNT();
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  f.initialized = true;
  return CUDA_SUCCESS;
}

// Needs no cuInit, as in the real driver. FAKECUDA_DRIVER_VERSION, when
// set, replaces the version (tests of a driver too old for VMM).
FAKE_EXPORT CUresult cuDriverGetVersion(int* version) {
  FAKE_COUNT();
  if (version == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const char* forced = std::getenv("FAKECUDA_DRIVER_VERSION");
  *version = forced != nullptr ? std::atoi(forced) : kDriverVersion;
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuDeviceGetCount(int* count) {
  FAKE_COUNT();
  if (CUresult r = NeedInit(); r != CUDA_SUCCESS) return r;
  if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *count = kDevices;
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  FAKE_COUNT();
  if (CUresult r = NeedInit(); r != CUDA_SUCCESS) return r;
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDevice(ordinal)) return CUDA_ERROR_INVALID_DEVICE;
  *device = ordinal;
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuDeviceGetName(char* name, int len, CUdevice device) {
  FAKE_COUNT();
  if (CUresult r = NeedInit(); r != CUDA_SUCCESS) return r;
  if (name == nullptr || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDevice(device)) return CUDA_ERROR_INVALID_DEVICE;
  std::snprintf(name, static_cast<std::size_t>(len), "jaxlake fake device %d",
                device);
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuDeviceGetAttribute(int* value, int attribute,
                                          CUdevice device) {
  FAKE_COUNT();
  if (CUresult r = NeedInit(); r != CUDA_SUCCESS) return r;
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDevice(device)) return CUDA_ERROR_INVALID_DEVICE;
  if (attribute == CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED) {
    *value = device == kNoVmmDevice ? 0 : 1;
  } else if (attribute == CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED) {
    *value = 1;
  } else {
    *value = 0;
  }
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuDeviceTotalMem_v2(std::size_t* bytes, CUdevice device) {
  FAKE_COUNT();
  if (CUresult r = NeedInit(); r != CUDA_SUCCESS) return r;
  if (bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDevice(device)) return CUDA_ERROR_INVALID_DEVICE;
  *bytes = kDeviceBytes;
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuMemGetInfo_v2(std::size_t* free_bytes,
                                     std::size_t* total) {
  FAKE_COUNT();
  int d = 0;
  if (CUresult r = NeedContext(&d); r != CUDA_SUCCESS) return r;
  if (free_bytes == nullptr || total == nullptr)
    return CUDA_ERROR_INVALID_VALUE;
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  const std::size_t used = f.created[d] + f.pool_used[d];
  *total = kDeviceBytes;
  *free_bytes = used < kDeviceBytes ? kDeviceBytes - used : 0;
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuDeviceCanAccessPeer(int* can, CUdevice device,
                                           CUdevice peer) {
  FAKE_COUNT();
  if (CUresult r = NeedInit(); r != CUDA_SUCCESS) return r;
  if (can == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDevice(device) || !ValidDevice(peer))
    return CUDA_ERROR_INVALID_DEVICE;
  // The two VMM devices see each other; the third sees no one.
  *can = device != peer && device != kNoVmmDevice && peer != kNoVmmDevice;
  return CUDA_SUCCESS;
}

// ---- contexts ---------------------------------------------------------------

FAKE_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext* ctx,
                                              CUdevice device) {
  FAKE_COUNT();
  if (CUresult r = NeedInit(); r != CUDA_SUCCESS) return r;
  if (ctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDevice(device)) return CUDA_ERROR_INVALID_DEVICE;
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  ++f.primary_refs[device];
  *ctx = ContextOf(device);
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice device) {
  FAKE_COUNT();
  if (CUresult r = NeedInit(); r != CUDA_SUCCESS) return r;
  if (!ValidDevice(device)) return CUDA_ERROR_INVALID_DEVICE;
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  if (f.primary_refs[device] == 0) return CUDA_ERROR_INVALID_CONTEXT;
  --f.primary_refs[device];
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) {
  FAKE_COUNT();
  if (CUresult r = NeedInit(); r != CUDA_SUCCESS) return r;
  if (ctx != nullptr && DeviceOfContext(ctx) < 0)
    return CUDA_ERROR_INVALID_CONTEXT;
  t_current = ctx;
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuCtxGetCurrent(CUcontext* ctx) {
  FAKE_COUNT();
  if (CUresult r = NeedInit(); r != CUDA_SUCCESS) return r;
  if (ctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *ctx = t_current;
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuCtxGetDevice(CUdevice* device) {
  FAKE_COUNT();
  int d = 0;
  if (CUresult r = NeedContext(&d); r != CUDA_SUCCESS) return r;
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *device = d;
  return CUDA_SUCCESS;
}

// ---- virtual memory management ----------------------------------------------

FAKE_EXPORT CUresult cuMemGetAllocationGranularity(
    std::size_t* granularity, const CUmemAllocationProp* prop, int option) {
  FAKE_COUNT();
  if (CUresult r = NeedInit(); r != CUDA_SUCCESS) return r;
  if (granularity == nullptr || prop == nullptr ||
      prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
      prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
      !ValidDevice(prop->location.id) || option < 0 || option > 1)
    return CUDA_ERROR_INVALID_VALUE;
  *granularity = kGranularity;
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuMemAddressReserve(CUdeviceptr* ptr, std::size_t size,
                                         std::size_t alignment,
                                         CUdeviceptr /*addr*/,
                                         unsigned long long flags) {
  FAKE_COUNT();
  if (CUresult r = NeedContext(); r != CUDA_SUCCESS) return r;
  if (CUresult r = NeedNoCapture(); r != CUDA_SUCCESS) return r;
  if (ptr == nullptr || flags != 0 || alignment > kGranularity ||
      (alignment & (alignment - 1)) != 0)
    return CUDA_ERROR_INVALID_VALUE;
  std::uintptr_t va = 0;
  const Status s = F().host.reserve(size, &va);
  if (s == Status::kOk) *ptr = va;
  return FromStatus(s);
}

FAKE_EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, std::size_t size) {
  FAKE_COUNT();
  if (CUresult r = NeedContext(); r != CUDA_SUCCESS) return r;
  if (CUresult r = NeedNoCapture(); r != CUDA_SUCCESS) return r;
  return FromStatus(F().host.address_free(ptr, size));
}

FAKE_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle* handle,
                                 std::size_t size,
                                 const CUmemAllocationProp* prop,
                                 unsigned long long flags) {
  FAKE_COUNT();
  if (CUresult r = NeedContext(); r != CUDA_SUCCESS) return r;
  if (CUresult r = NeedNoCapture(); r != CUDA_SUCCESS) return r;
  if (handle == nullptr || prop == nullptr || flags != 0 ||
      prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
      prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
      !ValidDevice(prop->location.id))
    return CUDA_ERROR_INVALID_VALUE;
  const int d = prop->location.id;
  Fake& f = F();
  {
    std::lock_guard<std::mutex> lock(f.mu);
    if (size > kDeviceBytes - f.created[d]) return CUDA_ERROR_OUT_OF_MEMORY;
    f.created[d] += size;  // claimed; undone below on failure
  }
  jaxlake::vmm::Handle h = 0;
  const Status s = f.host.create(size, &h);
  std::lock_guard<std::mutex> lock(f.mu);
  if (s != Status::kOk) {
    f.created[d] -= size;
    return FromStatus(s);
  }
  f.handles[h] = Fake::HandleInfo{d, size};
  *handle = h;
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  FAKE_COUNT();
  if (CUresult r = NeedContext(); r != CUDA_SUCCESS) return r;
  if (CUresult r = NeedNoCapture(); r != CUDA_SUCCESS) return r;
  Fake& f = F();
  const Status s = f.host.release(handle);
  if (s == Status::kOk) {
    std::lock_guard<std::mutex> lock(f.mu);
    auto it = f.handles.find(handle);
    if (it != f.handles.end()) {
      f.created[it->second.device] -= it->second.size;
      f.handles.erase(it);
    }
  }
  return FromStatus(s);
}

FAKE_EXPORT CUresult cuMemMap(CUdeviceptr ptr, std::size_t size,
                              std::size_t offset,
                              CUmemGenericAllocationHandle handle,
                              unsigned long long flags) {
  FAKE_COUNT();
  if (CUresult r = NeedContext(); r != CUDA_SUCCESS) return r;
  if (CUresult r = NeedNoCapture(); r != CUDA_SUCCESS) return r;
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  return FromStatus(F().host.map(ptr, size, offset, handle));
}

FAKE_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, std::size_t size) {
  FAKE_COUNT();
  if (CUresult r = NeedContext(); r != CUDA_SUCCESS) return r;
  if (CUresult r = NeedNoCapture(); r != CUDA_SUCCESS) return r;
  return FromStatus(F().host.unmap(ptr, size));
}

FAKE_EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, std::size_t size,
                                    const CUmemAccessDesc* desc,
                                    std::size_t count) {
  FAKE_COUNT();
  if (CUresult r = NeedContext(); r != CUDA_SUCCESS) return r;
  if (desc == nullptr || count == 0) return CUDA_ERROR_INVALID_VALUE;
  for (std::size_t i = 0; i < count; ++i) {
    if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
        !ValidDevice(desc[i].location.id) ||
        desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
      return CUDA_ERROR_INVALID_VALUE;
  }
  const Status s = F().host.set_access(ptr, size);
  if (s == Status::kOk) {
    std::lock_guard<std::mutex> lock(F().mu);
    F().last_access_count = count;
  }
  return FromStatus(s);
}

// ---- streams and events -----------------------------------------------------

FAKE_EXPORT CUresult cuStreamCreate(CUstream* stream, unsigned int /*flags*/) {
  FAKE_COUNT();
  if (CUresult r = NeedContext(); r != CUDA_SUCCESS) return r;
  if (stream == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  const std::uintptr_t s = f.next_stream++;
  f.streams.insert(s);
  *stream = reinterpret_cast<CUstream>(s);
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuStreamDestroy_v2(CUstream stream) {
  FAKE_COUNT();
  if (CUresult r = NeedContext(); r != CUDA_SUCCESS) return r;
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  return f.streams.erase(reinterpret_cast<std::uintptr_t>(stream)) == 1
             ? CUDA_SUCCESS
             : CUDA_ERROR_INVALID_HANDLE;
}

FAKE_EXPORT CUresult cuStreamSynchronize(CUstream stream) {
  FAKE_COUNT();
  if (CUresult r = NeedContext(); r != CUDA_SUCCESS) return r;
  std::uint64_t sid = 0;
  if (!StreamId(stream, false, &sid)) return CUDA_ERROR_INVALID_HANDLE;
  jaxlake::vmm::HostDriver& host = F().host;
  jaxlake::vmm::Event e = 0;
  Status s = host.event_create(&e);
  if (s == Status::kOk) s = host.event_record(e, sid);
  if (s == Status::kOk) s = host.event_synchronize(e);
  if (e != 0) host.event_destroy(e);
  return FromStatus(s);
}

namespace {
CUresult IsCapturing(CUstream stream, int* status, bool per_thread) {
  if (CUresult r = NeedContext(); r != CUDA_SUCCESS) return r;
  std::uint64_t sid = 0;
  if (status == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!StreamId(stream, per_thread, &sid)) return CUDA_ERROR_INVALID_HANDLE;
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  *status = f.capturing.count(sid) != 0 || f.captures.count(sid) != 0
                ? CU_STREAM_CAPTURE_STATUS_ACTIVE
                : CU_STREAM_CAPTURE_STATUS_NONE;
  return CUDA_SUCCESS;
}

CUresult BeginCapture(CUstream stream, int mode, bool per_thread) {
  if (CUresult r = NeedContext(); r != CUDA_SUCCESS) return r;
  std::uint64_t sid = 0;
  if (mode < 0 || mode > CU_STREAM_CAPTURE_MODE_RELAXED)
    return CUDA_ERROR_INVALID_VALUE;
  if (!StreamId(stream, per_thread, &sid)) return CUDA_ERROR_INVALID_HANDLE;
  if (sid == 0) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;  // legacy
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  if (f.captures.count(sid) != 0) return CUDA_ERROR_ILLEGAL_STATE;
  f.captures[sid] = Fake::Capture{ThisThread(), mode};
  return CUDA_SUCCESS;
}

CUresult EndCapture(CUstream stream, void** graph, bool per_thread) {
  if (CUresult r = NeedContext(); r != CUDA_SUCCESS) return r;
  std::uint64_t sid = 0;
  if (graph == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!StreamId(stream, per_thread, &sid)) return CUDA_ERROR_INVALID_HANDLE;
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  if (f.captures.erase(sid) == 0) return CUDA_ERROR_ILLEGAL_STATE;
  static int graphs = 0;
  *graph = &graphs;  // a handle; nothing is launched
  return CUDA_SUCCESS;
}
}  // namespace

FAKE_EXPORT CUresult cuStreamBeginCapture(CUstream stream) {
  FAKE_COUNT();
  return BeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL, false);
}

FAKE_EXPORT CUresult cuStreamBeginCapture_v2(CUstream stream, int mode) {
  FAKE_COUNT();
  return BeginCapture(stream, mode, false);
}

FAKE_EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream stream, int mode) {
  FAKE_COUNT();
  return BeginCapture(stream, mode, true);
}

FAKE_EXPORT CUresult cuStreamEndCapture(CUstream stream, void** graph) {
  FAKE_COUNT();
  return EndCapture(stream, graph, false);
}

FAKE_EXPORT CUresult cuStreamEndCapture_ptsz(CUstream stream, void** graph) {
  FAKE_COUNT();
  return EndCapture(stream, graph, true);
}

FAKE_EXPORT CUresult cuThreadExchangeStreamCaptureMode(int* mode) {
  FAKE_COUNT();
  if (mode == nullptr || *mode < 0 || *mode > CU_STREAM_CAPTURE_MODE_RELAXED)
    return CUDA_ERROR_INVALID_VALUE;
  const int old = t_capture_mode;
  t_capture_mode = *mode;
  *mode = old;
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuStreamIsCapturing(CUstream stream, int* status) {
  FAKE_COUNT();
  return IsCapturing(stream, status, false);
}

FAKE_EXPORT CUresult cuStreamIsCapturing_ptsz(CUstream stream, int* status) {
  FAKE_COUNT();
  return IsCapturing(stream, status, true);
}

// Records its eleven arguments (six in registers, five on the stack), so a
// test can check that a call through the shim delivers them unchanged.
FAKE_EXPORT CUresult cuLaunchKernel(void* f, unsigned int gx, unsigned int gy,
                                    unsigned int gz, unsigned int bx,
                                    unsigned int by, unsigned int bz,
                                    unsigned int shared_bytes, CUstream stream,
                                    void** params, void** extra) {
  FAKE_COUNT();
  Fake& fake = F();
  std::lock_guard<std::mutex> lock(fake.mu);
  const unsigned long long args[11] = {
      reinterpret_cast<std::uintptr_t>(f), gx, gy, gz, bx, by, bz,
      shared_bytes, reinterpret_cast<std::uintptr_t>(stream),
      reinterpret_cast<std::uintptr_t>(params),
      reinterpret_cast<std::uintptr_t>(extra)};
  std::memcpy(fake.last_launch, args, sizeof args);
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuEventCreate(CUevent* event, unsigned int /*flags*/) {
  FAKE_COUNT();
  if (CUresult r = NeedContext(); r != CUDA_SUCCESS) return r;
  if (event == nullptr) return CUDA_ERROR_INVALID_VALUE;
  jaxlake::vmm::Event e = 0;
  const Status s = F().host.event_create(&e);
  if (s == Status::kOk) *event = reinterpret_cast<CUevent>(e);
  return FromStatus(s);
}

FAKE_EXPORT CUresult cuEventDestroy_v2(CUevent event) {
  FAKE_COUNT();
  if (CUresult r = NeedContext(); r != CUDA_SUCCESS) return r;
  return FromStatus(
      F().host.event_destroy(reinterpret_cast<std::uintptr_t>(event)));
}

FAKE_EXPORT CUresult cuEventRecord(CUevent event, CUstream stream) {
  FAKE_COUNT();
  return EventRecord(event, stream, false);
}

FAKE_EXPORT CUresult cuEventRecord_ptsz(CUevent event, CUstream stream) {
  FAKE_COUNT();
  return EventRecord(event, stream, true);
}

FAKE_EXPORT CUresult cuEventQuery(CUevent event) {
  FAKE_COUNT();
  if (CUresult r = NeedContext(); r != CUDA_SUCCESS) return r;
  if (CUresult r = NeedNoCapture(); r != CUDA_SUCCESS) return r;
  return FromStatus(
      F().host.event_query(reinterpret_cast<std::uintptr_t>(event)));
}

FAKE_EXPORT CUresult cuEventSynchronize(CUevent event) {
  FAKE_COUNT();
  if (CUresult r = NeedContext(); r != CUDA_SUCCESS) return r;
  if (CUresult r = NeedNoCapture(); r != CUDA_SUCCESS) return r;
  return FromStatus(
      F().host.event_synchronize(reinterpret_cast<std::uintptr_t>(event)));
}

// ---- stream-ordered pools (the driver's own) --------------------------------

FAKE_EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool* pool,
                                               CUdevice device) {
  FAKE_COUNT();
  if (CUresult r = NeedInit(); r != CUDA_SUCCESS) return r;
  if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDevice(device)) return CUDA_ERROR_INVALID_DEVICE;
  *pool = PoolOf(device);
  return CUDA_SUCCESS;
}

// Plain device memory (host memory here), outside every pool.
FAKE_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr* dptr, std::size_t size) {
  FAKE_COUNT();
  if (CUresult r = NeedContext(); r != CUDA_SUCCESS) return r;
  if (dptr == nullptr || size == 0) return CUDA_ERROR_INVALID_VALUE;
  void* memory = std::aligned_alloc(256, (size + 255) / 256 * 256);
  if (memory == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  *dptr = reinterpret_cast<CUdeviceptr>(memory);
  f.plain_allocs[*dptr] = memory;
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
  FAKE_COUNT();
  if (CUresult r = NeedContext(); r != CUDA_SUCCESS) return r;
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  auto it = f.plain_allocs.find(dptr);
  if (it == f.plain_allocs.end()) return CUDA_ERROR_INVALID_VALUE;
  std::free(it->second);
  f.plain_allocs.erase(it);
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr* dptr,
                                             std::size_t size,
                                             CUmemoryPool pool,
                                             CUstream stream) {
  FAKE_COUNT();
  return PoolAlloc(dptr, size, pool, stream, false);
}

FAKE_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr,
                                                  std::size_t size,
                                                  CUmemoryPool pool,
                                                  CUstream stream) {
  FAKE_COUNT();
  return PoolAlloc(dptr, size, pool, stream, true);
}

FAKE_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream) {
  FAKE_COUNT();
  return PoolFree(dptr, stream, false);
}

FAKE_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream) {
  FAKE_COUNT();
  return PoolFree(dptr, stream, true);
}

FAKE_EXPORT CUresult cuMemPoolGetAttribute(CUmemoryPool pool, int attr,
                                           void* value) {
  FAKE_COUNT();
  if (CUresult r = NeedInit(); r != CUDA_SUCCESS) return r;
  const int d = DeviceOfPool(pool);
  if (d < 0 || value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  auto* out = static_cast<cuuint64_t*>(value);
  switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
      *static_cast<int*>(value) = f.reuse[d][attr - 1];
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
      *out = f.release_threshold[d];
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
      *out = f.pool_used[d];
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
      *out = f.pool_high[d];
      return CUDA_SUCCESS;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}

FAKE_EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool pool, int attr,
                                           void* value) {
  FAKE_COUNT();
  if (CUresult r = NeedInit(); r != CUDA_SUCCESS) return r;
  const int d = DeviceOfPool(pool);
  if (d < 0 || value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
      f.reuse[d][attr - 1] = *static_cast<const int*>(value);
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
      f.release_threshold[d] = *static_cast<const cuuint64_t*>(value);
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
      // Only a reset to zero is allowed; the mark restarts from now.
      if (*static_cast<const cuuint64_t*>(value) != 0)
        return CUDA_ERROR_INVALID_VALUE;
      f.pool_high[d] = f.pool_used[d];
      return CUDA_SUCCESS;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}

FAKE_EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, std::size_t keep) {
  FAKE_COUNT();
  if (CUresult r = NeedInit(); r != CUDA_SUCCESS) return r;
  const int d = DeviceOfPool(pool);
  if (d < 0) return CUDA_ERROR_INVALID_VALUE;
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  f.last_trim[d] = keep;
  return CUDA_SUCCESS;
}

// ---- entry points by name ---------------------------------------------------

namespace {

// This library's function for `symbol` as the real driver would choose it:
// the per-thread variant when asked for, then the _v2 version, then the
// plain name (cuGetProcAddress itself is _v2 from CUDA 12.0 on).
void* Lookup(const char* symbol, int version, cuuint64_t flags) {
  if (symbol == nullptr) return nullptr;
  const std::string name = symbol;
  if (name == "cuGetProcAddress")
    return ::dlsym(Self(), version >= 12000 ? "cuGetProcAddress_v2"
                                            : "cuGetProcAddress");
  if ((flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0) {
    if (void* fn = ::dlsym(Self(), (name + "_ptsz").c_str())) return fn;
  }
  if (void* fn = ::dlsym(Self(), (name + "_v2").c_str())) return fn;
  return ::dlsym(Self(), symbol);
}

}  // namespace

FAKE_EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn,
                                         int version, cuuint64_t flags,
                                         int* status) {
  FAKE_COUNT();
  if (symbol == nullptr || pfn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *pfn = Lookup(symbol, version, flags);
  if (status != nullptr)
    *status = *pfn != nullptr ? CU_GET_PROC_ADDRESS_SUCCESS
                              : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  return *pfn != nullptr ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

FAKE_EXPORT CUresult cuGetProcAddress(const char* symbol, void** pfn,
                                      int version, cuuint64_t flags) {
  FAKE_COUNT();
  if (symbol == nullptr || pfn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *pfn = Lookup(symbol, version, flags);
  return *pfn != nullptr ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

FAKE_EXPORT CUresult cuGetExportTable(const void** table, const CUuuid* id) {
  FAKE_COUNT();
  if (table == nullptr || id == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *table = nullptr;
  return CUDA_ERROR_NOT_SUPPORTED;
}

FAKE_EXPORT CUresult cuGetErrorName(CUresult error, const char** name) {
  FAKE_COUNT();
  if (name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  switch (error) {
    case CUDA_SUCCESS:
      *name = "CUDA_SUCCESS";
      break;
    case CUDA_ERROR_INVALID_VALUE:
      *name = "CUDA_ERROR_INVALID_VALUE";
      break;
    case CUDA_ERROR_OUT_OF_MEMORY:
      *name = "CUDA_ERROR_OUT_OF_MEMORY";
      break;
    case CUDA_ERROR_NOT_INITIALIZED:
      *name = "CUDA_ERROR_NOT_INITIALIZED";
      break;
    case CUDA_ERROR_INVALID_CONTEXT:
      *name = "CUDA_ERROR_INVALID_CONTEXT";
      break;
    default:
      *name = nullptr;
      return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

// ---- test-only exports ------------------------------------------------------

// Calls of one entry point so far.
FAKE_EXPORT unsigned long long fakecuda_calls(const char* name) {
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  auto it = f.calls.find(name != nullptr ? name : "");
  return it == f.calls.end() ? 0 : it->second;
}

// While a stream is held, events recorded on it stay incomplete.
FAKE_EXPORT void fakecuda_hold_stream(CUstream stream) {
  F().host.hold_stream(reinterpret_cast<std::uintptr_t>(stream));
}

// Completes everything recorded on the stream and wakes its waiters.
FAKE_EXPORT void fakecuda_release_stream(CUstream stream) {
  F().host.release_stream(reinterpret_cast<std::uintptr_t>(stream));
}

// Physical bytes created with cuMemCreate on `device` and not released.
FAKE_EXPORT unsigned long long fakecuda_created_bytes(int device) {
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  return ValidDevice(device) ? f.created[device] : 0;
}

// Bytes of the driver's own pool of `device` in use.
FAKE_EXPORT unsigned long long fakecuda_pool_bytes(int device) {
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  return ValidDevice(device) ? f.pool_used[device] : 0;
}

// Primary context references held on `device`.
FAKE_EXPORT int fakecuda_primary_refs(int device) {
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  return ValidDevice(device) ? f.primary_refs[device] : -1;
}

// The number of access descriptors of the last successful cuMemSetAccess.
FAKE_EXPORT unsigned long long fakecuda_last_access_count() {
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  return f.last_access_count;
}

// Makes cuStreamIsCapturing report `capturing` for the stream.
FAKE_EXPORT void fakecuda_set_capturing(CUstream stream, int capturing) {
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  const auto s = reinterpret_cast<std::uintptr_t>(stream);
  if (capturing != 0) {
    f.capturing.insert(s);
  } else {
    f.capturing.erase(s);
  }
}

// The arguments of the last cuLaunchKernel call.
FAKE_EXPORT void fakecuda_last_launch(unsigned long long out[11]) {
  Fake& f = F();
  std::lock_guard<std::mutex> lock(f.mu);
  std::memcpy(out, f.last_launch, sizeof f.last_launch);
}
