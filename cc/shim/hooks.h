// jaxlake shim: the hooked entry points the shim exports (hooked.inc is
// the list; hooks.cc defines them), and what hooks.cc and proc_address.cc
// share: a hook's call counts, and cuGetProcAddress's answer.
#ifndef JAXLAKE_SHIM_HOOKS_H_
#define JAXLAKE_SHIM_HOOKS_H_

#include <atomic>

#include "cc/shim/lakes.h"
#include "cc/vmm/cuda_types.h"

#define JAXLAKE_SHIM_EXPORT extern "C" __attribute__((visibility("default")))

using jaxlake::cuda::CUdeviceptr;
using jaxlake::cuda::CUmemoryPool;
using jaxlake::cuda::CUresult;
using jaxlake::cuda::CUstream;
using jaxlake::cuda::cuuint64_t;

// The hooked entry points (hooked.inc).
JAXLAKE_SHIM_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr* dptr,
                                                     std::size_t bytesize,
                                                     CUmemoryPool pool,
                                                     CUstream stream);
JAXLAKE_SHIM_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(
    CUdeviceptr* dptr, std::size_t bytesize, CUmemoryPool pool,
    CUstream stream);
JAXLAKE_SHIM_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr,
                                            CUstream stream);
JAXLAKE_SHIM_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr,
                                                 CUstream stream);
JAXLAKE_SHIM_EXPORT CUresult cuMemPoolGetAttribute(CUmemoryPool pool,
                                                   int attr, void* value);
JAXLAKE_SHIM_EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool,
                                             std::size_t keep);
JAXLAKE_SHIM_EXPORT CUresult cuStreamBeginCapture(CUstream stream);
JAXLAKE_SHIM_EXPORT CUresult cuStreamBeginCapture_ptsz(CUstream stream);
JAXLAKE_SHIM_EXPORT CUresult cuStreamBeginCapture_v2(CUstream stream,
                                                     int mode);
JAXLAKE_SHIM_EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream stream,
                                                          int mode);
JAXLAKE_SHIM_EXPORT CUresult cuStreamBeginCaptureToGraph(
    CUstream stream, void* graph, const void* deps, const void* edges,
    std::size_t count, int mode);
JAXLAKE_SHIM_EXPORT CUresult cuStreamBeginCaptureToGraph_ptsz(
    CUstream stream, void* graph, const void* deps, const void* edges,
    std::size_t count, int mode);
JAXLAKE_SHIM_EXPORT CUresult cuStreamEndCapture(CUstream stream,
                                                void** graph);
JAXLAKE_SHIM_EXPORT CUresult cuStreamEndCapture_ptsz(CUstream stream,
                                                     void** graph);
JAXLAKE_SHIM_EXPORT CUresult cuGetProcAddress(const char* symbol, void** pfn,
                                              int cuda_version,
                                              cuuint64_t flags);
JAXLAKE_SHIM_EXPORT CUresult cuGetProcAddress_v2(const char* symbol,
                                                 void** pfn, int cuda_version,
                                                 cuuint64_t flags,
                                                 int* symbol_status);
JAXLAKE_SHIM_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr* dptr,
                                           std::size_t bytesize);
JAXLAKE_SHIM_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr* dptr,
                                                std::size_t* pitch,
                                                std::size_t width,
                                                std::size_t height,
                                                unsigned int element);
JAXLAKE_SHIM_EXPORT CUresult cuMemAllocManaged(CUdeviceptr* dptr,
                                               std::size_t bytesize,
                                               unsigned int flags);
JAXLAKE_SHIM_EXPORT CUresult cuMemAllocAsync(CUdeviceptr* dptr,
                                             std::size_t bytesize,
                                             CUstream stream);
JAXLAKE_SHIM_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr* dptr,
                                                  std::size_t bytesize,
                                                  CUstream stream);
JAXLAKE_SHIM_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr);
JAXLAKE_SHIM_EXPORT CUresult cuMemCreate(
    jaxlake::cuda::CUmemGenericAllocationHandle* handle, std::size_t size,
    const jaxlake::cuda::CUmemAllocationProp* prop, unsigned long long flags);
JAXLAKE_SHIM_EXPORT CUresult cuMemRelease(
    jaxlake::cuda::CUmemGenericAllocationHandle handle);
JAXLAKE_SHIM_EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr* base,
                                                     std::size_t* size,
                                                     CUdeviceptr dptr);
JAXLAKE_SHIM_EXPORT CUresult cuPointerGetAttribute(void* data, int attribute,
                                                   CUdeviceptr ptr);
JAXLAKE_SHIM_EXPORT CUresult cuPointerGetAttributes(unsigned int count,
                                                    int* attributes,
                                                    void** data,
                                                    CUdeviceptr ptr);

namespace jaxlake::shim {

// Counts one call of `hook` and finishes it: `r` as the result of a call the
// shim answered itself (`served`) or passed on.
inline CUresult Done(Hook hook, bool served, CUresult r) {
  HookCounter& c = Lakes::Get().counter(hook);
  (served ? c.served : c.forwarded).fetch_add(1, std::memory_order_relaxed);
  if (r != jaxlake::cuda::CUDA_SUCCESS) c.failed.fetch_add(1, std::memory_order_relaxed);
  return r;
}

// Counts one call of `hook`.
inline void Called(Hook hook) {
  Lakes::Get().counter(hook).calls.fetch_add(1, std::memory_order_relaxed);
}

// cuGetProcAddress (`hook` says which version): the real driver's answer,
// with the shim's function for a hooked name (proc_address.cc).
CUresult GetProcAddress(Hook hook, const char* symbol, void** pfn,
                        int cuda_version, cuuint64_t flags,
                        int* symbol_status);

}  // namespace jaxlake::shim

#endif  // JAXLAKE_SHIM_HOOKS_H_
