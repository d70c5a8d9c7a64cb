#include "ferry/common/grpc_status.h"

#include <string>

namespace ferry {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  // Codes outside the canonical range (a misbehaving peer) become kUnknown.
  int code = static_cast<int>(status.error_code());
  absl::StatusCode out = (code > 0 && code <= 16)
                             ? static_cast<absl::StatusCode>(code)
                             : absl::StatusCode::kUnknown;
  return absl::Status(out, status.error_message());
}

}  // namespace ferry
