// jaxlake shim: finding and loading the real CUDA driver.
//
// The shim's SONAME is libcuda.so.1, so once it is loaded a later
// dlopen("libcuda.so.1") returns the shim itself. The real driver is
// therefore loaded by absolute path, with RTLD_LOCAL (its symbols stay out of
// the global scope, where the shim's must win):
//
//   1. $JAXLAKE_REAL_LIBCUDA, when set: that path and no other;
//   2. else libcuda.so.1 in each absolute directory of $LD_LIBRARY_PATH,
//      then in the usual driver directories (kDriverDirs in loader.cc).
//
// A candidate that resolves (realpath) to the shim's own file, or that is
// another copy of the shim (it exports jaxlake_shim_api_version), is
// skipped. Loading happens once, at the first call into the shim (a driver
// entry point or the C API), and fills the forwarding table
// (trampolines.h). Loading the shim alone costs nothing more: a process that
// never calls the driver never loads it.
#ifndef JAXLAKE_SHIM_LOADER_H_
#define JAXLAKE_SHIM_LOADER_H_

#include <string>

#include "cc/vmm/cuda_types.h"

namespace jaxlake::shim {

// The real driver's functions the shim calls itself (hooks and queries).
// Any may be null when the real driver lacks it.
struct RealApi {
  using CUresult = cuda::CUresult;
  CUresult (*MemAllocFromPoolAsync)(cuda::CUdeviceptr*, std::size_t,
                                    cuda::CUmemoryPool, cuda::CUstream);
  CUresult (*MemAllocFromPoolAsync_ptsz)(cuda::CUdeviceptr*, std::size_t,
                                         cuda::CUmemoryPool, cuda::CUstream);
  CUresult (*MemFreeAsync)(cuda::CUdeviceptr, cuda::CUstream);
  CUresult (*MemFreeAsync_ptsz)(cuda::CUdeviceptr, cuda::CUstream);
  CUresult (*MemPoolGetAttribute)(cuda::CUmemoryPool, int, void*);
  CUresult (*GetProcAddress)(const char*, void**, int, cuda::cuuint64_t);
  CUresult (*GetProcAddress_v2)(const char*, void**, int, cuda::cuuint64_t,
                                int*);
  CUresult (*DeviceGetCount)(int*);
  CUresult (*DeviceGet)(cuda::CUdevice*, int);
  CUresult (*DeviceGetDefaultMemPool)(cuda::CUmemoryPool*, cuda::CUdevice);
  CUresult (*CtxGetDevice)(cuda::CUdevice*);
  CUresult (*StreamIsCapturing)(cuda::CUstream, int*);
  CUresult (*StreamIsCapturing_ptsz)(cuda::CUstream, int*);
  CUresult (*ThreadExchangeStreamCaptureMode)(int*);
  CUresult (*MemPoolTrimTo)(cuda::CUmemoryPool, std::size_t);
  // Stream capture (the shim keeps track of open captures, hooks.cc).
  CUresult (*StreamBeginCapture)(cuda::CUstream);  // CUDA 10.0: global mode
  CUresult (*StreamBeginCapture_ptsz)(cuda::CUstream);
  CUresult (*StreamBeginCapture_v2)(cuda::CUstream, int);
  CUresult (*StreamBeginCapture_v2_ptsz)(cuda::CUstream, int);
  CUresult (*StreamBeginCaptureToGraph)(cuda::CUstream, void*, const void*,
                                        const void*, std::size_t, int);
  CUresult (*StreamBeginCaptureToGraph_ptsz)(cuda::CUstream, void*,
                                             const void*, const void*,
                                             std::size_t, int);
  CUresult (*StreamEndCapture)(cuda::CUstream, void**);
  CUresult (*StreamEndCapture_ptsz)(cuda::CUstream, void**);
  // Allocations outside the pools (the shim counts their bytes, hooks.cc).
  CUresult (*MemAlloc_v2)(cuda::CUdeviceptr*, std::size_t);
  CUresult (*MemAllocPitch_v2)(cuda::CUdeviceptr*, std::size_t*, std::size_t,
                               std::size_t, unsigned int);
  CUresult (*MemAllocManaged)(cuda::CUdeviceptr*, std::size_t, unsigned int);
  CUresult (*MemAllocAsync)(cuda::CUdeviceptr*, std::size_t, cuda::CUstream);
  CUresult (*MemAllocAsync_ptsz)(cuda::CUdeviceptr*, std::size_t,
                                 cuda::CUstream);
  CUresult (*MemFree_v2)(cuda::CUdeviceptr);
  CUresult (*MemCreate)(cuda::CUmemGenericAllocationHandle*, std::size_t,
                        const cuda::CUmemAllocationProp*,
                        unsigned long long);
  CUresult (*MemRelease)(cuda::CUmemGenericAllocationHandle);
  // Address-range queries (the shim answers them for lake allocations).
  CUresult (*MemGetAddressRange_v2)(cuda::CUdeviceptr*, std::size_t*,
                                    cuda::CUdeviceptr);
  CUresult (*PointerGetAttribute)(void*, int, cuda::CUdeviceptr);
  CUresult (*PointerGetAttributes)(unsigned int, int*, void**,
                                   cuda::CUdeviceptr);
};

struct RealDriver {
  void* handle = nullptr;  // dlopen handle, never closed; null: none found
  std::string path;        // the real driver's absolute path
  std::string self;        // the shim's own file (realpath)
  std::string error;       // why no real driver was loaded ("" if loaded)
  std::size_t forwarded = 0;  // forwarded names the real driver has
  RealApi api{};
};

// Loads the real driver on first use (thread-safe) and returns it.
const RealDriver& Real();

}  // namespace jaxlake::shim

#endif  // JAXLAKE_SHIM_LOADER_H_
