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
#include <dlfcn.h>
#include <elf.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cc/shim/jaxlake_shim.h"
#include "cc/vmm/cuda_types.h"
#include "tests/cc/check.h"
#include "tests/shim/fake_gpu.h"

namespace {

using namespace jaxlake::cuda;  // NOLINT: the driver's own vocabulary

constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::size_t kCapacity = 64 * kMiB;

void* g_shim = nullptr;     // the shim, loaded first (RTLD_GLOBAL)
void* g_fake = nullptr;     // the fake GPU the shim forwards to
void* g_libcuda = nullptr;  // dlopen("libcuda.so.1"): what XLA gets

// The first driver call of the process, made by main() through the shim
// before any test runs: whether the fake GPU was loaded before it, its
// result, and the arguments it passed.
struct FirstCall {
  bool driver_loaded_before = true;
  bool driver_loaded_after = false;
  CUresult result = -1;
  unsigned long long args[11] = {};
};
FirstCall g_first;

template <typename F>
F* Sym(void* handle, const char* name) {
  return reinterpret_cast<F*>(::dlsym(handle, name));
}

// The driver as XLA sees it: entry points of dlopen("libcuda.so.1").
struct Cuda {
  CUresult (*Init)(unsigned);
  CUresult (*DriverGetVersion)(int*);
  CUresult (*DeviceGet)(CUdevice*, int);
  CUresult (*DeviceGetName)(char*, int, CUdevice);
  CUresult (*PrimaryCtxRetain)(CUcontext*, CUdevice);
  CUresult (*CtxSetCurrent)(CUcontext);
  CUresult (*CtxGetCurrent)(CUcontext*);
  CUresult (*DeviceGetDefaultMemPool)(CUmemoryPool*, CUdevice);
  CUresult (*StreamCreate)(CUstream*, unsigned);
  CUresult (*MemAllocFromPoolAsync)(CUdeviceptr*, std::size_t, CUmemoryPool,
                                    CUstream);
  CUresult (*MemAllocFromPoolAsync_ptsz)(CUdeviceptr*, std::size_t,
                                         CUmemoryPool, CUstream);
  CUresult (*MemFreeAsync)(CUdeviceptr, CUstream);
  CUresult (*MemFreeAsync_ptsz)(CUdeviceptr, CUstream);
  CUresult (*MemPoolGetAttribute)(CUmemoryPool, int, void*);
  CUresult (*GetProcAddress)(const char*, void**, int, cuuint64_t);
  CUresult (*GetProcAddress_v2)(const char*, void**, int, cuuint64_t, int*);
  CUresult (*GetExportTable)(const void**, const CUuuid*);
};

const Cuda& Cu() {
  static const Cuda cuda = [] {
    Cuda c{};
    void* h = g_libcuda;
    c.Init = Sym<CUresult(unsigned)>(h, "cuInit");
    c.DriverGetVersion = Sym<CUresult(int*)>(h, "cuDriverGetVersion");
    c.DeviceGet = Sym<CUresult(CUdevice*, int)>(h, "cuDeviceGet");
    c.DeviceGetName =
        Sym<CUresult(char*, int, CUdevice)>(h, "cuDeviceGetName");
    c.PrimaryCtxRetain = Sym<CUresult(CUcontext*, CUdevice)>(
        h, "cuDevicePrimaryCtxRetain");
    c.CtxSetCurrent = Sym<CUresult(CUcontext)>(h, "cuCtxSetCurrent");
    c.CtxGetCurrent = Sym<CUresult(CUcontext*)>(h, "cuCtxGetCurrent");
    c.DeviceGetDefaultMemPool = Sym<CUresult(CUmemoryPool*, CUdevice)>(
        h, "cuDeviceGetDefaultMemPool");
    c.StreamCreate = Sym<CUresult(CUstream*, unsigned)>(h, "cuStreamCreate");
    c.MemAllocFromPoolAsync =
        Sym<CUresult(CUdeviceptr*, std::size_t, CUmemoryPool, CUstream)>(
            h, "cuMemAllocFromPoolAsync");
    c.MemAllocFromPoolAsync_ptsz =
        Sym<CUresult(CUdeviceptr*, std::size_t, CUmemoryPool, CUstream)>(
            h, "cuMemAllocFromPoolAsync_ptsz");
    c.MemFreeAsync = Sym<CUresult(CUdeviceptr, CUstream)>(h, "cuMemFreeAsync");
    c.MemFreeAsync_ptsz =
        Sym<CUresult(CUdeviceptr, CUstream)>(h, "cuMemFreeAsync_ptsz");
    c.MemPoolGetAttribute = Sym<CUresult(CUmemoryPool, int, void*)>(
        h, "cuMemPoolGetAttribute");
    c.GetProcAddress = Sym<CUresult(const char*, void**, int, cuuint64_t)>(
        h, "cuGetProcAddress");
    c.GetProcAddress_v2 =
        Sym<CUresult(const char*, void**, int, cuuint64_t, int*)>(
            h, "cuGetProcAddress_v2");
    c.GetExportTable = Sym<CUresult(const void**, const CUuuid*)>(
        h, "cuGetExportTable");
    return c;
  }();
  return cuda;
}

// ---- the shim's C API and the fake GPU's control API ------------------------

template <typename F>
F* Api(const char* name) {
  F* fn = Sym<F>(g_shim, name);
  if (fn == nullptr) {
    std::fprintf(stderr, "the shim does not export %s\n", name);
    std::abort();
  }
  return fn;
}

std::string ApiString(std::size_t (*fn)(char*, std::size_t)) {
  std::string out(fn(nullptr, 0), '\0');
  std::vector<char> buf(out.size() + 64);
  const std::size_t n = fn(buf.data(), buf.size());
  return std::string(buf.data(), std::min(n, buf.size() - 1));
}

int Active() {
  return Api<decltype(jaxlake_shim_active)>("jaxlake_shim_active")();
}
std::string Reason() {
  return ApiString(Api<decltype(jaxlake_shim_reason)>("jaxlake_shim_reason"));
}
std::string Status() {
  return ApiString(
      Api<decltype(jaxlake_shim_status_json)>("jaxlake_shim_status_json"));
}
std::string Hooks() {
  return ApiString(
      Api<decltype(jaxlake_shim_hooks_json)>("jaxlake_shim_hooks_json"));
}
std::string Stats(int device) {
  auto* fn = Api<decltype(jaxlake_shim_stats_json)>("jaxlake_shim_stats_json");
  const long long n = fn(device, nullptr, 0);
  if (n < 0) return {};
  std::vector<char> buf(static_cast<std::size_t>(n) + 64);
  fn(device, buf.data(), buf.size());
  return buf.data();
}
// Waits for the work of every stream (the fake GPU runs each stream's work
// on a thread of its own): the events the lake recorded are then complete.
void Finish() { FAKEGPU(jaxlake_fakegpu_synchronize)(-1); }
// The shim's empty_cache once the devices' work is done. A lake fences what
// it has not seen complete with events: the second call, after that work
// ran too, gives the rest back.
long long EmptyCache(int device) {
  auto* empty =
      Api<decltype(jaxlake_shim_empty_cache)>("jaxlake_shim_empty_cache");
  Finish();
  const long long first = empty(device);
  if (first < 0) return first;
  Finish();
  return first + empty(device);
}
std::vector<int> LakeDevices() {
  auto* fn =
      Api<decltype(jaxlake_shim_lake_devices)>("jaxlake_shim_lake_devices");
  std::vector<int> out(64);
  out.resize(static_cast<std::size_t>(fn(out.data(), 64)));
  return out;
}

unsigned long long FakeCalls(const char* name) {
  return FAKEGPU(jaxlake_fakegpu_calls)(name);
}
// Calls the fake GPU refused because of a capture: the lake must cause none.
unsigned long long CaptureRefusals() {
  return FAKEGPU(jaxlake_fakegpu_capture_refusals)();
}
void Hold(CUstream s) { CHECK_EQ(FAKEGPU(jaxlake_fakegpu_hold_stream)(s), 0); }
void Release(CUstream s) {
  CHECK_EQ(FAKEGPU(jaxlake_fakegpu_release_stream)(s), 0);
}
unsigned long long CreatedBytes(int device) {
  return FAKEGPU(jaxlake_fakegpu_created_bytes)(device);
}
unsigned long long PoolBytes(int device) {
  return FAKEGPU(jaxlake_fakegpu_pool_bytes)(device);
}

// The integer after `"key": ` in `json` (the first one), or -1.
long long JsonInt(const std::string& json, const std::string& key) {
  const std::string needle = "\"" + key + "\": ";
  const std::size_t at = json.find(needle);
  if (at == std::string::npos) return -1;
  return std::strtoll(json.c_str() + at + needle.size(), nullptr, 10);
}
// A counter, a driver call count or a gauge's current value of a lake.
long long Counter(int device, const std::string& name) {
  return JsonInt(Stats(device), name);
}
long long Gauge(int device, const std::string& name) {
  const std::string json = Stats(device);
  const std::size_t at = json.find("\"" + name + "\": {");
  return at == std::string::npos ? -1
                                 : JsonInt(json.substr(at), "current");
}
// One field of one hook's counters.
long long HookCount(const std::string& hook, const std::string& field) {
  const std::string json = Hooks();
  const std::size_t at = json.find("\"" + hook + "\": {");
  return at == std::string::npos ? -1 : JsonInt(json.substr(at), field);
}

// The JAXLAKE_* variable that should make the shim inactive in this run, or
// nullptr when it should be active.
const char* InactiveBecause() {
  const char* hooks = ::getenv("JAXLAKE_SHIM_HOOKS");
  if (hooks != nullptr && std::strcmp(hooks, "0") == 0)
    return "JAXLAKE_SHIM_HOOKS";
  const char* cap = ::getenv("JAXLAKE_CAPACITY");
  if (cap != nullptr && std::strspn(cap, "0123456789") != std::strlen(cap))
    return "JAXLAKE_CAPACITY";
  return nullptr;
}

// ---- a device made ready as XLA does ----------------------------------------

struct Device {
  int ordinal = -1;
  CUcontext ctx = nullptr;
  CUmemoryPool pool = nullptr;
};

// cuInit, the primary context made current, the default pool.
Device Ready(int ordinal) {
  const Cuda& cu = Cu();
  Device d;
  CUdevice dev = 0;
  if (cu.Init(0) != CUDA_SUCCESS || cu.DeviceGet(&dev, ordinal) != 0 ||
      cu.PrimaryCtxRetain(&d.ctx, dev) != 0 || cu.CtxSetCurrent(d.ctx) != 0 ||
      cu.DeviceGetDefaultMemPool(&d.pool, dev) != 0) {
    std::fprintf(stderr, "cannot make device %d ready\n", ordinal);
    std::abort();
  }
  d.ordinal = ordinal;
  return d;
}

CUstream NewStream() {
  CUstream s = nullptr;
  if (Cu().StreamCreate(&s, 0) != CUDA_SUCCESS) std::abort();
  return s;
}

std::uintptr_t Value(CUstream s) { return reinterpret_cast<std::uintptr_t>(s); }

// Makes the lake of device 0 start empty: no live allocation left by an
// earlier test, no cached memory.
void Drain() {
  EmptyCache(-1);
  if (!Stats(0).empty()) CHECK_EQ(Gauge(0, "live_allocations"), 0);
}

std::vector<std::string> ReadLines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::string TempPath(const char* name) {
  const char* dir = ::getenv("TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/jaxlake_shim_test_" +
         std::to_string(::getpid()) + "_" + name;
}

// The names the ELF file at `path` exports (defined global and weak symbols
// of its dynamic symbol table).
std::set<std::string> Exports(const char* path) {
  std::ifstream in(path, std::ios::binary);
  const std::string data((std::istreambuf_iterator<char>(in)),
                         std::istreambuf_iterator<char>());
  std::set<std::string> out;
  if (data.size() < sizeof(Elf64_Ehdr)) return out;
  const auto* eh = reinterpret_cast<const Elf64_Ehdr*>(data.data());
  if (std::memcmp(eh->e_ident, ELFMAG, SELFMAG) != 0) return out;
  const auto* sh =
      reinterpret_cast<const Elf64_Shdr*>(data.data() + eh->e_shoff);
  for (int i = 0; i < eh->e_shnum; ++i) {
    if (sh[i].sh_type != SHT_DYNSYM) continue;
    const auto* syms =
        reinterpret_cast<const Elf64_Sym*>(data.data() + sh[i].sh_offset);
    const char* names = data.data() + sh[sh[i].sh_link].sh_offset;
    for (std::size_t k = 0; k < sh[i].sh_size / sizeof(Elf64_Sym); ++k) {
      const int bind = ELF64_ST_BIND(syms[k].st_info);
      if ((bind == STB_GLOBAL || bind == STB_WEAK) &&
          syms[k].st_shndx != SHN_UNDEF)
        out.insert(names + syms[k].st_name);
    }
  }
  return out;
}

std::set<std::string> ListedNames() {
  std::set<std::string> out;
  std::ifstream in(JAXLAKE_SYMBOLS_PATH);
  for (std::string line; std::getline(in, line);)
    if (!line.empty() && line[0] != '#') out.insert(line);
  return out;
}

std::string RealPath(const char* path) {
  char buf[4096];
  return ::realpath(path, buf) != nullptr ? buf : "";
}

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
  CHECK(lines[1].find("\"op\": \"alloc\"") != std::string::npos);
  CHECK_EQ(JsonInt(lines[1], "size"), static_cast<long long>(8 * kMiB));
  CHECK_EQ(JsonInt(lines[1], "stream"), static_cast<long long>(Value(s1)));
  CHECK_EQ(JsonInt(lines[2], "size"), 1000);
  CHECK_EQ(JsonInt(lines[2], "stream"), static_cast<long long>(Value(s2)));
  CHECK(lines[3].find("\"op\": \"free\"") != std::string::npos);
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
  REQUIRE_EQ(alloc(&a, 3 * kMiB), CUDA_SUCCESS);
  CHECK_EQ(FakeCalls("cuMemAlloc_v2"), 1u);
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
