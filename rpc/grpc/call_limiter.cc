#include "rpc/grpc/call_limiter.h"

#include "absl/strings/str_cat.h"

namespace ferry::rpc::grpc_agent {

absl::StatusOr<std::shared_ptr<void>> CallLimiter::Acquire(
    const std::string& connection, absl::string_view worker) {
  MutexLock lock(&mu_);
  if (max_total_ > 0 && total_ >= max_total_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("worker '", worker, "' is serving ", total_,
                     " calls, its limit (max_inflight_calls = ", max_total_,
                     "); refused a call from ", connection));
  }
  int64_t& mine = per_connection_[connection];
  if (max_per_connection_ > 0 && mine >= max_per_connection_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "worker '", worker, "' is serving ", mine, " calls from connection ",
        connection, ", its limit (max_inflight_calls_per_connection = ",
        max_per_connection_, ")"));
  }
  ++mine;
  ++total_;
  return std::shared_ptr<void>(
      nullptr, [this, connection](void*) { Release(connection); });
}

void CallLimiter::Release(const std::string& connection) {
  MutexLock lock(&mu_);
  --total_;
  auto it = per_connection_.find(connection);
  if (it != per_connection_.end() && --it->second == 0) {
    per_connection_.erase(it);
  }
}

int64_t CallLimiter::in_flight() const {
  MutexLock lock(&mu_);
  return total_;
}

}  // namespace ferry::rpc::grpc_agent
