// A driver library with cuInit and no other name, as a driver older than
// every name the shim lists would be: shim_test_bare_driver runs the
// shim's test of missing names over it (the fake GPU defines them all).
#include "cc/vmm/cuda_types.h"

extern "C" __attribute__((visibility("default"))) jaxlake::cuda::CUresult
cuInit(unsigned int flags) {
  return flags == 0 ? jaxlake::cuda::CUDA_SUCCESS
                    : jaxlake::cuda::CUDA_ERROR_INVALID_VALUE;
}
