// The fake GPU's CUPTI, by NVIDIA's names and signatures (cupti_result.h,
// cupti_callbacks.h, cupti_activity.h), as far as XLA's profiler uses it:
// the version, status strings, timestamps, one callback subscriber and the
// domains and callbacks enabled for it, the activity kinds enabled and the
// buffer callbacks, flushes and record iteration.
//
// The fake records no activity and makes no callbacks: kernels do not run,
// and its entry points do not report themselves to a subscriber. So a
// profiled program runs and its trace holds the host's events only: no
// record is ever written, CUPTI never asks the program for a buffer (the
// buffer-request callback is not called), a flush completes nothing, and
// no record is dropped.
#include <cstdint>
#include <cstring>
#include <ctime>
#include <map>
#include <mutex>
#include <set>
#include <utility>
#include <vector>

#include "cc/fakegpu/fakegpu.h"

#define LIB JAXLAKE_FAKEGPU_EXPORT
#define ENTER() JAXLAKE_FAKEGPU_ENTER()

namespace {

// CUptiResult (cupti_result.h).
constexpr int kSuccess = 0, kInvalidParameter = 1, kInvalidKind = 21,
              kMaxLimitReached = 12, kMultipleSubscribers = 39;

// Activity kinds are 1 to CUPTI_ACTIVITY_KIND_COUNT - 1; callback domains 1
// to CUPTI_CB_DOMAIN_SIZE - 1. The bounds here are those of CUDA 13's
// headers, above CUDA 12's.
constexpr int kActivityKinds = 64, kCallbackDomains = 9;

struct Cupti {
  std::mutex mu;
  // The one subscriber (CUPTI allows one at a time): its handle, the
  // callback and user data it gave, and what is enabled for it (a domain's
  // callback ids; -1 for every id of the domain).
  void* subscriber = nullptr;
  void* callback = nullptr;
  void* userdata = nullptr;
  std::set<std::pair<int, long>> enabled;
  std::set<int> kinds;  // activity kinds enabled
  void* request = nullptr;
  void* complete = nullptr;
  std::map<int, std::uint64_t> attributes;
  int thread_id_type = 0;  // CUPTI_ACTIVITY_THREAD_ID_TYPE_DEFAULT
  std::map<int, std::vector<std::uint64_t>> external_ids;  // by kind
};
Cupti& State() {
  static Cupti* c = new Cupti;
  return *c;
}

bool LiveSubscriber(const Cupti& c, const void* subscriber) {
  return subscriber != nullptr && subscriber == c.subscriber;
}

// The subscriber-scoped (`_v2`) calls: the subscriber must be the live one,
// or null for the process-wide setting.
bool Subscribed(const void* subscriber) {
  Cupti& c = State();
  std::lock_guard<std::mutex> lock(c.mu);
  return subscriber == nullptr || LiveSubscriber(c, subscriber);
}

int Subscribe(void** subscriber, void* callback, void* userdata) {
  if (subscriber == nullptr) return kInvalidParameter;
  Cupti& c = State();
  std::lock_guard<std::mutex> lock(c.mu);
  if (c.subscriber != nullptr) return kMultipleSubscribers;
  static char handle;
  c.subscriber = &handle;
  c.callback = callback;
  c.userdata = userdata;
  c.enabled.clear();
  *subscriber = c.subscriber;
  return kSuccess;
}

int EnableCallbacks(std::uint32_t enable, void* subscriber, int domain,
                    long cbid) {
  Cupti& c = State();
  std::lock_guard<std::mutex> lock(c.mu);
  if (!LiveSubscriber(c, subscriber)) return kInvalidParameter;
  if (domain != -1 && (domain <= 0 || domain >= kCallbackDomains))
    return kInvalidParameter;
  if (cbid < -1) return kInvalidParameter;
  const std::pair<int, long> key{domain, cbid};
  if (enable != 0) {
    c.enabled.insert(key);
  } else if (domain == -1) {
    c.enabled.clear();
  } else {
    c.enabled.erase(key);
  }
  return kSuccess;
}

int EnableKind(int kind, bool enable) {
  if (kind <= 0 || kind >= kActivityKinds) return kInvalidKind;
  Cupti& c = State();
  std::lock_guard<std::mutex> lock(c.mu);
  if (enable) {
    c.kinds.insert(kind);
  } else {
    c.kinds.erase(kind);
  }
  return kSuccess;
}

}  // namespace

LIB int cuptiGetVersion(std::uint32_t* v) {
  ENTER();
  if (v == nullptr) return kInvalidParameter;
  *v = 28;  // CUPTI_API_VERSION of CUDA 12.9
  return kSuccess;
}

// Nanoseconds of the realtime clock (CUPTI's timestamps are nanoseconds; the
// fake's devices keep the host's time).
namespace {
int Timestamp(std::uint64_t* timestamp) {
  if (timestamp == nullptr) return kInvalidParameter;
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  *timestamp = static_cast<std::uint64_t>(ts.tv_sec) * 1000000000u +
               static_cast<std::uint64_t>(ts.tv_nsec);
  return kSuccess;
}
}  // namespace

LIB int cuptiGetTimestamp(std::uint64_t* timestamp) {
  ENTER();
  return Timestamp(timestamp);
}
LIB int cuptiGetTimestamp_v2(void* subscriber, std::uint64_t* timestamp) {
  ENTER();
  if (!Subscribed(subscriber)) return kInvalidParameter;
  return Timestamp(timestamp);
}

// ---- callbacks --------------------------------------------------------------

LIB int cuptiSubscribe(void** subscriber, void* callback, void* userdata) {
  ENTER();
  return Subscribe(subscriber, callback, userdata);
}

// CUPTI 12.9's form, with CUpti_SubscriberParams (a structSize and a name
// for the error message of a second subscriber), which may be null.
LIB int cuptiSubscribe_v2(void** subscriber, void* callback, void* userdata,
                          void*) {
  ENTER();
  return Subscribe(subscriber, callback, userdata);
}

LIB int cuptiUnsubscribe(void* subscriber) {
  ENTER();
  Cupti& c = State();
  std::lock_guard<std::mutex> lock(c.mu);
  if (!LiveSubscriber(c, subscriber)) return kInvalidParameter;
  c.subscriber = c.callback = c.userdata = nullptr;
  c.enabled.clear();
  return kSuccess;
}

LIB int cuptiEnableCallback(std::uint32_t enable, void* subscriber,
                            int domain, std::uint32_t cbid) {
  ENTER();
  return EnableCallbacks(enable, subscriber, domain, static_cast<long>(cbid));
}

LIB int cuptiEnableDomain(std::uint32_t enable, void* subscriber,
                          int domain) {
  ENTER();
  return EnableCallbacks(enable, subscriber, domain, -1);
}

LIB int cuptiEnableAllDomains(std::uint32_t enable, void* subscriber) {
  ENTER();
  return EnableCallbacks(enable, subscriber, -1, -1);
}

// Whether a callback is enabled: by its own id, its domain or every domain.
LIB int cuptiGetCallbackState(std::uint32_t* enable, void* subscriber,
                              int domain, std::uint32_t cbid) {
  ENTER();
  if (enable == nullptr) return kInvalidParameter;
  Cupti& c = State();
  std::lock_guard<std::mutex> lock(c.mu);
  if (!LiveSubscriber(c, subscriber) || domain <= 0 ||
      domain >= kCallbackDomains)
    return kInvalidParameter;
  *enable = c.enabled.count({domain, static_cast<long>(cbid)}) +
                    c.enabled.count({domain, -1}) +
                    c.enabled.count({-1, -1}) >
                0
                ? 1
                : 0;
  return kSuccess;
}

// ---- activities -------------------------------------------------------------

LIB int cuptiActivityEnable(int kind) {
  ENTER();
  return EnableKind(kind, true);
}
LIB int cuptiActivityDisable(int kind) {
  ENTER();
  return EnableKind(kind, false);
}
LIB int cuptiActivityEnableContext(void* context, int kind) {
  ENTER();
  if (context == nullptr) return 3;  // CUPTI_ERROR_INVALID_CONTEXT
  return EnableKind(kind, true);
}
LIB int cuptiActivityDisableContext(void* context, int kind) {
  ENTER();
  if (context == nullptr) return 3;
  return EnableKind(kind, false);
}

namespace {
int RegisterCallbacks(void* request, void* complete) {
  if (request == nullptr || complete == nullptr) return kInvalidParameter;
  Cupti& c = State();
  std::lock_guard<std::mutex> lock(c.mu);
  c.request = request;
  c.complete = complete;
  return kSuccess;
}
}  // namespace

LIB int cuptiActivityRegisterCallbacks(void* request, void* complete) {
  ENTER();
  return RegisterCallbacks(request, complete);
}
LIB int cuptiActivityRegisterCallbacks_v2(void* subscriber, void* request,
                                          void* complete) {
  ENTER();
  if (!Subscribed(subscriber)) return kInvalidParameter;
  return RegisterCallbacks(request, complete);
}

// (subscriber, kind, CUpti_ActivityConfig: may be null)
LIB int cuptiActivityEnable_v2(void* subscriber, int kind, void*) {
  ENTER();
  if (!Subscribed(subscriber)) return kInvalidParameter;
  return EnableKind(kind, true);
}
LIB int cuptiActivityDisable_v2(void* subscriber, int kind, void*) {
  ENTER();
  if (!Subscribed(subscriber)) return kInvalidParameter;
  return EnableKind(kind, false);
}

// No buffer was ever requested, so none is completed.
LIB int cuptiActivityFlushAll(std::uint32_t) {
  ENTER();
  return kSuccess;
}
LIB int cuptiActivityFlush(void*, std::uint32_t, std::uint32_t) {
  ENTER();
  return kSuccess;
}

// A buffer holds no record the fake wrote: the end is reached at once.
LIB int cuptiActivityGetNextRecord(std::uint8_t* buffer, std::size_t,
                                   void** record) {
  ENTER();
  if (buffer == nullptr || record == nullptr) return kInvalidParameter;
  return kMaxLimitReached;
}

LIB int cuptiActivityGetNumDroppedRecords(void*, std::uint32_t,
                                          std::size_t* dropped) {
  ENTER();
  if (dropped == nullptr) return kInvalidParameter;
  *dropped = 0;
  return kSuccess;
}

// The activity attributes (buffer sizes, pool limits, flags): each kept as
// set, of up to 8 bytes; one never set reads as 0.
namespace {
int SetAttribute(int attr, std::size_t* size, const void* value) {
  if (size == nullptr || value == nullptr || *size == 0 || *size > 8)
    return kInvalidParameter;
  std::uint64_t v = 0;
  std::memcpy(&v, value, *size);
  Cupti& c = State();
  std::lock_guard<std::mutex> lock(c.mu);
  c.attributes[attr] = v;
  return kSuccess;
}

int GetAttribute(int attr, std::size_t* size, void* value) {
  if (size == nullptr || value == nullptr || *size == 0 || *size > 8)
    return kInvalidParameter;
  Cupti& c = State();
  std::lock_guard<std::mutex> lock(c.mu);
  auto it = c.attributes.find(attr);
  const std::uint64_t v = it == c.attributes.end() ? 0 : it->second;
  std::memcpy(value, &v, *size);
  return kSuccess;
}

}  // namespace

LIB int cuptiActivitySetAttribute(int attr, std::size_t* size,
                                  const void* value) {
  ENTER();
  return SetAttribute(attr, size, value);
}
LIB int cuptiActivityGetAttribute(int attr, std::size_t* size, void* value) {
  ENTER();
  return GetAttribute(attr, size, value);
}
LIB int cuptiActivitySetAttribute_v2(void* subscriber, int attr,
                                     std::size_t* size, const void* value) {
  ENTER();
  if (!Subscribed(subscriber)) return kInvalidParameter;
  return SetAttribute(attr, size, value);
}

// The thread ids activity records carry (CUpti_ActivityThreadIdType:
// DEFAULT 0, SYSTEM 1), which CUDA 13's XLA sets to the system's.
LIB int cuptiSetThreadIdType(int type) {
  ENTER();
  if (type != 0 && type != 1) return kInvalidParameter;
  Cupti& c = State();
  std::lock_guard<std::mutex> lock(c.mu);
  c.thread_id_type = type;
  return kSuccess;
}

LIB int cuptiGetThreadIdType(int* type) {
  ENTER();
  if (type == nullptr) return kInvalidParameter;
  Cupti& c = State();
  std::lock_guard<std::mutex> lock(c.mu);
  *type = c.thread_id_type;
  return kSuccess;
}

// Latency timestamps, hardware tracing: flags of records the fake never
// writes.
LIB int cuptiActivityEnableLatencyTimestamps(std::uint8_t) {
  ENTER();
  return kSuccess;
}

// External correlation ids: a stack a kind (CUpti_ExternalCorrelationKind,
// 0 invalid).
LIB int cuptiActivityPushExternalCorrelationId(int kind, std::uint64_t id) {
  ENTER();
  if (kind <= 0) return kInvalidParameter;
  Cupti& c = State();
  std::lock_guard<std::mutex> lock(c.mu);
  c.external_ids[kind].push_back(id);
  return kSuccess;
}

LIB int cuptiActivityPopExternalCorrelationId(int kind, std::uint64_t* last) {
  ENTER();
  if (kind <= 0) return kInvalidParameter;
  Cupti& c = State();
  std::lock_guard<std::mutex> lock(c.mu);
  auto& ids = c.external_ids[kind];
  if (ids.empty()) return 18;  // CUPTI_ERROR_QUEUE_EMPTY
  if (last != nullptr) *last = ids.back();
  ids.pop_back();
  return kSuccess;
}

// Detaches CUPTI: the subscriber, callbacks and activity kinds are
// forgotten.
LIB int cuptiFinalize() {
  ENTER();
  Cupti& c = State();
  std::lock_guard<std::mutex> lock(c.mu);
  c.subscriber = c.callback = c.userdata = nullptr;
  c.request = c.complete = nullptr;
  c.enabled.clear();
  c.kinds.clear();
  return kSuccess;
}

// ---- CUPTI's status strings -------------------------------------------------
//
// A caller that reports an error asks for its name: these set *str to a
// static string naming the status (cupti_result.h).

namespace {
const char* CuptiResultName(int result) {
  switch (result) {
    case 0: return "CUPTI_SUCCESS";
    case 1: return "CUPTI_ERROR_INVALID_PARAMETER";
    case 2: return "CUPTI_ERROR_INVALID_DEVICE";
    case 3: return "CUPTI_ERROR_INVALID_CONTEXT";
    case 7: return "CUPTI_ERROR_INVALID_OPERATION";
    case 8: return "CUPTI_ERROR_OUT_OF_MEMORY";
    case 11: return "CUPTI_ERROR_API_NOT_IMPLEMENTED";
    case 12: return "CUPTI_ERROR_MAX_LIMIT_REACHED";
    case 15: return "CUPTI_ERROR_NOT_INITIALIZED";
    case 18: return "CUPTI_ERROR_QUEUE_EMPTY";
    case 21: return "CUPTI_ERROR_INVALID_KIND";
    case 23: return "CUPTI_ERROR_DISABLED";
    case 27: return "CUPTI_ERROR_NOT_SUPPORTED";
    case 35: return "CUPTI_ERROR_INSUFFICIENT_PRIVILEGES";
    case 39: return "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED";
    case 999: return "CUPTI_ERROR_UNKNOWN";
    default: return nullptr;
  }
}
}  // namespace

LIB int cuptiGetResultString(int result, const char** str) {
  ENTER();
  if (str == nullptr) return 1;  // CUPTI_ERROR_INVALID_PARAMETER
  const char* name = CuptiResultName(result);
  *str = name != nullptr ? name : "CUPTI_ERROR_UNKNOWN";
  return name != nullptr ? 0 : 1;
}

LIB int cuptiGetErrorMessage(int result, const char** str) {
  ENTER();
  if (str == nullptr) return 1;
  const char* name = CuptiResultName(result);
  if (name == nullptr) {
    *str = "unknown CUPTI result";
    return 1;
  }
  *str = result == 27 ? "the call is not supported by jaxlake's fake GPU"
                      : name;
  return 0;
}
