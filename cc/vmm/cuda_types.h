// jaxlake: the few CUDA driver types and constants jaxlake uses.
//
// Written from the driver's documented ABI (x86-64 Linux, LP64), so that
// nothing in jaxlake needs the CUDA toolkit to build: handles are opaque
// pointers, enums are passed as int, and the two structures the VMM calls
// take are laid out field by field (checked by static_assert below).
//
// Everything lives in namespace jaxlake::cuda, so a translation unit may
// include the toolkit's cuda.h beside this file without clashes. Only the
// values jaxlake reads or passes are listed; add more from the driver's
// documentation as they are needed.
#ifndef JAXLAKE_VMM_CUDA_TYPES_H_
#define JAXLAKE_VMM_CUDA_TYPES_H_

#include <cstddef>
#include <cstdint>

namespace jaxlake::cuda {

// ---- scalar and handle types ------------------------------------------------

using CUresult = int;  // an enum in the driver: int-sized
using CUdevice = int;
using CUdeviceptr = unsigned long long;
using CUmemGenericAllocationHandle = unsigned long long;
using cuuint64_t = std::uint64_t;

struct CUctx_st;
struct CUstream_st;
struct CUevent_st;
struct CUmemPoolHandle_st;
using CUcontext = CUctx_st*;
using CUstream = CUstream_st*;
using CUevent = CUevent_st*;
using CUmemoryPool = CUmemPoolHandle_st*;

struct CUuuid {
  char bytes[16];
};

// ---- CUresult values --------------------------------------------------------

inline constexpr CUresult CUDA_SUCCESS = 0;
inline constexpr CUresult CUDA_ERROR_INVALID_VALUE = 1;
inline constexpr CUresult CUDA_ERROR_OUT_OF_MEMORY = 2;
inline constexpr CUresult CUDA_ERROR_NOT_INITIALIZED = 3;
inline constexpr CUresult CUDA_ERROR_DEINITIALIZED = 4;
inline constexpr CUresult CUDA_ERROR_NO_DEVICE = 100;
inline constexpr CUresult CUDA_ERROR_INVALID_DEVICE = 101;
inline constexpr CUresult CUDA_ERROR_INVALID_CONTEXT = 201;
inline constexpr CUresult CUDA_ERROR_SHARED_OBJECT_INIT_FAILED = 303;
inline constexpr CUresult CUDA_ERROR_INVALID_HANDLE = 400;
inline constexpr CUresult CUDA_ERROR_ILLEGAL_STATE = 401;
inline constexpr CUresult CUDA_ERROR_NOT_FOUND = 500;
inline constexpr CUresult CUDA_ERROR_NOT_READY = 600;
inline constexpr CUresult CUDA_ERROR_NOT_SUPPORTED = 801;
inline constexpr CUresult CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900;
inline constexpr CUresult CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901;
inline constexpr CUresult CUDA_ERROR_STREAM_CAPTURE_IMPLICIT = 906;
inline constexpr CUresult CUDA_ERROR_UNKNOWN = 999;

// ---- streams and events -----------------------------------------------------

// The special stream handles (macros in the driver's header, hence the
// different spelling here): the legacy default stream and the calling
// thread's per-thread default stream.
inline constexpr std::uintptr_t kStreamLegacy = 0x1;
inline constexpr std::uintptr_t kStreamPerThread = 0x2;

// CUevent_flags
inline constexpr unsigned int CU_EVENT_DISABLE_TIMING = 0x2;

// CUstreamCaptureStatus
inline constexpr int CU_STREAM_CAPTURE_STATUS_NONE = 0;
inline constexpr int CU_STREAM_CAPTURE_STATUS_ACTIVE = 1;
inline constexpr int CU_STREAM_CAPTURE_STATUS_INVALIDATED = 2;

// CUstreamCaptureMode
inline constexpr int CU_STREAM_CAPTURE_MODE_GLOBAL = 0;
inline constexpr int CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1;
inline constexpr int CU_STREAM_CAPTURE_MODE_RELAXED = 2;

// ---- devices ----------------------------------------------------------------

// CUdevice_attribute
inline constexpr int CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED =
    102;
inline constexpr int CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED = 115;

// The first driver API version (CUDA 10.2) with the VMM calls.
inline constexpr int kVmmDriverVersion = 10020;

// ---- virtual memory management ----------------------------------------------

// CUmemAllocationType
inline constexpr int CU_MEM_ALLOCATION_TYPE_PINNED = 0x1;
// CUmemAllocationHandleType
inline constexpr int CU_MEM_HANDLE_TYPE_NONE = 0x0;
// CUmemLocationType
inline constexpr int CU_MEM_LOCATION_TYPE_DEVICE = 0x1;
// CUmemAccess_flags
inline constexpr int CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 0x3;
// CUmemAllocationGranularity_flags
inline constexpr int CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0x0;

struct CUmemLocation {
  int type;  // CUmemLocationType
  int id;    // the device ordinal for CU_MEM_LOCATION_TYPE_DEVICE
};

struct CUmemAllocationProp {
  int type;                  // CUmemAllocationType
  int requestedHandleTypes;  // CUmemAllocationHandleType
  CUmemLocation location;
  void* win32HandleMetaData;
  struct {
    unsigned char compressionType;
    unsigned char gpuDirectRDMACapable;
    unsigned short usage;
    unsigned char reserved[4];
  } allocFlags;
};

struct CUmemAccessDesc {
  CUmemLocation location;
  int flags;  // CUmemAccess_flags
};

static_assert(sizeof(CUmemLocation) == 8, "CUmemLocation ABI");
static_assert(sizeof(CUmemAllocationProp) == 32, "CUmemAllocationProp ABI");
static_assert(offsetof(CUmemAllocationProp, location) == 8,
              "CUmemAllocationProp ABI");
static_assert(offsetof(CUmemAllocationProp, win32HandleMetaData) == 16,
              "CUmemAllocationProp ABI");
static_assert(offsetof(CUmemAllocationProp, allocFlags) == 24,
              "CUmemAllocationProp ABI");
static_assert(sizeof(CUmemAccessDesc) == 12, "CUmemAccessDesc ABI");

// ---- stream-ordered memory pools --------------------------------------------

// CUmemPool_attribute (the value is an int for the three REUSE ones, a
// cuuint64_t for the others)
inline constexpr int CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES = 1;
inline constexpr int CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC = 2;
inline constexpr int CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES = 3;
inline constexpr int CU_MEMPOOL_ATTR_RELEASE_THRESHOLD = 4;
inline constexpr int CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT = 5;
inline constexpr int CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH = 6;
inline constexpr int CU_MEMPOOL_ATTR_USED_MEM_CURRENT = 7;
inline constexpr int CU_MEMPOOL_ATTR_USED_MEM_HIGH = 8;

// ---- driver entry points by name --------------------------------------------

// cuGetProcAddress flags
inline constexpr cuuint64_t CU_GET_PROC_ADDRESS_DEFAULT = 0;
inline constexpr cuuint64_t CU_GET_PROC_ADDRESS_LEGACY_STREAM = 1;
inline constexpr cuuint64_t CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM = 2;
// CUdriverProcAddressQueryResult
inline constexpr int CU_GET_PROC_ADDRESS_SUCCESS = 0;
inline constexpr int CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND = 1;
inline constexpr int CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT = 2;

}  // namespace jaxlake::cuda

#endif  // JAXLAKE_VMM_CUDA_TYPES_H_
