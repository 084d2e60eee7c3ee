// jaxlake: tests of the virtual-memory drivers.
//
// The conformance suite (driver_suite.h, driver_suite.inc) runs once over
// the sim driver and once over the host driver (and over the CUDA driver on
// the fake GPU in tests/shim/cuda_conformance_test.cc). Host-only tests check real bytes:
// one handle seen at several addresses, stitching, faults before
// set_access. Then the faulty driver, the factory and the names.
#include <dirent.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <ostream>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "cc/vmm/driver.h"
#include "cc/vmm/faulty_driver.h"
#include "cc/vmm/host_driver.h"
#include "cc/vmm/make_driver.h"
#include "cc/vmm/sim_driver.h"
#include "tests/cc/check.h"
#include "tests/cc/driver_suite.h"

namespace {

using jaxlake::vmm::BackendNames;
using jaxlake::vmm::Call;
using jaxlake::vmm::CallCounts;
using jaxlake::vmm::CallName;
using jaxlake::vmm::Driver;
using jaxlake::vmm::Event;
using jaxlake::vmm::FaultyDriver;
using jaxlake::vmm::Handle;
using jaxlake::vmm::kNumCalls;
using jaxlake::vmm::MakeDriver;
using jaxlake::vmm::SimDriver;
using jaxlake::vmm::SimOptions;
using jaxlake::vmm::Status;
using jaxlake::vmm::StatusName;

using jaxlake::driver_suite::kDevice;
using jaxlake::driver_suite::kG;
using jaxlake::driver_suite::kInvalid;
using jaxlake::driver_suite::kOk;
using jaxlake::driver_suite::kPage;
using jaxlake::driver_suite::Ptr;

SimOptions TestOptions() {
  SimOptions o;
  o.granularity = kG;
  o.device_bytes = kDevice;
  return o;
}

// A driver of the named backend, through the factory.
std::unique_ptr<SimDriver> NewDriver(const char* backend) {
  std::string error;
  std::unique_ptr<Driver> d = MakeDriver(backend, TestOptions(), &error);
  CHECK_EQ(error, std::string());
  auto* sim = dynamic_cast<SimDriver*>(d.get());
  if (sim == nullptr) return nullptr;
  d.release();
  return std::unique_ptr<SimDriver>(sim);
}

// The sim and host drivers under the conformance suite: their books are
// SimDriver's own.
class SimSubject : public jaxlake::driver_suite::DriverUnderTest {
 public:
  explicit SimSubject(const char* backend)
      : DriverUnderTest(NewDriver(backend), Status::kNotMapped,
                        Status::kAlreadyMapped, Status::kBusy,
                        std::strcmp(backend, "host") == 0) {}
  std::size_t physical_bytes() const override {
    return sim().physical_bytes();
  }
  std::size_t mapped_bytes() const override { return sim().mapped_bytes(); }
  std::size_t reserved_bytes() const override {
    return sim().reserved_bytes();
  }
  std::size_t live_handles() const override { return sim().live_handles(); }
  std::size_t live_events() const override { return sim().live_events(); }
  bool accessible(std::uintptr_t va, std::size_t size) const override {
    return sim().accessible(va, size);
  }
  void hold_stream(jaxlake::vmm::Stream s) override { sim().hold_stream(s); }
  void release_stream(jaxlake::vmm::Stream s) override {
    sim().release_stream(s);
  }

 private:
  SimDriver& sim() const {
    return static_cast<SimDriver&>(
        const_cast<SimSubject*>(this)->driver());
  }
};
struct Sim : SimSubject {
  Sim() : SimSubject("sim") {}
};
struct Host : SimSubject {
  Host() : SimSubject("host") {}
};

}  // namespace

#define JAXLAKE_DRIVER_BACKENDS(X, name) X(sim, Sim, name) X(host, Host, name)
#include "tests/cc/driver_suite.inc"

namespace {

// ---- host only: real bytes -------------------------------------------------

// Writes one tagged word at the start of every page of [va, va+size).
void Stamp(std::uintptr_t va, std::size_t size, std::uint32_t tag) {
  for (std::size_t off = 0; off < size; off += kPage) {
    const std::uint64_t word = (std::uint64_t{tag} << 32) | (off / kPage);
    std::memcpy(Ptr(va + off), &word, sizeof word);
  }
}

// True when [va, va+size) shows the words Stamp(tag) wrote, starting at
// page `first_page` of the stamped range.
bool HasStamp(std::uintptr_t va, std::size_t size, std::uint32_t tag,
              std::size_t first_page = 0) {
  for (std::size_t off = 0; off < size; off += kPage) {
    std::uint64_t word = 0;
    std::memcpy(&word, Ptr(va + off), sizeof word);
    if (word != ((std::uint64_t{tag} << 32) | (first_page + off / kPage)))
      return false;
  }
  return true;
}

TEST(host_one_handle_shows_the_same_bytes_everywhere) {
  auto d = NewDriver("host");
  REQUIRE(d != nullptr);
  Handle h1 = 0, h2 = 0;
  std::uintptr_t a = 0, b = 0, s = 0;
  REQUIRE_EQ(d->create(2 * kG, &h1), kOk);
  REQUIRE_EQ(d->create(kG, &h2), kOk);
  REQUIRE_EQ(d->reserve(2 * kG, &a), kOk);
  REQUIRE_EQ(d->reserve(kG, &b), kOk);
  REQUIRE_EQ(d->reserve(3 * kG, &s), kOk);

  // Primary ranges.
  REQUIRE_EQ(d->map(a, 2 * kG, 0, h1), kOk);
  REQUIRE_EQ(d->set_access(a, 2 * kG), kOk);
  REQUIRE_EQ(d->map(b, kG, 0, h2), kOk);
  REQUIRE_EQ(d->set_access(b, kG), kOk);
  Stamp(a, 2 * kG, 1);
  Stamp(b, kG, 2);

  // Stitched: h1 then h2 in one range, one set_access for both.
  REQUIRE_EQ(d->map(s, 2 * kG, 0, h1), kOk);
  REQUIRE_EQ(d->map(s + 2 * kG, kG, 0, h2), kOk);
  REQUIRE_EQ(d->set_access(s, 3 * kG), kOk);
  CHECK(HasStamp(s, 2 * kG, 1));
  CHECK(HasStamp(s + 2 * kG, kG, 2));

  // Writes through the stitched range show at the primary ones and back.
  std::memcpy(Ptr(s + 2 * kG - 8), "tail-h1", 8);
  std::memcpy(Ptr(s + 2 * kG + 16), "head-h2", 8);
  CHECK_EQ(std::string(Ptr(a + 2 * kG - 8)), "tail-h1");
  CHECK_EQ(std::string(Ptr(b + 16)), "head-h2");
  std::memcpy(Ptr(a + kG + 64), "via-a", 6);
  CHECK_EQ(std::string(Ptr(s + kG + 64)), "via-a");

  // Unmap both pieces in one call, then stitch in the other order.
  REQUIRE_EQ(d->unmap(s, 3 * kG), kOk);
  CHECK(!d->accessible(s, 3 * kG));
  Stamp(a, 2 * kG, 3);
  Stamp(b, kG, 4);
  REQUIRE_EQ(d->map(s, kG, 0, h2), kOk);
  REQUIRE_EQ(d->map(s + kG, 2 * kG, 0, h1), kOk);
  REQUIRE_EQ(d->set_access(s, 3 * kG), kOk);
  CHECK(HasStamp(s, kG, 4));
  CHECK(HasStamp(s + kG, 2 * kG, 3));

  // A piece at an offset of its handle.
  REQUIRE_EQ(d->unmap(s, 3 * kG), kOk);
  REQUIRE_EQ(d->map(s + kG, kG, kG, h1), kOk);
  REQUIRE_EQ(d->set_access(s + kG, kG), kOk);
  CHECK(HasStamp(s + kG, kG, 3, kG / kPage));

  CHECK_EQ(d->unmap(s + kG, kG), kOk);
  CHECK_EQ(d->unmap(a, 2 * kG), kOk);
  CHECK_EQ(d->unmap(b, kG), kOk);
  CHECK_EQ(d->release(h1), kOk);
  CHECK_EQ(d->release(h2), kOk);
  for (std::uintptr_t r : {a, b, s})
    CHECK_EQ(d->address_free(r, r == a ? 2 * kG : r == b ? kG : 3 * kG), kOk);
  CHECK_EQ(d->physical_bytes(), 0u);
}

// True when writing one byte at va kills a child process (so it faults).
bool WriteFaults(std::uintptr_t va) {
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int null_fd = ::open("/dev/null", O_WRONLY);  // quiet sanitizers
    if (null_fd >= 0) ::dup2(null_fd, 2);
    *reinterpret_cast<volatile char*>(va) = 1;
    ::_exit(0);
  }
  if (pid < 0) return false;
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) return false;
  return !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

TEST(host_touching_without_access_faults) {
  auto d = NewDriver("host");
  REQUIRE(d != nullptr);
  std::uintptr_t r = 0;
  Handle h = 0;
  REQUIRE_EQ(d->reserve(2 * kG, &r), kOk);
  REQUIRE_EQ(d->create(kG, &h), kOk);
  CHECK(WriteFaults(r));  // reserved, not mapped
  REQUIRE_EQ(d->map(r, kG, 0, h), kOk);
  CHECK(WriteFaults(r));  // mapped, no access yet
  REQUIRE_EQ(d->set_access(r, kG), kOk);
  CHECK(!WriteFaults(r));  // accessible
  CHECK_EQ(Ptr(r)[0], 1);  // the child's write went to the shared memory
  CHECK(WriteFaults(r + kG));  // the rest of the reservation
  REQUIRE_EQ(d->unmap(r, kG), kOk);
  CHECK(WriteFaults(r));  // unmapped again, still reserved
  CHECK_EQ(d->release(h), kOk);
  CHECK_EQ(d->address_free(r, 2 * kG), kOk);
}

int OpenFds() {
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  int n = 0;
  while (::readdir(dir) != nullptr) ++n;
  ::closedir(dir);
  return n;
}

TEST(host_release_closes_the_memfd_and_mappings_keep_the_bytes) {
  auto d = NewDriver("host");
  REQUIRE(d != nullptr);
  const int before = OpenFds();
  std::uintptr_t r = 0;
  Handle h = 0;
  REQUIRE_EQ(d->create(kG, &h), kOk);
  CHECK_EQ(OpenFds(), before + 1);
  REQUIRE_EQ(d->reserve(kG, &r), kOk);
  REQUIRE_EQ(d->map(r, kG, 0, h), kOk);
  REQUIRE_EQ(d->set_access(r, kG), kOk);
  Stamp(r, kG, 9);
  REQUIRE_EQ(d->release(h), kOk);
  CHECK_EQ(OpenFds(), before);
  CHECK(HasStamp(r, kG, 9));
  Stamp(r, kG, 10);
  CHECK(HasStamp(r, kG, 10));
  CHECK_EQ(d->unmap(r, kG), kOk);
  CHECK_EQ(d->address_free(r, kG), kOk);
  CHECK_EQ(d->physical_bytes(), 0u);
}

TEST(host_destructor_returns_everything) {
  const int before = OpenFds();
  {
    auto d = NewDriver("host");
    REQUIRE(d != nullptr);
    std::uintptr_t r = 0;
    Handle h = 0;
    REQUIRE_EQ(d->create(kG, &h), kOk);
    REQUIRE_EQ(d->reserve(kG, &r), kOk);
    REQUIRE_EQ(d->map(r, kG, 0, h), kOk);
    CHECK_EQ(OpenFds(), before + 1);
  }
  CHECK_EQ(OpenFds(), before);
}

// ---- faulty driver ---------------------------------------------------------

TEST(faulty_injects_the_nth_failure_then_forwards) {
  SimDriver inner(TestOptions());
  FaultyDriver d(inner);
  CHECK_EQ(&d.inner(), static_cast<Driver*>(&inner));
  CHECK_EQ(std::string(d.name()), "faulty");
  CHECK_EQ(d.granularity(), kG);
  CHECK_EQ(d.total_memory(), kDevice);

  std::uintptr_t r = 0;
  REQUIRE_EQ(d.reserve(4 * kG, &r), kOk);
  Handle h = 0;
  REQUIRE_EQ(d.create(4 * kG, &h), kOk);

  d.fail(Call::map, 2);
  CHECK_EQ(d.map(r, kG, 0, h), kOk);                         // 1st: forwarded
  CHECK_EQ(d.map(r + kG, kG, kG, h), Status::kDriverError);  // 2nd: injected
  CHECK_EQ(d.map(r + kG, kG, kG, h), kOk);                   // forwarded again
  CHECK_EQ(d.injected(), 1u);
  CHECK_EQ(d.calls(Call::map), 3u);
  CHECK_EQ(inner.calls(Call::map), 2u);  // the injected one never got there
  CHECK_EQ(inner.mapped_bytes(), 2 * kG);

  // Several failures in a row, with a chosen status.
  d.fail(Call::create, 1, Status::kOutOfMemory, 2);
  Handle x = 0;
  CHECK_EQ(d.create(kG, &x), Status::kOutOfMemory);
  CHECK_EQ(d.create(kG, &x), Status::kOutOfMemory);
  CHECK_EQ(x, Handle{0});
  CHECK_EQ(d.create(kG, &x), kOk);
  CHECK_EQ(d.injected(), 3u);

  // Arms are per kind; clear() disarms all of them.
  d.fail(Call::unmap, 1);
  d.fail(Call::event_synchronize, 1, Status::kNotReady);
  CHECK_EQ(d.release(x), kOk);
  d.clear();
  CHECK_EQ(d.unmap(r, 2 * kG), kOk);
  Event e = 0;
  REQUIRE_EQ(d.event_create(&e), kOk);
  CHECK_EQ(d.event_synchronize(e), kOk);
  CHECK_EQ(d.injected(), 3u);

  // Every kind can be failed.
  for (int i = 0; i < kNumCalls; ++i)
    d.fail(static_cast<Call>(i), 1, Status::kNotSupported);
  std::uintptr_t va = 0;
  CHECK_EQ(d.reserve(kG, &va), Status::kNotSupported);
  CHECK_EQ(d.address_free(r, 4 * kG), Status::kNotSupported);
  CHECK_EQ(d.create(kG, &x), Status::kNotSupported);
  CHECK_EQ(d.release(h), Status::kNotSupported);
  CHECK_EQ(d.map(r, kG, 0, h), Status::kNotSupported);
  CHECK_EQ(d.unmap(r, kG), Status::kNotSupported);
  CHECK_EQ(d.set_access(r, kG), Status::kNotSupported);
  CHECK_EQ(d.event_create(&e), Status::kNotSupported);
  CHECK_EQ(d.event_destroy(e), Status::kNotSupported);
  CHECK_EQ(d.event_record(e, 0), Status::kNotSupported);
  CHECK_EQ(d.event_query(e), Status::kNotSupported);
  CHECK_EQ(d.event_synchronize(e), Status::kNotSupported);
  CHECK_EQ(d.injected(), 3u + kNumCalls);

  // times 0 disarms.
  d.fail(Call::release, 1, Status::kDriverError, 0);
  CHECK_EQ(d.release(h), kOk);
  CHECK_EQ(d.event_destroy(e), kOk);
  CHECK_EQ(d.address_free(r, 4 * kG), kOk);
  CHECK_EQ(inner.physical_bytes(), 0u);
  CHECK_EQ(inner.reserved_bytes(), 0u);
}

TEST(faulty_failure_leaves_the_inner_driver_unchanged_over_host) {
  auto inner = NewDriver("host");
  REQUIRE(inner != nullptr);
  FaultyDriver d(*inner);
  std::uintptr_t r = 0;
  Handle h = 0;
  REQUIRE_EQ(d.reserve(kG, &r), kOk);
  REQUIRE_EQ(d.create(kG, &h), kOk);
  d.fail(Call::set_access, 1);
  REQUIRE_EQ(d.map(r, kG, 0, h), kOk);
  CHECK_EQ(d.set_access(r, kG), Status::kDriverError);
  CHECK(!inner->accessible(r, kG));
  CHECK_EQ(d.set_access(r, kG), kOk);
  CHECK(inner->accessible(r, kG));
  Ptr(r)[0] = 42;
  CHECK_EQ(d.unmap(r, kG), kOk);
  CHECK_EQ(d.release(h), kOk);
  CHECK_EQ(d.address_free(r, kG), kOk);
}

// ---- factory and names -----------------------------------------------------

TEST(make_driver_builds_each_backend) {
  CHECK(BackendNames() == (std::vector<std::string>{"host", "sim"}));
  for (const std::string& name : BackendNames()) {
    std::string error = "stale";
    std::unique_ptr<Driver> d = MakeDriver(name, TestOptions(), &error);
    REQUIRE(d != nullptr);
    CHECK_EQ(std::string(d->name()), name);
    CHECK_EQ(error, std::string());
    CHECK_EQ(d->granularity(), kG);
    CHECK_EQ(d->total_memory(), kDevice);
  }
  CHECK(MakeDriver("sim", TestOptions(), nullptr) != nullptr);
  SimOptions small;
  small.granularity = 64 << 10;
  small.device_bytes = 64 << 10;
  CHECK(MakeDriver("host", small, nullptr) != nullptr);
}

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(make_driver_errors) {
  std::string error;
  CHECK(MakeDriver("foo", TestOptions(), &error) == nullptr);
  CHECK_EQ(error, "unknown backend 'foo': expected one of host, sim");
  CHECK(MakeDriver("", TestOptions(), &error) == nullptr);
  CHECK(Contains(error, "unknown backend ''"));
  CHECK(MakeDriver("Sim", TestOptions(), &error) == nullptr);
  CHECK(MakeDriver("foo", TestOptions(), nullptr) == nullptr);

  SimOptions o = TestOptions();
  for (std::size_t bad : {std::size_t{0}, std::size_t{3000},
                          std::size_t{2048}, std::size_t{3} << 20,
                          std::size_t{12288}}) {
    o.granularity = bad;
    for (const char* backend : {"host", "sim"}) {
      error.clear();
      CHECK(MakeDriver(backend, o, &error) == nullptr);
      CHECK(Contains(error, "granularity " + std::to_string(bad)));
      CHECK(Contains(error, "power of two"));
    }
  }

  o = TestOptions();
  o.device_bytes = kG - kPage;
  CHECK(MakeDriver("sim", o, &error) == nullptr);
  CHECK(Contains(error, "device_bytes " + std::to_string(kG - kPage)));
  o.device_bytes = 0;
  CHECK(MakeDriver("host", o, &error) == nullptr);
  CHECK(Contains(error, "device_bytes 0"));
  o.device_bytes = kG;  // one granule is enough
  CHECK(MakeDriver("host", o, &error) != nullptr);
  CHECK_EQ(error, std::string());
}

TEST(host_defaults) {
  const SimOptions o = jaxlake::vmm::HostDefaults();
  CHECK_EQ(o.granularity, std::size_t{2} << 20);
  CHECK_EQ(o.device_bytes, std::size_t{4} << 30);
  jaxlake::vmm::HostDriver d;
  CHECK_EQ(d.granularity(), o.granularity);
  CHECK_EQ(d.total_memory(), o.device_bytes);
  CHECK_EQ(std::string(d.name()), "host");
}

TEST(status_and_call_names) {
  CHECK_EQ(std::string(StatusName(Status::kOk)), "ok");
  CHECK_EQ(std::string(StatusName(Status::kOutOfMemory)), "out_of_memory");
  CHECK_EQ(std::string(StatusName(static_cast<Status>(99))),
           "unknown_status");
  std::set<std::string> statuses;
  for (int i = 0; i <= static_cast<int>(Status::kDriverError); ++i)
    statuses.insert(StatusName(static_cast<Status>(i)));
  CHECK_EQ(statuses.size(),
           static_cast<std::size_t>(Status::kDriverError) + 1);

  CHECK_EQ(std::string(CallName(Call::reserve)), "reserve");
  CHECK_EQ(std::string(CallName(Call::set_access)), "set_access");
  CHECK_EQ(std::string(CallName(Call::event_synchronize)),
           "event_synchronize");
  CHECK_EQ(std::string(CallName(Call::kCount)), "unknown_call");
  std::set<std::string> calls;
  for (int i = 0; i < kNumCalls; ++i)
    calls.insert(CallName(static_cast<Call>(i)));
  CHECK_EQ(calls.size(), static_cast<std::size_t>(kNumCalls));
  CHECK_EQ(kNumCalls, 12);
}

}  // namespace

int main(int argc, char** argv) { return jaxlake::check::RunAll(argc, argv); }
