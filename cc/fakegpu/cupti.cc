// CUPTI as XLA's profiler (jax.profiler) drives it, by NVIDIA's names and
// signatures: the clock, result strings, callback subscribers, and the
// activity API's registration, attributes, enabling and flushing, in their
// global and per-subscriber (_v2) forms. The fake records no activity:
// kernels do not run, it calls no subscriber's callback and asks for no
// activity buffer, so a trace holds the host's events only. CUPTI's
// version call is in libs.cc; every other CUPTI entry point stays "not
// supported" (stubs.cc).
#include <time.h>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <set>

#include "cc/fakegpu/fakegpu.h"

#define LIB JAXLAKE_FAKEGPU_EXPORT
#define ENTER() JAXLAKE_FAKEGPU_ENTER()

namespace {

// CUptiResult codes (cupti_result.h).
constexpr int kSuccess = 0;
constexpr int kInvalidParameter = 1;
constexpr int kMaxLimitReached = 12;
constexpr int kNotSupported = 27;

// The live subscribers, each a handle the fake gave out. Never destroyed:
// a profiler may unsubscribe while the process exits.
struct Subscribers {
  std::mutex mu;
  std::set<const void*> live;
  std::uintptr_t next = 1;
};
Subscribers& S() {
  static Subscribers* const s = new Subscribers();
  return *s;
}

int Subscribe(void** subscriber) {
  if (subscriber == nullptr) return kInvalidParameter;
  Subscribers& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  // An opaque handle: an address no object of the fake's has.
  void* handle = reinterpret_cast<void*>(s.next++ << 4);
  s.live.insert(handle);
  *subscriber = handle;
  return kSuccess;
}

bool Live(const void* subscriber) {
  Subscribers& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.live.count(subscriber) != 0;
}

int ForSubscriber(const void* subscriber) {
  return Live(subscriber) ? kSuccess : kInvalidParameter;
}

}  // namespace

// Nanoseconds on a monotonic clock, as CUPTI's timestamps are.
LIB int cuptiGetTimestamp(std::uint64_t* timestamp) {
  ENTER();
  if (timestamp == nullptr) return kInvalidParameter;
  struct timespec ts {};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  *timestamp = static_cast<std::uint64_t>(ts.tv_sec) * 1000000000u +
               static_cast<std::uint64_t>(ts.tv_nsec);
  return kSuccess;
}

LIB int cuptiGetResultString(int result, const char** str) {
  ENTER();
  if (str == nullptr) return kInvalidParameter;
  switch (result) {
    case kSuccess: *str = "CUPTI_SUCCESS"; break;
    case kInvalidParameter: *str = "CUPTI_ERROR_INVALID_PARAMETER"; break;
    case kMaxLimitReached: *str = "CUPTI_ERROR_MAX_LIMIT_REACHED"; break;
    case kNotSupported: *str = "CUPTI_ERROR_NOT_SUPPORTED"; break;
    default: return kInvalidParameter;
  }
  return kSuccess;
}

LIB int cuptiSubscribe(void** subscriber, void* /*callback*/,
                       void* /*userdata*/) {
  ENTER();
  return Subscribe(subscriber);
}

// CUDA 12.6's form, with a parameter block the fake does not need.
LIB int cuptiSubscribe_v2(void** subscriber, void* /*callback*/,
                          void* /*userdata*/, void* /*params*/) {
  ENTER();
  return Subscribe(subscriber);
}

LIB int cuptiUnsubscribe(void* subscriber) {
  ENTER();
  Subscribers& s = S();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.live.erase(subscriber) != 0 ? kSuccess : kInvalidParameter;
}

// Callbacks are enabled and disabled as asked; the fake makes no call
// that it reports to them.
LIB int cuptiEnableCallback(std::uint32_t /*enable*/, void* subscriber,
                            int /*domain*/, std::uint32_t /*cbid*/) {
  ENTER();
  return ForSubscriber(subscriber);
}

LIB int cuptiEnableDomain(std::uint32_t /*enable*/, void* subscriber,
                          int /*domain*/) {
  ENTER();
  return ForSubscriber(subscriber);
}

// The activity API: buffers are never asked for, since no record is made.
LIB int cuptiActivityRegisterCallbacks(void* request, void* complete) {
  ENTER();
  return request == nullptr || complete == nullptr ? kInvalidParameter
                                                   : kSuccess;
}

LIB int cuptiActivityRegisterCallbacks_v2(void* subscriber, void* request,
                                          void* complete) {
  ENTER();
  if (request == nullptr || complete == nullptr) return kInvalidParameter;
  return ForSubscriber(subscriber);
}

LIB int cuptiActivitySetAttribute(int /*attribute*/, std::size_t* size,
                                  void* value) {
  ENTER();
  return size == nullptr || value == nullptr ? kInvalidParameter : kSuccess;
}

// A null subscriber sets the attribute for every subscriber.
LIB int cuptiActivitySetAttribute_v2(void* subscriber, int /*attribute*/,
                                     std::size_t* size, void* value) {
  ENTER();
  if (size == nullptr || value == nullptr) return kInvalidParameter;
  return subscriber == nullptr ? kSuccess : ForSubscriber(subscriber);
}

LIB int cuptiActivityEnable(int /*kind*/) {
  ENTER();
  return kSuccess;
}

LIB int cuptiActivityDisable(int /*kind*/) {
  ENTER();
  return kSuccess;
}

// (subscriber, kind, config): the configuration, if any, is not read.
LIB int cuptiActivityEnable_v2(void* subscriber, int /*kind*/,
                               void* /*config*/) {
  ENTER();
  return ForSubscriber(subscriber);
}

LIB int cuptiActivityDisable_v2(void* subscriber, int /*kind*/) {
  ENTER();
  return ForSubscriber(subscriber);
}

LIB int cuptiActivityConfigureUnifiedMemoryCounter(void* config,
                                                   std::uint32_t count) {
  ENTER();
  return config == nullptr && count != 0 ? kInvalidParameter : kSuccess;
}

LIB int cuptiActivityFlushAll(std::uint32_t /*flag*/) {
  ENTER();
  return kSuccess;
}

LIB int cuptiActivityGetNextRecord(std::uint8_t* buffer, std::size_t,
                                   void** record) {
  ENTER();
  if (buffer == nullptr || record == nullptr) return kInvalidParameter;
  return kMaxLimitReached;  // no (more) records
}

LIB int cuptiActivityGetNumDroppedRecords(void*, std::uint32_t,
                                          std::size_t* dropped) {
  ENTER();
  if (dropped == nullptr) return kInvalidParameter;
  *dropped = 0;
  return kSuccess;
}

LIB int cuptiFinalize() {
  ENTER();
  return kSuccess;
}
