// Lossless conversion between absl::Status and grpc::Status.
//
// The canonical codes of the two libraries are numerically identical (both
// follow google.rpc.Code), so the code and message carry over unchanged in
// both directions. Kept apart from status.h so that layers without gRPC
// (tensor/, store/, c10d/) never depend on it.
#ifndef FERRY_COMMON_GRPC_STATUS_H_
#define FERRY_COMMON_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace ferry {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace ferry

#endif  // FERRY_COMMON_GRPC_STATUS_H_
