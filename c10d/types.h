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

#include <optional>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"

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

}  // namespace c10d
}  // namespace ferry

#endif  // FERRY_C10D_TYPES_H_
