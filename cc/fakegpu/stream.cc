// The fake driver's streams and events: each stream runs its work in order
// on a thread of its own (fakegpu.h), events complete when the work recorded
// before them has run.
#include <chrono>
#include <cstdint>
#include <mutex>
#include <thread>
#include <type_traits>
#include <utility>

#include "cc/fakegpu/driver.h"
#include "cc/fakegpu/fakegpu.h"
#include "cc/vmm/cuda_types.h"

using namespace jaxlake::cuda;            // NOLINT: the driver's vocabulary
using namespace jaxlake::fakegpu::driver;  // NOLINT: its shared state
namespace fg = jaxlake::fakegpu;

extern "C" {

// ---- streams and events -----------------------------------------------------

FAKE cuStreamCreate(CUstream* stream, unsigned int flags) {
  ENTER();
  int dev = 0;
  if (CUresult r = NeedContext(&dev); r != CUDA_SUCCESS) return r;
  if (stream == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *stream = static_cast<CUstream>(fg::NewStream(dev, flags, 0));
  return CUDA_SUCCESS;
}

FAKE cuStreamCreateWithPriority(CUstream* stream, unsigned int flags,
                                int priority) {
  ENTER();
  int dev = 0;
  if (CUresult r = NeedContext(&dev); r != CUDA_SUCCESS) return r;
  if (stream == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *stream = static_cast<CUstream>(fg::NewStream(dev, flags, priority));
  return CUDA_SUCCESS;
}

FAKE cuStreamDestroy_v2(CUstream stream) {
  ENTER();
  return fg::DestroyStream(stream) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

FAKE cuStreamSynchronize(CUstream stream) {
  ENTER();
  if (CUresult r = NeedInit(); r != CUDA_SUCCESS) return r;
  fg::Stream* s = StreamFor(stream);
  if (s == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (CUresult r = CheckSync(stream); r != CUDA_SUCCESS) return r;
  s->Synchronize();
  TrimPools();
  return Sticky(s->device());
}

FAKE cuStreamQuery(CUstream stream) {
  ENTER();
  fg::Stream* s = StreamFor(stream);
  if (s == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (CUresult r = CheckSync(stream); r != CUDA_SUCCESS) return r;
  if (CUresult r = Sticky(s->device()); r != CUDA_SUCCESS) return r;
  return s->Idle() ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

FAKE cuStreamGetPriority(CUstream stream, int* priority) {
  ENTER();
  fg::Stream* s = StreamFor(stream);
  if (s == nullptr || priority == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *priority = s->priority;
  return CUDA_SUCCESS;
}

FAKE cuStreamGetFlags(CUstream stream, unsigned int* flags) {
  ENTER();
  fg::Stream* s = StreamFor(stream);
  if (s == nullptr || flags == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *flags = s->flags;
  return CUDA_SUCCESS;
}

FAKE cuStreamGetCtx(CUstream stream, CUcontext* ctx) {
  ENTER();
  fg::Stream* s = StreamFor(stream);
  if (s == nullptr || ctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *ctx = ContextOf(s->device());
  return CUDA_SUCCESS;
}

FAKE cuStreamWaitEvent(CUstream stream, CUevent event, unsigned int) {
  ENTER();
  fg::Stream* s = StreamFor(stream);
  auto e = fg::EventOf(event);
  if (s == nullptr || e == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (CUresult r = 0; CaptureEventWait(stream, event, &r)) return r;
  fg::WaitEvent(s, e);
  return CUDA_SUCCESS;
}

FAKE cuLaunchHostFunc(CUstream stream, void (*fn)(void*), void* data) {
  ENTER();
  fg::Stream* s = StreamFor(stream);
  if (s == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (fn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = 0; CaptureHost(stream, fn, data, &r)) return r;
  s->Enqueue([fn, data] { fn(data); });
  return CUDA_SUCCESS;
}

FAKE cuStreamAddCallback(CUstream stream,
                         void (*fn)(CUstream, CUresult, void*), void* data,
                         unsigned int flags) {
  ENTER();
  fg::Stream* s = StreamFor(stream);
  if (s == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (fn == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  // Stream callbacks cannot be captured (cuLaunchHostFunc can).
  if (CUresult r = CheckSync(stream); r != CUDA_SUCCESS) return r;
  s->Enqueue([fn, data, stream] { fn(stream, CUDA_SUCCESS, data); });
  return CUDA_SUCCESS;
}

// ---- stream memory operations -------------------------------------------

}  // extern "C"

namespace {
// A write of `value` to `addr` in stream order.
template <typename T>
CUresult WriteValue(CUstream stream, CUdeviceptr addr, T value,
                    unsigned flags) {
  fg::Stream* s = StreamFor(stream);
  if (s == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (addr == 0 || addr % sizeof(T) != 0 || flags > 1)
    return CUDA_ERROR_INVALID_VALUE;
  auto work = [addr, value] {
    __atomic_store_n(reinterpret_cast<T*>(addr), value, __ATOMIC_SEQ_CST);
  };
  if (CUresult r = 0; CaptureMemOp(stream, work, &r)) return r;
  EnqueueTouching(s, {{addr, sizeof(T)}}, work);
  return CUDA_SUCCESS;
}

// A wait, in stream order, until the value at `addr` meets the condition
// of `flags` (GEQ, EQ, AND, NOR; the flush flag changes nothing here). The
// stream's thread polls, as the GPU's front end does.
template <typename T>
CUresult WaitValue(CUstream stream, CUdeviceptr addr, T value,
                   unsigned flags) {
  fg::Stream* s = StreamFor(stream);
  if (s == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  const unsigned op = flags & ~(1u << 30);
  if (addr == 0 || addr % sizeof(T) != 0 || op > 3)
    return CUDA_ERROR_INVALID_VALUE;
  auto work = [addr, value, op] {
    using S = std::make_signed_t<T>;
    for (;;) {
      const T v =
          __atomic_load_n(reinterpret_cast<const T*>(addr), __ATOMIC_SEQ_CST);
      const bool met = op == 0   ? static_cast<S>(v - value) >= 0
                       : op == 1 ? v == value
                       : op == 2 ? (v & value) != 0
                                 : static_cast<T>(~(v | value)) != 0;
      if (met) return;
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  };
  if (CUresult r = 0; CaptureMemOp(stream, work, &r)) return r;
  s->Enqueue(work);
  return CUDA_SUCCESS;
}
}  // namespace

extern "C" {

// The _v2 names are CUDA 12's for the same calls, and the per-thread
// variants take the fake's default stream as the others do.
#define JAXLAKE_FAKEGPU_MEMOP(name, impl, T)                              \
  FAKE name(CUstream s, CUdeviceptr a, T v, unsigned int f) {             \
    ENTER();                                                              \
    return impl<T>(s, a, v, f);                                           \
  }
JAXLAKE_FAKEGPU_MEMOP(cuStreamWriteValue32, WriteValue, std::uint32_t)
JAXLAKE_FAKEGPU_MEMOP(cuStreamWriteValue32_v2, WriteValue, std::uint32_t)
JAXLAKE_FAKEGPU_MEMOP(cuStreamWriteValue32_ptsz, WriteValue, std::uint32_t)
JAXLAKE_FAKEGPU_MEMOP(cuStreamWriteValue32_v2_ptsz, WriteValue,
                      std::uint32_t)
JAXLAKE_FAKEGPU_MEMOP(cuStreamWriteValue64, WriteValue, std::uint64_t)
JAXLAKE_FAKEGPU_MEMOP(cuStreamWriteValue64_v2, WriteValue, std::uint64_t)
JAXLAKE_FAKEGPU_MEMOP(cuStreamWriteValue64_ptsz, WriteValue, std::uint64_t)
JAXLAKE_FAKEGPU_MEMOP(cuStreamWriteValue64_v2_ptsz, WriteValue,
                      std::uint64_t)
JAXLAKE_FAKEGPU_MEMOP(cuStreamWaitValue32, WaitValue, std::uint32_t)
JAXLAKE_FAKEGPU_MEMOP(cuStreamWaitValue32_v2, WaitValue, std::uint32_t)
JAXLAKE_FAKEGPU_MEMOP(cuStreamWaitValue32_ptsz, WaitValue, std::uint32_t)
JAXLAKE_FAKEGPU_MEMOP(cuStreamWaitValue32_v2_ptsz, WaitValue, std::uint32_t)
JAXLAKE_FAKEGPU_MEMOP(cuStreamWaitValue64, WaitValue, std::uint64_t)
JAXLAKE_FAKEGPU_MEMOP(cuStreamWaitValue64_v2, WaitValue, std::uint64_t)
JAXLAKE_FAKEGPU_MEMOP(cuStreamWaitValue64_ptsz, WaitValue, std::uint64_t)
JAXLAKE_FAKEGPU_MEMOP(cuStreamWaitValue64_v2_ptsz, WaitValue, std::uint64_t)
#undef JAXLAKE_FAKEGPU_MEMOP

FAKE cuEventCreate(CUevent* event, unsigned int flags) {
  ENTER();
  if (event == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *event = static_cast<CUevent>(fg::NewEvent(flags));
  return CUDA_SUCCESS;
}

FAKE cuEventDestroy_v2(CUevent event) {
  ENTER();
  return fg::DestroyEvent(event) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

FAKE cuEventRecord(CUevent event, CUstream stream) {
  ENTER();
  fg::Stream* s = StreamFor(stream);
  auto e = fg::EventOf(event);
  if (s == nullptr || e == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (CUresult r = 0; CaptureEventRecord(stream, event, &r)) return r;
  fg::RecordEvent(e, s);
  return CUDA_SUCCESS;
}

FAKE cuEventRecordWithFlags(CUevent event, CUstream stream, unsigned int) {
  return cuEventRecord(event, stream);
}

FAKE cuEventQuery(CUevent event) {
  ENTER();
  auto e = fg::EventOf(event);
  if (e == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (CUresult r = CheckEventSync(event); r != CUDA_SUCCESS) return r;
  if (CUresult r = Sticky(fg::CurrentDevice()); r != CUDA_SUCCESS) return r;
  std::lock_guard<std::mutex> lock(e->mu);
  return e->completed >= e->recorded ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

FAKE cuEventSynchronize(CUevent event) {
  ENTER();
  auto e = fg::EventOf(event);
  if (e == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (CUresult r = CheckEventSync(event); r != CUDA_SUCCESS) return r;
  std::unique_lock<std::mutex> lock(e->mu);
  const std::uint64_t target = e->recorded;
  e->cv.wait(lock, [&] { return e->completed >= target; });
  lock.unlock();
  TrimPools();
  return Sticky(fg::CurrentDevice());
}

FAKE cuEventElapsedTime(float* ms, CUevent start, CUevent end) {
  ENTER();
  auto a = fg::EventOf(start);
  auto b = fg::EventOf(end);
  if (ms == nullptr || a == nullptr || b == nullptr)
    return CUDA_ERROR_INVALID_HANDLE;
  double ta = 0, tb = 0;
  {
    std::lock_guard<std::mutex> lock(a->mu);
    if (a->completed < a->recorded) return CUDA_ERROR_NOT_READY;
    ta = a->time_ms;
  }
  {
    std::lock_guard<std::mutex> lock(b->mu);
    if (b->completed < b->recorded) return CUDA_ERROR_NOT_READY;
    tb = b->time_ms;
  }
  *ms = static_cast<float>(tb > ta ? tb - ta : 0.0);
  return CUDA_SUCCESS;
}

FAKE cuEventElapsedTime_v2(float* ms, CUevent start, CUevent end) {
  return cuEventElapsedTime(ms, start, end);
}


}  // extern "C"
