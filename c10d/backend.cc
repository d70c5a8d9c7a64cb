#include "ferry/c10d/backend.h"

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "ferry/common/status.h"

namespace ferry {
namespace c10d {

Backend::Backend(std::string name, int rank, int size, absl::Duration timeout)
    : name_(std::move(name)), rank_(rank), size_(size), timeout_(timeout) {}

Backend::~Backend() = default;

std::string Backend::Describe(OpType op) const {
  return absl::StrCat(name_, " ", OpTypeName(op), " (rank ", rank_, " of ",
                      size_, ")");
}

std::shared_ptr<Work> Backend::Unimplemented(OpType op) const {
  return Work::Completed(
      Describe(op),
      absl::UnimplementedError(absl::StrCat(
          "backend '", name_, "' does not implement ", OpTypeName(op))));
}

std::shared_ptr<Work> Backend::Fail(OpType op,
                                    const absl::Status& status) const {
  std::string description = Describe(op);
  return Work::Completed(description, Annotate(status, description));
}

std::shared_ptr<Work> Backend::Allreduce(Tensor, const AllreduceOptions&) {
  return Unimplemented(OpType::kAllreduce);
}
std::shared_ptr<Work> Backend::Broadcast(Tensor, const BroadcastOptions&) {
  return Unimplemented(OpType::kBroadcast);
}
std::shared_ptr<Work> Backend::Reduce(Tensor, const ReduceOptions&) {
  return Unimplemented(OpType::kReduce);
}
std::shared_ptr<Work> Backend::Allgather(std::vector<Tensor>, Tensor,
                                         const AllgatherOptions&) {
  return Unimplemented(OpType::kAllgather);
}
std::shared_ptr<Work> Backend::Gather(std::vector<Tensor>, Tensor,
                                      const GatherOptions&) {
  return Unimplemented(OpType::kGather);
}
std::shared_ptr<Work> Backend::Scatter(Tensor, std::vector<Tensor>,
                                       const ScatterOptions&) {
  return Unimplemented(OpType::kScatter);
}
std::shared_ptr<Work> Backend::ReduceScatter(Tensor, std::vector<Tensor>,
                                             const ReduceScatterOptions&) {
  return Unimplemented(OpType::kReduceScatter);
}
std::shared_ptr<Work> Backend::Alltoall(std::vector<Tensor>,
                                        std::vector<Tensor>,
                                        const AlltoallOptions&) {
  return Unimplemented(OpType::kAlltoall);
}
std::shared_ptr<Work> Backend::Barrier(const BarrierOptions&) {
  return Unimplemented(OpType::kBarrier);
}
std::shared_ptr<Work> Backend::Send(Tensor, int, const SendOptions&) {
  return Unimplemented(OpType::kSend);
}
std::shared_ptr<Work> Backend::Recv(Tensor, int, const RecvOptions&) {
  return Unimplemented(OpType::kRecv);
}
std::shared_ptr<Work> Backend::AllgatherIntoTensor(Tensor, Tensor,
                                                   const AllgatherOptions&) {
  return Unimplemented(OpType::kAllgatherIntoTensor);
}
std::shared_ptr<Work> Backend::ReduceScatterTensor(
    Tensor, Tensor, const ReduceScatterOptions&) {
  return Unimplemented(OpType::kReduceScatterTensor);
}
std::shared_ptr<Work> Backend::AlltoallSingle(Tensor, Tensor,
                                              const AlltoallSingleOptions&) {
  return Unimplemented(OpType::kAlltoallSingle);
}
std::shared_ptr<Work> Backend::RecvAnysource(Tensor, const RecvOptions&) {
  return Unimplemented(OpType::kRecvAnysource);
}

std::vector<std::shared_ptr<Work>> Backend::BatchIsendIrecv(
    std::vector<P2POp> ops) {
  std::vector<std::shared_ptr<Work>> works;
  works.reserve(ops.size());
  for (P2POp& op : ops) {
    if (op.kind == P2POp::Kind::kSend) {
      works.push_back(Send(std::move(op.tensor), op.peer, {.tag = op.tag}));
    } else {
      works.push_back(Recv(std::move(op.tensor), op.peer, {.tag = op.tag}));
    }
  }
  return works;
}

namespace {

// Ranks (other than 0) whose flag in `late` is set, as "1, 3".
std::string LateRanks(const std::vector<uint8_t>& late) {
  std::vector<int> ranks;
  for (size_t r = 1; r < late.size(); ++r) {
    if (late[r] != 0) ranks.push_back(static_cast<int>(r));
  }
  return absl::StrJoin(ranks, ", ");
}

}  // namespace

absl::Status Backend::MonitoredBarrier(const MonitoredBarrierOptions& options) {
  const absl::Duration timeout = TimeoutOr(options.timeout);
  const std::string what = Describe(OpType::kMonitoredBarrier);
  if (size_ == 1) return absl::OkStatus();
  constexpr int kTag = kMonitoredBarrierTag;
  if (rank_ != 0) {
    // Arrive, then wait for rank 0's verdict: one flag per rank, set for the
    // late ones. Rank 0 may itself wait a full timeout for others.
    RETURN_IF_ERROR(Annotate(
        Send(zeros({1}, DType::kUInt8), 0, {.tag = kTag, .timeout = timeout})
            ->Wait(timeout),
        what));
    Tensor verdict = zeros({size_}, DType::kUInt8);
    absl::Status got = Recv(verdict, 0, {.tag = kTag, .timeout = 2 * timeout})
                           ->Wait(2 * timeout);
    if (!got.ok()) {
      return absl::DeadlineExceededError(absl::StrCat(
          what, ": rank 0 gave no verdict within ",
          absl::FormatDuration(2 * timeout), " (", got.message(), ")"));
    }
    std::vector<uint8_t> late = verdict.to_vector<uint8_t>();
    std::string names = LateRanks(late);
    if (names.empty()) return absl::OkStatus();
    return absl::DeadlineExceededError(
        absl::StrCat(what, ": rank(s) ", names, " did not arrive within ",
                     absl::FormatDuration(timeout)));
  }
  // Rank 0: post a receive from every rank, wait against one deadline.
  std::vector<std::shared_ptr<Work>> arrivals(size_);
  for (int r = 1; r < size_; ++r) {
    // The receive outlives the judgement at `timeout`: gloo closes every
    // pair when a wait expires, which would stop the verdicts below.
    arrivals[r] = Recv(zeros({1}, DType::kUInt8), r,
                       {.tag = kTag, .timeout = 3 * timeout});
  }
  const absl::Time deadline = absl::Now() + timeout;
  std::vector<uint8_t> late(size_, 0);
  for (int r = 1; r < size_; ++r) {
    absl::Duration left =
        std::max(deadline - absl::Now(), absl::ZeroDuration());
    if (!arrivals[r]->Wait(left).ok()) {
      late[r] = 1;
      if (!options.wait_all_ranks) break;
    }
  }
  Tensor verdict = from_vector<uint8_t>(late, {size_});
  for (int r = 1; r < size_; ++r) {
    // Ranks that arrived get the verdict; a late rank's send may never come.
    if (late[r] == 0 && arrivals[r]->IsSuccess()) {
      Send(verdict, r, {.tag = kTag, .timeout = timeout})
          ->Wait(timeout)
          .IgnoreError();
    }
  }
  std::string names = LateRanks(late);
  if (names.empty()) return absl::OkStatus();
  return absl::DeadlineExceededError(
      absl::StrCat(what, ": rank(s) ", names, " did not arrive within ",
                   absl::FormatDuration(timeout)));
}

namespace {

std::string ShapeString(const Tensor& t) {
  return absl::StrCat(DTypeName(t.dtype()), "[", absl::StrJoin(t.sizes(), ", "),
                      "] on ", t.device().ToString());
}

}  // namespace

absl::Status CheckTensor(OpType op, const Tensor& t, absl::string_view what) {
  if (!t.defined()) {
    return absl::InvalidArgumentError(
        absl::StrCat(OpTypeName(op), ": ", what, " is an undefined tensor"));
  }
  if (!t.is_contiguous()) {
    return absl::InvalidArgumentError(
        absl::StrCat(OpTypeName(op), ": ", what, " (", ShapeString(t),
                     ") is not contiguous; pass t.contiguous() and copy back"));
  }
  return absl::OkStatus();
}

absl::Status CheckRank(OpType op, int root, int size, absl::string_view what) {
  if (root < 0 || root >= size) {
    return absl::InvalidArgumentError(absl::StrCat(
        OpTypeName(op), ": ", what, " ", root, " is not in [0, ", size, ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckTensorList(OpType op, const std::vector<Tensor>& list,
                             size_t count, const Tensor& like,
                             absl::string_view what) {
  if (list.size() != count) {
    return absl::InvalidArgumentError(
        absl::StrCat(OpTypeName(op), ": ", what, " has ", list.size(),
                     " tensors, expected ", count));
  }
  for (size_t i = 0; i < list.size(); ++i) {
    RETURN_IF_ERROR(CheckTensor(op, list[i], absl::StrCat(what, "[", i, "]")));
    if (list[i].dtype() != like.dtype() || list[i].sizes() != like.sizes() ||
        list[i].device() != like.device()) {
      return absl::InvalidArgumentError(
          absl::StrCat(OpTypeName(op), ": ", what, "[", i, "] is ",
                       ShapeString(list[i]), ", expected ", ShapeString(like)));
    }
  }
  return absl::OkStatus();
}

int64_t ElementsPerRow(const Tensor& t) {
  int64_t per_row = 1;
  for (size_t d = 1; d < t.sizes().size(); ++d) per_row *= t.sizes()[d];
  return per_row;
}

bool SharesBytes(const Tensor& a, const Tensor& b) {
  const char* x = static_cast<const char*>(a.data_ptr());
  const char* y = static_cast<const char*>(b.data_ptr());
  return x < y + b.nbytes() && y < x + a.nbytes();
}

absl::Status CheckReduceOp(OpType op, ReduceOp reduce_op, DType dtype) {
  switch (reduce_op) {
    case ReduceOp::kAvg:
      if (!IsFloatingPoint(dtype)) {
        return absl::InvalidArgumentError(absl::StrCat(
            OpTypeName(op), ": ReduceOp AVG needs a floating dtype, got ",
            DTypeName(dtype)));
      }
      break;
    case ReduceOp::kBand:
    case ReduceOp::kBor:
    case ReduceOp::kBxor:
      if (IsFloatingPoint(dtype)) {
        return absl::InvalidArgumentError(absl::StrCat(
            OpTypeName(op), ": ReduceOp ", ReduceOpName(reduce_op),
            " needs an integral or bool dtype, got ", DTypeName(dtype)));
      }
      break;
    case ReduceOp::kSum:
    case ReduceOp::kProduct:
    case ReduceOp::kMin:
    case ReduceOp::kMax:
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          OpTypeName(op), ": unknown ReduceOp ", static_cast<int>(reduce_op)));
  }
  return absl::OkStatus();
}

absl::Status CopyStatus(const absl::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(status.code(), std::string(status.message()));
}

absl::Status ArgChecks::One(OpType op, const Tensor& t,
                            absl::string_view what) const {
  RETURN_IF_ERROR(CheckTensor(op, t, what));
  if (t.device().type != device_) {
    return absl::InvalidArgumentError(
        absl::StrCat(OpTypeName(op), ": the ", backend_, " backend takes ",
                     device_ == DeviceType::kCPU ? "CPU" : "CUDA", " tensors, ",
                     what, " is on ", t.device().ToString()));
  }
  return absl::OkStatus();
}

absl::Status ArgChecks::Rooted(OpType op, const Tensor& t,
                               absl::string_view what, int root) const {
  RETURN_IF_ERROR(One(op, t, what));
  return CheckRank(op, root, size_, "root");
}

absl::Status ArgChecks::WithList(OpType op, const Tensor& t,
                                 absl::string_view what,
                                 const std::vector<Tensor>& list,
                                 absl::string_view list_what) const {
  RETURN_IF_ERROR(One(op, t, what));
  return CheckTensorList(op, list, size_, t, list_what);
}

absl::Status ArgChecks::RootedWithList(OpType op, const Tensor& t,
                                       absl::string_view what, int root,
                                       const std::vector<Tensor>& list,
                                       absl::string_view list_what) const {
  RETURN_IF_ERROR(Rooted(op, t, what, root));
  if (rank_ == root) return CheckTensorList(op, list, size_, t, list_what);
  return CheckTensorList(op, list, 0, t,
                         absl::StrCat(list_what, " (non-root)"));
}

absl::Status ArgChecks::Alltoall(const std::vector<Tensor>& outputs,
                                 const std::vector<Tensor>& inputs) const {
  constexpr OpType kOp = OpType::kAlltoall;
  if (inputs.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        OpTypeName(kOp), ": inputs has 0 tensors, expected ", size_));
  }
  RETURN_IF_ERROR(WithList(kOp, inputs[0], "inputs[0]", inputs, "inputs"));
  return CheckTensorList(kOp, outputs, size_, inputs[0], "outputs");
}

absl::Status ArgChecks::Flat(OpType op, const Tensor& big,
                             absl::string_view big_what, const Tensor& small,
                             absl::string_view small_what) const {
  RETURN_IF_ERROR(One(op, big, big_what));
  RETURN_IF_ERROR(One(op, small, small_what));
  if (big.dtype() != small.dtype() ||
      big.numel() != small.numel() * static_cast<int64_t>(size_)) {
    return absl::InvalidArgumentError(absl::StrCat(
        OpTypeName(op), ": ", big_what, " (", ShapeString(big),
        ") must have the dtype of ", small_what, " (", ShapeString(small),
        ") and ", size_, " times its elements"));
  }
  return absl::OkStatus();
}

namespace {

absl::Status ResolveSplits(OpType op, const Tensor& t, absl::string_view what,
                           const std::vector<int64_t>& splits, int size,
                           std::vector<int64_t>* rows) {
  const int64_t dim0 = t.sizes()[0];
  if (splits.empty()) {
    if (dim0 % size != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(OpTypeName(op), ": ", what, " has ", dim0,
                       " rows, not divisible by the group size ", size,
                       "; give split sizes"));
    }
    rows->assign(size, dim0 / size);
    return absl::OkStatus();
  }
  if (splits.size() != static_cast<size_t>(size)) {
    return absl::InvalidArgumentError(
        absl::StrCat(OpTypeName(op), ": ", what, " split sizes has ",
                     splits.size(), " entries, expected ", size));
  }
  int64_t sum = 0;
  for (int64_t v : splits) {
    if (v < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          OpTypeName(op), ": ", what, " split size ", v, " is negative"));
    }
    sum += v;
  }
  if (sum != dim0) {
    return absl::InvalidArgumentError(
        absl::StrCat(OpTypeName(op), ": ", what, " split sizes sum to ", sum,
                     " but it has ", dim0, " rows"));
  }
  *rows = splits;
  return absl::OkStatus();
}

}  // namespace

absl::Status ArgChecks::AlltoallSingle(const Tensor& output,
                                       const Tensor& input,
                                       const AlltoallSingleOptions& options,
                                       std::vector<int64_t>* out_rows,
                                       std::vector<int64_t>* in_rows) const {
  constexpr OpType kOp = OpType::kAlltoallSingle;
  RETURN_IF_ERROR(One(kOp, output, "output"));
  RETURN_IF_ERROR(One(kOp, input, "input"));
  auto row_shape = [](const Tensor& t) {
    std::vector<int64_t> s = t.sizes();
    s.erase(s.begin());
    return s;
  };
  if (output.dim() < 1 || input.dim() < 1 || output.dtype() != input.dtype() ||
      row_shape(output) != row_shape(input)) {
    return absl::InvalidArgumentError(absl::StrCat(
        OpTypeName(kOp), ": output (", ShapeString(output), ") and input (",
        ShapeString(input), ") need dim >= 1, one dtype and one row shape"));
  }
  RETURN_IF_ERROR(ResolveSplits(kOp, output, "output",
                                options.output_split_sizes, size_, out_rows));
  return ResolveSplits(kOp, input, "input", options.input_split_sizes, size_,
                       in_rows);
}

absl::Status ArgChecks::PointToPoint(OpType op, const Tensor& t, int peer,
                                     int tag) const {
  const absl::string_view role = op == OpType::kSend ? "destination" : "source";
  RETURN_IF_ERROR(One(op, t, "tensor"));
  RETURN_IF_ERROR(CheckRank(op, peer, size_, absl::StrCat(role, " rank")));
  if (peer == rank_) {
    return absl::InvalidArgumentError(
        absl::StrCat(OpTypeName(op), ": ", role, " is this rank"));
  }
  if (tag < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(OpTypeName(op), ": tag ", tag, " is negative"));
  }
  return absl::OkStatus();
}

}  // namespace c10d
}  // namespace ferry
