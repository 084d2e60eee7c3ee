// The fake GPU's loader guard, libjaxlake_fakegpu_interpose.so: under
// `jaxlake run --fake-gpu` it is preloaded (LD_PRELOAD) and stands in for
// dlopen and dlmopen, so that no load of an NVIDIA library reaches NVIDIA's
// own file. JAX's CUDA plugin loads NVIDIA's pip wheels (nvidia-*-cu12,
// nvidia-*-cu13) by absolute path (ctypes.CDLL in the plugin's Python code)
// and by bare name through its DT_RPATH, which the loader searches before
// LD_LIBRARY_PATH; either way NVIDIA's runtime would run over the fake
// driver.
//
// The rule, for a file name whose base name is an NVIDIA library's
// (IsNvidia: libcudart*, libcublas*, libcudnn*, libnccl*, libcuda.so*, ...)
// or whose path lies in an `nvidia` package of site-packages: the load is
// made of <folder>/<base name> instead, where <folder> is the fake's folder
// of links (JAXLAKE_FAKEGPU_LIBS, fakegpu.library_dir()). A name the folder
// has is the fake's library (or, for libcuda, the shim); a name it lacks
// fails as a missing file of that folder, so dlerror() names the fake's
// folder and the library. Every other name is the real dlopen's, untouched.
//
// The stand-ins hand over to the real functions with a jump, not a call, so
// the real dlopen sees its caller's return address: it picks the caller's
// RPATH/RUNPATH, $ORIGIN and link-map namespace from it. That is why they
// are written in x86-64 assembly (the fake GPU is built for x86-64 Linux
// only): the C++ part only computes the file name to load.
//
// JAXLAKE_FAKEGPU_LOADS=FILE appends one line per routed request to FILE:
// "<asked>\t<loaded>" or "<asked>\trefused\t<path tried>". Both variables
// are read once, at the first dlopen.
//
// The library uses only the C library (no C++ runtime), since every process
// the program starts inherits the preload.
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if !defined(__x86_64__) || !defined(__linux__)
#error "the fake GPU's loader guard is written for x86-64 Linux"
#endif

#define JAXLAKE_HIDDEN __attribute__((visibility("hidden")))

// The real functions, jumped to by the stand-ins below.
extern "C" {
JAXLAKE_HIDDEN void* jaxlake_fakegpu_real_dlopen = nullptr;
JAXLAKE_HIDDEN void* jaxlake_fakegpu_real_dlmopen = nullptr;
JAXLAKE_HIDDEN __attribute__((used)) const char* jaxlake_fakegpu_route(
    const char* file);
}

namespace {

constexpr size_t k_max_path = 4096;

// The fake's folder of links ("" when unset: nothing is routed) and the
// trace file (-1: none).
char g_folder[k_max_path];
int g_trace = -1;
pthread_once_t g_once = PTHREAD_ONCE_INIT;

// Routed names, kept for the life of the process: the real dlopen reads the
// name after the stand-in has returned its pointer.
struct Routed {
  Routed* next;
  char path[1];
};
Routed* g_routed = nullptr;
pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

void Say(const char* text) {
  ssize_t ignored = write(2, text, strlen(text));
  (void)ignored;
}

void Init() {
  jaxlake_fakegpu_real_dlopen = dlsym(RTLD_NEXT, "dlopen");
  jaxlake_fakegpu_real_dlmopen = dlsym(RTLD_NEXT, "dlmopen");
  if (jaxlake_fakegpu_real_dlopen == nullptr ||
      jaxlake_fakegpu_real_dlmopen == nullptr) {
    Say("jaxlake fake GPU: the loader guard finds no dlopen or dlmopen "
        "after it in the C library\n");
    abort();
  }
  const char* folder = getenv("JAXLAKE_FAKEGPU_LIBS");
  if (folder != nullptr && folder[0] == '/' &&
      strlen(folder) + 1 < sizeof g_folder) {
    strcpy(g_folder, folder);
    size_t n = strlen(g_folder);
    while (n > 1 && g_folder[n - 1] == '/') g_folder[--n] = '\0';
  } else if (folder != nullptr && folder[0] != '\0') {
    Say("jaxlake fake GPU: JAXLAKE_FAKEGPU_LIBS must be an absolute path "
        "of at most 4095 bytes; NVIDIA's libraries are not routed\n");
  }
  const char* trace = getenv("JAXLAKE_FAKEGPU_LOADS");
  if (trace != nullptr && trace[0] != '\0') {
    g_trace = open(trace, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (g_trace < 0) {
      Say("jaxlake fake GPU: cannot open JAXLAKE_FAKEGPU_LOADS for "
          "appending; loads are not traced\n");
    }
  }
}

bool StartsWith(const char* s, const char* prefix) {
  return strncmp(s, prefix, strlen(prefix)) == 0;
}

// NVIDIA's libraries, by base name, and anything in an `nvidia` package of
// site-packages (the wheels' folders: nvidia/cublas/lib, nvidia/cu13/lib,
// ...).
bool IsNvidia(const char* file, const char* base) {
  static const char* const k_prefixes[] = {
      "libcuda.so", "libcudart.", "libcublas.", "libcublasLt.",
      "libcudnn",   "libnccl.",   "libcufft",   "libcusparse.",
      "libcusolver", "libcupti.", "libnvJitLink.", "libnvrtc",
      "libnvidia-", "libnvshmem", "nvshmem_",   "libcurand.",
      "libnvToolsExt", "libnvtx", "libnvblas.", "libnvperf_",
      "libnvjpeg.", "libnpp",   "libnvptxcompiler", "libnvvm.",
      "libcheckpoint.", "libpcsamplingutil.",
  };
  for (const char* prefix : k_prefixes) {
    if (StartsWith(base, prefix)) return true;
  }
  return strstr(file, "site-packages/nvidia/") != nullptr ||
         strstr(file, "dist-packages/nvidia/") != nullptr;
}

// The name, stored for good: the same string for the same path.
const char* Keep(const char* path) {
  pthread_mutex_lock(&g_lock);
  const char* kept = nullptr;
  for (Routed* r = g_routed; r != nullptr; r = r->next) {
    if (strcmp(r->path, path) == 0) {
      kept = r->path;
      break;
    }
  }
  if (kept == nullptr) {
    size_t n = strlen(path);
    auto* r = static_cast<Routed*>(malloc(sizeof(Routed) + n));
    if (r != nullptr) {
      memcpy(r->path, path, n + 1);
      r->next = g_routed;
      g_routed = r;
      kept = r->path;
    }
  }
  pthread_mutex_unlock(&g_lock);
  return kept;
}

void Trace(const char* asked, const char* loaded, bool found) {
  if (g_trace < 0) return;
  char line[2 * k_max_path + 16];
  size_t n = 0;
  auto add = [&](const char* s) {
    size_t k = strlen(s);
    if (k > sizeof line - 1 - n) k = sizeof line - 1 - n;
    memcpy(line + n, s, k);
    n += k;
  };
  add(asked);
  add(found ? "\t" : "\trefused\t");
  add(loaded);
  add("\n");
  ssize_t ignored = write(g_trace, line, n);  // one write: O_APPEND keeps
  (void)ignored;                              // the lines whole
}

}  // namespace

extern "C" const char* jaxlake_fakegpu_route(const char* file) {
  pthread_once(&g_once, Init);
  if (file == nullptr || g_folder[0] == '\0') return file;
  const char* slash = strrchr(file, '/');
  const char* base = slash != nullptr ? slash + 1 : file;
  if (base[0] == '\0' || !IsNvidia(file, base)) return file;
  size_t folder = strlen(g_folder);
  if (slash != nullptr && static_cast<size_t>(slash - file) == folder &&
      strncmp(file, g_folder, folder) == 0) {
    return file;  // already one of the fake's links
  }
  char path[k_max_path];
  if (folder + 1 + strlen(base) + 1 > sizeof path) {
    return g_folder;  // no such name: loading the folder fails
  }
  memcpy(path, g_folder, folder);
  path[folder] = '/';
  strcpy(path + folder + 1, base);
  const char* kept = Keep(path);
  if (kept == nullptr) return g_folder;  // out of memory: fail the load
  Trace(file, kept, access(kept, F_OK) == 0);
  return kept;
}

// void* dlopen(const char* file, int mode);
// void* dlmopen(Lmid_t lmid, const char* file, int mode);
// Each saves its arguments, asks jaxlake_fakegpu_route for the file name,
// restores them with that name and jumps to the real function. The stack
// is 16-byte aligned at the call, as the ABI asks.
asm(R"(
  .text
  .globl dlopen
  .type dlopen, @function
dlopen:
  .cfi_startproc
  pushq %rdi
  .cfi_adjust_cfa_offset 8
  pushq %rsi
  .cfi_adjust_cfa_offset 8
  subq $8, %rsp
  .cfi_adjust_cfa_offset 8
  call jaxlake_fakegpu_route
  addq $8, %rsp
  .cfi_adjust_cfa_offset -8
  popq %rsi
  .cfi_adjust_cfa_offset -8
  popq %rdi
  .cfi_adjust_cfa_offset -8
  movq %rax, %rdi
  jmpq *jaxlake_fakegpu_real_dlopen(%rip)
  .cfi_endproc
  .size dlopen, .-dlopen

  .globl dlmopen
  .type dlmopen, @function
dlmopen:
  .cfi_startproc
  pushq %rdi
  .cfi_adjust_cfa_offset 8
  pushq %rsi
  .cfi_adjust_cfa_offset 8
  pushq %rdx
  .cfi_adjust_cfa_offset 8
  movq %rsi, %rdi
  call jaxlake_fakegpu_route
  popq %rdx
  .cfi_adjust_cfa_offset -8
  popq %rsi
  .cfi_adjust_cfa_offset -8
  popq %rdi
  .cfi_adjust_cfa_offset -8
  movq %rax, %rsi
  jmpq *jaxlake_fakegpu_real_dlmopen(%rip)
  .cfi_endproc
  .size dlmopen, .-dlmopen
)");
