// Agent: a named worker of a group that exchanges Messages with the others.
// The transport-free seam of rpc/: the gRPC agent (rpc/grpc/) and the
// in-process test agent (rpc/testing/) implement it; rref/, autograd/ and
// user code see only this header.
//
// Handlers (RegisterHandler) run on the agent's executor, may block and may
// reply later with a pending Future; functions registered with
// RegisterNonBlocking may run on a transport thread and must never block.
// Futures returned by Send / rpc_async complete on a transport thread:
// continuations must not block. Interceptors see every message both ways.
// Send's timeout bounds the whole exchange; a handler whose deadline passed
// before it started is not run.
//
// Errors are values naming the worker and function (or message type):
//   NotFound          unknown function / worker name or id
//   InvalidArgument   wrong argument count or types, malformed message
//   Unimplemented     the peer has no handler for the message type
//   DeadlineExceeded  the timeout passed
//   Unavailable       the peer is unreachable, dead, left, or this agent
//                     shut down
//   Cancelled         non-graceful shutdown with the call in flight
//   FailedPrecondition  a join the group cannot take (shutting down)
//   <any>             the handler's / function's own error, with its code
//
// Lifecycle: Shutdown(graceful=true) is collective (every worker calls it);
// Shutdown(false) cancels outgoing calls and stops at once; idempotent.
// Ids are never reused; a departed worker stays known by id and name.
// Several agents may live in one process; nothing is process-wide. Thread
// safety: every public method is safe from any thread, handlers included.
// Design: docs/design/grpc_agent.md
#ifndef FERRY_RPC_AGENT_H_
#define FERRY_RPC_AGENT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "ferry/common/executor.h"
#include "ferry/common/future.h"
#include "ferry/common/ids.h"
#include "ferry/common/sync.h"
#include "ferry/rpc/context.h"
#include "ferry/rpc/function_registry.h"
#include "ferry/rpc/inspect.h"
#include "ferry/rpc/message.h"
#include "ferry/tensor/value.h"

namespace ferry::rpc {

// A member of the group as the agent knows it.
struct WorkerInfo {
  std::string name;     // Unique in the group.
  int id = -1;          // The rank.
  std::string address;  // Transport-specific ("127.0.0.1:port" for gRPC).
};

// Names a peer: by name, id (rank) or WorkerInfo.
class WorkerRef {
 public:
  // Implicit, so that a name, an id or a WorkerInfo is accepted where a
  // WorkerRef is expected.
  WorkerRef(const char* name) : ref_(std::string(name)) {}  // NOLINT
  // By name.
  WorkerRef(std::string name) : ref_(std::move(name)) {}    // NOLINT
  // By id (the rank).
  WorkerRef(int id) : ref_(id) {}                           // NOLINT
  // By the member's id.
  WorkerRef(const WorkerInfo& info) : ref_(info.id) {}      // NOLINT
  // The name or the id.
  const std::variant<std::string, int>& ref() const { return ref_; }

 private:
  std::variant<std::string, int> ref_;
};

// Serves one request. Runs on the agent's executor with the request's context
// installed (as the kReceiveRequest interceptors left it). The reply's id and
// type default to the request's.
using Handler = std::function<Future<Message>(Message request)>;

// Where an interceptor sees a message.
enum class InterceptPoint {
  kSendRequest,     // Caller, in Send, on the sending thread.
  kReceiveRequest,  // Callee, on the executor, before the handler.
  kSendReply,       // Callee, when the handler's reply is ready.
  kReceiveReply,    // Caller, before Send's future completes.
};

// `peer` is the other end of the exchange. May edit `message`; an error fails
// the exchange with that error (the handler does not run / the caller gets
// it). Must not block.
using Interceptor = std::function<absl::Status(
    InterceptPoint point, const WorkerInfo& peer, Message& message)>;

// Told that `peer` is dead or unreachable; `why` is the error that showed it.
// Runs on the thread that found the failure (often a transport thread), with
// no agent lock held: must not block.
using PeerFailureListener =
    std::function<void(const WorkerInfo& peer, const absl::Status& why)>;

// Why a peer is down, in the agent's peer-state table (one table per agent;
// docs/design/grpc_agent.md, "Peer state"). A peer may be down for several
// reasons; each is recorded once, with the status that showed it. What the
// agent itself does per reason, unchanged by the table (layers decide the
// rest; IsPeerFailed drives Announce, WaitForWorker and the gRPC probe):
//
//   reason             from            IsPeerFailed  failure    membership
//                                                    listeners  listeners
//   kTransportFailure  the transport   yes           told       -
//   kDeparted          member table    no            -          told kLeft
//   kDetectorReport    ReportPeerDown  no            -          -
//   kRetriesExhausted  ReportPeerDown  no            -          -
//
// Every reason is told to the peer-down listeners that asked for it.
enum class PeerDownReason : uint32_t {
  kTransportFailure = 1,   // The transport found it dead or unreachable.
  kDeparted = 2,           // It left the group (or a restart took its name).
  kDetectorReport = 4,     // An outside failure detector reported it.
  kRetriesExhausted = 8,   // A layer's retried message to it still failed.
};
// A set of PeerDownReason values (their bits or-ed together).
using PeerDownReasons = uint32_t;
// Every reason.
inline constexpr PeerDownReasons kAnyPeerDownReason = 1 | 2 | 4 | 8;
// "transport failure", "departed", "reported by a detector", "retries
// exhausted".
absl::string_view PeerDownReasonName(PeerDownReason reason);

// One (peer, reason) entry of the peer-state table.
struct PeerDown {
  WorkerInfo peer;  // As the member table knows it (name empty if never).
  PeerDownReason reason = PeerDownReason::kTransportFailure;  // Why.
  // The status as reported (a transport's error, the departure, a
  // reporter's status); what PeerFailureListener gets.
  absl::Status cause;
  // cause's code; the message names the worker, its id and the reason,
  // then cause's message.
  absl::Status why;
  // Whether no other reason was recorded for `peer` before this one (a
  // layer that treats every reason alike acts on this entry only).
  bool first = false;
};
// Told of one new entry of the peer-state table, once; on the reporting
// thread (often a transport thread), with no agent lock held: must not
// block.
using PeerDownListener = std::function<void(const PeerDown& down)>;

// What happened to a member (MembershipListener).
enum class MembershipChange { kJoined = 1, kLeft = 2 };
// Told that `worker` joined or left the group. Runs on the thread that
// applied the change (the agent's executor or the caller of Join / Leave),
// with no agent lock held: must not block.
using MembershipListener =
    std::function<void(const WorkerInfo& worker, MembershipChange change)>;

// A named worker of a group (see the top of this file); transports derive
// from it.
class Agent {
 public:
  // The transport-independent settings.
  struct Options {
    int num_worker_threads = 16;  // Threads of the executor running handlers.
    // Default timeout of Send and calls.
    absl::Duration rpc_timeout = absl::Seconds(60);
    // Queue bound of the executor running handlers.
    size_t max_pending_calls = 1 << 16;
  };

  virtual ~Agent();
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  // self().address is set with the group (before that, only by SetSelf).
  const WorkerInfo& self() const { return self_; }
  // Whether the group is known (SetWorkers ran); readers of the group on
  // transport threads check it first.
  bool has_group() const { return has_group_.load(std::memory_order_acquire); }
  // Whether this worker began to stop (past its shutdown barrier, or its
  // departure announced): it refuses joiners from then on (Membership).
  bool stopping() const;
  // The present members (self included), by id.
  int world_size() const;
  // A present member; NotFound for an unknown name or id, Unavailable naming
  // the worker for one that left.
  absl::StatusOr<WorkerInfo> GetWorkerInfo(const WorkerRef& ref) const;
  // Every present member, by id.
  std::vector<WorkerInfo> GetWorkerInfos() const;

  // --- Membership (see the header comment). ---

  // Whether worker `id` left the group gracefully.
  bool HasLeft(int id) const;
  // Counts the changes applied to this worker's table (0: as formed).
  uint64_t membership_version() const;
  // Subscribes `listener` for this agent's life (capture weak references);
  // each later change once, to every listener, in the order added.
  void AddMembershipListener(MembershipListener listener);
  // Leaves the group gracefully: waits for this worker's outgoing calls,
  // tells every member, then stops serving (after the calls it received were
  // answered). Other workers' calls to it then fail at once naming it. Not
  // collective; idempotent; afterwards the agent is shut down. The default
  // is Unimplemented, naming the worker.
  virtual absl::Status Leave(absl::Duration timeout = absl::Seconds(60));

  // --- The message seam. ---

  // Sends `message` to `to`; completes with the reply or an error naming the
  // peer. Fills in id, caller, deadline (now + timeout; nullopt means
  // Options::rpc_timeout) and the current thread's context.
  Future<Message> Send(const WorkerRef& to, Message message,
                       std::optional<absl::Duration> timeout = std::nullopt);

  // Serves `type`. AlreadyExists if taken (kCall is built in); InvalidArgument
  // for kUnspecified. Register before peers send that type.
  absl::Status RegisterHandler(MessageType type, Handler handler);
  // Whether `type` has a handler (RegisterHandler, or built in).
  bool HasHandler(MessageType type) const;

  // Adds an interceptor; interceptors run in the order added.
  void AddInterceptor(Interceptor interceptor);

  // --- Peer state (PeerDownReason above). ---

  // Subscribes `listener` for this agent's life (capture weak references)
  // to the entries whose reason is in `reasons`: those recorded already at
  // once, on this thread (by id, each peer's in recording order); each later
  // one once, to every listener, in the order added.
  void AddPeerDownListener(PeerDownListener listener,
                           PeerDownReasons reasons = kAnyPeerDownReason);
  // Whether worker `id` is down for a reason in `reasons`. Lock-free while
  // no peer is down.
  bool IsPeerDown(int id, PeerDownReasons reasons = kAnyPeerDownReason) const;
  // Every entry of the table, by id, each peer's in recording order.
  std::vector<PeerDown> PeersDown() const;
  // Records that worker `id` is down for `reason`, kDetectorReport (an
  // outside failure detector: a launcher that saw the process exit) or
  // kRetriesExhausted (a layer whose retried message still failed), as the
  // non-OK `cause` shows; tells the peer-down listeners once. Taken at any
  // time, also while this agent stops, for any id (a worker not known yet
  // is recorded by id). The agent acts on neither reason itself (see the
  // table above). OK when already recorded; InvalidArgument naming the
  // worker for a negative id, this worker itself, another reason or an OK
  // `cause`.
  absl::Status ReportPeerDown(int id, PeerDownReason reason,
                              const absl::Status& cause);

  // Subscribes `listener` for this agent's life (capture weak references) to
  // kTransportFailure entries, with their cause: AddPeerDownListener for
  // that reason alone. Peers already found failed are reported to it at
  // once, on this thread; each later failure once, in the order added.
  void AddPeerFailureListener(PeerFailureListener listener);
  // Whether worker `id` was reported failed by the transport:
  // IsPeerDown(id, kTransportFailure).
  bool IsPeerFailed(int id) const;
  // Waits until a present member named `name` is neither reported failed nor
  // worker `stale_id` (the id whose call failed; -1: any), and returns it: a
  // worker restarted under its name (a new id) is back. For a caller whose
  // call failed with Unavailable naming that worker. DeadlineExceeded naming
  // the worker after `timeout`; Unavailable once this agent stops.
  absl::StatusOr<WorkerInfo> WaitForWorker(const std::string& name,
                                           absl::Duration timeout,
                                           int stale_id = -1) const;

  // Requests received before the group was known and still waiting for it
  // (inspection and tests).
  int requests_awaiting_group() const;

  // Layers' inspectors (rpc/inspect.h), exposed by the transport's admin
  // service.
  InspectorRegistry& inspectors() { return inspectors_; }  // See above.
  const InspectorRegistry& inspectors() const { return inspectors_; }  // Same.

  // --- Functions (the kCall client). ---

  // The functions this agent serves (shared with whoever passed it).
  FunctionRegistry& registry() { return *registry_; }
  // registry().Register: serves `f` as `name` (rpc/function_registry.h).
  template <typename F>
  absl::Status Register(std::string name, F f, std::string doc = "") {
    return registry_->Register(std::move(name), std::move(f), std::move(doc));
  }
  // A function that never blocks (rpc/function_registry.h).
  template <typename F>
  absl::Status RegisterNonBlocking(std::string name, F f,
                                   std::string doc = "") {
    return registry_->RegisterNonBlocking(std::move(name), std::move(f),
                                          std::move(doc));
  }

  // Calls `function` on `to` with `args` (a list). The untyped core of
  // rpc_async; `timeout` nullopt means Options::rpc_timeout.
  Future<Value> CallAsync(const WorkerRef& to, const std::string& function,
                          Value::List args,
                          std::optional<absl::Duration> timeout = std::nullopt);

  // rpc_async(to, "fn", args...) -> Future<R>; R = Value gives the raw result.
  template <typename R = Value, typename... A>
  Future<R> rpc_async(const WorkerRef& to, const std::string& function,
                      A&&... args) {
    return Typed<R>(CallAsync(to, function,
                              Value::List{ToValue(std::forward<A>(args))...}));
  }
  // The same, waiting for the result: the core of rpc_sync (no continuation
  // future per call).
  Result<Value> CallSync(const WorkerRef& to, const std::string& function,
                         Value::List args,
                         std::optional<absl::Duration> timeout = std::nullopt);

  // rpc_sync(to, "fn", args...) -> Result<R>: waits for the result.
  template <typename R = Value, typename... A>
  Result<R> rpc_sync(const WorkerRef& to, const std::string& function,
                     A&&... args) {
    return TypedResult<R>(CallSync(
        to, function, Value::List{ToValue(std::forward<A>(args))...}));
  }
  // The same with a per-call timeout instead of Options::rpc_timeout.
  template <typename R = Value, typename... A>
  Future<R> rpc_async_for(absl::Duration timeout, const WorkerRef& to,
                          const std::string& function, A&&... args) {
    return Typed<R>(CallAsync(
        to, function, Value::List{ToValue(std::forward<A>(args))...}, timeout));
  }
  // rpc_sync with a per-call timeout.
  template <typename R = Value, typename... A>
  Result<R> rpc_sync_for(absl::Duration timeout, const WorkerRef& to,
                         const std::string& function, A&&... args) {
    return TypedResult<R>(CallSync(
        to, function, Value::List{ToValue(std::forward<A>(args))...}, timeout));
  }

  // Typed calls through a RemoteFunction handle (rpc/remote_function.h):
  // arguments and result checked at compile time; `timeout` nullopt means
  // Options::rpc_timeout.
  template <typename R, typename... P, typename... A>
    requires CallableWith<RemoteFunction<R(P...)>, A...>
  Future<R> rpc_async(const WorkerRef& to, const RemoteFunction<R(P...)>& f,
                      A&&... args) {
    return Typed<R>(
        CallAsync(to, f.name(), Value::List{ToValue(P{std::forward<A>(args)})...}));
  }
  // Typed rpc_sync: waits for the result.
  template <typename R, typename... P, typename... A>
    requires CallableWith<RemoteFunction<R(P...)>, A...>
  Result<R> rpc_sync(const WorkerRef& to, const RemoteFunction<R(P...)>& f,
                     A&&... args) {
    return TypedResult<R>(
        CallSync(to, f.name(), Value::List{ToValue(P{std::forward<A>(args)})...}));
  }
  // Typed rpc_async with a per-call timeout.
  template <typename R, typename... P, typename... A>
    requires CallableWith<RemoteFunction<R(P...)>, A...>
  Future<R> rpc_async_for(absl::Duration timeout, const WorkerRef& to,
                          const RemoteFunction<R(P...)>& f, A&&... args) {
    return Typed<R>(CallAsync(
        to, f.name(), Value::List{ToValue(P{std::forward<A>(args)})...},
        timeout));
  }
  // Typed rpc_sync with a per-call timeout.
  template <typename R, typename... P, typename... A>
    requires CallableWith<RemoteFunction<R(P...)>, A...>
  Result<R> rpc_sync_for(absl::Duration timeout, const WorkerRef& to,
                         const RemoteFunction<R(P...)>& f, A&&... args) {
    return TypedResult<R>(CallSync(
        to, f.name(), Value::List{ToValue(P{std::forward<A>(args)})...},
        timeout));
  }

  // See the header comment. `timeout` bounds the whole shutdown.
  virtual absl::Status Shutdown(bool graceful = true,
                                absl::Duration timeout = absl::Seconds(60)) = 0;

 protected:
  // `registry` may be shared with other agents; null creates one.
  Agent(Options options, std::shared_ptr<FunctionRegistry> registry);

  // Names this worker and starts the executor; once, before any Dispatch.
  void SetSelf(WorkerInfo self);
  // Sets the group (self among them, whose address self() takes; entries
  // keyed by their id); once, before any Send. Requests that arrived before
  // (a fast peer) wait for it to run.
  void SetWorkers(std::vector<WorkerInfo> workers);
  // Both at once (a group formed, or the view a joiner is handed).
  void SetGroup(WorkerInfo self, std::vector<WorkerInfo> workers) {
    SetSelf(std::move(self));
    SetWorkers(std::move(workers));
  }

  // Transport: deliver `request` (fully filled in) to `to` and complete with
  // the reply, or with an error naming the peer and request (DescribeTarget).
  // `timeout` is the caller's full timeout, for error texts; the deadline is
  // request.deadline. Called on the sender's thread; must not block.
  virtual Future<Message> Transmit(const WorkerInfo& to, Message request,
                                   absl::Duration timeout) = 0;

  // Transport: serves a received request (deadline already converted to the
  // local clock). Runs the interceptors and the handler on the executor;
  // the future completes with the reply (interceptors run) or the error.
  Future<Message> Dispatch(Message request);
  // The same, with the request produced on the executor by `receive` (e.g.
  // decoding bytes off a transport thread). An error from `receive` is the
  // reply. `type` selects the handler (Unimplemented when there is none).
  using Receiver = absl::AnyInvocable<absl::StatusOr<Message>()>;
  // (Dispatch with a Receiver: see above.)
  Future<Message> Dispatch(MessageType type, Receiver receive);
  // The same, for a transport that knows the called function's name before
  // decoding (kCall): when that function is registered non-blocking, `receive`
  // and the function run here, on the calling transport thread, and the
  // future is usually complete on return. Otherwise as above.
  Future<Message> Dispatch(MessageType type, const std::string& function,
                           Receiver receive);
  // The same, handing the reply (interceptors run) or the error to `done`
  // instead of a future: called exactly once, on the thread that finished
  // the request (often before Dispatch returns). No future is made for a
  // function whose result is ready, so a transport's per-call path pays for
  // none.
  using ReplyCallback = absl::AnyInvocable<void(Result<Message>)>;
  // (Dispatch with a ReplyCallback: see above.)
  void Dispatch(MessageType type, const std::string& function, Receiver receive,
                ReplyCallback done);

  // Stops the executor (draining or cancelling queued handlers). Idempotent.
  // Also ends the wait of requests that arrived before the group was known.
  void StopExecutor(bool drain);
  // Handlers queued on the executor, not yet running (0 before SetSelf).
  size_t ExecutorQueueDepth() const {
    return executor_ ? executor_->QueueSize() : 0;
  }

  // Ends the wait of early requests (Unavailable), stops reporting peer
  // failures and refuses joiners (naming `state`, "shutting down" or
  // "leaving the group"); for a transport about to stop serving. Idempotent:
  // the first call's state stays.
  void BeginStop(absl::string_view state = "shutting down");

  // Transport: worker `id` is dead or unreachable, as `why` shows: a
  // kTransportFailure entry. The first report of a peer tells every listener
  // (on this thread, no lock held); repeats, self, unknown or departed ids
  // and reports after BeginStop are ignored.
  void ReportPeerFailure(int id, const absl::Status& why);

  const Options& options() const { return options_; }  // As constructed.

  // --- Membership, for transports (rpc/agent_membership.cc). ---

  // Adds `worker`, who joined after the group formed; returns whether the
  // table changed. A present member of the same name (with an older id)
  // must have left: it is marked departed first. Departed and known ids are
  // ignored. Tells the membership listeners.
  bool AddMember(const WorkerInfo& worker);
  // Marks `worker.id` departed (recorded even when the id is not known yet,
  // so a late join notice is ignored); returns whether the table changed.
  bool RemoveMember(const WorkerInfo& worker);
  // Sends a MEMBERSHIP notice of `change` of `subject` to each of `targets`
  // (never to self, nor to a peer reported failed) and waits for every reply
  // until `deadline`. Returns the
  // targets whose notice failed, with the error.
  std::vector<std::pair<WorkerInfo, absl::Status>> Announce(
      MembershipChange change, const WorkerInfo& subject,
      const std::vector<WorkerInfo>& targets, absl::Time deadline);

 private:
  struct Group;
  std::shared_ptr<const Group> group() const;
  // Applies `edit` to a copy of the group and publishes it; returns whether
  // `edit` changed it (it returns that too).
  bool EditGroup(absl::FunctionRef<bool(Group&)> edit);
  void TellMembershipListeners(const WorkerInfo& worker,
                               MembershipChange change);
  Future<Message> ServeMembership(Message request);

  template <typename R>
  static Result<R> TypedResult(Result<Value> v) {
    if constexpr (std::is_same_v<R, Value>) {
      return v;
    } else if constexpr (std::is_void_v<R>) {
      return v.status();
    } else {
      if (!v.ok()) return v.status();
      return FromValue<R>(*v);
    }
  }
  template <typename R>
  static Future<R> Typed(Future<Value> f) {
    if constexpr (std::is_same_v<R, Value>) {
      return f;
    } else {
      return f.Then([](const Result<Value>& v) -> Result<R> {
        return TypedResult<R>(v);
      });
    }
  }

  // Copy-on-write, so a message keeps the list it started with and a
  // reply arriving late never touches the agent.
  using InterceptorList = std::shared_ptr<const std::vector<Interceptor>>;
  InterceptorList Interceptors() const;
  static absl::Status Intercept(const InterceptorList& list,
                                InterceptPoint point, const WorkerInfo& peer,
                                Message& message);
  Handler FindHandler(MessageType type) const;
  // Waits until the group is known; the error says why it is not.
  absl::Status AwaitGroup(const Message& request);
  // What serving a request gives: the reply now, or a future of it.
  using Answer = std::variant<Result<Message>, Future<Message>>;
  // Serves the request `receive` gives with `entry` (a kCall function) or,
  // when null, `handler`; on this thread or, unless `entry` is non-blocking
  // and the group known, on the executor. Calls `done` once.
  void DispatchTo(MessageType type, std::shared_ptr<const FunctionEntry> entry,
                  Handler handler, Receiver receive, ReplyCallback done);
  // Runs `handler` on `request` with its context installed, after the deadline
  // check and the receive interceptors; the reply passes the send ones and
  // goes to `done` (once, here or where the handler's future completes).
  // The request is taken by reference and moved from at most once, into the
  // handler: a Message is large, and this is every request's path.
  void Serve(absl::FunctionRef<Answer(Message&&)> handler,
             absl::StatusOr<Message>&& request, ReplyCallback done);
  // Serve up to the handler's answer; a ready reply is returned, a pending
  // one handed to `done` (then nullopt).
  std::optional<Result<Message>> ServeNow(
      absl::FunctionRef<Answer(Message&&)> handler,
      absl::StatusOr<Message>& request, ReplyCallback& done);
  Future<Message> ServeCall(Message request);
  Answer ServeFunction(const FunctionEntry& entry, Message&& request);
  WorkerInfo PeerInfo(int id, const std::string& name) const;
  // A new entry of the peer-state table and the listeners to tell of it
  // (those subscribed when it was recorded).
  struct NewPeerDown {
    PeerDown down;
    std::vector<PeerDownListener> listeners;
  };
  // Adds (`peer`, `reason`) to the peer-state table; nullopt when it was
  // there or `peer` is this worker.
  std::optional<NewPeerDown> RecordPeerDown(const WorkerInfo& peer,
                                            PeerDownReason reason,
                                            const absl::Status& cause)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether worker `id` has an entry with a reason in `reasons`.
  bool IsPeerDownLocked(int id, PeerDownReasons reasons) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Tells the listeners of `news` (no lock held).
  void TellPeerDownListeners(const NewPeerDown& news);
  // Records `worker`'s departure (kDeparted) and tells the listeners.
  void RecordDeparture(const WorkerInfo& worker);
  // Worker `id`, present or departed; {"", id, ""} when unknown.
  WorkerInfo KnownWorker(int id) const;

  const Options options_;
  const std::shared_ptr<FunctionRegistry> registry_;
  // Written once by SetSelf / SetWorkers; read-only afterwards. Handlers
  // run only once has_group_ is set (AwaitGroup).
  WorkerInfo self_;
  std::string log_label_;  // "name:id", set with self_.
  std::atomic<bool> has_group_{false};
  // The member table: an immutable snapshot replaced on each change, so a
  // reader holds group_mu_ only to copy the pointer.
  mutable Mutex group_mu_;
  std::shared_ptr<const Group> group_ ABSL_GUARDED_BY(group_mu_);
  std::unique_ptr<IdGenerator> ids_;
  std::unique_ptr<ThreadPoolExecutor> executor_;
  InspectorRegistry inspectors_;

  mutable Mutex mu_;
  std::map<MessageType, Handler> handlers_ ABSL_GUARDED_BY(mu_);
  InterceptorList interceptors_ ABSL_GUARDED_BY(mu_);
  bool group_known_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::string stop_state_ ABSL_GUARDED_BY(mu_);  // BeginStop's `state`.
  int awaiting_group_ ABSL_GUARDED_BY(mu_) = 0;
  // A peer-down listener and the reasons it asked for.
  struct PeerDownSubscription {
    PeerDownReasons reasons;
    PeerDownListener listener;
  };
  std::vector<PeerDownSubscription> peer_down_listeners_ ABSL_GUARDED_BY(mu_);
  // The peer-state table: by id, each peer's entries in recording order.
  std::map<int, std::vector<PeerDown>> peers_down_ ABSL_GUARDED_BY(mu_);
  // Set (under mu_) with the table's first entry: IsPeerDown's fast path.
  std::atomic<bool> any_peer_down_{false};
  std::vector<MembershipListener> membership_listeners_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ferry::rpc

#endif  // FERRY_RPC_AGENT_H_
