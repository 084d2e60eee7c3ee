// The fake driver's own state and helpers, shared by the files that
// implement the driver API (README.md lists them by API area): devices and
// contexts (device.cc), memory (memory.cc, memory_alloc.cc), streams and
// events (stream.cc), modules and kernels (module.cc), graphs and stream
// capture (graph*.cc), and errors and entry points by name (driver.cc). Not
// a public header.
#ifndef JAXLAKE_FAKEGPU_DRIVER_H_
#define JAXLAKE_FAKEGPU_DRIVER_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cc/fakegpu/fakegpu.h"
#include "cc/vmm/cuda_types.h"

// An implemented driver entry point: exported, returns CUresult.
#define FAKE \
  ::jaxlake::cuda::CUresult __attribute__((visibility("default")))
#define ENTER() JAXLAKE_FAKEGPU_ENTER()

namespace jaxlake::fakegpu::driver {

using cuda::CUcontext;
using cuda::CUmemoryPool;
using cuda::CUresult;
using cuda::CUstream;

constexpr int kDriverVersion = 13000;
constexpr std::size_t kGranularity = std::size_t{2} << 20;
constexpr std::uintptr_t kContextBase = 0xC000;
constexpr std::uintptr_t kPoolBase = 0x9000;
constexpr CUresult CUDA_ERROR_INVALID_IMAGE = 200;
constexpr CUresult CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED = 704;

// The driver's state, under one lock.
struct Driver {
  std::mutex mu;
  // devices and contexts
  bool initialized = false;
  std::vector<int> primary_refs;
  std::set<std::pair<int, int>> peers;
  // memory
  struct Handle {
    int device;
    std::size_t size;
    int types = 0;    // the shareable handle types cuMemCreate asked for
    int retains = 0;  // cuMemRetainAllocationHandle's, each released once
  };
  std::unordered_map<cuda::CUmemGenericAllocationHandle, Handle> handles;
  // The VMM mappings, one per successful cuMemMap, by address: the device
  // of the handle mapped and the devices cuMemSetAccess granted access to
  // (a bit per ordinal). Address queries report the mapping an address
  // lies in, as the driver does, not the reservation around it.
  struct Mapping {
    std::size_t size;
    int device;
    std::uint64_t access;
    cuda::CUmemGenericAllocationHandle handle = 0;  // what is mapped
    std::size_t offset = 0;                         // from where in it
  };
  std::map<cuda::CUdeviceptr, Mapping> mappings;
  struct Alloc {
    int device;
    std::size_t size;
    bool pool;
  };
  std::unordered_map<cuda::CUdeviceptr, Alloc> allocs;  // cuMemAlloc, pools
  std::unordered_map<std::uintptr_t, std::size_t> host_allocs;
  std::vector<std::uint64_t> pool_used, pool_high, release_threshold;
  // The default pools' memory freed back to them and kept (still charged to
  // the device) until a synchronisation trims it to the release threshold;
  // their reserved bytes are pool_used + pool_cached (TrimPools()).
  std::vector<std::uint64_t> pool_cached, pool_reserved_high;
  // Bytes freed to the pool whose free has not yet run on its stream:
  // still reserved, not yet reusable.
  std::vector<std::uint64_t> pool_freeing;
  // modules and kernels
  struct Module {
    std::map<std::string, std::size_t> symbols;  // from the image's ELF
    std::map<std::string, std::pair<void*, std::size_t>> globals;
  };
  std::map<std::uintptr_t, Module> modules;
  struct Function {
    std::string name;
    int attrs[16] = {};
  };
  std::unordered_map<std::uintptr_t, std::unique_ptr<Function>> functions;
  std::uintptr_t next_module = 0x7000000;
  std::uint64_t launches = 0;
  // The eleven arguments of the last cuLaunchKernel call, as integers (the
  // control API's jaxlake_fakegpu_last_launch).
  unsigned long long last_launch[11] = {};
};
Driver& D();

inline int Count() { return Opts().count; }
inline bool ValidDevice(int d) { return d >= 0 && d < Count(); }

// Contexts and default pools are small integers, one a device.
inline CUcontext ContextOf(int device) {
  return reinterpret_cast<CUcontext>(kContextBase +
                                     static_cast<std::uintptr_t>(device));
}
inline int DeviceOfContext(CUcontext ctx) {
  const auto v = reinterpret_cast<std::uintptr_t>(ctx);
  return v >= kContextBase && v < kContextBase + static_cast<unsigned>(Count())
             ? static_cast<int>(v - kContextBase)
             : -1;
}
inline CUmemoryPool PoolOf(int device) {
  return reinterpret_cast<CUmemoryPool>(kPoolBase +
                                        static_cast<std::uintptr_t>(device));
}
inline int DeviceOfPool(CUmemoryPool pool) {
  const auto v = reinterpret_cast<std::uintptr_t>(pool);
  return v >= kPoolBase && v < kPoolBase + static_cast<unsigned>(Count())
             ? static_cast<int>(v - kPoolBase)
             : -1;
}

// A stream, event or context synchronisation (memory_alloc.cc): each default
// pool that reserves more than its release threshold gives its kept memory
// back to the device down to that threshold, as the driver documents it.
void TrimPools();
// Gives `dev`'s kept pool memory back until its pool reserves at most
// `keep` bytes or keeps nothing (cuMemPoolTrimTo).
void TrimPool(int dev, std::uint64_t keep);

// The VMM mapping that holds `p` (memory.cc): false when `p` lies in no
// mapping; else *base, *out are that mapping.
bool FindMapping(cuda::CUdeviceptr p, cuda::CUdeviceptr* base,
                 Driver::Mapping* out);

// Stream work in flight (memory.cc). `work`, enqueued on `s` by
// EnqueueTouching, touches the device ranges `touches` (address, bytes)
// when it runs. An unmap (cuMemUnmap) of memory that such work still has to
// touch is a use after free on the GPU: the work faults instead of running
// (WorkInFlight below), and the device's context takes the sticky error.
using Touch = std::pair<cuda::CUdeviceptr, std::size_t>;
void EnqueueTouching(Stream* s, std::vector<Touch> touches,
                     std::function<void()> work);
// Called by cuMemUnmap before [va, va+size) goes: every piece of work in
// flight that touches the range faults (it will not run; work already
// running on it is waited for, so that host memory is not pulled from under
// it), the fault is named on stderr and its device's context takes
// CUDA_ERROR_ILLEGAL_ADDRESS. Returns how many pieces of work faulted.
std::size_t WorkInFlight(cuda::CUdeviceptr va, std::size_t size);
// The VMM mappings that [va, va+size) overlaps, each as (address, size,
// handle, offset into the handle): what backs the range now (memory.cc).
struct Backing {
  cuda::CUdeviceptr base;
  std::size_t size;
  cuda::CUmemGenericAllocationHandle handle;
  std::size_t offset;
  bool operator==(const Backing& o) const {
    return base == o.base && size == o.size && handle == o.handle &&
           offset == o.offset;
  }
};
std::vector<Backing> BackingOf(cuda::CUdeviceptr va, std::size_t size);
// Gives `device`'s context the sticky CUDA_ERROR_ILLEGAL_ADDRESS (work of
// it faulted).
void Fault(int device);
// The context's sticky error, as the driver reports it from every later
// synchronisation: CUDA_ERROR_ILLEGAL_ADDRESS once work of `device` (any
// device when negative) faulted, else CUDA_SUCCESS.
CUresult Sticky(int device);

// CUDA_ERROR_NOT_INITIALIZED before cuInit.
CUresult NeedInit();
// As NeedInit, and CUDA_ERROR_INVALID_CONTEXT without a current context;
// else *device (when given) is the current device.
CUresult NeedContext(int* device = nullptr);
// The stream a handle names, for the calling thread's current device.
Stream* StreamFor(CUstream s);

// Stream capture (graph_capture.cc). When `stream` is being captured, each
// Capture* call records its work as a node of the capture's graph instead
// of running it, sets *r and returns true; otherwise it returns false and
// the caller runs the work.
bool CaptureCopy(CUstream stream, void* dst, const void* src, std::size_t n,
                 CUresult* r);
bool CaptureMemset(CUstream stream, cuda::CUdeviceptr dst, unsigned value,
                   unsigned element, std::size_t count, CUresult* r);
bool CaptureHost(CUstream stream, void (*fn)(void*), void* data, CUresult* r);
bool CaptureKernel(CUstream stream, void* f, CUresult* r);
bool CaptureEventRecord(CUstream stream, cuda::CUevent event, CUresult* r);
bool CaptureEventWait(CUstream stream, cuda::CUevent event, CUresult* r);
// Other stream work (stream memory operations): a batch memory operation
// node that runs `work` at each launch.
bool CaptureMemOp(CUstream stream, std::function<void()> work, CUresult* r);
// Stream-ordered allocation and free under capture: memory alloc and free
// nodes.
bool CaptureAlloc(CUstream stream, int device, std::size_t bytes,
                  cuda::CUdeviceptr* out, CUresult* r);
bool CaptureFree(CUstream stream, cuda::CUdeviceptr p, CUresult* r);
// Frees a graph allocation outside its graph (cuMemFreeAsync, cuMemFree)
// in `stream`'s order; false when `p` is no graph allocation.
bool FreeGraphAllocation(cuda::CUdeviceptr p, CUstream stream);
// A potentially unsafe call (cuMemAlloc, a synchronous copy, ...) while the
// calling thread is prohibited from it by a capture (the rule of its
// capture mode): CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, and the thread's
// captures are invalidated. Else CUDA_SUCCESS.
CUresult CheckUnsafe();
// A synchronisation or query of an event whose last record was captured
// (it marks a place in a graph, not in any stream's work): as CheckSync,
// for the capture it was recorded in.
CUresult CheckEventSync(cuda::CUevent event);
// A synchronisation or query of a capturing stream:
// CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, and its capture is invalidated.
CUresult CheckSync(CUstream stream);

}  // namespace jaxlake::fakegpu::driver

#endif  // JAXLAKE_FAKEGPU_DRIVER_H_
