// jaxlake: what the C++ tests of the lake share: an allocation that must
// succeed, and a sim driver that runs a callback inside one of its calls.
#ifndef JAXLAKE_TESTS_CC_TEST_UTIL_H_
#define JAXLAKE_TESTS_CC_TEST_UTIL_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <utility>

#include "cc/lake/lake.h"
#include "cc/vmm/sim_driver.h"
#include "tests/cc/check.h"

namespace jaxlake::testing {

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

}  // namespace jaxlake::testing

#endif  // JAXLAKE_TESTS_CC_TEST_UTIL_H_
