// What the shim's tests share (shim_test.cc, shim_hooks_test.cc,
// shim_capture_test.cc, one program): the loaded shim, fake GPU and
// driver, the driver's entry points as XLA sees them, the shim's C API and
// the fake GPU's control API, and a device made ready as XLA does.
#ifndef JAXLAKE_TESTS_SHIM_SHIM_UTIL_H_
#define JAXLAKE_TESTS_SHIM_SHIM_UTIL_H_

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

namespace jaxlake::shim_testing {

using namespace jaxlake::cuda;  // NOLINT: the driver's own vocabulary

constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::size_t kCapacity = 64 * kMiB;

inline void* g_shim = nullptr;     // the shim, loaded first (RTLD_GLOBAL)
inline void* g_fake = nullptr;     // the fake GPU the shim forwards to
inline void* g_libcuda = nullptr;  // dlopen("libcuda.so.1"): what XLA gets

// The first driver call of the process, made by main() through the shim
// before any test runs: whether the fake GPU was loaded before it, its
// result, and the arguments it passed.
struct FirstCall {
  bool driver_loaded_before = true;
  bool driver_loaded_after = false;
  CUresult result = -1;
  unsigned long long args[11] = {};
};
inline FirstCall g_first;

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

inline const Cuda& Cu() {
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

inline std::string ApiString(std::size_t (*fn)(char*, std::size_t)) {
  std::string out(fn(nullptr, 0), '\0');
  std::vector<char> buf(out.size() + 64);
  const std::size_t n = fn(buf.data(), buf.size());
  return std::string(buf.data(), std::min(n, buf.size() - 1));
}

inline int Active() {
  return Api<decltype(jaxlake_shim_active)>("jaxlake_shim_active")();
}
inline std::string Reason() {
  return ApiString(Api<decltype(jaxlake_shim_reason)>("jaxlake_shim_reason"));
}
inline std::string Status() {
  return ApiString(
      Api<decltype(jaxlake_shim_status_json)>("jaxlake_shim_status_json"));
}
inline std::string Hooks() {
  return ApiString(
      Api<decltype(jaxlake_shim_hooks_json)>("jaxlake_shim_hooks_json"));
}
inline std::string Stats(int device) {
  auto* fn = Api<decltype(jaxlake_shim_stats_json)>("jaxlake_shim_stats_json");
  const long long n = fn(device, nullptr, 0);
  if (n < 0) return {};
  std::vector<char> buf(static_cast<std::size_t>(n) + 64);
  fn(device, buf.data(), buf.size());
  return buf.data();
}
// Waits for the work of every stream (the fake GPU runs each stream's work
// on a thread of its own): the events the lake recorded are then complete.
inline void Finish() { FAKEGPU(jaxlake_fakegpu_synchronize)(-1); }
// The shim's empty_cache once the devices' work is done. A lake fences what
// it has not seen complete with events: the second call, after that work
// ran too, gives the rest back.
inline long long EmptyCache(int device) {
  auto* empty =
      Api<decltype(jaxlake_shim_empty_cache)>("jaxlake_shim_empty_cache");
  Finish();
  const long long first = empty(device);
  if (first < 0) return first;
  Finish();
  return first + empty(device);
}
inline std::vector<int> LakeDevices() {
  auto* fn =
      Api<decltype(jaxlake_shim_lake_devices)>("jaxlake_shim_lake_devices");
  std::vector<int> out(64);
  out.resize(static_cast<std::size_t>(fn(out.data(), 64)));
  return out;
}

inline unsigned long long FakeCalls(const char* name) {
  return FAKEGPU(jaxlake_fakegpu_calls)(name);
}
// Calls the fake GPU refused because of a capture: the lake must cause none.
inline unsigned long long CaptureRefusals() {
  return FAKEGPU(jaxlake_fakegpu_capture_refusals)();
}
inline void Hold(CUstream s) {
  CHECK_EQ(FAKEGPU(jaxlake_fakegpu_hold_stream)(s), 0);
}
inline void Release(CUstream s) {
  CHECK_EQ(FAKEGPU(jaxlake_fakegpu_release_stream)(s), 0);
}
inline unsigned long long CreatedBytes(int device) {
  return FAKEGPU(jaxlake_fakegpu_created_bytes)(device);
}
inline unsigned long long PoolBytes(int device) {
  return FAKEGPU(jaxlake_fakegpu_pool_bytes)(device);
}

// The integer after `"key": ` in `json` (the first one), or -1.
inline long long JsonInt(const std::string& json, const std::string& key) {
  // With or without a space after the colon (the stats' JSON has one, the
  // trace's event lines none).
  const std::string needle = "\"" + key + "\":";
  const std::size_t at = json.find(needle);
  if (at == std::string::npos) return -1;
  return std::strtoll(json.c_str() + at + needle.size(), nullptr, 10);
}
// A counter, a driver call count or a gauge's current value of a lake.
inline long long Counter(int device, const std::string& name) {
  return JsonInt(Stats(device), name);
}
inline long long Gauge(int device, const std::string& name) {
  const std::string json = Stats(device);
  const std::size_t at = json.find("\"" + name + "\": {");
  return at == std::string::npos ? -1
                                 : JsonInt(json.substr(at), "current");
}
// One field of one hook's counters.
inline long long HookCount(const std::string& hook, const std::string& field) {
  const std::string json = Hooks();
  const std::size_t at = json.find("\"" + hook + "\": {");
  return at == std::string::npos ? -1 : JsonInt(json.substr(at), field);
}

// The JAXLAKE_* variable that should make the shim inactive in this run, or
// nullptr when it should be active.
inline const char* InactiveBecause() {
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
inline Device Ready(int ordinal) {
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

inline CUstream NewStream() {
  CUstream s = nullptr;
  if (Cu().StreamCreate(&s, 0) != CUDA_SUCCESS) std::abort();
  return s;
}

inline std::uintptr_t Value(CUstream s) {
  return reinterpret_cast<std::uintptr_t>(s);
}

// Makes the lake of device 0 start empty: no live allocation left by an
// earlier test, no cached memory.
inline void Drain() {
  EmptyCache(-1);
  if (!Stats(0).empty()) CHECK_EQ(Gauge(0, "live_allocations"), 0);
}

inline std::vector<std::string> ReadLines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

inline std::string TempPath(const char* name) {
  const char* dir = ::getenv("TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/jaxlake_shim_test_" +
         std::to_string(::getpid()) + "_" + name;
}

// The names the ELF file at `path` exports (defined global and weak symbols
// of its dynamic symbol table).
inline std::set<std::string> Exports(const char* path) {
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

inline std::set<std::string> ListedNames() {
  std::set<std::string> out;
  std::ifstream in(JAXLAKE_SYMBOLS_PATH);
  for (std::string line; std::getline(in, line);)
    if (!line.empty() && line[0] != '#') out.insert(line);
  return out;
}

inline std::string RealPath(const char* path) {
  char buf[4096];
  return ::realpath(path, buf) != nullptr ? buf : "";
}

}  // namespace jaxlake::shim_testing

#endif  // JAXLAKE_TESTS_SHIM_SHIM_UTIL_H_
