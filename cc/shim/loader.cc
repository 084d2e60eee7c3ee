// jaxlake shim: finding and loading the real CUDA driver (see loader.h).
#include "cc/shim/loader.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdlib.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "cc/shim/trampolines.h"

namespace jaxlake::shim {
namespace {

// Where drivers are installed, searched after $LD_LIBRARY_PATH.
constexpr const char* kDriverDirs[] = {
    "/usr/lib/x86_64-linux-gnu",  // Debian, Ubuntu
    "/usr/lib64",                 // Red Hat, SUSE
    "/usr/lib",                   // Arch and others
    "/usr/local/nvidia/lib64",    // NVIDIA container toolkit
    "/usr/local/nvidia/lib",
    "/usr/lib/wsl/lib",           // WSL 2
    "/run/opengl-driver/lib",     // NixOS
    "/usr/local/cuda/compat",     // CUDA forward-compatibility package
};

constexpr const char kLibName[] = "libcuda.so.1";

std::string RealPath(const std::string& path) {
  char buf[PATH_MAX];
  return ::realpath(path.c_str(), buf) != nullptr ? std::string(buf)
                                                  : std::string();
}

// The file the shim was loaded from.
std::string SelfPath() {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&jaxlake_shim_missing), &info) == 0 ||
      info.dli_fname == nullptr)
    return {};
  return RealPath(info.dli_fname);
}

std::vector<std::string> Candidates() {
  std::vector<std::string> out;
  auto add = [&](const std::string& dir) {
    if (dir.empty() || dir[0] != '/') return;
    std::string path = dir + (dir.back() == '/' ? "" : "/") + kLibName;
    for (const std::string& p : out)
      if (p == path) return;
    out.push_back(std::move(path));
  };
  if (const char* env = ::getenv("LD_LIBRARY_PATH")) {
    std::string dirs = env;
    std::size_t start = 0;
    while (start <= dirs.size()) {
      std::size_t end = dirs.find(':', start);
      if (end == std::string::npos) end = dirs.size();
      add(dirs.substr(start, end - start));
      start = end + 1;
    }
  }
  for (const char* dir : kDriverDirs) add(dir);
  return out;
}

// Opens `path` if it is a real driver; else nullptr, with *why set when the
// file exists but was refused.
void* TryOpen(const std::string& path, const std::string& self,
              std::string* why) {
  why->clear();
  if (path.empty() || path[0] != '/') {
    *why = path + " is not an absolute path";
    return nullptr;
  }
  if (::access(path.c_str(), F_OK) != 0) return nullptr;
  if (!self.empty() && RealPath(path) == self) {
    *why = path + " is the shim itself";
    return nullptr;
  }
  void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* msg = ::dlerror();
    *why = path + ": " + (msg != nullptr ? msg : "cannot be loaded");
    return nullptr;
  }
  if (::dlsym(handle, "jaxlake_shim_api_version") != nullptr) {
    *why = path + " is a copy of the jaxlake shim";
  } else if (::dlsym(handle, "cuInit") == nullptr) {
    *why = path + " has no cuInit";
  } else {
    return handle;
  }
  ::dlclose(handle);
  return nullptr;
}

template <typename F>
void Resolve(void* handle, const char* name, F** fn) {
  *fn = reinterpret_cast<F*>(::dlsym(handle, name));
}

RealDriver* Load() {
  auto* r = new RealDriver;
  r->self = SelfPath();
  const char* forced = ::getenv("JAXLAKE_REAL_LIBCUDA");
  const bool use_env = forced != nullptr && forced[0] != '\0';
  const std::vector<std::string> candidates =
      use_env ? std::vector<std::string>{forced} : Candidates();
  std::string refused;
  for (const std::string& path : candidates) {
    std::string why;
    r->handle = TryOpen(path, r->self, &why);
    if (r->handle != nullptr) {
      r->path = path;
      break;
    }
    if (!why.empty()) refused += (refused.empty() ? "" : "; ") + why;
  }
  if (r->handle == nullptr) {
    if (use_env) {
      r->error = "JAXLAKE_REAL_LIBCUDA=" + std::string(forced) + ": " +
                 (refused.empty() ? "no such file" : refused);
    } else {
      r->error = "no real CUDA driver (libcuda.so.1) found in "
                 "LD_LIBRARY_PATH or the usual driver directories";
      if (!refused.empty()) r->error += " (refused: " + refused + ")";
      r->error += "; set JAXLAKE_REAL_LIBCUDA to its absolute path";
    }
  } else {
    RealApi& a = r->api;
    Resolve(r->handle, "cuMemAllocFromPoolAsync", &a.MemAllocFromPoolAsync);
    Resolve(r->handle, "cuMemAllocFromPoolAsync_ptsz",
            &a.MemAllocFromPoolAsync_ptsz);
    Resolve(r->handle, "cuMemFreeAsync", &a.MemFreeAsync);
    Resolve(r->handle, "cuMemFreeAsync_ptsz", &a.MemFreeAsync_ptsz);
    Resolve(r->handle, "cuMemPoolGetAttribute", &a.MemPoolGetAttribute);
    Resolve(r->handle, "cuGetProcAddress", &a.GetProcAddress);
    Resolve(r->handle, "cuGetProcAddress_v2", &a.GetProcAddress_v2);
    Resolve(r->handle, "cuDeviceGetCount", &a.DeviceGetCount);
    Resolve(r->handle, "cuDeviceGet", &a.DeviceGet);
    Resolve(r->handle, "cuDeviceGetDefaultMemPool",
            &a.DeviceGetDefaultMemPool);
    Resolve(r->handle, "cuCtxGetDevice", &a.CtxGetDevice);
    Resolve(r->handle, "cuStreamIsCapturing", &a.StreamIsCapturing);
    Resolve(r->handle, "cuStreamIsCapturing_ptsz", &a.StreamIsCapturing_ptsz);
    Resolve(r->handle, "cuThreadExchangeStreamCaptureMode",
            &a.ThreadExchangeStreamCaptureMode);
    Resolve(r->handle, "cuMemPoolTrimTo", &a.MemPoolTrimTo);
    Resolve(r->handle, "cuStreamBeginCapture", &a.StreamBeginCapture);
    Resolve(r->handle, "cuStreamBeginCapture_ptsz",
            &a.StreamBeginCapture_ptsz);
    Resolve(r->handle, "cuStreamBeginCapture_v2", &a.StreamBeginCapture_v2);
    Resolve(r->handle, "cuStreamBeginCapture_v2_ptsz",
            &a.StreamBeginCapture_v2_ptsz);
    Resolve(r->handle, "cuStreamBeginCaptureToGraph",
            &a.StreamBeginCaptureToGraph);
    Resolve(r->handle, "cuStreamBeginCaptureToGraph_ptsz",
            &a.StreamBeginCaptureToGraph_ptsz);
    Resolve(r->handle, "cuStreamEndCapture", &a.StreamEndCapture);
    Resolve(r->handle, "cuStreamEndCapture_ptsz", &a.StreamEndCapture_ptsz);
    Resolve(r->handle, "cuMemAlloc_v2", &a.MemAlloc_v2);
    Resolve(r->handle, "cuMemAllocPitch_v2", &a.MemAllocPitch_v2);
    Resolve(r->handle, "cuMemAllocManaged", &a.MemAllocManaged);
    Resolve(r->handle, "cuMemAllocAsync", &a.MemAllocAsync);
    Resolve(r->handle, "cuMemAllocAsync_ptsz", &a.MemAllocAsync_ptsz);
    Resolve(r->handle, "cuMemFree_v2", &a.MemFree_v2);
    Resolve(r->handle, "cuMemCreate", &a.MemCreate);
    Resolve(r->handle, "cuMemRelease", &a.MemRelease);
    Resolve(r->handle, "cuMemGetAddressRange_v2", &a.MemGetAddressRange_v2);
    Resolve(r->handle, "cuPointerGetAttribute", &a.PointerGetAttribute);
    Resolve(r->handle, "cuPointerGetAttributes", &a.PointerGetAttributes);
  }
  r->forwarded = FillForwardingTable(r->handle);
  return r;
}

}  // namespace

const RealDriver& Real() {
  static const RealDriver* const real = Load();  // never freed
  return *real;
}

}  // namespace jaxlake::shim
