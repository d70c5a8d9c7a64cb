#include "c10d/backend.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"

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
