// RRef<T>: a reference to a value (or a remote object) that lives on one
// worker, its owner, usable from any worker of the group.
//
//   auto ctx = *RRefContext::Install(agent);              // one per agent
//   RRef<Tensor> r = remote<Tensor>(*ctx, "ps", "make", 4);  // returns at once
//   absl::StatusOr<Tensor> t = r.to_here(absl::Seconds(5));
//   agent.rpc_sync("trainer", "use", r);                  // RRefs travel
//
//   ctx->classes().RegisterClass<Net>("Net").Constructor<int>()
//       .Method("forward", &Net::Forward);
//   RRef<Net> net = remote<Net>(*ctx, "ps", "Net", 3);
//   absl::StatusOr<Tensor> y = net.rpc_sync().call<Tensor>("forward", x);
//
// Which T: a type Value converts (tensor/value.h) for values, which gives
// to_here() and local_value() -> StatusOr<T>; any registered class for remote
// objects, which gives local_value() -> StatusOr<shared_ptr<T>> (owner only)
// and the proxies. RRef<Value> takes any value.
//
// Errors never abort: a remote() whose creation failed or timed out returns
// an RRef whose next use (to_here, proxies, creation()) reports the error,
// naming the RRef id, the owner and the limit. Every blocking call takes a
// timeout (default kDefaultRRefTimeout).
//
// Reference counting is automatic: copies of an RRef<T> share one reference;
// when the last copy on a worker goes (and no message carrying it is still
// being sent), the owner is told (rref_context.h has the protocol).
//
// Thread safety: an RRef<T> is a value type; const methods may be called
// concurrently from any thread. Futures complete on transport threads: do not
// block in their continuations.
#ifndef FERRY_RREF_RREF_H_
#define FERRY_RREF_RREF_H_

#include <memory>
#include <string>
#include <type_traits>
#include <typeindex>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "ferry/common/future.h"
#include "ferry/rpc/agent.h"
#include "ferry/rpc/function_registry.h"
#include "ferry/rref/class_registry.h"
#include "ferry/rref/rref_context.h"
#include "ferry/tensor/value.h"

namespace ferry::rref {

// The timeout of blocking RRef calls that are given none.
inline constexpr absl::Duration kDefaultRRefTimeout = absl::Seconds(60);

namespace rref_internal {

template <typename T, typename = void>
struct IsValueType : std::false_type {};
template <typename T>
struct IsValueType<T, std::void_t<decltype(ValueConverter<T>::From(
                          std::declval<const Value&>()))>> : std::true_type {};

template <typename R>
Future<R> Typed(Future<Value> f) {
  if constexpr (std::is_same_v<R, Value>) {
    return f;
  } else if constexpr (std::is_void_v<R>) {
    return f.Then(
        [](const Result<Value>& v) -> absl::Status { return v.status(); });
  } else {
    return f.Then([](const Result<Value>& v) -> absl::StatusOr<R> {
      if (!v.ok()) return v.status();
      return FromValue<R>(*v);
    });
  }
}

// The type name recorded with an RRef: the Value type's name, or the class /
// function name for objects.
template <typename T>
std::string TypeNameFor(const std::string& function) {
  if constexpr (IsValueType<T>::value) {
    return rpc::TypeName<T>::Get();
  } else {
    return function;
  }
}

inline absl::Status NoContext(const RRefState& s) {
  return absl::UnavailableError(absl::StrCat(
      s.DebugString(), ": its worker's RRefContext was destroyed"));
}

}  // namespace rref_internal

// A reference to a T owned by one worker (see the top of this file).
template <typename T>
class RRef {
 public:
  RRef() = default;  // Invalid: only assignment and valid() may be used.
  // Wraps this worker's reference `state` (made by RRefContext).
  explicit RRef(std::shared_ptr<RRefState> state) : state_(std::move(state)) {}

  bool valid() const { return state_ != nullptr; }  // Holds a reference.
  bool is_owner() const { return state_->is_owner(); }  // This worker owns it.
  // The worker that holds the value.
  const rpc::WorkerInfo& owner() const { return state_->owner(); }
  // owner().name.
  const std::string& owner_name() const { return state_->owner().name; }
  // The value's id, the same on every worker.
  GlobalId rref_id() const { return state_->rref_id(); }
  // Users: this worker's fork id. Owners: none (GlobalId()).
  GlobalId fork_id() const { return state_->fork_id(); }
  // True once the owner has confirmed this worker's reference (and, for a
  // remote(), created the value).
  bool confirmed_by_owner() const {
    return state_->created().IsReady() && state_->created().status().ok();
  }
  // Completes when the owner has the value / confirmed this reference, or
  // with the creation error.
  Future<void> creation() const { return state_->created(); }
  // The shared reference state (rref_context.h).
  const std::shared_ptr<RRefState>& state() const { return state_; }

  // A copy of the value, fetched from the owner (or read locally there).
  Future<T> to_here_async(absl::Duration timeout = kDefaultRRefTimeout) const {
    static_assert(rref_internal::IsValueType<T>::value,
                  "to_here() needs a Value type; remote objects stay remote");
    std::shared_ptr<RRefContext> ctx = state_->context();
    if (ctx == nullptr) {
      return MakeErrorFuture<T>(rref_internal::NoContext(*state_));
    }
    return rref_internal::Typed<T>(ctx->Fetch(state_, timeout));
  }
  absl::StatusOr<T> to_here(absl::Duration timeout = kDefaultRRefTimeout) const {
    Future<T> f = to_here_async(timeout);
    // The transport enforces `timeout` on users; the grace covers the owner's
    // local wait and the delivery of a timeout error.
    Result<T> r = f.Get(timeout + absl::Seconds(1));
    if (!r.ok() && !f.IsReady()) {
      return absl::DeadlineExceededError(
          absl::StrCat("to_here of ", state_->DebugString(), " not done after ",
                       absl::FormatDuration(timeout)));
    }
    return r;
  }

  // Owner only (FailedPrecondition elsewhere); waits up to `timeout` for a
  // pending creation. Values: a copy (tensors share storage). Objects: the
  // object itself.
  auto local_value(absl::Duration timeout = kDefaultRRefTimeout) const {
    std::shared_ptr<RRefContext> ctx = state_->context();
    if constexpr (rref_internal::IsValueType<T>::value) {
      if (ctx == nullptr) {
        return absl::StatusOr<T>(rref_internal::NoContext(*state_));
      }
      absl::StatusOr<Value> v = ctx->LocalValue(*state_, timeout);
      if (!v.ok()) return absl::StatusOr<T>(v.status());
      return FromValue<T>(*v);
    } else {
      using Out = absl::StatusOr<std::shared_ptr<T>>;
      if (ctx == nullptr) return Out(rref_internal::NoContext(*state_));
      absl::StatusOr<std::shared_ptr<void>> o =
          ctx->LocalObject(*state_, typeid(T), timeout);
      if (!o.ok()) return Out(o.status());
      return Out(std::static_pointer_cast<T>(*o));
    }
  }

  // --- Proxies: run a method of the remote object on its owner. ---
  // From rpc_sync(): each call waits for the method's result.
  class SyncProxy {
   public:
    // Runs `method` with `args` on the owner; its result as an R.
    template <typename R = Value, typename... A>
    Result<R> call(const std::string& method, A&&... args) const {
      return rref_->template Invoke<R>(timeout_, method,
                                       std::forward<A>(args)...)
          .Get();
    }

   private:
    friend class RRef;
    SyncProxy(const RRef* r, absl::Duration t) : rref_(r), timeout_(t) {}
    const RRef* rref_;
    absl::Duration timeout_;
  };
  // From rpc_async(): each call returns the future of the method's result.
  class AsyncProxy {
   public:
    // Runs `method` with `args` on the owner; the future of its result.
    template <typename R = Value, typename... A>
    Future<R> call(const std::string& method, A&&... args) const {
      return rref_.template Invoke<R>(timeout_, method,
                                      std::forward<A>(args)...);
    }

   private:
    friend class RRef;
    AsyncProxy(RRef r, absl::Duration t) : rref_(std::move(r)), timeout_(t) {}
    RRef rref_;
    absl::Duration timeout_;
  };
  // From remote(): each call leaves the method's result on the owner.
  class RemoteProxy {
   public:
    // Runs `method` with `args` on the owner, which keeps the result; an
    // RRef to it (invalid if this worker's RRefContext is gone).
    template <typename R = Value, typename... A>
    RRef<R> call(const std::string& method, A&&... args) const {
      std::shared_ptr<RRefContext> ctx = rref_.state_->context();
      if (ctx == nullptr) return RRef<R>();
      return RRef<R>(ctx->RemoteMethod(
          rref_.state_, method, Value::List{ToValue(std::forward<A>(args))...},
          rref_internal::TypeNameFor<R>(method), timeout_));
    }

   private:
    friend class RRef;
    RemoteProxy(RRef r, absl::Duration t) : rref_(std::move(r)), timeout_(t) {}
    RRef rref_;
    absl::Duration timeout_;
  };
  // The sync proxy must not outlive this RRef.
  SyncProxy rpc_sync(absl::Duration timeout = kDefaultRRefTimeout) const {
    return SyncProxy(this, timeout);
  }
  // A proxy whose calls return futures; it holds a copy of this RRef.
  AsyncProxy rpc_async(absl::Duration timeout = kDefaultRRefTimeout) const {
    return AsyncProxy(*this, timeout);
  }
  // A proxy whose calls return RRefs owned by this RRef's owner.
  RemoteProxy remote(absl::Duration timeout = kDefaultRRefTimeout) const {
    return RemoteProxy(*this, timeout);
  }

 private:
  template <typename R, typename... A>
  Future<R> Invoke(absl::Duration timeout, const std::string& method,
                   A&&... args) const {
    std::shared_ptr<RRefContext> ctx = state_->context();
    if (ctx == nullptr) {
      return MakeErrorFuture<R>(rref_internal::NoContext(*state_));
    }
    return rref_internal::Typed<R>(ctx->CallMethod(
        state_, method, Value::List{ToValue(std::forward<A>(args))...},
        timeout));
  }

  std::shared_ptr<RRefState> state_;
};

// Runs `function` (a registered function, or a registered class's
// constructor) on `to`, which keeps the result; returns at once.
template <typename T, typename... A>
RRef<T> remote_for(RRefContext& ctx, absl::Duration timeout,
                   const rpc::WorkerRef& to, const std::string& function,
                   A&&... args) {
  return RRef<T>(ctx.Remote(to, function,
                            Value::List{ToValue(std::forward<A>(args))...},
                            rref_internal::TypeNameFor<T>(function), timeout));
}
// remote_for with kDefaultRRefTimeout.
template <typename T, typename... A>
RRef<T> remote(RRefContext& ctx, const rpc::WorkerRef& to,
               const std::string& function, A&&... args) {
  return remote_for<T>(ctx, kDefaultRRefTimeout, to, function,
                       std::forward<A>(args)...);
}

// An RRef to a value this worker owns.
template <typename T>
RRef<T> MakeLocalRRef(RRefContext& ctx, const T& value) {
  return RRef<T>(ctx.Local(ToValue(value), rpc::TypeName<T>::Get()));
}

}  // namespace ferry::rref

namespace ferry {

// RRef<T> as an argument or result: the handle carries this worker's
// reference until the interceptor forks it for the receiver; on the receiver
// it carries the reference the interceptor created.
template <typename T>
struct ValueConverter<rref::RRef<T>> {
  // The handle, carrying this worker's reference.
  static Value To(const rref::RRef<T>& r) {
    return Value::FromRRef(rref::RRefContext::MakeHandle(r.state()));
  }
  // The RRef a received handle carries; FailedPrecondition when it holds
  // none here, InvalidArgument for another kind or type.
  static absl::StatusOr<rref::RRef<T>> From(const Value& v) {
    const RRefHandle* h = v.if_rref();
    if (h == nullptr) return KindMismatch("rref", v);
    if (h->local == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "RRef ", h->rref_id.ToString(),
          " holds no reference on this worker (no RRefContext received it)"));
    }
    auto state = std::static_pointer_cast<rref::RRefState>(h->local);
    if constexpr (rref::rref_internal::IsValueType<T>::value &&
                  !std::is_same_v<T, Value>) {
      const std::string want = rpc::TypeName<T>::Get();
      if (want != "value" && state->type_name() != "value" &&
          state->type_name() != want) {
        return absl::InvalidArgumentError(
            absl::StrCat("expected RRef of ", want, ", got RRef of ",
                         state->type_name()));
      }
    }
    return rref::RRef<T>(std::move(state));
  }
};

}  // namespace ferry

#endif  // FERRY_RREF_RREF_H_
