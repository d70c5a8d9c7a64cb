#include "optim/distributed_optimizer.h"

#include <atomic>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status.h"

namespace ferry::optim {

namespace {

constexpr char kCreate[] = "ferry.optim.create";
constexpr char kStep[] = "ferry.optim.step";
constexpr char kDestroy[] = "ferry.optim.destroy";

// Hyper-parameters travel as (kind, list of doubles).
std::pair<std::string, std::vector<double>> Encode(const FunctionalOptions& o) {
  if (const auto* s = std::get_if<SgdOptions>(&o)) {
    return {"sgd",
            {s->lr, s->momentum, s->dampening, s->nesterov ? 1.0 : 0.0,
             s->weight_decay}};
  }
  const auto& a = std::get<AdamOptions>(o);
  return {"adam", {a.lr, a.beta1, a.beta2, a.eps, a.weight_decay}};
}

}  // namespace

// One owner-side optimizer: its parameters and functional state.
struct DistOptimizerService::Owned {
  Mutex mu;  // Serializes steps (PyTorch's per-optimizer lock).
  std::vector<Tensor> params;
  FunctionalOptions options;
  SgdState sgd ABSL_GUARDED_BY(mu);
  AdamState adam ABSL_GUARDED_BY(mu);
};

absl::StatusOr<std::shared_ptr<DistOptimizerService>>
DistOptimizerService::Install(
    rpc::Agent& agent,
    std::shared_ptr<autograd::dist::DistAutogradContainer> dist) {
  std::shared_ptr<DistOptimizerService> s(
      new DistOptimizerService(agent, std::move(dist)));
  std::weak_ptr<DistOptimizerService> weak = s;
  auto gone = [] {
    return absl::UnavailableError("the DistOptimizerService was destroyed");
  };
  RETURN_IF_ERROR(agent.Register(
      kCreate,
      [weak, gone](int64_t id, std::string kind, std::vector<double> options,
                   std::vector<rref::RRef<Tensor>> params) {
        std::shared_ptr<DistOptimizerService> self = weak.lock();
        return self ? self->Create(id, kind, options, params) : gone();
      }));
  RETURN_IF_ERROR(
      agent.Register(kStep, [weak, gone](int64_t id, int64_t context) {
        std::shared_ptr<DistOptimizerService> self = weak.lock();
        return self ? self->Step(id, context) : gone();
      }));
  RETURN_IF_ERROR(agent.Register(kDestroy, [weak](int64_t id) {
    if (std::shared_ptr<DistOptimizerService> self = weak.lock()) {
      self->Destroy(id);
    }
  }));
  return s;
}

size_t DistOptimizerService::num_optimizers() const {
  MutexLock l(&mu_);
  return optimizers_.size();
}

absl::Status DistOptimizerService::Create(
    int64_t id, const std::string& kind, const std::vector<double>& o,
    const std::vector<rref::RRef<Tensor>>& params) {
  auto owned = std::make_shared<Owned>();
  if (kind == "sgd" && o.size() == 5) {
    owned->options = SgdOptions{o[0], o[1], o[2], o[3] != 0, o[4]};
  } else if (kind == "adam" && o.size() == 5) {
    owned->options = AdamOptions{o[0], o[1], o[2], o[3], o[4]};
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker '", agent_.self().name, "': unknown optimizer '", kind, "'"));
  }
  for (const rref::RRef<Tensor>& p : params) {
    if (!p.valid() || !p.is_owner()) {
      return absl::InvalidArgumentError(
          absl::StrCat("worker '", agent_.self().name,
                       "' does not own a parameter it was given"));
    }
    absl::StatusOr<Tensor> t = p.local_value();
    if (!t.ok()) return Annotate(t.status(), agent_.self().name);
    owned->params.push_back(*t);  // The owner's tensor object itself.
  }
  MutexLock l(&mu_);
  optimizers_[id] = std::move(owned);
  return absl::OkStatus();
}

absl::Status DistOptimizerService::Step(int64_t id, int64_t context_id) {
  std::shared_ptr<Owned> owned;
  {
    MutexLock l(&mu_);
    auto it = optimizers_.find(id);
    if (it != optimizers_.end()) owned = it->second;
  }
  const std::string where =
      absl::StrCat("worker '", agent_.self().name, "' optimizer step");
  if (owned == nullptr) {
    return absl::NotFoundError(absl::StrCat(where, ": unknown optimizer"));
  }
  absl::StatusOr<autograd::dist::GradientMap> grads = dist_->GetGradients(
      GlobalId::FromValue(static_cast<uint64_t>(context_id)));
  if (!grads.ok()) return Annotate(grads.status(), where);
  std::vector<Tensor> g;
  for (const Tensor& p : owned->params) g.push_back(grads->Get(p));
  MutexLock l(&owned->mu);
  absl::Status s = std::holds_alternative<SgdOptions>(owned->options)
                       ? SgdStep(owned->params, g, owned->sgd,
                                 std::get<SgdOptions>(owned->options))
                       : AdamStep(owned->params, g, owned->adam,
                                  std::get<AdamOptions>(owned->options));
  return Annotate(s, where);
}

void DistOptimizerService::Destroy(int64_t id) {
  MutexLock l(&mu_);
  optimizers_.erase(id);
}

absl::StatusOr<std::unique_ptr<DistributedOptimizer>>
DistributedOptimizer::Create(rpc::Agent& agent, FunctionalOptions options,
                             const std::vector<rref::RRef<Tensor>>& params,
                             absl::Duration timeout) {
  // Unique per creating worker; the worker id makes it unique per job.
  static std::atomic<uint64_t> counter{1};
  const int64_t id = static_cast<int64_t>(
      GlobalId(static_cast<uint16_t>(agent.self().id), counter++).value());
  std::map<int, std::vector<rref::RRef<Tensor>>> by_owner;
  for (const rref::RRef<Tensor>& p : params) {
    if (!p.valid()) return absl::InvalidArgumentError("invalid parameter RRef");
    by_owner[p.owner().id].push_back(p);
  }
  auto [kind, values] = Encode(options);
  std::vector<int> owners;
  std::vector<Future<void>> created;
  for (const auto& [owner, ps] : by_owner) {
    owners.push_back(owner);
    created.push_back(agent.rpc_async_for<void>(timeout, owner, kCreate, id,
                                                kind, values, ps));
  }
  std::unique_ptr<DistributedOptimizer> opt(
      new DistributedOptimizer(agent, id, owners, timeout));
  for (size_t i = 0; i < created.size(); ++i) {
    absl::Status s = created[i].Get();
    if (!s.ok()) {
      return Annotate(
          s, absl::StrCat("creating the optimizer on worker ", owners[i]));
    }
  }
  return opt;
}

DistributedOptimizer::~DistributedOptimizer() {
  std::vector<Future<void>> done;
  for (int owner : owners_) {
    done.push_back(agent_.rpc_async_for<void>(timeout_, owner, kDestroy, id_));
  }
  for (size_t i = 0; i < done.size(); ++i) {
    // Best effort: a dead owner has no state left to free.
    absl::Status s = done[i].Get();
    if (!s.ok()) {
      FERRY_LOG(WARNING) << "freeing optimizer state on worker " << owners_[i]
                         << ": " << s;
    }
  }
}

absl::Status DistributedOptimizer::Step(GlobalId context_id) {
  const int64_t context = static_cast<int64_t>(context_id.value());
  std::vector<Future<void>> steps;
  for (int owner : owners_) {
    steps.push_back(
        agent_.rpc_async_for<void>(timeout_, owner, kStep, id_, context));
  }
  absl::Status first;
  for (size_t i = 0; i < steps.size(); ++i) {
    first.Update(steps[i].Get());  // Each bounded by timeout_.
  }
  return first;
}

}  // namespace ferry::optim
