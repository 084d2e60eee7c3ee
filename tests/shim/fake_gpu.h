// The fake GPU (cc/fakegpu) as the shim's tests use it: the devices they
// ask for, and its control API (cc/fakegpu/control.h) looked up in the
// library once it is loaded. JAXLAKE_FAKEGPU_PATH is the library's
// absolute path.
#ifndef JAXLAKE_TESTS_SHIM_FAKE_GPU_H_
#define JAXLAKE_TESTS_SHIM_FAKE_GPU_H_

#include <dlfcn.h>
#include <stdlib.h>

#include <cstdio>
#include <cstdlib>

#include "cc/fakegpu/control.h"

namespace jaxlake::testing {

// Three 1 GiB devices: 0 and 1 support virtual memory management and can
// access each other, 2 supports neither (a lake must leave its pool
// alone). Set before the library is loaded (it reads its options once);
// a variable already set wins.
inline void UseFakeGpuDevices() {
  ::setenv("JAXLAKE_FAKEGPU_COUNT", "3", 0);
  ::setenv("JAXLAKE_FAKEGPU_MEMORY", "1073741824", 0);
  ::setenv("JAXLAKE_FAKEGPU_NO_VMM", "2", 0);
}
constexpr int kFakeDevices = 3;
constexpr int kNoVmmDevice = 2;
constexpr std::size_t kFakeDeviceBytes = std::size_t{1} << 30;

// The loaded fake GPU, or nullptr before something loaded it.
inline void* FakeGpu() {
  return ::dlopen(JAXLAKE_FAKEGPU_PATH, RTLD_NOW | RTLD_NOLOAD);
}

// A function of the loaded fake GPU (a control function or a CUDA entry
// point, called directly rather than through the shim); aborts, naming
// it, when it is missing.
template <typename F>
F* FakeGpuFn(const char* name) {
  void* lib = FakeGpu();
  void* fn = lib != nullptr ? ::dlsym(lib, name) : nullptr;
  if (fn == nullptr) {
    std::fprintf(stderr, "the fake GPU %s is not loaded or lacks %s\n",
                 JAXLAKE_FAKEGPU_PATH, name);
    std::abort();
  }
  return reinterpret_cast<F*>(fn);
}

}  // namespace jaxlake::testing

// A control function of control.h, by its name: FAKEGPU(jaxlake_fakegpu_
// calls)("cuInit").
#define FAKEGPU(name) (*::jaxlake::testing::FakeGpuFn<decltype(name)>(#name))

#endif  // JAXLAKE_TESTS_SHIM_FAKE_GPU_H_
