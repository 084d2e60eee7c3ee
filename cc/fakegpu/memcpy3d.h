// CUDA_MEMCPY3D of cuda.h, field for field (the fake keeps its own copies
// of the public structs, as cc/vmm/cuda_types.h does): the driver's copy
// node parameters (graph_internal.h), and what the runtime converts
// cudaMemcpy3DParms to (graph_runtime.cc).
#ifndef JAXLAKE_FAKEGPU_MEMCPY3D_H_
#define JAXLAKE_FAKEGPU_MEMCPY3D_H_

#include <cstddef>

namespace jaxlake::fakegpu {

struct Memcpy3D {
  std::size_t srcXInBytes, srcY, srcZ, srcLOD;
  int srcMemoryType;
  const void* srcHost;
  unsigned long long srcDevice;  // CUdeviceptr
  void* srcArray;
  void* reserved0;
  std::size_t srcPitch, srcHeight;
  std::size_t dstXInBytes, dstY, dstZ, dstLOD;
  int dstMemoryType;
  void* dstHost;
  unsigned long long dstDevice;  // CUdeviceptr
  void* dstArray;
  void* reserved1;
  std::size_t dstPitch, dstHeight;
  std::size_t WidthInBytes, Height, Depth;
};
static_assert(sizeof(Memcpy3D) == 200, "CUDA_MEMCPY3D");

}  // namespace jaxlake::fakegpu

#endif  // JAXLAKE_FAKEGPU_MEMCPY3D_H_
