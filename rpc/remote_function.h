// RemoteFunction<R(P...)>: a typed handle to a function a worker serves.
//
// Declare a handle once (in a header both sides include), register the
// implementation against it on the callee, and call through it:
//
//   inline const ferry::rpc::RemoteFunction<int64_t(int64_t, int64_t)>
//       kAdd("add");
//   registry.Register(kAdd, [](int64_t a, int64_t b) { return a + b; });
//   ferry::Result<int64_t> sum = worker.rpc_sync("w1", kAdd, 2, 3);
//
// or let the registry deduce the signature from the callable:
//   ASSIGN_OR_RETURN(auto add, registry.Define("add", impl));
//
// Checked at compile time: the call's argument count, each argument against
// its parameter (it must initialize P with braces: no narrowing, no
// unrelated type), the result type (Result<R>; no cast, no restated type),
// and on registration that the implementation takes P... (optionally after
// a `const CallContext&`) and returns R, absl::StatusOr<R> or Future<R>
// (for R = void: void, absl::Status or Future<void>). On the wire a typed
// call is an ordinary call by name, so by-name callers and callers in other
// languages reach the same function; the callee still checks the values it
// receives (InvalidArgument naming the function and argument).
//
// Thread safety: a handle is an immutable value; copy it freely.
#ifndef FERRY_RPC_REMOTE_FUNCTION_H_
#define FERRY_RPC_REMOTE_FUNCTION_H_

#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

namespace ferry::rpc {

template <typename Sig>
class RemoteFunction;

// The handle of a function taking P... and returning R (see the top of
// this file).
template <typename R, typename... P>
class RemoteFunction<R(P...)> {
  static_assert(!std::is_reference_v<R> && (!std::is_reference_v<P> && ...),
                "a remote function's parameters and result are values: "
                "declare them without & (they are copied across workers)");
  static_assert(!(std::is_const_v<P> || ...),
                "declare remote function parameters without const");

 public:
  using Result = R;  // What the function returns.
  using Params = std::tuple<P...>;  // What it takes.

  // Names it.
  explicit RemoteFunction(std::string name) : name_(std::move(name)) {}

  const std::string& name() const { return name_; }  // The registered name.

 private:
  std::string name_;
};

namespace remote_function_internal {

// `a` initializes a P with braces: exact, widening or converting by
// constructor, never narrowing.
template <typename P, typename A>
concept Initializes = requires(A&& a) {
  P{std::forward<A>(a)};
};

template <typename Params, typename... A>
struct ArgsFit : std::false_type {};
template <typename... P, typename... A>
requires(sizeof...(P) == sizeof...(A)) struct ArgsFit<std::tuple<P...>, A...>
    : std::bool_constant<(Initializes<P, A> && ...)> {
};

}  // namespace remote_function_internal

// Whether a call of `F` (a RemoteFunction) with arguments `A...` compiles.
template <typename F, typename... A>
concept CallableWith =
    remote_function_internal::ArgsFit<typename F::Params, A...>::value;

}  // namespace ferry::rpc

#endif  // FERRY_RPC_REMOTE_FUNCTION_H_
