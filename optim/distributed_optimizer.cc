#include "ferry/optim/distributed_optimizer.h"

#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "ferry/autograd/node.h"
#include "ferry/common/logging.h"
#include "ferry/common/status.h"
#include "ferry/rpc/layer.h"

namespace ferry::optim {

namespace {

using rpc::Message;

// The peer-state reasons that release a creator's optimizers: it failed
// (the transport found it) or it left the group.
constexpr rpc::PeerDownReasons kReleasingReasons =
    static_cast<rpc::PeerDownReasons>(rpc::PeerDownReason::kTransportFailure) |
    static_cast<rpc::PeerDownReasons>(rpc::PeerDownReason::kDeparted);

absl::Status ClaimMessages() {
  static const rpc::LayerClaim* const kClaim =
      new rpc::LayerClaim{"optim",
                          0,
                          {{40, 49}},
                          {{40, "OPTIM_CREATE"},
                           {41, "OPTIM_STEP"},
                           {42, "OPTIM_DESTROY"}}};
  return rpc::ClaimLayer(*kClaim);
}

// A request of `type` with `args` as its list payload.
template <typename... A>
Message Request(rpc::MessageType type, const A&... args) {
  Message m;
  m.type = type;
  m.payload = Value::FromList({ToValue(args)...});
  return m;
}

// A request's arguments; InvalidArgument naming the message and sender.
template <typename... A>
absl::StatusOr<std::tuple<A...>> Arguments(const Message& m) {
  absl::StatusOr<std::tuple<A...>> args = FromValue<std::tuple<A...>>(m.payload);
  if (!args.ok()) {
    return Annotate(args.status(), absl::StrCat("malformed ", m.DebugString()));
  }
  return args;
}

// A request's outcome, its reply dropped.
Future<void> Sent(Future<Message> reply) {
  return reply.Then(
      [](const Result<Message>& r) -> absl::Status { return r.status(); });
}

Future<Message> Reply(const absl::StatusOr<Value>& v) {
  if (!v.ok()) return MakeErrorFuture<Message>(v.status());
  Message reply;
  reply.payload = *v;
  return MakeReadyFuture<Message>(std::move(reply));
}

// Hyper-parameters travel as (kind, list of doubles).
std::pair<std::string, std::vector<double>> Encode(const FunctionalOptions& o) {
  if (const auto* s = std::get_if<SgdOptions>(&o)) {
    return {"sgd",
            {s->lr, s->momentum, s->dampening, s->nesterov ? 1.0 : 0.0,
             s->weight_decay}};
  }
  if (const auto* g = std::get_if<AdagradOptions>(&o)) {
    return {"adagrad",
            {g->lr, g->lr_decay, g->weight_decay, g->initial_accumulator_value,
             g->eps}};
  }
  const bool decoupled = std::holds_alternative<AdamWOptions>(o);
  const AdamOptions& a =
      decoupled ? std::get<AdamWOptions>(o) : std::get<AdamOptions>(o);
  return {decoupled ? "adamw" : "adam",
          {a.lr, a.beta1, a.beta2, a.eps, a.weight_decay}};
}

std::optional<FunctionalOptions> Decode(const std::string& kind,
                                        const std::vector<double>& o) {
  if (o.size() != 5) return std::nullopt;
  if (kind == "sgd") return SgdOptions{o[0], o[1], o[2], o[3] != 0, o[4]};
  if (kind == "adagrad") return AdagradOptions{o[0], o[1], o[2], o[3], o[4]};
  const AdamOptions a{o[0], o[1], o[2], o[3], o[4]};
  if (kind == "adam") return a;
  if (kind == "adamw") return AdamWOptions{a};
  return std::nullopt;
}

}  // namespace

// One owner-side optimizer: its parameters and functional state.
struct DistOptimizerService::Owned {
  int creator = -1;  // The worker that created it (its id).
  Mutex mu;  // Serializes steps (PyTorch's per-optimizer lock).
  std::vector<Tensor> params;
  FunctionalOptions options;
  SgdState sgd ABSL_GUARDED_BY(mu);
  AdamState adam ABSL_GUARDED_BY(mu);
  AdagradState adagrad ABSL_GUARDED_BY(mu);

  absl::Status Apply(const std::vector<Tensor>& grads)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (const auto* o = std::get_if<SgdOptions>(&options)) {
      return SgdStep(params, grads, sgd, *o);
    }
    if (const auto* o = std::get_if<AdamOptions>(&options)) {
      return AdamStep(params, grads, adam, *o);
    }
    if (const auto* o = std::get_if<AdamWOptions>(&options)) {
      return AdamWStep(params, grads, adam, *o);
    }
    return AdagradStep(params, grads, adagrad,
                       std::get<AdagradOptions>(options));
  }
};

absl::StatusOr<std::shared_ptr<DistOptimizerService>>
DistOptimizerService::Install(rpc::Agent& agent, Options options) {
  if (options.dist == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker '", agent.self().name,
        "': DistOptimizerService::Install needs Options::dist"));
  }
  std::shared_ptr<autograd::dist::DistAutogradContainer> dist = options.dist;
  std::shared_ptr<DistOptimizerService> s(
      new DistOptimizerService(agent, std::move(dist), std::move(options)));
  std::weak_ptr<DistOptimizerService> weak = s;
  auto gone = [] {
    return absl::UnavailableError("the DistOptimizerService was destroyed");
  };
  RETURN_IF_ERROR(ClaimMessages());
  RETURN_IF_ERROR(agent.RegisterHandler(kOptimCreate, [weak, gone](Message m) {
    std::shared_ptr<DistOptimizerService> self = weak.lock();
    if (self == nullptr) return Reply(gone());
    auto args = Arguments<std::string, std::vector<double>,
                          std::vector<rref::RRef<Tensor>>>(m);
    if (!args.ok()) return Reply(args.status());
    const auto& [kind, options, params] = *args;
    absl::StatusOr<int64_t> id =
        self->Create(m.caller_id, kind, options, params);
    if (!id.ok()) return Reply(id.status());
    return Reply(Value::Int(*id));
  }));
  RETURN_IF_ERROR(agent.RegisterHandler(kOptimStep, [weak, gone](Message m) {
    std::shared_ptr<DistOptimizerService> self = weak.lock();
    if (self == nullptr) return Reply(gone());
    auto args = Arguments<int64_t, int64_t>(m);
    if (!args.ok()) return Reply(args.status());
    absl::Status s =
        self->Step(m.caller_id, std::get<0>(*args), std::get<1>(*args));
    if (!s.ok()) return Reply(s);
    return Reply(Value::None());
  }));
  RETURN_IF_ERROR(agent.RegisterHandler(kOptimDestroy, [weak](Message m) {
    auto args = Arguments<int64_t>(m);
    if (!args.ok()) return Reply(args.status());
    if (std::shared_ptr<DistOptimizerService> self = weak.lock()) {
      absl::Status s = self->Destroy(m.caller_id, std::get<0>(*args));
      if (!s.ok()) return Reply(s);
    }
    return Reply(Value::None());
  }));
  // A creator that died or left takes its optimizers' state with it (a
  // departed worker destroyed them itself unless it failed first): the
  // agent's peer-state entries for those two reasons.
  agent.AddPeerDownListener(
      [weak](const rpc::PeerDown& down) {
        if (std::shared_ptr<DistOptimizerService> self = weak.lock()) {
          self->ReleaseWorker(down.peer.id);
        }
      },
      kReleasingReasons);
  RETURN_IF_ERROR(s->dist_->SetFusedStepHandler(
      [weak, gone](int64_t id, const Tensor& leaf, const Tensor& grad) {
        std::shared_ptr<DistOptimizerService> self = weak.lock();
        return self ? self->StepOne(id, leaf, grad) : gone();
      }));
  return s;
}

size_t DistOptimizerService::num_optimizers() const {
  MutexLock l(&mu_);
  return optimizers_.size();
}

size_t DistOptimizerService::num_optimizers_of(int worker_id) const {
  MutexLock l(&mu_);
  size_t n = 0;
  for (const auto& [id, owned] : optimizers_) n += owned->creator == worker_id;
  return n;
}

size_t DistOptimizerService::ReleaseWorker(int worker_id) {
  std::vector<std::shared_ptr<Owned>> gone;  // Freed outside the lock.
  MutexLock l(&mu_);
  for (auto it = optimizers_.begin(); it != optimizers_.end();) {
    if (it->second->creator == worker_id) {
      gone.push_back(std::move(it->second));
      it = optimizers_.erase(it);
    } else {
      ++it;
    }
  }
  released_of_[worker_id] += gone.size();
  return gone.size();
}

size_t DistOptimizerService::released_of(int worker_id) const {
  MutexLock l(&mu_);
  auto it = released_of_.find(worker_id);
  return it == released_of_.end() ? 0 : it->second;
}

absl::StatusOr<int64_t> DistOptimizerService::Create(
    int creator, const std::string& kind, const std::vector<double>& o,
    const std::vector<rref::RRef<Tensor>>& params) {
  auto owned = std::make_shared<Owned>();
  owned->creator = creator;
  std::optional<FunctionalOptions> options = Decode(kind, o);
  if (!options.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker '", agent_.self().name, "': unknown optimizer '",
                     kind, "' with ", o.size(), " hyper-parameters"));
  }
  owned->options = *options;
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
  // A request that was still queued when its creator failed or left would
  // otherwise leave an optimizer nobody releases. Checked under mu_: an
  // entry recorded after this check is released by the listener, which
  // waits for mu_ (ids are never reused).
  if (agent_.IsPeerDown(creator, kReleasingReasons)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker '", agent_.self().name, "': optimizer creator id ", creator,
        " failed or left; its optimizers were released"));
  }
  const int64_t id = next_id_++;
  optimizers_[id] = std::move(owned);
  return id;
}

std::shared_ptr<DistOptimizerService::Owned> DistOptimizerService::Find(
    int64_t id) const {
  MutexLock l(&mu_);
  auto it = optimizers_.find(id);
  return it == optimizers_.end() ? nullptr : it->second;
}

absl::Status DistOptimizerService::StepOne(int64_t id, const Tensor& leaf,
                                           const Tensor& grad) {
  std::shared_ptr<Owned> owned = Find(id);
  if (owned == nullptr) {
    return absl::NotFoundError(absl::StrCat(
        "worker '", agent_.self().name,
        "' fused optimizer step: unknown optimizer ", id));
  }
  const std::vector<Tensor>& params = owned->params;
  size_t i = 0;
  while (i < params.size() &&
         params[i].autograd_meta() != leaf.autograd_meta()) {
    ++i;
  }
  if (i == params.size()) return absl::OkStatus();  // Another's parameter.
  // Only parameter i has a gradient: the functional steps skip the others
  // and keep per-parameter state, so this is Step's update of parameter i.
  std::vector<Tensor> g(params.size());
  g[i] = grad;
  absl::Status s;
  {
    MutexLock l(&owned->mu);
    if (options_.param_mutex == nullptr) {
      s = owned->Apply(g);
    } else {
      MutexLock p(options_.param_mutex.get());
      s = owned->Apply(g);
      if (s.ok() && options_.after_update) options_.after_update(params[i]);
    }
  }
  if (s.ok()) return s;  // The message is built only for a failure.
  return Annotate(s, absl::StrCat("worker '", agent_.self().name,
                                  "' fused optimizer step, parameter ", i,
                                  " of ", params.size(), " (",
                                  autograd::ShapeString(params[i]), ")"));
}

namespace {

// PermissionDenied: worker id `caller` asked for `what` on optimizer `id`,
// which worker id `creator` created.
absl::Status NotTheCreator(const std::string& where, int caller, int64_t id,
                           int creator) {
  return absl::PermissionDeniedError(absl::StrCat(
      where, ": optimizer ", id, " belongs to worker id ", creator,
      ", not to the caller, worker id ", caller));
}

}  // namespace

absl::Status DistOptimizerService::Step(int caller, int64_t id,
                                        int64_t context_id) {
  std::shared_ptr<Owned> owned = Find(id);
  const std::string where =
      absl::StrCat("worker '", agent_.self().name, "' optimizer step");
  if (owned == nullptr) {
    return absl::NotFoundError(absl::StrCat(where, ": unknown optimizer"));
  }
  if (owned->creator != caller) {
    return NotTheCreator(where, caller, id, owned->creator);
  }
  absl::StatusOr<autograd::dist::GradientMap> grads = dist_->GetGradients(
      GlobalId::FromValue(static_cast<uint64_t>(context_id)));
  if (!grads.ok()) return Annotate(grads.status(), where);
  std::vector<Tensor> g;
  for (const Tensor& p : owned->params) g.push_back(grads->Get(p));
  MutexLock l(&owned->mu);
  if (options_.param_mutex == nullptr) return Annotate(owned->Apply(g), where);
  MutexLock params(options_.param_mutex.get());
  absl::Status s = owned->Apply(g);
  if (s.ok() && options_.after_update) {
    for (size_t i = 0; i < g.size(); ++i) {
      if (g[i].defined()) options_.after_update(owned->params[i]);
    }
  }
  return Annotate(s, where);
}

absl::Status DistOptimizerService::Destroy(int caller, int64_t id) {
  MutexLock l(&mu_);
  auto it = optimizers_.find(id);
  if (it == optimizers_.end()) return absl::OkStatus();
  if (it->second->creator != caller) {
    return NotTheCreator(
        absl::StrCat("worker '", agent_.self().name, "' optimizer destroy"),
        caller, id, it->second->creator);
  }
  optimizers_.erase(it);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<DistributedOptimizer>>
DistributedOptimizer::Create(rpc::Agent& agent, FunctionalOptions options,
                             const std::vector<rref::RRef<Tensor>>& params,
                             absl::Duration timeout) {
  std::map<int, std::vector<rref::RRef<Tensor>>> by_owner;
  for (const rref::RRef<Tensor>& p : params) {
    if (!p.valid()) return absl::InvalidArgumentError("invalid parameter RRef");
    by_owner[p.owner().id].push_back(p);
  }
  auto [kind, values] = Encode(options);
  std::vector<int> owners;
  std::vector<Future<int64_t>> created;
  for (const auto& [owner, ps] : by_owner) {
    owners.push_back(owner);
    created.push_back(
        agent.Send(owner, Request(kOptimCreate, kind, values, ps), timeout)
            .Then([](const Result<Message>& r) -> absl::StatusOr<int64_t> {
              if (!r.ok()) return r.status();
              return FromValue<int64_t>(r->payload);
            }));
  }
  // Collects every answer first, so that the optimizers that were created
  // are destroyed (by the destructor) when another owner refused.
  OwnerIds ids;
  absl::Status first;
  for (size_t i = 0; i < created.size(); ++i) {
    Result<int64_t> id = created[i].Get();
    if (id.ok()) {
      ids.emplace_back(owners[i], *id);
    } else if (first.ok()) {
      first = Annotate(id.status(), absl::StrCat("creating the optimizer on ",
                                                 "worker ", owners[i]));
    }
  }
  std::unique_ptr<DistributedOptimizer> opt(
      new DistributedOptimizer(agent, std::move(ids), timeout));
  if (!first.ok()) return first;
  return opt;
}

DistributedOptimizer::~DistributedOptimizer() {
  std::vector<Future<void>> done;
  for (const auto& [owner, id] : owners_) {
    done.push_back(Sent(agent_.Send(owner, Request(kOptimDestroy, id),
                                    timeout_)));
  }
  for (size_t i = 0; i < done.size(); ++i) {
    // Best effort: a dead owner has no state left to free.
    absl::Status s = done[i].Get();
    if (!s.ok()) {
      FERRY_LOG(WARNING) << "freeing optimizer state on worker "
                         << owners_[i].first << ": " << s;
    }
  }
}

absl::Status DistributedOptimizer::Step(GlobalId context_id) {
  const int64_t context = static_cast<int64_t>(context_id.value());
  std::vector<Future<void>> steps;
  for (const auto& [owner, id] : owners_) {
    steps.push_back(Sent(
        agent_.Send(owner, Request(kOptimStep, id, context), timeout_)));
  }
  absl::Status first;
  for (size_t i = 0; i < steps.size(); ++i) {
    first.Update(steps[i].Get());  // Each bounded by timeout_.
  }
  return first;
}

}  // namespace ferry::optim
