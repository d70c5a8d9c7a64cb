// RRefContext: one worker's side of Ferry's RRef protocol (remote references
// with distributed reference counting), on top of the transport-free Agent
// (rpc/agent.h). One context per agent; several may share a process. Typed
// use goes through rref.h (RRef<T>, remote<T>); this header is the protocol.
// The OWNER holds the value; every other holder is a USER, known to the
// owner by a fork id. Messages: REMOTE_CALL, RREF_FETCH, RREF_FORK_REQUEST,
// RREF_CHILD_ACCEPT, RREF_USER_DELETE (batched, piggybacked), RREF_METHOD
// (rref/messages.h); all are idempotent requests with a reply. Its parts,
// each with its invariants: owner_table.h, user_table.h, delete_batcher.h,
// internal_sender.h; this class keeps the handlers and the glue.
//
// Invariants (the design note explains each):
//  I1 (G1) a user deletes a fork only after the owner confirmed it;
//  I2 (G2) a parent's reference lives while a child fork is pending;
//  I3 the owner deletes R once its value exists (or failed), with no fork
//     and no local handle;
//  I4 deleted fork and RRef ids are remembered: nothing resurrects;
//  I5 internal messages are retried on Unavailable / DeadlineExceeded;
//  I6 a queued deletion is never lost.
//
// Errors: owner death fails to_here, proxies and pending creations with the
// transport's error (Unavailable naming the owner) or their timeout, naming
// the RRef and owner; once the owner is down in the agent's peer-state table
// (Agent::IsPeerDown) they fail at once; its owners drop a down worker's forks.
// Lifetime: Install() registers handlers and an interceptor on the agent that
// hold the context weakly, so it may die before the agent (they then answer
// Unavailable); handles (RRefState) hold it weakly too.
// Thread safety: every method is safe from any thread. Completion callbacks
// run on transport threads and never block.
// Design: docs/design/rref_protocol.md
#ifndef FERRY_RREF_RREF_CONTEXT_H_
#define FERRY_RREF_RREF_CONTEXT_H_

#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ferry/common/future.h"
#include "ferry/common/ids.h"
#include "ferry/common/sync.h"
#include "ferry/rpc/agent.h"
#include "ferry/rpc/message.h"
#include "ferry/rref/class_registry.h"
#include "ferry/rref/delete_batcher.h"
#include "ferry/rref/internal_sender.h"
#include "ferry/rref/messages.h"
#include "ferry/rref/owner_table.h"
#include "ferry/rref/user_table.h"
#include "ferry/tensor/value.h"

namespace ferry::rref {

class RRefContext;

// One worker's reference to an RRef: the owner's local handle or a user's
// fork. Shared by every RRef<T> copy on this worker; its destruction releases
// the reference (a user's deletion is sent once the owner confirmed it).
class RRefState {
 public:
  ~RRefState();
  RRefState(const RRefState&) = delete;
  RRefState& operator=(const RRefState&) = delete;

  bool is_owner() const { return is_owner_; }  // This worker owns the value.
  const rpc::WorkerInfo& owner() const { return owner_; }  // The owner.
  GlobalId rref_id() const { return rref_id_; }  // The value's id.
  // Users: this worker's fork id. Owners: none (GlobalId()).
  GlobalId fork_id() const { return fork_id_; }
  const std::string& type_name() const { return type_name_; }  // The value's.
  // Users: completes when the owner confirmed this fork, with the creation
  // error of a remote() whose function failed. Owners: when the value exists.
  const Future<void>& created() const { return created_; }
  // Null once destroyed.
  std::shared_ptr<RRefContext> context() const { return ctx_.lock(); }
  std::string DebugString() const;  // One line, for logs and errors.

 private:
  friend class RRefContext;
  RRefState() = default;

  std::weak_ptr<RRefContext> ctx_;
  bool is_owner_ = false;
  rpc::WorkerInfo owner_;
  GlobalId rref_id_;
  GlobalId fork_id_;
  std::string type_name_;
  Future<void> created_;
  // Users made by remote(): the value carried by the creation reply (nullopt
  // when it was not carried or the creation failed). A to_here() issued
  // before it completes uses it; later ones fetch (the owner's value may
  // have changed since).
  std::optional<Future<std::optional<Value>>> creation_value_;
  // Set once the deletion was handed to the protocol (Shutdown may do it
  // before the last handle goes).
  std::atomic<bool> released_{false};
};

// One worker's side of the RRef protocol (see the top of this file).
class RRefContext : public std::enable_shared_from_this<RRefContext>,
                    private InternalSender::Ledger {
 public:
  // Install's settings.
  struct Options {
    // Per attempt of an internal message (fork request, accept, delete).
    absl::Duration internal_timeout = absl::Seconds(10);
    int max_attempts = 5;  // Attempts per internal message.
    // Owner side: a REMOTE_CALL reply carries the created value when its
    // tensors, strings and bytes total at most this many bytes and it holds
    // no RRef, protobuf message or autograd state (those take RREF_FETCH,
    // where the RRef and autograd interceptors see them). 0: never.
    size_t inline_value_bytes = 4096;
    // How long a dropped fork's deletion waits for a request to its owner
    // to ride on before it goes alone as USER_DELETE. Zero: at once.
    absl::Duration delete_flush_delay = absl::Milliseconds(2);
    // Shared with other contexts if given; a fresh one otherwise.
    std::shared_ptr<ClassRegistry> classes;
  };

  // What an owner holds of one RRef (owner_table.h).
  using OwnedInfo = rref::OwnedInfo;

  // Registers the RRef handlers and interceptor on `agent` (which must
  // outlive the context, and must be joined: self() known). AlreadyExists if
  // the agent already has RRef handlers. The layers' one install signature
  // (as DistAutogradContainer and DistOptimizerService).
  static absl::StatusOr<std::shared_ptr<RRefContext>> Install(
      rpc::Agent& agent, Options options);
  // Install with the default Options.
  static absl::StatusOr<std::shared_ptr<RRefContext>> Install(
      rpc::Agent& agent) {
    return Install(agent, Options());
  }
  ~RRefContext();

  rpc::Agent& agent() const { return *agent_; }  // As installed on.
  ClassRegistry& classes() { return *classes_; }  // The remote classes.

  // --- Creation (rref.h wraps these). Never fail synchronously: errors
  // complete the state's created() future and surface at the next use. ---

  // Runs `function` (a registered function or class) on `to` with `args`;
  // the result stays there. `timeout` bounds the creation.
  std::shared_ptr<RRefState> Remote(const rpc::WorkerRef& to,
                                    const std::string& function,
                                    Value::List args, std::string type_name,
                                    absl::Duration timeout);
  // Runs `method` of the object behind `target` on its owner; the result
  // stays there as a new RRef.
  std::shared_ptr<RRefState> RemoteMethod(
      const std::shared_ptr<RRefState>& target, const std::string& method,
      Value::List args, std::string type_name, absl::Duration timeout);
  // A value this worker owns.
  std::shared_ptr<RRefState> Local(Value value, std::string type_name);

  // --- Use. ---

  // A copy of the value (fetched from the owner unless local). Errors name
  // the RRef, owner and limit.
  Future<Value> Fetch(const std::shared_ptr<RRefState>& state,
                      absl::Duration timeout);
  // Owner only: the value (FailedPrecondition elsewhere), waiting up to
  // `timeout` for a pending creation.
  absl::StatusOr<Value> LocalValue(const RRefState& state,
                                   absl::Duration timeout);
  // Owner only: the object of a remote-object RRef.
  absl::StatusOr<std::shared_ptr<void>> LocalObject(const RRefState& state,
                                                    std::type_index type,
                                                    absl::Duration timeout);
  // Runs `method` on the object behind `state`, on its owner.
  Future<Value> CallMethod(const std::shared_ptr<RRefState>& state,
                           const std::string& method, Value::List args,
                           absl::Duration timeout);

  // --- Failures and shutdown. ---

  // Waits until this worker has no internal message in flight, no pending
  // child and no deletion waiting for a confirmation. DeadlineExceeded
  // (listing what is pending) after `timeout`.
  absl::Status AwaitSettled(absl::Duration timeout) const;

  // Graceful, collective (every worker calls it, like Agent::Shutdown):
  // releases every user reference this worker still holds (handles held by
  // the program become unusable), waits for this worker's protocol messages
  // to settle, shuts the agent down gracefully (a barrier: after it, every
  // worker's deletions have been served), then drops this worker's own
  // unforked values. Returns FailedPrecondition listing the OwnerRRefs still
  // registered (leaked: a fork whose deletion never came), or the first
  // error of the steps above. `timeout` bounds each step.
  absl::Status Shutdown(absl::Duration timeout = absl::Seconds(60));
  // The same for a worker leaving a running group (rpc/agent.h, Membership),
  // not collective: releases this worker's user references, waits until its
  // protocol settled (the owners have served its deletions), leaves the
  // group (Agent::Leave), then drops its own values. FailedPrecondition
  // lists the OwnerRRefs other workers still held: they lose them (their
  // uses fail naming this worker as departed).
  absl::Status Leave(absl::Duration timeout = absl::Seconds(60));

  // --- Inspection (tests, admin). ---
  // The RRefs this worker owns and has not deleted.
  std::vector<OwnedInfo> Owned() const;
  size_t num_owned() const;  // Owned().size()
  size_t num_users() const;  // Live user forks on this worker.
  // Forks this worker sent that the owner has not yet accepted.
  size_t num_pending_children() const;
  // Internal messages (fork, accept, delete) sent and not yet answered.
  int num_in_flight() const;
  // Rows of the "rref" inspector (rpc/inspect.h), registered on the agent:
  // rref_context (counts), owned_rref (id, type, holders as worker/fork,
  // local handles, created), user_rref (id, fork, type, owner, confirmed,
  // pending forks), pending_fork (a fork sent, not yet accepted).
  std::vector<rpc::InspectionRow> Inspect() const;
  // Counters of internal messages sent, by type (each attempt counts).
  std::map<rpc::MessageType, int> messages_sent() const;

  // Interceptor/handler entry points for Value conversion (rref.h).
  // Takes a handle for this worker's reference (attached to a Value).
  static RRefHandle MakeHandle(const std::shared_ptr<RRefState>& state);

 private:
  using Slot = OwnedSlot;
  // Owner only: the slot of `state` once its creation succeeded (waiting up
  // to `timeout`); errors say local_value() of what, and that only the owner
  // has the `kind` ("value" or "object").
  absl::StatusOr<std::shared_ptr<Slot>> CreatedSlot(const RRefState& state,
                                                    absl::Duration timeout,
                                                    const char* kind);
  using PendingChild = UserTable<RRefState>::Child;
  using Done = InternalSender::Done;

  RRefContext(rpc::Agent* agent, Options options);
  // Shutdown (collective) or Leave.
  absl::Status Stop(absl::Duration timeout, bool leave);
  absl::Status Install();

  // --- Sending and receiving handles (the interceptor). ---
  absl::Status Intercept(rpc::InterceptPoint point, const rpc::WorkerInfo& peer,
                         rpc::Message& message);
  absl::Status ForkForSend(RRefHandle& handle, int to);
  absl::Status AcceptReceived(RRefHandle& handle, int parent);

  // --- Handlers. ---
  Future<rpc::Message> HandleRemoteCall(rpc::Message request);
  Future<rpc::Message> HandleFetch(rpc::Message request);
  Future<rpc::Message> HandleForkRequest(rpc::Message request);
  Future<rpc::Message> HandleChildAccept(rpc::Message request);
  Future<rpc::Message> HandleUserDelete(rpc::Message request);
  Future<rpc::Message> HandleMethod(rpc::Message request);

  // --- Owner side. ---
  Future<Value> RunCreation(const std::shared_ptr<Slot>& slot,
                            const rpc::Message& request);
  Future<rpc::Message> CreationReply(const std::shared_ptr<Slot>& slot) const;
  Future<Value> RunMethod(const std::shared_ptr<Slot>& slot,
                          const std::string& method, const Value& args);
  std::shared_ptr<RRefState> NewOwnerHandle(GlobalId rref_id,
                                            const std::string& type_name,
                                            const std::shared_ptr<Slot>& slot)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Deletes fork `fork_id` of `rref_id` for worker `sender`: a fork
  // registered to another holder is left alone (only its holder drops it).
  void DeleteFork(GlobalId rref_id, GlobalId fork_id, int sender);
  void OnCreated(GlobalId rref_id);

  std::shared_ptr<RRefState> RemoteImpl(const rpc::WorkerRef& to,
                                        const std::string& function,
                                        Value::List args, std::string type_name,
                                        absl::Duration timeout,
                                        std::shared_ptr<RRefState> keep_alive);

  // --- User side. ---
  std::shared_ptr<RRefState> NewUser(
      const rpc::WorkerInfo& owner, GlobalId rref_id, GlobalId fork_id,
      std::string type_name, Future<void> created,
      std::optional<Future<std::optional<Value>>> creation_value =
          std::nullopt);
  // RREF_FETCH to the owner (Fetch's remote path).
  Future<Value> FetchFromOwner(const std::shared_ptr<RRefState>& state,
                               absl::Duration timeout);
  friend class RRefState;
  void OnStateDropped(bool is_owner, const rpc::WorkerInfo& owner,
                      GlobalId rref_id, GlobalId fork_id,
                      const Future<void>& created);
  // Queues fork F's deletion for `owner`; unless a batch to `owner` is in
  // flight (its completion takes what queued meanwhile), arms the flush.
  void QueueUserDelete(int owner, GlobalId rref_id, GlobalId fork_id);
  void SendUserDeletes(int owner, DeleteBatch batch);
  // Moves what is queued for `owner` (unless a batch is in flight) into
  // `m`'s RRef header (RRefFields::deletes); returns it (empty: none).
  DeleteBatch AttachDeletes(int owner, rpc::Message& m);
  // The carrier of `batch` completed with `s`: done, or sent again alone.
  void CarrierDone(int owner, DeleteBatch batch, const absl::Status& s);
  // Ends the batch in flight to `owner`; returns what queued meanwhile (now
  // the batch in flight, for the caller to send outside the lock).
  DeleteBatch EndBatch(int owner) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Applies the deletions a received request's RRef header carries.
  absl::Status ApplyPiggybackedDeletes(const rpc::WorkerInfo& peer,
                                       rpc::Message& m);
  // The flusher thread: sends queued batches whose delay passed.
  void FlushLoop(const std::weak_ptr<RRefContext>& weak);
  // Waits until batches are due (moved into `due`, marked in flight): true;
  // false once the flusher must stop.
  bool AwaitDueDeletes(std::vector<std::pair<int, DeleteBatch>>& due)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Agent::Send with the owner's queued deletions riding along.
  Future<rpc::Message> SendCarrying(int owner, rpc::Message m,
                                    absl::Duration timeout);

  // --- Internal messages (sender_, I5). ---
  void SendInternal(int to, rpc::Message message, Done done,
                    std::optional<absl::Duration> timeout = std::nullopt,
                    bool retry_timeouts = true);
  // InternalSender::Ledger: in_flight_ and sent_ under mu_; failed peers
  // are the agent's (IsPeerDown), exhausted retries reported to it.
  bool BeginMessage(int to) override;
  void CountAttempt(rpc::MessageType type) override;
  bool IsFailed(int to) override { return IsPeerDown(to); }
  // Whether worker `id` is known dead: down, for any reason, in the agent's
  // peer-state table (Agent::IsPeerDown).
  bool IsPeerDown(int id) const;
  void GaveUp(int to, const absl::Status& last) override;
  void EndMessage() override;
  // Worker `id`'s first entry in the agent's peer-state table: the forks it
  // held here and the children sent to it go (see the header).
  void DropPeer(int id);

  absl::StatusOr<GlobalId> NextId();
  absl::StatusOr<rpc::WorkerInfo> Worker(int id) const;
  std::string Describe(GlobalId rref_id, const std::string& owner) const;
  std::string WorkerName(int id) const;

  rpc::Agent* const agent_;
  const Options options_;
  const std::shared_ptr<ClassRegistry> classes_;
  IdGenerator ids_;
  const InternalSender sender_;

  mutable Mutex mu_;
  // Owner side: every RRef this worker owns and has not deleted (I3, I4).
  OwnerTable owned_ ABSL_GUARDED_BY(mu_);
  // User side: live forks (dedups a received handle delivered twice), forks
  // sent and not yet accepted (I2), deletions not yet answered (I1).
  UserTable<RRefState> users_ ABSL_GUARDED_BY(mu_);
  // User side: deletions queued per owner, and the batch in flight (I6).
  DeleteBatcher batcher_ ABSL_GUARDED_BY(mu_);
  bool stop_flusher_ ABSL_GUARDED_BY(mu_) = false;
  std::thread flusher_;
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<rpc::MessageType, int> sent_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ferry::rref

#endif  // FERRY_RREF_RREF_CONTEXT_H_
