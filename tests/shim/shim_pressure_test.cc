// Tests of the lake's room on the device over the fake GPU: its capacity
// rule, a lake whose capacity is more than the device has left, and memory
// given back when another allocation of the process finds the device full.
// Part of shim_test (shim_test.cc says how it runs); shim_test_whole_device
// runs these with JAXLAKE_CAPACITY=0, where the lake may take the whole
// device.
#include <stdlib.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "tests/shim/shim_util.h"

namespace {

using namespace jaxlake::cuda;           // NOLINT: the driver's vocabulary
using namespace jaxlake::shim_testing;   // NOLINT: the tests' helpers

// True in the run without a capacity (JAXLAKE_CAPACITY=0): the lake's
// capacity is then the device's whole memory.
bool WholeDevice() {
  const char* cap = ::getenv("JAXLAKE_CAPACITY");
  return cap != nullptr && std::strcmp(cap, "0") == 0;
}

// The device's free memory, as cuMemGetInfo reports it through the shim.
std::size_t FreeBytes() {
  auto* info = Sym<CUresult(std::size_t*, std::size_t*)>(g_libcuda,
                                                         "cuMemGetInfo_v2");
  std::size_t free = 0, total = 0;
  if (info == nullptr || info(&free, &total) != CUDA_SUCCESS) {
    std::fprintf(stderr, "cuMemGetInfo_v2 failed through the shim\n");
    std::abort();
  }
  return free;
}

// The lakes' check(): "" when every invariant holds.
std::string LakeCheck() {
  return ApiString([](char* buf, std::size_t size) {
    return Api<decltype(jaxlake_shim_check)>("jaxlake_shim_check")(-1, buf,
                                                                   size);
  });
}

// Plain device memory taken past the lakes (cuMemAlloc_v2 through the
// shim), given back by Give().
struct Filler {
  CUdeviceptr p = 0;
  void Take(std::size_t bytes) {
    auto* alloc =
        Sym<CUresult(CUdeviceptr*, std::size_t)>(g_libcuda, "cuMemAlloc_v2");
    REQUIRE_EQ(alloc(&p, bytes), CUDA_SUCCESS);
  }
  void Give() {
    auto* free_ = Sym<CUresult(CUdeviceptr)>(g_libcuda, "cuMemFree_v2");
    if (p != 0) CHECK_EQ(free_(p), CUDA_SUCCESS);
    p = 0;
  }
};

TEST(capacity_follows_the_rule) {
  // JAXLAKE_CAPACITY (main() sets 64 MiB) is a hard cap; without any
  // capacity or fraction the lake may hold the whole device.
  const Cuda& cu = Cu();
  const Device d = Ready(0);
  const CUstream s = NewStream();
  CUdeviceptr p = 0;
  REQUIRE_EQ(cu.MemAllocFromPoolAsync(&p, kMiB, d.pool, s), CUDA_SUCCESS);
  CHECK_EQ(JsonInt(Stats(0), "capacity"),
           static_cast<long long>(WholeDevice() ? jaxlake::testing::kFakeDeviceBytes
                                                : kCapacity));
  CHECK_EQ(cu.MemFreeAsync(p, s), CUDA_SUCCESS);
}

TEST(a_lake_beyond_what_the_device_has_left_fails_cleanly) {
  // Other allocations took all but 16 MiB of the device: a 40 MiB request,
  // within the lake's capacity, finds the driver refusing; the lake says
  // out of memory, stays consistent and usable, and serves the same
  // request once the memory is back.
  const Cuda& cu = Cu();
  const Device d = Ready(0);
  const CUstream s = NewStream();
  Drain();  // (the capacity is 64 MiB or the whole device)
  Filler filler;
  filler.Take(FreeBytes() - 16 * kMiB);
  const long long ooms = Counter(0, "ooms");
  CUdeviceptr big = 0, small = 0;
  CHECK_EQ(cu.MemAllocFromPoolAsync(&big, 40 * kMiB, d.pool, s),
           CUDA_ERROR_OUT_OF_MEMORY);
  CHECK_EQ(Counter(0, "ooms"), ooms + 1);
  CHECK_EQ(LakeCheck(), "");
  // Usable within what is left.
  REQUIRE_EQ(cu.MemAllocFromPoolAsync(&small, 8 * kMiB, d.pool, s),
             CUDA_SUCCESS);
  CHECK_EQ(LakeCheck(), "");
  filler.Give();
  REQUIRE_EQ(cu.MemAllocFromPoolAsync(&big, 40 * kMiB, d.pool, s),
             CUDA_SUCCESS);
  CHECK_EQ(LakeCheck(), "");
  CHECK_EQ(cu.MemFreeAsync(big, s), CUDA_SUCCESS);
  CHECK_EQ(cu.MemFreeAsync(small, s), CUDA_SUCCESS);
  Drain();
}

// One forwarded allocating entry point: its hook's name, and how to take
// and give back `bytes` through it. (cuMemAllocPitch_v2 takes the same path
// in the shim; the fake GPU does not implement it.)
struct Entry {
  const char* hook;
  std::function<CUresult(std::size_t, std::uintptr_t*)> take;
  std::function<CUresult(std::uintptr_t)> give;
};

std::vector<Entry> Entries(const Device& d, CUstream s) {
  auto* alloc =
      Sym<CUresult(CUdeviceptr*, std::size_t)>(g_libcuda, "cuMemAlloc_v2");
  auto* free_ = Sym<CUresult(CUdeviceptr)>(g_libcuda, "cuMemFree_v2");
  auto* async = Sym<CUresult(CUdeviceptr*, std::size_t, CUstream)>(
      g_libcuda, "cuMemAllocAsync");
  auto* create = Sym<CUresult(CUmemGenericAllocationHandle*, std::size_t,
                              const CUmemAllocationProp*, unsigned long long)>(
      g_libcuda, "cuMemCreate");
  auto* release =
      Sym<CUresult(CUmemGenericAllocationHandle)>(g_libcuda, "cuMemRelease");
  if (alloc == nullptr || free_ == nullptr || async == nullptr || create == nullptr || release == nullptr) {
    std::fprintf(stderr, "the shim lacks an allocating entry point\n");
    std::abort();
  }
  // A driver-pool free returns the memory to the pool, which keeps it
  // until trimmed: trimmed here so that the device has it back.
  auto* trim =
      Sym<CUresult(CUmemoryPool, std::size_t)>(g_libcuda, "cuMemPoolTrimTo");
  auto pool_free = [s, trim, pool = d.pool](std::uintptr_t p) {
    const CUresult r = Cu().MemFreeAsync(static_cast<CUdeviceptr>(p), s);
    Finish();
    trim(pool, 0);
    return r;
  };
  return {
      {"cuMemAlloc_v2",
       [alloc](std::size_t n, std::uintptr_t* out) {
         CUdeviceptr p = 0;
         const CUresult r = alloc(&p, n);
         *out = p;
         return r;
       },
       [free_](std::uintptr_t p) { return free_(p); }},
      {"cuMemAllocAsync",
       [async, s](std::size_t n, std::uintptr_t* out) {
         CUdeviceptr p = 0;
         const CUresult r = async(&p, n, s);
         *out = p;
         return r;
       },
       pool_free},
      {"cuMemCreate",
       [create](std::size_t n, std::uintptr_t* out) {
         CUmemAllocationProp prop{};
         prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
         prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
         prop.location.id = 0;
         CUmemGenericAllocationHandle h = 0;
         const CUresult r = create(&h, n, &prop, 0);
         *out = static_cast<std::uintptr_t>(h);
         return r;
       },
       [release](std::uintptr_t h) { return release(h); }},
      // The per-thread default stream's pool requests stay with the driver.
      {"cuMemAllocFromPoolAsync_ptsz",
       [pool = d.pool](std::size_t n, std::uintptr_t* out) {
         CUdeviceptr p = 0;
         const CUresult r =
             Cu().MemAllocFromPoolAsync_ptsz(&p, n, pool, nullptr);
         *out = p;
         return r;
       },
       [trim, pool = d.pool](std::uintptr_t p) {
         const CUresult r =
             Cu().MemFreeAsync_ptsz(static_cast<CUdeviceptr>(p), nullptr);
         Finish();
         trim(pool, 0);
         return r;
       }},
  };
}

TEST(memory_pressure_takes_back_the_lakes_cached_memory) {
  // The device is full but for 16 MiB, and the lake holds 48 MiB of it.
  // Live, the lake's memory stays its own: a forwarded 32 MiB request
  // fails. Freed (cached, its last use not yet seen complete), the same
  // request makes the lake release it and succeeds on its second try.
  const Cuda& cu = Cu();
  const Device d = Ready(0);
  const CUstream s = NewStream();
  for (const Entry& e : Entries(d, s)) {
    Drain();
    CUdeviceptr held = 0;
    REQUIRE_EQ(cu.MemAllocFromPoolAsync(&held, 48 * kMiB, d.pool, s),
               CUDA_SUCCESS);
    Filler filler;
    filler.Take(FreeBytes() - 16 * kMiB);
    const long long tries = HookCount(e.hook, "pressure");
    const long long ok = HookCount(e.hook, "pressure_ok");
    const long long given = HookCount(e.hook, "pressure_bytes");
    std::uintptr_t got = 0;
    CHECK_EQ(e.take(32 * kMiB, &got), CUDA_ERROR_OUT_OF_MEMORY);
    CHECK_EQ(HookCount(e.hook, "pressure"), tries);  // nothing to give back
    CHECK_EQ(Gauge(0, "live_allocations"), 1);
    CHECK_EQ(cu.MemFreeAsync(held, s), CUDA_SUCCESS);
    const long long reserved = Gauge(0, "bytes_reserved");
    CHECK(reserved >= static_cast<long long>(48 * kMiB));
    if (!(e.take(32 * kMiB, &got) == CUDA_SUCCESS)) {
      CHECK_EQ(std::string(e.hook), "succeeded under pressure");
      filler.Give();
      continue;
    }
    CHECK_EQ(HookCount(e.hook, "pressure"), tries + 1);
    CHECK_EQ(HookCount(e.hook, "pressure_ok"), ok + 1);
    CHECK_EQ(HookCount(e.hook, "pressure_bytes"), given + reserved);
    CHECK_EQ(Gauge(0, "bytes_reserved"), 0);
    CHECK_EQ(LakeCheck(), "");
    CHECK_EQ(e.give(got), CUDA_SUCCESS);
    filler.Give();
    // The lake grows again.
    REQUIRE_EQ(cu.MemAllocFromPoolAsync(&held, 48 * kMiB, d.pool, s),
               CUDA_SUCCESS);
    CHECK_EQ(cu.MemFreeAsync(held, s), CUDA_SUCCESS);
  }
  // The exit report sums them.
  const std::string report = ApiString(
      Api<decltype(jaxlake_shim_exit_report)>("jaxlake_shim_exit_report"));
  CHECK(report.find("memory pressure: ") != std::string::npos);
  CHECK(report.find(" of cached memory and ") != std::string::npos);
  Drain();
}

}  // namespace
