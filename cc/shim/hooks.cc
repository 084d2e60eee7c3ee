// jaxlake shim: the hooked driver entry points.
//
// XLA's cuda_async allocator gets every device buffer with
// cuMemAllocFromPoolAsync(&ptr, size, pool, stream) from the device's default
// pool and gives it back with cuMemFreeAsync(ptr, stream). Here the lake of
// that device serves both; everything else (other pools, requests on a
// stream being captured into a graph, frees of pointers the lakes do not
// own, every call while the shim is inactive) goes to the real driver.
// cuMemPoolGetAttribute reports the lake's bytes for the default pools, and
// cuGetProcAddress hands out these functions for the hooked names, so
// callers that look entry points up by name (cudart, cuBLAS, NCCL) reach
// them too.
//
// No C++ exception leaves these functions: each body runs inside a
// catch-all that turns one into CUDA_ERROR_UNKNOWN.
#include <dlfcn.h>

#include <cstdio>
#include <cstring>

#include "cc/shim/lakes.h"
#include "cc/shim/loader.h"
#include "cc/vmm/cuda_types.h"

#define JAXLAKE_SHIM_EXPORT extern "C" __attribute__((visibility("default")))

using jaxlake::cuda::CUdeviceptr;
using jaxlake::cuda::CUmemoryPool;
using jaxlake::cuda::CUresult;
using jaxlake::cuda::CUstream;
using jaxlake::cuda::cuuint64_t;

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
JAXLAKE_SHIM_EXPORT CUresult cuGetProcAddress(const char* symbol, void** pfn,
                                              int cuda_version,
                                              cuuint64_t flags);
JAXLAKE_SHIM_EXPORT CUresult cuGetProcAddress_v2(const char* symbol,
                                                 void** pfn, int cuda_version,
                                                 cuuint64_t flags,
                                                 int* symbol_status);

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

// Counts one call of `hook` and finishes it: `r` as the result of a call the
// shim answered itself (`served`) or passed on.
CUresult Done(Hook hook, bool served, CUresult r) {
  HookCounter& c = Lakes::Get().counter(hook);
  (served ? c.served : c.forwarded).fetch_add(1, std::memory_order_relaxed);
  if (r != cu::CUDA_SUCCESS) c.failed.fetch_add(1, std::memory_order_relaxed);
  return r;
}

template <typename F, typename... Args>
CUresult Forward(Hook hook, F* fn, Args... args) {
  return Done(hook, false,
              fn != nullptr ? fn(args...) : cu::CUDA_ERROR_NOT_FOUND);
}

void Called(Hook hook) {
  Lakes::Get().counter(hook).calls.fetch_add(1, std::memory_order_relaxed);
}

bool Capturing(CUstream stream, bool per_thread) {
  const RealApi& real = Real().api;
  auto* query =
      per_thread ? real.StreamIsCapturing_ptsz : real.StreamIsCapturing;
  int status = cu::CU_STREAM_CAPTURE_STATUS_NONE;
  return query != nullptr && query(stream, &status) == cu::CUDA_SUCCESS &&
         status != cu::CU_STREAM_CAPTURE_STATUS_NONE;
}

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
  if (!lakes.active() || dptr == nullptr || size == 0)
    return Forward(hook, forward, dptr, size, pool, stream);
  const int device = lakes.DeviceOfPool(pool);
  Lake* lake = device >= 0 ? lakes.LakeFor(device) : nullptr;
  // A request made while the stream is being captured into a graph becomes
  // a graph allocation node: that stays with the driver.
  if (lake == nullptr || Capturing(stream, per_thread))
    return Forward(hook, forward, dptr, size, pool, stream);
  const vmm::Stream s = LakeStream(stream, per_thread);
  std::uintptr_t address = 0;
  const vmm::Status st = lake->allocate(size, s, &address);
  if (st == vmm::Status::kOk) {
    *dptr = static_cast<CUdeviceptr>(address);
    lakes.trace().Alloc(device, address, size, s);
  } else if (st == vmm::Status::kOutOfMemory) {
    std::fprintf(stderr, "jaxlake: device %d: %s\n", device,
                 lake->last_error().c_str());
  }
  return Done(hook, true, ToCu(st));
}

CUresult FreeAsync(bool per_thread, CUdeviceptr dptr, CUstream stream) {
  const Hook hook =
      per_thread ? Hook::cuMemFreeAsync_ptsz : Hook::cuMemFreeAsync;
  Called(hook);
  Lakes& lakes = Lakes::Get();
  const auto ptr = static_cast<std::uintptr_t>(dptr);
  const vmm::Stream s = LakeStream(stream, per_thread);
  if (ptr != 0 && lakes.trace().active()) {
    // The free is traced while the address is still live, so that no other
    // thread's new allocation at the same address comes before it.
    const int device = lakes.Owner(ptr);
    if (device >= 0) {
      lakes.trace().Free(device, ptr, s);
      return Done(hook, true, ToCu(lakes.Existing(device)->free(ptr, s)));
    }
  } else if (ptr != 0) {
    int device = -1;
    if (lakes.Free(ptr, s, &device)) return Done(hook, true, cu::CUDA_SUCCESS);
  }
  const RealApi& real = Real().api;
  return Forward(hook, per_thread ? real.MemFreeAsync_ptsz : real.MemFreeAsync,
                 dptr, stream);
}

CUresult PoolGetAttribute(CUmemoryPool pool, int attr, void* value) {
  const Hook hook = Hook::cuMemPoolGetAttribute;
  Called(hook);
  Lakes& lakes = Lakes::Get();
  const bool ours = attr == cu::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT ||
                    attr == cu::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH ||
                    attr == cu::CU_MEMPOOL_ATTR_USED_MEM_CURRENT ||
                    attr == cu::CU_MEMPOOL_ATTR_USED_MEM_HIGH;
  if (ours && value != nullptr && lakes.active()) {
    const int device = lakes.DeviceOfPool(pool);
    if (Lake* lake = device >= 0 ? lakes.LakeFor(device) : nullptr) {
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
      *static_cast<cuuint64_t*>(value) = static_cast<cuuint64_t>(v < 0 ? 0 : v);
      return Done(hook, true, cu::CUDA_SUCCESS);
    }
  }
  return Forward(hook, Real().api.MemPoolGetAttribute, pool, attr, value);
}

// Replaces the real driver's answer for a hooked name with the shim's
// function. Returns true when it did.
bool RewriteProcAddress(const char* symbol, void** pfn, int cuda_version,
                        cuuint64_t flags) {
  const RealDriver& real = Real();
  if (symbol == nullptr || pfn == nullptr || *pfn == nullptr ||
      real.handle == nullptr)
    return false;
  const bool per_thread_flag =
      (flags & cu::CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
  // Which variant the real driver chose: the per-thread one when asked for,
  // or when its answer is the per-thread export.
  auto per_thread = [&](const char* ptsz_name) {
    return per_thread_flag || *pfn == ::dlsym(real.handle, ptsz_name);
  };
  struct Pair {
    const char* name;
    const char* ptsz;
    void* plain;
    void* per_thread;
  };
  const Pair pairs[] = {
      {"cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync_ptsz",
       reinterpret_cast<void*>(&::cuMemAllocFromPoolAsync),
       reinterpret_cast<void*>(&::cuMemAllocFromPoolAsync_ptsz)},
      {"cuMemFreeAsync", "cuMemFreeAsync_ptsz",
       reinterpret_cast<void*>(&::cuMemFreeAsync),
       reinterpret_cast<void*>(&::cuMemFreeAsync_ptsz)},
  };
  for (const Pair& p : pairs) {
    if (std::strcmp(symbol, p.name) == 0) {
      *pfn = per_thread(p.ptsz) ? p.per_thread : p.plain;
      return true;
    }
    if (std::strcmp(symbol, p.ptsz) == 0) {
      *pfn = p.per_thread;
      return true;
    }
  }
  if (std::strcmp(symbol, "cuMemPoolGetAttribute") == 0) {
    *pfn = reinterpret_cast<void*>(&::cuMemPoolGetAttribute);
    return true;
  }
  if (std::strcmp(symbol, "cuGetProcAddress") == 0) {
    // Versions before 12.0 get the four-argument function.
    const bool legacy =
        *pfn == reinterpret_cast<void*>(real.api.GetProcAddress) ||
        (*pfn != reinterpret_cast<void*>(real.api.GetProcAddress_v2) &&
         cuda_version < 12000);
    *pfn = legacy ? reinterpret_cast<void*>(&::cuGetProcAddress)
                  : reinterpret_cast<void*>(&::cuGetProcAddress_v2);
    return true;
  }
  if (std::strcmp(symbol, "cuGetProcAddress_v2") == 0) {
    *pfn = reinterpret_cast<void*>(&::cuGetProcAddress_v2);
    return true;
  }
  return false;
}

CUresult GetProcAddress(Hook hook, const char* symbol, void** pfn,
                        int cuda_version, cuuint64_t flags,
                        int* symbol_status) {
  Called(hook);
  const RealApi& real = Real().api;
  CUresult r;
  if (hook == Hook::cuGetProcAddress_v2 && real.GetProcAddress_v2 != nullptr) {
    r = real.GetProcAddress_v2(symbol, pfn, cuda_version, flags,
                               symbol_status);
  } else if (real.GetProcAddress != nullptr) {
    // The four-argument form (also for a _v2 call on a driver before 12.0).
    r = real.GetProcAddress(symbol, pfn, cuda_version, flags);
    if (symbol_status != nullptr)
      *symbol_status = r == cu::CUDA_SUCCESS
                           ? cu::CU_GET_PROC_ADDRESS_SUCCESS
                           : cu::CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  } else {
    return Done(hook, false, cu::CUDA_ERROR_NOT_FOUND);
  }
  const bool found =
      r == cu::CUDA_SUCCESS &&
      (symbol_status == nullptr ||
       *symbol_status == cu::CU_GET_PROC_ADDRESS_SUCCESS);
  const bool rewritten =
      found && RewriteProcAddress(symbol, pfn, cuda_version, flags);
  return Done(hook, rewritten, r);
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
