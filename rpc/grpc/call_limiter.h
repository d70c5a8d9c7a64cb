// Caps on the calls a gRPC agent serves at once (received, not yet
// answered): in total and per client connection, so one client cannot take
// every executor slot and queue entry.
//
// Thread safety: all methods are safe from any thread.
#ifndef FERRY_RPC_GRPC_CALL_LIMITER_H_
#define FERRY_RPC_GRPC_CALL_LIMITER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ferry/common/sync.h"

namespace ferry::rpc::grpc_agent {

class CallLimiter {
 public:
  // Limits <= 0 mean unlimited.
  CallLimiter(int64_t max_total, int64_t max_per_connection)
      : max_total_(max_total), max_per_connection_(max_per_connection) {}

  // Takes a slot for a call from `connection` (gRPC's peer string); the
  // slot is given back when the returned handle is destroyed.
  // ResourceExhausted naming `worker`, the connection and the limit when a
  // cap is reached.
  absl::StatusOr<std::shared_ptr<void>> Acquire(const std::string& connection,
                                                absl::string_view worker);

  int64_t in_flight() const;

 private:
  // Connections whose calls all ended keep their entry (reused by their
  // next call) until this many are known; then idle entries are dropped.
  static constexpr size_t kMaxIdleConnections = 1024;

  void Release(int64_t* count);
  void PruneIdle() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int64_t max_total_;
  const int64_t max_per_connection_;
  mutable Mutex mu_;
  int64_t total_ ABSL_GUARDED_BY(mu_) = 0;
  // Calls in flight per connection (gRPC's peer string).
  std::map<std::string, int64_t, std::less<>> per_connection_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace ferry::rpc::grpc_agent

#endif  // FERRY_RPC_GRPC_CALL_LIMITER_H_
