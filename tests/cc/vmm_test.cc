// jaxlake: tests of the virtual-memory drivers.
//
// DRIVER_TEST bodies form a conformance suite that runs once over the sim
// driver and once over the host driver. Host-only tests check real bytes:
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

namespace jaxlake::vmm {
std::ostream& operator<<(std::ostream& os, Status s) {
  return os << StatusName(s);
}
}  // namespace jaxlake::vmm

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

constexpr std::size_t kG = std::size_t{2} << 20;        // granularity
constexpr std::size_t kDevice = std::size_t{256} << 20;  // device bytes
constexpr std::size_t kPage = 4096;

const Status kOk = Status::kOk;
const Status kInvalid = Status::kInvalidValue;
const Status kNotMapped = Status::kNotMapped;
const Status kAlreadyMapped = Status::kAlreadyMapped;

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

bool IsHost(const SimDriver& d) { return std::strcmp(d.name(), "host") == 0; }

char* Ptr(std::uintptr_t va) { return reinterpret_cast<char*>(va); }

#define DRIVER_TEST(name)                           \
  static void name##_body(SimDriver& d);            \
  TEST(sim_##name) {                                \
    auto d = NewDriver("sim");                      \
    REQUIRE(d != nullptr);                          \
    name##_body(*d);                                \
  }                                                 \
  TEST(host_##name) {                               \
    auto d = NewDriver("host");                     \
    REQUIRE(d != nullptr);                          \
    name##_body(*d);                                \
  }                                                 \
  static void name##_body(SimDriver& d)

// ---- conformance: address space --------------------------------------------

DRIVER_TEST(reserve_and_free) {
  std::uintptr_t va = 0;
  CHECK_EQ(d.granularity(), kG);
  CHECK_EQ(d.total_memory(), kDevice);
  CHECK_EQ(d.reserve(0, &va), kInvalid);
  CHECK_EQ(d.reserve(kG / 2, &va), kInvalid);
  CHECK_EQ(d.reserve(kG + kPage, &va), kInvalid);
  CHECK_EQ(d.reserve(kG, nullptr), kInvalid);
  CHECK_EQ(d.reserved_bytes(), 0u);

  std::uintptr_t a = 0, b = 0;
  REQUIRE_EQ(d.reserve(3 * kG, &a), kOk);
  REQUIRE_EQ(d.reserve(kG, &b), kOk);
  CHECK_EQ(a % kG, 0u);
  CHECK_EQ(b % kG, 0u);
  CHECK(b >= a + 3 * kG || b + kG <= a);  // disjoint
  if (!IsHost(d)) CHECK(a >= (std::uintptr_t{1} << 44));
  CHECK_EQ(d.reserved_bytes(), 4 * kG);

  CHECK_EQ(d.address_free(a, 2 * kG), kInvalid);  // not the whole reservation
  CHECK_EQ(d.address_free(a + kG, 2 * kG), kInvalid);
  CHECK_EQ(d.address_free(a, 4 * kG), kInvalid);
  CHECK_EQ(d.address_free(a, 3 * kG), kOk);
  CHECK_EQ(d.address_free(a, 3 * kG), kInvalid);  // already freed
  CHECK_EQ(d.address_free(b, kG), kOk);
  CHECK_EQ(d.reserved_bytes(), 0u);
}

DRIVER_TEST(address_free_while_mapped_is_busy) {
  std::uintptr_t r = 0;
  Handle h = 0;
  REQUIRE_EQ(d.reserve(2 * kG, &r), kOk);
  REQUIRE_EQ(d.create(kG, &h), kOk);
  REQUIRE_EQ(d.map(r + kG, kG, 0, h), kOk);
  CHECK_EQ(d.address_free(r, 2 * kG), Status::kBusy);
  CHECK_EQ(d.reserved_bytes(), 2 * kG);
  CHECK_EQ(d.unmap(r + kG, kG), kOk);
  CHECK_EQ(d.address_free(r, 2 * kG), kOk);
  CHECK_EQ(d.release(h), kOk);
}

// ---- conformance: physical memory ------------------------------------------

DRIVER_TEST(create_and_release) {
  Handle h = 0;
  CHECK_EQ(d.create(0, &h), kInvalid);
  CHECK_EQ(d.create(kG - kPage, &h), kInvalid);
  CHECK_EQ(d.create(kG + kPage, &h), kInvalid);
  CHECK_EQ(d.create(kG, nullptr), kInvalid);
  CHECK_EQ(d.physical_bytes(), 0u);

  Handle a = 0, b = 0;
  REQUIRE_EQ(d.create(kG, &a), kOk);
  REQUIRE_EQ(d.create(3 * kG, &b), kOk);
  CHECK_NE(a, Handle{0});
  CHECK_NE(b, Handle{0});
  CHECK_NE(a, b);
  CHECK_EQ(d.physical_bytes(), 4 * kG);
  CHECK_EQ(d.live_handles(), 2u);

  CHECK_EQ(d.release(0), kInvalid);
  CHECK_EQ(d.release(a + b + 1000), kInvalid);
  CHECK_EQ(d.release(a), kOk);
  CHECK_EQ(d.release(a), kInvalid);  // twice
  CHECK_EQ(d.physical_bytes(), 3 * kG);
  CHECK_EQ(d.live_handles(), 1u);
  CHECK_EQ(d.release(b), kOk);
  CHECK_EQ(d.physical_bytes(), 0u);
  CHECK_EQ(d.live_handles(), 0u);
}

DRIVER_TEST(create_beyond_device_is_out_of_memory) {
  Handle big = 0, more = 0;
  CHECK_EQ(d.create(kDevice + kG, &big), Status::kOutOfMemory);
  REQUIRE_EQ(d.create(kDevice - kG, &big), kOk);
  CHECK_EQ(d.create(2 * kG, &more), Status::kOutOfMemory);
  REQUIRE_EQ(d.create(kG, &more), kOk);  // exactly full
  CHECK_EQ(d.physical_bytes(), kDevice);
  Handle none = 0;
  CHECK_EQ(d.create(kG, &none), Status::kOutOfMemory);
  CHECK_EQ(none, Handle{0});
  CHECK_EQ(d.release(more), kOk);
  CHECK_EQ(d.create(kG, &more), kOk);  // room again
  CHECK_EQ(d.release(more), kOk);
  CHECK_EQ(d.release(big), kOk);
  CHECK_EQ(d.physical_bytes(), 0u);
}

DRIVER_TEST(release_while_mapped_keeps_memory_until_unmap) {
  std::uintptr_t r1 = 0, r2 = 0;
  Handle h = 0;
  REQUIRE_EQ(d.reserve(2 * kG, &r1), kOk);
  REQUIRE_EQ(d.reserve(2 * kG, &r2), kOk);
  REQUIRE_EQ(d.create(2 * kG, &h), kOk);
  REQUIRE_EQ(d.map(r1, 2 * kG, 0, h), kOk);
  REQUIRE_EQ(d.map(r2, 2 * kG, 0, h), kOk);
  REQUIRE_EQ(d.set_access(r1, 2 * kG), kOk);
  if (IsHost(d)) std::memcpy(Ptr(r1 + 100), "stitch", 7);

  CHECK_EQ(d.release(h), kOk);
  CHECK_EQ(d.live_handles(), 0u);
  CHECK_EQ(d.physical_bytes(), 2 * kG);  // still mapped twice
  CHECK_EQ(d.release(h), kInvalid);
  std::uintptr_t r3 = 0;
  REQUIRE_EQ(d.reserve(2 * kG, &r3), kOk);
  CHECK_EQ(d.map(r3, 2 * kG, 0, h), kInvalid);  // released: no new mappings
  CHECK(d.accessible(r1, 2 * kG));
  if (IsHost(d)) CHECK_EQ(std::string(Ptr(r1 + 100)), "stitch");

  CHECK_EQ(d.unmap(r1, 2 * kG), kOk);
  CHECK_EQ(d.physical_bytes(), 2 * kG);  // one mapping left
  CHECK_EQ(d.unmap(r2, 2 * kG), kOk);
  CHECK_EQ(d.physical_bytes(), 0u);
  CHECK_EQ(d.address_free(r1, 2 * kG), kOk);
  CHECK_EQ(d.address_free(r2, 2 * kG), kOk);
  CHECK_EQ(d.address_free(r3, 2 * kG), kOk);
}

// ---- conformance: mappings -------------------------------------------------

DRIVER_TEST(map_rules) {
  std::uintptr_t r = 0;
  Handle h = 0;
  REQUIRE_EQ(d.reserve(4 * kG, &r), kOk);
  REQUIRE_EQ(d.create(2 * kG, &h), kOk);

  // Alignment and sizes.
  CHECK_EQ(d.map(r + kPage, kG, 0, h), kInvalid);
  CHECK_EQ(d.map(r, kG + kPage, 0, h), kInvalid);
  CHECK_EQ(d.map(r, kG, kPage, h), kInvalid);
  CHECK_EQ(d.map(r, 0, 0, h), kInvalid);
  // The handle's range.
  CHECK_EQ(d.map(r, 2 * kG, kG, h), kInvalid);
  CHECK_EQ(d.map(r, 3 * kG, 0, h), kInvalid);
  CHECK_EQ(d.map(r, kG, 2 * kG, h), kInvalid);
  CHECK_EQ(d.map(r, kG, 0, 0), kInvalid);
  CHECK_EQ(d.map(r, kG, 0, h + 1000), kInvalid);
  // The reservation.
  CHECK_EQ(d.map(r + 3 * kG, 2 * kG, 0, h), kInvalid);  // runs past its end
  std::uintptr_t gone = 0;
  REQUIRE_EQ(d.reserve(kG, &gone), kOk);
  REQUIRE_EQ(d.address_free(gone, kG), kOk);
  CHECK_EQ(d.map(gone, kG, 0, h), kInvalid);  // no longer reserved
  CHECK_EQ(d.mapped_bytes(), 0u);

  // Overlaps.
  REQUIRE_EQ(d.map(r + kG, 2 * kG, 0, h), kOk);
  CHECK_EQ(d.map(r + kG, 2 * kG, 0, h), kAlreadyMapped);  // same place
  CHECK_EQ(d.map(r, 2 * kG, 0, h), kAlreadyMapped);       // tail overlaps
  CHECK_EQ(d.map(r + 2 * kG, 2 * kG, 0, h), kAlreadyMapped);  // head overlaps
  CHECK_EQ(d.map(r + 2 * kG, kG, 0, h), kAlreadyMapped);      // inside
  // The same handle at a second place of the same reservation is fine.
  CHECK_EQ(d.map(r, kG, kG, h), kOk);
  CHECK_EQ(d.map(r + 3 * kG, kG, 0, h), kOk);
  CHECK_EQ(d.mapped_bytes(), 4 * kG);
  CHECK(!d.accessible(r, 4 * kG));  // a new mapping has no access

  // A released handle can not be mapped.
  Handle dead = 0;
  REQUIRE_EQ(d.create(kG, &dead), kOk);
  REQUIRE_EQ(d.release(dead), kOk);
  std::uintptr_t r2 = 0;
  REQUIRE_EQ(d.reserve(kG, &r2), kOk);
  CHECK_EQ(d.map(r2, kG, 0, dead), kInvalid);

  CHECK_EQ(d.unmap(r, 4 * kG), kOk);  // three whole mappings at once
  CHECK_EQ(d.mapped_bytes(), 0u);
  CHECK_EQ(d.release(h), kOk);
  CHECK_EQ(d.physical_bytes(), 0u);
  CHECK_EQ(d.address_free(r, 4 * kG), kOk);
  CHECK_EQ(d.address_free(r2, kG), kOk);
}

DRIVER_TEST(unmap_rules) {
  std::uintptr_t r = 0;
  Handle h = 0;
  REQUIRE_EQ(d.reserve(5 * kG, &r), kOk);
  REQUIRE_EQ(d.create(4 * kG, &h), kOk);
  // [r, r+2g) and [r+2g, r+3g) mapped; [r+3g, r+4g) not; [r+4g, r+5g) mapped.
  REQUIRE_EQ(d.map(r, 2 * kG, 0, h), kOk);
  REQUIRE_EQ(d.map(r + 2 * kG, kG, 2 * kG, h), kOk);
  REQUIRE_EQ(d.map(r + 4 * kG, kG, 3 * kG, h), kOk);
  REQUIRE_EQ(d.set_access(r, 3 * kG), kOk);

  CHECK_EQ(d.unmap(r, kG), kNotMapped);           // part of a mapping
  CHECK_EQ(d.unmap(r + kG, kG), kNotMapped);      // its other part
  CHECK_EQ(d.unmap(r + kG, 2 * kG), kNotMapped);  // starts inside
  CHECK_EQ(d.unmap(r, 4 * kG), kNotMapped);       // runs into a gap
  CHECK_EQ(d.unmap(r, 5 * kG), kNotMapped);       // spans the gap
  CHECK_EQ(d.unmap(r + 3 * kG, kG), kNotMapped);  // nothing there
  CHECK_EQ(d.unmap(r + 2 * kG, 2 * kG), kNotMapped);
  CHECK_EQ(d.unmap(r, 2 * kG + kPage), kInvalid);  // misaligned
  CHECK_EQ(d.unmap(r + kPage, kG), kInvalid);
  CHECK_EQ(d.unmap(r, 0), kInvalid);
  // Nothing changed.
  CHECK_EQ(d.mapped_bytes(), 4 * kG);
  CHECK(d.accessible(r, 3 * kG));

  CHECK_EQ(d.unmap(r, 3 * kG), kOk);  // two contiguous whole mappings
  CHECK_EQ(d.mapped_bytes(), kG);
  CHECK(!d.accessible(r, kG));
  CHECK_EQ(d.unmap(r, 3 * kG), kNotMapped);  // gone
  CHECK_EQ(d.unmap(r + 4 * kG, kG), kOk);
  CHECK_EQ(d.mapped_bytes(), 0u);

  // The range can be mapped again, with a new layout.
  CHECK_EQ(d.map(r + kG, kG, 0, h), kOk);
  CHECK_EQ(d.unmap(r + kG, kG), kOk);
  CHECK_EQ(d.release(h), kOk);
  CHECK_EQ(d.address_free(r, 5 * kG), kOk);
  CHECK_EQ(d.physical_bytes(), 0u);
}

DRIVER_TEST(access_rules) {
  std::uintptr_t r = 0;
  Handle h = 0;
  REQUIRE_EQ(d.reserve(5 * kG, &r), kOk);
  REQUIRE_EQ(d.create(4 * kG, &h), kOk);
  // [r, r+g) and [r+g, r+2g) mapped; [r+2g, r+3g) not; [r+3g, r+5g) mapped.
  REQUIRE_EQ(d.map(r, kG, 0, h), kOk);
  REQUIRE_EQ(d.map(r + kG, kG, kG, h), kOk);
  REQUIRE_EQ(d.map(r + 3 * kG, 2 * kG, 2 * kG, h), kOk);

  CHECK(!d.accessible(r, kG));  // before set_access
  CHECK(!d.accessible(r, 1));
  CHECK_EQ(d.set_access(r + 2 * kG, kG), kNotMapped);
  CHECK_EQ(d.set_access(r, 3 * kG), kNotMapped);  // ends in the gap
  CHECK_EQ(d.set_access(r + kG, 3 * kG), kNotMapped);  // spans the gap
  CHECK_EQ(d.set_access(r, kG + kPage), kInvalid);
  CHECK_EQ(d.set_access(r + kPage, kG), kInvalid);
  CHECK_EQ(d.set_access(r, 0), kInvalid);
  CHECK(!d.accessible(r, kG));

  CHECK_EQ(d.set_access(r, 2 * kG), kOk);  // one call, two mappings
  CHECK(d.accessible(r, 2 * kG));
  CHECK(d.accessible(r + 100, 10));
  CHECK(!d.accessible(r, 3 * kG));
  CHECK(!d.accessible(r, 0));

  // Part of one mapping.
  CHECK_EQ(d.set_access(r + 3 * kG, kG), kOk);
  CHECK(d.accessible(r + 3 * kG, kG));
  CHECK(!d.accessible(r + 3 * kG, 2 * kG));
  CHECK_EQ(d.set_access(r + 3 * kG, 2 * kG), kOk);
  CHECK(d.accessible(r + 3 * kG, 2 * kG));

  // Unmapping drops access; a new mapping starts without it.
  CHECK_EQ(d.unmap(r, kG), kOk);
  CHECK(!d.accessible(r, kG));
  CHECK(d.accessible(r + kG, kG));
  CHECK_EQ(d.map(r, kG, 0, h), kOk);
  CHECK(!d.accessible(r, kG));
  CHECK(!d.accessible(r, 2 * kG));
  CHECK_EQ(d.set_access(r, kG), kOk);
  CHECK(d.accessible(r, 2 * kG));

  CHECK_EQ(d.unmap(r, 2 * kG), kOk);
  CHECK_EQ(d.unmap(r + 3 * kG, 2 * kG), kOk);
  CHECK(!d.accessible(r + 3 * kG, kG));
  CHECK_EQ(d.release(h), kOk);
  CHECK_EQ(d.address_free(r, 5 * kG), kOk);
}

// Random map/unmap/set_access on one reservation, checked against a model
// that tracks each granule.
DRIVER_TEST(random_ops_match_a_granule_model) {
  constexpr int kN = 16;  // granules in the reservation and the handle
  std::uintptr_t r = 0;
  Handle h = 0;
  REQUIRE_EQ(d.reserve(kN * kG, &r), kOk);
  REQUIRE_EQ(d.create(kN * kG, &h), kOk);
  int owner[kN];  // start granule of the mapping holding each granule, or -1
  int length[kN];  // length of the mapping starting at a granule
  bool access[kN];
  for (int i = 0; i < kN; ++i) {
    owner[i] = -1;
    length[i] = 0;
    access[i] = false;
  }
  std::mt19937 rng(12345);
  for (int step = 0; step < 1500; ++step) {
    const int start = static_cast<int>(rng() % kN);
    const int len = 1 + static_cast<int>(rng() % 4);
    const int end = start + len;
    const std::uintptr_t va = r + start * kG;
    const std::size_t size = len * kG;
    const int op = static_cast<int>(rng() % 4);
    if (op == 0) {  // map
      Status want = kOk;
      if (end > kN) {
        want = kInvalid;
      } else {
        for (int i = start; i < end; ++i)
          if (owner[i] >= 0) want = kAlreadyMapped;
      }
      const Status got = d.map(va, size, start * kG, h);
      REQUIRE_EQ(got, want);
      if (got == kOk) {
        length[start] = len;
        for (int i = start; i < end; ++i) owner[i] = start;
      }
    } else if (op == 1) {  // unmap
      Status want = kNotMapped;
      if (end <= kN && owner[start] == start) {
        int at = start;
        while (at < end && owner[at] == at) at += length[at];
        if (at == end) want = kOk;
      }
      if (end > kN) want = kNotMapped;
      const Status got = d.unmap(va, size);
      REQUIRE_EQ(got, want);
      if (got == kOk) {
        for (int i = start; i < end; ++i) {
          owner[i] = -1;
          length[i] = 0;
          access[i] = false;
        }
      }
    } else if (op == 2) {  // set_access
      Status want = end > kN ? kNotMapped : kOk;
      for (int i = start; i < end && i < kN; ++i)
        if (owner[i] < 0) want = kNotMapped;
      const Status got = d.set_access(va, size);
      REQUIRE_EQ(got, want);
      if (got == kOk)
        for (int i = start; i < end; ++i) access[i] = true;
    }
    // Check the whole state after every step.
    std::size_t mapped = 0;
    for (int i = 0; i < kN; ++i) mapped += owner[i] >= 0 ? kG : 0;
    REQUIRE_EQ(d.mapped_bytes(), mapped);
    for (int i = 0; i < kN; ++i) {
      for (int j = i + 1; j <= kN; ++j) {
        bool want = true;
        for (int k = i; k < j; ++k) want = want && access[k];
        REQUIRE_EQ(d.accessible(r + i * kG, (j - i) * kG), want);
      }
    }
  }
  for (int i = 0; i < kN; ++i) {
    if (owner[i] == i) CHECK_EQ(d.unmap(r + i * kG, length[i] * kG), kOk);
  }
  CHECK_EQ(d.mapped_bytes(), 0u);
  CHECK_EQ(d.release(h), kOk);
  CHECK_EQ(d.address_free(r, kN * kG), kOk);
}

// ---- conformance: counters -------------------------------------------------

DRIVER_TEST(calls_are_counted_by_kind) {
  for (std::uint64_t c : d.calls()) CHECK_EQ(c, 0u);
  std::uintptr_t r = 0;
  Handle h = 0;
  Event e = 0;
  CHECK_EQ(d.reserve(kG, &r), kOk);
  CHECK_EQ(d.reserve(1, &r), kInvalid);  // failures count too
  CHECK_EQ(d.create(kG, &h), kOk);
  CHECK_EQ(d.map(r, kG, 0, h), kOk);
  CHECK_EQ(d.map(r, kG, 0, h), kAlreadyMapped);
  CHECK_EQ(d.set_access(r, kG), kOk);
  CHECK_EQ(d.event_create(&e), kOk);
  CHECK_EQ(d.event_record(e, 0), kOk);
  CHECK_EQ(d.event_query(e), kOk);
  CHECK_EQ(d.event_synchronize(e), kOk);
  CHECK_EQ(d.event_destroy(e), kOk);
  CHECK_EQ(d.unmap(r, kG), kOk);
  CHECK_EQ(d.release(h), kOk);
  CHECK_EQ(d.address_free(r, kG), kOk);

  const CallCounts calls = d.calls();
  CHECK_EQ(calls[static_cast<int>(Call::reserve)], 2u);
  CHECK_EQ(d.calls(Call::reserve), 2u);
  CHECK_EQ(d.calls(Call::map), 2u);
  for (Call c : {Call::address_free, Call::create, Call::release, Call::unmap,
                 Call::set_access, Call::event_create, Call::event_destroy,
                 Call::event_record, Call::event_query,
                 Call::event_synchronize}) {
    CHECK_EQ(d.calls(c), 1u);
    CHECK_EQ(calls[static_cast<int>(c)], 1u);
  }
}

// ---- conformance: streams and events ---------------------------------------

DRIVER_TEST(events_basic) {
  Event e = 0, f = 0;
  CHECK_EQ(d.event_create(nullptr), kInvalid);
  REQUIRE_EQ(d.event_create(&e), kOk);
  REQUIRE_EQ(d.event_create(&f), kOk);
  CHECK_NE(e, Event{0});
  CHECK_NE(e, f);
  CHECK_EQ(d.live_events(), 2u);

  CHECK_EQ(d.event_query(e), kOk);  // never recorded: complete
  CHECK_EQ(d.event_synchronize(e), kOk);
  CHECK_EQ(d.event_record(e, 0), kOk);  // stream 0 is a stream
  CHECK_EQ(d.event_query(e), kOk);
  CHECK_EQ(d.event_record(f, 12345), kOk);
  CHECK_EQ(d.event_synchronize(f), kOk);

  const Event unknown = e + f + 1000;
  CHECK_EQ(d.event_query(unknown), kInvalid);
  CHECK_EQ(d.event_record(unknown, 0), kInvalid);
  CHECK_EQ(d.event_synchronize(unknown), kInvalid);
  CHECK_EQ(d.event_destroy(unknown), kInvalid);
  CHECK_EQ(d.event_query(0), kInvalid);

  CHECK_EQ(d.event_destroy(e), kOk);
  CHECK_EQ(d.event_destroy(e), kInvalid);
  CHECK_EQ(d.event_query(e), kInvalid);
  CHECK_EQ(d.live_events(), 1u);
  CHECK_EQ(d.event_destroy(f), kOk);
  CHECK_EQ(d.live_events(), 0u);
}

DRIVER_TEST(held_stream_keeps_events_pending) {
  Event a = 0, b = 0, other = 0;
  REQUIRE_EQ(d.event_create(&a), kOk);
  REQUIRE_EQ(d.event_create(&b), kOk);
  REQUIRE_EQ(d.event_create(&other), kOk);

  d.hold_stream(7);
  CHECK_EQ(d.event_record(a, 7), kOk);
  CHECK_EQ(d.event_query(a), Status::kNotReady);
  CHECK_EQ(d.event_record(other, 0), kOk);  // other streams run on
  CHECK_EQ(d.event_query(other), kOk);
  CHECK_EQ(d.event_record(b, 7), kOk);
  CHECK_EQ(d.event_query(b), Status::kNotReady);
  CHECK_EQ(d.event_query(a), Status::kNotReady);

  d.release_stream(7);
  CHECK_EQ(d.event_query(a), kOk);
  CHECK_EQ(d.event_query(b), kOk);
  CHECK_EQ(d.event_record(a, 7), kOk);  // released: completes at once
  CHECK_EQ(d.event_query(a), kOk);

  // A completed event recorded again on a held stream is pending again.
  d.hold_stream(7);
  CHECK_EQ(d.event_record(b, 7), kOk);
  CHECK_EQ(d.event_query(b), Status::kNotReady);
  CHECK_EQ(d.event_query(a), kOk);  // recorded before the hold
  d.release_stream(7);
  CHECK_EQ(d.event_query(b), kOk);

  d.hold_stream(0);  // the default stream can be held too
  CHECK_EQ(d.event_record(other, 0), kOk);
  CHECK_EQ(d.event_query(other), Status::kNotReady);
  d.release_stream(0);
  CHECK_EQ(d.event_query(other), kOk);

  CHECK_EQ(d.event_destroy(a), kOk);
  CHECK_EQ(d.event_destroy(b), kOk);
  CHECK_EQ(d.event_destroy(other), kOk);
}

DRIVER_TEST(event_synchronize_is_woken_by_release_stream) {
  Event e = 0;
  REQUIRE_EQ(d.event_create(&e), kOk);
  d.hold_stream(3);
  REQUIRE_EQ(d.event_record(e, 3), kOk);

  std::atomic<int> done{0};
  std::atomic<int> status_ok{0};
  std::vector<std::thread> waiters;
  for (int i = 0; i < 2; ++i) {
    waiters.emplace_back([&] {
      if (d.event_synchronize(e) == kOk) status_ok.fetch_add(1);
      done.fetch_add(1);
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  CHECK_EQ(done.load(), 0);  // still blocked on the held stream
  d.release_stream(3);
  // A waiter that is never woken would hang the suite: give up loudly.
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (done.load() < 2 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (done.load() < 2) {
    std::fprintf(stderr, "%s:%d: event_synchronize was not woken\n",
                 __FILE__, __LINE__);
    std::_Exit(1);
  }
  for (std::thread& t : waiters) t.join();
  CHECK_EQ(done.load(), 2);
  CHECK_EQ(status_ok.load(), 2);
  CHECK_EQ(d.event_destroy(e), kOk);
}

// ---- conformance: threads --------------------------------------------------

DRIVER_TEST(concurrent_calls_keep_the_books) {
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  const bool host = IsHost(d);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 40; ++i) {
        std::uintptr_t r = 0;
        Handle h = 0;
        Event e = 0;
        bool ok = d.reserve(2 * kG, &r) == kOk && d.create(kG, &h) == kOk &&
                  d.map(r + kG, kG, 0, h) == kOk &&
                  d.set_access(r + kG, kG) == kOk &&
                  d.accessible(r + kG, kG);
        if (ok && host) {
          Ptr(r + kG)[t * kPage] = static_cast<char>(i);
          ok = Ptr(r + kG)[t * kPage] == static_cast<char>(i);
        }
        ok = ok && d.event_create(&e) == kOk &&
             d.event_record(e, static_cast<std::uint64_t>(t)) == kOk &&
             d.event_synchronize(e) == kOk && d.event_destroy(e) == kOk &&
             d.release(h) == kOk && d.unmap(r + kG, kG) == kOk &&
             d.address_free(r, 2 * kG) == kOk;
        if (!ok) failures.fetch_add(1);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  CHECK_EQ(failures.load(), 0);
  CHECK_EQ(d.physical_bytes(), 0u);
  CHECK_EQ(d.mapped_bytes(), 0u);
  CHECK_EQ(d.reserved_bytes(), 0u);
  CHECK_EQ(d.live_handles(), 0u);
  CHECK_EQ(d.live_events(), 0u);
  CHECK_EQ(d.calls(Call::map), 160u);
}

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
