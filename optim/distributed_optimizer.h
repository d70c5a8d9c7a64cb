// DistributedOptimizer: steps parameters where they live, with the gradients
// a distributed autograd context accumulated there (PyTorch's
// torch.distributed.optim.DistributedOptimizer).
//
//   // On every worker, after distributed autograd and RRefs:
//   DistOptimizerService::Install(agent, {.param_mutex = m, .dist = dist});
//   // On the trainer:
//   auto opt = *DistributedOptimizer::Create(agent, SgdOptions{}, params);
//   { ContextScope ctx(*dist); ...forward...;
//     RETURN_IF_ERROR(dist->Backward(ctx.id(), {loss},
//                                    {.fused_optimizer = opt.get()})); }
//   // or Backward(ctx.id(), {loss}) then opt->Step(ctx.id()).
//
// Create makes one functional optimizer per owner of the parameters (ids are
// per service, so several workers or optimizers in one process stay
// independent). Step asks every owner in parallel to apply the context's
// gradients with optim.h's functional step and returns the first error,
// naming the owner; a parameter without a gradient is skipped. Fused
// (BackwardOptions::fused_optimizer): each owner steps a parameter as soon
// as its gradient of the pass is final, with the same step on the same
// gradient (bit-identical to Backward then Step); a failed step fails the
// pass naming owner and parameter. Steps of one owner-side optimizer are
// serialized, as in PyTorch. Destroying the DistributedOptimizer frees its
// owner-side state (waiting up to the timeout per owner; failures logged);
// an owner frees the optimizers of a creator that died or left by itself.
//
// Thread safety: Step may be called from several threads (each with its own
// context). The agent and the service must outlive the optimizer's use.
#ifndef FERRY_OPTIM_DISTRIBUTED_OPTIMIZER_H_
#define FERRY_OPTIM_DISTRIBUTED_OPTIMIZER_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ferry/autograd/dist/dist_autograd.h"
#include "ferry/common/ids.h"
#include "ferry/common/sync.h"
#include "ferry/optim/optim.h"
#include "ferry/rpc/agent.h"
#include "ferry/rref/rref.h"
#include "ferry/tensor/tensor.h"

namespace ferry::optim {

// AdamW: Adam's hyper-parameters with decoupled weight decay (AdamWStep).
struct AdamWOptions : AdamOptions {};

// Which functional optimizer, with its hyper-parameters.
using FunctionalOptions =
    std::variant<SgdOptions, AdamOptions, AdamWOptions, AdagradOptions>;

// The optimizer's own message types (claimed from rpc/, rpc/layer.h; the
// user's function registry is never touched). Requests carry their
// arguments as a list payload: CREATE [kind, hyper-parameters, parameter
// RRefs] (reply: the optimizer id), STEP [optimizer id, context id],
// DESTROY [optimizer id].
inline constexpr rpc::MessageType kOptimCreate =
    static_cast<rpc::MessageType>(40);
// STEP: apply one context's gradients with an optimizer (see above).
inline constexpr rpc::MessageType kOptimStep = static_cast<rpc::MessageType>(41);
// DESTROY: free an optimizer (see above).
inline constexpr rpc::MessageType kOptimDestroy =
    static_cast<rpc::MessageType>(42);

// Owner side: holds the per-owner optimizers and steps them. Install on
// every worker that owns parameters (it serves kOptimCreate, kOptimStep and
// kOptimDestroy on the agent: AlreadyExists when installed twice on one
// agent).
class DistOptimizerService {
 public:
  // Install's settings.
  struct Options {
    // When set, held while any optimizer of this service updates its
    // parameters. Steps of optimizers sharing parameters (one per trainer,
    // as in a parameter server) then never overlap, and the owner's code
    // that reads those parameters concurrently (a forward pass served for
    // another trainer) holds it too, so it never sees a half-done update.
    std::shared_ptr<Mutex> param_mutex;
    // When set (with param_mutex), called with param_mutex held after each
    // parameter an optimizer updated (the tensor updated, as registered by
    // the creator's RRef): a parameter server counts applied updates and
    // snapshots its shard there. Must not block or call back into the
    // service.
    std::function<void(const Tensor& param)> after_update = nullptr;
    // The worker's distributed autograd (required): steps read the
    // gradients of its contexts.
    std::shared_ptr<autograd::dist::DistAutogradContainer> dist;
  };

  // The layers' one install signature (as RRefContext and
  // DistAutogradContainer). InvalidArgument without `options.dist`.
  static absl::StatusOr<std::shared_ptr<DistOptimizerService>> Install(
      rpc::Agent& agent, Options options);

  // Optimizers created here and not yet released.
  size_t num_optimizers() const;
  // Of those, the ones worker `worker_id` created.
  size_t num_optimizers_of(int worker_id) const;
  // Frees the optimizers (and their state) worker `worker_id` created;
  // returns how many. Called by the service itself when the agent's
  // peer-state table records the worker failed or departed (from then on
  // Create refuses it).
  size_t ReleaseWorker(int worker_id);
  // How many optimizers of `worker_id` ReleaseWorker freed so far.
  size_t released_of(int worker_id) const;

 private:
  struct Owned;
  DistOptimizerService(rpc::Agent& agent,
                       std::shared_ptr<autograd::dist::DistAutogradContainer> d,
                       Options options)
      : agent_(agent), dist_(std::move(d)), options_(std::move(options)) {}

  // Returns the new optimizer's id (unique within this service).
  absl::StatusOr<int64_t> Create(int creator, const std::string& kind,
                                 const std::vector<double>& options,
                                 const std::vector<rref::RRef<Tensor>>& params);
  // Steps optimizer `id` with context `context_id`'s gradients, for its
  // creator `caller` alone (PermissionDenied naming both otherwise).
  absl::Status Step(int caller, int64_t id, int64_t context_id);
  // The fused step of one parameter (FusedStepHandler).
  absl::Status StepOne(int64_t id, const Tensor& leaf, const Tensor& grad);
  std::shared_ptr<Owned> Find(int64_t id) const;
  // Frees optimizer `id` for its creator `caller` (PermissionDenied naming
  // both when another worker asks; OK when the id is unknown).
  absl::Status Destroy(int caller, int64_t id);

  rpc::Agent& agent_;
  const std::shared_ptr<autograd::dist::DistAutogradContainer> dist_;
  const Options options_;
  mutable Mutex mu_;
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<int64_t, std::shared_ptr<Owned>> optimizers_ ABSL_GUARDED_BY(mu_);
  std::map<int, size_t> released_of_ ABSL_GUARDED_BY(mu_);
};

// Trainer side.
class DistributedOptimizer : public autograd::dist::FusedOptimizer {
 public:
  // Creates one optimizer per owner of `params` (all RRefs to tensors that
  // require grad). Errors name the owner that refused.
  static absl::StatusOr<std::unique_ptr<DistributedOptimizer>> Create(
      rpc::Agent& agent, FunctionalOptions options,
      const std::vector<rref::RRef<Tensor>>& params,
      absl::Duration timeout = absl::Seconds(60));
  ~DistributedOptimizer() override;
  DistributedOptimizer(const DistributedOptimizer&) = delete;
  DistributedOptimizer& operator=(const DistributedOptimizer&) = delete;

  // Applies context `context_id`'s gradients on every owner, in parallel.
  absl::Status Step(GlobalId context_id);

  // FusedOptimizer: (owner, its optimizer id there) per owner.
  const std::vector<std::pair<int, int64_t>>& FusedSteps() const override {
    return owners_;
  }

 private:
  // (owner worker id, the optimizer's id on that owner).
  using OwnerIds = std::vector<std::pair<int, int64_t>>;
  DistributedOptimizer(rpc::Agent& agent, OwnerIds owners,
                       absl::Duration timeout)
      : agent_(agent), owners_(std::move(owners)), timeout_(timeout) {}

  rpc::Agent& agent_;
  const OwnerIds owners_;
  const absl::Duration timeout_;
};

}  // namespace ferry::optim

#endif  // FERRY_OPTIM_DISTRIBUTED_OPTIMIZER_H_
