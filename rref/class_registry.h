// ClassRegistry: C++ classes whose objects live behind RRefs (PyTorch's
// "remote objects"). A class is registered by name with one constructor and
// any number of methods; `remote(to, "Net", args...)` builds an object on
// `to`, and the RRef's proxies (rref.h: rpc_sync().call("forward", x)) run
// its methods there.
//
//   ctx->classes().RegisterClass<Net>("Net")
//       .Constructor<int>()
//       .Method("forward", &Net::Forward);
//
// Arguments and results convert through Value (tensor/value.h), as for
// registered functions; a method may return T, StatusOr<T>, Status, void or
// Future<T>.
//
// Concurrency contract: methods run on the owner agent's executor threads
// (the thread serving the call, or the one that finished constructing the
// object when the call arrived first). Calls on one object from different
// callers run concurrently: the class must be thread safe, or register it
// with Serialized() so that the owner runs one method of that object at a
// time. A method that blocks holds one executor thread.
//
// Errors: unknown class/method -> NotFound naming it; bad arguments ->
// InvalidArgument naming the class, method and argument.
//
// Thread safety: all methods are safe from any thread. Register a class
// before peers create objects of it.
#ifndef FERRY_RREF_CLASS_REGISTRY_H_
#define FERRY_RREF_CLASS_REGISTRY_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <typeindex>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "ferry/common/future.h"
#include "ferry/common/sync.h"
#include "ferry/rpc/function_registry.h"
#include "ferry/tensor/value.h"

namespace ferry::rref {

// A registered class in type-erased form.
struct ClassInfo {
  // Builds an object from the remote() call's arguments.
  using Constructor =
      std::function<absl::StatusOr<std::shared_ptr<void>>(const Value& args)>;
  // Runs a method on an object with the call's arguments.
  using Method = std::function<Future<Value>(void* object, const Value& args)>;

  std::string name;                        // The registered name.
  std::type_index type = typeid(void);     // The C++ class.
  Constructor construct;                   // Null until Constructor<A...>().
  std::map<std::string, Method> methods;   // By name.
  bool serialized = false;                 // See ClassBuilder::Serialized.
};

class ClassRegistry;

// Adds a class's constructor and methods (ClassRegistry::RegisterClass).
template <typename C>
class ClassBuilder {
 public:
  // The constructor C(A...) that remote(to, name, args...) calls.
  template <typename... A>
  ClassBuilder& Constructor();
  // A method by name; `m` is a pointer to a (const or not) member function.
  template <typename M>
  ClassBuilder& Method(const std::string& method, M m);
  // Runs at most one method of each object at a time.
  ClassBuilder& Serialized();

 private:
  friend class ClassRegistry;
  ClassBuilder(ClassRegistry* registry, std::string name)
      : registry_(registry), name_(std::move(name)) {}
  ClassRegistry* registry_;
  std::string name_;
};

// The classes a worker can construct for remote() and run methods of, by
// name.
class ClassRegistry {
 public:
  // Registers (or, for a name already registered with the same C, extends)
  // class `name`.
  template <typename C>
  ClassBuilder<C> RegisterClass(std::string name) {
    Update(name, [&](ClassInfo& info) { info.type = typeid(C); });
    return ClassBuilder<C>(this, std::move(name));
  }

  // nullptr when absent.
  std::shared_ptr<const ClassInfo> Find(const std::string& name) const;

  // Copy-on-write edit of class `name` (created when absent).
  void Update(const std::string& name,
              const std::function<void(ClassInfo&)>& edit);

 private:
  mutable Mutex mu_;
  std::map<std::string, std::shared_ptr<const ClassInfo>> classes_
      ABSL_GUARDED_BY(mu_);
};

namespace class_internal {

template <typename M>
struct MethodTraits;
template <typename C, typename R, typename... A>
struct MethodTraits<R (C::*)(A...)> {
  using Result = R;
  using Args = std::tuple<std::decay_t<A>...>;
};
template <typename C, typename R, typename... A>
struct MethodTraits<R (C::*)(A...) const> : MethodTraits<R (C::*)(A...)> {};

inline absl::Status ArgError(const std::string& cls, const std::string& what,
                             const absl::Status& s) {
  return absl::InvalidArgumentError(
      absl::StrCat("class '", cls, "' ", what, " arguments ", s.message()));
}

}  // namespace class_internal

template <typename C>
template <typename... A>
ClassBuilder<C>& ClassBuilder<C>::Constructor() {
  const std::string cls = name_;
  registry_->Update(name_, [&](ClassInfo& info) {
    info.construct =
        [cls](const Value& args) -> absl::StatusOr<std::shared_ptr<void>> {
      auto parsed = FromValue<std::tuple<std::decay_t<A>...>>(args);
      if (!parsed.ok()) {
        return class_internal::ArgError(cls, "constructor", parsed.status());
      }
      return std::apply(
          [](auto&&... a) -> std::shared_ptr<void> {
            return std::make_shared<C>(std::forward<decltype(a)>(a)...);
          },
          *std::move(parsed));
    };
  });
  return *this;
}

template <typename C>
template <typename M>
ClassBuilder<C>& ClassBuilder<C>::Method(const std::string& method, M m) {
  using Traits = class_internal::MethodTraits<M>;
  using R = typename Traits::Result;
  const std::string what = absl::StrCat("method '", method, "'");
  const std::string cls = name_;
  registry_->Update(name_, [&](ClassInfo& info) {
    info.methods[method] = [m, cls, what](void* object,
                                          const Value& args) -> Future<Value> {
      auto parsed = FromValue<typename Traits::Args>(args);
      if (!parsed.ok()) {
        return MakeErrorFuture<Value>(
            class_internal::ArgError(cls, what, parsed.status()));
      }
      C* self = static_cast<C*>(object);
      auto call = [&](auto&&... a) -> decltype(auto) {
        return (self->*m)(std::forward<decltype(a)>(a)...);
      };
      if constexpr (std::is_void_v<R>) {
        std::apply(call, *std::move(parsed));
        return MakeReadyFuture<Value>(Value::None());
      } else {
        return rpc::registry_internal::ToValueFuture(
            std::apply(call, *std::move(parsed)));
      }
    };
  });
  return *this;
}

template <typename C>
ClassBuilder<C>& ClassBuilder<C>::Serialized() {
  registry_->Update(name_, [](ClassInfo& info) { info.serialized = true; });
  return *this;
}

}  // namespace ferry::rref

#endif  // FERRY_RREF_CLASS_REGISTRY_H_
