// jaxlake: a driver that fails chosen calls (for tests).
//
// Wraps another driver and forwards every call, except those armed with
// fail(): the nth call of a kind from now on (1 = the next one), and the
// `times - 1` calls of that kind after it, return `status` without reaching
// the inner driver.
//
// It also runs hooks: hook() makes the nth call of a kind from now on run a
// function just before it is forwarded (or refused) or just after it
// returned. A hook runs once, on the calling thread, with no lock of this
// driver held, so it may call back into the lake whose driver call it
// interrupts: tests use it to change the lake's state at the exact moment
// the lake has released its own lock for a driver call.
#ifndef JAXLAKE_VMM_FAULTY_DRIVER_H_
#define JAXLAKE_VMM_FAULTY_DRIVER_H_

#include <array>
#include <functional>
#include <mutex>

#include "cc/vmm/driver.h"

namespace jaxlake::vmm {

class FaultyDriver : public Driver {
 public:
  explicit FaultyDriver(Driver& inner);

  const char* name() const override { return "faulty"; }
  std::size_t granularity() const override { return inner_.granularity(); }
  std::size_t total_memory() const override { return inner_.total_memory(); }
  Driver& inner() const { return inner_; }

  void fail(Call call, std::uint64_t nth = 1,
            Status status = Status::kDriverError, std::uint64_t times = 1);
  void clear();
  // Runs fn once around the nth call of `call` from now on (1 = the next
  // one): before it when after is false, else after it returned. Replaces
  // the kind's earlier hook of the same side; an empty fn disarms it.
  void hook(Call call, std::function<void()> fn, bool after = true,
            std::uint64_t nth = 1);
  // Calls refused so far.
  std::uint64_t injected() const;

 protected:
  JAXLAKE_VMM_BACKEND_CALLS(, override)

 private:
  // Returns the injected status for this call, or kOk to forward it.
  Status Next(Call call);
  // The hook of (call, after) due now, if any (disarmed as it is taken).
  std::function<void()> TakeHook(Call call, bool after);
  template <typename F>
  Status Run(Call call, F&& forward) {
    if (auto fn = TakeHook(call, false)) fn();
    Status s = Next(call);
    if (s == Status::kOk) s = forward();
    if (auto fn = TakeHook(call, true)) fn();
    return s;
  }
  struct Hook {
    std::uint64_t skip = 0;
    std::function<void()> fn;
  };
  struct Arm {
    std::uint64_t skip = 0;   // calls still to forward before failing
    std::uint64_t left = 0;   // failures still to inject
    Status status = Status::kOk;
  };
  Driver& inner_;
  mutable std::mutex mu_;
  std::array<Arm, kNumCalls> arms_{};
  std::array<std::array<Hook, 2>, kNumCalls> hooks_{};  // [call][after]
  std::uint64_t injected_ = 0;
};

}  // namespace jaxlake::vmm

#endif  // JAXLAKE_VMM_FAULTY_DRIVER_H_
