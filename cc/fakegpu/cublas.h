// What the fake's cuBLAS files (cublas.cc: handles and cuBLASLt;
// cublas_blas.cc: the routines) share. Not a public header.
#ifndef JAXLAKE_FAKEGPU_CUBLAS_H_
#define JAXLAKE_FAKEGPU_CUBLAS_H_

namespace jaxlake::fakegpu {

// The pointer mode of a live cuBLAS handle (CUBLAS_POINTER_MODE_HOST 0,
// DEVICE 1), or -1 for a handle the fake did not create.
int CublasPointerMode(const void* handle);

}  // namespace jaxlake::fakegpu

#endif  // JAXLAKE_FAKEGPU_CUBLAS_H_
