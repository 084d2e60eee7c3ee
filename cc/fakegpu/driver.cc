// The fake GPU's CUDA driver API (libcuda.so.1 behind the shim): devices with
// H100/H200 attributes, primary contexts, VMM on memfd-backed host memory
// (jaxlake's HostDriver), plain and stream-ordered allocations, in-order
// streams, events, modules whose kernels do nothing, and entry points by
// name. cuGetExportTable, the door to NVIDIA's private tables, is refused:
// the fake implements no private interface (fakegpu.h).
#include <dlfcn.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <map>
#include <set>
#include <string>
#include <unordered_map>

#include "cc/fakegpu/fakegpu.h"
#include "cc/vmm/cuda_types.h"

using namespace jaxlake::cuda;  // NOLINT: the driver's own vocabulary
namespace fg = jaxlake::fakegpu;

namespace {

constexpr int kDriverVersion = 13000;
constexpr std::size_t kGranularity = std::size_t{2} << 20;
constexpr std::uintptr_t kContextBase = 0xC000;
constexpr std::uintptr_t kPoolBase = 0x9000;
constexpr CUresult CUDA_ERROR_INVALID_IMAGE = 200;
constexpr CUresult CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED = 704;

struct Driver {
  std::mutex mu;
  bool initialized = false;
  std::vector<int> primary_refs;
  std::set<std::pair<int, int>> peers;
  struct Handle {
    int device;
    std::size_t size;
  };
  std::unordered_map<CUmemGenericAllocationHandle, Handle> handles;
  struct Alloc {
    int device;
    std::size_t size;
    bool pool;
  };
  std::unordered_map<CUdeviceptr, Alloc> allocs;  // cuMemAlloc, pools
  std::unordered_map<std::uintptr_t, std::size_t> host_allocs;
  std::vector<std::uint64_t> pool_used, pool_high, release_threshold;
  struct Module {
    std::map<std::string, std::size_t> symbols;  // from the image's ELF
    std::map<std::string, std::pair<void*, std::size_t>> globals;
  };
  std::map<std::uintptr_t, Module> modules;
  struct Function {
    std::string name;
    int attrs[16] = {};
  };
  std::unordered_map<std::uintptr_t, std::unique_ptr<Function>> functions;
  std::uintptr_t next_module = 0x7000000;
  std::uint64_t launches = 0;
};

Driver& D() {
  static Driver* const d = [] {
    auto* p = new Driver();
    const int n = fg::Opts().count;
    p->primary_refs.assign(n, 0);
    p->pool_used.assign(n, 0);
    p->pool_high.assign(n, 0);
    p->release_threshold.assign(n, 0);
    return p;
  }();
  return *d;
}

int Count() { return fg::Opts().count; }
bool ValidDevice(CUdevice d) { return d >= 0 && d < Count(); }

CUcontext ContextOf(int device) {
  return reinterpret_cast<CUcontext>(kContextBase +
                                     static_cast<std::uintptr_t>(device));
}
int DeviceOfContext(CUcontext ctx) {
  const auto v = reinterpret_cast<std::uintptr_t>(ctx);
  return v >= kContextBase && v < kContextBase + static_cast<unsigned>(Count())
             ? static_cast<int>(v - kContextBase)
             : -1;
}
CUmemoryPool PoolOf(int device) {
  return reinterpret_cast<CUmemoryPool>(kPoolBase +
                                        static_cast<std::uintptr_t>(device));
}
int DeviceOfPool(CUmemoryPool pool) {
  const auto v = reinterpret_cast<std::uintptr_t>(pool);
  return v >= kPoolBase && v < kPoolBase + static_cast<unsigned>(Count())
             ? static_cast<int>(v - kPoolBase)
             : -1;
}

CUresult NeedInit() {
  Driver& d = D();
  std::lock_guard<std::mutex> lock(d.mu);
  return d.initialized ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
}

CUresult NeedContext(int* device = nullptr) {
  if (CUresult r = NeedInit(); r != CUDA_SUCCESS) return r;
  const int dev = fg::CurrentDevice();
  if (dev < 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (device != nullptr) *device = dev;
  return CUDA_SUCCESS;
}

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

fg::Stream* StreamFor(CUstream s) {
  return fg::StreamOf(s, fg::CurrentDevice());
}

// Whether [p, p+n) is memory the device may run a copy on later: device
// memory and pinned host memory. Other (pageable) host memory is copied at
// the call, as the driver stages it.
bool Pinned(const void* p) {
  fg::Range r;
  return fg::FindRange(reinterpret_cast<std::uintptr_t>(p), &r);
}

// A copy in stream order; from or to pageable memory it completes before
// the call returns, after the work before it.
CUresult Copy(void* dst, const void* src, std::size_t n, CUstream stream) {
  fg::Stream* s = StreamFor(stream);
  if (s == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (n == 0) return CUDA_SUCCESS;
  if (Pinned(dst) && Pinned(src)) {
    s->Enqueue([dst, src, n] { fg::Move(dst, src, n); });
  } else {
    s->Synchronize();
    fg::Move(dst, src, n);
  }
  return CUDA_SUCCESS;
}

// A synchronous copy: after all work of the device, before the return.
CUresult CopySync(void* dst, const void* src, std::size_t n) {
  int dev = 0;
  if (CUresult r = NeedContext(&dev); r != CUDA_SUCCESS) return r;
  for (fg::Stream* s : fg::StreamsOf(dev)) s->Synchronize();
  if (n != 0) fg::Move(dst, src, n);
  return CUDA_SUCCESS;
}

template <typename T>
CUresult Memset(CUdeviceptr dst, T value, std::size_t count, CUstream stream,
                bool sync) {
  if (CUresult r = NeedContext(); r != CUDA_SUCCESS) return r;
  fg::Stream* s = StreamFor(stream);
  if (s == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  s->Enqueue([dst, value, count] {
    fg::Fill<T>(reinterpret_cast<void*>(dst), value, count);
  });
  if (sync) s->Synchronize();
  return CUDA_SUCCESS;
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

// The device attributes of an H100/H200 SXM (compute capability 9.0).
int Attribute(int attribute, int device) {
  const fg::Options& o = fg::Opts();
  switch (attribute) {
    case 1: return 1024;           // MAX_THREADS_PER_BLOCK
    case 2: case 3: return 1024;   // MAX_BLOCK_DIM_X, _Y
    case 4: return 64;             // MAX_BLOCK_DIM_Z
    case 5: return 2147483647;     // MAX_GRID_DIM_X
    case 6: case 7: return 65535;  // MAX_GRID_DIM_Y, _Z
    case 8: return 49152;          // MAX_SHARED_MEMORY_PER_BLOCK
    case 9: return 65536;          // TOTAL_CONSTANT_MEMORY
    case 10: return 32;            // WARP_SIZE
    case 11: return 2147483647;    // MAX_PITCH
    case 12: return 65536;         // MAX_REGISTERS_PER_BLOCK
    case 13: return o.clock_khz;   // CLOCK_RATE
    case 14: return 512;           // TEXTURE_ALIGNMENT
    case 15: return 1;             // GPU_OVERLAP
    case 16: return o.sms;         // MULTIPROCESSOR_COUNT
    case 17: return 0;             // KERNEL_EXEC_TIMEOUT
    case 18: return 0;             // INTEGRATED
    case 19: return 1;             // CAN_MAP_HOST_MEMORY
    case 20: return 0;             // COMPUTE_MODE (default)
    case 30: return 512;           // SURFACE_ALIGNMENT
    case 31: return 1;             // CONCURRENT_KERNELS
    case 32: return 1;             // ECC_ENABLED
    case 33: return 0x18 + device * 0x10;  // PCI_BUS_ID
    case 34: return 0;             // PCI_DEVICE_ID
    case 35: return 0;             // TCC_DRIVER
    case 36: return o.memory_clock_khz;    // MEMORY_CLOCK_RATE
    case 37: return o.bus_width;   // GLOBAL_MEMORY_BUS_WIDTH
    case 38: return 50 << 20;      // L2_CACHE_SIZE
    case 39: return 2048;          // MAX_THREADS_PER_MULTIPROCESSOR
    case 40: return 3;             // ASYNC_ENGINE_COUNT
    case 41: return 1;             // UNIFIED_ADDRESSING
    case 50: return 0;             // PCI_DOMAIN_ID
    case 51: return 32;            // TEXTURE_PITCH_ALIGNMENT
    case 75: return 9;             // COMPUTE_CAPABILITY_MAJOR
    case 76: return 0;             // COMPUTE_CAPABILITY_MINOR
    case 78: return 1;             // STREAM_PRIORITIES_SUPPORTED
    case 79: case 80: return 1;    // GLOBAL/LOCAL_L1_CACHE_SUPPORTED
    case 81: return 233472;        // MAX_SHARED_MEMORY_PER_MULTIPROCESSOR
    case 82: return 65536;         // MAX_REGISTERS_PER_MULTIPROCESSOR
    case 83: return 1;             // MANAGED_MEMORY
    case 84: return 0;             // MULTI_GPU_BOARD
    case 85: return device;        // MULTI_GPU_BOARD_GROUP_ID
    case 86: return 0;             // HOST_NATIVE_ATOMIC_SUPPORTED
    case 87: return 2;             // SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO
    case 88: return 0;             // PAGEABLE_MEMORY_ACCESS
    case 89: return 1;             // CONCURRENT_MANAGED_ACCESS
    case 90: return 1;             // COMPUTE_PREEMPTION_SUPPORTED
    case 91: return 0;             // CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM
    case 95: return 1;             // COOPERATIVE_LAUNCH
    case 96: return 1;             // COOPERATIVE_MULTI_DEVICE_LAUNCH
    case 97: return 232448;        // MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
    case 98: return 1;             // CAN_FLUSH_REMOTE_WRITES
    case 99: return 1;             // HOST_REGISTER_SUPPORTED
    case 102: return 1;            // VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
    case 103: return 1;            // HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_...
    case 106: return 32;           // MAX_BLOCKS_PER_MULTIPROCESSOR
    case 107: return 1;            // GENERIC_COMPRESSION_SUPPORTED
    case 108: return 31457280;     // MAX_PERSISTING_L2_CACHE_SIZE
    case 109: return 134213632;    // MAX_ACCESS_POLICY_WINDOW_SIZE
    case 110: return 1;            // GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED
    case 111: return 1024;         // RESERVED_SHARED_MEMORY_PER_BLOCK
    case 112: case 113: return 1;  // SPARSE_CUDA_ARRAY, READ_ONLY_HOST_REG.
    case 115: return 1;            // MEMORY_POOLS_SUPPORTED
    case 116: return 1;            // GPU_DIRECT_RDMA_SUPPORTED
    case 119: return 1;            // MEMPOOL_SUPPORTED_HANDLE_TYPES (fd)
    case 120: return 1;            // CLUSTER_LAUNCH
    case 121: return 1;            // DEFERRED_MAPPING_CUDA_ARRAY_SUPPORTED
    case 122: case 123: return 1;  // 64-bit stream mem ops, wait NOR
    case 124: return 1;            // DMA_BUF_SUPPORTED
    case 125: return 1;            // IPC_EVENT_SUPPORTED
    case 126: return 4;            // MEM_SYNC_DOMAIN_COUNT
    case 127: return 1;            // TENSOR_MAP_ACCESS_SUPPORTED
    case 129: return 0;            // UNIFIED_FUNCTION_POINTERS
    case 130: return 0;            // NUMA_CONFIG
    case 131: case 134: return -1; // NUMA_ID, HOST_NUMA_ID
    case 132: return 1;            // MULTICAST_SUPPORTED
    default: return 0;
  }
}

}  // namespace

#define FAKE CUresult __attribute__((visibility("default")))
#define ENTER() JAXLAKE_FAKEGPU_ENTER()

extern "C" {

// ---- initialisation and devices ---------------------------------------------

FAKE cuInit(unsigned int flags) {
  ENTER();
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = D();
  std::lock_guard<std::mutex> lock(d.mu);
  d.initialized = true;
  return CUDA_SUCCESS;
}

FAKE cuDriverGetVersion(int* version) {
  ENTER();
  if (version == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *version = kDriverVersion;
  return CUDA_SUCCESS;
}

FAKE cuDeviceGetCount(int* count) {
  ENTER();
  if (CUresult r = NeedInit(); r != CUDA_SUCCESS) return r;
  if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *count = Count();
  return CUDA_SUCCESS;
}

FAKE cuDeviceGet(CUdevice* device, int ordinal) {
  ENTER();
  if (CUresult r = NeedInit(); r != CUDA_SUCCESS) return r;
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDevice(ordinal)) return CUDA_ERROR_INVALID_DEVICE;
  *device = ordinal;
  return CUDA_SUCCESS;
}

FAKE cuDeviceGetName(char* name, int len, CUdevice device) {
  ENTER();
  if (CUresult r = NeedInit(); r != CUDA_SUCCESS) return r;
  if (name == nullptr || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDevice(device)) return CUDA_ERROR_INVALID_DEVICE;
  std::snprintf(name, static_cast<std::size_t>(len), "%s",
                fg::Opts().name.c_str());
  return CUDA_SUCCESS;
}

FAKE cuDeviceGetUuid(CUuuid* uuid, CUdevice device) {
  ENTER();
  if (CUresult r = NeedInit(); r != CUDA_SUCCESS) return r;
  if (uuid == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDevice(device)) return CUDA_ERROR_INVALID_DEVICE;
  std::memset(uuid, 0, sizeof *uuid);
  std::memcpy(uuid, "jaxlakefakegpu", 14);
  reinterpret_cast<unsigned char*>(uuid)[15] =
      static_cast<unsigned char>(device);
  return CUDA_SUCCESS;
}

FAKE cuDeviceGetUuid_v2(CUuuid* uuid, CUdevice device) {
  return cuDeviceGetUuid(uuid, device);
}

FAKE cuDeviceGetPCIBusId(char* id, int len, CUdevice device) {
  ENTER();
  if (CUresult r = NeedInit(); r != CUDA_SUCCESS) return r;
  if (id == nullptr || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDevice(device)) return CUDA_ERROR_INVALID_DEVICE;
  std::snprintf(id, static_cast<std::size_t>(len), "00000000:%02X:00.0",
                Attribute(33, device));
  return CUDA_SUCCESS;
}

FAKE cuDeviceGetByPCIBusId(CUdevice* device, const char* id) {
  ENTER();
  if (CUresult r = NeedInit(); r != CUDA_SUCCESS) return r;
  if (device == nullptr || id == nullptr) return CUDA_ERROR_INVALID_VALUE;
  for (int d = 0; d < Count(); ++d) {
    char mine[32];
    std::snprintf(mine, sizeof mine, "00000000:%02X:00.0", Attribute(33, d));
    if (strcasecmp(mine, id) == 0 || strcasecmp(mine + 4, id) == 0) {
      *device = d;
      return CUDA_SUCCESS;
    }
  }
  return CUDA_ERROR_INVALID_DEVICE;
}

FAKE cuDeviceGetAttribute(int* value, int attribute, CUdevice device) {
  ENTER();
  if (CUresult r = NeedInit(); r != CUDA_SUCCESS) return r;
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDevice(device)) return CUDA_ERROR_INVALID_DEVICE;
  *value = Attribute(attribute, device);
  return CUDA_SUCCESS;
}

FAKE cuDeviceComputeCapability(int* major, int* minor, CUdevice device) {
  ENTER();
  if (major == nullptr || minor == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDevice(device)) return CUDA_ERROR_INVALID_DEVICE;
  *major = 9;
  *minor = 0;
  return CUDA_SUCCESS;
}

FAKE cuDeviceTotalMem_v2(std::size_t* bytes, CUdevice device) {
  ENTER();
  if (CUresult r = NeedInit(); r != CUDA_SUCCESS) return r;
  if (bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDevice(device)) return CUDA_ERROR_INVALID_DEVICE;
  *bytes = fg::Opts().memory;
  return CUDA_SUCCESS;
}

FAKE cuMemGetInfo_v2(std::size_t* free_bytes, std::size_t* total) {
  ENTER();
  int dev = 0;
  if (CUresult r = NeedContext(&dev); r != CUDA_SUCCESS) return r;
  if (free_bytes == nullptr || total == nullptr)
    return CUDA_ERROR_INVALID_VALUE;
  *total = fg::Opts().memory;
  *free_bytes = *total - std::min(*total, fg::Used(dev));
  return CUDA_SUCCESS;
}

FAKE cuDeviceCanAccessPeer(int* can, CUdevice device, CUdevice peer) {
  ENTER();
  if (CUresult r = NeedInit(); r != CUDA_SUCCESS) return r;
  if (can == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDevice(device) || !ValidDevice(peer))
    return CUDA_ERROR_INVALID_DEVICE;
  *can = device != peer ? 1 : 0;
  return CUDA_SUCCESS;
}

FAKE cuDeviceGetP2PAttribute(int* value, int attribute, CUdevice src,
                             CUdevice dst) {
  ENTER();
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDevice(src) || !ValidDevice(dst) || src == dst)
    return CUDA_ERROR_INVALID_DEVICE;
  // PERFORMANCE_RANK (1) 0; ACCESS_SUPPORTED, NATIVE_ATOMIC, CUDA_ARRAY 1.
  *value = attribute == 1 ? 0 : 1;
  return CUDA_SUCCESS;
}

// ---- contexts ---------------------------------------------------------------

FAKE cuDevicePrimaryCtxRetain(CUcontext* ctx, CUdevice device) {
  ENTER();
  if (CUresult r = NeedInit(); r != CUDA_SUCCESS) return r;
  if (ctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDevice(device)) return CUDA_ERROR_INVALID_DEVICE;
  Driver& d = D();
  std::lock_guard<std::mutex> lock(d.mu);
  ++d.primary_refs[device];
  *ctx = ContextOf(device);
  return CUDA_SUCCESS;
}

FAKE cuDevicePrimaryCtxRelease_v2(CUdevice device) {
  ENTER();
  if (!ValidDevice(device)) return CUDA_ERROR_INVALID_DEVICE;
  Driver& d = D();
  std::lock_guard<std::mutex> lock(d.mu);
  if (d.primary_refs[device] == 0) return CUDA_ERROR_INVALID_CONTEXT;
  --d.primary_refs[device];
  return CUDA_SUCCESS;
}

FAKE cuDevicePrimaryCtxGetState(CUdevice device, unsigned int* flags,
                                int* active) {
  ENTER();
  if (flags == nullptr || active == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDevice(device)) return CUDA_ERROR_INVALID_DEVICE;
  Driver& d = D();
  std::lock_guard<std::mutex> lock(d.mu);
  *flags = 0;
  *active = d.primary_refs[device] > 0 ? 1 : 0;
  return CUDA_SUCCESS;
}

FAKE cuDevicePrimaryCtxSetFlags_v2(CUdevice device, unsigned int /*flags*/) {
  ENTER();
  return ValidDevice(device) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

FAKE cuDevicePrimaryCtxReset_v2(CUdevice device) {
  ENTER();
  return ValidDevice(device) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

FAKE cuCtxSetCurrent(CUcontext ctx) {
  ENTER();
  if (CUresult r = NeedInit(); r != CUDA_SUCCESS) return r;
  if (ctx != nullptr && DeviceOfContext(ctx) < 0)
    return CUDA_ERROR_INVALID_CONTEXT;
  fg::SetCurrentDevice(ctx == nullptr ? -1 : DeviceOfContext(ctx));
  return CUDA_SUCCESS;
}

FAKE cuCtxGetCurrent(CUcontext* ctx) {
  ENTER();
  if (CUresult r = NeedInit(); r != CUDA_SUCCESS) return r;
  if (ctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const int dev = fg::CurrentDevice();
  *ctx = dev < 0 ? nullptr : ContextOf(dev);
  return CUDA_SUCCESS;
}

FAKE cuCtxPushCurrent_v2(CUcontext ctx) { return cuCtxSetCurrent(ctx); }

FAKE cuCtxPopCurrent_v2(CUcontext* ctx) {
  ENTER();
  const int dev = fg::CurrentDevice();
  if (ctx != nullptr) *ctx = dev < 0 ? nullptr : ContextOf(dev);
  return CUDA_SUCCESS;
}

FAKE cuCtxGetDevice(CUdevice* device) {
  ENTER();
  int dev = 0;
  if (CUresult r = NeedContext(&dev); r != CUDA_SUCCESS) return r;
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *device = dev;
  return CUDA_SUCCESS;
}

FAKE cuCtxGetDevice_v2(CUdevice* device, CUcontext ctx) {
  ENTER();
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const int dev = ctx == nullptr ? fg::CurrentDevice() : DeviceOfContext(ctx);
  if (dev < 0) return CUDA_ERROR_INVALID_CONTEXT;
  *device = dev;
  return CUDA_SUCCESS;
}

FAKE cuCtxGetApiVersion(CUcontext /*ctx*/, unsigned int* version) {
  ENTER();
  if (version == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *version = 12000;
  return CUDA_SUCCESS;
}

FAKE cuCtxGetFlags(unsigned int* flags) {
  ENTER();
  if (flags == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *flags = 0;
  return CUDA_SUCCESS;
}

FAKE cuCtxSynchronize() {
  ENTER();
  int dev = 0;
  if (CUresult r = NeedContext(&dev); r != CUDA_SUCCESS) return r;
  for (fg::Stream* s : fg::StreamsOf(dev)) s->Synchronize();
  return CUDA_SUCCESS;
}

FAKE cuCtxGetStreamPriorityRange(int* least, int* greatest) {
  ENTER();
  if (least != nullptr) *least = 0;
  if (greatest != nullptr) *greatest = -5;
  return CUDA_SUCCESS;
}

FAKE cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags) {
  ENTER();
  int dev = 0;
  if (CUresult r = NeedContext(&dev); r != CUDA_SUCCESS) return r;
  const int p = DeviceOfContext(peer);
  if (p < 0 || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = D();
  std::lock_guard<std::mutex> lock(d.mu);
  return d.peers.insert({dev, p}).second
             ? CUDA_SUCCESS
             : CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
}

FAKE cuCtxSetLimit(int /*limit*/, std::size_t /*value*/) {
  ENTER();
  return CUDA_SUCCESS;
}

FAKE cuCtxGetLimit(std::size_t* value, int limit) {
  ENTER();
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  // STACK_SIZE 1 KiB, PRINTF_FIFO_SIZE and MALLOC_HEAP_SIZE 8 MiB.
  *value = limit == 0 ? 1024 : std::size_t{8} << 20;
  return CUDA_SUCCESS;
}

FAKE cuCtxSetCacheConfig(int /*config*/) {
  ENTER();
  return CUDA_SUCCESS;
}

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
  const int dev = fg::CurrentDevice();
  fg::AddRange({va, size, dev < 0 ? 0 : dev, fg::Kind::kReserved});
  return CUDA_SUCCESS;
}

FAKE cuMemAddressFree(CUdeviceptr ptr, std::size_t size) {
  ENTER();
  if (CUresult r = NeedInit(); r != CUDA_SUCCESS) return r;
  const auto s = fg::Host().address_free(ptr, size);
  if (s == jaxlake::vmm::Status::kOk) fg::RemoveRange(ptr);
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
  d.handles[h] = Driver::Handle{dev, size};
  *handle = h;
  return CUDA_SUCCESS;
}

FAKE cuMemRelease(CUmemGenericAllocationHandle handle) {
  ENTER();
  if (CUresult r = NeedInit(); r != CUDA_SUCCESS) return r;
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
  return FromStatus(fg::Host().map(ptr, size, offset, handle));
}

FAKE cuMemUnmap(CUdeviceptr ptr, std::size_t size) {
  ENTER();
  if (CUresult r = NeedInit(); r != CUDA_SUCCESS) return r;
  return FromStatus(fg::Host().unmap(ptr, size));
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
  return FromStatus(fg::Host().set_access(ptr, size));
}

// ---- plain allocations ------------------------------------------------------

namespace {
// `bytes` of device memory on `dev` (cuMemAlloc's, or the driver pool's when
// `pool`): charged to the device, mapped lazily, and recorded.
CUresult NewAllocation(int dev, std::size_t bytes, bool pool,
                       CUdeviceptr* dptr) {
  if (!fg::Charge(dev, bytes)) return CUDA_ERROR_OUT_OF_MEMORY;
  void* p = fg::MapAnonymous(bytes);
  if (p == nullptr) {
    fg::Uncharge(dev, bytes);
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
  }
  *dptr = v;
  return CUDA_SUCCESS;
}
}  // namespace

FAKE cuMemAlloc_v2(CUdeviceptr* dptr, std::size_t size) {
  ENTER();
  int dev = 0;
  if (CUresult r = NeedContext(&dev); r != CUDA_SUCCESS) return r;
  if (dptr == nullptr || size == 0) return CUDA_ERROR_INVALID_VALUE;
  return NewAllocation(dev, (size + kGranularity - 1) / kGranularity *
                                kGranularity, false, dptr);
}

FAKE cuMemFree_v2(CUdeviceptr dptr) {
  ENTER();
  if (CUresult r = NeedInit(); r != CUDA_SUCCESS) return r;
  if (dptr == 0) return CUDA_SUCCESS;
  Driver::Alloc a{};
  {
    Driver& d = D();
    std::lock_guard<std::mutex> lock(d.mu);
    auto it = d.allocs.find(dptr);
    if (it == d.allocs.end() || it->second.pool)
      return CUDA_ERROR_INVALID_VALUE;
    a = it->second;
    d.allocs.erase(it);
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

FAKE cuMemGetAddressRange_v2(CUdeviceptr* base, std::size_t* size,
                             CUdeviceptr p) {
  ENTER();
  fg::Range r;
  if (!fg::FindRange(p, &r)) return CUDA_ERROR_NOT_FOUND;
  if (base != nullptr) *base = r.base;
  if (size != nullptr) *size = r.size;
  return CUDA_SUCCESS;
}

namespace {
// One pointer attribute (CUpointer_attribute) of `p`.
CUresult PointerAttribute(void* data, int attribute, CUdeviceptr p,
                          bool lenient) {
  fg::Range r;
  const bool known = fg::FindRange(p, &r);
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

// ---- streams and events -----------------------------------------------------

FAKE cuStreamCreate(CUstream* stream, unsigned int flags) {
  ENTER();
  int dev = 0;
  if (CUresult r = NeedContext(&dev); r != CUDA_SUCCESS) return r;
  if (stream == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *stream = static_cast<CUstream>(fg::NewStream(dev, flags, 0));
  return CUDA_SUCCESS;
}

FAKE cuStreamCreateWithPriority(CUstream* stream, unsigned int flags,
                                int priority) {
  ENTER();
  int dev = 0;
  if (CUresult r = NeedContext(&dev); r != CUDA_SUCCESS) return r;
  if (stream == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *stream = static_cast<CUstream>(fg::NewStream(dev, flags, priority));
  return CUDA_SUCCESS;
}

FAKE cuStreamDestroy_v2(CUstream stream) {
  ENTER();
  return fg::DestroyStream(stream) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

FAKE cuStreamSynchronize(CUstream stream) {
  ENTER();
  if (CUresult r = NeedInit(); r != CUDA_SUCCESS) return r;
  fg::Stream* s = StreamFor(stream);
  if (s == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  s->Synchronize();
  return CUDA_SUCCESS;
}

FAKE cuStreamQuery(CUstream stream) {
  ENTER();
  fg::Stream* s = StreamFor(stream);
  if (s == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  return s->Idle() ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

FAKE cuStreamGetPriority(CUstream stream, int* priority) {
  ENTER();
  fg::Stream* s = StreamFor(stream);
  if (s == nullptr || priority == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *priority = s->priority;
  return CUDA_SUCCESS;
}

FAKE cuStreamGetFlags(CUstream stream, unsigned int* flags) {
  ENTER();
  fg::Stream* s = StreamFor(stream);
  if (s == nullptr || flags == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *flags = s->flags;
  return CUDA_SUCCESS;
}

FAKE cuStreamGetCtx(CUstream stream, CUcontext* ctx) {
  ENTER();
  fg::Stream* s = StreamFor(stream);
  if (s == nullptr || ctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *ctx = ContextOf(s->device());
  return CUDA_SUCCESS;
}

FAKE cuStreamWaitEvent(CUstream stream, CUevent event, unsigned int) {
  ENTER();
  fg::Stream* s = StreamFor(stream);
  auto e = fg::EventOf(event);
  if (s == nullptr || e == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  fg::WaitEvent(s, e);
  return CUDA_SUCCESS;
}

FAKE cuLaunchHostFunc(CUstream stream, void (*fn)(void*), void* data) {
  ENTER();
  fg::Stream* s = StreamFor(stream);
  if (s == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (fn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  s->Enqueue([fn, data] { fn(data); });
  return CUDA_SUCCESS;
}

FAKE cuStreamAddCallback(CUstream stream,
                         void (*fn)(CUstream, CUresult, void*), void* data,
                         unsigned int flags) {
  ENTER();
  fg::Stream* s = StreamFor(stream);
  if (s == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (fn == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  s->Enqueue([fn, data, stream] { fn(stream, CUDA_SUCCESS, data); });
  return CUDA_SUCCESS;
}

// No stream is ever captured: XLA's command buffers are built with the
// graph calls, and those the fake does not implement.
FAKE cuStreamIsCapturing(CUstream stream, int* status) {
  ENTER();
  if (status == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (StreamFor(stream) == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  *status = CU_STREAM_CAPTURE_STATUS_NONE;
  return CUDA_SUCCESS;
}

FAKE cuThreadExchangeStreamCaptureMode(int* mode) {
  ENTER();
  if (mode == nullptr) return CUDA_ERROR_INVALID_VALUE;
  thread_local int t_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
  std::swap(*mode, t_mode);
  return CUDA_SUCCESS;
}

FAKE cuEventCreate(CUevent* event, unsigned int flags) {
  ENTER();
  if (event == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *event = static_cast<CUevent>(fg::NewEvent(flags));
  return CUDA_SUCCESS;
}

FAKE cuEventDestroy_v2(CUevent event) {
  ENTER();
  return fg::DestroyEvent(event) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

FAKE cuEventRecord(CUevent event, CUstream stream) {
  ENTER();
  fg::Stream* s = StreamFor(stream);
  auto e = fg::EventOf(event);
  if (s == nullptr || e == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  fg::RecordEvent(e, s);
  return CUDA_SUCCESS;
}

FAKE cuEventRecordWithFlags(CUevent event, CUstream stream, unsigned int) {
  return cuEventRecord(event, stream);
}

FAKE cuEventQuery(CUevent event) {
  ENTER();
  auto e = fg::EventOf(event);
  if (e == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  std::lock_guard<std::mutex> lock(e->mu);
  return e->completed >= e->recorded ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

FAKE cuEventSynchronize(CUevent event) {
  ENTER();
  auto e = fg::EventOf(event);
  if (e == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  std::unique_lock<std::mutex> lock(e->mu);
  const std::uint64_t target = e->recorded;
  e->cv.wait(lock, [&] { return e->completed >= target; });
  return CUDA_SUCCESS;
}

FAKE cuEventElapsedTime(float* ms, CUevent start, CUevent end) {
  ENTER();
  auto a = fg::EventOf(start);
  auto b = fg::EventOf(end);
  if (ms == nullptr || a == nullptr || b == nullptr)
    return CUDA_ERROR_INVALID_HANDLE;
  double ta = 0, tb = 0;
  {
    std::lock_guard<std::mutex> lock(a->mu);
    if (a->completed < a->recorded) return CUDA_ERROR_NOT_READY;
    ta = a->time_ms;
  }
  {
    std::lock_guard<std::mutex> lock(b->mu);
    if (b->completed < b->recorded) return CUDA_ERROR_NOT_READY;
    tb = b->time_ms;
  }
  *ms = static_cast<float>(tb > ta ? tb - ta : 0.0);
  return CUDA_SUCCESS;
}

FAKE cuEventElapsedTime_v2(float* ms, CUevent start, CUevent end) {
  return cuEventElapsedTime(ms, start, end);
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
  return NewAllocation(dev, (size + 511) / 512 * 512, true, dptr);
}

CUresult PoolFree(CUdeviceptr dptr, CUstream stream) {
  if (CUresult r = NeedInit(); r != CUDA_SUCCESS) return r;
  fg::Stream* s = StreamFor(stream);
  if (s == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  Driver::Alloc a{};
  {
    Driver& d = D();
    std::lock_guard<std::mutex> lock(d.mu);
    auto it = d.allocs.find(dptr);
    if (it == d.allocs.end() || !it->second.pool)
      return CUDA_ERROR_INVALID_VALUE;
    a = it->second;
    d.allocs.erase(it);
    d.pool_used[a.device] -= a.size;
  }
  fg::RemoveRange(dptr);
  // The memory goes back once the stream's work before the free has run.
  s->Enqueue([dptr, a] {
    fg::UnmapAnonymous(reinterpret_cast<void*>(dptr), a.size);
    fg::Uncharge(a.device, a.size);
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

FAKE cuMemPoolGetAttribute(CUmemoryPool pool, int attr, void* value) {
  ENTER();
  const int dev = DeviceOfPool(pool);
  if (dev < 0 || value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = D();
  std::lock_guard<std::mutex> lock(d.mu);
  auto* out = static_cast<cuuint64_t*>(value);
  switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
      *static_cast<int*>(value) = 1;
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
      *out = d.release_threshold[dev];
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
      *out = d.pool_used[dev];
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
      *out = d.pool_high[dev];
      return CUDA_SUCCESS;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}

FAKE cuMemPoolSetAttribute(CUmemoryPool pool, int attr, void* value) {
  ENTER();
  const int dev = DeviceOfPool(pool);
  if (dev < 0 || value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = D();
  std::lock_guard<std::mutex> lock(d.mu);
  switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
      d.release_threshold[dev] = *static_cast<const cuuint64_t*>(value);
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
      d.pool_high[dev] = d.pool_used[dev];
      return CUDA_SUCCESS;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}

FAKE cuMemPoolTrimTo(CUmemoryPool pool, std::size_t /*keep*/) {
  ENTER();
  return DeviceOfPool(pool) < 0 ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

FAKE cuMemPoolSetAccess(CUmemoryPool pool, const CUmemAccessDesc* desc,
                        std::size_t count) {
  ENTER();
  if (DeviceOfPool(pool) < 0 || (desc == nullptr && count != 0))
    return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;
}

// ---- modules and kernels (kernels do not run) -------------------------------

namespace {
// The sized symbols of a cubin (an ELF file, as XLA loads), by name: what
// cuModuleGetGlobal answers. A fat binary or PTX image yields none.
std::map<std::string, std::size_t> ElfSymbols(const void* image) {
  std::map<std::string, std::size_t> out;
  const auto* b = static_cast<const unsigned char*>(image);
  if (std::memcmp(b, "\x7f" "ELF", 4) != 0 || b[4] != 2) return out;  // ELF64
  std::uint64_t shoff = 0;
  std::uint16_t shentsize = 0, shnum = 0;
  std::memcpy(&shoff, b + 0x28, 8);
  std::memcpy(&shentsize, b + 0x3A, 2);
  std::memcpy(&shnum, b + 0x3C, 2);
  if (shentsize < 64) return out;
  auto section = [&](unsigned i, std::uint32_t* type, std::uint64_t* off,
                     std::uint64_t* size, std::uint32_t* link,
                     std::uint64_t* entsize) {
    const unsigned char* h = b + shoff + std::uint64_t{i} * shentsize;
    std::memcpy(type, h + 4, 4);
    std::memcpy(off, h + 0x18, 8);
    std::memcpy(size, h + 0x20, 8);
    std::memcpy(link, h + 0x28, 4);
    std::memcpy(entsize, h + 0x38, 8);
  };
  for (unsigned i = 0; i < shnum; ++i) {
    std::uint32_t type = 0, link = 0;
    std::uint64_t off = 0, size = 0, entsize = 0;
    section(i, &type, &off, &size, &link, &entsize);
    if (type != 2 || entsize < 24 || link >= shnum) continue;  // SHT_SYMTAB
    std::uint32_t stype = 0, slink = 0;
    std::uint64_t soff = 0, ssize = 0, sent = 0;
    section(link, &stype, &soff, &ssize, &slink, &sent);
    for (std::uint64_t e = 0; e + entsize <= size; e += entsize) {
      const unsigned char* sym = b + off + e;
      std::uint32_t name = 0;
      std::uint64_t value_size = 0;
      std::memcpy(&name, sym, 4);
      std::memcpy(&value_size, sym + 16, 8);
      if (name == 0 || name >= ssize || value_size == 0) continue;
      const char* n = reinterpret_cast<const char*>(b + soff + name);
      out[std::string(n, strnlen(n, ssize - name))] = value_size;
    }
  }
  return out;
}

CUresult LoadModule(void** module, const void* image) {
  if (CUresult r = NeedContext(); r != CUDA_SUCCESS) return r;
  if (module == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (image == nullptr) return CUDA_ERROR_INVALID_IMAGE;
  auto symbols = ElfSymbols(image);
  Driver& d = D();
  std::lock_guard<std::mutex> lock(d.mu);
  const std::uintptr_t m = d.next_module;
  d.next_module += 0x10;
  d.modules[m].symbols = std::move(symbols);
  *module = reinterpret_cast<void*>(m);
  return CUDA_SUCCESS;
}
}  // namespace

// A module's global: device memory of the symbol's size, zeroed, the same
// for every call with that name (freed with the module).
FAKE cuModuleGetGlobal_v2(CUdeviceptr* dptr, std::size_t* bytes,
                          void* module, const char* name) {
  ENTER();
  if (name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = D();
  std::lock_guard<std::mutex> lock(d.mu);
  auto it = d.modules.find(reinterpret_cast<std::uintptr_t>(module));
  if (it == d.modules.end()) return CUDA_ERROR_INVALID_HANDLE;
  auto g = it->second.globals.find(name);
  if (g == it->second.globals.end()) {
    auto sym = it->second.symbols.find(name);
    if (sym == it->second.symbols.end()) return CUDA_ERROR_NOT_FOUND;
    void* p = fg::MapAnonymous(sym->second);
    if (p == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
    const int dev = fg::CurrentDevice();
    fg::AddRange({reinterpret_cast<std::uintptr_t>(p), sym->second,
                  dev < 0 ? 0 : dev, fg::Kind::kDevice, true});
    g = it->second.globals.emplace(name, std::make_pair(p, sym->second)).first;
  }
  if (dptr != nullptr) *dptr = reinterpret_cast<CUdeviceptr>(g->second.first);
  if (bytes != nullptr) *bytes = g->second.second;
  return CUDA_SUCCESS;
}

FAKE cuModuleLoadData(void** module, const void* image) {
  ENTER();
  return LoadModule(module, image);
}
FAKE cuModuleLoadDataEx(void** module, const void* image, unsigned int,
                        void*, void**) {
  ENTER();
  return LoadModule(module, image);
}
FAKE cuModuleLoadFatBinary(void** module, const void* image) {
  ENTER();
  return LoadModule(module, image);
}

FAKE cuModuleUnload(void* module) {
  ENTER();
  Driver& d = D();
  std::lock_guard<std::mutex> lock(d.mu);
  auto it = d.modules.find(reinterpret_cast<std::uintptr_t>(module));
  if (it == d.modules.end()) return CUDA_ERROR_INVALID_HANDLE;
  for (auto& [name, g] : it->second.globals) {
    fg::RemoveRange(reinterpret_cast<std::uintptr_t>(g.first));
    fg::UnmapAnonymous(g.first, g.second);
  }
  d.modules.erase(it);
  return CUDA_SUCCESS;
}

FAKE cuModuleGetFunction(void** function, void* module, const char* name) {
  ENTER();
  if (function == nullptr || name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = D();
  std::lock_guard<std::mutex> lock(d.mu);
  if (d.modules.count(reinterpret_cast<std::uintptr_t>(module)) == 0)
    return CUDA_ERROR_INVALID_HANDLE;
  auto f = std::make_unique<Driver::Function>();
  f->name = name;
  *function = f.get();
  d.functions[reinterpret_cast<std::uintptr_t>(f.get())] = std::move(f);
  return CUDA_SUCCESS;
}

FAKE cuModuleGetLoadingMode(int* mode) {
  ENTER();
  if (mode == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *mode = 1;  // CU_MODULE_EAGER_LOADING
  return CUDA_SUCCESS;
}

FAKE cuFuncGetAttribute(int* value, int attribute, void* function) {
  ENTER();
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = D();
  std::lock_guard<std::mutex> lock(d.mu);
  auto it = d.functions.find(reinterpret_cast<std::uintptr_t>(function));
  const int set = it != d.functions.end() && attribute >= 0 && attribute < 16
                      ? it->second->attrs[attribute]
                      : 0;
  switch (attribute) {
    case 0: *value = 1024; break;  // MAX_THREADS_PER_BLOCK
    case 4: *value = 32; break;    // NUM_REGS
    case 5: case 6: *value = 90; break;  // PTX_VERSION, BINARY_VERSION
    default: *value = set; break;
  }
  return CUDA_SUCCESS;
}

FAKE cuFuncSetAttribute(void* function, int attribute, int value) {
  ENTER();
  Driver& d = D();
  std::lock_guard<std::mutex> lock(d.mu);
  if (function == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  // A runtime kernel (cudaGetFuncBySymbol) has no entry: nothing to keep.
  auto it = d.functions.find(reinterpret_cast<std::uintptr_t>(function));
  if (it != d.functions.end() && attribute >= 0 && attribute < 16)
    it->second->attrs[attribute] = value;
  return CUDA_SUCCESS;
}

FAKE cuFuncSetCacheConfig(void*, int) {
  ENTER();
  return CUDA_SUCCESS;
}

FAKE cuFuncSetSharedMemConfig(void*, int) {
  ENTER();
  return CUDA_SUCCESS;
}

FAKE cuFuncGetName(const char** name, void* function) {
  ENTER();
  Driver& d = D();
  std::lock_guard<std::mutex> lock(d.mu);
  auto it = d.functions.find(reinterpret_cast<std::uintptr_t>(function));
  if (name == nullptr || it == d.functions.end())
    return CUDA_ERROR_INVALID_VALUE;
  *name = it->second->name.c_str();
  return CUDA_SUCCESS;
}

FAKE cuOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, void*,
                                                 int block_size,
                                                 std::size_t) {
  ENTER();
  if (blocks == nullptr || block_size <= 0) return CUDA_ERROR_INVALID_VALUE;
  *blocks = std::max(1, std::min(32, 2048 / block_size));
  return CUDA_SUCCESS;
}

FAKE cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
    int* blocks, void* f, int block_size, std::size_t smem, unsigned int) {
  return cuOccupancyMaxActiveBlocksPerMultiprocessor(blocks, f, block_size,
                                                     smem);
}

FAKE cuOccupancyAvailableDynamicSMemPerBlock(std::size_t* smem, void*,
                                             int blocks, int) {
  ENTER();
  if (smem == nullptr || blocks <= 0) return CUDA_ERROR_INVALID_VALUE;
  *smem = 232448 / static_cast<std::size_t>(blocks);
  return CUDA_SUCCESS;
}

FAKE cuOccupancyMaxActiveClusters(int* clusters, void*, const void*) {
  ENTER();
  if (clusters == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *clusters = fg::Opts().sms / 2;
  return CUDA_SUCCESS;
}

FAKE cuOccupancyMaxPotentialBlockSize(int* min_grid, int* block_size, void*,
                                      void*, std::size_t, int limit) {
  ENTER();
  if (min_grid == nullptr || block_size == nullptr)
    return CUDA_ERROR_INVALID_VALUE;
  *block_size = limit > 0 && limit < 1024 ? limit : 1024;
  *min_grid = fg::Opts().sms * 2;
  return CUDA_SUCCESS;
}

namespace {
void Launched() {
  Driver& d = D();
  std::lock_guard<std::mutex> lock(d.mu);
  ++d.launches;
}
}  // namespace

// Kernels do not run: a launch is accepted in stream order and does
// nothing, so the values XLA computes are meaningless.
FAKE cuLaunchKernel(void* f, unsigned int, unsigned int, unsigned int,
                    unsigned int, unsigned int, unsigned int, unsigned int,
                    CUstream stream, void**, void**) {
  ENTER();
  if (f == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (StreamFor(stream) == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  Launched();
  return CUDA_SUCCESS;
}

struct LaunchConfig {  // CUlaunchConfig's leading fields
  unsigned int grid[3];
  unsigned int block[3];
  unsigned int shared_bytes;
  CUstream stream;
};

FAKE cuLaunchKernelEx(const LaunchConfig* config, void* f, void**, void**) {
  ENTER();
  if (config == nullptr || f == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (StreamFor(config->stream) == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  Launched();
  return CUDA_SUCCESS;
}

FAKE cuLaunchCooperativeKernel(void* f, unsigned int, unsigned int,
                               unsigned int, unsigned int, unsigned int,
                               unsigned int, unsigned int, CUstream stream,
                               void**) {
  ENTER();
  if (f == nullptr || StreamFor(stream) == nullptr)
    return CUDA_ERROR_INVALID_HANDLE;
  Launched();
  return CUDA_SUCCESS;
}

// Tensor-memory-access descriptors (CUtensorMap, 128 bytes) that Triton's
// Hopper kernels take: zeroed, since the kernels do not run.
FAKE cuTensorMapEncodeTiled(void* map) {
  ENTER();
  if (map == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::memset(map, 0, 128);
  return CUDA_SUCCESS;
}

FAKE cuTensorMapEncodeIm2col(void* map) {
  ENTER();
  if (map == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::memset(map, 0, 128);
  return CUDA_SUCCESS;
}

// ---- errors and entry points by name ----------------------------------------

FAKE cuGetErrorName(CUresult error, const char** name) {
  ENTER();
  if (name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  switch (error) {
#define NAME(code, text) \
  case code:             \
    *name = text;        \
    return CUDA_SUCCESS;
    NAME(0, "CUDA_SUCCESS")
    NAME(1, "CUDA_ERROR_INVALID_VALUE")
    NAME(2, "CUDA_ERROR_OUT_OF_MEMORY")
    NAME(3, "CUDA_ERROR_NOT_INITIALIZED")
    NAME(100, "CUDA_ERROR_NO_DEVICE")
    NAME(101, "CUDA_ERROR_INVALID_DEVICE")
    NAME(200, "CUDA_ERROR_INVALID_IMAGE")
    NAME(201, "CUDA_ERROR_INVALID_CONTEXT")
    NAME(400, "CUDA_ERROR_INVALID_HANDLE")
    NAME(401, "CUDA_ERROR_ILLEGAL_STATE")
    NAME(500, "CUDA_ERROR_NOT_FOUND")
    NAME(600, "CUDA_ERROR_NOT_READY")
    NAME(704, "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED")
    NAME(801, "CUDA_ERROR_NOT_SUPPORTED")
    NAME(900, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED")
    NAME(999, "CUDA_ERROR_UNKNOWN")
#undef NAME
    default:
      *name = nullptr;
      return CUDA_ERROR_INVALID_VALUE;
  }
}

FAKE cuGetErrorString(CUresult error, const char** text) {
  ENTER();
  if (text == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const char* name = nullptr;
  const CUresult r = cuGetErrorName(error, &name);
  *text = r == CUDA_SUCCESS ? name : nullptr;
  return r;
}

namespace {
// This library's function for `symbol` as the real driver would choose it:
// the per-thread variant when asked for, then the _v2 version, then the
// plain name.
void* Lookup(const char* symbol, int version, cuuint64_t flags) {
  const std::string name = symbol;
  if (name == "cuGetProcAddress")
    return ::dlsym(Self(), version >= 12000 ? "cuGetProcAddress_v2"
                                            : "cuGetProcAddress");
  if ((flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0) {
    if (void* fn = ::dlsym(Self(), (name + "_ptsz").c_str())) return fn;
  }
  if (void* fn = ::dlsym(Self(), (name + "_v2").c_str())) return fn;
  if (void* fn = ::dlsym(Self(), symbol)) return fn;
  fg::Unsupported("driver", symbol, CUDA_ERROR_NOT_FOUND);
  return nullptr;
}
}  // namespace

FAKE cuGetProcAddress_v2(const char* symbol, void** pfn, int version,
                         cuuint64_t flags, int* status) {
  ENTER();
  if (symbol == nullptr || pfn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *pfn = Lookup(symbol, version, flags);
  if (status != nullptr)
    *status = *pfn != nullptr ? CU_GET_PROC_ADDRESS_SUCCESS
                              : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  return *pfn != nullptr ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

FAKE cuGetProcAddress(const char* symbol, void** pfn, int version,
                      cuuint64_t flags) {
  return cuGetProcAddress_v2(symbol, pfn, version, flags, nullptr);
}

// NVIDIA's private tables are not implemented: a caller asking for one
// (only NVIDIA's own runtime does, and the fake stands in its place) is
// refused.
FAKE cuGetExportTable(const void** table, const CUuuid*) {
  ENTER();
  if (table != nullptr) *table = nullptr;
  return fg::Unsupported("driver", "cuGetExportTable",
                         CUDA_ERROR_NOT_SUPPORTED);
}

// ---- figures for the tests --------------------------------------------------

// Calls of kernels launched so far.
__attribute__((visibility("default"))) unsigned long long
jaxlake_fakegpu_launches() {
  Driver& d = D();
  std::lock_guard<std::mutex> lock(d.mu);
  return d.launches;
}

// Device bytes in use on `device` (VMM, cuMemAlloc and the pool).
__attribute__((visibility("default"))) unsigned long long
jaxlake_fakegpu_used(int device) {
  return fg::Used(device);
}

}  // extern "C"
