// InProcessNetwork: several Agents in one process whose messages travel
// through one queue that the test controls. For protocol tests of layers on
// the Agent seam (RRef reference counting, distributed autograd) and for the
// agent conformance suite.
//
//   InProcessNetwork net({"a", "b"}, {.auto_deliver = false});
//   Future<Value> f = net.agent("a").rpc_async("b", "add", x, y);
//   auto req = net.AwaitQueued(Matching("a", "b"), absl::Seconds(10));
//   net.Deliver(req->seq);                       // b runs "add"
//   auto rep = net.AwaitQueued(RepliesTo("a"), absl::Seconds(10));
//   net.Deliver(rep->seq);                       // f completes
//
// Every request and every reply is a queued message with a sequence number.
// In manual mode (auto_deliver = false) it stays queued until the test
// Delivers, Drops or Duplicates it, in any order: holding a message while
// others pass is a delay. In auto mode every message is delivered as soon as
// it is queued, on the queuing thread, so ordinary tests need no stepping;
// Hold(predicate) keeps matching messages queued (delayed) meanwhile.
//
// Failure switches: Kill(worker) (see there). Timeouts hold in both modes:
// a call whose message was dropped or never delivered fails with
// DeadlineExceeded at its deadline (a timer thread enforces it), so no test
// hangs on a lost message.
//
// Replies complete the caller's future on the thread that delivers them
// (the test's thread in manual mode, the callee's executor in auto mode).
//
// Thread safety: every method is safe from any thread. The network owns its
// agents and must outlive every use of them; destroying it shuts them down
// non-gracefully.
#ifndef FERRY_RPC_TESTING_IN_PROCESS_H_
#define FERRY_RPC_TESTING_IN_PROCESS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ferry/common/future.h"
#include "ferry/common/sync.h"
#include "ferry/rpc/agent.h"

namespace ferry::rpc::testing {

class InProcessNetwork;

// One worker of an InProcessNetwork. WorkerInfo::address is "inproc:<name>".
class InProcessAgent final : public Agent {
 public:
  ~InProcessAgent() override;

  // Graceful: waits for this worker's outgoing calls, then for every live
  // worker of the network to call Shutdown (a barrier), then drains its
  // executor. Non-graceful: fails outgoing calls with Cancelled and stops.
  absl::Status Shutdown(bool graceful = true,
                        absl::Duration timeout = absl::Seconds(60)) override;
  // Waits for this worker's outgoing calls, sends a MEMBERSHIP notice to
  // every present member (through the queue), then stops: later messages to
  // it fail naming it as departed. Not collective.
  absl::Status Leave(absl::Duration timeout = absl::Seconds(60)) override;

 private:
  friend class InProcessNetwork;
  InProcessAgent(InProcessNetwork* network, Options options,
                 std::shared_ptr<FunctionRegistry> registry);

  Future<Message> Transmit(const WorkerInfo& to, Message request,
                           absl::Duration timeout) override;
  Future<Message> Receive(Message request) {
    return Dispatch(std::move(request));
  }
  void PeerDied(int id, const absl::Status& why) { ReportPeerFailure(id, why); }

  InProcessNetwork* const network_;
  Mutex shutdown_mu_;
  bool shut_down_ ABSL_GUARDED_BY(shutdown_mu_) = false;
};

// A message waiting in the network's queue.
struct QueuedMessage {
  uint64_t seq = 0;  // Its number in the queue (Deliver, Drop...).
  std::string from;  // The sender's name.
  std::string to;  // The receiver's name.
  bool is_reply = false;  // A reply, else a request.
  MessageType type = MessageType::kUnspecified;  // The request's type.
  std::string function;  // kCall: the function called.
  GlobalId id;         // The request's id (a reply carries its request's).
  absl::Status error;  // Replies only: the handler's error, if any.
  std::string DebugString() const;  // One line naming the fields, for failures.
};

// Selects queued messages (AwaitQueued, Hold).
using MessagePredicate = std::function<bool(const QueuedMessage&)>;
// Requests (not replies) from `from` to `to`; "" matches any worker.
MessagePredicate Matching(const std::string& from, const std::string& to);
// Replies travelling to `to`.
MessagePredicate RepliesTo(const std::string& to);

// How InProcessNetwork runs.
struct InProcessOptions {
  bool auto_deliver = true;  // See the top of this file.
  Agent::Options agent;  // Every worker's agent options.
  // Shared by every worker; null gives each worker its own registry.
  std::shared_ptr<FunctionRegistry> registry;
};

// Agents in one process and the queue between them (see the top of this
// file).
class InProcessNetwork {
 public:
  using Options = InProcessOptions;  // See InProcessOptions.

  // Workers get ids 0..n-1 in the order of `names`, which must be unique and
  // non-empty (the process aborts otherwise: a test bug).
  explicit InProcessNetwork(const std::vector<std::string>& names,
                            Options options = Options());
  ~InProcessNetwork();
  InProcessNetwork(const InProcessNetwork&) = delete;
  InProcessNetwork& operator=(const InProcessNetwork&) = delete;

  // The worker named `name` / with id `id`; aborts when absent (a test bug).
  InProcessAgent& agent(const std::string& name);
  InProcessAgent& agent(int id);  // By id.
  // Ids handed out (departed workers included).
  int size() const { return size_.load(std::memory_order_acquire); }

  // --- Queue control. Errors: NotFound for a seq no longer queued. ---

  // What is queued now, in queue order.
  std::vector<QueuedMessage> Queued() const;
  // Waits until a queued message satisfies `match` and returns it;
  // DeadlineExceeded (listing the queue) after `timeout`.
  absl::StatusOr<QueuedMessage> AwaitQueued(const MessagePredicate& match,
                                            absl::Duration timeout) const;
  // Delivers message `seq` now (replies complete on this thread).
  absl::Status Deliver(uint64_t seq);
  absl::Status Drop(uint64_t seq);  // Removes message `seq` (never delivered).
  // Queues a copy of message `seq`; returns the copy's seq. A duplicated
  // request runs its handler again; a duplicated reply is ignored by the
  // caller (counted in ignored_replies()).
  absl::StatusOr<uint64_t> Duplicate(uint64_t seq);
  // Delivers what is queued now and what that queues at once, until the
  // queue is empty or `max_messages` were delivered; returns how many.
  // Replies of handlers still running on an executor are queued later: use
  // AwaitQueued to wait for them.
  int DeliverAll(int max_messages = 10000);
  void SetAutoDeliver(bool on);  // Switches between auto and manual mode.
  // Delay in auto mode: messages matching `hold` stay queued (for Deliver,
  // Drop, Duplicate) while the others flow. Hold(nullptr) stops holding and
  // delivers what was held.
  void Hold(MessagePredicate hold);
  // Replies that arrived for calls no longer pending (duplicates, late).
  int ignored_replies() const;
  // Workers that reached the shutdown barrier (graceful Shutdown) so far.
  int ArrivedAtShutdownBarrier() const;

  // --- Failures. ---

  // Makes `worker` dead at once: its queued messages vanish, calls it made
  // and calls made to it fail with Unavailable naming it, later sends to or
  // from it fail the same way, and every live worker reports it failed to
  // its peer-failure listeners (rpc/agent.h), on Kill's thread. NotFound for
  // an unknown worker.
  absl::Status Kill(const std::string& worker);
  // Whether Kill(worker) was called: the simulated network's own record of
  // what it did, not an agent's view (an agent's is its peer-state table,
  // Agent::IsPeerDown).
  bool IsKilled(const std::string& worker) const;

  // --- Membership (rpc/agent.h). ---

  // A new worker joins the running group with the next id (ids are never
  // reused): it knows every worker that has not left, and every live one
  // learns of it through a MEMBERSHIP notice (queued messages: in manual
  // mode, deliver them from another thread) before Join returns.
  // InvalidArgument for an empty name, AlreadyExists for the name of a
  // present worker, ResourceExhausted beyond kMaxWorkers ids,
  // FailedPrecondition once every worker reached the shutdown barrier (the
  // group is shutting down). A worker waiting in the barrier is told, and the
  // barrier then waits for the joiner too (it leaves or shuts down).
  absl::StatusOr<InProcessAgent*> Join(
      const std::string& name, absl::Duration timeout = absl::Seconds(60));
  static constexpr int kMaxWorkers = 1024;  // Ids a network hands out at most.

 private:
  friend class InProcessAgent;
  struct Envelope {
    QueuedMessage summary;
    int from_id = -1;
    int to_id = -1;
    Result<Message> body = absl::UnknownError("empty");
  };
  struct PendingCall {
    Promise<Message> promise;
    int callee = -1;
    std::string target;  // DescribeTarget(...)
    absl::Duration timeout;
    absl::Time deadline;
  };
  using CallKey = std::pair<int, uint64_t>;  // (caller id, request id)

  Future<Message> Transmit(int from, const WorkerInfo& to, Message request,
                           absl::Duration timeout);
  // Queues (or, in auto mode, delivers) one envelope.
  void Post(Envelope envelope) ABSL_LOCKS_EXCLUDED(mu_);
  void DeliverEnvelope(Envelope envelope) ABSL_LOCKS_EXCLUDED(mu_);
  void CompleteCall(CallKey key, Result<Message> result)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Removes the calls matching `pred`, returning their promises.
  std::vector<std::pair<Promise<Message>, absl::Status>> TakeCalls(
      const std::function<absl::Status(const CallKey&, const PendingCall&)>&
          error_for) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fails `from`'s outgoing calls with Cancelled (non-graceful shutdown).
  void CancelCallsFrom(int from);
  absl::Status AwaitNoCallsFrom(int from, absl::Time deadline);
  absl::Status Barrier(int id, absl::Time deadline);
  // Every worker that has not left or died reached the shutdown barrier.
  bool BarrierCompleteLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MarkStopped(int id, bool left = false);
  void TimerLoop();

  // "dead", "shut down" or "gone (it left the group)", for errors.
  std::string StateOf(int id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The worker named `name`'s id; -1 when unknown.
  int IdOf(const std::string& name) const;

  Options options_;
  // kMaxWorkers slots, each filled once (under mu_) before its id is used.
  std::vector<std::unique_ptr<InProcessAgent>> agents_;
  std::atomic<int> size_{0};

  mutable Mutex mu_;
  std::map<std::string, int> ids_ ABSL_GUARDED_BY(mu_);  // Latest id per name.
  std::set<int> left_ ABSL_GUARDED_BY(mu_);
  bool auto_deliver_ ABSL_GUARDED_BY(mu_);
  MessagePredicate hold_ ABSL_GUARDED_BY(mu_);
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, Envelope> queue_ ABSL_GUARDED_BY(mu_);
  std::map<CallKey, PendingCall> calls_ ABSL_GUARDED_BY(mu_);
  std::set<int> killed_ ABSL_GUARDED_BY(mu_);
  std::set<int> stopped_ ABSL_GUARDED_BY(mu_);
  std::set<int> at_barrier_ ABSL_GUARDED_BY(mu_);
  int ignored_replies_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_timer_ ABSL_GUARDED_BY(mu_) = false;
  std::thread timer_;
};

}  // namespace ferry::rpc::testing

#endif  // FERRY_RPC_TESTING_IN_PROCESS_H_
