// jaxlake: a driver that fails chosen calls.
//
// fail(call, nth, status, times): the next nth-1 calls of that kind are
// forwarded, then `times` calls return `status` without reaching the inner
// driver, then calls are forwarded again. Arming a kind replaces its earlier
// arm; nth 0 counts as 1; times 0 or status kOk disarms the kind. clear()
// disarms every kind and keeps the injected() count (hooks stay armed).
#include "cc/vmm/faulty_driver.h"

#include <utility>

namespace jaxlake::vmm {

FaultyDriver::FaultyDriver(Driver& inner) : inner_(inner) {}

void FaultyDriver::fail(Call call, std::uint64_t nth, Status status,
                        std::uint64_t times) {
  const int i = static_cast<int>(call);
  if (i < 0 || i >= kNumCalls) return;
  std::lock_guard<std::mutex> lock(mu_);
  Arm& arm = arms_[i];
  if (times == 0 || status == Status::kOk) {
    arm = Arm{};
    return;
  }
  arm.skip = nth == 0 ? 0 : nth - 1;
  arm.left = times;
  arm.status = status;
}

void FaultyDriver::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  arms_.fill(Arm{});
}

void FaultyDriver::hook(Call call, std::function<void()> fn, bool after,
                        std::uint64_t nth) {
  const int i = static_cast<int>(call);
  if (i < 0 || i >= kNumCalls) return;
  std::lock_guard<std::mutex> lock(mu_);
  Hook& h = hooks_[i][after ? 1 : 0];
  h.skip = nth == 0 ? 0 : nth - 1;
  h.fn = std::move(fn);
}

std::function<void()> FaultyDriver::TakeHook(Call call, bool after) {
  std::lock_guard<std::mutex> lock(mu_);
  Hook& h = hooks_[static_cast<int>(call)][after ? 1 : 0];
  if (!h.fn) return nullptr;
  if (h.skip > 0) {
    --h.skip;
    return nullptr;
  }
  std::function<void()> fn = std::move(h.fn);
  h.fn = nullptr;
  return fn;
}

std::uint64_t FaultyDriver::injected() const {
  std::lock_guard<std::mutex> lock(mu_);
  return injected_;
}

Status FaultyDriver::Next(Call call) {
  std::lock_guard<std::mutex> lock(mu_);
  Arm& arm = arms_[static_cast<int>(call)];
  if (arm.left == 0) return Status::kOk;
  if (arm.skip > 0) {
    --arm.skip;
    return Status::kOk;
  }
  --arm.left;
  ++injected_;
  return arm.status;
}

// The lock is dropped before forwarding, so a blocking inner call
// (event_synchronize) does not stall the other kinds.
Status FaultyDriver::do_reserve(std::size_t size, std::uintptr_t* va) {
  return Run(Call::reserve, [&] { return inner_.reserve(size, va); });
}

Status FaultyDriver::do_address_free(std::uintptr_t va, std::size_t size) {
  return Run(Call::address_free, [&] { return inner_.address_free(va, size); });
}

Status FaultyDriver::do_create(std::size_t size, Handle* handle) {
  return Run(Call::create, [&] { return inner_.create(size, handle); });
}

Status FaultyDriver::do_release(Handle handle) {
  return Run(Call::release, [&] { return inner_.release(handle); });
}

Status FaultyDriver::do_map(std::uintptr_t va, std::size_t size,
                            std::size_t offset, Handle handle) {
  return Run(Call::map, [&] { return inner_.map(va, size, offset, handle); });
}

Status FaultyDriver::do_unmap(std::uintptr_t va, std::size_t size) {
  return Run(Call::unmap, [&] { return inner_.unmap(va, size); });
}

Status FaultyDriver::do_set_access(std::uintptr_t va, std::size_t size) {
  return Run(Call::set_access, [&] { return inner_.set_access(va, size); });
}

Status FaultyDriver::do_event_create(Event* event) {
  return Run(Call::event_create, [&] { return inner_.event_create(event); });
}

Status FaultyDriver::do_event_destroy(Event event) {
  return Run(Call::event_destroy, [&] { return inner_.event_destroy(event); });
}

Status FaultyDriver::do_event_record(Event event, Stream stream) {
  return Run(Call::event_record, [&] { return inner_.event_record(event, stream); });
}

Status FaultyDriver::do_event_query(Event event) {
  return Run(Call::event_query, [&] { return inner_.event_query(event); });
}

Status FaultyDriver::do_event_synchronize(Event event) {
  return Run(Call::event_synchronize, [&] { return inner_.event_synchronize(event); });
}

}  // namespace jaxlake::vmm
