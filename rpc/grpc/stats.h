// Per-function call statistics of an agent, for the admin service.
//
// Counts calls, errors and bytes in each direction, and keeps the most recent
// latencies (a bounded ring per function and direction) for percentiles.
//
// Entries are keyed by names a client chooses (a call to an unregistered
// function is recorded too, with its NotFound), so memory is bounded: a name
// is cut to kMaxNameBytes, and once kMaxFunctions names are tracked, calls
// under any new name count under kOtherName.
//
// Thread safety: all methods are safe from any thread.
#ifndef FERRY_RPC_GRPC_STATS_H_
#define FERRY_RPC_GRPC_STATS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "ferry/common/sync.h"
#include "ferry/proto/admin.pb.h"

namespace ferry::rpc {

class RpcStats {
 public:
  enum class Direction { kIn, kOut };

  static constexpr size_t kMaxFunctions = 256;
  static constexpr size_t kMaxNameBytes = 128;
  static constexpr const char kOtherName[] = "(other)";

  void Record(Direction dir, const std::string& function,
              absl::Duration latency, bool error, uint64_t bytes_in,
              uint64_t bytes_out);

  ferry::admin::v1::GetStatsResponse Snapshot() const;

 private:
  static constexpr size_t kWindow = 1024;

  struct Ring {
    std::vector<double> us;
    size_t next = 0;
    void Add(double v);
    double Percentile(double p) const;
  };
  struct PerFunction {
    uint64_t calls[2] = {0, 0};
    uint64_t errors[2] = {0, 0};
    uint64_t bytes_in = 0;
    uint64_t bytes_out = 0;
    Ring latency[2];
  };

  mutable Mutex mu_;
  std::map<std::string, PerFunction, std::less<>> functions_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace ferry::rpc

#endif  // FERRY_RPC_GRPC_STATS_H_
