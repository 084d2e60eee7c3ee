// Tests of the libcuda.so.1 shim over the fake GPU (cc/fakegpu), with three
// 1 GiB devices, the third without VMM (tests/shim/fake_gpu.h).
//
// The test loads the shim as jaxlake's Python side does (RTLD_GLOBAL, before
// anything opens the driver), with JAXLAKE_REAL_LIBCUDA pointing at the fake
// GPU's library, then does what XLA does: dlopen("libcuda.so.1"), dlsym the
// entry points, cuInit, retain and make current the primary context, take
// the default pool, and allocate and free with cuMemAllocFromPoolAsync and
// cuMemFreeAsync on streams. The fake runs each stream's work on a thread
// of its own, so a test that needs that work done waits for it (Finish).
//
// The shim reads its options once, at load, so one process is one
// configuration. Without JAXLAKE_CAPACITY set, main() sets a 64 MiB
// capacity. ctest runs the file four times (cc/shim/shim.cmake): as is, with
// JAXLAKE_SHIM_HOOKS=0 and with a malformed option, the last two only with
// the tests that do not need a lake, and the missing-name test over a
// driver with cuInit alone (bare_driver.cc).
//
// The tests are in three files of one program: loading and forwarding
// here, the hooks in shim_hooks_test.cc, capture, lookups by name, range
// queries and threads in shim_capture_test.cc; what they share in
// shim_util.h.
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

// ---- loading and forwarding -------------------------------------------------

TEST(first_call_loads_the_driver_and_keeps_every_argument) {
  // Loading the shim does not load the real driver; the first call through
  // a trampoline does, then continues to the driver's function with the
  // caller's arguments intact (six in registers, five on the stack).
  CHECK(!g_first.driver_loaded_before);
  CHECK(g_first.driver_loaded_after);
  CHECK_EQ(g_first.result, CUDA_SUCCESS);
  unsigned long long got[11] = {};
  FAKEGPU(jaxlake_fakegpu_last_launch)(got);
  for (int i = 0; i < 11; ++i) CHECK_EQ(got[i], g_first.args[i]);
  CHECK_EQ(FakeCalls("cuLaunchKernel"), 1u);
}

TEST(configuration_is_reported) {
  const std::string status = Status();
  CHECK_EQ(JsonInt(status, "api_version"), JAXLAKE_SHIM_API_VERSION);
  CHECK(status.find("\"real_libcuda\": \"" JAXLAKE_FAKEGPU_PATH "\"") !=
        std::string::npos);
  CHECK_EQ(std::string(Api<decltype(jaxlake_shim_version)>(
                           "jaxlake_shim_version")())
               .empty(),
           false);
  if (const char* var = InactiveBecause()) {
    CHECK_EQ(Active(), 0);
    CHECK(Reason().find(var) != std::string::npos);
    CHECK(status.find("\"active\": false") != std::string::npos);
  } else {
    CHECK_EQ(Active(), 1);
    CHECK(Reason().find("JAXLAKE_") == std::string::npos);
    CHECK(status.find("\"active\": true") != std::string::npos);
    CHECK_EQ(JsonInt(status, "capacity"), kCapacity);
  }
}

TEST(dlopen_libcuda_returns_the_shim) {
  void* h = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  REQUIRE(h != nullptr);
  CHECK(h == g_shim);
  CHECK(::dlsym(h, "jaxlake_shim_api_version") != nullptr);
  const std::string shim = RealPath(JAXLAKE_SHIM_PATH);
  for (const char* name :
       {"cuInit", "cuMemAllocFromPoolAsync", "cuMemFreeAsync",
        "cuMemPoolGetAttribute", "cuGetProcAddress_v2", "cuGetExportTable"}) {
    void* fn = ::dlsym(h, name);
    CHECK(fn != nullptr);
    CHECK(fn != ::dlsym(g_fake, name));
    Dl_info info{};
    CHECK(::dladdr(fn, &info) != 0);
    CHECK_EQ(RealPath(info.dli_fname), shim);
  }
  ::dlclose(h);
}

TEST(every_listed_symbol_is_exported_and_nothing_else) {
  const std::set<std::string> listed = ListedNames();
  CHECK(listed.size() > 600);
  std::string missing;
  for (const std::string& name : listed)
    if (::dlsym(g_shim, name.c_str()) == nullptr) missing += name + " ";
  CHECK_EQ(missing, "");
  // The API of jaxlake_shim.h, and what the linker itself defines.
  const std::set<std::string> allowed = {
      "jaxlake_shim_api_version", "jaxlake_shim_version",
      "jaxlake_shim_active",      "jaxlake_shim_reason",
      "jaxlake_shim_num_lakes",   "jaxlake_shim_lake_devices",
      "jaxlake_shim_stats_json",  "jaxlake_shim_hooks_json",
      "jaxlake_shim_status_json", "jaxlake_shim_empty_cache",
      "jaxlake_shim_trace_start", "jaxlake_shim_trace_stop",
      "jaxlake_shim_disable",     "jaxlake_shim_check",
      "jaxlake_shim_open_lake",   "jaxlake_shim_exit_report",
      "_init", "_fini", "_edata", "_end", "__bss_start"};
  std::string extra;
  for (const std::string& name : Exports(JAXLAKE_SHIM_PATH))
    if (listed.count(name) == 0 && allowed.count(name) == 0)
      extra += name + " ";
  CHECK_EQ(extra, "");
  for (const char* internal : {"jaxlake_shim_table", "jaxlake_shim_lazy",
                               "jaxlake_shim_resolve", "jaxlake_shim_missing"})
    CHECK(::dlsym(g_shim, internal) == nullptr);
}

TEST(unhooked_calls_reach_the_fake_gpu) {
  const Cuda& cu = Cu();
  Ready(0);
  const auto before = FakeCalls("cuDeviceGetName");
  char name[64] = {};
  CHECK_EQ(cu.DeviceGetName(name, sizeof name, 1), CUDA_SUCCESS);
  CHECK_EQ(std::string(name), "NVIDIA H100 80GB HBM3 (jaxlake fake)");
  CHECK_EQ(FakeCalls("cuDeviceGetName"), before + 1);
  int version = 0;
  CHECK_EQ(cu.DriverGetVersion(&version), CUDA_SUCCESS);
  CHECK_EQ(version, 13000);
  // cuGetExportTable goes through untouched (the fake refuses it).
  const CUuuid id{};
  const void* through_shim = &id;
  const auto calls = FakeCalls("cuGetExportTable");
  CHECK_EQ(cu.GetExportTable(&through_shim, &id), CUDA_ERROR_NOT_SUPPORTED);
  CHECK(through_shim == nullptr);
  CHECK_EQ(FakeCalls("cuGetExportTable"), calls + 1);
}

TEST(missing_names_return_not_found) {
  // A listed name the driver does not define: the shim exports it all the
  // same and answers CUDA_ERROR_NOT_FOUND instead of crashing. The fake GPU
  // defines every listed name; shim_test_bare_driver runs this test over a
  // driver with cuInit alone (bare_driver.cc).
  std::string absent;
  for (const std::string& name : ListedNames()) {
    if (::dlsym(g_fake, name.c_str()) == nullptr) {
      absent = name;
      break;
    }
  }
  const std::string status = Status();
  if (absent.empty()) {
    CHECK_EQ(JsonInt(status, "forwarded_found"),
             JsonInt(status, "forwarded_names"));
    return;
  }
  auto* missing = Sym<int()>(g_libcuda, absent.c_str());
  REQUIRE(missing != nullptr);
  CHECK_EQ(missing(), CUDA_ERROR_NOT_FOUND);
  CHECK(JsonInt(status, "forwarded_found") >= 1);  // cuInit
  CHECK(JsonInt(status, "forwarded_found") <
        JsonInt(status, "forwarded_names"));
}

TEST(get_proc_address_answers_hooked_names_with_the_shim) {
  const Cuda& cu = Cu();
  const long long served = HookCount("cuGetProcAddress_v2", "served");
  struct Case {
    const char* name;
    cuuint64_t flags;
    const char* want;  // the shim export it must be
  };
  const Case cases[] = {
      {"cuMemAllocFromPoolAsync", 0, "cuMemAllocFromPoolAsync"},
      {"cuMemAllocFromPoolAsync", 2, "cuMemAllocFromPoolAsync_ptsz"},
      {"cuMemFreeAsync", 0, "cuMemFreeAsync"},
      {"cuMemFreeAsync", 2, "cuMemFreeAsync_ptsz"},
      {"cuMemPoolGetAttribute", 0, "cuMemPoolGetAttribute"},
      {"cuGetProcAddress", 0, "cuGetProcAddress_v2"},
  };
  for (const Case& c : cases) {
    void* fn = nullptr;
    int status = -1;
    CHECK_EQ(cu.GetProcAddress_v2(c.name, &fn, 12080, c.flags, &status),
             CUDA_SUCCESS);
    CHECK_EQ(status, CU_GET_PROC_ADDRESS_SUCCESS);
    CHECK(fn != nullptr && fn == ::dlsym(g_shim, c.want));
  }
  CHECK_EQ(HookCount("cuGetProcAddress_v2", "served"), served + 6);
  // Before CUDA 12.0, cuGetProcAddress is the four-argument function.
  void* fn = nullptr;
  CHECK_EQ(cu.GetProcAddress_v2("cuGetProcAddress", &fn, 11080, 0, nullptr),
           CUDA_SUCCESS);
  CHECK(fn == ::dlsym(g_shim, "cuGetProcAddress"));
  // The legacy entry point rewrites as well.
  CHECK_EQ(cu.GetProcAddress("cuMemFreeAsync", &fn, 11020, 0), CUDA_SUCCESS);
  CHECK(fn == ::dlsym(g_shim, "cuMemFreeAsync"));
  // Other names keep the driver's answer, versioned lookups included.
  CHECK_EQ(cu.GetProcAddress_v2("cuDeviceGetName", &fn, 12080, 0, nullptr),
           CUDA_SUCCESS);
  CHECK(fn != nullptr && fn == ::dlsym(g_fake, "cuDeviceGetName"));
  CHECK_EQ(cu.GetProcAddress_v2("cuMemGetInfo", &fn, 12080, 0, nullptr),
           CUDA_SUCCESS);
  CHECK(fn != nullptr && fn == ::dlsym(g_fake, "cuMemGetInfo_v2"));
  int status = -1;
  CHECK_EQ(cu.GetProcAddress_v2("cuNoSuchFunction", &fn, 12080, 0, &status),
           CUDA_ERROR_NOT_FOUND);
  CHECK_EQ(status, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
}

}  // namespace

int main(int argc, char** argv) {
  jaxlake::testing::UseFakeGpuDevices();
  ::setenv("JAXLAKE_REAL_LIBCUDA", JAXLAKE_FAKEGPU_PATH, 0);
  ::setenv("JAXLAKE_CAPACITY", std::to_string(kCapacity).c_str(), 0);
  g_shim = ::dlopen(JAXLAKE_SHIM_PATH, RTLD_NOW | RTLD_GLOBAL);
  if (g_shim == nullptr) {
    std::fprintf(stderr, "cannot load the shim: %s\n", ::dlerror());
    return 1;
  }
  g_libcuda = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (g_libcuda == nullptr) {
    std::fprintf(stderr, "dlopen(libcuda.so.1): %s\n", ::dlerror());
    return 1;
  }
  // The process's first driver call (see first_call_... above). The driver
  // is the fake GPU unless the run names another (shim_test_bare_driver).
  const char* driver = ::getenv("JAXLAKE_REAL_LIBCUDA");
  g_first.driver_loaded_before =
      ::dlopen(driver, RTLD_NOW | RTLD_NOLOAD) != nullptr;
  int params = 0;
  const unsigned long long args[11] = {
      0xF00D, 1, 2, 3, 4, 5, 6, 7, kStreamPerThread,
      reinterpret_cast<std::uintptr_t>(&params), 0xE7};
  std::memcpy(g_first.args, args, sizeof args);
  auto* launch = Sym<CUresult(void*, unsigned, unsigned, unsigned, unsigned,
                              unsigned, unsigned, unsigned, CUstream, void**,
                              void**)>(g_libcuda, "cuLaunchKernel");
  g_first.result = launch(reinterpret_cast<void*>(args[0]), 1, 2, 3, 4, 5, 6,
                          7, reinterpret_cast<CUstream>(args[8]),
                          reinterpret_cast<void**>(args[9]),
                          reinterpret_cast<void**>(args[10]));
  g_fake = ::dlopen(driver, RTLD_NOW | RTLD_NOLOAD);
  g_first.driver_loaded_after = g_fake != nullptr;
  if (g_fake == nullptr) {
    std::fprintf(stderr, "the shim did not load the driver %s\n", driver);
    return 1;
  }
  return jaxlake::check::RunAll(argc, argv);
}
