// jaxlake: the conformance suite of the virtual-memory driver interface
// (cc/vmm/driver.h), what every backend must do: DriverUnderTest, the
// backend as the suite sees it, here; the tests in driver_suite.inc.
//
// A test program defines a default-constructible DriverUnderTest per
// backend, then JAXLAKE_DRIVER_BACKENDS(X, name) as one X(prefix, Subject,
// name) per backend, and includes driver_suite.inc once: each of its tests
// becomes one test a backend, named prefix_test (vmm_test.cc: sim and host;
// tests/shim/cuda_conformance_test.cc: cuda over the fake GPU).
#ifndef JAXLAKE_TESTS_CC_DRIVER_SUITE_H_
#define JAXLAKE_TESTS_CC_DRIVER_SUITE_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <ostream>

#include "cc/vmm/driver.h"
#include "tests/cc/check.h"

namespace jaxlake::vmm {
inline std::ostream& operator<<(std::ostream& os, Status s) {
  return os << StatusName(s);
}
}  // namespace jaxlake::vmm

namespace jaxlake::driver_suite {

using vmm::Call;
using vmm::CallCounts;
using vmm::Event;
using vmm::Handle;
using vmm::Status;
using vmm::Stream;

constexpr std::size_t kG = std::size_t{2} << 20;        // granularity
constexpr std::size_t kDevice = std::size_t{256} << 20;  // device bytes
constexpr std::size_t kPage = 4096;

constexpr Status kOk = Status::kOk;
constexpr Status kInvalid = Status::kInvalidValue;

inline char* Ptr(std::uintptr_t va) { return reinterpret_cast<char*>(va); }

// A backend under the suite: its driver (a device of kDevice bytes with a
// granularity of kG), the driver's books, and its streams. The suite's
// streams are small numbers (0 is the default stream); a subject maps them
// to its own. Work on a stream that is not held completes by the time
// event_record returns, as on the sim driver: a backend whose device runs
// work later (Settle) waits for it there.
class DriverUnderTest {
 public:
  // The statuses of the rules the sim and host drivers tell apart, as this
  // backend reports them (the CUDA driver says CUDA_ERROR_INVALID_VALUE).
  const Status not_mapped, already_mapped, busy;
  // Whether the addresses are memory this process may read and write.
  const bool real_bytes;

  DriverUnderTest(std::unique_ptr<vmm::Driver> driver, Status not_mapped_as,
                  Status already_mapped_as, Status busy_as, bool real)
      : not_mapped(not_mapped_as),
        already_mapped(already_mapped_as),
        busy(busy_as),
        real_bytes(real),
        driver_(std::move(driver)) {}
  virtual ~DriverUnderTest() = default;
  DriverUnderTest(const DriverUnderTest&) = delete;
  DriverUnderTest& operator=(const DriverUnderTest&) = delete;

  bool ok() const { return driver_ != nullptr; }
  vmm::Driver& driver() { return *driver_; }

  const char* name() const { return driver_->name(); }
  std::size_t granularity() const { return driver_->granularity(); }
  std::size_t total_memory() const { return driver_->total_memory(); }
  CallCounts calls() const { return driver_->calls(); }
  std::uint64_t calls(Call c) const { return driver_->calls(c); }

  Status reserve(std::size_t size, std::uintptr_t* va) {
    return driver_->reserve(size, va);
  }
  Status address_free(std::uintptr_t va, std::size_t size) {
    return driver_->address_free(va, size);
  }
  Status create(std::size_t size, Handle* handle) {
    return driver_->create(size, handle);
  }
  Status release(Handle handle) { return driver_->release(handle); }
  Status map(std::uintptr_t va, std::size_t size, std::size_t offset,
             Handle handle) {
    return driver_->map(va, size, offset, handle);
  }
  Status unmap(std::uintptr_t va, std::size_t size) {
    return driver_->unmap(va, size);
  }
  Status set_access(std::uintptr_t va, std::size_t size) {
    return driver_->set_access(va, size);
  }
  Status event_create(Event* event) { return driver_->event_create(event); }
  Status event_destroy(Event event) { return driver_->event_destroy(event); }
  Status event_record(Event event, Stream stream) {
    const Status s = driver_->event_record(event, StreamOf(stream));
    Settle(stream);
    return s;
  }
  Status event_query(Event event) { return driver_->event_query(event); }
  Status event_synchronize(Event event) {
    return driver_->event_synchronize(event);
  }

  // The books: bytes of memory alive, mapped and reserved, and the live
  // handles and events.
  virtual std::size_t physical_bytes() const = 0;
  virtual std::size_t mapped_bytes() const = 0;
  virtual std::size_t reserved_bytes() const = 0;
  virtual std::size_t live_handles() const = 0;
  virtual std::size_t live_events() const = 0;
  // True when every byte of [va, va+size) is mapped with access set.
  virtual bool accessible(std::uintptr_t va, std::size_t size) const = 0;
  // While a stream is held, events recorded on it stay incomplete; its
  // release completes them.
  virtual void hold_stream(Stream stream) = 0;
  virtual void release_stream(Stream stream) = 0;

 protected:
  // The backend's stream for the suite's stream number.
  virtual Stream StreamOf(Stream stream) { return stream; }
  // Waits until the work enqueued on the stream ran, unless it is held.
  virtual void Settle(Stream /*stream*/) {}

 private:
  std::unique_ptr<vmm::Driver> driver_;
};

}  // namespace jaxlake::driver_suite

#endif  // JAXLAKE_TESTS_CC_DRIVER_SUITE_H_
