// GrpcAgent: the production Agent (rpc/agent.h), over gRPC.
//
// Start-up (Start): the agent starts its gRPC server (127.0.0.1, port 0 by
// default) with the Worker, Admin, health and reflection services, joins the
// group through the store (rpc/grpc/rendezvous.h), and opens a channel to
// every peer. Every message type with a registered handler is served; others
// are refused with Unimplemented naming the worker and type.
//
// Messages travel as proto/rpc.proto envelopes whose payload is the
// zero-copy wire encoding of the Value (tensors are not copied); payloads of
// GrpcAgentOptions::stream.threshold_bytes or more are streamed in pieces
// (rpc/grpc/stream.h). Replies complete Send's future on gRPC's callback
// thread.
//
// Shutdown and errors follow rpc/agent.h; transport errors add the peer's
// address (Unavailable) or the message limit (ResourceExhausted).
// Membership: see Join (the store log is rpc/grpc/membership.h); a static
// member that leaves counts as arrived at the shutdown barrier. Deadlines:
// a call with the default timeout fails with DeadlineExceeded at its
// deadline, as with a gRPC deadline; the callee's deadline is the caller's
// remaining time.
// Peer failures: a peer is reported failed only if, after a call failed
// with Unavailable, a probe of its health service fails at the transport.
//
// Thread safety: as rpc/agent.h.
// Design: docs/design/grpc_agent.md ("Membership, deadlines and peer
// failures" has the details this comment leaves out).
#ifndef FERRY_RPC_GRPC_AGENT_H_
#define FERRY_RPC_GRPC_AGENT_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ferry/common/executor.h"
#include "ferry/common/sync.h"
#include "ferry/rpc/agent.h"
#include "ferry/rpc/grpc/buffer_pool.h"
#include "ferry/rpc/grpc/shm_channel.h"
#include "ferry/rpc/grpc/stats.h"
#include "ferry/rpc/grpc/stream.h"
#include "ferry/rpc/grpc/tls.h"
#include "ferry/store/store.h"
#include "ferry/tensor/wire.h"

namespace ferry::rpc {

struct GrpcAgentOptions : Agent::Options {
  // How long Start waits for the other workers (store rendezvous).
  absl::Duration join_timeout = absl::Seconds(300);
  // Largest message sent or received (bytes), streamed or not. gRPC's own
  // ceiling for one message is 2 GiB - 1.
  int max_message_bytes = 0x7fffffff;
  // Large payloads go as a stream of pieces (rpc/grpc/stream.h): above
  // stream.threshold_bytes (1 MiB), unless stream.enabled is false.
  StreamOptions stream;
  // HTTP/2 receive window of every call, on this worker's channels and
  // server: how far a peer may send ahead of what this worker has taken
  // (a slow receiver holds its sender back by this much). gRPC's automatic
  // window grows with its BDP probe, to tens of MiB on loopback: a receiver
  // then holds that much unread data in read buffers that the allocator
  // keeps returning to the kernel and faulting back in, which made large
  // streamed payloads slow (bench/rpc: 256 MiB at 0.61x raw gRPC's stream).
  // A fixed window (BDP probe off) keeps that memory small and warm.
  // 0: gRPC's automatic window. Otherwise within [64 KiB, 2 GiB - 1]; Start
  // and Join refuse other values (InvalidArgument).
  int64_t http2_window_bytes = int64_t{8} << 20;
  // host:port the server binds; empty: 127.0.0.1:0 (InitRpc chooses one:
  // rpc/grpc/init.h).
  std::string listen_address;
  // The host peers use to reach this worker, published through the store.
  // Empty: the listen host, which must then not be a wildcard (0.0.0.0, ::).
  std::string advertise_address;
  // TLS / mutual TLS (rpc/grpc/tls.h); plaintext when empty. Listening on a
  // non-loopback address without TLS logs a warning. With client
  // certificates, a request's declared caller must be named by its
  // certificate (SAN or CN; rpc/grpc/identity.h, docs/security.md).
  TlsOptions tls;
  // The store secret (store/store_auth.h), the same on every worker; InitRpc
  // reads FERRY_STORE_SECRET(_FILE) when empty. Set: each worker proves its
  // name on each channel and protocol messages from a caller that did not
  // are refused (rpc/grpc/identity.h). Empty: no proof.
  std::string secret;
  WireLimits wire_limits;
  // Bound of the health probe that confirms a peer failure.
  absl::Duration peer_probe_timeout = absl::Seconds(5);
  // Calls this worker serves at once (received, not answered yet): in total
  // and from one client connection. Beyond them a call is refused with
  // ResourceExhausted naming the limit. <= 0: unlimited.
  int64_t max_inflight_calls = 1 << 16;
  int64_t max_inflight_calls_per_connection = 1 << 14;
  // Called once with the new agent before it serves or joins the group:
  // register the handlers and interceptors peers may use as soon as the
  // group forms (a layer's Install(agent)). An error aborts Start.
  std::function<absl::Status(Agent&)> before_serving;
  // Serve the admin Invoke method (run any registered function with JSON
  // arguments, proto/admin.proto). Off: Invoke answers PERMISSION_DENIED.
  // It runs code paths on operator input, so enable it only where the
  // admin port is trusted (TLS with client certificates, or loopback).
  bool enable_admin_invoke = false;
  // Same-host channel (rpc/grpc/shm_channel.h): tensor payloads to workers
  // on this host go through cross-memory attach instead of TCP where both
  // sides allow it. Off with `same_host.enabled = false`,
  // FERRY_RPC_SAME_HOST=0, or TLS (whose peers are not trusted with memory).
  grpc_agent::SameHostOptions same_host;
};

namespace grpc_agent {
class WorkerService;
class AdminService;
class CallerVerifier;
}  // namespace grpc_agent

class GrpcAgent final : public Agent {
 public:
  // Starts a worker. `store` is shared by every worker of the group (its keys
  // live under "rpc/"). `registry` may be shared with other agents; null
  // creates one. Register functions and handlers peers use at once before
  // Start returns on the other workers (e.g. in a shared registry).
  static absl::StatusOr<std::unique_ptr<GrpcAgent>> Start(
      std::string name, int rank, int world_size, std::shared_ptr<Store> store,
      GrpcAgentOptions options = {},
      std::shared_ptr<FunctionRegistry> registry = nullptr);

  // Joins the running group whose store is `store` (waiting up to
  // options.join_timeout for it to form) as a new worker named `name`.
  // Returns once every present member knows it. AlreadyExists when a live
  // present member has the name; a present member of the name whose health
  // probe fails (a dead process) is evicted and the joiner takes its name
  // under a new id (members then route calls by name to the joiner, and see
  // the dead one leave). DeadlineExceeded when no group runs;
  // FailedPrecondition once the static group's shutdown barrier completed.
  // The joined worker gets a fresh id (the static world size or more); its
  // graceful Shutdown is its Leave. The static group's shutdown does not wait
  // for workers still joined: leave first.
  static absl::StatusOr<std::unique_ptr<GrpcAgent>> Join(
      std::string name, std::shared_ptr<Store> store,
      GrpcAgentOptions options = {},
      std::shared_ptr<FunctionRegistry> registry = nullptr);

  ~GrpcAgent() override;

  absl::Status Shutdown(bool graceful = true,
                        absl::Duration timeout = absl::Seconds(60)) override;
  absl::Status Leave(absl::Duration timeout = absl::Seconds(60)) override;

  // The gRPC address this worker publishes ("advertised-host:port").
  const std::string& address() const { return self().address; }
  const RpcStats& stats() const { return stats_; }
  const StreamStats& stream_stats() const { return stream_stats_; }
  // Requests refused because their declared caller was not the identity
  // their connection proved (see GrpcAgentOptions::tls and ::secret).
  uint64_t identity_refusals() const {
    return identity_refusals_.load(std::memory_order_relaxed);
  }
  // Calls being served now (see max_inflight_calls).
  int64_t calls_in_flight() const;
  size_t executor_queue_depth() const { return ExecutorQueueDepth(); }
  absl::Time start_time() const { return start_time_; }
  // The same-host channel (counters, usable peers); never null.
  grpc_agent::SameHostChannel& same_host() const { return *same_host_; }
  // The group's store this agent formed the group through.
  Store& store() const { return *store_; }
  // Reuse counters of the receive buffers (rpc/grpc/buffer_pool.h).
  grpc_agent::ReceiveBufferPool::Stats receive_pool_stats() const {
    return receive_pool_->stats();
  }

 private:
  friend class grpc_agent::WorkerService;
  friend class grpc_agent::AdminService;
  struct Peer;
  struct OutgoingCall;
  struct Probe;
  // Outgoing calls, linked through the calls.
  struct CallList {
    OutgoingCall* head = nullptr;
    OutgoingCall* tail = nullptr;
    size_t size = 0;
    void PushBack(OutgoingCall* call);
    // Keeps the list sorted by deadline: walks back from the tail, which is
    // almost always where a new call belongs (deadlines are set before the
    // request is encoded, so a slow encode can land a call behind a later
    // deadline).
    void InsertByDeadline(OutgoingCall* call);
    void Remove(OutgoingCall* call);
  };

  GrpcAgent(std::shared_ptr<Store> store, GrpcAgentOptions options,
            std::shared_ptr<FunctionRegistry> registry);

  // Validates Start's / Join's arguments.
  static absl::Status CheckArguments(const std::string& name,
                                     const Store* store,
                                     const GrpcAgentOptions& options);
  // SetSelf and before_serving, then the server; returns the bound address.
  absl::StatusOr<std::string> Serve(const WorkerInfo& self);
  // Probes `worker`'s health service once (bounded by peer_probe_timeout):
  // OK when its server answers, Unavailable naming it when the transport
  // fails (connection refused, no answer in time). With `check_identity`,
  // asks for the worker's own service name (IdentityHealthService), so a
  // different process at the same address counts as the worker gone.
  absl::Status ProbeWorker(const WorkerInfo& worker,
                           bool check_identity = false);
  // The health service name only worker `id`'s server answers for.
  static std::string IdentityHealthService(int id);
  // Returns the bound address.
  absl::StatusOr<std::string> StartServer(const std::string& name);
  void OpenChannels();
  // The channel to `to`, opened on first use (members that joined later).
  std::shared_ptr<Peer> PeerFor(const WorkerInfo& to)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits until no outgoing call runs; the error names the count.
  absl::Status AwaitOutgoingCalls(absl::Time deadline, absl::Duration timeout);
  // Stops serving: fails outgoing calls and probes, serves the calls
  // received until `server_deadline` (then cuts them), stops the executor
  // (draining its queue or cancelling it).
  void StopServing(bool drain, absl::Time server_deadline);
  // Join's notices to `members` (self among them); FailedPrecondition when
  // the group's shutdown barrier completed meanwhile (the members that took
  // the joiner are told it left).
  absl::Status AnnounceJoin(const std::vector<WorkerInfo>& members,
                            absl::Time deadline, const std::string& who);
  // Leave's announcement: the log event, the barrier (static members), the
  // notices.
  absl::Status AnnounceLeave(absl::Time deadline);
  // Settles the same-host channel with the joined group (shm_channel.h).
  absl::Status NegotiateSameHost(const std::vector<WorkerInfo>& group,
                                 int rank);
  Future<Message> Transmit(const WorkerInfo& to, Message request,
                           absl::Duration timeout) override;
  void CallDone(OutgoingCall* call, const grpc::Status& status);
  // The reply (or error) of a call gRPC completed with `status`.
  Result<Message> CallResult(const OutgoingCall& call,
                             const grpc::Status& status, uint64_t* bytes_in);
  // The sweeper: cancels calls of swept_ whose deadline passed, until
  // sweeper_stop_.
  void SweepLoop();
  void StopSweeper();
  // The error of a call gRPC failed with `status`, naming the peer (and
  // probing it when unavailable).
  absl::Status CallError(const OutgoingCall& call, const grpc::Status& status);
  // After a call to peer `id` failed with Unavailable (`why`): probes the
  // peer's health service and reports it failed if that fails too.
  void ProbePeer(int id, const absl::Status& why);
  void ProbeDone(Probe* probe, const grpc::Status& status);
  // Destroys a call or probe already counted in finishing_, then uncounts it.
  template <typename T>
  void DestroyFinished(std::unique_ptr<T> finished) ABSL_LOCKS_EXCLUDED(mu_);
  // gRPC's connectivity state of the channel to `rank` ("READY"...), for
  // the admin service; "NONE" before the channels open.
  std::string ChannelState(int rank) const;

  const GrpcAgentOptions grpc_options_;
  const std::shared_ptr<Store> store_;
  const absl::Time start_time_;
  // The static group's size (Start's world_size; read from the store by
  // Join). Written before serving.
  int static_size_ = 0;

  RpcStats stats_;
  // Payload buffers of streamed and same-host receives, reused.
  const std::shared_ptr<grpc_agent::ReceiveBufferPool> receive_pool_ =
      grpc_agent::ReceiveBufferPool::Create();
  // Created before the server; negotiated before the group is known.
  std::shared_ptr<grpc_agent::SameHostChannel> same_host_;
  StreamStats stream_stats_;
  std::atomic<uint64_t> identity_refusals_{0};
  // Proves this worker's name to peers and checks callers' (made in
  // StartServer, before the service).
  std::unique_ptr<grpc_agent::CallerVerifier> verifier_;
  std::unique_ptr<grpc_agent::WorkerService> worker_service_;
  std::unique_ptr<grpc_agent::AdminService> admin_service_;
  std::unique_ptr<grpc::Server> server_;
  // Server and channel credentials, loaded once in StartServer.
  grpc_agent::Credentials credentials_;
  // One thread on which streamed writes wait for payload bytes still being
  // written (pipelined device staging), so gRPC's callback threads never
  // block on them (rpc/grpc/stream.h). Made in StartServer.
  std::unique_ptr<ThreadPoolExecutor> gates_;

  mutable Mutex mu_;
  // Outgoing calls not yet completed; Shutdown waits for or cancels them.
  // swept_: those with the default timeout and no gRPC deadline, kept in
  // deadline order (InsertByDeadline), so the sweeper looks only at the
  // head; it moves them to unswept_ as it cancels them. unswept_: every
  // other call.
  CallList swept_ ABSL_GUARDED_BY(mu_);
  CallList unswept_ ABSL_GUARDED_BY(mu_);
  bool sweeper_stop_ ABSL_GUARDED_BY(mu_) = false;
  CondVar sweeper_wake_;
  std::thread sweeper_;
  // Health probes in flight; Shutdown cancels them and waits.
  std::set<Probe*> probes_ ABSL_GUARDED_BY(mu_);
  // Calls and probes taken off their list whose ClientContext is still being
  // destroyed on a gRPC callback thread. Shutdown waits for these too: the
  // agent's channels must outlive every context, or the last reference to a
  // grpc::Channel drops on that thread, and gRPC then frees the callback
  // queue the thread is still polling.
  int finishing_ ABSL_GUARDED_BY(mu_) = 0;
  // By worker id; a departed worker's stays (ids are never reused).
  std::vector<std::shared_ptr<Peer>> peers_ ABSL_GUARDED_BY(mu_);
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  Mutex shutdown_mu_ ABSL_ACQUIRED_BEFORE(mu_);
};

}  // namespace ferry::rpc

#endif  // FERRY_RPC_GRPC_AGENT_H_
