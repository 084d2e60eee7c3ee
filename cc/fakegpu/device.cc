// The fake driver's devices and contexts: H100/H200 SXM devices (their
// attribute table), primary contexts, the current context of each thread,
// peer access and limits.
#include <strings.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "cc/fakegpu/driver.h"
#include "cc/fakegpu/fakegpu.h"
#include "cc/vmm/cuda_types.h"

using namespace jaxlake::cuda;            // NOLINT: the driver's vocabulary
using namespace jaxlake::fakegpu::driver;  // NOLINT: its shared state
namespace fg = jaxlake::fakegpu;

namespace {

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
    case 102: case 103: case 110:  // VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
      return fg::HasVmm(device);   // its POSIX handles, RDMA with VMM
    case 106: return 32;           // MAX_BLOCKS_PER_MULTIPROCESSOR
    case 107: return 1;            // GENERIC_COMPRESSION_SUPPORTED
    case 108: return 31457280;     // MAX_PERSISTING_L2_CACHE_SIZE
    case 109: return 134213632;    // MAX_ACCESS_POLICY_WINDOW_SIZE
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
    case 132: return 0;            // MULTICAST_SUPPORTED: no NVSwitch
    default: return 0;
  }
}

}  // namespace

extern "C" {

// ---- initialisation and devices ---------------------------------------------

FAKE cuInit(unsigned int flags) {
  ENTER();
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  // Shared device memory (JAXLAKE_FAKEGPU_SHARED) that cannot be had: no
  // device, as a driver that cannot reach its GPU answers (shared.cc said
  // why on stderr).
  if (fg::SharedError() != nullptr) return CUDA_ERROR_NO_DEVICE;
  Driver& d = D();
  std::lock_guard<std::mutex> lock(d.mu);
  d.initialized = true;
  return CUDA_SUCCESS;
}

FAKE cuDriverGetVersion(int* version) {
  ENTER();
  if (version == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *version = fg::Opts().driver_version;
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
  // A device without VMM (JAXLAKE_FAKEGPU_NO_VMM) stands for a GPU of
  // another kind beside the others: no peer access either way.
  *can = device != peer && fg::HasVmm(device) && fg::HasVmm(peer) ? 1 : 0;
  return CUDA_SUCCESS;
}

FAKE cuDeviceGetP2PAttribute(int* value, int attribute, CUdevice src,
                             CUdevice dst) {
  ENTER();
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDevice(src) || !ValidDevice(dst) || src == dst)
    return CUDA_ERROR_INVALID_DEVICE;
  // PERFORMANCE_RANK (1) 0; ACCESS_SUPPORTED, NATIVE_ATOMIC, CUDA_ARRAY 1
  // (0 beside a device without VMM, as cuDeviceCanAccessPeer says).
  *value = attribute == 1 || !fg::HasVmm(src) || !fg::HasVmm(dst) ? 0 : 1;
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
  if (CUresult r = CheckUnsafe(); r != CUDA_SUCCESS) return r;
  for (fg::Stream* s : fg::StreamsOf(dev)) s->Synchronize();
  TrimPools();
  return Sticky(dev);
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


}  // extern "C"
