// Collective operation kinds, reduction operators and per-call options.
//
// Every option struct carries an optional timeout; nullopt means the
// backend's default (the timeout it was created with). A timeout bounds the
// whole operation from the moment it starts running on the backend (not
// while it waits behind earlier calls in the backend's queue).
//
// Thread safety: plain values; everything here is stateless.
#ifndef FERRY_C10D_TYPES_H_
#define FERRY_C10D_TYPES_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "ferry/tensor/tensor.h"

namespace ferry {
namespace c10d {

// torch.distributed.ReduceOp. AVG divides the sum by the group size (floating
// dtypes only); BAND/BOR/BXOR are for integral and bool dtypes. On bool, SUM
// and MAX are "or", PRODUCT and MIN are "and".
enum class ReduceOp : int {
  kSum = 0,
  kAvg = 1,
  kProduct = 2,
  kMin = 3,
  kMax = 4,
  kBand = 5,
  kBor = 6,
  kBxor = 7,
};

inline constexpr ReduceOp kAllReduceOps[] = {
    ReduceOp::kSum, ReduceOp::kAvg,  ReduceOp::kProduct, ReduceOp::kMin,
    ReduceOp::kMax, ReduceOp::kBand, ReduceOp::kBor,     ReduceOp::kBxor,
};

// "SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR".
absl::string_view ReduceOpName(ReduceOp op);

// The operations a Backend offers (used in error messages and Work names).
enum class OpType : int {
  kAllreduce = 0,
  kBroadcast,
  kReduce,
  kAllgather,
  kGather,
  kScatter,
  kReduceScatter,
  kAlltoall,
  kBarrier,
  kSend,
  kRecv,
  // Added after the first release; values stay stable.
  kAllgatherIntoTensor,
  kReduceScatterTensor,
  kAlltoallSingle,
  kRecvAnysource,
  kMonitoredBarrier,
};

// "Allreduce", "Broadcast", ... (the method names).
absl::string_view OpTypeName(OpType op);

struct AllreduceOptions {
  ReduceOp op = ReduceOp::kSum;
  std::optional<absl::Duration> timeout = std::nullopt;
};

struct BroadcastOptions {
  int root = 0;
  std::optional<absl::Duration> timeout = std::nullopt;
};

struct ReduceOptions {
  int root = 0;
  ReduceOp op = ReduceOp::kSum;
  std::optional<absl::Duration> timeout = std::nullopt;
};

struct AllgatherOptions {
  std::optional<absl::Duration> timeout = std::nullopt;
};

struct GatherOptions {
  int root = 0;
  std::optional<absl::Duration> timeout = std::nullopt;
};

struct ScatterOptions {
  int root = 0;
  std::optional<absl::Duration> timeout = std::nullopt;
};

struct ReduceScatterOptions {
  ReduceOp op = ReduceOp::kSum;
  std::optional<absl::Duration> timeout = std::nullopt;
};

struct AlltoallOptions {
  std::optional<absl::Duration> timeout = std::nullopt;
};

// torch.distributed.all_to_all_single: splits count rows (dim 0) sent to /
// received from each rank; empty means dim 0 divided equally by the group
// size.
struct AlltoallSingleOptions {
  std::vector<int64_t> output_split_sizes;
  std::vector<int64_t> input_split_sizes;
  std::optional<absl::Duration> timeout = std::nullopt;
};

struct BarrierOptions {
  std::optional<absl::Duration> timeout = std::nullopt;
};

// Point-to-point: a Send matches the Recv on the peer with the same tag
// (>= 0); several with the same (peer, tag) match in issue order.
struct SendOptions {
  int tag = 0;
  std::optional<absl::Duration> timeout = std::nullopt;
};

struct RecvOptions {
  int tag = 0;
  std::optional<absl::Duration> timeout = std::nullopt;
};

// One entry of a batched point-to-point call (torch.distributed.P2POp).
struct P2POp {
  enum class Kind { kSend, kRecv };
  Kind kind = Kind::kSend;
  Tensor tensor;
  int peer = 0;
  int tag = 0;
};

// torch.distributed.monitored_barrier.
struct MonitoredBarrierOptions {
  std::optional<absl::Duration> timeout = std::nullopt;
  // Rank 0 waits for every rank (naming all late ones) rather than failing
  // at the first that is late.
  bool wait_all_ranks = false;
};

}  // namespace c10d
}  // namespace ferry

#endif  // FERRY_C10D_TYPES_H_
