// Value: the dynamic value type of RPC arguments and results.
//
// A Value holds one of: none, bool, int (int64), double, string, bytes,
// Tensor, list of Values, dict (string keys, sorted), an RRef handle (filled
// in by the RRef layer) or a protobuf message (by type name and serialized
// bytes). Tensors inside a Value are shared handles, not copies.
//
// Typed conversion both ways:
//   Value v = ToValue(std::make_tuple(1, std::string("x"), tensor));
//   absl::StatusOr<std::tuple<int, std::string, Tensor>> t =
//       FromValue<std::tuple<int, std::string, Tensor>>(v);
// Supported: Value, bool, every integral type, float, double, std::string
// (also from const char* / absl::string_view), Bytes, Tensor, RRefHandle,
// MessageValue, std::optional<T> (none when empty), std::vector<T>,
// std::map<std::string, T>, std::pair, std::tuple; generated protobuf
// messages with ferry/tensor/proto_value.h. Add your own by specializing
// ValueConverter<T>.
//
// Errors: FromValue returns InvalidArgument naming the expected and actual
// kinds and where in the value the mismatch is ("[2]: ['w']: expected tensor,
// got string"), or an out-of-range integer.
//
// Thread safety: a Value is a plain value type; const access from several
// threads is safe, mutation needs external synchronization.
#ifndef FERRY_TENSOR_VALUE_H_
#define FERRY_TENSOR_VALUE_H_

#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "ferry/common/ids.h"
#include "ferry/common/status.h"
#include "ferry/tensor/tensor.h"

namespace ferry {

// Raw bytes (as opposed to text in a std::string Value).
struct Bytes {
  std::string data;  // The bytes.
  friend bool operator==(const Bytes& a, const Bytes& b) {
    return a.data == b.data;
  }
};

// The serialized form of a reference to a remote value. Its meaning belongs
// to the RRef layer; this layer only carries it. `extra` is free for that
// layer's own fields.
struct RRefHandle {
  int64_t owner_id = 0;  // The owner's worker id.
  GlobalId rref_id;  // common/ids.h: creating worker + counter.
  GlobalId fork_id;       // The reference's fork (the RRef layer's).
  std::string type_name;  // The type of the referenced value.
  std::string extra;      // See above.
  // The RRef layer's reference held by this worker while the handle sits in
  // a Value (keeps the RRef alive until the handle is sent or dropped).
  // Never encoded, copied by sharing, ignored by ==.
  std::shared_ptr<void> local = nullptr;
  friend bool operator==(const RRefHandle& a, const RRefHandle& b) {
    return a.owner_id == b.owner_id && a.rref_id == b.rref_id &&
           a.fork_id == b.fork_id && a.type_name == b.type_name &&
           a.extra == b.extra;
  }
};

// A protobuf message of any type: full type name plus serialized bytes.
struct MessageValue {
  std::string type_name;  // Full name ("pkg.Msg").
  std::string data;       // The serialized message.
  friend bool operator==(const MessageValue& a, const MessageValue& b) {
    return a.type_name == b.type_name && a.data == b.data;
  }
};

// A dynamically typed value: what remote functions take and return (see the
// top of this file).
class Value {
 public:
  // Which alternative a Value holds.
  enum class Kind {
    kNone,
    kBool,
    kInt,
    kDouble,
    kString,
    kBytes,
    kTensor,
    kList,
    kDict,
    kRRef,
    kMessage,
  };
  using List = std::vector<Value>;           // A list Value's elements.
  using Dict = std::map<std::string, Value>;  // A dict Value's entries.

  Value() = default;  // none
  // Factories, one per kind (named by the trailing comments).
  static Value None() { return Value(); }  // none
  static Value Bool(bool b) { return Make<1>(b); }  // bool
  static Value Int(int64_t i) { return Make<2>(i); }  // int
  static Value Double(double d) { return Make<3>(d); }  // double
  static Value String(std::string s) { return Make<4>(std::move(s)); }  // text
  static Value FromBytes(Bytes b) { return Make<5>(std::move(b)); }  // bytes
  static Value FromTensor(Tensor t) { return Make<6>(std::move(t)); }  // tensor
  static Value FromList(List l) { return Make<7>(std::move(l)); }  // list
  static Value FromDict(Dict d) { return Make<8>(std::move(d)); }  // dict
  static Value FromRRef(RRefHandle r) { return Make<9>(std::move(r)); }  // rref
  // A message Value.
  static Value FromMessage(MessageValue m) { return Make<10>(std::move(m)); }

  // What it holds.
  Kind kind() const { return static_cast<Kind>(data_.index()); }
  bool is_none() const { return kind() == Kind::kNone; }  // kind() is kNone.

  // Pointer to the held value, or nullptr when the Value is another kind.
  const bool* if_bool() const { return std::get_if<1>(&data_); }
  // The int held, or nullptr.
  const int64_t* if_int() const { return std::get_if<2>(&data_); }
  // The double held, or nullptr.
  const double* if_double() const { return std::get_if<3>(&data_); }
  // The text held, or nullptr.
  const std::string* if_string() const { return std::get_if<4>(&data_); }
  // The bytes held, or nullptr.
  const Bytes* if_bytes() const { return std::get_if<5>(&data_); }
  // The tensor held, or nullptr.
  const Tensor* if_tensor() const { return std::get_if<6>(&data_); }
  // The list held, or nullptr.
  const List* if_list() const { return std::get_if<7>(&data_); }
  // The dict held, or nullptr.
  const Dict* if_dict() const { return std::get_if<8>(&data_); }
  // The RRef handle held, or nullptr.
  const RRefHandle* if_rref() const { return std::get_if<9>(&data_); }
  // The message held, or nullptr.
  const MessageValue* if_message() const { return std::get_if<10>(&data_); }
  // The tensor held, mutable, or nullptr.
  Tensor* mutable_tensor() { return std::get_if<6>(&data_); }
  // The list held, mutable, or nullptr.
  List* mutable_list() { return std::get_if<7>(&data_); }
  // The dict held, mutable, or nullptr.
  Dict* mutable_dict() { return std::get_if<8>(&data_); }
  // The RRef handle held, mutable, or nullptr.
  RRefHandle* mutable_rref() { return std::get_if<9>(&data_); }

  // Short readable form: none, true, 3, 2.5, "text", b"\x01", [..], {..},
  // Tensor(shape=[2], dtype=float32, device=cpu), RRef(...), <pkg.Msg>.
  std::string DebugString() const;

  // Deep equality; tensors compare by dtype, shape and values (Tensor::equal).
  friend bool operator==(const Value& a, const Value& b);
  friend bool operator!=(const Value& a, const Value& b) { return !(a == b); }

 private:
  using Data =
      std::variant<std::monostate, bool, int64_t, double, std::string, Bytes,
                   Tensor, List, Dict, RRefHandle, MessageValue>;
  // Builds the alternative in place (moving a whole variant trips GCC's
  // -Wmaybe-uninitialized at -O1).
  template <size_t I, typename T>
  static Value Make(T&& x) {
    Value v;
    v.data_.template emplace<I>(std::forward<T>(x));
    return v;
  }
  Data data_;
};

// "none", "bool", "int", "double", "string", "bytes", "tensor", "list",
// "dict", "rref", "message".
absl::string_view KindName(Value::Kind kind);

// InvalidArgument "expected <expected>, got <actual kind>".
absl::Status KindMismatch(absl::string_view expected, const Value& actual);

// Specialize for your own types: static Value To(const T&) and
// static absl::StatusOr<T> From(const Value&).
template <typename T, typename Enable = void>
struct ValueConverter;

// x as a Value, through ValueConverter<T>::To.
template <typename T>
Value ToValue(const T& x) {
  return ValueConverter<std::decay_t<T>>::To(x);
}
inline Value ToValue(const char* s) { return Value::String(s); }  // Text.

// v as a T, through ValueConverter<T>::From (KindMismatch or range errors).
template <typename T>
absl::StatusOr<T> FromValue(const Value& v) {
  return ValueConverter<T>::From(v);
}

// --- Converters
// ---------------------------------------------------------------

// A Value as itself.
template <>
struct ValueConverter<Value> {
  static Value To(const Value& v) { return v; }  // As a Value.
  // Or KindMismatch.
  static absl::StatusOr<Value> From(const Value& v) { return v; }
};

// bool <-> a bool Value.
template <>
struct ValueConverter<bool> {
  static Value To(bool b) { return Value::Bool(b); }  // As a Value.
  // Or KindMismatch.
  static absl::StatusOr<bool> From(const Value& v) {
    if (const bool* b = v.if_bool()) return *b;
    return KindMismatch("bool", v);
  }
};

// Integers travel as int64. uint64_t values above INT64_MAX are stored as
// their two's complement and come back unchanged through FromValue<uint64_t>.
template <typename T>
struct ValueConverter<
    T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>>> {
  // As a Value.
  static Value To(T x) { return Value::Int(static_cast<int64_t>(x)); }
  // Or KindMismatch.
  static absl::StatusOr<T> From(const Value& v) {
    const int64_t* i = v.if_int();
    if (i == nullptr) return KindMismatch("int", v);
    if constexpr (sizeof(T) < sizeof(int64_t) || std::is_signed_v<T>) {
      if (*i < static_cast<int64_t>(std::numeric_limits<T>::min()) ||
          (sizeof(T) < sizeof(int64_t) &&
           *i > static_cast<int64_t>(std::numeric_limits<T>::max()))) {
        return absl::InvalidArgumentError(absl::StrCat(
            "int ", *i, " out of range for a ", sizeof(T) * 8, "-bit ",
            std::is_signed_v<T> ? "" : "un", "signed integer"));
      }
    }
    return static_cast<T>(*i);
  }
};

// Doubles; an int Value converts to floating point too.
template <typename T>
struct ValueConverter<T, std::enable_if_t<std::is_floating_point_v<T>>> {
  // As a Value.
  static Value To(T x) { return Value::Double(static_cast<double>(x)); }
  // Or KindMismatch.
  static absl::StatusOr<T> From(const Value& v) {
    if (const double* d = v.if_double()) return static_cast<T>(*d);
    if (const int64_t* i = v.if_int()) return static_cast<T>(*i);
    return KindMismatch("double", v);
  }
};

template <>
struct ValueConverter<std::string> {
  // As a Value.
  static Value To(const std::string& s) { return Value::String(s); }
  // Or KindMismatch.
  static absl::StatusOr<std::string> From(const Value& v) {
    if (const std::string* s = v.if_string()) return *s;
    return KindMismatch("string", v);
  }
};

// Text, To only (read it back as std::string).
template <>
struct ValueConverter<absl::string_view> {
  // As a Value.
  static Value To(absl::string_view s) { return Value::String(std::string(s)); }
};

// Text, To only (read it back as std::string).
template <>
struct ValueConverter<const char*> {
  static Value To(const char* s) { return Value::String(s); }  // As a Value.
};

// Bytes <-> a bytes Value.
template <>
struct ValueConverter<Bytes> {
  // As a Value.
  static Value To(const Bytes& b) { return Value::FromBytes(b); }
  // Or KindMismatch.
  static absl::StatusOr<Bytes> From(const Value& v) {
    if (const Bytes* b = v.if_bytes()) return *b;
    return KindMismatch("bytes", v);
  }
};

// Tensor <-> a tensor Value (sharing its elements).
template <>
struct ValueConverter<Tensor> {
  // As a Value.
  static Value To(const Tensor& t) { return Value::FromTensor(t); }
  // Or KindMismatch.
  static absl::StatusOr<Tensor> From(const Value& v) {
    if (const Tensor* t = v.if_tensor()) return *t;
    return KindMismatch("tensor", v);
  }
};

// RRefHandle <-> an rref Value (used by the RRef layer).
template <>
struct ValueConverter<RRefHandle> {
  // As a Value.
  static Value To(const RRefHandle& r) { return Value::FromRRef(r); }
  // Or KindMismatch.
  static absl::StatusOr<RRefHandle> From(const Value& v) {
    if (const RRefHandle* r = v.if_rref()) return *r;
    return KindMismatch("rref", v);
  }
};

// MessageValue <-> a message Value.
template <>
struct ValueConverter<MessageValue> {
  // As a Value.
  static Value To(const MessageValue& m) { return Value::FromMessage(m); }
  // Or KindMismatch.
  static absl::StatusOr<MessageValue> From(const Value& v) {
    if (const MessageValue* m = v.if_message()) return *m;
    return KindMismatch("message", v);
  }
};

template <typename T>
struct ValueConverter<std::optional<T>> {
  // As a Value.
  static Value To(const std::optional<T>& o) {
    return o ? ToValue(*o) : Value::None();
  }
  static absl::StatusOr<std::optional<T>> From(const Value& v) {
    if (v.is_none()) return std::optional<T>();
    absl::StatusOr<T> x = FromValue<T>(v);
    if (!x.ok()) return x.status();
    return std::optional<T>(*std::move(x));
  }
};

template <typename T>
struct ValueConverter<std::vector<T>> {
  // As a Value.
  static Value To(const std::vector<T>& xs) {
    Value::List l;
    l.reserve(xs.size());
    for (const auto& x : xs) l.push_back(ToValue(static_cast<const T&>(x)));
    return Value::FromList(std::move(l));
  }
  static absl::StatusOr<std::vector<T>> From(const Value& v) {
    const Value::List* l = v.if_list();
    if (l == nullptr) return KindMismatch("list", v);
    std::vector<T> out;
    out.reserve(l->size());
    for (size_t i = 0; i < l->size(); ++i) {
      absl::StatusOr<T> x = FromValue<T>((*l)[i]);
      if (!x.ok()) return Annotate(x.status(), absl::StrCat("[", i, "]"));
      out.push_back(*std::move(x));
    }
    return out;
  }
};

template <typename T>
struct ValueConverter<std::map<std::string, T>> {
  // As a Value.
  static Value To(const std::map<std::string, T>& xs) {
    Value::Dict d;
    for (const auto& [k, x] : xs) d.emplace(k, ToValue(x));
    return Value::FromDict(std::move(d));
  }
  static absl::StatusOr<std::map<std::string, T>> From(const Value& v) {
    const Value::Dict* d = v.if_dict();
    if (d == nullptr) return KindMismatch("dict", v);
    std::map<std::string, T> out;
    for (const auto& [k, x] : *d) {
      absl::StatusOr<T> y = FromValue<T>(x);
      if (!y.ok()) return Annotate(y.status(), absl::StrCat("['", k, "']"));
      out.emplace(k, *std::move(y));
    }
    return out;
  }
};

template <typename... Ts>
struct ValueConverter<std::tuple<Ts...>> {
  // As a Value.
  static Value To(const std::tuple<Ts...>& t) {
    return std::apply(
        [](const auto&... xs) {
          return Value::FromList(Value::List{ToValue(xs)...});
        },
        t);
  }
  static absl::StatusOr<std::tuple<Ts...>> From(const Value& v) {
    const Value::List* l = v.if_list();
    if (l == nullptr)
      return KindMismatch(absl::StrCat("list of ", sizeof...(Ts)), v);
    if (l->size() != sizeof...(Ts)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "expected a list of ", sizeof...(Ts), " elements, got ", l->size()));
    }
    return FromList(*l, std::index_sequence_for<Ts...>());
  }

 private:
  template <size_t... I>
  static absl::StatusOr<std::tuple<Ts...>> FromList(const Value::List& l,
                                                    std::index_sequence<I...>) {
    std::tuple<absl::StatusOr<Ts>...> parts{FromValue<Ts>(l[I])...};
    absl::Status st;
    ((st.ok() && !std::get<I>(parts).ok()
          ? (void)(st = Annotate(std::get<I>(parts).status(),
                                 absl::StrCat("[", I, "]")))
          : (void)0),
     ...);
    if (!st.ok()) return st;
    return std::tuple<Ts...>(*std::move(std::get<I>(parts))...);
  }
};

template <typename A, typename B>
struct ValueConverter<std::pair<A, B>> {
  // As a Value.
  static Value To(const std::pair<A, B>& p) {
    return ToValue(std::tuple<A, B>(p.first, p.second));
  }
  static absl::StatusOr<std::pair<A, B>> From(const Value& v) {
    absl::StatusOr<std::tuple<A, B>> t = FromValue<std::tuple<A, B>>(v);
    if (!t.ok()) return t.status();
    return std::pair<A, B>(std::get<0>(*std::move(t)),
                           std::get<1>(*std::move(t)));
  }
};

}  // namespace ferry

#endif  // FERRY_TENSOR_VALUE_H_
