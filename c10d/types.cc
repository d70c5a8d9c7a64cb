#include "ferry/c10d/types.h"

namespace ferry {
namespace c10d {

absl::string_view ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "SUM";
    case ReduceOp::kAvg:
      return "AVG";
    case ReduceOp::kProduct:
      return "PRODUCT";
    case ReduceOp::kMin:
      return "MIN";
    case ReduceOp::kMax:
      return "MAX";
    case ReduceOp::kBand:
      return "BAND";
    case ReduceOp::kBor:
      return "BOR";
    case ReduceOp::kBxor:
      return "BXOR";
  }
  return "UNKNOWN_REDUCE_OP";
}

absl::string_view OpTypeName(OpType op) {
  switch (op) {
    case OpType::kAllreduce:
      return "Allreduce";
    case OpType::kBroadcast:
      return "Broadcast";
    case OpType::kReduce:
      return "Reduce";
    case OpType::kAllgather:
      return "Allgather";
    case OpType::kGather:
      return "Gather";
    case OpType::kScatter:
      return "Scatter";
    case OpType::kReduceScatter:
      return "ReduceScatter";
    case OpType::kAlltoall:
      return "Alltoall";
    case OpType::kBarrier:
      return "Barrier";
    case OpType::kSend:
      return "Send";
    case OpType::kRecv:
      return "Recv";
    case OpType::kAllgatherIntoTensor:
      return "AllgatherIntoTensor";
    case OpType::kReduceScatterTensor:
      return "ReduceScatterTensor";
    case OpType::kAlltoallSingle:
      return "AlltoallSingle";
    case OpType::kRecvAnysource:
      return "RecvAnysource";
    case OpType::kMonitoredBarrier:
      return "MonitoredBarrier";
  }
  return "UnknownOp";
}

}  // namespace c10d
}  // namespace ferry
