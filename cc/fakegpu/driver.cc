// The fake GPU's CUDA driver API (libcuda.so.1 behind the shim), its shared
// state (driver.h) and what belongs to no API area: errors and entry points
// by name. cuGetExportTable, the door to NVIDIA's private tables, is
// refused: the fake implements no private interface (fakegpu.h). The API areas have files of their own (README.md).
#include <dlfcn.h>

#include <cstring>
#include <mutex>
#include <string>

#include "cc/fakegpu/driver.h"
#include "cc/fakegpu/fakegpu.h"
#include "cc/vmm/cuda_types.h"

using namespace jaxlake::cuda;            // NOLINT: the driver's vocabulary
using namespace jaxlake::fakegpu::driver;  // NOLINT: its shared state
namespace fg = jaxlake::fakegpu;

namespace jaxlake::fakegpu::driver {

Driver& D() {
  static Driver* const d = [] {
    auto* p = new Driver();
    const int n = fg::Opts().count;
    p->primary_refs.assign(n, 0);
    p->pool_used.assign(n, 0);
    p->pool_high.assign(n, 0);
    p->release_threshold.assign(n, 0);
    p->pool_cached.assign(n, 0);
    p->pool_freeing.assign(n, 0);
    p->pool_reserved_high.assign(n, 0);
    return p;
  }();
  return *d;
}

CUresult NeedInit() {
  Driver& d = D();
  std::lock_guard<std::mutex> lock(d.mu);
  return d.initialized ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
}

CUresult NeedContext(int* device) {
  if (CUresult r = NeedInit(); r != CUDA_SUCCESS) return r;
  const int dev = fg::CurrentDevice();
  if (dev < 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (device != nullptr) *device = dev;
  return CUDA_SUCCESS;
}


fg::Stream* StreamFor(CUstream s) {
  return fg::StreamOf(s, fg::CurrentDevice());
}

}  // namespace jaxlake::fakegpu::driver

namespace {

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

extern "C" {

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
  // Where CUDA 12 changed a function's signature under its old name.
  if (name == "cuGraphInstantiate" && version >= 12000)
    return ::dlsym(Self(), "cuGraphInstantiateWithFlags");
  if (name == "cuStreamGetCaptureInfo" && version >= 12030)
    return ::dlsym(Self(), "cuStreamGetCaptureInfo_v3");
  if ((flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0) {
    // The _v2 per-thread variant before the legacy one, as for the plain
    // names (cuStreamBeginCapture's).
    if (void* fn = ::dlsym(Self(), (name + "_v2_ptsz").c_str())) return fn;
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

// ---- figures for the tests (cc/fakegpu/control.h) -------------------------

// With shared device memory (JAXLAKE_FAKEGPU_SHARED): each process's bytes
// on `device`, up to `max` of them in pids and used; returns the number of
// processes with a slot (those that created device memory since they
// started), or -1 when the memory is not shared.
__attribute__((visibility("default"))) int jaxlake_fakegpu_shared_usage(
    int device, int* pids, unsigned long long* used, int max) {
  return fg::SharedUsage(device, pids, used, max);
}

}  // extern "C"
