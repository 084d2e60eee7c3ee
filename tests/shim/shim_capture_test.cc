// Tests of the shim under stream capture, its answers to lookups by name,
// range queries, and calls from threads, over the fake GPU. Part of
// shim_test (shim_test.cc says how it runs).
#include <dlfcn.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tests/shim/shim_util.h"

namespace {

using namespace jaxlake::cuda;           // NOLINT: the driver's vocabulary
using namespace jaxlake::shim_testing;   // NOLINT: the tests' helpers

// Captures through the shim, as XLA's command buffers make them.
CUresult BeginCapture(CUstream s, int mode) {
  return Sym<CUresult(CUstream, int)>(g_libcuda, "cuStreamBeginCapture_v2")(
      s, mode);
}
CUresult EndCapture(CUstream s) {
  void* graph = nullptr;
  return Sym<CUresult(CUstream, void**)>(g_libcuda, "cuStreamEndCapture")(
      s, &graph);
}
int ExchangeMode(int mode) {
  Sym<CUresult(int*)>(g_libcuda, "cuThreadExchangeStreamCaptureMode")(&mode);
  return mode;
}

TEST(allocations_during_capture_stay_with_the_driver) {
  const Cuda& cu = Cu();
  const Device d = Ready(0);
  const CUstream s = NewStream();
  const auto allocs = FakeCalls("cuMemAllocFromPoolAsync");
  const auto frees = FakeCalls("cuMemFreeAsync");
  const long long captured = HookCount("cuMemAllocFromPoolAsync", "captured");
  const long long captured_frees = HookCount("cuMemFreeAsync", "captured");
  REQUIRE_EQ(BeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
             CUDA_SUCCESS);
  CUdeviceptr p = 0;
  CHECK_EQ(cu.MemAllocFromPoolAsync(&p, 4 * kMiB, d.pool, s), CUDA_SUCCESS);
  CHECK_EQ(cu.MemFreeAsync(p, s), CUDA_SUCCESS);
  CHECK_EQ(EndCapture(s), CUDA_SUCCESS);
  CHECK_EQ(FakeCalls("cuMemAllocFromPoolAsync"), allocs + 1);
  CHECK_EQ(FakeCalls("cuMemFreeAsync"), frees + 1);
  if (InactiveBecause() == nullptr) {
    CHECK_EQ(HookCount("cuMemAllocFromPoolAsync", "captured"), captured + 1);
    CHECK_EQ(HookCount("cuMemFreeAsync", "captured"), captured_frees + 1);
  }
  CHECK_EQ(CaptureRefusals(), 0u);
}

TEST(a_thread_local_capture_sends_that_threads_requests_to_the_driver) {
  // Thread A captures stream c in thread-local mode (as XLA does) and then
  // allocates on stream s, which is not being captured: the lake's driver
  // calls would be prohibited on A, so the driver's pool serves it. Thread
  // B, meanwhile, is served by the lake.
  const Cuda& cu = Cu();
  const Device d = Ready(0);
  Drain();
  const CUstream c = NewStream(), s = NewStream(), other = NewStream();
  const auto native = FakeCalls("cuMemAllocFromPoolAsync");
  const long long captured = HookCount("cuMemAllocFromPoolAsync", "captured");
  const long long allocs = Counter(0, "allocs");
  std::atomic<int> step{0};
  CUresult begin = -1, a_alloc = -1, a_free = -1, end = -1;
  CUdeviceptr pa = 0;
  std::thread a([&] {
    cu.CtxSetCurrent(d.ctx);
    begin = BeginCapture(c, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
    a_alloc = cu.MemAllocFromPoolAsync(&pa, 6 * kMiB, d.pool, s);
    step = 1;
    while (step.load() != 2) std::this_thread::yield();
    a_free = cu.MemFreeAsync(pa, s);
    end = EndCapture(c);
  });
  while (step.load() != 1) std::this_thread::yield();
  // B, while A's capture is open: the lake serves it (and may call the
  // driver's unsafe functions, which B may).
  CUdeviceptr pb = 0;
  CHECK_EQ(cu.MemAllocFromPoolAsync(&pb, 6 * kMiB, d.pool, other),
           CUDA_SUCCESS);
  CHECK_EQ(cu.MemFreeAsync(pb, other), CUDA_SUCCESS);
  step = 2;
  a.join();
  CHECK_EQ(begin, CUDA_SUCCESS);
  CHECK_EQ(a_alloc, CUDA_SUCCESS);
  CHECK_EQ(a_free, CUDA_SUCCESS);
  CHECK_EQ(end, CUDA_SUCCESS);
  if (InactiveBecause() != nullptr) return;
  CHECK_EQ(FakeCalls("cuMemAllocFromPoolAsync"), native + 1);
  CHECK_EQ(HookCount("cuMemAllocFromPoolAsync", "captured"), captured + 1);
  CHECK_EQ(Counter(0, "allocs"), allocs + 1);  // B's
  CHECK_EQ(CaptureRefusals(), 0u);
  // Once the capture ended, the same thread's requests reach the lake.
  CUdeviceptr p = 0;
  CHECK_EQ(cu.MemAllocFromPoolAsync(&p, 6 * kMiB, d.pool, s), CUDA_SUCCESS);
  CHECK_EQ(Counter(0, "allocs"), allocs + 2);
  CHECK_EQ(cu.MemFreeAsync(p, s), CUDA_SUCCESS);
}

TEST(a_global_capture_sends_other_threads_to_the_driver_unless_relaxed) {
  const Cuda& cu = Cu();
  const Device d = Ready(0);
  Drain();
  const CUstream c = NewStream(), s = NewStream();
  const auto native = FakeCalls("cuMemAllocFromPoolAsync");
  const long long allocs = Counter(0, "allocs");
  std::atomic<int> step{0};
  std::thread a([&] {
    cu.CtxSetCurrent(d.ctx);
    if (BeginCapture(c, CU_STREAM_CAPTURE_MODE_GLOBAL) != CUDA_SUCCESS)
      std::abort();
    step = 1;
    while (step.load() != 2) std::this_thread::yield();
    if (EndCapture(c) != CUDA_SUCCESS) std::abort();
  });
  while (step.load() != 1) std::this_thread::yield();
  CUdeviceptr p = 0, q = 0;
  CHECK_EQ(cu.MemAllocFromPoolAsync(&p, 4 * kMiB, d.pool, s), CUDA_SUCCESS);
  CHECK_EQ(cu.MemFreeAsync(p, s), CUDA_SUCCESS);
  if (InactiveBecause() == nullptr) {
    CHECK_EQ(FakeCalls("cuMemAllocFromPoolAsync"), native + 1);
    CHECK_EQ(Counter(0, "allocs"), allocs);
  }
  // In relaxed mode this thread may make unsafe calls: the lake serves it.
  const int old = ExchangeMode(CU_STREAM_CAPTURE_MODE_RELAXED);
  CHECK_EQ(cu.MemAllocFromPoolAsync(&q, 4 * kMiB, d.pool, s), CUDA_SUCCESS);
  CHECK_EQ(cu.MemFreeAsync(q, s), CUDA_SUCCESS);
  CHECK_EQ(ExchangeMode(old), CU_STREAM_CAPTURE_MODE_RELAXED);
  // The shim's query put the thread's mode back each time.
  CHECK_EQ(old, CU_STREAM_CAPTURE_MODE_GLOBAL);
  step = 2;
  a.join();
  if (InactiveBecause() == nullptr) {
    CHECK_EQ(Counter(0, "allocs"), allocs + 1);
    CHECK_EQ(CaptureRefusals(), 0u);
  }
}

TEST(lake_and_pool_addresses_never_cross) {
  const Cuda& cu = Cu();
  const Device d = Ready(0);
  Drain();
  const CUstream s = NewStream(), c = NewStream();
  const auto frees = FakeCalls("cuMemFreeAsync");
  // A lake address freed under capture is refused, not handed to the pool.
  CUdeviceptr lake = 0;
  REQUIRE_EQ(cu.MemAllocFromPoolAsync(&lake, 4 * kMiB, d.pool, s),
             CUDA_SUCCESS);
  REQUIRE_EQ(BeginCapture(c, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
             CUDA_SUCCESS);
  CHECK_EQ(cu.MemFreeAsync(lake, c), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  // A pool address made under capture ...
  CUdeviceptr pool = 0;
  REQUIRE_EQ(cu.MemAllocFromPoolAsync(&pool, 4 * kMiB, d.pool, c),
             CUDA_SUCCESS);
  REQUIRE_EQ(EndCapture(c), CUDA_SUCCESS);
  CHECK_EQ(FakeCalls("cuMemFreeAsync"), frees);
  CHECK_EQ(Gauge(0, "live_allocations"), 1);
  // ... is freed by the pool after it, and the lake address by the lake.
  CHECK_EQ(cu.MemFreeAsync(pool, s), CUDA_SUCCESS);
  CHECK_EQ(FakeCalls("cuMemFreeAsync"), frees + 1);
  CHECK_EQ(cu.MemFreeAsync(lake, s), CUDA_SUCCESS);
  CHECK_EQ(Gauge(0, "live_allocations"), 0);
  // A second free of the lake address is the lake's error, not the pool's.
  CHECK_EQ(cu.MemFreeAsync(lake, s), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(cu.MemFreeAsync(lake + 256, s), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(FakeCalls("cuMemFreeAsync"), frees + 1);
  CHECK_EQ(CaptureRefusals(), 0u);
}

TEST(get_proc_address_answers_capture_names_with_the_shim) {
  const Cuda& cu = Cu();
  struct Case {
    const char* name;
    cuuint64_t flags;
    const char* want;
  };
  const Case cases[] = {
      {"cuStreamBeginCapture", 0, "cuStreamBeginCapture_v2"},
      {"cuStreamBeginCapture", 2, "cuStreamBeginCapture_v2_ptsz"},
      {"cuStreamEndCapture", 0, "cuStreamEndCapture"},
      {"cuStreamEndCapture", 2, "cuStreamEndCapture_ptsz"},
      {"cuMemPoolTrimTo", 0, "cuMemPoolTrimTo"},
  };
  for (const Case& c : cases) {
    void* fn = nullptr;
    CHECK_EQ(cu.GetProcAddress_v2(c.name, &fn, 12080, c.flags, nullptr),
             CUDA_SUCCESS);
    CHECK(fn != nullptr && fn == ::dlsym(g_shim, c.want));
  }
}

TEST(get_proc_address_answers_allocation_names_with_the_shim) {
  // The entry points whose memory the shim counts as outside the lakes
  // (those the fake GPU has: cuMemAlloc_v2, cuMemFree_v2, cuMemCreate,
  // cuMemRelease).
  const Cuda& cu = Cu();
  struct Case {
    const char* name;
    const char* want;
  };
  const Case cases[] = {
      {"cuMemAlloc", "cuMemAlloc_v2"},   {"cuMemAlloc_v2", "cuMemAlloc_v2"},
      {"cuMemFree", "cuMemFree_v2"},     {"cuMemCreate", "cuMemCreate"},
      {"cuMemRelease", "cuMemRelease"},
  };
  for (const Case& c : cases) {
    void* fn = nullptr;
    CHECK_EQ(cu.GetProcAddress_v2(c.name, &fn, 12080, 0, nullptr),
             CUDA_SUCCESS);
    CHECK(fn != nullptr && fn == ::dlsym(g_shim, c.want));
    CHECK(fn != ::dlsym(g_fake, c.want));
  }
}

TEST(range_queries_inside_a_lake_allocation_answer_with_the_allocation) {
  // A buffer's range, as NCCL, RDMA and cuFile ask for it, is the whole
  // lake allocation from any address inside it: the driver would report
  // one mapping, a piece of a stitched buffer (torchcomms#3078). The fake
  // GPU answers with the mapping, as the driver does.
  const Cuda& cu = Cu();
  const Device d = Ready(0);
  auto* range = Sym<CUresult(CUdeviceptr*, std::size_t*, CUdeviceptr)>(
      g_libcuda, "cuMemGetAddressRange_v2");
  auto* attribute = Sym<CUresult(void*, int, CUdeviceptr)>(
      g_libcuda, "cuPointerGetAttribute");
  const std::size_t bytes = 5 * kMiB + 3;
  CUdeviceptr p = 0;
  CHECK_EQ(cu.MemAllocFromPoolAsync(&p, bytes, d.pool, nullptr),
           CUDA_SUCCESS);
  CUdeviceptr base = 0;
  std::size_t size = 0;
  CHECK_EQ(range(&base, &size, p + kMiB), CUDA_SUCCESS);
  CHECK(base == p);
  CHECK_EQ(size, bytes);
  CUdeviceptr start = 0;
  CHECK_EQ(attribute(&start, 11, p + bytes - 1), CUDA_SUCCESS);  // START
  CHECK(start == p);
  std::size_t n = 0;
  CHECK_EQ(attribute(&n, 12, p), CUDA_SUCCESS);  // RANGE_SIZE
  CHECK_EQ(n, bytes);
  CHECK_EQ(cu.MemFreeAsync(p, nullptr), CUDA_SUCCESS);
  // Freed, the address is the driver's business again: the shim's answer
  // is the fake GPU's own.
  auto* own = jaxlake::testing::FakeGpuFn<CUresult(CUdeviceptr*, std::size_t*,
                                                   CUdeviceptr)>(
      "cuMemGetAddressRange_v2");
  CUdeviceptr own_base = 0;
  std::size_t own_size = 0;
  CHECK_EQ(range(&base, &size, p), own(&own_base, &own_size, p));
  CHECK(base == own_base);
  CHECK_EQ(size, own_size);
  CHECK(base != p || size != bytes);
}

TEST(a_thread_without_a_context_can_allocate) {
  const Cuda& cu = Cu();
  const Device d = Ready(0);
  Drain();  // the lake must call the driver (create, map) for this request
  CUresult alloc = -1, release = -1;
  CUcontext before = d.ctx, after = d.ctx;
  std::thread worker([&] {
    cu.CtxGetCurrent(&before);
    CUdeviceptr p = 0;
    alloc = cu.MemAllocFromPoolAsync(&p, 6 * kMiB, d.pool, nullptr);
    if (alloc == CUDA_SUCCESS) release = cu.MemFreeAsync(p, nullptr);
    cu.CtxGetCurrent(&after);
  });
  worker.join();
  CHECK(before == nullptr);
  CHECK_EQ(alloc, CUDA_SUCCESS);
  CHECK_EQ(release, CUDA_SUCCESS);
  CHECK(after == nullptr);  // the lake's context switch was undone
}

TEST(concurrent_calls_from_many_threads) {
  // Threads allocate, touch and free on streams of their own, some of them
  // with no current context, while a trace records every call.
  const Cuda& cu = Cu();
  const Device d = Ready(0);
  Drain();
  const std::string trace = TempPath("threads.jsonl");
  REQUIRE_EQ(Api<decltype(jaxlake_shim_trace_start)>(
                 "jaxlake_shim_trace_start")(trace.c_str(), "threads"),
             0);
  constexpr int kThreads = 8, kRounds = 100;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      if (t % 2 == 0) cu.CtxSetCurrent(d.ctx);
      CUstream s = nullptr;
      if (t % 2 == 0 && cu.StreamCreate(&s, 0) != CUDA_SUCCESS) ++failures;
      for (int i = 0; i < kRounds; ++i) {
        // 1 KiB .. 3 MiB, small and large requests alike.
        const std::size_t size = std::size_t{1024} << ((t + i) % 12);
        CUdeviceptr p = 0;
        if (cu.MemAllocFromPoolAsync(&p, size, d.pool, s) != CUDA_SUCCESS) {
          ++failures;
          continue;
        }
        reinterpret_cast<unsigned char*>(p)[size - 1] =
            static_cast<unsigned char>(i);
        if (cu.MemFreeAsync(p, s) != CUDA_SUCCESS) ++failures;
      }
    });
  }
  for (std::thread& th : threads) th.join();
  CHECK_EQ(failures.load(), 0);
  CHECK_EQ(Api<decltype(jaxlake_shim_trace_stop)>("jaxlake_shim_trace_stop")(),
           2 * kThreads * kRounds);
  CHECK_EQ(ReadLines(trace).size(), 1u + 2 * kThreads * kRounds);
  ::unlink(trace.c_str());
  CHECK_EQ(Gauge(0, "live_allocations"), 0);
  Drain();
}

TEST(empty_cache_gives_memory_back_to_the_driver) {
  const Cuda& cu = Cu();
  const Device d = Ready(0);
  const CUstream s = NewStream();
  Drain();
  const auto base = CreatedBytes(0);
  CUdeviceptr p = 0;
  REQUIRE_EQ(cu.MemAllocFromPoolAsync(&p, 16 * kMiB, d.pool, s), CUDA_SUCCESS);
  CHECK_EQ(cu.MemFreeAsync(p, s), CUDA_SUCCESS);
  CHECK(CreatedBytes(0) >= base + 16 * kMiB);
  const long long released = EmptyCache(0);
  CHECK(released >= static_cast<long long>(16 * kMiB));
  CHECK_EQ(CreatedBytes(0), base);
  CHECK_EQ(Gauge(0, "bytes_reserved"), 0);
  CHECK_EQ(EmptyCache(7), -1);  // no lake there
}

}  // namespace
