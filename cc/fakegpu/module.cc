// The fake driver's modules and kernels: modules whose globals are zeroed
// device memory of the size the cubin's ELF symbol table gives, functions
// with attributes, occupancy answers, and launches that are accepted in
// stream order and do nothing.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "cc/fakegpu/driver.h"
#include "cc/fakegpu/fakegpu.h"
#include "cc/vmm/cuda_types.h"

using namespace jaxlake::cuda;            // NOLINT: the driver's vocabulary
using namespace jaxlake::fakegpu::driver;  // NOLINT: its shared state
namespace fg = jaxlake::fakegpu;

extern "C" {

// ---- modules and kernels (kernels do not run) -------------------------------

namespace {
// The sized symbols of a cubin (an ELF file, as XLA loads), by name: what
// cuModuleGetGlobal answers. A fat binary or PTX image yields none.
std::map<std::string, std::size_t> ElfSymbols(const void* image) {
  std::map<std::string, std::size_t> out;
  const auto* b = static_cast<const unsigned char*>(image);
  if (std::memcmp(b, "\x7f" "ELF", 4) != 0 || b[4] != 2) return out;  // ELF64
  std::uint64_t shoff = 0;
  std::uint16_t shentsize = 0, shnum = 0;
  std::memcpy(&shoff, b + 0x28, 8);
  std::memcpy(&shentsize, b + 0x3A, 2);
  std::memcpy(&shnum, b + 0x3C, 2);
  if (shentsize < 64) return out;
  auto section = [&](unsigned i, std::uint32_t* type, std::uint64_t* off,
                     std::uint64_t* size, std::uint32_t* link,
                     std::uint64_t* entsize) {
    const unsigned char* h = b + shoff + std::uint64_t{i} * shentsize;
    std::memcpy(type, h + 4, 4);
    std::memcpy(off, h + 0x18, 8);
    std::memcpy(size, h + 0x20, 8);
    std::memcpy(link, h + 0x28, 4);
    std::memcpy(entsize, h + 0x38, 8);
  };
  for (unsigned i = 0; i < shnum; ++i) {
    std::uint32_t type = 0, link = 0;
    std::uint64_t off = 0, size = 0, entsize = 0;
    section(i, &type, &off, &size, &link, &entsize);
    if (type != 2 || entsize < 24 || link >= shnum) continue;  // SHT_SYMTAB
    std::uint32_t stype = 0, slink = 0;
    std::uint64_t soff = 0, ssize = 0, sent = 0;
    section(link, &stype, &soff, &ssize, &slink, &sent);
    for (std::uint64_t e = 0; e + entsize <= size; e += entsize) {
      const unsigned char* sym = b + off + e;
      std::uint32_t name = 0;
      std::uint64_t value_size = 0;
      std::memcpy(&name, sym, 4);
      std::memcpy(&value_size, sym + 16, 8);
      if (name == 0 || name >= ssize || value_size == 0) continue;
      const char* n = reinterpret_cast<const char*>(b + soff + name);
      out[std::string(n, strnlen(n, ssize - name))] = value_size;
    }
  }
  return out;
}

CUresult LoadModule(void** module, const void* image) {
  if (CUresult r = NeedContext(); r != CUDA_SUCCESS) return r;
  if (module == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (image == nullptr) return CUDA_ERROR_INVALID_IMAGE;
  auto symbols = ElfSymbols(image);
  Driver& d = D();
  std::lock_guard<std::mutex> lock(d.mu);
  const std::uintptr_t m = d.next_module;
  d.next_module += 0x10;
  d.modules[m].symbols = std::move(symbols);
  *module = reinterpret_cast<void*>(m);
  return CUDA_SUCCESS;
}
}  // namespace

// A module's global: device memory of the symbol's size, zeroed, the same
// for every call with that name (freed with the module).
FAKE cuModuleGetGlobal_v2(CUdeviceptr* dptr, std::size_t* bytes,
                          void* module, const char* name) {
  ENTER();
  if (name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = D();
  std::lock_guard<std::mutex> lock(d.mu);
  auto it = d.modules.find(reinterpret_cast<std::uintptr_t>(module));
  if (it == d.modules.end()) return CUDA_ERROR_INVALID_HANDLE;
  auto g = it->second.globals.find(name);
  if (g == it->second.globals.end()) {
    auto sym = it->second.symbols.find(name);
    if (sym == it->second.symbols.end()) return CUDA_ERROR_NOT_FOUND;
    void* p = fg::MapAnonymous(sym->second);
    if (p == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
    const int dev = fg::CurrentDevice();
    fg::AddRange({reinterpret_cast<std::uintptr_t>(p), sym->second,
                  dev < 0 ? 0 : dev, fg::Kind::kDevice, true});
    g = it->second.globals.emplace(name, std::make_pair(p, sym->second)).first;
  }
  if (dptr != nullptr) *dptr = reinterpret_cast<CUdeviceptr>(g->second.first);
  if (bytes != nullptr) *bytes = g->second.second;
  return CUDA_SUCCESS;
}

FAKE cuModuleLoadData(void** module, const void* image) {
  ENTER();
  return LoadModule(module, image);
}
FAKE cuModuleLoadDataEx(void** module, const void* image, unsigned int,
                        void*, void**) {
  ENTER();
  return LoadModule(module, image);
}
FAKE cuModuleLoadFatBinary(void** module, const void* image) {
  ENTER();
  return LoadModule(module, image);
}

FAKE cuModuleUnload(void* module) {
  ENTER();
  Driver& d = D();
  std::lock_guard<std::mutex> lock(d.mu);
  auto it = d.modules.find(reinterpret_cast<std::uintptr_t>(module));
  if (it == d.modules.end()) return CUDA_ERROR_INVALID_HANDLE;
  for (auto& [name, g] : it->second.globals) {
    fg::RemoveRange(reinterpret_cast<std::uintptr_t>(g.first));
    fg::UnmapAnonymous(g.first, g.second);
  }
  d.modules.erase(it);
  return CUDA_SUCCESS;
}

FAKE cuModuleGetFunction(void** function, void* module, const char* name) {
  ENTER();
  if (function == nullptr || name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = D();
  std::lock_guard<std::mutex> lock(d.mu);
  if (d.modules.count(reinterpret_cast<std::uintptr_t>(module)) == 0)
    return CUDA_ERROR_INVALID_HANDLE;
  auto f = std::make_unique<Driver::Function>();
  f->name = name;
  *function = f.get();
  d.functions[reinterpret_cast<std::uintptr_t>(f.get())] = std::move(f);
  return CUDA_SUCCESS;
}

FAKE cuModuleGetLoadingMode(int* mode) {
  ENTER();
  if (mode == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *mode = 1;  // CU_MODULE_EAGER_LOADING
  return CUDA_SUCCESS;
}

FAKE cuFuncGetAttribute(int* value, int attribute, void* function) {
  ENTER();
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Driver& d = D();
  std::lock_guard<std::mutex> lock(d.mu);
  auto it = d.functions.find(reinterpret_cast<std::uintptr_t>(function));
  const int set = it != d.functions.end() && attribute >= 0 && attribute < 16
                      ? it->second->attrs[attribute]
                      : 0;
  switch (attribute) {
    case 0: *value = 1024; break;  // MAX_THREADS_PER_BLOCK
    case 4: *value = 32; break;    // NUM_REGS
    case 5: case 6: *value = 90; break;  // PTX_VERSION, BINARY_VERSION
    default: *value = set; break;
  }
  return CUDA_SUCCESS;
}

FAKE cuFuncSetAttribute(void* function, int attribute, int value) {
  ENTER();
  Driver& d = D();
  std::lock_guard<std::mutex> lock(d.mu);
  if (function == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  // A runtime kernel (cudaGetFuncBySymbol) has no entry: nothing to keep.
  auto it = d.functions.find(reinterpret_cast<std::uintptr_t>(function));
  if (it != d.functions.end() && attribute >= 0 && attribute < 16)
    it->second->attrs[attribute] = value;
  return CUDA_SUCCESS;
}

FAKE cuFuncSetCacheConfig(void*, int) {
  ENTER();
  return CUDA_SUCCESS;
}

FAKE cuFuncSetSharedMemConfig(void*, int) {
  ENTER();
  return CUDA_SUCCESS;
}

FAKE cuFuncGetName(const char** name, void* function) {
  ENTER();
  Driver& d = D();
  std::lock_guard<std::mutex> lock(d.mu);
  auto it = d.functions.find(reinterpret_cast<std::uintptr_t>(function));
  if (name == nullptr || it == d.functions.end())
    return CUDA_ERROR_INVALID_VALUE;
  *name = it->second->name.c_str();
  return CUDA_SUCCESS;
}

FAKE cuOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, void*,
                                                 int block_size,
                                                 std::size_t) {
  ENTER();
  if (blocks == nullptr || block_size <= 0) return CUDA_ERROR_INVALID_VALUE;
  *blocks = std::max(1, std::min(32, 2048 / block_size));
  return CUDA_SUCCESS;
}

FAKE cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
    int* blocks, void* f, int block_size, std::size_t smem, unsigned int) {
  return cuOccupancyMaxActiveBlocksPerMultiprocessor(blocks, f, block_size,
                                                     smem);
}

FAKE cuOccupancyAvailableDynamicSMemPerBlock(std::size_t* smem, void*,
                                             int blocks, int) {
  ENTER();
  if (smem == nullptr || blocks <= 0) return CUDA_ERROR_INVALID_VALUE;
  *smem = 232448 / static_cast<std::size_t>(blocks);
  return CUDA_SUCCESS;
}

FAKE cuOccupancyMaxActiveClusters(int* clusters, void*, const void*) {
  ENTER();
  if (clusters == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *clusters = fg::Opts().sms / 2;
  return CUDA_SUCCESS;
}

FAKE cuOccupancyMaxPotentialBlockSize(int* min_grid, int* block_size, void*,
                                      void*, std::size_t, int limit) {
  ENTER();
  if (min_grid == nullptr || block_size == nullptr)
    return CUDA_ERROR_INVALID_VALUE;
  *block_size = limit > 0 && limit < 1024 ? limit : 1024;
  *min_grid = fg::Opts().sms * 2;
  return CUDA_SUCCESS;
}

namespace {
void Launched() {
  Driver& d = D();
  std::lock_guard<std::mutex> lock(d.mu);
  ++d.launches;
}
}  // namespace

// Kernels do not run: a launch is accepted in stream order and does
// nothing, so the values XLA computes are meaningless.
FAKE cuLaunchKernel(void* f, unsigned int gx, unsigned int gy,
                    unsigned int gz, unsigned int bx, unsigned int by,
                    unsigned int bz, unsigned int shared_bytes,
                    CUstream stream, void** params, void** extra) {
  ENTER();
  {
    Driver& d = D();
    std::lock_guard<std::mutex> lock(d.mu);
    const unsigned long long args[11] = {
        reinterpret_cast<std::uintptr_t>(f), gx, gy, gz, bx, by, bz,
        shared_bytes, reinterpret_cast<std::uintptr_t>(stream),
        reinterpret_cast<std::uintptr_t>(params),
        reinterpret_cast<std::uintptr_t>(extra)};
    std::copy(args, args + 11, d.last_launch);
  }
  if (f == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (StreamFor(stream) == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (CUresult r = 0; CaptureKernel(stream, f, &r)) return r;
  Launched();
  return CUDA_SUCCESS;
}

struct LaunchConfig {  // CUlaunchConfig's leading fields
  unsigned int grid[3];
  unsigned int block[3];
  unsigned int shared_bytes;
  CUstream stream;
};

FAKE cuLaunchKernelEx(const LaunchConfig* config, void* f, void**, void**) {
  ENTER();
  if (config == nullptr || f == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (StreamFor(config->stream) == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (CUresult r = 0; CaptureKernel(config->stream, f, &r)) return r;
  Launched();
  return CUDA_SUCCESS;
}

FAKE cuLaunchCooperativeKernel(void* f, unsigned int, unsigned int,
                               unsigned int, unsigned int, unsigned int,
                               unsigned int, unsigned int, CUstream stream,
                               void**) {
  ENTER();
  if (f == nullptr || StreamFor(stream) == nullptr)
    return CUDA_ERROR_INVALID_HANDLE;
  if (CUresult r = 0; CaptureKernel(stream, f, &r)) return r;
  Launched();
  return CUDA_SUCCESS;
}

// Tensor-memory-access descriptors (CUtensorMap, 128 bytes) that Triton's
// Hopper kernels take: zeroed, since the kernels do not run.
FAKE cuTensorMapEncodeTiled(void* map) {
  ENTER();
  if (map == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::memset(map, 0, 128);
  return CUDA_SUCCESS;
}

FAKE cuTensorMapEncodeIm2col(void* map) {
  ENTER();
  if (map == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::memset(map, 0, 128);
  return CUDA_SUCCESS;
}


}  // extern "C"
