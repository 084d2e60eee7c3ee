// Tests of the shim's hooks over the fake GPU: pool allocations served by
// the lake with their streams, pool attributes, out of memory, forwarded
// calls, memory outside the lakes, devices and peers. Part of shim_test
// (shim_test.cc says how it runs).
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

// ---- the hooks --------------------------------------------------------------

TEST(pool_allocations_are_served_by_the_lake_with_their_stream) {
  const Cuda& cu = Cu();
  const Device d = Ready(0);
  const CUstream s1 = NewStream(), s2 = NewStream();
  Drain();
  const auto native = FakeCalls("cuMemAllocFromPoolAsync");
  const long long allocs = Counter(0, "allocs");  // -1: no lake yet
  const std::string trace = TempPath("served.jsonl");
  auto* trace_start =
      Api<decltype(jaxlake_shim_trace_start)>("jaxlake_shim_trace_start");
  auto* trace_stop =
      Api<decltype(jaxlake_shim_trace_stop)>("jaxlake_shim_trace_stop");
  REQUIRE_EQ(trace_start(trace.c_str(), "served"), 0);

  CUdeviceptr big = 0, small = 0;
  REQUIRE_EQ(cu.MemAllocFromPoolAsync(&big, 8 * kMiB, d.pool, s1),
             CUDA_SUCCESS);
  REQUIRE_EQ(cu.MemAllocFromPoolAsync(&small, 1000, d.pool, s2), CUDA_SUCCESS);
  CHECK_EQ(big % 256, 0u);
  CHECK_EQ(small % 256, 0u);
  // The fake GPU's memory is host memory: the bytes are real.
  std::memset(reinterpret_cast<void*>(big), 0xAB, 8 * kMiB);
  std::memset(reinterpret_cast<void*>(small), 0xCD, 1000);
  CHECK_EQ(reinterpret_cast<unsigned char*>(big)[8 * kMiB - 1], 0xAB);
  CHECK_EQ(reinterpret_cast<unsigned char*>(small)[999], 0xCD);
  // Served by the lake, not by the driver's own pool.
  CHECK_EQ(FakeCalls("cuMemAllocFromPoolAsync"), native);
  CHECK(CreatedBytes(0) >= 8 * kMiB);
  CHECK_EQ(Counter(0, "allocs"), (allocs < 0 ? 0 : allocs) + 2);
  CHECK_EQ(Gauge(0, "bytes_in_use"), static_cast<long long>(8 * kMiB + 1000));
  CHECK(Counter(0, "create") >= 1);  // driver calls of the lake

  CHECK_EQ(cu.MemFreeAsync(big, s1), CUDA_SUCCESS);
  CHECK_EQ(cu.MemFreeAsync(small, s2), CUDA_SUCCESS);
  CHECK_EQ(Gauge(0, "bytes_in_use"), 0);
  CHECK_EQ(trace_stop(), 4);
  CHECK_EQ(trace_stop(), -1);

  // The trace names each call's stream.
  const std::vector<std::string> lines = ReadLines(trace);
  REQUIRE_EQ(lines.size(), 5u);
  CHECK(lines[0].find("\"format\": \"jaxlake-trace\"") != std::string::npos);
  CHECK(lines[0].find("\"name\": \"served\"") != std::string::npos);
  CHECK(lines[0].find("\"source\": \"shim\"") != std::string::npos);
  CHECK_EQ(JsonInt(lines[0], "devices"), jaxlake::testing::kFakeDevices);
  CHECK(lines[1].find("\"op\":\"alloc\"") != std::string::npos);
  CHECK_EQ(JsonInt(lines[1], "size"), static_cast<long long>(8 * kMiB));
  CHECK_EQ(JsonInt(lines[1], "stream"), static_cast<long long>(Value(s1)));
  CHECK_EQ(JsonInt(lines[2], "size"), 1000);
  CHECK_EQ(JsonInt(lines[2], "stream"), static_cast<long long>(Value(s2)));
  CHECK(lines[3].find("\"op\":\"free\"") != std::string::npos);
  CHECK_EQ(JsonInt(lines[3], "id"), JsonInt(lines[1], "id"));
  CHECK_EQ(JsonInt(lines[3], "stream"), static_cast<long long>(Value(s1)));
  CHECK_EQ(JsonInt(lines[4], "id"), JsonInt(lines[2], "id"));
  ::unlink(trace.c_str());
  CHECK(HookCount("cuMemAllocFromPoolAsync", "served") >= 2);
  CHECK(HookCount("cuMemFreeAsync", "served") >= 2);
}

TEST(null_streams_are_the_legacy_or_per_thread_stream) {
  // The legacy stream (null in the plain entry points, or its handle) is
  // one stream for every thread: the lake serves it as stream 0. The
  // per-thread default stream (null in the _ptsz ones, or its handle) is
  // one per thread, so the driver's pool serves it.
  const Cuda& cu = Cu();
  const Device d = Ready(0);
  Drain();
  const std::string trace = TempPath("streams.jsonl");
  REQUIRE_EQ(Api<decltype(jaxlake_shim_trace_start)>(
                 "jaxlake_shim_trace_start")(trace.c_str(), nullptr),
             0);
  const auto native = FakeCalls("cuMemAllocFromPoolAsync_ptsz") +
                      FakeCalls("cuMemAllocFromPoolAsync");
  const auto native_frees =
      FakeCalls("cuMemFreeAsync_ptsz") + FakeCalls("cuMemFreeAsync");
  CUdeviceptr a = 0, b = 0, c = 0;
  CHECK_EQ(cu.MemAllocFromPoolAsync(&a, 4 * kMiB, d.pool, nullptr),
           CUDA_SUCCESS);
  CHECK_EQ(cu.MemAllocFromPoolAsync_ptsz(&b, 4 * kMiB, d.pool, nullptr),
           CUDA_SUCCESS);
  CHECK_EQ(cu.MemAllocFromPoolAsync(
               &c, 4 * kMiB, d.pool, reinterpret_cast<CUstream>(kStreamPerThread)),
           CUDA_SUCCESS);
  CHECK_EQ(FakeCalls("cuMemAllocFromPoolAsync_ptsz") +
               FakeCalls("cuMemAllocFromPoolAsync"),
           native + 2);
  CHECK_EQ(Gauge(0, "live_allocations"), 1);
  CHECK_EQ(cu.MemFreeAsync_ptsz(b, nullptr), CUDA_SUCCESS);
  CHECK_EQ(cu.MemFreeAsync(c, reinterpret_cast<CUstream>(kStreamPerThread)),
           CUDA_SUCCESS);
  CHECK_EQ(FakeCalls("cuMemFreeAsync_ptsz") + FakeCalls("cuMemFreeAsync"),
           native_frees + 2);
  CHECK_EQ(cu.MemFreeAsync(a, reinterpret_cast<CUstream>(kStreamLegacy)),
           CUDA_SUCCESS);
  CHECK_EQ(Api<decltype(jaxlake_shim_trace_stop)>("jaxlake_shim_trace_stop")(),
           2);
  const std::vector<std::string> lines = ReadLines(trace);
  REQUIRE_EQ(lines.size(), 3u);
  CHECK_EQ(JsonInt(lines[1], "stream"), 0);
  CHECK_EQ(JsonInt(lines[2], "stream"), 0);
  ::unlink(trace.c_str());
  CHECK(HookCount("cuMemAllocFromPoolAsync_ptsz", "forwarded") >= 1);
  CHECK(HookCount("cuMemFreeAsync_ptsz", "forwarded") >= 1);
}

TEST(per_thread_default_streams_never_share_lake_memory) {
  // Two threads each allocate and free on their own per-thread default
  // stream while the other holds memory: no block freed on one thread's
  // stream can reach the other thread unordered, because neither comes
  // from the lake.
  const Cuda& cu = Cu();
  const Device d = Ready(0);
  Drain();
  const long long allocs = Counter(0, "allocs");
  std::atomic<int> failures{0};
  std::atomic<int> phase{0};
  CUdeviceptr first = 0, second = 0;
  std::thread one([&] {
    cu.CtxSetCurrent(d.ctx);
    if (cu.MemAllocFromPoolAsync_ptsz(&first, 8 * kMiB, d.pool, nullptr) != 0)
      ++failures;
    if (cu.MemFreeAsync_ptsz(first, nullptr) != 0) ++failures;
    phase = 1;
  });
  std::thread two([&] {
    cu.CtxSetCurrent(d.ctx);
    while (phase.load() == 0) std::this_thread::yield();
    if (cu.MemAllocFromPoolAsync_ptsz(&second, 8 * kMiB, d.pool, nullptr) != 0)
      ++failures;
    if (cu.MemFreeAsync_ptsz(second, nullptr) != 0) ++failures;
  });
  one.join();
  two.join();
  CHECK_EQ(failures.load(), 0);
  CHECK_EQ(Counter(0, "allocs"), allocs);  // the lake served neither
  CHECK_EQ(Gauge(0, "live_allocations"), 0);
}

TEST(reuse_across_streams_waits_for_the_event) {
  const Cuda& cu = Cu();
  const Device d = Ready(0);
  const CUstream s1 = NewStream(), s2 = NewStream();
  Drain();
  CUdeviceptr a = 0, b = 0, c = 0;
  REQUIRE_EQ(cu.MemAllocFromPoolAsync(&a, 32 * kMiB, d.pool, s1),
             CUDA_SUCCESS);
  // The free is queued on s1, whose work stays in flight while it is held.
  Hold(s1);
  CHECK_EQ(cu.MemFreeAsync(a, s1), CUDA_SUCCESS);
  // s1 itself may reuse the block at once (stream order protects it) ...
  CHECK_EQ(cu.MemAllocFromPoolAsync(&b, 32 * kMiB, d.pool, s1), CUDA_SUCCESS);
  CHECK_EQ(b, a);
  CHECK_EQ(cu.MemFreeAsync(b, s1), CUDA_SUCCESS);
  // ... another stream may not while that work is pending.
  CHECK_EQ(cu.MemAllocFromPoolAsync(&c, 32 * kMiB, d.pool, s2), CUDA_SUCCESS);
  CHECK(c != a);
  CHECK_EQ(cu.MemFreeAsync(c, s2), CUDA_SUCCESS);
  // The capacity is now all held: a request for all of it on s2 must wait
  // for the event recorded on s1, which completes when s1 is released.
  const long long waits = Counter(0, "event_waits");
  const auto syncs = FakeCalls("cuEventSynchronize");
  std::atomic<bool> released{false};
  std::thread releaser([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    released = true;
    Release(s1);
  });
  const auto start = std::chrono::steady_clock::now();
  CUdeviceptr all = 0;
  const CUresult r = cu.MemAllocFromPoolAsync(&all, kCapacity, d.pool, s2);
  const bool after_release = released.load();
  const auto waited = std::chrono::steady_clock::now() - start;
  releaser.join();
  CHECK_EQ(r, CUDA_SUCCESS);
  CHECK(after_release);
  CHECK(waited >= std::chrono::milliseconds(150));
  CHECK(Counter(0, "event_waits") > waits);
  CHECK(FakeCalls("cuEventSynchronize") > syncs);
  if (r == CUDA_SUCCESS) CHECK_EQ(cu.MemFreeAsync(all, s2), CUDA_SUCCESS);
  Drain();
}

TEST(pool_attributes_report_the_lake) {
  const Cuda& cu = Cu();
  const Device d = Ready(0);
  const CUstream s = NewStream();
  Drain();
  CUdeviceptr p = 0;
  REQUIRE_EQ(cu.MemAllocFromPoolAsync(&p, 8 * kMiB + 1, d.pool, s),
             CUDA_SUCCESS);
  auto attr = [&](int which) {
    cuuint64_t v = ~cuuint64_t{0};
    CHECK_EQ(cu.MemPoolGetAttribute(d.pool, which, &v), CUDA_SUCCESS);
    return v;
  };
  // Used: the allocation as handed out (rounded up to the alignment).
  CHECK_EQ(attr(CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 8 * kMiB + 256);
  CHECK(attr(CU_MEMPOOL_ATTR_USED_MEM_HIGH) >= 8 * kMiB + 256);
  CHECK_EQ(attr(CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT),
           static_cast<cuuint64_t>(Gauge(0, "bytes_reserved")));
  CHECK(attr(CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) >= 10 * kMiB);
  CHECK(attr(CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH) >=
        attr(CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT));
  // The driver's own pool memory (here made behind the shim's back) adds
  // to the lake's.
  auto* native =
      Sym<CUresult(CUdeviceptr*, std::size_t, CUmemoryPool, CUstream)>(
          g_fake, "cuMemAllocFromPoolAsync");
  CUdeviceptr q = 0;
  REQUIRE_EQ(native(&q, 4096, d.pool, s), CUDA_SUCCESS);
  CHECK_EQ(attr(CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 8 * kMiB + 256 + 4096);
  CHECK_EQ(cu.MemFreeAsync(q, s), CUDA_SUCCESS);
  // Other attributes are the driver's, and so are sets: XLA's release
  // threshold reaches the driver's pool and reads back.
  auto* set = Sym<CUresult(CUmemoryPool, int, void*)>(g_libcuda,
                                                      "cuMemPoolSetAttribute");
  cuuint64_t threshold = 1ull << 40;
  CHECK_EQ(set(d.pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold),
           CUDA_SUCCESS);
  const auto before = FakeCalls("cuMemPoolGetAttribute");
  threshold = 0;
  CHECK_EQ(cu.MemPoolGetAttribute(d.pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                                  &threshold),
           CUDA_SUCCESS);
  CHECK_EQ(threshold, 1ull << 40);
  CHECK_EQ(FakeCalls("cuMemPoolGetAttribute"), before + 1);
  int reuse = -1;
  CHECK_EQ(cu.MemPoolGetAttribute(
               d.pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES,
               &reuse),
           CUDA_SUCCESS);
  CHECK_EQ(reuse, 1);  // the driver's default
  // A reset of a high mark is the driver's; the lake's peak stays.
  cuuint64_t zero = 0;
  CHECK_EQ(set(d.pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &zero), CUDA_SUCCESS);
  CHECK(attr(CU_MEMPOOL_ATTR_USED_MEM_HIGH) >= 10 * kMiB);
  CHECK_EQ(cu.MemFreeAsync(p, s), CUDA_SUCCESS);
  CHECK_EQ(attr(CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 0u);
  // Trimming releases the lake's cached memory beyond the bytes to keep.
  auto* trim =
      Sym<CUresult(CUmemoryPool, std::size_t)>(g_libcuda, "cuMemPoolTrimTo");
  const auto trims = FakeCalls("cuMemPoolTrimTo");
  CHECK(Gauge(0, "bytes_reserved") > 0);
  CHECK_EQ(trim(d.pool, 1ull << 40), CUDA_SUCCESS);
  CHECK(Gauge(0, "bytes_reserved") > 0);
  // The lake fences what it releases with an event on the stream of the
  // free; once the fake GPU's stream ran it, a second trim releases all.
  CHECK_EQ(trim(d.pool, 0), CUDA_SUCCESS);
  Finish();
  CHECK_EQ(trim(d.pool, 0), CUDA_SUCCESS);
  CHECK_EQ(Gauge(0, "bytes_reserved"), 0);
  CHECK_EQ(FakeCalls("cuMemPoolTrimTo"), trims + 3);
  CHECK_EQ(attr(CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0u);
}

TEST(pool_queries_do_not_create_a_lake) {
  const Cuda& cu = Cu();
  const Device d = Ready(1);
  const std::vector<int> before = LakeDevices();
  const bool had = std::find(before.begin(), before.end(), 1) != before.end();
  for (int which : {CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
                    CU_MEMPOOL_ATTR_USED_MEM_HIGH}) {
    cuuint64_t v = ~cuuint64_t{0};
    CHECK_EQ(cu.MemPoolGetAttribute(d.pool, which, &v), CUDA_SUCCESS);
    if (!had) CHECK_EQ(v, PoolBytes(1));
  }
  auto* trim =
      Sym<CUresult(CUmemoryPool, std::size_t)>(g_libcuda, "cuMemPoolTrimTo");
  CHECK_EQ(trim(d.pool, 0), CUDA_SUCCESS);
  const std::vector<int> after = LakeDevices();
  CHECK_EQ(std::find(after.begin(), after.end(), 1) != after.end(), had);
  Ready(0);
}

TEST(out_of_memory_is_reported_and_recovers) {
  const Cuda& cu = Cu();
  const Device d = Ready(0);
  const CUstream s = NewStream();
  Drain();
  const long long ooms = Counter(0, "ooms");
  const long long failed = HookCount("cuMemAllocFromPoolAsync", "failed");
  CUdeviceptr p[4] = {};
  for (CUdeviceptr& q : p)
    REQUIRE_EQ(cu.MemAllocFromPoolAsync(&q, 16 * kMiB, d.pool, s),
               CUDA_SUCCESS);
  CUdeviceptr extra = 0;
  CHECK_EQ(cu.MemAllocFromPoolAsync(&extra, 16 * kMiB, d.pool, s),
           CUDA_ERROR_OUT_OF_MEMORY);
  CHECK_EQ(cu.MemAllocFromPoolAsync(&extra, 2 * kCapacity, d.pool, s),
           CUDA_ERROR_OUT_OF_MEMORY);
  CHECK_EQ(Counter(0, "ooms"), ooms + 2);
  CHECK_EQ(HookCount("cuMemAllocFromPoolAsync", "failed"), failed + 2);
  // After a free the same request succeeds.
  CHECK_EQ(cu.MemFreeAsync(p[1], s), CUDA_SUCCESS);
  CHECK_EQ(cu.MemAllocFromPoolAsync(&p[1], 16 * kMiB, d.pool, s),
           CUDA_SUCCESS);
  for (CUdeviceptr q : p) CHECK_EQ(cu.MemFreeAsync(q, s), CUDA_SUCCESS);
}

TEST(frees_of_foreign_pointers_are_forwarded) {
  const Cuda& cu = Cu();
  const Device d = Ready(0);
  const CUstream s = NewStream();
  // Allocated by the driver's own pool (as before the shim took over).
  CUdeviceptr p = 0;
  auto* native =
      Sym<CUresult(CUdeviceptr*, std::size_t, CUmemoryPool, CUstream)>(
          g_fake, "cuMemAllocFromPoolAsync");
  REQUIRE_EQ(native(&p, 4096, d.pool, s), CUDA_SUCCESS);
  const auto pool = PoolBytes(0);
  const auto frees = FakeCalls("cuMemFreeAsync");
  CHECK_EQ(cu.MemFreeAsync(p, s), CUDA_SUCCESS);
  CHECK_EQ(FakeCalls("cuMemFreeAsync"), frees + 1);
  CHECK_EQ(PoolBytes(0), pool - 4096);
  // The driver's answer for a pointer nobody owns comes back unchanged.
  CHECK_EQ(cu.MemFreeAsync(0x1234, s), CUDA_ERROR_INVALID_VALUE);
}

TEST(forwarded_pool_calls_stay_with_the_driver) {
  // Inactive: every pool. Active: device 2, which lacks VMM.
  const Cuda& cu = Cu();
  const bool active = InactiveBecause() == nullptr;
  const int ordinal = active ? 2 : 0;
  const Device d = Ready(ordinal);
  const CUstream s = NewStream();
  const auto allocs = FakeCalls("cuMemAllocFromPoolAsync");
  const auto frees = FakeCalls("cuMemFreeAsync");
  CUdeviceptr p = 0;
  REQUIRE_EQ(cu.MemAllocFromPoolAsync(&p, kMiB, d.pool, s), CUDA_SUCCESS);
  CHECK_EQ(FakeCalls("cuMemAllocFromPoolAsync"), allocs + 1);
  CHECK(PoolBytes(ordinal) >= kMiB);
  cuuint64_t used = 0;
  CHECK_EQ(cu.MemPoolGetAttribute(d.pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT,
                                  &used),
           CUDA_SUCCESS);
  CHECK_EQ(used, PoolBytes(ordinal));
  CHECK_EQ(cu.MemFreeAsync(p, s), CUDA_SUCCESS);
  CHECK_EQ(FakeCalls("cuMemFreeAsync"), frees + 1);
  CHECK(HookCount("cuMemAllocFromPoolAsync", "forwarded") >= 1);
  if (active) {
    CHECK(Reason().find("device 2") != std::string::npos);
    CHECK(Reason().find("virtual memory management") != std::string::npos);
    for (int dev : LakeDevices()) CHECK(dev != 2);
  } else {
    CHECK(LakeDevices().empty());
  }
  Ready(0);
}

// The figure after `"outside_pool": {"<field>": ` in the status.
long long Outside(const std::string& field) {
  const std::string status = Status();
  const std::size_t at = status.find("\"outside_pool\": {");
  return at == std::string::npos ? -1 : JsonInt(status.substr(at), field);
}

TEST(memory_outside_the_lakes_is_counted_and_traced) {
  const Cuda& cu = Cu();
  const bool active = InactiveBecause() == nullptr;
  const Device d = Ready(0);
  const CUstream s = NewStream();
  auto* alloc = Sym<CUresult(CUdeviceptr*, std::size_t)>(g_libcuda,
                                                          "cuMemAlloc_v2");
  auto* free_ = Sym<CUresult(CUdeviceptr)>(g_libcuda, "cuMemFree_v2");
  auto* create = Sym<CUresult(CUmemGenericAllocationHandle*, std::size_t,
                              const CUmemAllocationProp*, unsigned long long)>(
      g_libcuda, "cuMemCreate");
  auto* release =
      Sym<CUresult(CUmemGenericAllocationHandle)>(g_libcuda, "cuMemRelease");
  REQUIRE(alloc != nullptr && free_ != nullptr && create != nullptr &&
          release != nullptr);
  const std::string trace = TempPath("outside.jsonl");
  REQUIRE_EQ(Api<decltype(jaxlake_shim_trace_start)>(
                 "jaxlake_shim_trace_start")(trace.c_str(), "outside"),
             0);
  const long long base = Outside("current");
  REQUIRE(base >= 0);
  CHECK_EQ(Outside("peak"), base);  // the trace's start resets the peak
  const long long bytes = HookCount("cuMemAlloc_v2", "forwarded_bytes");

  CUdeviceptr a = 0, b = 0;
  const auto fake_allocs = FakeCalls("cuMemAlloc_v2");
  REQUIRE_EQ(alloc(&a, 3 * kMiB), CUDA_SUCCESS);
  CHECK_EQ(FakeCalls("cuMemAlloc_v2"), fake_allocs + 1);
  CHECK_EQ(HookCount("cuMemAlloc_v2", "forwarded_bytes"),
           bytes + static_cast<long long>(3 * kMiB));
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  CUmemGenericAllocationHandle h = 0;
  REQUIRE_EQ(create(&h, 2 * kMiB, &prop, 0), CUDA_SUCCESS);
  CHECK_EQ(Outside("current"), base + static_cast<long long>(5 * kMiB));
  CHECK_EQ(free_(a), CUDA_SUCCESS);
  REQUIRE_EQ(alloc(&b, kMiB), CUDA_SUCCESS);
  CHECK_EQ(Outside("current"), base + static_cast<long long>(3 * kMiB));
  // A failed free takes nothing off.
  CHECK_EQ(free_(0x1234), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(Outside("current"), base + static_cast<long long>(3 * kMiB));
  // A pool allocation the shim forwards (device 2 has no lake) counts
  // until its free; one the lake serves, and the lake's own cuMemCreate
  // calls behind it, do not.
  const Device other = Ready(2);
  CUdeviceptr p = 0;
  REQUIRE_EQ(cu.MemAllocFromPoolAsync(&p, kMiB, other.pool, s),
             CUDA_SUCCESS);
  CHECK_EQ(Outside("current"), base + static_cast<long long>(4 * kMiB));
  CHECK_EQ(cu.MemFreeAsync(p, s), CUDA_SUCCESS);
  Ready(0);
  EmptyCache(-1);  // the lake has to grow for the allocation below
  const auto created = CreatedBytes(0);
  CUdeviceptr q = 0;
  REQUIRE_EQ(cu.MemAllocFromPoolAsync(&q, 8 * kMiB, d.pool, s),
             CUDA_SUCCESS);
  if (active) CHECK(CreatedBytes(0) > created);  // the lake grew
  CHECK_EQ(Outside("current"),
           base + static_cast<long long>((active ? 3 : 11) * kMiB));
  CHECK_EQ(cu.MemFreeAsync(q, s), CUDA_SUCCESS);
  CHECK_EQ(release(h), CUDA_SUCCESS);
  CHECK_EQ(free_(b), CUDA_SUCCESS);
  CHECK_EQ(Outside("current"), base);
  const long long peak = base + static_cast<long long>(
                                    (active ? 5 : 11) * kMiB);
  CHECK_EQ(Outside("peak"), peak);
  CHECK(Outside("allocations") >= 4);
  Api<decltype(jaxlake_shim_trace_stop)>("jaxlake_shim_trace_stop")();

  // The header carries the peak since the trace started.
  const std::vector<std::string> lines = ReadLines(trace);
  REQUIRE(!lines.empty());
  CHECK_EQ(JsonInt(lines[0], "outside_pool_bytes"), peak);
  CHECK(lines[0].find("\"meta\": {\"outside_pool_bytes\": ") !=
        std::string::npos);
  CHECK_EQ(lines[0].substr(lines[0].size() - 2), "}}");
  ::unlink(trace.c_str());
}

TEST(each_device_gets_its_own_lake) {
  const Cuda& cu = Cu();
  const Device d1 = Ready(1);
  const CUstream s = NewStream();
  const auto created = CreatedBytes(1);
  CUdeviceptr p = 0;
  REQUIRE_EQ(cu.MemAllocFromPoolAsync(&p, 4 * kMiB, d1.pool, s), CUDA_SUCCESS);
  CHECK(CreatedBytes(1) >= created + 4 * kMiB);
  const std::vector<int> devices = LakeDevices();
  CHECK(std::find(devices.begin(), devices.end(), 1) != devices.end());
  CHECK_EQ(Api<decltype(jaxlake_shim_num_lakes)>("jaxlake_shim_num_lakes")(),
           static_cast<int>(devices.size()));
  CHECK_EQ(JsonInt(Stats(1), "device"), 1);
  CHECK(Counter(1, "allocs") >= 1);
  CHECK_EQ(cu.MemFreeAsync(p, s), CUDA_SUCCESS);
  CHECK(EmptyCache(1) >= static_cast<long long>(4 * kMiB));
  Ready(0);
}

TEST(peers_get_access_to_the_lake_memory) {
  // Devices 0 and 1 can access each other: one cuMemSetAccess call per
  // range, with a descriptor for each.
  const Cuda& cu = Cu();
  const Device d = Ready(0);
  const CUstream s = NewStream();
  Drain();
  const auto calls = FakeCalls("cuMemSetAccess");
  CUdeviceptr p = 0;
  REQUIRE_EQ(cu.MemAllocFromPoolAsync(&p, 8 * kMiB, d.pool, s), CUDA_SUCCESS);
  CHECK_EQ(FakeCalls("cuMemSetAccess"), calls + 1);
  // The mapping behind p was granted access for devices 0 and 1 (bits).
  CHECK_EQ(FAKEGPU(jaxlake_fakegpu_access)(p), 3u);
  CHECK_EQ(cu.MemFreeAsync(p, s), CUDA_SUCCESS);
}

}  // namespace
