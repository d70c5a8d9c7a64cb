// Protobuf messages as Values (opt-in): include this header to pass or
// return a generated protobuf message type through rpc_sync, remote() and
// the function registry. A message travels serialized, tagged with its full
// type name; FromValue checks the name before parsing (InvalidArgument
// naming both names on a mismatch, or the type when the bytes do not parse).
// Kept out of ferry/tensor/value.h so that the public headers reach no
// protobuf header.
#ifndef FERRY_TENSOR_PROTO_VALUE_H_
#define FERRY_TENSOR_PROTO_VALUE_H_

#include <type_traits>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "ferry/tensor/value.h"
#include "google/protobuf/message.h"

namespace ferry {

// Protobuf messages travel serialized, tagged with their full type name;
// FromValue checks the name before parsing.
template <typename T>
struct ValueConverter<
    T, std::enable_if_t<std::is_base_of_v<google::protobuf::Message, T>>> {
  static Value To(const T& m) {
    return Value::FromMessage(
        MessageValue{m.GetDescriptor()->full_name(), m.SerializeAsString()});
  }
  static absl::StatusOr<T> From(const Value& v) {
    const MessageValue* m = v.if_message();
    if (m == nullptr)
      return KindMismatch(
          absl::StrCat("message ", T::descriptor()->full_name()), v);
    if (m->type_name != T::descriptor()->full_name()) {
      return absl::InvalidArgumentError(
          absl::StrCat("expected message ", T::descriptor()->full_name(),
                       ", got message ", m->type_name));
    }
    T out;
    if (!out.ParseFromString(m->data)) {
      return absl::InvalidArgumentError(
          absl::StrCat("message ", m->type_name, " does not parse"));
    }
    return out;
  }
};

}  // namespace ferry

#endif  // FERRY_TENSOR_PROTO_VALUE_H_
