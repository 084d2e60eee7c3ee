// The fake GPU's math and communication libraries: cuDNN, cuBLAS, cuBLASLt
// and NCCL handles, descriptors and operations (an operation is a kernel,
// so it is accepted and does nothing), and the version calls of cuFFT, CUPTI,
// cuSPARSE and cuSOLVER that JAX's start-up checks. The versions reported
// are at or above what JAX's CUDA 12 and CUDA 13 plugins are built against.
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "cc/fakegpu/fakegpu.h"

namespace fg = jaxlake::fakegpu;

namespace {

bool Cuda13() { return fg::Opts().cuda_major == 13; }

// Distinct handles for the objects the libraries create; never
// dereferenced by their users.
void* NewHandle() {
  static std::atomic<std::uintptr_t> next{0x3000000};
  return reinterpret_cast<void*>(next.fetch_add(0x10));
}

#define ENTER() JAXLAKE_FAKEGPU_ENTER()

#define CREATE(name, type)          \
  extern "C" __attribute__((visibility("default"))) int name(type* h, ...) { \
    ENTER();                        \
    if (h == nullptr) return 7;     \
    *h = NewHandle();               \
    return 0;                       \
  }
#define ACCEPT(name)                                                       \
  extern "C" __attribute__((visibility("default"))) int name(void*, ...) { \
    ENTER();                                                               \
    return 0;                                                              \
  }

constexpr int kCudnnMajor = 9, kCudnnMinor = 19, kCudnnPatch = 0;

}  // namespace

#define LIB extern "C" __attribute__((visibility("default")))

// ---- cuDNN ------------------------------------------------------------------

LIB std::size_t cudnnGetVersion() {
  return kCudnnMajor * 10000 + kCudnnMinor * 100 + kCudnnPatch;
}
LIB std::size_t cudnnGetCudartVersion() { return Cuda13() ? 13000 : 12090; }
LIB std::size_t cudnnGetMaxDeviceVersion() { return 1200; }

LIB int cudnnGetProperty(int type, int* value) {
  ENTER();
  if (value == nullptr) return 2000;  // CUDNN_STATUS_BAD_PARAM
  *value = type == 0 ? kCudnnMajor : type == 1 ? kCudnnMinor : kCudnnPatch;
  return 0;
}

LIB const char* cudnnGetErrorString(int status) {
  return status == 0 ? "CUDNN_STATUS_SUCCESS"
                     : "CUDNN_STATUS_NOT_SUPPORTED (jaxlake fake GPU)";
}

LIB void cudnnGetLastErrorString(char* message, std::size_t n) {
  if (message != nullptr && n > 0) message[0] = '\0';
}

CREATE(cudnnCreate, void*)
ACCEPT(cudnnDestroy)
ACCEPT(cudnnSetStream)

LIB int cudnnGetStream(void*, void** stream) {
  ENTER();
  if (stream != nullptr) *stream = nullptr;
  return 0;
}

// ---- cuBLAS -----------------------------------------------------------------

namespace {
int CublasVersion() { return Cuda13() ? 130100 : 120904; }
}  // namespace

CREATE(cublasCreate_v2, void*)
ACCEPT(cublasDestroy_v2)
ACCEPT(cublasSetStream_v2)
ACCEPT(cublasSetWorkspace_v2)
ACCEPT(cublasSetMathMode)
ACCEPT(cublasSetPointerMode_v2)
ACCEPT(cublasSetAtomicsMode)
ACCEPT(cublasSetSmCountTarget)

LIB int cublasGetVersion_v2(void*, int* v) {
  ENTER();
  if (v == nullptr) return 7;  // CUBLAS_STATUS_INVALID_VALUE
  *v = CublasVersion();
  return 0;
}

LIB int cublasGetProperty(int type, int* value) {
  ENTER();
  if (value == nullptr) return 7;
  const int v = CublasVersion();
  *value = type == 0 ? v / 10000 : type == 1 ? v / 100 % 100 : v % 100;
  return 0;
}

LIB int cublasGetMathMode(void*, int* mode) {
  ENTER();
  if (mode != nullptr) *mode = 0;
  return 0;
}

LIB int cublasGetStream_v2(void*, void** stream) {
  ENTER();
  if (stream != nullptr) *stream = nullptr;
  return 0;
}

LIB std::size_t cublasGetCudartVersion() { return Cuda13() ? 13000 : 12090; }
LIB const char* cublasGetStatusString(int status) {
  return status == 0 ? "CUBLAS_STATUS_SUCCESS"
                     : "CUBLAS_STATUS_NOT_SUPPORTED (jaxlake fake GPU)";
}
LIB const char* cublasGetStatusName(int status) {
  return status == 0 ? "CUBLAS_STATUS_SUCCESS" : "CUBLAS_STATUS_NOT_SUPPORTED";
}

// The matrix products XLA calls: kernels, which do not run.
ACCEPT(cublasGemmEx)
ACCEPT(cublasGemmBatchedEx)
ACCEPT(cublasGemmStridedBatchedEx)
ACCEPT(cublasSgemm_v2)
ACCEPT(cublasDgemm_v2)
ACCEPT(cublasHgemm)
ACCEPT(cublasCgemm_v2)
ACCEPT(cublasZgemm_v2)
ACCEPT(cublasSgemmStridedBatched)
ACCEPT(cublasDgemmStridedBatched)
ACCEPT(cublasHgemmStridedBatched)
ACCEPT(cublasCgemmStridedBatched)
ACCEPT(cublasZgemmStridedBatched)
ACCEPT(cublasSgemmBatched)
ACCEPT(cublasDgemmBatched)
ACCEPT(cublasStrsmBatched)
ACCEPT(cublasDtrsmBatched)
ACCEPT(cublasStrsm_v2)
ACCEPT(cublasDtrsm_v2)

// ---- cuBLASLt ---------------------------------------------------------------

LIB std::size_t cublasLtGetVersion() {
  return static_cast<std::size_t>(CublasVersion());
}
LIB std::size_t cublasLtGetCudartVersion() { return Cuda13() ? 13000 : 12090; }
LIB int cublasLtGetProperty(int type, int* value) {
  return cublasGetProperty(type, value);
}
LIB const char* cublasLtGetStatusString(int status) {
  return cublasGetStatusString(status);
}
LIB const char* cublasLtGetStatusName(int status) {
  return cublasGetStatusName(status);
}

CREATE(cublasLtCreate, void*)
ACCEPT(cublasLtDestroy)
CREATE(cublasLtMatmulDescCreate, void*)
ACCEPT(cublasLtMatmulDescDestroy)
ACCEPT(cublasLtMatmulDescSetAttribute)
CREATE(cublasLtMatrixLayoutCreate, void*)
ACCEPT(cublasLtMatrixLayoutDestroy)
ACCEPT(cublasLtMatrixLayoutSetAttribute)
CREATE(cublasLtMatmulPreferenceCreate, void*)
ACCEPT(cublasLtMatmulPreferenceDestroy)
ACCEPT(cublasLtMatmulPreferenceSetAttribute)
ACCEPT(cublasLtMatmulAlgoConfigSetAttribute)
ACCEPT(cublasLtMatmul)
ACCEPT(cublasLtMatrixTransform)

LIB int cublasLtMatmulDescGetAttribute(void*, int, void* buf,
                                       std::size_t size,
                                       std::size_t* written) {
  ENTER();
  if (buf != nullptr) std::memset(buf, 0, size);
  if (written != nullptr) *written = size;
  return 0;
}

LIB int cublasLtMatrixLayoutGetAttribute(void*, int, void* buf,
                                         std::size_t size,
                                         std::size_t* written) {
  ENTER();
  if (buf != nullptr) std::memset(buf, 0, size);
  if (written != nullptr) *written = size;
  return 0;
}

struct HeuristicResult {  // cublasLtMatmulHeuristicResult_t
  std::uint64_t algo[8];
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
  if (results == nullptr || returned == nullptr || requested <= 0) return 7;
  std::memset(&results[0], 0, sizeof results[0]);
  results[0].waves_count = 1.0f;
  *returned = 1;
  return 0;
}

LIB int cublasLtMatmulAlgoInit(void*, int, int, int, int, int, int, int id,
                               std::uint64_t* algo) {
  ENTER();
  if (algo == nullptr) return 7;
  std::memset(algo, 0, 8 * sizeof *algo);
  algo[0] = static_cast<std::uint64_t>(id);
  return 0;
}

LIB int cublasLtMatmulAlgoCheck(void*, void*, void*, void*, void*, void*,
                                const void*, HeuristicResult* result) {
  ENTER();
  if (result != nullptr) {
    std::memset(result, 0, sizeof *result);
    result->waves_count = 1.0f;
  }
  return 0;
}

LIB int cublasLtMatmulAlgoGetIds(void*, int, int, int, int, int, int requested,
                                 int* ids, int* returned) {
  ENTER();
  if (ids == nullptr || returned == nullptr || requested <= 0) return 7;
  ids[0] = 0;
  *returned = 1;
  return 0;
}

// ---- NCCL (collectives are kernels: they do not run) ------------------------

namespace {
struct Comm {
  int nranks;
  int rank;
  int device;
};
}  // namespace

LIB int ncclGetVersion(int* v) {
  ENTER();
  if (v == nullptr) return 4;  // ncclInvalidArgument
  *v = 22703;                  // 2.27.3
  return 0;
}

LIB int ncclGetUniqueId(unsigned char* id) {
  ENTER();
  if (id == nullptr) return 4;
  static std::atomic<unsigned> n{0};
  std::memset(id, 0, 128);
  std::snprintf(reinterpret_cast<char*>(id), 128, "jaxlake-fakegpu-%u",
                n.fetch_add(1));
  return 0;
}

namespace {
int NewComm(void** comm, int nranks, int rank) {
  if (comm == nullptr || nranks <= 0 || rank < 0 || rank >= nranks) return 4;
  const int d = fg::CurrentDevice();
  *comm = new Comm{nranks, rank, d < 0 ? 0 : d};
  return 0;
}
}  // namespace

struct UniqueId {
  unsigned char internal[128];
};

LIB int ncclCommInitRank(void** comm, int nranks, UniqueId, int rank) {
  ENTER();
  return NewComm(comm, nranks, rank);
}

LIB int ncclCommInitRankConfig(void** comm, int nranks, UniqueId, int rank,
                               void*) {
  ENTER();
  return NewComm(comm, nranks, rank);
}

LIB int ncclCommInitAll(void** comms, int n, const int*) {
  ENTER();
  if (comms == nullptr) return 4;
  for (int i = 0; i < n; ++i)
    if (int r = NewComm(&comms[i], n, i); r != 0) return r;
  return 0;
}

LIB int ncclCommSplit(void* comm, int color, int key, void** out, void*) {
  ENTER();
  if (out == nullptr) return 4;
  if (color < 0) {  // NCCL_SPLIT_NOCOLOR
    *out = nullptr;
    return 0;
  }
  const Comm* c = static_cast<const Comm*>(comm);
  const int n = c != nullptr ? c->nranks : 1;
  return NewComm(out, n, key >= 0 && key < n ? key : 0);
}

LIB int ncclCommDestroy(void* comm) {
  ENTER();
  delete static_cast<Comm*>(comm);
  return 0;
}
LIB int ncclCommAbort(void* comm) { return ncclCommDestroy(comm); }
ACCEPT(ncclCommFinalize)

LIB int ncclCommCount(const void* comm, int* n) {
  ENTER();
  if (comm == nullptr || n == nullptr) return 4;
  *n = static_cast<const Comm*>(comm)->nranks;
  return 0;
}
LIB int ncclCommUserRank(const void* comm, int* rank) {
  ENTER();
  if (comm == nullptr || rank == nullptr) return 4;
  *rank = static_cast<const Comm*>(comm)->rank;
  return 0;
}
LIB int ncclCommCuDevice(const void* comm, int* device) {
  ENTER();
  if (comm == nullptr || device == nullptr) return 4;
  *device = static_cast<const Comm*>(comm)->device;
  return 0;
}
LIB int ncclCommGetAsyncError(void*, int* result) {
  ENTER();
  if (result == nullptr) return 4;
  *result = 0;
  return 0;
}
LIB const char* ncclGetErrorString(int result) {
  return result == 0 ? "no error" : "invalid usage (jaxlake fake GPU)";
}
LIB const char* ncclGetLastError(void*) { return ""; }

extern "C" __attribute__((visibility("default"))) int ncclGroupStart() {
  ENTER();
  return 0;
}
extern "C" __attribute__((visibility("default"))) int ncclGroupEnd() {
  ENTER();
  return 0;
}
ACCEPT(ncclAllReduce)
ACCEPT(ncclAllGather)
ACCEPT(ncclReduceScatter)
ACCEPT(ncclBroadcast)
ACCEPT(ncclReduce)
ACCEPT(ncclSend)
ACCEPT(ncclRecv)
ACCEPT(ncclAllToAll)

// ---- the version calls of JAX's start-up check ------------------------------

namespace {
int CufftVersion() { return Cuda13() ? 12000 : 11400; }
}  // namespace

LIB int cufftGetVersion(int* v) {
  ENTER();
  if (v == nullptr) return 4;
  *v = CufftVersion();
  return 0;
}

LIB int cufftGetProperty(int type, int* value) {
  ENTER();
  if (value == nullptr) return 4;
  const int v = CufftVersion();
  *value = type == 0 ? v / 1000 : type == 1 ? v / 100 % 10 : 0;
  return 0;
}

LIB int cuptiGetVersion(std::uint32_t* v) {
  ENTER();
  if (v == nullptr) return 1;
  *v = 28;
  return 0;
}

LIB int cusparseGetProperty(int type, int* value) {
  ENTER();
  if (value == nullptr) return 3;  // CUSPARSE_STATUS_INVALID_VALUE
  *value = type == 0 ? 12 : type == 1 ? (Cuda13() ? 6 : 5) : 10;
  return 0;
}

LIB int cusparseGetVersion(void*, int* v) {
  ENTER();
  if (v == nullptr) return 3;
  *v = Cuda13() ? 12610 : 12510;
  return 0;
}

LIB int cusolverGetProperty(int type, int* value) {
  ENTER();
  if (value == nullptr) return 3;
  *value = type == 0 ? (Cuda13() ? 12 : 11) : type == 1 ? 7 : 5;
  return 0;
}

LIB int cusolverGetVersion(int* v) {
  ENTER();
  if (v == nullptr) return 3;
  *v = Cuda13() ? 12000 : 11705;
  return 0;
}
