// Tests of the CUDA backend (cc/vmm/cuda_driver.h) over the fake GPU
// (cc/fakegpu), loaded by its absolute path as the real driver would be,
// with three 1 GiB devices: 0 and 1 support VMM and can access each other,
// 2 supports neither (tests/shim/fake_gpu.h).
#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cc/lake/lake.h"
#include "cc/vmm/cuda_driver.h"
#include "tests/cc/check.h"
#include "tests/shim/fake_gpu.h"

namespace {

using jaxlake::vmm::Call;
using jaxlake::vmm::CudaDriver;
using jaxlake::vmm::CudaDriverOptions;
using jaxlake::vmm::CudaLibrary;
using jaxlake::vmm::Status;

constexpr std::size_t kMiB = std::size_t{1} << 20;

std::shared_ptr<CudaLibrary> Library() {
  std::string error;
  std::shared_ptr<CudaLibrary> lib =
      CudaLibrary::Open(JAXLAKE_FAKEGPU_PATH, &error);
  CHECK_EQ(error, "");
  return lib;
}

std::unique_ptr<CudaDriver> Driver(int ordinal,
                                   const CudaDriverOptions& options = {}) {
  std::string reason;
  auto driver = CudaDriver::Create(Library(), ordinal, &reason, options);
  CHECK_EQ(reason, "");
  return driver;
}

unsigned long long CreatedBytes(int device) {
  return FAKEGPU(jaxlake_fakegpu_created_bytes)(device);
}
int PrimaryRefs(int device) {
  return FAKEGPU(jaxlake_fakegpu_primary_refs)(device);
}

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(factory_says_why_it_cannot_make_a_driver) {
  std::string why;
  CHECK(jaxlake::vmm::MakeCudaDriver("libcuda.so.1", 0, &why) == nullptr);
  CHECK(Contains(why, "not absolute"));
  CHECK(jaxlake::vmm::MakeCudaDriver("/nonexistent/libcuda.so.1", 0, &why) ==
        nullptr);
  CHECK(Contains(why, "cannot load"));
  // A library that is not a driver (this test links libdl's provider).
  Dl_info info{};
  ::dladdr(reinterpret_cast<void*>(&::dlopen), &info);
  CHECK(jaxlake::vmm::MakeCudaDriver(info.dli_fname, 0, &why) == nullptr);
  CHECK(Contains(why, "has no cuInit"));
  CHECK(jaxlake::vmm::MakeCudaDriver(JAXLAKE_FAKEGPU_PATH, 7, &why) ==
        nullptr);
  CHECK(Contains(why, "device 7 does not exist (3 devices)"));
  CHECK(jaxlake::vmm::MakeCudaDriver(JAXLAKE_FAKEGPU_PATH, 2, &why) ==
        nullptr);
  CHECK(Contains(why, "device 2 does not support virtual memory management"));
}

TEST(driver_reports_the_device) {
  auto driver = Driver(0);
  REQUIRE(driver != nullptr);
  CHECK_EQ(std::string(driver->name()), "cuda");
  CHECK_EQ(driver->granularity(), 2 * kMiB);
  CHECK_EQ(driver->total_memory(), std::size_t{1} << 30);
  CHECK_EQ(driver->driver_version(), 13000);
  CHECK_EQ(driver->ordinal(), 0);
  CHECK(driver->access_devices() == std::vector<int>({0, 1}));
  CudaDriverOptions alone;
  alone.peer_access = false;
  auto solo = Driver(1, alone);
  REQUIRE(solo != nullptr);
  CHECK(solo->access_devices() == std::vector<int>({1}));
}

TEST(vmm_calls_map_real_memory) {
  auto driver = Driver(0);
  REQUIRE(driver != nullptr);
  const std::size_t g = driver->granularity();
  std::uintptr_t a = 0, b = 0;
  jaxlake::vmm::Handle h = 0;
  REQUIRE(driver->create(2 * g, &h) == Status::kOk);
  REQUIRE(driver->reserve(2 * g, &a) == Status::kOk);
  REQUIRE(driver->reserve(g, &b) == Status::kOk);
  // The whole handle at a, its second granule at b: one memory, two views.
  REQUIRE(driver->map(a, 2 * g, 0, h) == Status::kOk);
  REQUIRE(driver->map(b, g, g, h) == Status::kOk);
  REQUIRE(driver->set_access(a, 2 * g) == Status::kOk);
  REQUIRE(driver->set_access(b, g) == Status::kOk);
  std::memset(reinterpret_cast<void*>(a + g), 0x5A, g);
  CHECK_EQ(reinterpret_cast<unsigned char*>(b)[g - 1], 0x5A);
  // The driver's rules come back as statuses.
  CHECK(driver->unmap(a, g) != Status::kOk);  // part of one mapping
  CHECK(driver->create(g + 1, &h) == Status::kInvalidValue);
  CHECK(driver->unmap(b, g) == Status::kOk);
  CHECK(driver->unmap(a, 2 * g) == Status::kOk);
  CHECK(driver->release(h) == Status::kOk);
  CHECK(driver->address_free(a, 2 * g) == Status::kOk);
  CHECK(driver->address_free(b, g) == Status::kOk);
  CHECK_EQ(driver->calls(Call::map), 2u);
  CHECK_EQ(driver->calls(Call::set_access), 2u);
}

TEST(events_follow_their_stream) {
  auto driver = Driver(0);
  REQUIRE(driver != nullptr);
  jaxlake::vmm::Event e = 0;
  REQUIRE(driver->event_create(&e) == Status::kOk);
  CHECK(driver->event_record(e, 0) == Status::kOk);
  // The fake GPU runs a stream's work on a thread: complete once waited for.
  CHECK(driver->event_synchronize(e) == Status::kOk);
  CHECK(driver->event_query(e) == Status::kOk);
  CHECK(driver->event_destroy(e) == Status::kOk);
}

TEST(calls_work_from_a_thread_without_a_context_and_leave_none) {
  auto driver = Driver(0);
  REQUIRE(driver != nullptr);
  auto* get_current = jaxlake::testing::FakeGpuFn<int(void**)>(
      "cuCtxGetCurrent");  // the fake's own entry point
  Status created = Status::kDriverError;
  void* after = reinterpret_cast<void*>(1);
  std::thread worker([&] {
    jaxlake::vmm::Handle h = 0;
    created = driver->create(driver->granularity(), &h);
    if (created == Status::kOk) driver->release(h);
    get_current(&after);
  });
  worker.join();
  CHECK(created == Status::kOk);
  CHECK(after == nullptr);
}

TEST(destruction_returns_everything_and_the_context) {
  const int refs = PrimaryRefs(1);
  const auto created = CreatedBytes(1);
  {
    auto driver = Driver(1);
    REQUIRE(driver != nullptr);
    CHECK_EQ(PrimaryRefs(1), refs + 1);
    // Left behind on purpose: a mapped handle, a reservation, an event.
    const std::size_t g = driver->granularity();
    std::uintptr_t va = 0;
    jaxlake::vmm::Handle h = 0;
    jaxlake::vmm::Event e = 0;
    REQUIRE(driver->reserve(4 * g, &va) == Status::kOk);
    REQUIRE(driver->create(4 * g, &h) == Status::kOk);
    REQUIRE(driver->map(va, 4 * g, 0, h) == Status::kOk);
    REQUIRE(driver->event_create(&e) == Status::kOk);
    CHECK_EQ(CreatedBytes(1), created + 4 * g);
  }
  CHECK_EQ(CreatedBytes(1), created);
  CHECK_EQ(PrimaryRefs(1), refs);
}

TEST(a_lake_over_the_cuda_driver_stitches) {
  auto driver = Driver(0);
  REQUIRE(driver != nullptr);
  jaxlake::LakeOptions options;
  options.capacity = 32 * kMiB;
  REQUIRE_EQ(jaxlake::ValidateOptions(options, *driver), "");
  {
    jaxlake::Lake lake(*driver, options);
    std::uintptr_t p[4] = {};
    for (std::uintptr_t& q : p)
      REQUIRE(lake.allocate(8 * kMiB, 0, &q) == Status::kOk);
    CHECK(lake.free(p[0], 0) == Status::kOk);
    CHECK(lake.free(p[2], 0) == Status::kOk);
    std::uintptr_t big = 0;
    jaxlake::AllocState how{};
    REQUIRE(lake.allocate(16 * kMiB, 0, &big, &how) == Status::kOk);
    CHECK(how == jaxlake::AllocState::stitch);
    std::memset(reinterpret_cast<void*>(big), 0x77, 16 * kMiB);
    CHECK_EQ(reinterpret_cast<unsigned char*>(big)[16 * kMiB - 1], 0x77);
    CHECK_EQ(lake.check(), "");
    CHECK_EQ(lake.stats().bytes_reserved.current,
             static_cast<std::int64_t>(32 * kMiB));
  }
  CHECK_EQ(CreatedBytes(0), 0u);
}

}  // namespace

int main(int argc, char** argv) {
  jaxlake::testing::UseFakeGpuDevices();
  if (::dlopen(JAXLAKE_FAKEGPU_PATH, RTLD_NOW) == nullptr) {
    std::fprintf(stderr, "cannot load the fake GPU: %s\n", ::dlerror());
    return 1;
  }
  return jaxlake::check::RunAll(argc, argv);
}
