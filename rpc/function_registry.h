// FunctionRegistry: the functions a worker serves, by name.
//
// Functions are ordinary C++ callables. Arguments arrive as a Value list and
// are converted with FromValue<T> (tensor/value.h); the result goes back with
// ToValue. A callable may return:
//   T                  -> the value
//   absl::StatusOr<T>  -> the value, or the error to the caller
//   absl::Status/void  -> none (or the error)
//   Future<T>          -> the reply is sent when the future completes, without
//                         holding a worker thread (PyTorch's @async_execution)
// A callable whose first parameter is `const CallContext&` receives the
// caller's identity and deadline (e.g. to call its caller back).
//
// RegisterNonBlocking marks a function that never blocks (no rpc_sync, no
// Future::Get, no lock held for long, no I/O): a transport may then run it on
// the thread that received the request instead of handing it to the agent's
// executor, saving a thread hop per call. A non-blocking function that does
// block stalls that transport thread (and can deadlock the agent: nested
// calls then have no thread left to complete on); register such functions
// with Register, which always runs them on the executor.
//
//   registry.Register("add", [](Tensor a, Tensor b) { return a.add(b); });
//
// Wrong argument count or types give InvalidArgument naming the function,
// the argument and the expected and actual kinds.
//
// Thread safety: Register and Find may be called concurrently from any
// thread. Registered callables may run concurrently on several threads.
#ifndef FERRY_RPC_FUNCTION_REGISTRY_H_
#define FERRY_RPC_FUNCTION_REGISTRY_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "ferry/common/future.h"
#include "ferry/common/sync.h"
#include "ferry/rpc/remote_function.h"
#include "ferry/tensor/value.h"

namespace ferry::rpc {

// What a served function knows about its call.
struct CallContext {
  std::string caller_name;  // The calling worker's name.
  int caller_id = -1;  // Its id (rank).
  std::string function;  // The name called.
  uint64_t request_id = 0;  // The request's id from the caller.
  // When the caller stops waiting.
  absl::Time deadline = absl::InfiniteFuture();
};

// A function in its type-erased form.
using RawFunction =
    std::function<Future<Value>(const CallContext&, const Value& args)>;

// A registered function and what is known about it.
struct FunctionEntry {
  std::string name;  // The name callers use.
  std::string signature;  // "(Tensor, int64) -> Tensor"
  std::string doc;  // Free text (admin listing).
  bool is_async = false;  // Returns a Future.
  // Never blocks: may run on a transport thread (RegisterNonBlocking).
  bool non_blocking = false;
  RawFunction fn;  // The implementation.
};

// Readable names of argument and result types, for signatures.
template <typename T, typename = void>
struct TypeName {
  static std::string Get() { return "value"; }  // The name.
};

namespace registry_internal {

template <typename T>
struct IsFuture : std::false_type {};
template <typename T>
struct IsFuture<Future<T>> : std::true_type {
  using Inner = T;
};
template <typename T>
struct IsStatusOr : std::false_type {};
template <typename T>
struct IsStatusOr<absl::StatusOr<T>> : std::true_type {
  using Inner = T;
};

template <typename T>
struct Signature;
template <typename R, typename... A>
struct Signature<R(A...)> {
  using Result = R;
  using Args = std::tuple<A...>;
};
template <typename R, typename... A>
struct Signature<R (*)(A...)> : Signature<R(A...)> {};
template <typename C, typename R, typename... A>
struct Signature<R (C::*)(A...)> : Signature<R(A...)> {};
template <typename C, typename R, typename... A>
struct Signature<R (C::*)(A...) const> : Signature<R(A...)> {};
template <typename F, typename = void>
struct CallableSignature : Signature<F> {};
template <typename F>
struct CallableSignature<F, std::void_t<decltype(&F::operator())>>
    : Signature<decltype(&F::operator())> {};

// Converts whatever the user's function returned into a Future<Value>.
template <typename R>
Future<Value> ToValueFuture(R&& r);

template <typename U>
absl::StatusOr<Value> ResultToValue(const Result<U>& r) {
  if constexpr (std::is_void_v<U>) {
    if (!r.ok()) return r;
    return Value::None();
  } else {
    if (!r.ok()) return r.status();
    return ToValue(*r);
  }
}

template <typename R>
Future<Value> ToValueFuture(R&& r) {
  using D = std::decay_t<R>;
  if constexpr (IsFuture<D>::value) {
    using U = typename IsFuture<D>::Inner;
    return r.Then([](const Result<U>& x) { return ResultToValue<U>(x); });
  } else if constexpr (IsStatusOr<D>::value) {
    using U = typename IsStatusOr<D>::Inner;
    return MakeReadyFuture<Value>(ResultToValue<U>(r));
  } else if constexpr (std::is_same_v<D, absl::Status>) {
    return MakeReadyFuture<Value>(ResultToValue<void>(r));
  } else {
    return MakeReadyFuture<Value>(ToValue(r));
  }
}

template <typename Tuple>
struct DropContext {
  static constexpr bool kHasContext = false;
  using Args = Tuple;
};
template <typename First, typename... Rest>
struct DropContext<std::tuple<First, Rest...>> {
  static constexpr bool kHasContext =
      std::is_same_v<std::decay_t<First>, CallContext>;
  using Args = std::conditional_t<kHasContext, std::tuple<Rest...>,
                                  std::tuple<First, Rest...>>;
};

template <typename Tuple>
struct DecayAll;
template <typename... A>
struct DecayAll<std::tuple<A...>> {
  using type = std::tuple<std::decay_t<A>...>;
  static std::string Names() {
    std::vector<std::string> names{TypeName<std::decay_t<A>>::Get()...};
    return absl::StrCat("(", absl::StrJoin(names, ", "), ")");
  }
};

template <typename R>
std::string ResultName() {
  using D = std::decay_t<R>;
  if constexpr (IsFuture<D>::value) {
    return ResultName<typename IsFuture<D>::Inner>();
  } else if constexpr (IsStatusOr<D>::value) {
    return ResultName<typename IsStatusOr<D>::Inner>();
  } else if constexpr (std::is_void_v<D> || std::is_same_v<D, absl::Status>) {
    return "none";
  } else {
    return TypeName<D>::Get();
  }
}

// The value a remote call of a function returning R produces: R itself, or
// what a StatusOr / Future carries (absl::Status: none, void).
template <typename R>
struct Produced {
  using type = R;
};
template <typename T>
struct Produced<absl::StatusOr<T>> {
  using type = T;
};
template <typename T>
struct Produced<Future<T>> {
  using type = T;
};
template <>
struct Produced<absl::Status> {
  using type = void;
};

template <typename R, typename Tuple>
struct HandleFor;
template <typename R, typename... P>
struct HandleFor<R, std::tuple<P...>> {
  using type = RemoteFunction<R(P...)>;
};

}  // namespace registry_internal

// The functions a worker serves, by name (see the top of this file).
class FunctionRegistry {
 public:
  FunctionRegistry() = default;
  FunctionRegistry(const FunctionRegistry&) = delete;
  FunctionRegistry& operator=(const FunctionRegistry&) = delete;

  // Registers a typed callable. AlreadyExists if `name` is taken;
  // InvalidArgument for an empty name.
  template <typename F>
  absl::Status Register(std::string name, F f, std::string doc = "") {
    return RegisterRaw(
        MakeEntry(std::move(name), std::move(f), std::move(doc)));
  }
  // The same for a function that never blocks (see the file comment).
  template <typename F>
  absl::Status RegisterNonBlocking(std::string name, F f,
                                   std::string doc = "") {
    FunctionEntry entry =
        MakeEntry(std::move(name), std::move(f), std::move(doc));
    entry.non_blocking = true;
    return RegisterRaw(std::move(entry));
  }

  // Registers `f` as the implementation of `handle` (remote_function.h):
  // a compile error unless `f` takes the handle's parameters (optionally
  // after a `const CallContext&`) and produces its result. Arguments are
  // converted to the handle's parameter types, whatever `f` takes them as.
  template <typename R, typename... P, typename F>
  absl::Status Register(const RemoteFunction<R(P...)>& handle, F f,
                        std::string doc = "") {
    constexpr bool kContext =
        std::is_invocable_v<F&, const CallContext&, P&&...>;
    static_assert(kContext || std::is_invocable_v<F&, P&&...>,
                  "the implementation does not take the remote function's "
                  "parameters");
    if constexpr (kContext) {
      using Out = std::invoke_result_t<F&, const CallContext&, P&&...>;
      CheckProduces<Out, R>();
      return Register(
          handle.name(),
          [f = std::move(f)](const CallContext& ctx, P... p) mutable -> Out {
            return f(ctx, std::move(p)...);
          },
          std::move(doc));
    } else {
      using Out = std::invoke_result_t<F&, P&&...>;
      CheckProduces<Out, R>();
      return Register(
          handle.name(),
          [f = std::move(f)](P... p) mutable -> Out {
            return f(std::move(p)...);
          },
          std::move(doc));
    }
  }

  // Registers `f` under `name` and returns its typed handle, whose
  // signature is `f`'s (parameters decayed, a leading CallContext dropped,
  // the result unwrapped from StatusOr / Future). Errors as Register.
  template <typename F>
  auto Define(std::string name, F f, std::string doc = "") {
    using Sig = registry_internal::CallableSignature<std::decay_t<F>>;
    using Drop = registry_internal::DropContext<typename Sig::Args>;
    using Handle = typename registry_internal::HandleFor<
        typename registry_internal::Produced<
            std::decay_t<typename Sig::Result>>::type,
        typename registry_internal::DecayAll<typename Drop::Args>::type>::type;
    Handle handle(name);
    absl::Status s = Register(std::move(name), std::move(f), std::move(doc));
    return s.ok() ? absl::StatusOr<Handle>(std::move(handle))
                  : absl::StatusOr<Handle>(std::move(s));
  }

  // Registers a type-erased entry (errors as Register).
  absl::Status RegisterRaw(FunctionEntry entry);

  // nullptr when absent.
  std::shared_ptr<const FunctionEntry> Find(const std::string& name) const;

  // Every entry, sorted by name.
  std::vector<std::shared_ptr<const FunctionEntry>> List() const;

 private:
  template <typename Out, typename R>
  static constexpr void CheckProduces() {
    static_assert(
        std::is_same_v<typename registry_internal::Produced<
                           std::decay_t<Out>>::type,
                       R>,
        "the implementation's result is not the remote function's result "
        "type (R, absl::StatusOr<R> or Future<R>)");
  }
  template <typename F>
  static FunctionEntry MakeEntry(std::string name, F f, std::string doc);

  mutable Mutex mu_;
  std::map<std::string, std::shared_ptr<const FunctionEntry>> functions_
      ABSL_GUARDED_BY(mu_);
};

template <typename F>
FunctionEntry FunctionRegistry::MakeEntry(std::string name, F f,
                                          std::string doc) {
  using Sig = registry_internal::CallableSignature<std::decay_t<F>>;
  using R = typename Sig::Result;
  using Drop = registry_internal::DropContext<typename Sig::Args>;
  using Decayed = registry_internal::DecayAll<typename Drop::Args>;
  using ArgTuple = typename Decayed::type;
  constexpr bool kHasContext = Drop::kHasContext;

  FunctionEntry entry;
  entry.name = name;
  entry.doc = std::move(doc);
  entry.is_async = registry_internal::IsFuture<std::decay_t<R>>::value;
  entry.signature = absl::StrCat(Decayed::Names(), " -> ",
                                 registry_internal::ResultName<R>());
  entry.fn = [f = std::move(f), name](
                 const CallContext& ctx,
                 const Value& args) mutable -> Future<Value> {
    absl::StatusOr<ArgTuple> parsed = FromValue<ArgTuple>(args);
    if (!parsed.ok()) {
      return MakeErrorFuture<Value>(absl::InvalidArgumentError(absl::StrCat(
          "function '", name, "' arguments ", parsed.status().message())));
    }
    auto call = [&](auto&&... a) -> decltype(auto) {
      if constexpr (kHasContext) {
        return f(ctx, std::forward<decltype(a)>(a)...);
      } else {
        return f(std::forward<decltype(a)>(a)...);
      }
    };
    if constexpr (std::is_void_v<R>) {
      std::apply(call, *std::move(parsed));
      return MakeReadyFuture<Value>(Value::None());
    } else {
      return registry_internal::ToValueFuture(
          std::apply(call, *std::move(parsed)));
    }
  };
  return entry;
}

// TypeName specializations for the types Value converts.
template <>
struct TypeName<bool> {
  static std::string Get() { return "bool"; }  // The name.
};
template <typename T>
struct TypeName<
    T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>>> {
  static std::string Get() { return std::is_signed_v<T> ? "int64" : "uint64"; }
};
template <typename T>
struct TypeName<T, std::enable_if_t<std::is_floating_point_v<T>>> {
  static std::string Get() { return "double"; }
};
template <>
struct TypeName<std::string> {
  static std::string Get() { return "string"; }
};
// TypeName of Bytes.
template <>
struct TypeName<Bytes> {
  static std::string Get() { return "bytes"; }  // The name.
};
// TypeName of Tensor.
template <>
struct TypeName<Tensor> {
  static std::string Get() { return "Tensor"; }  // The name.
};
// TypeName of Value.
template <>
struct TypeName<Value> {
  static std::string Get() { return "value"; }  // The name.
};
template <typename T>
struct TypeName<std::vector<T>> {
  static std::string Get() {
    return absl::StrCat("list<", TypeName<T>::Get(), ">");
  }
};
template <typename T>
struct TypeName<std::map<std::string, T>> {
  static std::string Get() {
    return absl::StrCat("dict<string, ", TypeName<T>::Get(), ">");
  }
};
template <typename T>
struct TypeName<std::optional<T>> {
  static std::string Get() {
    return absl::StrCat("optional<", TypeName<T>::Get(), ">");
  }
};

}  // namespace ferry::rpc

#endif  // FERRY_RPC_FUNCTION_REGISTRY_H_
