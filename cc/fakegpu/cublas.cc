// The fake GPU's cuBLAS and cuBLASLt, by NVIDIA's names and signatures
// (cublas_api.h, cublasLt.h): handles, which keep their stream, math mode
// and pointer mode, versions and status strings, cuBLASLt's descriptors, which hold the
// attributes set on them, one heuristic algorithm a product, needing no
// workspace, and the products themselves, which are kernels: they are
// accepted and do nothing (those entry points read none of their
// arguments).
#include <atomic>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <vector>

#include "cc/fakegpu/cublas.h"
#include "cc/fakegpu/fakegpu.h"

namespace fg = jaxlake::fakegpu;

#define LIB JAXLAKE_FAKEGPU_EXPORT
#define ENTER() JAXLAKE_FAKEGPU_ENTER()

namespace {

bool Cuda13() { return fg::Opts().cuda_major == 13; }
int CublasVersion() { return Cuda13() ? 130100 : 120904; }

// cublasStatus_t (cublas_api.h).
constexpr int kSuccess = 0, kInvalidValue = 7;

// A cuBLAS or cuBLASLt handle: the stream and math mode set on it.
struct Handle {
  void* stream = nullptr;
  int math_mode = 0;  // CUBLAS_DEFAULT_MATH
  int pointer_mode = 0;  // CUBLAS_POINTER_MODE_HOST
};

struct Handles {
  std::mutex mu;
  std::map<void*, Handle> live;
};
Handles& Hs() {
  static Handles* h = new Handles;
  return *h;
}

int NewHandle(void** out) {
  if (out == nullptr) return kInvalidValue;
  static std::atomic<std::uintptr_t> next{0x3000000};
  void* h = reinterpret_cast<void*>(next.fetch_add(0x10));
  std::lock_guard<std::mutex> lock(Hs().mu);
  Hs().live[h] = Handle{};
  *out = h;
  return kSuccess;
}

// Forgets a handle (cuBLAS's and cuBLASLt's alike);
// CUBLAS_STATUS_NOT_INITIALIZED for one the fake did not create.
int DestroyHandle(void* handle) {
  std::lock_guard<std::mutex> lock(Hs().mu);
  return Hs().live.erase(handle) == 1 ? kSuccess : 1;
}

// Runs `f` on the handle's state; CUBLAS_STATUS_NOT_INITIALIZED for a
// handle the fake did not create.
template <typename F>
int WithHandle(void* h, F f) {
  std::lock_guard<std::mutex> lock(Hs().mu);
  auto it = Hs().live.find(h);
  if (it == Hs().live.end()) return 1;  // CUBLAS_STATUS_NOT_INITIALIZED
  return f(it->second);
}

// A cuBLASLt descriptor (matmul, matrix layout, preference, transform):
// the bytes of each attribute as set.
struct LtDescriptor {
  std::map<int, std::vector<unsigned char>> attrs;
};

struct LtRegistry {
  std::mutex mu;
  std::set<LtDescriptor*> live;
};
LtRegistry& Lt() {
  static LtRegistry* r = new LtRegistry;
  return *r;
}

template <typename T>
void Put(LtDescriptor* d, int attr, T value) {
  std::vector<unsigned char> bytes(sizeof value);
  std::memcpy(bytes.data(), &value, sizeof value);
  d->attrs[attr] = std::move(bytes);
}

int CreateLt(void** out, LtDescriptor* d) {
  if (out == nullptr) {
    delete d;
    return kInvalidValue;
  }
  std::lock_guard<std::mutex> lock(Lt().mu);
  Lt().live.insert(d);
  *out = d;
  return kSuccess;
}

int DestroyLt(void* p) {
  std::lock_guard<std::mutex> lock(Lt().mu);
  auto* d = static_cast<LtDescriptor*>(p);
  if (Lt().live.erase(d) == 0) return kInvalidValue;
  delete d;
  return kSuccess;
}

int SetLt(void* p, int attr, const void* buf, std::size_t size) {
  std::lock_guard<std::mutex> lock(Lt().mu);
  auto* d = static_cast<LtDescriptor*>(p);
  if (Lt().live.count(d) == 0 || (size > 0 && buf == nullptr))
    return kInvalidValue;
  const auto* b = static_cast<const unsigned char*>(buf);
  d->attrs[attr].assign(b, b + size);
  return kSuccess;
}

// As cuBLASLt: size 0 asks for the size (in *written); otherwise the size
// must be the attribute's. An attribute never set reads as zeros of the
// size asked for (cuBLASLt's defaults are mostly zero).
int GetLt(void* p, int attr, void* buf, std::size_t size,
          std::size_t* written) {
  std::lock_guard<std::mutex> lock(Lt().mu);
  auto* d = static_cast<LtDescriptor*>(p);
  if (Lt().live.count(d) == 0) return kInvalidValue;
  auto it = d->attrs.find(attr);
  if (size == 0) {
    if (written == nullptr) return kInvalidValue;
    *written = it == d->attrs.end() ? 0 : it->second.size();
    return kSuccess;
  }
  if (buf == nullptr) return kInvalidValue;
  if (it == d->attrs.end()) {
    std::memset(buf, 0, size);
  } else {
    if (it->second.size() != size) return kInvalidValue;
    std::memcpy(buf, it->second.data(), size);
  }
  if (written != nullptr) *written = size;
  return kSuccess;
}

}  // namespace

int jaxlake::fakegpu::CublasPointerMode(const void* handle) {
  std::lock_guard<std::mutex> lock(Hs().mu);
  auto it = Hs().live.find(const_cast<void*>(handle));
  return it == Hs().live.end() ? -1 : it->second.pointer_mode;
}

#define ACCEPT(name)              \
  LIB int name(void*, ...) {      \
    ENTER();                      \
    return kSuccess;              \
  }

// ---- cuBLAS -----------------------------------------------------------------

LIB int cublasCreate_v2(void** handle) {
  ENTER();
  return NewHandle(handle);
}

LIB int cublasDestroy_v2(void* handle) {
  ENTER();
  return DestroyHandle(handle);
}

LIB int cublasSetStream_v2(void* handle, void* stream) {
  ENTER();
  return WithHandle(handle, [&](Handle& h) {
    h.stream = stream;
    return kSuccess;
  });
}

LIB int cublasGetStream_v2(void* handle, void** stream) {
  ENTER();
  if (stream == nullptr) return kInvalidValue;
  return WithHandle(handle, [&](Handle& h) {
    *stream = h.stream;
    return kSuccess;
  });
}

LIB int cublasSetMathMode(void* handle, int mode) {
  ENTER();
  return WithHandle(handle, [&](Handle& h) {
    h.math_mode = mode;
    return kSuccess;
  });
}

LIB int cublasGetMathMode(void* handle, int* mode) {
  ENTER();
  if (mode == nullptr) return kInvalidValue;
  return WithHandle(handle, [&](Handle& h) {
    *mode = h.math_mode;
    return kSuccess;
  });
}

ACCEPT(cublasSetWorkspace_v2)

// The pointer mode (where the scalars are: host 0, device 1), which XLA's
// triangular solve reads, sets and restores.
LIB int cublasSetPointerMode_v2(void* handle, int mode) {
  ENTER();
  if (mode != 0 && mode != 1) return kInvalidValue;
  return WithHandle(handle, [&](Handle& h) {
    h.pointer_mode = mode;
    return kSuccess;
  });
}

LIB int cublasGetPointerMode_v2(void* handle, int* mode) {
  ENTER();
  if (mode == nullptr) return kInvalidValue;
  return WithHandle(handle, [&](Handle& h) {
    *mode = h.pointer_mode;
    return kSuccess;
  });
}

ACCEPT(cublasSetAtomicsMode)
ACCEPT(cublasSetSmCountTarget)

LIB int cublasGetVersion_v2(void*, int* v) {
  ENTER();
  if (v == nullptr) return kInvalidValue;
  *v = CublasVersion();
  return kSuccess;
}

LIB int cublasGetProperty(int type, int* value) {
  ENTER();
  if (value == nullptr) return kInvalidValue;
  const int v = CublasVersion();
  *value = type == 0 ? v / 10000 : type == 1 ? v / 100 % 100 : v % 100;
  return kSuccess;
}

LIB std::size_t cublasGetCudartVersion() { return Cuda13() ? 13000 : 12090; }

LIB const char* cublasGetStatusName(int status) {
  switch (status) {
    case 0: return "CUBLAS_STATUS_SUCCESS";
    case 1: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case 3: return "CUBLAS_STATUS_ALLOC_FAILED";
    case 7: return "CUBLAS_STATUS_INVALID_VALUE";
    case 8: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case 11: return "CUBLAS_STATUS_MAPPING_ERROR";
    case 13: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case 14: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case 15: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case 16: return "CUBLAS_STATUS_LICENSE_ERROR";
    default: return "<unknown>";
  }
}
LIB const char* cublasGetStatusString(int status) {
  return cublasGetStatusName(status);
}

// The routines (products, solves, factorizations): cublas_blas.cc.

// ---- cuBLASLt ---------------------------------------------------------------

LIB std::size_t cublasLtGetVersion() {
  return static_cast<std::size_t>(CublasVersion());
}
LIB std::size_t cublasLtGetCudartVersion() { return Cuda13() ? 13000 : 12090; }
LIB int cublasLtGetProperty(int type, int* value) {
  return cublasGetProperty(type, value);
}
LIB const char* cublasLtGetStatusString(int status) {
  return cublasGetStatusName(status);
}
LIB const char* cublasLtGetStatusName(int status) {
  return cublasGetStatusName(status);
}

LIB int cublasLtCreate(void** handle) {
  ENTER();
  return NewHandle(handle);
}

LIB int cublasLtDestroy(void* handle) {
  ENTER();
  return DestroyHandle(handle);
}

// cublasLtMatmulDescAttributes_t: COMPUTE_TYPE 0, SCALE_TYPE 1 (int32).
LIB int cublasLtMatmulDescCreate(void** desc, int compute_type,
                                 int scale_type) {
  ENTER();
  auto* d = new LtDescriptor;
  Put<std::int32_t>(d, 0, compute_type);
  Put<std::int32_t>(d, 1, scale_type);
  return CreateLt(desc, d);
}
LIB int cublasLtMatmulDescDestroy(void* desc) {
  ENTER();
  return DestroyLt(desc);
}
LIB int cublasLtMatmulDescSetAttribute(void* desc, int attr, const void* buf,
                                       std::size_t size) {
  ENTER();
  return SetLt(desc, attr, buf, size);
}
LIB int cublasLtMatmulDescGetAttribute(void* desc, int attr, void* buf,
                                       std::size_t size,
                                       std::size_t* written) {
  ENTER();
  return GetLt(desc, attr, buf, size, written);
}

// cublasLtMatrixLayoutAttribute_t: TYPE 0 (uint32), ROWS 2, COLS 3
// (uint64), LD 4 (int64).
LIB int cublasLtMatrixLayoutCreate(void** layout, int type,
                                   std::uint64_t rows, std::uint64_t cols,
                                   std::int64_t ld) {
  ENTER();
  auto* d = new LtDescriptor;
  Put<std::uint32_t>(d, 0, static_cast<std::uint32_t>(type));
  Put<std::uint64_t>(d, 2, rows);
  Put<std::uint64_t>(d, 3, cols);
  Put<std::int64_t>(d, 4, ld);
  return CreateLt(layout, d);
}
LIB int cublasLtMatrixLayoutDestroy(void* layout) {
  ENTER();
  return DestroyLt(layout);
}
LIB int cublasLtMatrixLayoutSetAttribute(void* layout, int attr,
                                         const void* buf, std::size_t size) {
  ENTER();
  return SetLt(layout, attr, buf, size);
}
LIB int cublasLtMatrixLayoutGetAttribute(void* layout, int attr, void* buf,
                                         std::size_t size,
                                         std::size_t* written) {
  ENTER();
  return GetLt(layout, attr, buf, size, written);
}

LIB int cublasLtMatmulPreferenceCreate(void** pref) {
  ENTER();
  return CreateLt(pref, new LtDescriptor);
}
LIB int cublasLtMatmulPreferenceDestroy(void* pref) {
  ENTER();
  return DestroyLt(pref);
}
LIB int cublasLtMatmulPreferenceSetAttribute(void* pref, int attr,
                                             const void* buf,
                                             std::size_t size) {
  ENTER();
  return SetLt(pref, attr, buf, size);
}
LIB int cublasLtMatmulPreferenceGetAttribute(void* pref, int attr, void* buf,
                                             std::size_t size,
                                             std::size_t* written) {
  ENTER();
  return GetLt(pref, attr, buf, size, written);
}

ACCEPT(cublasLtMatmulAlgoConfigSetAttribute)
ACCEPT(cublasLtMatmul)
ACCEPT(cublasLtMatrixTransform)

struct HeuristicResult {  // cublasLtMatmulHeuristicResult_t
  std::uint64_t algo[8];    // cublasLtMatmulAlgo_t
  std::size_t workspace_size;
  int state;
  float waves_count;
  int reserved[4];
};

// One algorithm, needing no workspace, for every product.
LIB int cublasLtMatmulAlgoGetHeuristic(void*, void*, void*, void*, void*,
                                       void*, void*, int requested,
                                       HeuristicResult* results,
                                       int* returned) {
  ENTER();
  if (results == nullptr || returned == nullptr || requested <= 0)
    return kInvalidValue;
  std::memset(&results[0], 0, sizeof results[0]);
  results[0].waves_count = 1.0f;
  *returned = 1;
  return kSuccess;
}

LIB int cublasLtMatmulAlgoInit(void*, int, int, int, int, int, int, int id,
                               std::uint64_t* algo) {
  ENTER();
  if (algo == nullptr) return kInvalidValue;
  std::memset(algo, 0, 8 * sizeof *algo);
  algo[0] = static_cast<std::uint64_t>(id);
  return kSuccess;
}

LIB int cublasLtMatmulAlgoCheck(void*, void*, void*, void*, void*, void*,
                                const void*, HeuristicResult* result) {
  ENTER();
  if (result == nullptr) return kInvalidValue;
  std::memset(result, 0, sizeof *result);
  result->waves_count = 1.0f;
  return kSuccess;
}

// (handle, computeType, scaleType, Atype, Btype, Ctype, Dtype, requested,
// ids, returned): algorithm 0 only.
LIB int cublasLtMatmulAlgoGetIds(void*, int, int, int, int, int, int,
                                 int requested, int* ids, int* returned) {
  ENTER();
  if (ids == nullptr || returned == nullptr || requested <= 0)
    return kInvalidValue;
  ids[0] = 0;
  *returned = 1;
  return kSuccess;
}
