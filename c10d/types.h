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

// Every ReduceOp, in value order (for tests and loops over them).
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

// Backend::Allreduce's options.
struct AllreduceOptions {
  ReduceOp op = ReduceOp::kSum;  // How values combine.
  std::optional<absl::Duration> timeout = std::nullopt;  // nullopt: default
  // Device tensors: the caller's stream on their device (a StreamHandle,
  // e.g. a cudaStream_t; 0: the legacy default stream). The collective
  // runs after the work queued on it before the call (nccl; backends whose
  // tensors are host memory ignore it).
  uintptr_t stream = 0;
};

// Backend::Broadcast's options.
struct BroadcastOptions {
  int root = 0;  // The rank whose tensor every rank gets.
  std::optional<absl::Duration> timeout = std::nullopt;  // nullopt: default
};

// Backend::Reduce's options.
struct ReduceOptions {
  int root = 0;                  // The rank that gets the result.
  ReduceOp op = ReduceOp::kSum;  // How values combine.
  std::optional<absl::Duration> timeout = std::nullopt;  // nullopt: default
};

// Backend::Allgather's and AllgatherIntoTensor's options.
struct AllgatherOptions {
  std::optional<absl::Duration> timeout = std::nullopt;  // nullopt: default
};

// Backend::Gather's options.
struct GatherOptions {
  int root = 0;  // The rank that gathers.
  std::optional<absl::Duration> timeout = std::nullopt;  // nullopt: default
};

// Backend::Scatter's options.
struct ScatterOptions {
  int root = 0;  // The rank that scatters.
  std::optional<absl::Duration> timeout = std::nullopt;  // nullopt: default
};

// Backend::ReduceScatter's and ReduceScatterTensor's options.
struct ReduceScatterOptions {
  ReduceOp op = ReduceOp::kSum;  // How values combine.
  std::optional<absl::Duration> timeout = std::nullopt;  // nullopt: default
};

// Backend::Alltoall's options.
struct AlltoallOptions {
  std::optional<absl::Duration> timeout = std::nullopt;  // nullopt: default
};

// torch.distributed.all_to_all_single: splits count rows (dim 0) sent to /
// received from each rank; empty means dim 0 divided equally by the group
// size.
struct AlltoallSingleOptions {
  std::vector<int64_t> output_split_sizes;  // Rows received from each rank.
  std::vector<int64_t> input_split_sizes;   // Rows sent to each rank.
  std::optional<absl::Duration> timeout = std::nullopt;  // nullopt: default
};

// Backend::Barrier's options.
struct BarrierOptions {
  std::optional<absl::Duration> timeout = std::nullopt;  // nullopt: default
};

// Point-to-point: a Send matches the Recv on the peer with the same tag
// (>= 0); several with the same (peer, tag) match in issue order.
struct SendOptions {
  int tag = 0;  // Matches the Recv with the same tag.
  std::optional<absl::Duration> timeout = std::nullopt;  // nullopt: default
};

// Backend::Recv's and RecvAnysource's options (see SendOptions).
struct RecvOptions {
  int tag = 0;  // Matches the Send with the same tag.
  std::optional<absl::Duration> timeout = std::nullopt;  // nullopt: default
};

// One entry of a batched point-to-point call (torch.distributed.P2POp).
struct P2POp {
  // Which operation.
  enum class Kind { kSend, kRecv };
  Kind kind = Kind::kSend;           // Which operation.
  Tensor tensor;                     // Sent, or received into.
  int peer = 0;                      // The other rank.
  int tag = 0;                       // As SendOptions::tag.
};

// torch.distributed.monitored_barrier.
struct MonitoredBarrierOptions {
  std::optional<absl::Duration> timeout = std::nullopt;  // nullopt: default
  // Rank 0 waits for every rank (naming all late ones) rather than failing
  // at the first that is late.
  bool wait_all_ranks = false;
};

}  // namespace c10d
}  // namespace ferry

#endif  // FERRY_C10D_TYPES_H_
