// DistributedDataParallel: data-parallel training over a c10d ProcessGroup.
//
//   ASSIGN_OR_RETURN(auto ddp, DistributedDataParallel::Create(model, pg));
//   for (...) {
//     model->ZeroGrad();
//     Tensor loss = loss_fn(ddp->Forward(shard_x), shard_y);
//     RETURN_IF_ERROR(ddp->Backward(loss));  // .grad = average over ranks
//     optimizer step on model->parameters();
//   }
//
// Options: DdpOptions (reducer.h), listed in docs/guide/ddp.md.
//
// Errors: a failed or timed-out collective, or a parameter that got no
// gradient while find_unused_parameters is off, makes Backward return an
// error and leaves this DDP broken (every later Backward fails): the
// ranks' collective sequences are out of step, so make a new group and
// Reconfigure onto it (fault tolerance: docs/design/ddp_quorum.md).
//
// Thread safety: one training thread drives a DDP (Forward/Backward/
// NoSync); Create is collective. The DDP must outlive nothing in particular:
// hooks left on the parameters hold the reducer weakly.
// Design: docs/design/ddp.md
#ifndef FERRY_DDP_DISTRIBUTED_DATA_PARALLEL_H_
#define FERRY_DDP_DISTRIBUTED_DATA_PARALLEL_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ferry/autograd/nn.h"
#include "ferry/c10d/process_group.h"
#include "ferry/ddp/reducer.h"
#include "ferry/tensor/tensor.h"

namespace ferry::ddp {

// DDP's options are the Reducer's (reducer.h).
using DdpOptions = ReducerOptions;

// Checks that every rank of `pg` holds parameters of the same count, dtypes
// and shapes (see above). Collective.
absl::Status VerifyParameters(
    c10d::ProcessGroup& pg,
    const std::vector<std::pair<std::string, Tensor>>& named_params,
    absl::Duration timeout);

// Broadcasts each of `tensors` in place from `root` of `pg` (e.g. optimizer
// state to a replacement rank after DistributedDataParallel::Reconfigure).
// Collective; errors name the tensor index and the group.
absl::Status BroadcastTensors(c10d::ProcessGroup& pg,
                              const std::vector<Tensor>& tensors, int root,
                              absl::Duration timeout);

// Averages the gradients of a model's replicas over the ranks of a group
// during backward (see the top of this file).
class DistributedDataParallel {
 public:
  // Collective: every rank calls Create with the same group. All-gathers
  // every rank's parameter count, dtypes and shapes; on any difference every
  // rank fails with InvalidArgument naming the first differing parameter (by
  // index and this rank's name) and the first rank that differs from rank 0.
  // Then rank 0's parameter values are broadcast. (Modules have no buffers
  // yet, so there are none to broadcast.)
  //
  // Wraps a module (Forward runs it) ...
  static absl::StatusOr<std::unique_ptr<DistributedDataParallel>> Create(
      std::shared_ptr<nn::Module> module,
      std::shared_ptr<c10d::ProcessGroup> pg, DdpOptions options = {});
  // ... or a plain set of named parameters (Forward unavailable).
  static absl::StatusOr<std::unique_ptr<DistributedDataParallel>> Create(
      std::vector<std::pair<std::string, Tensor>> named_params,
      std::shared_ptr<c10d::ProcessGroup> pg, DdpOptions options = {});

  // The wrapped module's forward. Aborts when created from parameters.
  Tensor Forward(const Tensor& input);

  // Runs the autograd pass from `loss` with the Reducer's hooks active
  // (reducer.h: bucketed all-reduce overlapped with backward) and returns
  // once every parameter's .grad holds the average over ranks. After a
  // synchronized pass every parameter has a .grad (zeros from ranks where it
  // was unused). Errors: see the top of this file.
  absl::Status Backward(const Tensor& loss);
  // For custom loops: PrepareForBackward(outputs), any autograd backward
  // over the loss, then FinishBackward, which waits for the reductions.
  absl::Status PrepareForBackward(const std::vector<Tensor>& outputs);
  // Ends a pass begun with PrepareForBackward (see there).
  absl::Status FinishBackward();

  // While a NoSyncGuard lives, Backward only accumulates locally; the next
  // synchronized Backward reduces the accumulated sum. Not thread-safe.
  class NoSyncGuard {
   public:
    // Turns synchronization off for `ddp` until destroyed.
    explicit NoSyncGuard(DistributedDataParallel* ddp)
        : ddp_(ddp), prev_(ddp->sync_) {
      ddp_->sync_ = false;
    }
    ~NoSyncGuard() { ddp_->sync_ = prev_; }
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    DistributedDataParallel* ddp_;
    bool prev_;
  };
  // Local accumulation only while the guard lives.
  [[nodiscard]] NoSyncGuard NoSync() { return NoSyncGuard(this); }
  // False while a NoSyncGuard lives.
  bool require_grad_sync() const { return sync_; }

  // Moves this DDP onto a new group `pg` (fault tolerance after a failed
  // collective; docs/design/ddp_quorum.md). Collective over `pg`, issuing
  // exactly what Create issues, so survivors calling Reconfigure meet a
  // replacement calling Create: parameters verified, then broadcast from
  // rank 0 of `pg`, then a fresh Reducer (buckets in registration order,
  // rebuilt after its first pass) replaces the old one, which may be broken.
  // Not during a pass. This DDP drops its reference to the old group; the
  // old Reducer's hooks stay on the parameters and return at once. Errors:
  // Create's; the DDP keeps its old (broken) reducer then.
  absl::Status Reconfigure(std::shared_ptr<c10d::ProcessGroup> pg);

  // The Reducer that buckets and all-reduces the gradients.
  Reducer& reducer() { return *reducer_; }
  // The group the gradients are averaged over.
  c10d::ProcessGroup& process_group() { return *pg_; }

 private:
  DistributedDataParallel(
      std::shared_ptr<nn::Module> module,
      std::vector<std::pair<std::string, Tensor>> named_params,
      DdpOptions options, std::shared_ptr<c10d::ProcessGroup> pg,
      std::shared_ptr<Reducer> reducer)
      : module_(std::move(module)),
        named_params_(std::move(named_params)),
        options_(std::move(options)),
        pg_(std::move(pg)),
        reducer_(std::move(reducer)) {}

  std::shared_ptr<nn::Module> module_;
  const std::vector<std::pair<std::string, Tensor>> named_params_;
  const DdpOptions options_;
  std::shared_ptr<c10d::ProcessGroup> pg_;
  std::shared_ptr<Reducer> reducer_;
  bool sync_ = true;
};

}  // namespace ferry::ddp

#endif  // FERRY_DDP_DISTRIBUTED_DATA_PARALLEL_H_
