// Future<T> / Promise<T>: the currency of every asynchronous API in Ferry
// (rpc_async, Work, RRef::to_here).
//
// A Promise completes its shared state exactly once, with a value or an
// error; later attempts return false and change nothing. A Future reads that
// state: it can be waited on with a timeout, polled, or given callbacks.
// Results are absl::StatusOr<T> (absl::Status for Future<void>).
//
//   Promise<int> p;
//   Future<int> f = p.GetFuture();
//   f.Then([](const absl::StatusOr<int>& r) { ... });   // runs once complete
//   p.SetValue(7);                                      // runs callbacks here
//
// Callbacks: a callback added to a complete future runs inline, on the
// calling thread; otherwise it runs on the thread that completes the promise,
// after the state is published and outside any lock, in the order added. A
// callback must not block for long (it holds up the completing thread), and
// should not throw.
//
// Abandonment: when the last Promise for a state is destroyed without
// completing it, the state completes with Cancelled ("promise abandoned"),
// so no waiter hangs on a producer that is gone.
//
// Thread safety: Promise and Future are cheap shared handles; every method
// may be called concurrently from any thread. Copies share the state.
#ifndef FERRY_COMMON_FUTURE_H_
#define FERRY_COMMON_FUTURE_H_

#include <atomic>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "ferry/common/sync.h"

namespace ferry {

// The completion type of a Future<T>: StatusOr<T>, or Status for void.
template <typename T>
using Result =
    std::conditional_t<std::is_void_v<T>, absl::Status, absl::StatusOr<T>>;

template <typename T>
class Future;
template <typename T>
class Promise;

namespace future_internal {

template <typename T>
const absl::Status& StatusOf(const Result<T>& r) {
  if constexpr (std::is_void_v<T>) {
    return r;
  } else {
    return r.status();
  }
}

// absl::Status shares one heap representation between copies and counts
// its references inside Abseil's compiled library. Debian's Abseil is not
// built with TSAN, so TSAN does not see that count synchronize: an error
// read on one thread (a waiter's copy) and freed on another (when the last
// other copy goes) is reported as a data race. So every error crossing
// threads through a future is an unshared copy (same code, message and
// payloads): the state keeps its own, and Get() hands out another. Only
// errors pay for it; OK results are not copied.
inline absl::Status Unshared(const absl::Status& s) {
  if (s.ok()) return s;
  absl::Status out(s.code(), s.message());
  s.ForEachPayload([&out](absl::string_view url, const absl::Cord& payload) {
    out.SetPayload(url, absl::Cord(std::string(payload)));
  });
  return out;
}
template <typename T>
Result<T> Unshared(Result<T> r) {
  if constexpr (std::is_void_v<T>) {
    return Unshared(static_cast<const absl::Status&>(r));
  } else {
    if (r.ok()) return r;
    return Unshared(r.status());
  }
}

template <typename T>
class State {
 public:
  using Callback = absl::AnyInvocable<void(const Result<T>&)>;

  State() = default;
  // Complete from the start (MakeReadyFuture): no promise, no lock taken.
  explicit State(Result<T> result)
      : result_(Unshared<T>(std::move(result))), ready_(true) {}

  // Returns false if already complete. A value is moved in once (no copy
  // through Unshared: values are large, e.g. rpc::Message).
  bool Complete(Result<T>&& result) ABSL_LOCKS_EXCLUDED(mu_) {
    Callbacks callbacks;
    bool wake = false;
    {
      MutexLock lock(&mu_);
      if (result_.has_value()) return false;
      if constexpr (std::is_void_v<T>) {
        result_.emplace(Unshared(static_cast<const absl::Status&>(result)));
      } else if (result.ok()) {
        result_.emplace(std::move(result));
      } else {
        result_.emplace(Unshared(result.status()));
      }
      callbacks.swap(callbacks_);
      ready_.store(true, std::memory_order_release);
      wake = waiters_ > 0;
    }
    // Woken after the release, so a waiter does not wake only to block on
    // mu_ while this thread still holds it. The caller's promise keeps this
    // state alive. result_ is immutable from here on: read unlocked.
    if (wake) done_.SignalAll();
    for (Callback& cb : callbacks) cb(this->result());
    return true;
  }

  void AddCallback(Callback cb) ABSL_LOCKS_EXCLUDED(mu_) {
    if (!IsReady()) {
      MutexLock lock(&mu_);
      if (!result_.has_value()) {
        callbacks_.push_back(std::move(cb));
        return;
      }
    }
    cb(result());
  }

  bool IsReady() const { return ready_.load(std::memory_order_acquire); }

  bool WaitFor(absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_) {
    if (IsReady()) return true;
    const absl::Time deadline = timeout == absl::InfiniteDuration()
                                    ? absl::InfiniteFuture()
                                    : absl::Now() + timeout;
    MutexLock lock(&mu_);
    while (!result_.has_value()) {
      ++waiters_;
      const bool timed_out = deadline == absl::InfiniteFuture()
                                 ? (done_.Wait(&mu_), false)
                                 : done_.WaitWithDeadline(&mu_, deadline);
      --waiters_;
      if (timed_out) break;
    }
    return result_.has_value();
  }

  // Requires IsReady(). The result never changes once set.
  const Result<T>& result() const ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return *result_;
  }

  // Promises sharing this state (Promise keeps the count). When the last
  // goes without completing it, the state completes with Cancelled, so no
  // waiter hangs on a producer that is gone.
  void AddPromise() { promises_.fetch_add(1, std::memory_order_relaxed); }
  void DropPromise() {
    if (promises_.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    // Most states are complete by now: skip building the error.
    if (IsReady()) return;
    Complete(absl::CancelledError(
        "promise abandoned: its producer was destroyed without completing "
        "it"));
  }

 private:
  mutable Mutex mu_;
  std::optional<Result<T>> result_ ABSL_GUARDED_BY(mu_);
  // Most futures get one callback (Then, OnComplete): held inline.
  using Callbacks = absl::InlinedVector<Callback, 1>;
  Callbacks callbacks_ ABSL_GUARDED_BY(mu_);
  // Threads in WaitFor; Complete signals done_ only when there are some.
  int waiters_ ABSL_GUARDED_BY(mu_) = 0;
  CondVar done_;
  std::atomic<bool> ready_{false};
  std::atomic<int> promises_{0};
};

// Builds futures from states (MakeReadyFuture).
struct Access {
  template <typename T>
  static Future<T> Make(std::shared_ptr<State<T>> state) {
    return Future<T>(std::move(state));
  }
};

template <typename F, typename Arg>
using CallResult = std::invoke_result_t<F, Arg>;

template <typename X>
struct FutureTraits {
  static constexpr bool kIsFuture = false;
};
template <typename U>
struct FutureTraits<Future<U>> {
  static constexpr bool kIsFuture = true;
  using Value = U;
};

// Maps the return type of a Then() continuation to the value type of the
// resulting future: StatusOr<U> -> U, Status -> void, Future<U> -> U, U -> U.
template <typename R>
struct ContinuationValue {
  using type = R;
};
template <typename U>
struct ContinuationValue<absl::StatusOr<U>> {
  using type = U;
};
template <>
struct ContinuationValue<absl::Status> {
  using type = void;
};
template <typename U>
struct ContinuationValue<Future<U>> {
  using type = U;
};

}  // namespace future_internal

// The reading end of an asynchronous result (see the top of this file).
template <typename T>
class Future {
 public:
  using ValueType = T;  // The T of Future<T>.

  // An invalid future (no state); only assignment and valid() may be used.
  Future() = default;

  bool valid() const { return state_ != nullptr; }  // Has a state.

  // True once the promise has been completed.
  bool IsReady() const { return state_->IsReady(); }

  // Waits up to `timeout` for completion. OK when complete (whatever the
  // result); DeadlineExceeded otherwise. Does not consume the result.
  absl::Status Wait(absl::Duration timeout = absl::InfiniteDuration()) const {
    if (state_->WaitFor(timeout)) return absl::OkStatus();
    return absl::DeadlineExceededError(absl::StrCat(
        "future not complete after ", absl::FormatDuration(timeout)));
  }

  // Waits for completion and returns the result (a copy; futures are
  // shared; an error is an unshared copy, see Unshared). On timeout returns
  // DeadlineExceeded.
  Result<T> Get(absl::Duration timeout = absl::InfiniteDuration()) const {
    absl::Status waited = Wait(timeout);
    if (!waited.ok()) return waited;
    return future_internal::Unshared<T>(state_->result());
  }

  // The result; requires IsReady(). A reference valid while a Future or
  // Promise for this state lives.
  const Result<T>& result() const { return state_->result(); }

  // The error of a completed future (OK for a value). Requires IsReady().
  const absl::Status& status() const {
    return future_internal::StatusOf<T>(state_->result());
  }

  // Calls `cb(const Result<T>&)` once complete (see header comment for the
  // thread it runs on).
  void OnComplete(absl::AnyInvocable<void(const Result<T>&)> cb) const {
    state_->AddCallback(std::move(cb));
  }

  // Chains a continuation and returns the future of its result. `f` receives
  // `const Result<T>&` and returns `U`, `StatusOr<U>`, `Status` (->
  // `Future<void>`) or `Future<U>` (flattened).
  template <typename F>
  auto Then(F f) const {
    using R = future_internal::CallResult<F, const Result<T>&>;
    using U = typename future_internal::ContinuationValue<R>::type;
    // A struct, not a lambda: a stateless `f` then takes no space, so the
    // continuation (one Promise) is stored inline in the callback.
    struct Continuation {
      [[no_unique_address]] F f;
      Promise<U> promise;
      void operator()(const Result<T>& r) {
        if constexpr (future_internal::FutureTraits<R>::kIsFuture) {
          f(r).OnComplete(
              [promise = std::move(promise)](const Result<U>& inner) mutable {
                promise.Set(inner);
              });
        } else if constexpr (std::is_same_v<R, void>) {
          f(r);
          promise.Set(absl::OkStatus());
        } else {
          promise.Set(Result<U>(f(r)));
        }
      }
    };
    Promise<U> promise;
    Future<U> out = promise.GetFuture();
    OnComplete(Continuation{std::move(f), std::move(promise)});
    return out;
  }

 private:
  friend class Promise<T>;
  friend struct future_internal::Access;
  explicit Future(std::shared_ptr<future_internal::State<T>> s)
      : state_(std::move(s)) {}

  std::shared_ptr<future_internal::State<T>> state_;
};

// The writing end: completes the shared state once (see the top of this
// file).
template <typename T>
class Promise {
 public:
  Promise() : state_(std::make_shared<future_internal::State<T>>()) {
    state_->AddPromise();
  }
  // Another promise of the same state (the state is abandoned only when
  // the last one goes without completing it).
  Promise(const Promise& other) : state_(other.state_) {
    if (state_ != nullptr) state_->AddPromise();
  }
  Promise(Promise&& other) noexcept = default;  // Leaves `other` empty.
  // Takes `other`'s state, dropping this one's (which may abandon it).
  Promise& operator=(Promise other) noexcept {
    std::swap(state_, other.state_);
    return *this;
  }
  ~Promise() {
    if (state_ != nullptr) state_->DropPromise();
  }

  // A future of this promise's state; any number may be taken.
  Future<T> GetFuture() const { return Future<T>(state_); }

  // Each returns true if this call completed the state, false if it was
  // already complete (the result is then unchanged).
  bool Set(Result<T> result) { return state_->Complete(std::move(result)); }

  // Set(value); for Promise<void>, SetValue() sets OK.
  template <typename U = T, typename = std::enable_if_t<!std::is_void_v<U>>>
  bool SetValue(U value) {
    return Set(Result<T>(std::move(value)));
  }
  // Set(OK), for Promise<void>.
  template <typename U = T, typename = std::enable_if_t<std::is_void_v<U>>>
  bool SetValue() {
    return Set(absl::OkStatus());
  }

  // `error` must not be OK (an OK status becomes Internal, naming the misuse).
  bool SetError(absl::Status error) {
    if (error.ok())
      error = absl::InternalError("Promise::SetError called with OK");
    return Set(Result<T>(std::move(error)));
  }

  bool IsReady() const { return state_->IsReady(); }  // Completed already.

 private:
  // A moved-from Promise holds none (and may only be destroyed or assigned).
  std::shared_ptr<future_internal::State<T>> state_;
};

// A future already complete with `result`.
template <typename T>
Future<T> MakeReadyFuture(Result<T> result) {
  return future_internal::Access::Make(
      std::make_shared<future_internal::State<T>>(std::move(result)));
}

// A Future<void> already complete with OK.
inline Future<void> MakeReadyFuture() {
  return MakeReadyFuture<void>(absl::OkStatus());
}

// A future already complete with `error` (not OK; see Promise::SetError).
template <typename T>
Future<T> MakeErrorFuture(absl::Status error) {
  Promise<T> p;
  p.SetError(std::move(error));
  return p.GetFuture();
}

// Completes once every input is complete, with every result in input order
// (never an error itself). An empty input completes at once.
template <typename T>
Future<std::vector<Result<T>>> WhenAll(const std::vector<Future<T>>& futures) {
  struct Gather {
    explicit Gather(size_t n) : results(n) {}
    Mutex mu;
    std::vector<std::optional<Result<T>>> results ABSL_GUARDED_BY(mu);
    size_t remaining ABSL_GUARDED_BY(mu) = 0;
    Promise<std::vector<Result<T>>> promise;
  };
  auto g = std::make_shared<Gather>(futures.size());
  {
    MutexLock lock(&g->mu);
    g->remaining = futures.size();
  }
  if (futures.empty()) {
    g->promise.SetValue({});
    return g->promise.GetFuture();
  }
  Future<std::vector<Result<T>>> out = g->promise.GetFuture();
  for (size_t i = 0; i < futures.size(); ++i) {
    futures[i].OnComplete([g, i](const Result<T>& r) {
      std::vector<Result<T>> all;
      {
        MutexLock lock(&g->mu);
        g->results[i].emplace(r);
        if (--g->remaining != 0) return;
        all.reserve(g->results.size());
        for (auto& x : g->results) all.push_back(std::move(*x));
      }
      g->promise.SetValue(std::move(all));
    });
  }
  return out;
}

// Completes with every value in input order once all succeed, or with the
// first error to arrive (without waiting for the rest), like
// torch.futures.collect_all followed by wait. Future<void> inputs give
// Future<void>.
template <typename T>
auto CollectAll(const std::vector<Future<T>>& futures) {
  using Out = std::conditional_t<std::is_void_v<T>, void, std::vector<T>>;
  Promise<Out> promise;
  Future<Out> out = promise.GetFuture();
  // Errors short-circuit: the first failure completes the output at once.
  for (const Future<T>& f : futures) {
    f.OnComplete([promise](const Result<T>& r) mutable {
      const absl::Status& s = future_internal::StatusOf<T>(r);
      if (!s.ok()) promise.SetError(s);
    });
  }
  WhenAll(futures).OnComplete(
      [promise](const absl::StatusOr<std::vector<Result<T>>>& all) mutable {
        if constexpr (std::is_void_v<T>) {
          promise.Set(absl::OkStatus());
        } else {
          std::vector<T> values;
          values.reserve(all->size());
          for (const Result<T>& r : *all) {
            if (!r.ok()) return;  // The error already completed `promise`.
            values.push_back(*r);
          }
          promise.SetValue(std::move(values));
        }
      });
  return out;
}

}  // namespace ferry

#endif  // FERRY_COMMON_FUTURE_H_
