// jaxlake: the CUDA driver backend.
//
// CudaDriver implements the Driver interface for one GPU with the CUDA
// virtual memory management (VMM) API of the real driver library. The
// library is opened at run time with dlopen from an absolute path: nothing
// links against libcuda, and the build needs no CUDA toolkit (the types come
// from cuda_types.h).
//
//   reserve / address_free   cuMemAddressReserve / cuMemAddressFree
//   create  / release        cuMemCreate (pinned, this device) / cuMemRelease
//   map     / unmap          cuMemMap / cuMemUnmap
//   set_access               cuMemSetAccess, one call per range: read-write
//                            for this device and, by default, for every
//                            device that can access its memory as a peer
//                            (as XLA's cuda_async allocator gives peers
//                            access to its pool)
//   event_*                  cuEventCreate (timing disabled), cuEventRecord,
//                            cuEventQuery, cuEventSynchronize, cuEventDestroy
//
// The driver retains the device's primary context for its lifetime and makes
// it current around every call when the calling thread has another one (or
// none), restoring the caller's afterwards. One CudaDriver (and one lake)
// per device.
//
// Resources: the library handle and the primary context are owned (RAII).
// Memory handles, reservations, mappings and events are owned by the caller
// (the lake gives them all back); any still alive when the driver is
// destroyed are returned then, mappings first.
#ifndef JAXLAKE_VMM_CUDA_DRIVER_H_
#define JAXLAKE_VMM_CUDA_DRIVER_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cc/vmm/cuda_types.h"
#include "cc/vmm/driver.h"

namespace jaxlake::vmm {

// The driver entry points jaxlake calls, by their exported names.
// X(member, exported symbol, parameter list); every one returns CUresult.
#define JAXLAKE_CUDA_API(X)                                                  \
  X(Init, "cuInit", (unsigned int flags))                                   \
  X(DriverGetVersion, "cuDriverGetVersion", (int* version))                 \
  X(DeviceGetCount, "cuDeviceGetCount", (int* count))                       \
  X(DeviceGet, "cuDeviceGet", (cuda::CUdevice * device, int ordinal))       \
  X(DeviceGetAttribute, "cuDeviceGetAttribute",                             \
    (int* value, int attribute, cuda::CUdevice device))                     \
  X(DeviceCanAccessPeer, "cuDeviceCanAccessPeer",                           \
    (int* can, cuda::CUdevice device, cuda::CUdevice peer))                 \
  X(DeviceTotalMem, "cuDeviceTotalMem_v2",                                  \
    (std::size_t * bytes, cuda::CUdevice device))                           \
  X(PrimaryCtxRetain, "cuDevicePrimaryCtxRetain",                           \
    (cuda::CUcontext * ctx, cuda::CUdevice device))                         \
  X(PrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2",                      \
    (cuda::CUdevice device))                                                \
  X(CtxGetCurrent, "cuCtxGetCurrent", (cuda::CUcontext * ctx))              \
  X(CtxSetCurrent, "cuCtxSetCurrent", (cuda::CUcontext ctx))                \
  X(MemGetAllocationGranularity, "cuMemGetAllocationGranularity",           \
    (std::size_t * granularity, const cuda::CUmemAllocationProp* prop,      \
     int option))                                                           \
  X(MemAddressReserve, "cuMemAddressReserve",                               \
    (cuda::CUdeviceptr * ptr, std::size_t size, std::size_t alignment,      \
     cuda::CUdeviceptr addr, unsigned long long flags))                     \
  X(MemAddressFree, "cuMemAddressFree",                                     \
    (cuda::CUdeviceptr ptr, std::size_t size))                              \
  X(MemCreate, "cuMemCreate",                                               \
    (cuda::CUmemGenericAllocationHandle * handle, std::size_t size,         \
     const cuda::CUmemAllocationProp* prop, unsigned long long flags))      \
  X(MemRelease, "cuMemRelease", (cuda::CUmemGenericAllocationHandle handle)) \
  X(MemMap, "cuMemMap",                                                     \
    (cuda::CUdeviceptr ptr, std::size_t size, std::size_t offset,           \
     cuda::CUmemGenericAllocationHandle handle, unsigned long long flags))  \
  X(MemUnmap, "cuMemUnmap", (cuda::CUdeviceptr ptr, std::size_t size))      \
  X(MemSetAccess, "cuMemSetAccess",                                         \
    (cuda::CUdeviceptr ptr, std::size_t size,                               \
     const cuda::CUmemAccessDesc* desc, std::size_t count))                 \
  X(EventCreate, "cuEventCreate", (cuda::CUevent * event, unsigned int flags)) \
  X(EventDestroy, "cuEventDestroy_v2", (cuda::CUevent event))               \
  X(EventRecord, "cuEventRecord", (cuda::CUevent event, cuda::CUstream s))  \
  X(EventQuery, "cuEventQuery", (cuda::CUevent event))                      \
  X(EventSynchronize, "cuEventSynchronize", (cuda::CUevent event))

struct CudaApi {
#define JAXLAKE_X(member, symbol, params) \
  cuda::CUresult(*member) params = nullptr;
  JAXLAKE_CUDA_API(JAXLAKE_X)
#undef JAXLAKE_X
  // Optional (only for messages): cuGetErrorName.
  cuda::CUresult (*GetErrorName)(cuda::CUresult error,
                                 const char** name) = nullptr;
};

// A driver library opened with dlopen(path, RTLD_NOW | RTLD_LOCAL), and its
// entry points. Shared by the drivers of all devices; closed with the last.
class CudaLibrary {
 public:
  // Opens the library at the absolute `path` and resolves every entry point
  // of CudaApi. Returns nullptr with *error saying why when the path is not
  // absolute, the library does not load, or an entry point is missing.
  static std::shared_ptr<CudaLibrary> Open(const std::string& path,
                                           std::string* error);
  ~CudaLibrary();
  CudaLibrary(const CudaLibrary&) = delete;
  CudaLibrary& operator=(const CudaLibrary&) = delete;

  const CudaApi& api() const { return api_; }
  const std::string& path() const { return path_; }
  // "CUDA_ERROR_OUT_OF_MEMORY (2)", or "CUresult N" without cuGetErrorName.
  std::string ErrorName(cuda::CUresult r) const;

 private:
  CudaLibrary(void* handle, std::string path);
  void* handle_;
  std::string path_;
  CudaApi api_;
};

struct CudaDriverOptions {
  // Also grant read-write access to every other device that can access
  // this one's memory (cuDeviceCanAccessPeer). Should the driver refuse a
  // peer, access falls back to this device alone from then on.
  bool peer_access = true;
};

class CudaDriver : public Driver {
 public:
  // Makes a driver for device `ordinal` after checking, in order: cuInit
  // succeeds, the driver's API version is at least 10.2 (10020, the first
  // with VMM), the ordinal names a device, the device supports virtual
  // memory management, its primary context can be retained and its
  // allocation granularity is a power of two. Returns nullptr with *reason
  // naming the first check that failed.
  static std::unique_ptr<CudaDriver> Create(
      std::shared_ptr<CudaLibrary> lib, int ordinal, std::string* reason,
      const CudaDriverOptions& options = {});
  ~CudaDriver() override;

  const char* name() const override { return "cuda"; }
  std::size_t granularity() const override { return granularity_; }
  std::size_t total_memory() const override { return total_memory_; }

  int ordinal() const { return ordinal_; }
  int driver_version() const { return driver_version_; }
  const CudaLibrary& library() const { return *lib_; }
  // The CUresult of the most recent failed driver call (0 if none failed).
  cuda::CUresult last_error() const;
  // The devices set_access grants access to (this one first).
  std::vector<int> access_devices() const;
  // True when `address` lies in a virtual range this driver reserved and
  // has not freed: the shim uses it to tell the lake's addresses from the
  // driver's own pool's (one is never freed through the other).
  bool owns_address(std::uintptr_t address) const;

 protected:
  JAXLAKE_VMM_BACKEND_CALLS(, override)

 private:
  class PrimaryContext;
  class ScopedCurrent;
  struct Live;

  CudaDriver(std::shared_ptr<CudaLibrary> lib, int ordinal,
             cuda::CUdevice device, int driver_version,
             std::unique_ptr<PrimaryContext> context, std::size_t granularity,
             std::size_t total_memory, std::vector<int> peers);
  // Maps a CUresult to a Status, remembering failures in last_error_.
  Status Check(cuda::CUresult r);

  std::shared_ptr<CudaLibrary> lib_;
  const CudaApi& api_;
  const int ordinal_;
  const cuda::CUdevice device_;
  const int driver_version_;
  std::unique_ptr<PrimaryContext> context_;
  const std::size_t granularity_;
  const std::size_t total_memory_;
  // Access descriptors: this device, then its peers. set_access passes the
  // first access_count_ of them (1 once a peer was refused).
  std::vector<cuda::CUmemAccessDesc> access_;
  std::atomic<std::size_t> access_count_;
  std::unique_ptr<Live> live_;
};

// Opens the library at `libcuda_path` and makes a driver for device
// `ordinal`; nullptr with *reason on any failure (see CudaLibrary::Open and
// CudaDriver::Create).
std::unique_ptr<CudaDriver> MakeCudaDriver(
    const std::string& libcuda_path, int ordinal, std::string* reason,
    const CudaDriverOptions& options = {});

}  // namespace jaxlake::vmm

#endif  // JAXLAKE_VMM_CUDA_DRIVER_H_
