// jaxlake: what the C++ tests of the lake share (tests/cc/lake_*_test.cc,
// snapshot_test.cc): a small sim device and option sets, an allocation that
// must succeed, filling and checking bytes, a sim driver that runs a
// callback inside one of its calls, and a lake with stream ordering to wait
// for (TwoChunks).
#ifndef JAXLAKE_TESTS_CC_TEST_UTIL_H_
#define JAXLAKE_TESTS_CC_TEST_UTIL_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "cc/lake/lake.h"
#include "cc/vmm/faulty_driver.h"
#include "cc/vmm/sim_driver.h"
#include "tests/cc/check.h"

namespace jaxlake::testing {

// The driver's names the lake's tests use (they live in this namespace).
using vmm::Call;
using vmm::FaultyDriver;
using vmm::SimDriver;
using vmm::Status;
using vmm::Stream;

constexpr std::size_t kMiB = std::size_t{1} << 20;

// Allocates `n` bytes on `stream`, checking that it succeeds; *how (when
// given) says how the lake served it.
inline std::uintptr_t Alloc(Lake& lake, std::size_t n,
                            AllocState* how = nullptr,
                            std::uint64_t stream = 0) {
  std::uintptr_t p = 0;
  AllocState state{};
  const vmm::Status s = lake.allocate(n, stream, &p, &state);
  CHECK_EQ(static_cast<int>(s), static_cast<int>(vmm::Status::kOk));
  if (how) *how = state;
  return p;
}

// A sim device of 2 MiB chunks, 256 MiB unless said otherwise.
inline vmm::SimOptions SmallDevice(std::size_t device = 256 * kMiB) {
  vmm::SimOptions o;
  o.granularity = 2 * kMiB;
  o.device_bytes = device;
  return o;
}

// The default options with a capacity.
inline LakeOptions Capped(std::size_t capacity) {
  LakeOptions o;
  o.capacity = capacity;
  return o;
}

// The small-request pool of per-stream slabs (off by default).
inline LakeOptions Slabs() {
  LakeOptions o;
  o.small_limit = kMiB;
  return o;
}

// Writes n bytes of v at p (memory of the host driver or the sim's).
inline void Fill(std::uintptr_t p, std::size_t n, unsigned char v) {
  std::memset(reinterpret_cast<void*>(p), v, n);
}
// True when the n bytes at p hold v (one byte per page, and the last).
inline bool Holds(std::uintptr_t p, std::size_t n, unsigned char v) {
  const auto* b = reinterpret_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < n; i += 4096)
    if (b[i] != v) return false;
  return b[n - 1] == v;
}

// Frees each address on stream s; true when every free succeeded.
inline bool FreeAll(Lake& lake, std::initializer_list<std::uintptr_t> ptrs,
                    vmm::Stream s = 0) {
  bool ok = true;
  for (std::uintptr_t p : ptrs) ok = lake.free(p, s) == vmm::Status::kOk && ok;
  return ok;
}

// Frees each address on stream 0, then checks the lake's invariants: ""
// when every free succeeded and they hold, else what went wrong.
inline std::string FreeAllThenCheck(
    Lake& lake, std::initializer_list<std::uintptr_t> ptrs) {
  if (!FreeAll(lake, ptrs)) return "a free was refused";
  return lake.check();
}

// n allocations of `bytes` each on stream s, each of which must succeed.
inline std::vector<std::uintptr_t> AllocEach(Lake& lake, int n,
                                             std::size_t bytes,
                                             vmm::Stream s = 0) {
  std::vector<std::uintptr_t> out;
  for (int i = 0; i < n; ++i) out.push_back(Alloc(lake, bytes, nullptr, s));
  return out;
}

// A lake of `capacity` over a FaultyDriver over the sim: the tests of what
// happens while the lake has its lock released set the FaultyDriver's hooks
// (they run inside its calls) and count in `fired` the hooks that ran.
struct HookedLake {
  explicit HookedLake(std::size_t capacity) : lake(drv, Capped(capacity)) {}
  vmm::SimDriver sim{SmallDevice()};
  vmm::FaultyDriver drv{sim};
  Lake lake;
  int fired = 0;
};

// Holds stream 1 of a sim driver, then allocates `bytes` on it and frees
// them there: a free whose last use is still in flight. Returns the
// address.
inline std::uintptr_t FreedInFlight(vmm::SimDriver& drv, Lake& lake,
                                    std::size_t bytes) {
  drv.hold_stream(1);
  const std::uintptr_t p = Alloc(lake, bytes, nullptr, 1);
  CHECK(lake.free(p, 1) == vmm::Status::kOk);
  return p;
}

// The physical bytes the lake holds (its bytes_reserved gauge).
inline std::size_t Reserved(const Lake& lake) {
  return static_cast<std::size_t>(lake.stats().bytes_reserved.current);
}

// What a sim driver still holds (physical bytes, mappings, reserved
// address space, handles, events); "" when nothing.
inline std::string Leftovers(const vmm::SimDriver& drv) {
  std::string out;
  auto add = [&](const char* what, std::size_t n) {
    if (n != 0) out += std::string(what) + " " + std::to_string(n) + " ";
  };
  add("physical_bytes", drv.physical_bytes());
  add("mapped_bytes", drv.mapped_bytes());
  add("reserved_bytes", drv.reserved_bytes());
  add("live_handles", drv.live_handles());
  add("live_events", drv.live_events());
  return out;
}

// Frees each address on stream 0 (each free must succeed), then empties
// the cache: it must release `released` bytes, leave `drv` no reserved
// address space, and the lake's invariants must hold.
template <typename Driver>
void FreeAllAndEmpty(Lake& lake, std::initializer_list<std::uintptr_t> ptrs,
                     std::size_t released, const Driver& drv) {
  CHECK(FreeAll(lake, ptrs));
  CHECK_EQ(lake.empty_cache(), released);
  CHECK_EQ(drv.reserved_bytes(), 0u);
  CHECK_EQ(lake.check(), std::string());
}

// A sim driver that runs a callback inside one of its map, reserve or
// unmap calls, while the lake has released its lock: a deterministic
// interleaving. The callback set for a kind of call (on_map, on_reserve,
// on_unmap) runs once: in the hook_at-th call of that kind (1 = the first
// the driver makes), or with hook_at 0 in the next one; before the call,
// or with `after` once the call has succeeded.
class HookDriver : public vmm::SimDriver {
 public:
  using SimDriver::SimDriver;
  int hook_at = 0;
  bool after = false;
  std::function<void()> on_map, on_reserve, on_unmap;

 protected:
  vmm::Status do_map(std::uintptr_t va, std::size_t size, std::size_t offset,
                     vmm::Handle handle) override {
    return Hooked(&maps_, &on_map, [&] {
      return SimDriver::do_map(va, size, offset, handle);
    });
  }
  vmm::Status do_reserve(std::size_t size, std::uintptr_t* va) override {
    return Hooked(&reserves_, &on_reserve,
                  [&] { return SimDriver::do_reserve(size, va); });
  }
  vmm::Status do_unmap(std::uintptr_t va, std::size_t size) override {
    return Hooked(&unmaps_, &on_unmap,
                  [&] { return SimDriver::do_unmap(va, size); });
  }

 private:
  template <typename F>
  vmm::Status Hooked(int* calls, std::function<void()>* hook, F call) {
    const bool now = ++*calls == hook_at || hook_at == 0;
    std::function<void()> f;
    if (now && *hook) f = std::exchange(*hook, nullptr);
    if (f && !after) f();
    const vmm::Status s = call();
    if (f && after && s == vmm::Status::kOk) f();
    return s;
  }
  int maps_ = 0, reserves_ = 0, unmaps_ = 0;
};

// The lake releases its lock around driver calls. The tests of what
// happens meanwhile make the interleaving deterministic: a driver hook
// (HookDriver above, or FaultyDriver's) runs, on the calling thread,
// exactly while the lake waits inside a driver call, and changes the
// lake's state meanwhile (as another thread would).
//
// Capacity two chunks; stream 1 held; X and Y (one chunk each) allocated on
// stream 1 and X freed there. A request on stream 2 must wait for stream 1.
struct TwoChunks {
  vmm::SimDriver sim{SmallDevice()};
  vmm::FaultyDriver drv{sim};
  Lake lake{drv, Capped(4 * kMiB)};
  std::uintptr_t x = 0, y = 0;
  TwoChunks() {
    sim.hold_stream(1);
    x = Alloc(lake, 2 * kMiB, nullptr, 1);
    y = Alloc(lake, 2 * kMiB, nullptr, 1);
    CHECK(lake.free(x, 1) == vmm::Status::kOk);
  }
};

}  // namespace jaxlake::testing

#endif  // JAXLAKE_TESTS_CC_TEST_UTIL_H_
