// Distributed autograd: one backward pass over a graph that spans workers.
//
//   auto dist = DistAutogradContainer::Install(agent);   // on every worker
//   {
//     ContextScope ctx(**dist);                 // thread's current context
//     Tensor y = *agent.rpc_sync<Tensor>("b", "forward", x);
//     RETURN_IF_ERROR((*dist)->Backward(ctx.id(), {autograd::sum(y)}));
//     GradientMap g = *(*dist)->GetGradients(ctx.id());   // this worker's
//   }                          // scope exit released the context everywhere
//
// Every worker of a job must install distributed autograd. Backward runs in
// FAST mode: every SendNode of the context must receive a gradient in the
// pass. Gradients of leaves accumulate in the context (GetGradients), never
// in .grad. Backward returns when every worker the pass reached is done, or
// with the first error (naming worker, context and op);
// BackwardOptions::fused_optimizer steps each parameter on its owner in the
// pass. Invariants of the context map
// (DistAutogradContainer::contexts_; why: docs/design/dist_autograd.md):
//  1. An id maps to at most one live context per worker (minted by its
//     creator: 16-bit worker id, 48-bit counter).
//  2. A context is in the map from creation until its release; after
//     release no graph piece of it is reachable from the container.
//  3. Every Send/RecvNode is in its context's tables; its peer is in the
//     context's workers (so release reaches it).
//  4. reply_contexts_ and each context's pending_replies hold the same keys.
//  5. A context has at most one pass, run on one thread at a time.
//  6. A released id (among the last kMaxReleasedIds) is never re-created.
// Thread safety: every public method is safe from any thread. The agent must
// outlive the container's use (handlers hold it weakly).
#ifndef FERRY_AUTOGRAD_DIST_DIST_AUTOGRAD_H_
#define FERRY_AUTOGRAD_DIST_DIST_AUTOGRAD_H_

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ferry/autograd/dist/messages.h"
#include "ferry/autograd/dist/nodes.h"
#include "ferry/common/future.h"
#include "ferry/common/ids.h"
#include "ferry/common/sync.h"
#include "ferry/rpc/agent.h"
#include "ferry/rpc/context.h"
#include "ferry/tensor/tensor.h"

namespace ferry::autograd::dist {

// rpc context entry holding the current context id (decimal GlobalId value)
// on this worker's threads; between workers it travels as the autograd
// header's typed field instead (messages.h).
inline constexpr char kContextKey[] = "autograd/context";
// Which payload tensors required grad (AutogradFields::grad_tensors),
// background releases (AutogradReleases) and fused steps (FusedStep) travel
// as typed fields of the autograd header (messages.h).

// The payload of a BACKWARD reply from a worker named in the header's
// fused_steps: its fused steps of the pass are done (an older worker replies
// with nothing, which fails the pass rather than skip the step silently).
inline constexpr char kFusedStepDone[] = "fused_step_done";

// An optimizer whose owner-side steps can run inside a distributed backward
// pass (optim::DistributedOptimizer; see BackwardOptions).
class FusedOptimizer {
 public:
  virtual ~FusedOptimizer() = default;
  // (owner worker id, the owner-side step id) for every owner it steps.
  virtual const std::vector<std::pair<int, int64_t>>& FusedSteps() const = 0;
};

// Owner side of a fused step (optim::DistOptimizerService installs it):
// steps parameter `leaf` of owner-side optimizer `step_id` with `grad`, the
// context's final gradient of it. OK when `leaf` is not one of its
// parameters; an error names the worker and parameter.
using FusedStepHandler = std::function<absl::Status(
    int64_t step_id, const Tensor& leaf, const Tensor& grad)>;

// Options of one backward pass (DistAutogradContainer::Backward).
struct BackwardOptions {
  // Keep the graph pieces after the pass.
  bool retain_graph = false;
  // When set, every owner of its parameters steps each parameter as soon as
  // that parameter's gradient of the pass is final (its accumulation node
  // ran), before its BACKWARD reply; Backward returns once every step is
  // done and fails with the first failed step (naming owner and parameter).
  // The result is bit-identical to Backward then opt.Step(context) (which
  // stays available; do not call both for one context). Must outlive the
  // call.
  const FusedOptimizer* fused_optimizer = nullptr;
};

// Leaf tensor -> accumulated gradient, for one context on one worker.
class GradientMap {
 public:
  // The gradient of `leaf` (the same tensor object), or undefined.
  Tensor Get(const Tensor& leaf) const;
  size_t size() const { return entries_.size(); }  // Leaves with a gradient.
  // (leaf, gradient) in first-arrival order.
  const std::vector<std::pair<Tensor, Tensor>>& entries() const {
    return entries_;
  }
  // Adds `grad` to `leaf`'s gradient (out of place); returns the sum
  // (InvalidArgument naming both when their devices differ).
  absl::StatusOr<Tensor> Accumulate(const Tensor& leaf, const Tensor& grad);

 private:
  std::vector<std::pair<Tensor, Tensor>> entries_;
  std::map<const AutogradMetaInterface*, size_t> index_;
};

struct Pass;
struct GradTensors;
struct FusedPlan;
class ContextSink;

// The state of one context on one worker. Obtained from the container; its
// tables are the container's business (see the invariants above).
class DistAutogradContext {
 public:
  // Context `id` (the container creates them).
  explicit DistAutogradContext(GlobalId id) : id_(id) {}
  GlobalId id() const { return id_; }  // Same on every worker.

  GradientMap gradients() const;  // The gradients accumulated here so far.
  size_t num_send_nodes() const;  // SendNodes recorded here.
  size_t num_recv_nodes() const;  // RecvNodes recorded here.
  // Workers this one exchanged messages with in the context.
  std::set<int> workers() const;

 private:
  friend class DistAutogradContainer;
  friend class ContextSink;

  const GlobalId id_;
  mutable Mutex mu_;
  std::map<GlobalId, std::shared_ptr<SendNode>> sends_ ABSL_GUARDED_BY(mu_);
  std::map<GlobalId, std::shared_ptr<RecvNode>> recvs_ ABSL_GUARDED_BY(mu_);
  std::set<int> workers_ ABSL_GUARDED_BY(mu_);
  std::set<std::pair<int, uint64_t>> pending_replies_ ABSL_GUARDED_BY(mu_);
  GradientMap grads_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<Pass> pass_ ABSL_GUARDED_BY(mu_);
  // The last pass this worker initiated and finished (late messages of it
  // are refused).
  GlobalId finished_pass_ ABSL_GUARDED_BY(mu_);
  bool released_ ABSL_GUARDED_BY(mu_) = false;
};

// One worker's distributed autograd: its contexts and the pass runner (see
// the top of this file).
class DistAutogradContainer
    : public std::enable_shared_from_this<DistAutogradContainer> {
 public:
  // Install's settings.
  struct Options {
    // Timeout of each kBackward and kCleanupAutogradContext message.
    absl::Duration rpc_timeout = absl::Seconds(60);
    // A background release rides on the next request this worker sends to
    // each worker it must reach (the autograd header's releases); one that finds none within
    // this delay goes alone. Zero: alone at once.
    absl::Duration release_delay = absl::Milliseconds(5);
  };

  // Installs distributed autograd on `agent`: handlers for kBackward and
  // kCleanupAutogradContext, and the recording interceptors. Once per agent
  // (AlreadyExists otherwise), on every worker, before messages flow.
  static absl::StatusOr<std::shared_ptr<DistAutogradContainer>> Install(
      rpc::Agent& agent, Options options);
  // Install with the default Options.
  static absl::StatusOr<std::shared_ptr<DistAutogradContainer>> Install(
      rpc::Agent& agent) {
    return Install(agent, Options());
  }

  ~DistAutogradContainer();
  DistAutogradContainer(const DistAutogradContainer&) = delete;
  DistAutogradContainer& operator=(const DistAutogradContainer&) = delete;

  // A new context owned by this worker (in the map until released).
  absl::StatusOr<GlobalId> NewContext();
  // Null when the id is unknown here.
  std::shared_ptr<DistAutogradContext> Find(GlobalId id) const;
  size_t NumContexts() const;  // Live contexts on this worker.
  std::vector<GlobalId> ContextIds() const;  // Their ids.

  // Runs the distributed backward pass of `roots` (one-element tensors,
  // each seeded with a gradient of one) in context `context_id`, whose
  // graph pieces are kept when `retain_graph`. See the header comment.
  // Errors: NotFound (unknown context), InvalidArgument (a root without
  // grad), FailedPrecondition (a pass of this context already running from
  // this worker), the first node or transport error of any worker reached.
  absl::Status Backward(GlobalId context_id, const std::vector<Tensor>& roots,
                        bool retain_graph = false) {
    return Backward(context_id, roots, BackwardOptions{.retain_graph = retain_graph});
  }
  // The same with options (a fused optimizer step: BackwardOptions).
  // FailedPrecondition when a fused step names this worker and no handler
  // is set here.
  absl::Status Backward(GlobalId context_id, const std::vector<Tensor>& roots,
                        const BackwardOptions& options);

  // Sets this worker's owner side of fused optimizer steps (once;
  // AlreadyExists otherwise).
  absl::Status SetFusedStepHandler(FusedStepHandler handler);

  // The gradients accumulated in the context on this worker.
  absl::StatusOr<GradientMap> GetGradients(GlobalId context_id) const;

  // Removes the context here and on every worker it touched; completes when
  // they all answered (the first error otherwise; local state is gone
  // either way). OK when the id is unknown.
  Future<void> Release(GlobalId context_id);
  // Removes the context here at once; the other workers it touched learn it
  // on the next request sent to each (or alone after Options::release_delay).
  // Never lost: a carrier that gets no reply is followed by the release
  // alone (releases are idempotent). Failures (a dead worker) are logged.
  void ReleaseInBackground(GlobalId context_id);
  // Sends every background release not yet confirmed alone now, and waits
  // until none is pending (DeadlineExceeded after `timeout`). Call before the
  // agent shuts down (Worker::Shutdown does).
  absl::Status FlushReleases(absl::Duration timeout = absl::Seconds(60));
  // Background releases not yet confirmed (queued, or on a request in
  // flight, or sent alone and unanswered).
  size_t NumPendingReleases() const;

  const rpc::WorkerInfo& self() const { return agent_.self(); }  // This worker.

  // Rows of the "dist_autograd" inspector (rpc/inspect.h): one per live
  // context (id, peer workers, send/recv nodes, gradients, pending replies).
  std::vector<rpc::InspectionRow> Inspect() const;

 private:
  class Outstanding;
  using ReplyKey = std::pair<int, uint64_t>;  // (caller id, request id)

  DistAutogradContainer(rpc::Agent& agent, Options options);

  std::shared_ptr<DistAutogradContext> GetOrCreate(GlobalId id);
  Future<void> ReleaseExcept(GlobalId id, int skip_worker);
  // The local part of a release: the context leaves the map; returns the
  // other workers it touched.
  std::set<int> Forget(GlobalId id);
  // kCleanupAutogradContext to each of `workers` (but `skip_worker`).
  Future<void> SendReleases(GlobalId id, const std::set<int>& workers,
                            int skip_worker);

  // Background releases (AutogradHeader::releases). Attach: sets `h`'s
  // releases for a request `m` to `peer` (what is queued for it, or none);
  // true when `h` changed.
  bool AttachReleases(const rpc::WorkerInfo& peer, const rpc::Message& m,
                      AutogradHeader& h);
  // Acts on `releases` only when `peer` sent them and this worker is their
  // receiver.
  void ApplyReleases(const rpc::WorkerInfo& peer,
                     const std::optional<AutogradReleases>& releases);
  void ConfirmCarried(const rpc::WorkerInfo& peer, const rpc::Message& m);
  // Sends `ids` to `worker` alone, one kCleanupAutogradContext each.
  void SendReleasesAlone(int worker, const std::vector<GlobalId>& ids);
  using DueReleases = std::vector<std::pair<int, std::vector<GlobalId>>>;
  void ReleaseLoop(const std::weak_ptr<DistAutogradContainer>& weak);
  // Waits until releases are due (moved into `due`): true; false once the
  // loop must stop.
  bool AwaitDueReleases(DueReleases& due)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(release_mu_);
  void RememberReleased(GlobalId id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Interceptor and handlers.
  absl::Status Intercept(rpc::InterceptPoint point, const rpc::WorkerInfo& peer,
                         rpc::Message& message);
  absl::Status OnSendRequest(const rpc::WorkerInfo& peer, rpc::Message& m);
  absl::Status OnReceiveRequest(const rpc::WorkerInfo& peer, rpc::Message& m);
  absl::Status OnSendReply(const rpc::WorkerInfo& peer, rpc::Message& m);
  absl::Status OnReceiveReply(const rpc::WorkerInfo& peer, rpc::Message& m);
  Future<rpc::Message> OnBackward(const rpc::Message& m);
  Future<rpc::Message> OnCleanup(const rpc::Message& m);

  // Records an outgoing message's grad tensors (already detached) in `ctx`
  // and marks which they are in `h`'s fields (grad_tensors); `h` becomes
  // `m`'s header.
  absl::Status RecordSend(DistAutogradContext& ctx, const rpc::WorkerInfo& peer,
                          const GradTensors& grads, const rpc::Message& m,
                          AutogradHeader& h);
  // Gives the tensors of an incoming message at `indices` (depth-first,
  // increasing) a RecvNode paired with the sender's send node `message_id`.
  // `from_request`: `m` is a request (else a reply).
  absl::Status RecordRecv(DistAutogradContext& ctx, const rpc::WorkerInfo& peer,
                          const std::vector<int>& indices, GlobalId message_id,
                          rpc::Message& m, bool from_request);
  // A received message's autograd header; InvalidArgument naming `peer`.
  absl::StatusOr<AutogradHeader> ReceivedHeader(const rpc::WorkerInfo& peer,
                                                const rpc::Message& m) const;

  // Pass runner.
  std::shared_ptr<Pass> NewPass(
      DistAutogradContext& ctx, GlobalId pass_id, bool retain_graph,
      const std::vector<std::pair<Edge, Tensor>>& roots, FusedPlan fused)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx.mu_);
  // The fused steps a BACKWARD's header (or an optimizer) asks of this
  // pass; FailedPrecondition when they name this worker and no handler is
  // set.
  absl::StatusOr<FusedPlan> PlanFusedSteps(
      const std::vector<FusedStep>& steps) const;
  // Runs ready nodes until none is left; kBackward futures go to `rpcs`.
  void Drain(const std::shared_ptr<DistAutogradContext>& ctx, Pass& pass,
             Outstanding& rpcs);
  absl::StatusOr<std::vector<Tensor>> RunNode(DistAutogradContext& ctx,
                                              Pass& pass, Node& node,
                                              std::vector<Tensor> inputs,
                                              Outstanding& rpcs);
  void SendGradients(DistAutogradContext& ctx, Pass& pass, const RecvNode& node,
                     std::vector<Tensor> grads, Outstanding& rpcs);
  // "worker 'b' autograd context GlobalId(...)": how errors start.
  std::string Where(GlobalId context_id) const;

  rpc::Agent& agent_;
  const Options options_;
  IdGenerator ids_;

  mutable Mutex mu_;
  std::map<GlobalId, std::shared_ptr<DistAutogradContext>> contexts_
      ABSL_GUARDED_BY(mu_);
  std::map<ReplyKey, GlobalId> reply_contexts_ ABSL_GUARDED_BY(mu_);
  // Recently released ids (invariant 6), oldest first in released_order_.
  static constexpr size_t kMaxReleasedIds = 1 << 14;
  std::set<GlobalId> released_ids_ ABSL_GUARDED_BY(mu_);
  std::deque<GlobalId> released_order_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<const FusedStepHandler> fused_handler_ ABSL_GUARDED_BY(mu_);

  // Background releases: per worker, those waiting for a carrier; those on
  // a request in flight, by (worker, request id); the count sent alone and
  // unanswered. release_mu_ is never held while taking another lock.
  struct ReleaseQueue {
    std::vector<GlobalId> queued;
    absl::Time flush_at = absl::InfiniteFuture();
  };
  struct Carried {
    std::vector<GlobalId> ids;
    absl::Time resend_at;  // The carrier's deadline: then it goes alone.
  };
  mutable Mutex release_mu_;
  std::map<int, ReleaseQueue> releases_ ABSL_GUARDED_BY(release_mu_);
  std::map<ReplyKey, Carried> carried_ ABSL_GUARDED_BY(release_mu_);
  size_t sending_alone_ ABSL_GUARDED_BY(release_mu_) = 0;
  uint64_t release_changes_ ABSL_GUARDED_BY(release_mu_) = 0;
  bool stop_releases_ ABSL_GUARDED_BY(release_mu_) = false;
  std::thread release_loop_;
};

// Makes a new context current on this thread for its scope (the rpc context
// entry kContextKey), then releases it everywhere and restores the previous
// entry. Must end on the thread that began it. Aborts if the container's
// ids are exhausted (2^48 contexts). Release errors (a dead worker) are
// logged by the destructor; call Release() to see them.
class ContextScope {
 public:
  // What the scope's end (the destructor) waits for.
  enum class OnExit {
    // Every worker the context touched answered its release (bounded by the
    // container's rpc_timeout per worker).
    kWaitForRelease,
    // Nothing: the context is gone here at once and its release travels on
    // the next request to each worker (ReleaseInBackground; PyTorch's
    // context exit sends it alone), so a training loop's next step does not
    // pay that round trip. The other workers free the context when the
    // release arrives; failures are logged then. Release() still waits.
    kReleaseInBackground,
  };
  // Creates the context in `container` and makes it current on this thread.
  explicit ContextScope(DistAutogradContainer& container,
                        OnExit on_exit = OnExit::kWaitForRelease);
  ~ContextScope();
  ContextScope(const ContextScope&) = delete;
  ContextScope& operator=(const ContextScope&) = delete;

  GlobalId id() const { return id_; }  // The context's id.
  // Releases now (idempotent) and restores the previous rpc context entry;
  // waits up to `timeout` for every worker. On the scope's thread.
  absl::Status Release(absl::Duration timeout = absl::Seconds(60));

 private:
  DistAutogradContainer& container_;
  const OnExit on_exit_;
  GlobalId id_;
  std::optional<rpc::ScopedContextEntry> entry_;
  bool released_ = false;
};

}  // namespace ferry::autograd::dist

#endif  // FERRY_AUTOGRAD_DIST_DIST_AUTOGRAD_H_
