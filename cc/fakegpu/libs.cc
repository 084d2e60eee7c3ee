// The version calls of cuFFT, CUPTI, cuSPARSE and cuSOLVER that JAX's
// start-up checks, by NVIDIA's names and signatures, and CUPTI's status
// strings. The versions reported are at or above what JAX's CUDA 12 and
// CUDA 13 plugins are built against. (cuDNN, cuBLAS(Lt) and NCCL are
// cudnn.cc, cublas.cc and nccl.cc; cuFFT, cuSOLVER and cuSPARSE's other
// entry points cufft.cc, cusolver.cc and cusparse.cc.)
#include <cstdint>

#include "cc/fakegpu/fakegpu.h"

namespace fg = jaxlake::fakegpu;

#define LIB JAXLAKE_FAKEGPU_EXPORT
#define ENTER() JAXLAKE_FAKEGPU_ENTER()

namespace {
bool Cuda13() { return fg::Opts().cuda_major == 13; }
}  // namespace

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

// ---- CUPTI's status strings -------------------------------------------------
//
// CUPTI is not implemented (its calls answer CUPTI_ERROR_NOT_SUPPORTED), so
// a caller that reports one of those errors asks for its name: these set
// *str to a static string naming the status (cupti_result.h).

namespace {
const char* CuptiResultName(int result) {
  switch (result) {
    case 0: return "CUPTI_SUCCESS";
    case 1: return "CUPTI_ERROR_INVALID_PARAMETER";
    case 2: return "CUPTI_ERROR_INVALID_DEVICE";
    case 3: return "CUPTI_ERROR_INVALID_CONTEXT";
    case 7: return "CUPTI_ERROR_INVALID_OPERATION";
    case 8: return "CUPTI_ERROR_OUT_OF_MEMORY";
    case 11: return "CUPTI_ERROR_API_NOT_IMPLEMENTED";
    case 15: return "CUPTI_ERROR_NOT_INITIALIZED";
    case 23: return "CUPTI_ERROR_DISABLED";
    case 27: return "CUPTI_ERROR_NOT_SUPPORTED";
    case 35: return "CUPTI_ERROR_INSUFFICIENT_PRIVILEGES";
    case 999: return "CUPTI_ERROR_UNKNOWN";
    default: return nullptr;
  }
}
}  // namespace

LIB int cuptiGetResultString(int result, const char** str) {
  ENTER();
  if (str == nullptr) return 1;  // CUPTI_ERROR_INVALID_PARAMETER
  const char* name = CuptiResultName(result);
  *str = name != nullptr ? name : "CUPTI_ERROR_UNKNOWN";
  return name != nullptr ? 0 : 1;
}

LIB int cuptiGetErrorMessage(int result, const char** str) {
  ENTER();
  if (str == nullptr) return 1;
  const char* name = CuptiResultName(result);
  if (name == nullptr) {
    *str = "unknown CUPTI result";
    return 1;
  }
  *str = result == 27 ? "CUPTI is not supported by jaxlake's fake GPU"
                      : name;
  return 0;
}
