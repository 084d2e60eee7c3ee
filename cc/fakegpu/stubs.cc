// Every entry point of names.inc that no other file implements: a weak
// definition that names the call once in the log and returns its library's
// "not supported" error. The implemented entry points are strong
// definitions, which the linker takes instead. The stubs read none of their
// arguments, so one signature serves each kind: a STUB line's function
// returns its library's int-sized status enum (or void), and a STRING
// line's returns a string (gen_names.RETURNS_STRING), so its stand-in
// returns one too, saying that the call is not supported. The fake
// implements every STRING function; the few that return a size are
// implemented as well.
#include "cc/fakegpu/fakegpu.h"

namespace {

// Each library's "not supported" status.
constexpr int k_driver = 801;    // CUDA_ERROR_NOT_SUPPORTED
constexpr int k_cudart = 801;    // cudaErrorNotSupported
constexpr int k_cublas = 15;     // CUBLAS_STATUS_NOT_SUPPORTED
constexpr int k_cublaslt = 15;   // CUBLAS_STATUS_NOT_SUPPORTED
constexpr int k_cudnn = 3000;    // CUDNN_STATUS_NOT_SUPPORTED
constexpr int k_nvml = 3;        // NVML_ERROR_NOT_SUPPORTED
constexpr int k_cufft = 16;      // CUFFT_NOT_SUPPORTED
constexpr int k_cupti = 27;      // CUPTI_ERROR_NOT_SUPPORTED
constexpr int k_cusparse = 10;   // CUSPARSE_STATUS_NOT_SUPPORTED
constexpr int k_cusolver = 9;    // CUSOLVER_STATUS_NOT_SUPPORTED
constexpr int k_nccl = 5;        // ncclInvalidUsage

}  // namespace

#define JAXLAKE_FAKEGPU_STUB(lib, name)                                  \
  extern "C" __attribute__((weak, visibility("default"))) int name() {   \
    return jaxlake::fakegpu::Unsupported(#lib, #name, k_##lib);          \
  }
#define JAXLAKE_FAKEGPU_STRING(lib, name)                                     \
  extern "C" __attribute__((weak, visibility("default"))) const char* name() { \
    jaxlake::fakegpu::Unsupported(#lib, #name, 0);                          \
    return #name " is not supported by jaxlake's fake GPU";                 \
  }
#include "cc/fakegpu/names.inc"
#undef JAXLAKE_FAKEGPU_STRING
#undef JAXLAKE_FAKEGPU_STUB
