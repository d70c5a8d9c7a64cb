#include "ferry/ddp/distributed_data_parallel.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ferry/autograd/engine.h"
#include "ferry/common/status.h"

namespace ferry::ddp {
namespace {

// Each rank's copy of `mine` (an int64 vector of the same length everywhere).
absl::StatusOr<std::vector<std::vector<int64_t>>> AllgatherInts(
    c10d::ProcessGroup& pg, const std::vector<int64_t>& mine,
    absl::Duration timeout) {
  Tensor in = from_vector<int64_t>(mine);
  std::vector<Tensor> outs;
  for (int r = 0; r < pg.size(); ++r) outs.push_back(zeros_like(in));
  c10d::AllgatherOptions o;
  o.timeout = timeout;
  RETURN_IF_ERROR(pg.Allgather(outs, in, o)->Wait(timeout));
  std::vector<std::vector<int64_t>> result;
  for (const Tensor& t : outs) result.push_back(t.to_vector<int64_t>());
  return result;
}

// "float32 [4, 3]" from a signature row: dtype, ndim, sizes..., padding.
std::string Describe(const std::vector<int64_t>& row, size_t at) {
  const int64_t ndim = row[at + 1];
  std::vector<int64_t> sizes(row.begin() + at + 2, row.begin() + at + 2 + ndim);
  return absl::StrCat(DTypeName(static_cast<DType>(row[at])), " [",
                      absl::StrJoin(sizes, ", "), "]");
}

}  // namespace

absl::Status VerifyParameters(
    c10d::ProcessGroup& pg,
    const std::vector<std::pair<std::string, Tensor>>& named_params,
    absl::Duration timeout) {
  const int64_t count = static_cast<int64_t>(named_params.size());
  int64_t max_ndim = 0;
  for (const auto& [name, p] : named_params)
    max_ndim = std::max(max_ndim, p.dim());
  ASSIGN_OR_RETURN(auto heads, AllgatherInts(pg, {count, max_ndim}, timeout));
  for (int r = 1; r < pg.size(); ++r) {
    if (heads[r][0] != heads[0][0]) {
      return absl::InvalidArgumentError(
          absl::StrCat("DDP: parameter ", std::min(heads[0][0], heads[r][0]),
                       " differs: rank ", r, " has ", heads[r][0],
                       " parameters, rank 0 has ", heads[0][0]));
    }
    max_ndim = std::max(max_ndim, heads[r][1]);
  }
  // One row per parameter: dtype, ndim, sizes padded with -1.
  const size_t width = 2 + static_cast<size_t>(max_ndim);
  std::vector<int64_t> sig;
  for (const auto& [name, p] : named_params) {
    std::vector<int64_t> row(width, -1);
    row[0] = static_cast<int64_t>(p.dtype());
    row[1] = p.dim();
    std::copy(p.sizes().begin(), p.sizes().end(), row.begin() + 2);
    sig.insert(sig.end(), row.begin(), row.end());
  }
  if (sig.empty()) return absl::OkStatus();
  ASSIGN_OR_RETURN(auto all, AllgatherInts(pg, sig, timeout));
  for (int64_t i = 0; i < count; ++i) {
    const size_t at = static_cast<size_t>(i) * width;
    for (int r = 1; r < pg.size(); ++r) {
      if (!std::equal(all[r].begin() + at, all[r].begin() + at + width,
                      all[0].begin() + at)) {
        return absl::InvalidArgumentError(
            absl::StrCat("DDP: parameter ", i, " ('", named_params[i].first,
                         "' here) differs: rank 0 has ", Describe(all[0], at),
                         ", rank ", r, " has ", Describe(all[r], at)));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status BroadcastTensors(c10d::ProcessGroup& pg,
                              const std::vector<Tensor>& tensors, int root,
                              absl::Duration timeout) {
  std::vector<std::shared_ptr<c10d::Work>> works;
  c10d::BroadcastOptions o;
  o.root = root;
  o.timeout = timeout;
  for (const Tensor& t : tensors) works.push_back(pg.Broadcast(t, o));
  for (size_t i = 0; i < works.size(); ++i) {
    RETURN_IF_ERROR(Annotate(
        works[i]->Wait(timeout),
        absl::StrCat("broadcasting tensor ", i, " of ", works.size(),
                     " from rank ", root, " of group '", pg.name(), "'")));
  }
  return absl::OkStatus();
}

namespace {

absl::Status BroadcastParameters(
    c10d::ProcessGroup& pg,
    const std::vector<std::pair<std::string, Tensor>>& named_params,
    absl::Duration timeout) {
  std::vector<std::shared_ptr<c10d::Work>> works;
  c10d::BroadcastOptions o;
  o.root = 0;
  o.timeout = timeout;
  for (const auto& [name, p] : named_params)
    works.push_back(pg.Broadcast(p, o));
  for (const auto& w : works)
    RETURN_IF_ERROR(Annotate(w->Wait(timeout), "DDP: broadcasting parameters"));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<DistributedDataParallel>>
DistributedDataParallel::Create(std::shared_ptr<nn::Module> module,
                                std::shared_ptr<c10d::ProcessGroup> pg,
                                DdpOptions options) {
  if (module == nullptr) return absl::InvalidArgumentError("DDP: null module");
  ASSIGN_OR_RETURN(auto ddp, Create(module->named_parameters(), std::move(pg),
                                    std::move(options)));
  ddp->module_ = std::move(module);
  return ddp;
}

absl::StatusOr<std::unique_ptr<DistributedDataParallel>>
DistributedDataParallel::Create(
    std::vector<std::pair<std::string, Tensor>> named_params,
    std::shared_ptr<c10d::ProcessGroup> pg, DdpOptions options) {
  if (pg == nullptr) return absl::InvalidArgumentError("DDP: null group");
  RETURN_IF_ERROR(VerifyParameters(*pg, named_params, options.timeout));
  RETURN_IF_ERROR(BroadcastParameters(*pg, named_params, options.timeout));
  ASSIGN_OR_RETURN(auto reducer, Reducer::Create(named_params, pg, options));
  return std::unique_ptr<DistributedDataParallel>(new DistributedDataParallel(
      nullptr, std::move(named_params), std::move(options), std::move(pg),
      std::move(reducer)));
}

absl::Status DistributedDataParallel::Reconfigure(
    std::shared_ptr<c10d::ProcessGroup> pg) {
  if (pg == nullptr) return absl::InvalidArgumentError("DDP: null group");
  RETURN_IF_ERROR(Annotate(
      VerifyParameters(*pg, named_params_, options_.timeout),
      absl::StrCat("DDP reconfigure onto group '", pg->name(), "' as rank ",
                   pg->rank(), " of ", pg->size())));
  RETURN_IF_ERROR(Annotate(
      BroadcastParameters(*pg, named_params_, options_.timeout),
      absl::StrCat("DDP reconfigure onto group '", pg->name(), "'")));
  ASSIGN_OR_RETURN(auto reducer, Reducer::Create(named_params_, pg, options_));
  // The old reducer goes first: its buckets no longer own .grad views.
  reducer_ = std::move(reducer);
  pg_ = std::move(pg);
  return absl::OkStatus();
}

Tensor DistributedDataParallel::Forward(const Tensor& input) {
  if (module_ == nullptr)
    TensorFail("DDP::Forward: created from parameters, not a module");
  return module_->Forward(input);
}

absl::Status DistributedDataParallel::PrepareForBackward(
    const std::vector<Tensor>& outputs) {
  if (!sync_) return absl::OkStatus();
  return reducer_->Prepare(outputs);
}

absl::Status DistributedDataParallel::FinishBackward() {
  if (!sync_) return absl::OkStatus();
  return reducer_->Finish();
}

absl::Status DistributedDataParallel::Backward(const Tensor& loss) {
  if (!sync_) return autograd::Backward({loss});
  RETURN_IF_ERROR(reducer_->Prepare({loss}));
  absl::Status backward = autograd::Backward({loss});
  // Finish even after a failed pass: it drains launched buckets.
  absl::Status finish = reducer_->Finish();
  return backward.ok() ? finish : backward;
}

}  // namespace ferry::ddp
