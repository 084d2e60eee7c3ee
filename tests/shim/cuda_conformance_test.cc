// The driver conformance suite (tests/cc/driver_suite.h) over the CUDA
// backend (cc/vmm/cuda_driver.h) on the fake GPU: one device of the suite's
// size, its books read through the fake's control API
// (cc/fakegpu/control.h). The CUDA driver reports the VMM rule violations
// that the sim and host drivers name apart as CUDA_ERROR_INVALID_VALUE; and
// the fake GPU runs a stream's work on a thread of its own, so the subject
// waits for a stream's work after each event record (unless the stream is
// held), as the sim driver completes it at once.
#include <dlfcn.h>

#include <cstdio>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "cc/vmm/cuda_driver.h"
#include "cc/vmm/cuda_types.h"
#include "tests/cc/check.h"
#include "tests/cc/driver_suite.h"
#include "tests/shim/fake_gpu.h"

namespace {

using jaxlake::cuda::CUcontext;
using jaxlake::cuda::CUresult;
using jaxlake::cuda::CUstream;
using jaxlake::driver_suite::DriverUnderTest;
using jaxlake::testing::FakeGpuFn;
using jaxlake::vmm::Status;
using jaxlake::vmm::Stream;

std::unique_ptr<jaxlake::vmm::Driver> NewCudaDriver() {
  std::string error;
  auto lib = jaxlake::vmm::CudaLibrary::Open(JAXLAKE_FAKEGPU_PATH, &error);
  CHECK_EQ(error, "");
  if (lib == nullptr) return nullptr;
  std::string reason;
  auto driver = jaxlake::vmm::CudaDriver::Create(lib, 0, &reason);
  CHECK_EQ(reason, "");
  return driver;
}

class Cuda : public DriverUnderTest {
 public:
  Cuda()
      : DriverUnderTest(NewCudaDriver(), Status::kInvalidValue,
                        Status::kInvalidValue, Status::kInvalidValue, true) {
    if (!ok()) return;
    // The suite's streams (0 is the default stream), made in the device's
    // primary context.
    CUcontext ctx = nullptr;
    FakeGpuFn<CUresult(CUcontext*, int)>("cuDevicePrimaryCtxRetain")(&ctx, 0);
    FakeGpuFn<CUresult(CUcontext)>("cuCtxSetCurrent")(ctx);
    for (Stream n : {1, 2, 3, 7, 12345}) {
      CUstream s = nullptr;
      if (FakeGpuFn<CUresult(CUstream*, unsigned)>("cuStreamCreate")(
              &s, 0) != 0)
        std::abort();
      streams_[n] = reinterpret_cast<Stream>(s);
    }
  }
  ~Cuda() override {
    for (const auto& [n, s] : streams_)
      FakeGpuFn<CUresult(CUstream)>("cuStreamDestroy_v2")(
          reinterpret_cast<CUstream>(s));
    FakeGpuFn<CUresult(CUcontext)>("cuCtxSetCurrent")(nullptr);
    FakeGpuFn<CUresult(int)>("cuDevicePrimaryCtxRelease_v2")(0);
  }
  Cuda(const Cuda&) = delete;
  Cuda& operator=(const Cuda&) = delete;

  std::size_t physical_bytes() const override { return Vmm("physical"); }
  std::size_t mapped_bytes() const override { return Vmm("mapped"); }
  std::size_t reserved_bytes() const override { return Vmm("reserved"); }
  std::size_t live_handles() const override { return Vmm("handles"); }
  std::size_t live_events() const override { return Vmm("events"); }
  bool accessible(std::uintptr_t va, std::size_t size) const override {
    return FAKEGPU(jaxlake_fakegpu_accessible)(va, size) == 1;
  }
  void hold_stream(Stream stream) override {
    CHECK_EQ(FAKEGPU(jaxlake_fakegpu_hold_stream)(Handle(stream)), 0);
    held_.insert(stream);
  }
  void release_stream(Stream stream) override {
    CHECK_EQ(FAKEGPU(jaxlake_fakegpu_release_stream)(Handle(stream)), 0);
    held_.erase(stream);
    Settle(stream);
  }

 protected:
  Stream StreamOf(Stream stream) override {
    if (stream == 0) return 0;
    auto it = streams_.find(stream);
    if (it == streams_.end()) {
      std::fprintf(stderr, "the suite uses stream %llu, which the CUDA "
                   "subject did not make\n",
                   static_cast<unsigned long long>(stream));
      std::abort();
    }
    return it->second;
  }
  void Settle(Stream stream) override {
    if (held_.count(stream) != 0) return;
    FakeGpuFn<CUresult(CUstream)>("cuStreamSynchronize")(
        reinterpret_cast<CUstream>(StreamOf(stream)));
  }

 private:
  static std::size_t Vmm(const char* figure) {
    return static_cast<std::size_t>(FAKEGPU(jaxlake_fakegpu_vmm)(figure));
  }
  void* Handle(Stream stream) {
    return reinterpret_cast<void*>(StreamOf(stream));
  }
  std::map<Stream, Stream> streams_;  // const after construction
  std::set<Stream> held_;             // changed by the test's thread only
};

}  // namespace

#define JAXLAKE_DRIVER_BACKENDS(X, name) X(cuda, Cuda, name)
#include "tests/cc/driver_suite.inc"

int main(int argc, char** argv) {
  // One device of the suite's size.
  ::setenv("JAXLAKE_FAKEGPU_MEMORY",
           std::to_string(jaxlake::driver_suite::kDevice).c_str(), 0);
  if (::dlopen(JAXLAKE_FAKEGPU_PATH, RTLD_NOW) == nullptr) {
    std::fprintf(stderr, "cannot load the fake GPU: %s\n", ::dlerror());
    return 1;
  }
  return jaxlake::check::RunAll(argc, argv);
}
