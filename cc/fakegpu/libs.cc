// The version calls of cuFFT, cuSPARSE and cuSOLVER that JAX's start-up
// checks, by NVIDIA's names and signatures. The versions reported are at or
// above what JAX's CUDA 12 and CUDA 13 plugins are built against. (cuDNN, cuBLAS(Lt) and NCCL are
// cudnn.cc, cublas.cc and nccl.cc; cuFFT, cuSOLVER and cuSPARSE's other
// entry points cufft.cc, cusolver.cc and cusparse.cc; CUPTI cupti.cc.)
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
