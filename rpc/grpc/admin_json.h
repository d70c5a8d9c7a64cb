// JSON (google.protobuf.Value) <-> ferry Value for the admin Invoke method.
//
// JSON -> Value: null, bool, number (integral and within int64: Int, else
// Double), string, array (List), object (Dict), and an object with "dtype",
// "shape" and "data" keys is a CPU tensor. Value -> JSON: the inverse, with
// tensors rendered as dtype, shape, numel and a bounded flattened preview,
// bytes as base64, RRefs and protobuf messages as their debug strings.
//
// Errors: InvalidArgument naming the path of the offending element
// ("args[1].shape"). Thread safety: stateless functions.
#ifndef FERRY_RPC_GRPC_ADMIN_JSON_H_
#define FERRY_RPC_GRPC_ADMIN_JSON_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "google/protobuf/struct.pb.h"
#include "ferry/tensor/value.h"

namespace ferry::rpc::grpc_agent {

// Bounds what a JSON tensor may allocate (elements).
inline constexpr int64_t kMaxJsonTensorElements = 1 << 20;

absl::StatusOr<Value> JsonToValue(const google::protobuf::Value& json,
                                  const std::string& path);

google::protobuf::Value ValueToJson(const Value& value,
                                    int64_t tensor_preview = 16);

}  // namespace ferry::rpc::grpc_agent

#endif  // FERRY_RPC_GRPC_ADMIN_JSON_H_
