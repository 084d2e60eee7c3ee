// The fake GPU's CUDA runtime (libcudart) and NVML (libnvidia-ml): the
// public calls XLA and JAX's CUDA extensions make, over the fake driver's
// state. In the fake, the runtime's streams are the driver's (as
// cudaStream_t and CUstream are in CUDA), and device memory is host memory.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <mutex>

#include "cc/fakegpu/fakegpu.h"

namespace fg = jaxlake::fakegpu;

// The driver's entry points this file calls (device.cc, memory.cc,
// stream.cc).
extern "C" {
int cuInit(unsigned int);
int cuDeviceGetAttribute(int*, int, int);
int cuDevicePrimaryCtxRetain(void**, int);
int cuCtxSetCurrent(void*);
int cuCtxSynchronize();
int cuMemAlloc_v2(unsigned long long*, std::size_t);
int cuMemFree_v2(unsigned long long);
int cuMemcpyAsync(unsigned long long, unsigned long long, std::size_t,
                  void*);
int cuMemcpy(unsigned long long, unsigned long long, std::size_t);
int cuMemsetD8Async(unsigned long long, unsigned char, std::size_t, void*);
int cuStreamSynchronize(void*);
int cuStreamCreateWithPriority(void**, unsigned int, int);
int cuStreamDestroy_v2(void*);
int cuStreamWaitEvent(void*, void*, unsigned int);
int cuEventCreate(void**, unsigned int);
int cuEventDestroy_v2(void*);
int cuEventRecord(void*, void*);
int cuEventSynchronize(void*);
int cuEventQuery(void*);
int cuLaunchHostFunc(void*, void (*)(void*), void*);
}

namespace {

constexpr int kSuccess = 0;
constexpr int kErrorInvalidValue = 1;        // cudaErrorInvalidValue
constexpr int kErrorInvalidDevice = 101;     // cudaErrorInvalidDevice

int RuntimeVersion() { return fg::Opts().cuda_major == 13 ? 13000 : 12090; }

// The runtime makes the device's primary context current on first use, as
// cudart does.
int Ready() {
  if (fg::CurrentDevice() >= 0) return kSuccess;
  cuInit(0);
  void* ctx = nullptr;
  if (cuDevicePrimaryCtxRetain(&ctx, 0) != 0) return kErrorInvalidDevice;
  return cuCtxSetCurrent(ctx);
}

int FromDriver(int r) {
  switch (r) {
    case 0: return kSuccess;
    case 1: return kErrorInvalidValue;
    case 2: return 2;     // cudaErrorMemoryAllocation
    case 400: return 400; // cudaErrorInvalidResourceHandle
    case 600: return 600; // cudaErrorNotReady
    default: return 999;  // cudaErrorUnknown
  }
}

#define ENTER() JAXLAKE_FAKEGPU_ENTER()

}  // namespace

#define RT extern "C" __attribute__((visibility("default")))

// ---- versions, devices, errors ----------------------------------------------

RT int cudaRuntimeGetVersion(int* v) {
  ENTER();
  if (v == nullptr) return kErrorInvalidValue;
  *v = RuntimeVersion();
  return kSuccess;
}

RT int cudaDriverGetVersion(int* v) {
  ENTER();
  if (v == nullptr) return kErrorInvalidValue;
  *v = 13000;
  return kSuccess;
}

RT int cudaGetDeviceCount(int* n) {
  ENTER();
  if (n == nullptr) return kErrorInvalidValue;
  *n = fg::Opts().count;
  return kSuccess;
}

RT int cudaGetDevice(int* d) {
  ENTER();
  if (d == nullptr) return kErrorInvalidValue;
  if (int r = Ready(); r != kSuccess) return r;
  *d = fg::CurrentDevice();
  return kSuccess;
}

RT int cudaSetDevice(int d) {
  ENTER();
  if (d < 0 || d >= fg::Opts().count) return kErrorInvalidDevice;
  cuInit(0);
  void* ctx = nullptr;
  if (cuDevicePrimaryCtxRetain(&ctx, d) != 0) return kErrorInvalidDevice;
  return FromDriver(cuCtxSetCurrent(ctx));
}

RT int cudaInitDevice(int d, unsigned int, unsigned int) {
  return cudaSetDevice(d);
}

RT int cudaFree(void* p);

// cudaDeviceAttr shares the driver's numbering.
RT int cudaDeviceGetAttribute(int* value, int attribute, int device) {
  ENTER();
  cuInit(0);
  return cuDeviceGetAttribute(value, attribute, device) == 0
             ? kSuccess
             : kErrorInvalidValue;
}

// The driver's range (cuCtxGetStreamPriorityRange): least 0, greatest -5.
RT int cudaDeviceGetStreamPriorityRange(int* least, int* greatest) {
  ENTER();
  if (int r = Ready(); r != kSuccess) return r;
  if (least != nullptr) *least = 0;
  if (greatest != nullptr) *greatest = -5;
  return kSuccess;
}

// cudaDeviceProp's leading fields, at their offsets in CUDA 12's layout
// (CUDA 13 removed clockRate, deviceOverlap and kernelExecTimeoutEnabled,
// which moves the fields after them). The rest of the structure is zero.
RT int cudaGetDeviceProperties_v2(unsigned char* prop, int device) {
  ENTER();
  if (prop == nullptr) return kErrorInvalidValue;
  if (device < 0 || device >= fg::Opts().count) return kErrorInvalidDevice;
  const bool cuda13 = fg::Opts().cuda_major == 13;
  std::memset(prop, 0, 720);  // the first 720 of its 1008+ bytes
  std::snprintf(reinterpret_cast<char*>(prop), 256, "%s",
                fg::Opts().name.c_str());
  auto put_size = [&](std::size_t off, std::size_t v) {
    std::memcpy(prop + off, &v, sizeof v);
  };
  auto put_int = [&](std::size_t off, int v) {
    std::memcpy(prop + off, &v, sizeof v);
  };
  put_size(288, fg::Opts().memory);  // totalGlobalMem
  put_size(296, 49152);              // sharedMemPerBlock
  put_int(304, 65536);               // regsPerBlock
  put_int(308, 32);                  // warpSize
  put_size(312, 2147483647);         // memPitch
  put_int(320, 1024);                // maxThreadsPerBlock
  put_int(324, 1024);
  put_int(328, 1024);
  put_int(332, 64);                  // maxThreadsDim
  put_int(336, 2147483647);
  put_int(340, 65535);
  put_int(344, 65535);               // maxGridSize
  if (!cuda13) put_int(348, fg::Opts().clock_khz);  // clockRate
  put_size(352, 65536);              // totalConstMem
  put_int(360, 9);                   // major
  put_int(364, 0);                   // minor
  put_size(368, 512);                // textureAlignment
  put_size(376, 32);                 // texturePitchAlignment
  put_int(cuda13 ? 384 : 388, fg::Opts().sms);  // multiProcessorCount
  return kSuccess;
}

RT int cudaGetDeviceProperties(unsigned char* prop, int device) {
  return cudaGetDeviceProperties_v2(prop, device);
}

RT int cudaGetLastError() { return kSuccess; }
RT int cudaPeekAtLastError() { return kSuccess; }

RT const char* cudaGetErrorString(int error) {
  switch (error) {
    case 0: return "no error";
    case 1: return "invalid argument";
    case 2: return "out of memory";
    case 101: return "invalid device ordinal";
    case 801: return "operation not supported (jaxlake fake GPU)";
    default: return "unknown error (jaxlake fake GPU)";
  }
}

RT const char* cudaGetErrorName(int error) {
  switch (error) {
    case 0: return "cudaSuccess";
    case 1: return "cudaErrorInvalidValue";
    case 2: return "cudaErrorMemoryAllocation";
    case 101: return "cudaErrorInvalidDevice";
    case 801: return "cudaErrorNotSupported";
    default: return "cudaErrorUnknown";
  }
}

RT int cudaDeviceSynchronize() {
  ENTER();
  if (int r = Ready(); r != kSuccess) return r;
  return FromDriver(cuCtxSynchronize());
}

// ---- memory -----------------------------------------------------------------

RT int cudaMalloc(void** p, std::size_t n) {
  ENTER();
  if (p == nullptr) return kErrorInvalidValue;
  if (int r = Ready(); r != kSuccess) return r;
  unsigned long long d = 0;
  const int r = cuMemAlloc_v2(&d, n);
  *p = reinterpret_cast<void*>(d);
  return FromDriver(r);
}

RT int cudaFree(void* p) {
  ENTER();
  return FromDriver(cuMemFree_v2(reinterpret_cast<unsigned long long>(p)));
}

RT int cudaMemcpyAsync(void* dst, const void* src, std::size_t n, int,
                       void* stream) {
  ENTER();
  if (int r = Ready(); r != kSuccess) return r;
  return FromDriver(cuMemcpyAsync(reinterpret_cast<unsigned long long>(dst),
                                  reinterpret_cast<unsigned long long>(src), n,
                                  stream));
}

RT int cudaMemcpy(void* dst, const void* src, std::size_t n, int) {
  ENTER();
  if (int r = Ready(); r != kSuccess) return r;
  return FromDriver(cuMemcpy(reinterpret_cast<unsigned long long>(dst),
                             reinterpret_cast<unsigned long long>(src), n));
}

RT int cudaMemsetAsync(void* dst, int value, std::size_t n, void* stream) {
  ENTER();
  if (int r = Ready(); r != kSuccess) return r;
  return FromDriver(cuMemsetD8Async(reinterpret_cast<unsigned long long>(dst),
                                    static_cast<unsigned char>(value), n,
                                    stream));
}

RT int cudaMemset(void* dst, int value, std::size_t n) {
  const int r = cudaMemsetAsync(dst, value, n, nullptr);
  return r != kSuccess ? r : FromDriver(cuStreamSynchronize(nullptr));
}

struct PointerAttributes {  // cudaPointerAttributes
  int type;
  int device;
  void* device_pointer;
  void* host_pointer;
};

RT int cudaPointerGetAttributes(PointerAttributes* a, const void* p) {
  ENTER();
  if (a == nullptr) return kErrorInvalidValue;
  fg::Range r;
  const bool known = fg::FindRange(reinterpret_cast<std::uintptr_t>(p), &r);
  // cudaMemoryTypeUnregistered 0, Host 1, Device 2.
  a->type = !known ? 0 : r.kind == fg::Kind::kHost ? 1 : 2;
  a->device = known ? r.device : -2;
  a->device_pointer = known ? const_cast<void*>(p) : nullptr;
  a->host_pointer = known ? const_cast<void*>(p) : nullptr;
  return kSuccess;
}

// ---- streams, events, kernels -----------------------------------------------

RT int cudaStreamSynchronize(void* stream) {
  ENTER();
  if (int r = Ready(); r != kSuccess) return r;
  return FromDriver(cuStreamSynchronize(stream));
}

RT int cudaStreamCreateWithPriority(void** stream, unsigned int flags,
                                    int priority) {
  ENTER();
  if (int r = Ready(); r != kSuccess) return r;
  return FromDriver(cuStreamCreateWithPriority(stream, flags, priority));
}

RT int cudaStreamCreateWithFlags(void** stream, unsigned int flags) {
  return cudaStreamCreateWithPriority(stream, flags, 0);
}

RT int cudaStreamCreate(void** stream) {
  return cudaStreamCreateWithPriority(stream, 0, 0);
}

RT int cudaStreamDestroy(void* stream) {
  ENTER();
  return FromDriver(cuStreamDestroy_v2(stream));
}

RT int cudaStreamWaitEvent(void* stream, void* event, unsigned int flags) {
  ENTER();
  return FromDriver(cuStreamWaitEvent(stream, event, flags));
}

RT int cudaEventCreateWithFlags(void** event, unsigned int flags) {
  ENTER();
  return FromDriver(cuEventCreate(event, flags));
}

RT int cudaEventCreate(void** event) { return cudaEventCreateWithFlags(event, 0); }

RT int cudaEventDestroy(void* event) {
  ENTER();
  return FromDriver(cuEventDestroy_v2(event));
}

RT int cudaEventRecord(void* event, void* stream) {
  ENTER();
  if (int r = Ready(); r != kSuccess) return r;
  return FromDriver(cuEventRecord(event, stream));
}

RT int cudaEventSynchronize(void* event) {
  ENTER();
  return FromDriver(cuEventSynchronize(event));
}

RT int cudaEventQuery(void* event) {
  ENTER();
  return FromDriver(cuEventQuery(event));
}

RT int cudaLaunchHostFunc(void* stream, void (*fn)(void*), void* data) {
  ENTER();
  if (int r = Ready(); r != kSuccess) return r;
  return FromDriver(cuLaunchHostFunc(stream, fn, data));
}

// Kernels do not run (the arguments, grid and block are not read).
RT int cudaLaunchKernel(const void* func) {
  ENTER();
  return func != nullptr ? kSuccess : kErrorInvalidValue;
}

RT int cudaLaunchKernelExC(const void* config, const void* func) {
  ENTER();
  return config != nullptr && func != nullptr ? kSuccess : kErrorInvalidValue;
}

// The kernel behind a function of nvcc's code: the symbol's address serves
// as its handle (kernels do not run; the driver accepts any non-null one).
RT int cudaGetFuncBySymbol(void** function, const void* symbol) {
  ENTER();
  if (function == nullptr || symbol == nullptr) return kErrorInvalidValue;
  *function = const_cast<void*>(symbol);
  return kSuccess;
}

RT int cudaGetKernel(void** kernel, const void* symbol) {
  return cudaGetFuncBySymbol(kernel, symbol);
}

RT int cudaFuncSetAttribute(const void*, int, int) {
  ENTER();
  return kSuccess;
}

RT int cudaFuncSetCacheConfig(const void*, int) {
  ENTER();
  return kSuccess;
}

RT int cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, const void*,
                                                     int block_size,
                                                     std::size_t) {
  ENTER();
  if (blocks == nullptr || block_size <= 0) return kErrorInvalidValue;
  *blocks = block_size >= 2048 ? 1 : 2048 / block_size > 32 ? 32
                                                            : 2048 / block_size;
  return kSuccess;
}

// ---- the registration calls nvcc's generated code makes at load -------------

namespace {
void* g_fatbin_handles[64];
}

RT void** __cudaRegisterFatBinary(void*) { return g_fatbin_handles; }
RT void __cudaRegisterFatBinaryEnd(void**) {}
RT void __cudaUnregisterFatBinary(void**) {}
RT void __cudaRegisterFunction(void**, const char*, char*, const char*, int,
                               void*, void*, void*, void*, int*) {}
RT void __cudaRegisterVar(void**, char*, char*, const char*, int,
                          std::size_t, int, int) {}
RT void __cudaRegisterManagedVar(void**, void**, char*, const char*, int,
                                 std::size_t, int, int) {}
RT void __cudaRegisterHostVar(void**, const char*, char*, std::size_t) {}
RT char __cudaInitModule(void**) { return 1; }

struct Dim3 {
  unsigned x, y, z;
};
namespace {
thread_local Dim3 t_grid{1, 1, 1}, t_block{1, 1, 1};
thread_local std::size_t t_shared = 0;
thread_local void* t_stream = nullptr;
}  // namespace

RT unsigned __cudaPushCallConfiguration(Dim3 grid, Dim3 block,
                                        std::size_t shared, void* stream) {
  t_grid = grid;
  t_block = block;
  t_shared = shared;
  t_stream = stream;
  return 0;
}

RT int __cudaPopCallConfiguration(Dim3* grid, Dim3* block,
                                  std::size_t* shared, void** stream) {
  if (grid != nullptr) *grid = t_grid;
  if (block != nullptr) *block = t_block;
  if (shared != nullptr) *shared = t_shared;
  if (stream != nullptr) *stream = t_stream;
  return kSuccess;
}

// CUDA 13's launch of nvcc's code (crt/host_runtime.h): the kernel of a
// function is looked up once (__cudaGetKernel, as cudaGetKernel) and each
// launch goes through __cudaLaunchKernel with the popped configuration.
// Kernels do not run, as with cudaLaunchKernel: the kernel must be one
// __cudaGetKernel gave (non-null); the arguments, grid and block are not
// read.
RT int __cudaGetKernel(void** kernel, const void* symbol) {
  ENTER();
  if (kernel == nullptr || symbol == nullptr) return kErrorInvalidValue;
  *kernel = const_cast<void*>(symbol);
  return kSuccess;
}

RT int __cudaLaunchKernel(const void* kernel, Dim3, Dim3, void**,
                          std::size_t, void*) {
  ENTER();
  return kernel != nullptr ? kSuccess : kErrorInvalidValue;
}

// ---- NVML -------------------------------------------------------------------

namespace {
constexpr int kNvmlSuccess = 0;
constexpr int kNvmlInvalidArgument = 2;
constexpr int kNvmlInsufficientSize = 7;

void* NvmlHandle(unsigned i) {
  return reinterpret_cast<void*>(static_cast<std::uintptr_t>(0x100 + i));
}
int NvmlIndex(void* h) {
  const auto v = reinterpret_cast<std::uintptr_t>(h);
  return v >= 0x100 && v < 0x100 + static_cast<unsigned>(fg::Opts().count)
             ? static_cast<int>(v - 0x100)
             : -1;
}
void BusId(int d, char* out, std::size_t n) {
  std::snprintf(out, n, "00000000:%02X:00.0", 0x18 + d * 0x10);
}
}  // namespace

RT int nvmlInit_v2() { ENTER(); return kNvmlSuccess; }
RT int nvmlInit() { return nvmlInit_v2(); }
RT int nvmlInitWithFlags(unsigned int) { return nvmlInit_v2(); }
RT int nvmlShutdown() { ENTER(); return kNvmlSuccess; }

RT const char* nvmlErrorString(int result) {
  switch (result) {
    case 0: return "Success";
    case 2: return "Invalid Argument";
    case 3: return "Not Supported (jaxlake fake GPU)";
    default: return "Unknown Error (jaxlake fake GPU)";
  }
}

RT int nvmlSystemGetDriverVersion(char* out, unsigned int n) {
  ENTER();
  if (out == nullptr || n < 8) return kNvmlInsufficientSize;
  std::snprintf(out, n, "580.65.06");
  return kNvmlSuccess;
}

RT int nvmlSystemGetCudaDriverVersion_v2(int* v) {
  ENTER();
  if (v == nullptr) return kNvmlInvalidArgument;
  *v = 13000;
  return kNvmlSuccess;
}
RT int nvmlSystemGetCudaDriverVersion(int* v) {
  return nvmlSystemGetCudaDriverVersion_v2(v);
}

RT int nvmlDeviceGetCount_v2(unsigned int* n) {
  ENTER();
  if (n == nullptr) return kNvmlInvalidArgument;
  *n = static_cast<unsigned>(fg::Opts().count);
  return kNvmlSuccess;
}
RT int nvmlDeviceGetCount(unsigned int* n) { return nvmlDeviceGetCount_v2(n); }

RT int nvmlDeviceGetHandleByIndex_v2(unsigned int i, void** h) {
  ENTER();
  if (h == nullptr || i >= static_cast<unsigned>(fg::Opts().count))
    return kNvmlInvalidArgument;
  *h = NvmlHandle(i);
  return kNvmlSuccess;
}
RT int nvmlDeviceGetHandleByIndex(unsigned int i, void** h) {
  return nvmlDeviceGetHandleByIndex_v2(i, h);
}

RT int nvmlDeviceGetHandleByPciBusId_v2(const char* id, void** h) {
  ENTER();
  if (id == nullptr || h == nullptr) return kNvmlInvalidArgument;
  for (int d = 0; d < fg::Opts().count; ++d) {
    char mine[32];
    BusId(d, mine, sizeof mine);
    if (strcasecmp(mine, id) == 0 || strcasecmp(mine + 4, id) == 0) {
      *h = NvmlHandle(static_cast<unsigned>(d));
      return kNvmlSuccess;
    }
  }
  return 6;  // NVML_ERROR_NOT_FOUND
}
RT int nvmlDeviceGetHandleByPciBusId(const char* id, void** h) {
  return nvmlDeviceGetHandleByPciBusId_v2(id, h);
}

RT int nvmlDeviceGetIndex(void* h, unsigned int* i) {
  ENTER();
  const int d = NvmlIndex(h);
  if (d < 0 || i == nullptr) return kNvmlInvalidArgument;
  *i = static_cast<unsigned>(d);
  return kNvmlSuccess;
}

RT int nvmlDeviceGetName(void* h, char* out, unsigned int n) {
  ENTER();
  if (NvmlIndex(h) < 0 || out == nullptr) return kNvmlInvalidArgument;
  std::snprintf(out, n, "%s", fg::Opts().name.c_str());
  return kNvmlSuccess;
}

RT int nvmlDeviceGetUUID(void* h, char* out, unsigned int n) {
  ENTER();
  const int d = NvmlIndex(h);
  if (d < 0 || out == nullptr) return kNvmlInvalidArgument;
  std::snprintf(out, n, "GPU-6a61786c-616b-6566-616b-6567707500%02x", d);
  return kNvmlSuccess;
}

RT int nvmlDeviceGetMinorNumber(void* h, unsigned int* minor) {
  ENTER();
  const int d = NvmlIndex(h);
  if (d < 0 || minor == nullptr) return kNvmlInvalidArgument;
  *minor = static_cast<unsigned>(d);
  return kNvmlSuccess;
}

struct NvmlMemory {  // nvmlMemory_t
  unsigned long long total, free, used;
};

RT int nvmlDeviceGetMemoryInfo(void* h, NvmlMemory* m) {
  ENTER();
  const int d = NvmlIndex(h);
  if (d < 0 || m == nullptr) return kNvmlInvalidArgument;
  m->total = fg::Opts().memory;
  m->used = fg::Used(d);
  m->free = m->total - (m->used < m->total ? m->used : m->total);
  return kNvmlSuccess;
}

RT int nvmlDeviceGetCudaComputeCapability(void* h, int* major, int* minor) {
  ENTER();
  if (NvmlIndex(h) < 0 || major == nullptr || minor == nullptr)
    return kNvmlInvalidArgument;
  *major = 9;
  *minor = 0;
  return kNvmlSuccess;
}

// H100 and H200 support MIG; the fake devices run with it disabled, as a
// GPU does until an administrator enables it (NVML_DEVICE_MIG_DISABLE, 0,
// for the current and the pending mode).
RT int nvmlDeviceGetMigMode(void* h, unsigned int* current,
                            unsigned int* pending) {
  ENTER();
  if (NvmlIndex(h) < 0 || current == nullptr || pending == nullptr)
    return kNvmlInvalidArgument;
  *current = 0;
  *pending = 0;
  return kNvmlSuccess;
}

struct NvmlPciInfo {  // nvmlPciInfo_t
  char bus_id_legacy[16];
  unsigned domain, bus, device, pci_device_id, pci_subsystem_id;
  char bus_id[32];
};

RT int nvmlDeviceGetPciInfo_v3(void* h, NvmlPciInfo* info) {
  ENTER();
  const int d = NvmlIndex(h);
  if (d < 0 || info == nullptr) return kNvmlInvalidArgument;
  std::memset(info, 0, sizeof *info);
  BusId(d, info->bus_id, sizeof info->bus_id);
  std::snprintf(info->bus_id_legacy, sizeof info->bus_id_legacy,
                "0000:%02X:00.0", static_cast<unsigned>((0x18 + d * 0x10) & 0xff));
  info->bus = static_cast<unsigned>(0x18 + d * 0x10);
  info->pci_device_id = 0x233010de;  // H100 SXM5's id, NVIDIA's vendor id
  return kNvmlSuccess;
}

RT int nvmlDeviceGetCurrPcieLinkGeneration(void* h, unsigned int* gen) {
  ENTER();
  if (NvmlIndex(h) < 0 || gen == nullptr) return kNvmlInvalidArgument;
  *gen = 5;
  return kNvmlSuccess;
}
RT int nvmlDeviceGetMaxPcieLinkGeneration(void* h, unsigned int* gen) {
  return nvmlDeviceGetCurrPcieLinkGeneration(h, gen);
}

RT int nvmlDeviceGetCurrPcieLinkWidth(void* h, unsigned int* width) {
  ENTER();
  if (NvmlIndex(h) < 0 || width == nullptr) return kNvmlInvalidArgument;
  *width = 16;
  return kNvmlSuccess;
}
RT int nvmlDeviceGetMaxPcieLinkWidth(void* h, unsigned int* width) {
  return nvmlDeviceGetCurrPcieLinkWidth(h, width);
}

// The fake devices have no NVLink and no fabric: NVML answers so, as it
// does on a GPU without them (these are not unknown calls, so not logged).
RT int nvmlDeviceGetNvLinkState(void* h, unsigned int, int*) {
  ENTER();
  return NvmlIndex(h) < 0 ? kNvmlInvalidArgument : 3;  // NOT_SUPPORTED
}
// Fabric info (multi-node NVLink): the call succeeds and the state says
// NVML_GPU_FABRIC_STATE_NOT_SUPPORTED (0), as for a GPU on no NVLink fabric.
// nvmlGpuFabricInfo_t: clusterUuid[16], status, cliqueId, state (a byte);
// nvmlGpuFabricInfo_v2_t puts a version first and a healthMask last (36
// bytes, version nvmlGpuFabricInfo_v2 = 36 | 2 << 24).
RT int nvmlDeviceGetGpuFabricInfoV(void* h, unsigned char* info) {
  ENTER();
  if (NvmlIndex(h) < 0 || info == nullptr) return kNvmlInvalidArgument;
  unsigned int version = 0;
  std::memcpy(&version, info, 4);
  if ((version >> 24) < 2 || (version & 0xFFFFFF) < 36)
    return 25;  // NVML_ERROR_ARGUMENT_VERSION_MISMATCH
  std::memset(info + 4, 0, 32);  // no cluster, no clique, NOT_SUPPORTED
  return kNvmlSuccess;
}
RT int nvmlDeviceGetGpuFabricInfo(void* h, unsigned char* info) {
  ENTER();
  if (NvmlIndex(h) < 0 || info == nullptr) return kNvmlInvalidArgument;
  std::memset(info, 0, 28);
  return kNvmlSuccess;
}

// Field values (nvmlFieldValue_t: fieldId, scopeId, timestamp, latencyUsec,
// valueType, nvmlReturn, an 8-byte value). The call succeeds; each field
// the fake knows gets its value, every other one NVML_ERROR_NOT_SUPPORTED
// in its own nvmlReturn, as NVML answers for a field a GPU lacks. Known:
// NVML_FI_DEV_NVLINK_LINK_COUNT (91), 0, since the fake has no NVLink.
struct NvmlFieldValue {
  unsigned int field_id;
  unsigned int scope_id;
  long long timestamp;
  long long latency_us;
  int value_type;
  int nvml_return;
  unsigned long long value;
};
static_assert(sizeof(NvmlFieldValue) == 40, "nvmlFieldValue_t");
RT int nvmlDeviceGetFieldValues(void* h, int count, NvmlFieldValue* values) {
  ENTER();
  if (NvmlIndex(h) < 0 || count < 0 || (count > 0 && values == nullptr))
    return kNvmlInvalidArgument;
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  for (int i = 0; i < count; ++i) {
    NvmlFieldValue& v = values[i];
    v.timestamp = static_cast<long long>(ts.tv_sec) * 1000000 +
                  ts.tv_nsec / 1000;
    v.latency_us = 0;
    v.value = 0;
    if (v.field_id == 91) {  // NVML_FI_DEV_NVLINK_LINK_COUNT
      v.value_type = 1;      // NVML_VALUE_TYPE_UNSIGNED_INT
      v.nvml_return = kNvmlSuccess;
    } else {
      v.value_type = 0;
      v.nvml_return = 3;  // NVML_ERROR_NOT_SUPPORTED
    }
  }
  return kNvmlSuccess;
}

// Confidential computing (nvmlConfComputeSystemState_t: environment,
// ccFeature, devToolsMode): unavailable, disabled, off.
RT int nvmlSystemGetConfComputeState(unsigned int* state) {
  ENTER();
  if (state == nullptr) return kNvmlInvalidArgument;
  state[0] = state[1] = state[2] = 0;
  return kNvmlSuccess;
}
