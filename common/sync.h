// Mutex, MutexLock, CondVar and Notification for Ferry's own code.
//
// Why not absl::Mutex directly: Debian's Abseil is built without
// ThreadSanitizer instrumentation, so TSAN cannot see the happens-before
// edges absl::Mutex creates and reports races on every guarded field. These
// types sit on std::mutex / std::condition_variable (pthreads, which TSAN
// intercepts), keep absl::Mutex's spelling for the subset Ferry uses
// (including Await/AwaitWithTimeout with an absl::Condition) and carry the
// same thread-safety annotations.
//
// Await semantics: a waiter re-checks its condition whenever the mutex is
// released by a holder while waiters exist, by Unlock or by a holder starting
// to wait (as absl::Mutex does), so conditions need no explicit signalling.
//
// Thread safety: these are synchronization primitives; all methods are safe
// from any thread, with the usual lock discipline.
#ifndef FERRY_COMMON_SYNC_H_
#define FERRY_COMMON_SYNC_H_

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"  // absl::Condition only.
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace ferry {

// A mutex with absl::Mutex's API subset (Lock, Await, ...) on std::mutex
// (see the top of this file). Not recursive.
class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  // Blocks until held.
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  // Takes the lock if free; whether it did.
  bool TryLock() ABSL_EXCLUSIVE_TRYLOCK_FUNCTION(true) {
    return mu_.try_lock();
  }
  void Unlock() ABSL_UNLOCK_FUNCTION() {
    // Waiters re-evaluate their conditions after any release. Notified
    // before the release: once released, a waiter may return from Await and
    // destroy this Mutex (and the object holding it), so Unlock touches
    // nothing after mu_.unlock().
    if (awaiters_ > 0) changed_.notify_all();
    mu_.unlock();
  }
  // For the analysis only.
  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK() {}

  // Requires the lock. Releases it until `cond` holds, then returns holding it.
  void Await(const absl::Condition& cond) ABSL_EXCLUSIVE_LOCKS_REQUIRED(this) {
    AwaitUntil(cond, absl::InfiniteFuture());
  }
  // Like Await; returns whether `cond` holds (false on timeout), holding the
  // lock.
  bool AwaitWithTimeout(const absl::Condition& cond, absl::Duration timeout)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(this) {
    return AwaitUntil(cond, absl::Now() + timeout);
  }
  // AwaitWithTimeout with an absolute deadline.
  bool AwaitWithDeadline(const absl::Condition& cond, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(this) {
    return AwaitUntil(cond, deadline);
  }

 private:
  friend class CondVar;

  bool AwaitUntil(const absl::Condition& cond, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(this);

  std::mutex mu_;
  std::condition_variable changed_;
  int awaiters_ = 0;  // Guarded by mu_ (not annotatable: it is the lock).
};

// Holds a Mutex for its scope.
class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  // Locks `mu` (not null) until destroyed.
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) {
    mu_->Lock();
  }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

// A condition variable used with ferry::Mutex (explicit Signal/SignalAll).
class CondVar {
 public:
  // Releases `mu` until signalled (or woken spuriously), then retakes it.
  void Wait(Mutex* mu) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();
  }
  // Returns true on timeout (absl::CondVar's convention).
  bool WaitWithTimeout(Mutex* mu, absl::Duration timeout)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return WaitWithDeadline(mu, absl::Now() + timeout);
  }
  // WaitWithTimeout with an absolute deadline.
  bool WaitWithDeadline(Mutex* mu, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    bool timed_out = cv_.wait_until(lock, absl::ToChronoTime(deadline)) ==
                     std::cv_status::timeout;
    lock.release();
    return timed_out;
  }
  void Signal() { cv_.notify_one(); }  // Wakes one waiter.
  void SignalAll() { cv_.notify_all(); }  // Wakes every waiter.

 private:
  std::condition_variable cv_;
};

// A one-shot event: Notify() once, any number of waiters.
class Notification {
 public:
  // Sets the event and wakes the waiters; idempotent.
  void Notify() {
    MutexLock lock(&mu_);
    notified_ = true;
  }
  // Whether Notify ran.
  bool HasBeenNotified() {
    MutexLock lock(&mu_);
    return notified_;
  }
  // Blocks until Notify ran.
  void WaitForNotification() {
    MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&notified_));
  }
  // Waits up to `timeout`; whether Notify ran.
  bool WaitForNotificationWithTimeout(absl::Duration timeout) {
    MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(&notified_), timeout);
  }

 private:
  Mutex mu_;
  bool notified_ ABSL_GUARDED_BY(mu_) = false;
};

inline bool Mutex::AwaitUntil(const absl::Condition& cond,
                              absl::Time deadline) {
  std::unique_lock<std::mutex> lock(mu_, std::adopt_lock);
  bool ok = true;
  // Entering a wait releases the lock too, after the caller may have changed
  // guarded state: wake the other waiters once. Later rounds follow only a
  // condition check, which changes nothing, so they do not (no ping-pong).
  bool may_have_changed = true;
  while (!cond.Eval()) {
    if (may_have_changed && awaiters_ > 0) changed_.notify_all();
    may_have_changed = false;
    ++awaiters_;
    if (deadline == absl::InfiniteFuture()) {
      changed_.wait(lock);
    } else if (changed_.wait_until(lock, absl::ToChronoTime(deadline)) ==
               std::cv_status::timeout) {
      --awaiters_;
      ok = cond.Eval();
      break;
    }
    --awaiters_;
  }
  lock.release();
  return ok;
}

}  // namespace ferry

#endif  // FERRY_COMMON_SYNC_H_
