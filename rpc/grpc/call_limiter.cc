#include "ferry/rpc/grpc/call_limiter.h"

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
  auto it = per_connection_.find(connection);
  if (it == per_connection_.end()) {
    if (per_connection_.size() >= kMaxIdleConnections) PruneIdle();
    it = per_connection_.emplace(connection, 0).first;
  }
  int64_t& mine = it->second;
  if (max_per_connection_ > 0 && mine >= max_per_connection_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "worker '", worker, "' is serving ", mine, " calls from connection ",
        connection, ", its limit (max_inflight_calls_per_connection = ",
        max_per_connection_, ")"));
  }
  ++mine;
  ++total_;
  // The entry stays put while its count is above 0 (PruneIdle skips it), so
  // the slot keeps its address: no lookup or name copy per call.
  int64_t* count = &mine;
  return std::shared_ptr<void>(nullptr,
                               [this, count](void*) { Release(count); });
}

void CallLimiter::Release(int64_t* count) {
  MutexLock lock(&mu_);
  --total_;
  --*count;
}

void CallLimiter::PruneIdle() {
  for (auto it = per_connection_.begin(); it != per_connection_.end();) {
    it = it->second == 0 ? per_connection_.erase(it) : std::next(it);
  }
}

int64_t CallLimiter::in_flight() const {
  MutexLock lock(&mu_);
  return total_;
}

}  // namespace ferry::rpc::grpc_agent
