// jaxlake: Clang's thread-safety annotations for the lake, and the mutex
// and scoped lock they name. Under Clang the macros expand to the
// attributes that -Wthread-safety checks (docs/contributing.md says how
// the check runs); under other compilers to nothing. Private to cc/lake/;
// not installed.
//
// In Lake::Impl, `mu` is the capability; each field it guards is
// JAXLAKE_GUARDED_BY(mu); each method that needs the lock is
// JAXLAKE_REQUIRES(mu), and each method that needs it and may release it
// for a while (driver calls, waits) before taking it again is
// JAXLAKE_MAY_UNLOCK(mu): whatever such a call's caller read before it may
// have changed when it returns.
#ifndef JAXLAKE_CC_LAKE_THREAD_ANNOTATIONS_H_
#define JAXLAKE_CC_LAKE_THREAD_ANNOTATIONS_H_

#include <mutex>

#if defined(__clang__)
#define JAXLAKE_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define JAXLAKE_THREAD_ANNOTATION(x)
#endif

#define JAXLAKE_CAPABILITY(name) JAXLAKE_THREAD_ANNOTATION(capability(name))
#define JAXLAKE_SCOPED_CAPABILITY JAXLAKE_THREAD_ANNOTATION(scoped_lockable)
#define JAXLAKE_GUARDED_BY(mu) JAXLAKE_THREAD_ANNOTATION(guarded_by(mu))
#define JAXLAKE_REQUIRES(...) \
  JAXLAKE_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define JAXLAKE_ACQUIRE(...) \
  JAXLAKE_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define JAXLAKE_RELEASE(...) \
  JAXLAKE_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define JAXLAKE_EXCLUDES(...) \
  JAXLAKE_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define JAXLAKE_ASSERT_CAPABILITY(x) \
  JAXLAKE_THREAD_ANNOTATION(assert_capability(x))
#define JAXLAKE_NO_THREAD_SAFETY_ANALYSIS \
  JAXLAKE_THREAD_ANNOTATION(no_thread_safety_analysis)
// Called with `mu` held; may release it and take it again before it
// returns. The same check as JAXLAKE_REQUIRES: the name tells the reader.
#define JAXLAKE_MAY_UNLOCK(mu) JAXLAKE_REQUIRES(mu)

namespace jaxlake {
namespace detail {

// A std::mutex that the analysis knows as a capability.
class JAXLAKE_CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;
  void lock() JAXLAKE_ACQUIRE() { mu_.lock(); }
  void unlock() JAXLAKE_RELEASE() { mu_.unlock(); }
  // Tells the analysis that the caller holds the mutex (checks nothing at
  // run time): for a lambda run by a function that holds it, where the
  // analysis cannot see that.
  void AssertHeld() const JAXLAKE_ASSERT_CAPABILITY(this) {}

 private:
  friend class MutexLock;
  std::mutex mu_;
};

// Holds a Mutex for its scope. A function that releases it for a while
// does so through its owner's Unlock / Relock (Lake::Impl), which tell the
// analysis which mutex that is; Clang 14 cannot follow a scoped lock passed
// by reference.
class JAXLAKE_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) JAXLAKE_ACQUIRE(mu) : lk_(mu.mu_) {}
  ~MutexLock() JAXLAKE_RELEASE() {}
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;
  void unlock() JAXLAKE_RELEASE() { lk_.unlock(); }
  void lock() JAXLAKE_ACQUIRE() { lk_.lock(); }
  // For std::condition_variable::wait, which releases and retakes it.
  std::unique_lock<std::mutex>& native() { return lk_; }

 private:
  std::unique_lock<std::mutex> lk_;
};

}  // namespace detail
}  // namespace jaxlake

#endif  // JAXLAKE_CC_LAKE_THREAD_ANNOTATIONS_H_
