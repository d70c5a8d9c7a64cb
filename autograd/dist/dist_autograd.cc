#include "ferry/autograd/dist/dist_autograd.h"

#include <algorithm>
#include <cstdlib>
#include <deque>
#include <unordered_map>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ferry/autograd/engine.h"
#include "ferry/autograd/grad_mode.h"
#include "ferry/common/logging.h"
#include "ferry/common/status.h"
#include "ferry/tensor/cuda/device_ops.h"

namespace ferry::autograd::dist {

using rpc::InterceptPoint;
using rpc::Message;
using rpc::MessageType;
using rpc::WorkerInfo;

// ---------------------------------------------------------------------------
// GradientMap and DistAutogradContext.

Tensor GradientMap::Get(const Tensor& leaf) const {
  auto it = index_.find(leaf.autograd_meta());
  return it == index_.end() ? Tensor() : entries_[it->second].second;
}

namespace {

// a + b, out of place (either may be shared elsewhere); CUDA gradients
// through the backend of a's storage. InvalidArgument naming both when
// they are on different devices or a device one has no backend.
absl::StatusOr<Tensor> SumGradients(const Tensor& a, const Tensor& b) {
  if (!a.device().is_cuda() && !b.device().is_cuda()) return a.add(b);
  cuda::DeviceOps* d = cuda::DeviceOpsOf(a);
  if (d == nullptr || a.device() != b.device()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot sum gradients ", cuda::DescribeOperand(a), " and ",
        cuda::DescribeOperand(b),
        d == nullptr ? " (no compute backend for the device tensor)"
                     : " (different devices)"));
  }
  return d->Binary(cuda::math::BinaryOp::kAdd, a, b);
}

}  // namespace

absl::StatusOr<Tensor> GradientMap::Accumulate(const Tensor& leaf,
                                               const Tensor& grad) {
  auto [it, fresh] = index_.emplace(leaf.autograd_meta(), entries_.size());
  if (fresh) {
    entries_.emplace_back(leaf, grad);
    return grad;
  }
  Tensor& slot = entries_[it->second].second;
  ASSIGN_OR_RETURN(slot, SumGradients(slot, grad));
  return slot;
}

GradientMap DistAutogradContext::gradients() const {
  MutexLock l(&mu_);
  return grads_;
}

size_t DistAutogradContext::num_send_nodes() const {
  MutexLock l(&mu_);
  return sends_.size();
}

size_t DistAutogradContext::num_recv_nodes() const {
  MutexLock l(&mu_);
  return recvs_.size();
}

std::set<int> DistAutogradContext::workers() const {
  MutexLock l(&mu_);
  return workers_;
}

// ---------------------------------------------------------------------------
// A pass on one worker: FAST-mode dependency counts and ready queue.

// The fused optimizer steps of one pass (BackwardOptions::fused_optimizer).
struct FusedPlan {
  std::vector<FusedStep> steps;  // Forwarded on this pass's BACKWARDs.
  std::set<int> owners;       // Workers whose BACKWARD replies must confirm.
  std::vector<int64_t> mine;  // This worker's step ids.
  std::shared_ptr<const FusedStepHandler> handler;  // Set when `mine` is not.
};

// Delivers leaf gradients into the context's map; with fused steps for this
// worker, steps the leaf then: its accumulation node runs once per pass,
// after every gradient of the pass reached it, so the sum is final.
class ContextSink final : public GradientSink {
 public:
  ContextSink(DistAutogradContext* ctx, const FusedPlan* plan)
      : ctx_(ctx), plan_(plan) {}
  absl::Status Deliver(const Tensor& leaf, const Tensor& grad) override {
    Tensor total;
    {
      MutexLock l(&ctx_->mu_);
      // A released context keeps no gradients (invariant 2).
      if (ctx_->released_) return absl::OkStatus();
      absl::StatusOr<Tensor> sum = ctx_->grads_.Accumulate(leaf, grad);
      if (!sum.ok()) return sum.status();
      total = *std::move(sum);
    }
    for (int64_t id : plan_->mine) {
      if (absl::Status s = (*plan_->handler)(id, leaf, total); !s.ok()) {
        return s;
      }
    }
    return absl::OkStatus();
  }

 private:
  DistAutogradContext* const ctx_;
  const FusedPlan* const plan_;
};

namespace {

absl::Status AddInto(Tensor& slot, const Tensor& grad) {
  if (!grad.defined()) return absl::OkStatus();
  if (!slot.defined()) {
    slot = grad;
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(slot, SumGradients(slot, grad));
  return absl::OkStatus();
}

std::unordered_map<Node*, int> CountDependencies(
    const std::vector<Node*>& starts) {
  std::unordered_map<Node*, int> deps;
  std::unordered_map<Node*, bool> seen;
  std::vector<Node*> stack;
  for (Node* n : starts) {
    if (!seen[n]) {
      seen[n] = true;
      stack.push_back(n);
    }
  }
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const Edge& e : n->next_edges()) {
      if (!e.valid()) continue;
      ++deps[e.node.get()];
      if (!seen[e.node.get()]) {
        seen[e.node.get()] = true;
        stack.push_back(e.node.get());
      }
    }
  }
  return deps;
}

}  // namespace

// Fields below `running` are guarded by the owning context's mu_ (not
// expressible as an annotation across objects).
struct Pass {
  Pass(GlobalId pass_id, bool retain, DistAutogradContext* ctx, FusedPlan plan)
      : id(pass_id),
        retain_graph(retain),
        fused(std::move(plan)),
        sink(ctx, &fused),
        task(&sink, retain) {}

  const GlobalId id;
  const bool retain_graph;
  const FusedPlan fused;
  ContextSink sink;
  GraphTask task;  // Carries the sink and retain flag into Node::Apply.
  bool local_initiator = false;

  bool running = false;
  absl::Status error;
  std::unordered_map<Node*, int> deps;
  std::unordered_map<Node*, std::vector<Tensor>> buffers;
  std::unordered_map<Node*, std::shared_ptr<Node>> owners;
  std::set<Node*> fed_sends;
  std::deque<Node*> ready;

  // Adds `grad` to input `input_nr` of `node`; queues the node once its
  // dependencies are met. A sum that cannot be made (devices differ)
  // becomes the pass's error, naming the node.
  void Feed(const std::shared_ptr<Node>& node, int input_nr,
            const Tensor& grad) {
    Node* n = node.get();
    auto& buf = buffers[n];
    if (buf.empty()) buf.resize(n->num_inputs());
    if (absl::Status s = AddInto(buf[input_nr], grad); !s.ok() && error.ok()) {
      error = absl::Status(
          s.code(), absl::StrCat("backward of ", n->name(), ": ", s.message()));
    }
    owners.emplace(n, node);
  }
};

// ---------------------------------------------------------------------------
// Outstanding: completes when sealed and every added future completed, or at
// the first error. Callbacks only count: safe on transport threads.

class DistAutogradContainer::Outstanding {
 public:
  Outstanding() : s_(std::make_shared<State>()) {}

  void Add(Future<void> f) {
    {
      MutexLock l(&s_->mu);
      ++s_->pending;
    }
    f.OnComplete([s = s_](const absl::Status& r) {
      if (!r.ok()) {
        s->done.SetError(r);
        return;
      }
      bool finished;
      {
        MutexLock l(&s->mu);
        finished = --s->pending == 0 && s->sealed;
      }
      if (finished) s->done.SetValue();
    });
  }
  void Fail(absl::Status error) { s_->done.SetError(std::move(error)); }
  void Seal() {
    bool finished;
    {
      MutexLock l(&s_->mu);
      s_->sealed = true;
      finished = s_->pending == 0;
    }
    if (finished) s_->done.SetValue();
  }
  Future<void> future() const { return s_->done.GetFuture(); }

 private:
  struct State {
    Mutex mu;
    int pending ABSL_GUARDED_BY(mu) = 0;
    bool sealed ABSL_GUARDED_BY(mu) = false;
    Promise<void> done;
  };
  std::shared_ptr<State> s_;
};

// ---------------------------------------------------------------------------
// Message helpers.

// The payload's tensors that require grad, detached in place (so they
// travel without the sender's autograd state).
struct GradTensors {
  std::vector<int> indices;  // Depth-first positions in the payload.
  std::vector<Edge> edges;
  std::vector<TensorSpec> specs;
};

namespace {

bool IsOwnType(MessageType t) {
  return t == kBackward || t == kCleanupAutogradContext;
}

// The autograd header of a message this worker sends (ours: it decodes).
AutogradHeader OutgoingHeader(const Message& m) {
  absl::StatusOr<AutogradHeader> h = AutogradHeaderOf(m);
  return h.ok() ? *std::move(h) : AutogradHeader{};
}

// The context id a message travels in, if any.
absl::StatusOr<std::optional<GlobalId>> ContextIdOf(
    const rpc::ContextEntries& entries) {
  auto it = entries.find(kContextKey);
  if (it == entries.end()) return std::optional<GlobalId>();
  uint64_t v = 0;
  if (!absl::SimpleAtoi(it->second, &v)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "malformed autograd context id '", it->second, "' in rpc context"));
  }
  return std::optional<GlobalId>(GlobalId::FromValue(v));
}

// What a gradient of `t` must look like, where it must be.
TensorSpec SpecOf(const Tensor& t) {
  return TensorSpec{
      t.sizes(), t.dtype(), t.device(),
      t.device().is_cuda() ? t.storage().shared_compute() : nullptr};
}

// `value`-filled tensor of `spec` on its device (through its backend when
// it is a CUDA device); FailedPrecondition without a backend.
absl::StatusOr<Tensor> FilledLike(const TensorSpec& spec, double value) {
  if (!spec.device.is_cuda()) return full(spec.sizes, value, spec.dtype);
  auto* d = dynamic_cast<cuda::DeviceOps*>(spec.compute.get());
  if (d == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "a ", DTypeName(spec.dtype), " tensor on ", spec.device.ToString(),
        " has no compute backend to make its gradient (landed without "
        "WorkerOptions::device_compute?)"));
  }
  ASSIGN_OR_RETURN(Tensor t, d->Empty(spec.sizes, spec.dtype, spec.device));
  RETURN_IF_ERROR(d->Fill(t, value));
  return t;
}

GradTensors TakeGradTensors(Value& payload) {
  GradTensors out;
  int i = 0;
  rpc::ForEachTensor(payload, [&](Tensor& t) {
    if (t.defined() && RequiresGrad(t)) {
      out.indices.push_back(i);
      out.edges.push_back(GradientEdge(t));
      out.specs.push_back(SpecOf(t));
      t = Detach(t);
    }
    ++i;
  });
  return out;
}

absl::StatusOr<std::vector<std::pair<Edge, Tensor>>> RootEdges(
    const std::vector<Tensor>& roots) {
  std::vector<std::pair<Edge, Tensor>> out;
  for (size_t i = 0; i < roots.size(); ++i) {
    Edge e = GradientEdge(roots[i]);
    if (!e.valid()) {
      return absl::InvalidArgumentError(
          absl::StrCat("root ", i, " ", ShapeString(roots[i]),
                       " does not require grad and has no grad_fn"));
    }
    if (roots[i].numel() != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("root ", i, " has shape ", ShapeString(roots[i]),
                       ": distributed backward seeds one-element roots"));
    }
    // The seed of one on the root's device (a CUDA root: its backend).
    absl::StatusOr<Tensor> one = FilledLike(SpecOf(roots[i]), 1.0);
    if (!one.ok()) {
      return Annotate(one.status(), absl::StrCat("seeding root ", i));
    }
    out.emplace_back(std::move(e), *std::move(one));
  }
  return out;
}

absl::Status NodeError(const std::string& where, const absl::Status& s,
                       const Node& node) {
  return absl::Status(
      s.code(), absl::StrCat(where, ": backward of ", node.name(), " (inputs ",
                             node.shapes(), "): ", s.message()));
}

}  // namespace

// ---------------------------------------------------------------------------
// Container: installation and the context map.

DistAutogradContainer::DistAutogradContainer(rpc::Agent& agent, Options options)
    : agent_(agent),
      options_(options),
      ids_(static_cast<uint16_t>(agent.self().id), /*first_local=*/1) {}

absl::StatusOr<std::shared_ptr<DistAutogradContainer>>
DistAutogradContainer::Install(rpc::Agent& agent, Options options) {
  RETURN_IF_ERROR(ClaimMessages());
  for (MessageType t : {kBackward, kCleanupAutogradContext}) {
    if (agent.HasHandler(t)) {
      return absl::AlreadyExistsError(absl::StrCat(
          "worker '", agent.self().name, "' already serves ",
          rpc::MessageTypeName(t), ": distributed autograd installed twice?"));
    }
  }
  std::shared_ptr<DistAutogradContainer> c(
      new DistAutogradContainer(agent, options));
  std::weak_ptr<DistAutogradContainer> weak = c;
  auto gone = [name = agent.self().name] {
    return MakeErrorFuture<Message>(absl::UnavailableError(absl::StrCat(
        "worker '", name, "': distributed autograd was destroyed")));
  };
  RETURN_IF_ERROR(
      agent.RegisterHandler(kBackward, [weak, gone](Message m) {
        std::shared_ptr<DistAutogradContainer> self = weak.lock();
        return self ? self->OnBackward(m) : gone();
      }));
  RETURN_IF_ERROR(agent.RegisterHandler(
      kCleanupAutogradContext, [weak, gone](Message m) {
        std::shared_ptr<DistAutogradContainer> self = weak.lock();
        return self ? self->OnCleanup(m) : gone();
      }));
  agent.AddInterceptor(
      [weak](InterceptPoint point, const WorkerInfo& peer, Message& m) {
        std::shared_ptr<DistAutogradContainer> self = weak.lock();
        return self ? self->Intercept(point, peer, m) : absl::OkStatus();
      });
  c->release_loop_ = std::thread([weak] {
    if (std::shared_ptr<DistAutogradContainer> self = weak.lock()) {
      DistAutogradContainer* raw = self.get();
      self.reset();
      raw->ReleaseLoop(weak);
    }
  });
  // A container installed again after the first was destroyed replaces it.
  agent.inspectors().Unregister("dist_autograd");
  RETURN_IF_ERROR(agent.inspectors().Register("dist_autograd", [weak] {
    std::shared_ptr<DistAutogradContainer> self = weak.lock();
    return self ? self->Inspect() : std::vector<rpc::InspectionRow>{};
  }));
  return c;
}

std::vector<rpc::InspectionRow> DistAutogradContainer::Inspect() const {
  std::vector<std::shared_ptr<DistAutogradContext>> live;
  {
    MutexLock l(&mu_);
    for (const auto& [id, ctx] : contexts_) live.push_back(ctx);
  }
  std::vector<rpc::InspectionRow> rows;
  for (const std::shared_ptr<DistAutogradContext>& ctx : live) {
    std::vector<std::string> peers;
    for (int w : ctx->workers()) {
      absl::StatusOr<WorkerInfo> info = agent_.GetWorkerInfo(w);
      peers.push_back(info.ok() ? info->name : absl::StrCat("#", w));
    }
    size_t pending_replies = 0;
    bool in_backward = false;
    {
      MutexLock cl(&ctx->mu_);
      pending_replies = ctx->pending_replies_.size();
      in_backward = ctx->pass_ != nullptr;
    }
    rows.push_back(rpc::InspectionRow{
        "context",
        {{"id", ctx->id().ToString()},
         {"workers", absl::StrJoin(peers, ",")},
         {"send_nodes", absl::StrCat(ctx->num_send_nodes())},
         {"recv_nodes", absl::StrCat(ctx->num_recv_nodes())},
         {"gradients", absl::StrCat(ctx->gradients().size())},
         {"pending_replies", absl::StrCat(pending_replies)},
         {"in_backward", in_backward ? "true" : "false"}}});
  }
  return rows;
}

std::string DistAutogradContainer::Where(GlobalId context_id) const {
  return absl::StrCat("worker '", agent_.self().name, "' autograd context ",
                      context_id.ToString());
}

absl::StatusOr<GlobalId> DistAutogradContainer::NewContext() {
  ASSIGN_OR_RETURN(GlobalId id, ids_.Next());
  GetOrCreate(id);
  return id;
}

std::shared_ptr<DistAutogradContext> DistAutogradContainer::GetOrCreate(
    GlobalId id) {
  MutexLock l(&mu_);
  std::shared_ptr<DistAutogradContext>& slot = contexts_[id];
  if (slot == nullptr) slot = std::make_shared<DistAutogradContext>(id);
  return slot;
}

std::shared_ptr<DistAutogradContext> DistAutogradContainer::Find(
    GlobalId id) const {
  MutexLock l(&mu_);
  auto it = contexts_.find(id);
  return it == contexts_.end() ? nullptr : it->second;
}

size_t DistAutogradContainer::NumContexts() const {
  MutexLock l(&mu_);
  return contexts_.size();
}

std::vector<GlobalId> DistAutogradContainer::ContextIds() const {
  MutexLock l(&mu_);
  std::vector<GlobalId> out;
  for (const auto& [id, ctx] : contexts_) out.push_back(id);
  return out;
}

absl::StatusOr<GradientMap> DistAutogradContainer::GetGradients(
    GlobalId context_id) const {
  std::shared_ptr<DistAutogradContext> ctx = Find(context_id);
  if (ctx == nullptr) {
    return absl::NotFoundError(absl::StrCat(Where(context_id), " is unknown"));
  }
  return ctx->gradients();
}

// ---------------------------------------------------------------------------
// Recording.

absl::Status DistAutogradContainer::Intercept(InterceptPoint point,
                                              const WorkerInfo& peer,
                                              Message& m) {
  switch (point) {
    case InterceptPoint::kSendRequest:
      return OnSendRequest(peer, m);
    case InterceptPoint::kReceiveRequest:
      return OnReceiveRequest(peer, m);
    case InterceptPoint::kSendReply:
      return OnSendReply(peer, m);
    case InterceptPoint::kReceiveReply:
      return OnReceiveReply(peer, m);
  }
  return absl::OkStatus();
}

absl::Status DistAutogradContainer::OnSendRequest(const WorkerInfo& peer,
                                                  Message& m) {
  // Read once and written once, when it changed.
  AutogradHeader h = OutgoingHeader(m);
  bool changed = AttachReleases(peer, m, h);
  auto finish = [&]() -> absl::Status {
    if (changed) SetAutogradHeader(m, h);
    return absl::OkStatus();
  };
  // The current context travels as the header's typed field, never as the
  // context entry (which OnReceiveRequest restores from the header).
  absl::StatusOr<std::optional<GlobalId>> current = ContextIdOf(m.context);
  m.context.erase(kContextKey);
  if (IsOwnType(m.type)) {
    if (current.ok() && current->has_value()) {
      h.context = **current;
      changed = true;
    }
    return finish();
  }
  GradTensors grads = TakeGradTensors(m.payload);
  if (!current.ok()) return current.status();
  const std::optional<GlobalId>& id = *current;
  if (!id.has_value()) return finish();
  // Released (or never created) here: the id must not revive the context
  // on the callee, which would then hold it forever; it does not travel.
  std::shared_ptr<DistAutogradContext> ctx = Find(*id);
  if (ctx == nullptr) return finish();
  {
    MutexLock l(&ctx->mu_);
    if (ctx->released_) return finish();
    ctx->workers_.insert(peer.id);
  }
  h.context = *id;
  changed = true;
  absl::Status recorded = RecordSend(*ctx, peer, grads, m, h);
  SetAutogradHeader(m, h);
  return recorded;
}

absl::StatusOr<AutogradHeader> DistAutogradContainer::ReceivedHeader(
    const WorkerInfo& peer, const Message& m) const {
  absl::StatusOr<AutogradHeader> h = AutogradHeaderOf(m);
  if (!h.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker '", agent_.self().name, "': ",
                     h.status().message(), " from '", peer.name, "'"));
  }
  return h;
}

absl::Status DistAutogradContainer::OnReceiveRequest(const WorkerInfo& peer,
                                                     Message& m) {
  ASSIGN_OR_RETURN(AutogradHeader header, ReceivedHeader(peer, m));
  // Before the request's own work.
  ApplyReleases(peer, header.releases);
  // Only the header's typed field says which context a request is in; the
  // handler's thread gets it as its context entry (for its nested calls).
  m.context.erase(kContextKey);
  // A sender's local mark for its device stage; never the handler's.
  m.context.erase(kReturningEntry);
  if (header.context.has_value()) {
    m.context[kContextKey] = std::to_string(header.context->value());
  }
  if (IsOwnType(m.type)) return absl::OkStatus();
  ASSIGN_OR_RETURN(std::optional<GlobalId> id, ContextIdOf(m.context));
  if (!id.has_value()) return absl::OkStatus();
  std::shared_ptr<DistAutogradContext> ctx;
  {
    // mu_ before ctx->mu_ (the one lock order), so release cannot slip in
    // between the two tables (invariant 4).
    MutexLock l(&mu_);
    if (released_ids_.count(*id) > 0) {
      // Overtaken by its release: serve it outside the context (its
      // tensors arrived detached) rather than revive the context.
      return absl::OkStatus();
    }
    std::shared_ptr<DistAutogradContext>& slot = contexts_[*id];
    if (slot == nullptr) slot = std::make_shared<DistAutogradContext>(*id);
    ctx = slot;
    const ReplyKey key{peer.id, m.id.value()};
    reply_contexts_[key] = *id;
    MutexLock cl(&ctx->mu_);
    ctx->pending_replies_.insert(key);
    ctx->workers_.insert(peer.id);
  }
  if (!header.fields.has_value() || header.fields->grad_tensors.empty()) {
    return absl::OkStatus();
  }
  return RecordRecv(*ctx, peer, header.fields->grad_tensors,
                    header.fields->message_id, m, /*from_request=*/true);
}

absl::Status DistAutogradContainer::OnSendReply(const WorkerInfo& peer,
                                                Message& m) {
  if (IsOwnType(m.type)) return absl::OkStatus();
  GradTensors grads = TakeGradTensors(m.payload);
  std::shared_ptr<DistAutogradContext> ctx;
  {
    MutexLock l(&mu_);
    auto it = reply_contexts_.find(ReplyKey{peer.id, m.id.value()});
    if (it == reply_contexts_.end()) return absl::OkStatus();
    auto c = contexts_.find(it->second);
    reply_contexts_.erase(it);
    if (c == contexts_.end()) return absl::OkStatus();
    ctx = c->second;
    MutexLock cl(&ctx->mu_);
    ctx->pending_replies_.erase(ReplyKey{peer.id, m.id.value()});
  }
  if (grads.indices.empty()) return absl::OkStatus();
  AutogradHeader h = OutgoingHeader(m);
  absl::Status recorded = RecordSend(*ctx, peer, grads, m, h);
  if (recorded.ok()) SetAutogradHeader(m, h);
  return recorded;
}

absl::Status DistAutogradContainer::OnReceiveReply(const WorkerInfo& peer,
                                                   Message& m) {
  ConfirmCarried(peer, m);
  if (IsOwnType(m.type)) return absl::OkStatus();
  ASSIGN_OR_RETURN(AutogradHeader header, ReceivedHeader(peer, m));
  if (!header.fields.has_value()) return absl::OkStatus();
  const AutogradFields& fields = *header.fields;
  // A reply's fields are set only with the tensors they pair.
  if (fields.grad_tensors.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker '", agent_.self().name, "': reply from '", peer.name,
        "' in autograd context ", fields.context_id.ToString(),
        " names no tensor requiring grad"));
  }
  std::shared_ptr<DistAutogradContext> ctx = Find(fields.context_id);
  // Released while the call was in flight: the tensors arrive detached.
  if (ctx == nullptr) return absl::OkStatus();
  return RecordRecv(*ctx, peer, fields.grad_tensors, fields.message_id, m,
                    /*from_request=*/false);
}

absl::Status DistAutogradContainer::RecordSend(DistAutogradContext& ctx,
                                               const WorkerInfo& peer,
                                               const GradTensors& grads,
                                               const Message& m,
                                               AutogradHeader& h) {
  if (grads.indices.empty()) return absl::OkStatus();
  absl::StatusOr<GlobalId> message_id = ids_.Next();
  if (!message_id.ok()) return Annotate(message_id.status(), Where(ctx.id()));
  auto node = std::make_shared<SendNode>(peer.id, *message_id, grads.edges,
                                         grads.specs);
  {
    MutexLock l(&ctx.mu_);
    if (ctx.released_) {
      return absl::FailedPreconditionError(
          absl::StrCat(Where(ctx.id()), " was released; cannot send ",
                       m.DebugString(), " in it"));
    }
    ctx.sends_[*message_id] = std::move(node);
    ctx.workers_.insert(peer.id);
  }
  h.fields = AutogradFields{ctx.id(), *message_id, false, grads.indices};
  return absl::OkStatus();
}

absl::Status DistAutogradContainer::RecordRecv(DistAutogradContext& ctx,
                                               const WorkerInfo& peer,
                                               const std::vector<int>& indices,
                                               GlobalId message_id, Message& m,
                                               bool from_request) {
  // First pass: the specs, so the node exists before the tensors point at it.
  std::vector<TensorSpec> specs;
  {
    size_t next = 0;
    int i = 0;
    rpc::ForEachTensor(m.payload, [&](Tensor& t) {
      if (next < indices.size() && indices[next] == i) {
        specs.push_back(SpecOf(t));
        ++next;
      }
      ++i;
    });
  }
  if (specs.size() != indices.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        Where(ctx.id()), ": ", m.DebugString(), " marks ", indices.size(),
        " tensors requiring grad but carries ", specs.size()));
  }
  auto node = std::make_shared<RecvNode>(peer.id, peer.name, message_id,
                                         std::move(specs), from_request);
  size_t next = 0;
  int i = 0;
  rpc::ForEachTensor(m.payload, [&](Tensor& t) {
    if (next < indices.size() && indices[next] == i) {
      Tensor fresh = Detach(t);
      auto meta = std::make_shared<AutogradMeta>();
      meta->grad_fn = node;
      meta->output_nr = static_cast<int>(next);
      fresh.set_autograd_meta(std::move(meta));
      t = std::move(fresh);
      ++next;
    }
    ++i;
  });
  MutexLock l(&ctx.mu_);
  if (ctx.released_) return absl::OkStatus();  // Nothing will run backward.
  ctx.recvs_[message_id] = std::move(node);
  ctx.workers_.insert(peer.id);
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Backward.

absl::Status DistAutogradContainer::SetFusedStepHandler(
    FusedStepHandler handler) {
  MutexLock l(&mu_);
  if (fused_handler_ != nullptr) {
    return absl::AlreadyExistsError(absl::StrCat(
        "worker '", agent_.self().name, "' already has a fused step handler"));
  }
  fused_handler_ =
      std::make_shared<const FusedStepHandler>(std::move(handler));
  return absl::OkStatus();
}

absl::StatusOr<FusedPlan> DistAutogradContainer::PlanFusedSteps(
    const std::vector<FusedStep>& steps) const {
  FusedPlan plan;
  plan.steps = steps;
  for (const FusedStep& step : steps) {
    plan.owners.insert(step.worker);
    if (step.worker == agent_.self().id) plan.mine.push_back(step.step_id);
  }
  if (plan.mine.empty()) return plan;
  MutexLock l(&mu_);
  plan.handler = fused_handler_;
  if (plan.handler == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker '", agent_.self().name,
        "': a fused optimizer step was requested but this worker steps no "
        "optimizer (is DistOptimizerService installed here?)"));
  }
  return plan;
}

std::shared_ptr<Pass> DistAutogradContainer::NewPass(
    DistAutogradContext& ctx, GlobalId pass_id, bool retain_graph,
    const std::vector<std::pair<Edge, Tensor>>& roots, FusedPlan fused) {
  auto pass = std::make_shared<Pass>(pass_id, retain_graph, &ctx,
                                     std::move(fused));
  std::vector<Node*> starts;
  for (const auto& [edge, grad] : roots) starts.push_back(edge.node.get());
  for (const auto& [id, send] : ctx.sends_) starts.push_back(send.get());
  pass->deps = CountDependencies(starts);
  for (const auto& [edge, grad] : roots) {
    Node* n = edge.node.get();
    const bool first = pass->owners.count(n) == 0;
    pass->Feed(edge.node, edge.input_nr, grad);
    if (first && pass->deps[n] == 0) pass->ready.push_back(n);
  }
  return pass;
}

absl::Status DistAutogradContainer::Backward(GlobalId context_id,
                                             const std::vector<Tensor>& roots,
                                             const BackwardOptions& options) {
  std::shared_ptr<DistAutogradContext> ctx = Find(context_id);
  if (ctx == nullptr) {
    return absl::NotFoundError(
        absl::StrCat(Where(context_id), " is unknown (backward)"));
  }
  absl::StatusOr<std::vector<std::pair<Edge, Tensor>>> edges = RootEdges(roots);
  if (!edges.ok()) return Annotate(edges.status(), Where(context_id));
  absl::StatusOr<GlobalId> pass_id = ids_.Next();
  if (!pass_id.ok()) return Annotate(pass_id.status(), Where(context_id));
  std::vector<FusedStep> steps;
  if (options.fused_optimizer != nullptr) {
    for (const auto& [worker, step] : options.fused_optimizer->FusedSteps()) {
      steps.push_back(FusedStep{worker, step});
    }
  }
  absl::StatusOr<FusedPlan> fused = PlanFusedSteps(steps);
  if (!fused.ok()) return Annotate(fused.status(), Where(context_id));
  std::shared_ptr<Pass> pass;
  {
    MutexLock l(&ctx->mu_);
    if (ctx->released_) {
      return absl::NotFoundError(
          absl::StrCat(Where(context_id), " was released (backward)"));
    }
    if (ctx->pass_ != nullptr &&
        (ctx->pass_->local_initiator || ctx->pass_->running)) {
      return absl::FailedPreconditionError(absl::StrCat(
          Where(context_id), ": a backward pass is already running"));
    }
    pass = NewPass(*ctx, *pass_id, options.retain_graph, *edges,
                   *std::move(fused));
    pass->local_initiator = true;
    pass->running = true;
    ctx->pass_ = pass;
  }
  Outstanding rpcs;
  Drain(ctx, *pass, rpcs);
  rpcs.Seal();
  // Bounded: every kBackward this worker sent has options_.rpc_timeout.
  absl::Status s = rpcs.future().Get();
  MutexLock l(&ctx->mu_);
  if (ctx->pass_ == pass) ctx->pass_.reset();
  ctx->finished_pass_ = *pass_id;
  if (s.ok()) s = pass->error;
  return s;
}

void DistAutogradContainer::Drain(
    const std::shared_ptr<DistAutogradContext>& ctx, Pass& pass,
    Outstanding& rpcs) {
  NoGradGuard no_grad;  // Backward math records no graph.
  for (;;) {
    std::shared_ptr<Node> node;
    std::vector<Tensor> inputs;
    absl::Status failed;
    {
      MutexLock l(&ctx->mu_);
      if (pass.ready.empty() || !pass.error.ok()) {
        pass.running = false;
        failed = pass.error;
      } else {
        Node* n = pass.ready.front();
        pass.ready.pop_front();
        node = std::move(pass.owners[n]);
        pass.owners.erase(n);
        inputs = std::move(pass.buffers[n]);
        pass.buffers.erase(n);
      }
    }
    if (!failed.ok()) {
      // The pass failed (a node here or a gradient sum in Feed): this
      // thread's work fails with it, naming the worker and context.
      const std::string where = Where(ctx->id());
      rpcs.Fail(absl::StartsWith(failed.message(), where)
                    ? failed
                    : Annotate(failed, where));
      return;
    }
    if (node == nullptr) return;  // Nothing left to run.
    absl::StatusOr<std::vector<Tensor>> outs =
        RunNode(*ctx, pass, *node, std::move(inputs), rpcs);
    if (outs.ok() && outs->size() != node->next_edges().size()) {
      outs = absl::InternalError(
          absl::StrCat("returned ", outs->size(), " gradients for ",
                       node->next_edges().size(), " inputs"));
    }
    if (!outs.ok()) {
      absl::Status error = NodeError(Where(ctx->id()), outs.status(), *node);
      {
        MutexLock l(&ctx->mu_);
        pass.error = error;
        pass.running = false;
      }
      rpcs.Fail(error);  // Outside the lock: it may run continuations.
      return;
    }
    MutexLock l(&ctx->mu_);
    const std::vector<Edge>& edges = node->next_edges();
    for (size_t j = 0; j < edges.size(); ++j) {
      if (!edges[j].valid()) continue;
      Node* next = edges[j].node.get();
      pass.Feed(edges[j].node, edges[j].input_nr, (*outs)[j]);
      if (--pass.deps[next] == 0) pass.ready.push_back(next);
    }
  }
}

absl::StatusOr<std::vector<Tensor>> DistAutogradContainer::RunNode(
    DistAutogradContext& ctx, Pass& pass, Node& node,
    std::vector<Tensor> inputs, Outstanding& rpcs) {
  for (int i = 0; i < static_cast<int>(inputs.size()); ++i) {
    if (inputs[i].defined()) inputs[i] = node.RunPreHooks(i, inputs[i]);
  }
  if (auto* recv = dynamic_cast<RecvNode*>(&node)) {
    SendGradients(ctx, pass, *recv, std::move(inputs), rpcs);
    return std::vector<Tensor>();
  }
  absl::StatusOr<std::vector<Tensor>> outs =
      node.Apply(pass.task, std::move(inputs));
  if (outs.ok() && !pass.retain_graph) node.Release();
  return outs;
}

void DistAutogradContainer::SendGradients(DistAutogradContext& ctx, Pass& pass,
                                          const RecvNode& node,
                                          std::vector<Tensor> grads,
                                          Outstanding& rpcs) {
  std::string what = absl::StrCat(Where(ctx.id()), ": gradients of message ",
                                  node.message_id().ToString(), " to worker '",
                                  node.peer_name(), "'");
  Value::List list;
  for (size_t i = 0; i < grads.size(); ++i) {
    const TensorSpec& spec = node.specs()[i];
    if (grads[i].defined()) {
      list.push_back(Value::FromTensor(grads[i]));
      continue;
    }
    // No gradient reached it: zeros where the tensor was.
    absl::StatusOr<Tensor> zero = FilledLike(spec, 0.0);
    if (!zero.ok()) {
      rpcs.Fail(Annotate(zero.status(), absl::StrCat(what, ", gradient ", i)));
      return;
    }
    list.push_back(Value::FromTensor(*std::move(zero)));
  }
  Message m;
  m.type = kBackward;
  // Back along a forward request: the gradients go where the forward's
  // caller maps them (its device stage reads the mark).
  if (node.from_request()) m.context.emplace(kReturningEntry, "1");
  AutogradHeader h;
  h.fields = AutogradFields{ctx.id(), node.message_id(), pass.retain_graph, {}};
  h.fused_steps = pass.fused.steps;
  SetAutogradHeader(m, h);
  m.payload =
      Value::FromList({Value::Int(static_cast<int64_t>(pass.id.value())),
                       Value::FromList(std::move(list))});
  const bool confirm = pass.fused.owners.count(node.peer()) > 0;
  rpcs.Add(
      agent_.Send(node.peer(), std::move(m), options_.rpc_timeout)
          .Then([what, confirm](const Result<Message>& r) -> absl::Status {
            if (!r.ok()) return Annotate(r.status(), what);
            const std::string* done = r->payload.if_string();
            if (confirm && (done == nullptr || *done != kFusedStepDone)) {
              return absl::FailedPreconditionError(absl::StrCat(
                  what, ": the reply does not confirm the fused optimizer "
                        "step (a worker without fused steps?)"));
            }
            return absl::OkStatus();
          }));
}

Future<Message> DistAutogradContainer::OnBackward(const Message& m) {
  auto fail = [](absl::Status s) { return MakeErrorFuture<Message>(s); };
  const Value::List* parts = m.payload.if_list();
  const Value::List* grad_values =
      parts != nullptr && parts->size() == 2 ? (*parts)[1].if_list() : nullptr;
  absl::StatusOr<AutogradHeader> header = AutogradHeaderOf(m);
  if (!header.ok() || !header->fields.has_value() || grad_values == nullptr ||
      (*parts)[0].if_int() == nullptr) {
    return fail(absl::InvalidArgumentError(absl::StrCat(
        "worker '", agent_.self().name, "': malformed ", m.DebugString())));
  }
  const GlobalId context_id = header->fields->context_id;
  const GlobalId message_id = header->fields->message_id;
  const bool retain_graph = header->fields->retain_graph;
  const GlobalId pass_id =
      GlobalId::FromValue(static_cast<uint64_t>(*(*parts)[0].if_int()));
  std::shared_ptr<DistAutogradContext> ctx = Find(context_id);
  if (ctx == nullptr) {
    return fail(absl::NotFoundError(absl::StrCat(Where(context_id),
                                                 " is unknown (backward from '",
                                                 m.caller_name, "')")));
  }
  absl::StatusOr<FusedPlan> fused = PlanFusedSteps(header->fused_steps);
  if (!fused.ok()) return fail(Annotate(fused.status(), Where(context_id)));
  const bool confirm = !fused->mine.empty();
  auto reply = [confirm] {
    Message r;
    if (confirm) r.payload = Value::String(kFusedStepDone);
    return r;
  };
  std::shared_ptr<Pass> pass;
  {
    MutexLock l(&ctx->mu_);
    auto it = ctx->sends_.find(message_id);
    if (ctx->released_ || it == ctx->sends_.end()) {
      return fail(absl::NotFoundError(absl::StrCat(
          Where(context_id), ": no send node for message ",
          message_id.ToString(), " (backward from '", m.caller_name, "')")));
    }
    const std::shared_ptr<SendNode>& send = it->second;
    if (grad_values->size() != send->specs().size()) {
      return fail(absl::InvalidArgumentError(absl::StrCat(
          Where(context_id), ": ", grad_values->size(),
          " gradients for send node of ", send->specs().size(), " tensors")));
    }
    // Validated before the pass state changes.
    for (size_t i = 0; i < grad_values->size(); ++i) {
      const Tensor* g = (*grad_values)[i].if_tensor();
      const TensorSpec& want = send->specs()[i];
      if (g == nullptr || g->sizes() != want.sizes ||
          g->dtype() != want.dtype) {
        return fail(absl::InvalidArgumentError(absl::StrCat(
            Where(context_id), ": gradient ", i, " for message ",
            message_id.ToString(), " is not a ", DTypeName(want.dtype),
            " tensor of shape ", ShapeString(zeros(want.sizes)))));
      }
      // Where the tensor was sent from. A CPU gradient of a tensor staged
      // to the peer's CPU (stage_unmapped_to_cpu) is moved back onto its
      // device by the send node; any other mismatch (a device map that
      // does not bring it back) would mix devices in the graph.
      const bool moved_back = g->device().is_cpu() && want.device.is_cuda() &&
                              want.compute != nullptr;
      if (g->device() != want.device && !moved_back) {
        return fail(absl::InvalidArgumentError(absl::StrCat(
            Where(context_id), ": gradient ", i, " for message ",
            message_id.ToString(), " from '", m.caller_name, "' arrived on ",
            g->device().ToString(), ", but the tensor was sent from ",
            want.device.ToString())));
      }
    }
    if (pass_id == ctx->finished_pass_) {
      return fail(absl::AbortedError(
          absl::StrCat(Where(context_id), ": backward pass ",
                       pass_id.ToString(), " already finished here")));
    }
    if (ctx->pass_ == nullptr || ctx->pass_->id != pass_id) {
      if (ctx->pass_ != nullptr && ctx->pass_->running) {
        return fail(absl::UnavailableError(
            absl::StrCat(Where(context_id),
                         ": the previous backward pass is still running")));
      }
      ctx->pass_ = NewPass(*ctx, pass_id, retain_graph, {},
                           *std::move(fused));
    }
    pass = ctx->pass_;
    if (!pass->error.ok()) return fail(pass->error);
    if (!pass->fed_sends.insert(send.get()).second) {
      return fail(absl::AlreadyExistsError(
          absl::StrCat(Where(context_id), ": gradients for message ",
                       message_id.ToString(), " arrived twice in one pass")));
    }
    for (size_t i = 0; i < grad_values->size(); ++i) {
      pass->Feed(send, static_cast<int>(i), *(*grad_values)[i].if_tensor());
    }
    pass->ready.push_back(send.get());
    // The running thread's reply covers this message's work (and steps).
    if (pass->running) return MakeReadyFuture<Message>(reply());
    pass->running = true;
  }
  // This thread runs the pass; the reply waits for what that work sent.
  Outstanding rpcs;
  Drain(ctx, *pass, rpcs);
  rpcs.Seal();
  return rpcs.future().Then(
      [reply](const absl::Status& s) -> absl::StatusOr<Message> {
        if (!s.ok()) return s;
        return reply();
      });
}

// ---------------------------------------------------------------------------
// Release.

Future<void> DistAutogradContainer::Release(GlobalId context_id) {
  return ReleaseExcept(context_id, agent_.self().id);
}

void DistAutogradContainer::RememberReleased(GlobalId id) {
  if (!released_ids_.insert(id).second) return;
  released_order_.push_back(id);
  if (released_order_.size() > kMaxReleasedIds) {
    released_ids_.erase(released_order_.front());
    released_order_.pop_front();
  }
}

Future<void> DistAutogradContainer::ReleaseExcept(GlobalId id,
                                                  int skip_worker) {
  return SendReleases(id, Forget(id), skip_worker);
}

std::set<int> DistAutogradContainer::Forget(GlobalId id) {
  std::shared_ptr<DistAutogradContext> ctx;
  std::set<int> workers;
  {
    MutexLock l(&mu_);
    RememberReleased(id);
    auto it = contexts_.find(id);
    if (it == contexts_.end()) return workers;
    ctx = std::move(it->second);
    contexts_.erase(it);
    MutexLock cl(&ctx->mu_);
    for (const ReplyKey& key : ctx->pending_replies_)
      reply_contexts_.erase(key);
    ctx->pending_replies_.clear();
    ctx->released_ = true;
    workers = std::move(ctx->workers_);
    ctx->workers_.clear();
    ctx->sends_.clear();
    ctx->recvs_.clear();
    ctx->grads_ = GradientMap();
    ctx->pass_.reset();
  }
  return workers;
}

Future<void> DistAutogradContainer::SendReleases(GlobalId id,
                                                 const std::set<int>& workers,
                                                 int skip_worker) {
  Outstanding out;
  for (int w : workers) {
    if (w == agent_.self().id || w == skip_worker) continue;
    Message m;
    m.type = kCleanupAutogradContext;
    SetAutogradFields(m, AutogradFields{id, GlobalId(), false, {}});
    std::string what = absl::StrCat(Where(id), ": releasing on worker ", w);
    out.Add(agent_.Send(w, std::move(m), options_.rpc_timeout)
                .Then([what](const Result<Message>& r) -> absl::Status {
                  return Annotate(r.status(), what);
                }));
  }
  out.Seal();
  return out.future();
}

// ---------------------------------------------------------------------------
// Background releases: queued per worker, carried by the next request there
// (the autograd header's releases), or sent alone by the release loop.

void DistAutogradContainer::ReleaseInBackground(GlobalId context_id) {
  std::set<int> workers = Forget(context_id);
  workers.erase(agent_.self().id);
  if (workers.empty()) return;
  if (options_.release_delay <= absl::ZeroDuration()) {
    SendReleases(context_id, workers, agent_.self().id)
        .OnComplete([id = context_id.ToString()](const absl::Status& s) {
          if (!s.ok()) FERRY_LOG(WARNING) << "releasing " << id << ": " << s;
        });
    return;
  }
  MutexLock l(&release_mu_);
  for (int w : workers) {
    ReleaseQueue& q = releases_[w];
    q.queued.push_back(context_id);
    if (q.flush_at == absl::InfiniteFuture()) {
      q.flush_at = absl::Now() + options_.release_delay;
      ++release_changes_;
    }
  }
}

bool DistAutogradContainer::AttachReleases(const WorkerInfo& peer,
                                           const Message& m,
                                           AutogradHeader& h) {
  // Only releases made for this message travel on it.
  const bool had = h.releases.has_value();
  h.releases.reset();
  std::vector<GlobalId> ids;
  {
    MutexLock l(&release_mu_);
    if (releases_.empty()) return had;
    auto it = releases_.find(peer.id);
    if (it == releases_.end()) return had;
    ids = std::move(it->second.queued);
    releases_.erase(it);
    const absl::Time resend_at =
        m.deadline != absl::InfiniteFuture()
            ? m.deadline
            : absl::Now() + options_.rpc_timeout;
    carried_[ReplyKey{peer.id, m.id.value()}] = Carried{ids, resend_at};
    ++release_changes_;  // The loop's next wake-up may be this deadline.
  }
  h.releases = AutogradReleases{agent_.self().id, peer.id, std::move(ids)};
  return true;
}

void DistAutogradContainer::ConfirmCarried(const WorkerInfo& peer,
                                           const Message& m) {
  MutexLock l(&release_mu_);
  if (!carried_.empty()) carried_.erase(ReplyKey{peer.id, m.id.value()});
}

void DistAutogradContainer::ApplyReleases(
    const WorkerInfo& peer, const std::optional<AutogradReleases>& releases) {
  if (!releases.has_value()) return;
  // Only the sender named, over its own connection, to this worker.
  if (releases->sender != peer.id || releases->receiver != agent_.self().id) {
    return;
  }
  for (GlobalId id : releases->context_ids) {
    ReleaseExcept(id, peer.id).OnComplete([id](const absl::Status& s) {
      if (!s.ok()) FERRY_LOG(WARNING) << "releasing " << id.ToString() << ": " << s;
    });
  }
}

void DistAutogradContainer::SendReleasesAlone(int worker,
                                              const std::vector<GlobalId>& ids) {
  {
    MutexLock l(&release_mu_);
    sending_alone_ += ids.size();
  }
  std::weak_ptr<DistAutogradContainer> weak = weak_from_this();
  for (GlobalId id : ids) {
    Message m;
    m.type = kCleanupAutogradContext;
    SetAutogradFields(m, AutogradFields{id, GlobalId(), false, {}});
    agent_.Send(worker, std::move(m), options_.rpc_timeout)
        .OnComplete([weak, worker, id](const Result<Message>& r) {
          if (!r.ok()) {
            FERRY_LOG(WARNING) << "releasing " << id.ToString()
                               << " on worker " << worker << ": "
                               << r.status();
          }
          if (std::shared_ptr<DistAutogradContainer> self = weak.lock()) {
            MutexLock l(&self->release_mu_);
            --self->sending_alone_;
          }
        });
  }
}

bool DistAutogradContainer::AwaitDueReleases(DueReleases& due) {
  while (!stop_releases_) {
    absl::Time next = absl::InfiniteFuture();
    for (const auto& [w, q] : releases_) next = std::min(next, q.flush_at);
    for (const auto& [key, c] : carried_) next = std::min(next, c.resend_at);
    const uint64_t seen = release_changes_;
    auto changed = [this, seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(release_mu_) {
      return stop_releases_ || release_changes_ != seen;
    };
    if (release_mu_.AwaitWithDeadline(absl::Condition(&changed), next)) {
      continue;
    }
    const absl::Time now = absl::Now();
    for (auto it = releases_.begin(); it != releases_.end();) {
      if (it->second.flush_at > now) {
        ++it;
        continue;
      }
      due.emplace_back(it->first, std::move(it->second.queued));
      it = releases_.erase(it);
    }
    for (auto it = carried_.begin(); it != carried_.end();) {
      if (it->second.resend_at > now) {
        ++it;
        continue;
      }
      // No reply by the carrier's deadline: delivered or not, alone again.
      due.emplace_back(it->first.first, std::move(it->second.ids));
      it = carried_.erase(it);
    }
    if (!due.empty()) return true;
  }
  return false;
}

void DistAutogradContainer::ReleaseLoop(
    const std::weak_ptr<DistAutogradContainer>& weak) {
  // `this` stays valid while the destructor has not begun elsewhere (it
  // joins this thread). Releasing `self` may run the destructor here (it then
  // detaches this thread); `weak` tells, without touching `this`.
  for (;;) {
    DueReleases due;
    {
      MutexLock l(&release_mu_);
      if (!AwaitDueReleases(due)) return;
    }
    std::shared_ptr<DistAutogradContainer> self = weak.lock();
    for (const auto& [worker, ids] : due) SendReleasesAlone(worker, ids);
    self.reset();
    if (weak.expired()) return;
  }
}

absl::Status DistAutogradContainer::FlushReleases(absl::Duration timeout) {
  DueReleases due;
  {
    MutexLock l(&release_mu_);
    for (auto& [w, q] : releases_) due.emplace_back(w, std::move(q.queued));
    releases_.clear();
    // A carrier still in flight may be lost with the shutdown: alone too.
    for (auto& [key, c] : carried_) due.emplace_back(key.first, std::move(c.ids));
    carried_.clear();
  }
  for (const auto& [worker, ids] : due) SendReleasesAlone(worker, ids);
  MutexLock l(&release_mu_);
  auto settled = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(release_mu_) {
    return releases_.empty() && carried_.empty() && sending_alone_ == 0;
  };
  if (release_mu_.AwaitWithTimeout(absl::Condition(&settled), timeout)) {
    return absl::OkStatus();
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "worker '", agent_.self().name, "': ",
      releases_.size() + carried_.size() + sending_alone_,
      " autograd context releases still pending after ",
      absl::FormatDuration(timeout)));
}

size_t DistAutogradContainer::NumPendingReleases() const {
  MutexLock l(&release_mu_);
  size_t n = sending_alone_;
  for (const auto& [w, q] : releases_) n += q.queued.size();
  for (const auto& [key, c] : carried_) n += c.ids.size();
  return n;
}

DistAutogradContainer::~DistAutogradContainer() {
  DueReleases due;
  {
    MutexLock l(&release_mu_);
    stop_releases_ = true;
    for (auto& [w, q] : releases_) due.emplace_back(w, std::move(q.queued));
    releases_.clear();
  }
  if (release_loop_.joinable()) {
    if (release_loop_.get_id() == std::this_thread::get_id()) {
      release_loop_.detach();  // The loop dropped the last reference.
    } else {
      release_loop_.join();
    }
  }
  // Best effort: the agent outlives the container; nothing waits.
  for (const auto& [worker, ids] : due) {
    for (GlobalId id : ids) {
      Message m;
      m.type = kCleanupAutogradContext;
      SetAutogradFields(m, AutogradFields{id, GlobalId(), false, {}});
      agent_.Send(worker, std::move(m), options_.rpc_timeout)
          .OnComplete([id](const Result<Message>& r) {
            if (!r.ok()) {
              FERRY_LOG(WARNING) << "releasing " << id.ToString() << ": "
                                 << r.status();
            }
          });
    }
  }
}

Future<Message> DistAutogradContainer::OnCleanup(const Message& m) {
  absl::StatusOr<AutogradHeader> header = AutogradHeaderOf(m);
  if (!header.ok() || !header->fields.has_value()) {
    return MakeErrorFuture<Message>(absl::InvalidArgumentError(absl::StrCat(
        "worker '", agent_.self().name, "': malformed ", m.DebugString())));
  }
  return ReleaseExcept(header->fields->context_id, m.caller_id)
      .Then([](const absl::Status& s) -> absl::StatusOr<Message> {
        if (!s.ok()) return s;
        return Message();
      });
}

// ---------------------------------------------------------------------------
// ContextScope.

ContextScope::ContextScope(DistAutogradContainer& container, OnExit on_exit)
    : container_(container), on_exit_(on_exit) {
  absl::StatusOr<GlobalId> id = container.NewContext();
  if (!id.ok()) {
    FERRY_LOG(ERROR) << "ContextScope: " << id.status();
    std::abort();
  }
  id_ = *id;
  entry_.emplace(kContextKey, std::to_string(id_.value()));
}

ContextScope::~ContextScope() {
  if (on_exit_ == OnExit::kReleaseInBackground && !released_) {
    released_ = true;
    entry_.reset();
    container_.ReleaseInBackground(id_);
    return;
  }
  absl::Status s = Release();
  if (!s.ok())
    FERRY_LOG(WARNING) << "releasing " << id_.ToString() << ": " << s;
  entry_.reset();
}

absl::Status ContextScope::Release(absl::Duration timeout) {
  if (released_) return absl::OkStatus();
  released_ = true;
  entry_.reset();  // No longer current: later calls travel outside it.
  return container_.Release(id_).Get(timeout);
}

}  // namespace ferry::autograd::dist
