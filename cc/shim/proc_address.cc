// jaxlake shim: entry points by name. cuGetProcAddress hands out the
// shim's functions for the hooked names, so callers that look entry points
// up by name (cudart, cuBLAS, NCCL) reach them too; every other name gets
// the real driver's answer.
#include <dlfcn.h>

#include <cstring>
#include <utility>

#include "cc/shim/hooks.h"
#include "cc/shim/loader.h"
#include "cc/vmm/cuda_types.h"

namespace jaxlake::shim {
namespace {

namespace cu = jaxlake::cuda;

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
  // A name that the real driver answers with a versioned function: which
  // one it chose decides which of the shim's it gets.
  auto is = [&](const char* name) { return *pfn == ::dlsym(real.handle, name); };
  struct Pair {
    const char* name;
    const char* ptsz;  // nullptr: no per-thread variant
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
      {"cuStreamEndCapture", "cuStreamEndCapture_ptsz",
       reinterpret_cast<void*>(&::cuStreamEndCapture),
       reinterpret_cast<void*>(&::cuStreamEndCapture_ptsz)},
      {"cuStreamBeginCaptureToGraph", "cuStreamBeginCaptureToGraph_ptsz",
       reinterpret_cast<void*>(&::cuStreamBeginCaptureToGraph),
       reinterpret_cast<void*>(&::cuStreamBeginCaptureToGraph_ptsz)},
      {"cuStreamBeginCapture_v2", "cuStreamBeginCapture_v2_ptsz",
       reinterpret_cast<void*>(&::cuStreamBeginCapture_v2),
       reinterpret_cast<void*>(&::cuStreamBeginCapture_v2_ptsz)},
      {"cuMemPoolGetAttribute", nullptr,
       reinterpret_cast<void*>(&::cuMemPoolGetAttribute), nullptr},
      {"cuMemPoolTrimTo", nullptr,
       reinterpret_cast<void*>(&::cuMemPoolTrimTo), nullptr},
      {"cuMemAllocAsync", "cuMemAllocAsync_ptsz",
       reinterpret_cast<void*>(&::cuMemAllocAsync),
       reinterpret_cast<void*>(&::cuMemAllocAsync_ptsz)},
      {"cuMemAllocManaged", nullptr,
       reinterpret_cast<void*>(&::cuMemAllocManaged), nullptr},
      {"cuMemCreate", nullptr, reinterpret_cast<void*>(&::cuMemCreate),
       nullptr},
      {"cuMemRelease", nullptr, reinterpret_cast<void*>(&::cuMemRelease),
       nullptr},
      {"cuPointerGetAttribute", nullptr,
       reinterpret_cast<void*>(&::cuPointerGetAttribute), nullptr},
      {"cuPointerGetAttributes", nullptr,
       reinterpret_cast<void*>(&::cuPointerGetAttributes), nullptr},
  };
  for (const Pair& p : pairs) {
    if (std::strcmp(symbol, p.name) == 0) {
      *pfn = p.ptsz != nullptr && per_thread(p.ptsz) ? p.per_thread : p.plain;
      return true;
    }
    if (p.ptsz != nullptr && std::strcmp(symbol, p.ptsz) == 0) {
      *pfn = p.per_thread;
      return true;
    }
  }
  // cuMemAlloc, cuMemAllocPitch and cuMemFree: the driver answers with the
  // _v2 function (the shim's twin) or, for old versions, the 32-bit legacy
  // one, which is left alone.
  const std::pair<const char*, void*> versioned[] = {
      {"cuMemAlloc_v2", reinterpret_cast<void*>(&::cuMemAlloc_v2)},
      {"cuMemAllocPitch_v2", reinterpret_cast<void*>(&::cuMemAllocPitch_v2)},
      {"cuMemFree_v2", reinterpret_cast<void*>(&::cuMemFree_v2)},
      {"cuMemGetAddressRange_v2",
       reinterpret_cast<void*>(&::cuMemGetAddressRange_v2)},
  };
  for (const auto& [name, ours] : versioned) {
    const std::size_t base = std::strlen(name) - 3;  // without "_v2"
    if ((std::strncmp(symbol, name, base) == 0 && symbol[base] == '\0') ||
        std::strcmp(symbol, name) == 0) {
      if (!is(name)) return false;
      *pfn = ours;
      return true;
    }
  }
  if (std::strcmp(symbol, "cuStreamBeginCapture") == 0) {
    // The driver hands out the one-argument legacy function or _v2 (with a
    // mode) by version; the shim's twin of the one it chose.
    const bool ptds = per_thread_flag ||
                      is("cuStreamBeginCapture_ptsz") ||
                      is("cuStreamBeginCapture_v2_ptsz");
    const bool legacy = is("cuStreamBeginCapture") ||
                        is("cuStreamBeginCapture_ptsz");
    if (legacy) {
      *pfn = ptds ? reinterpret_cast<void*>(&::cuStreamBeginCapture_ptsz)
                  : reinterpret_cast<void*>(&::cuStreamBeginCapture);
    } else {
      *pfn = ptds ? reinterpret_cast<void*>(&::cuStreamBeginCapture_v2_ptsz)
                  : reinterpret_cast<void*>(&::cuStreamBeginCapture_v2);
    }
    return true;
  }
  if (std::strcmp(symbol, "cuStreamBeginCapture_ptsz") == 0) {
    *pfn = reinterpret_cast<void*>(&::cuStreamBeginCapture_ptsz);
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

}  // namespace

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

}  // namespace jaxlake::shim
