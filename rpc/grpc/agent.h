// RpcAgent: a named worker that serves registered functions over gRPC and
// calls other workers' functions (rpc_sync / rpc_async).
//
// Start-up (Start): the agent starts its gRPC server (127.0.0.1, port 0 by
// default), publishes {name, rank, address} in the store, waits until all
// `world_size` workers have joined, and checks the group: names unique, ranks
// exactly 0..world_size-1. Every worker sees the same records, so a duplicate
// name or rank is reported by every worker, naming the culprits.
//
// Calls: user functions run on the agent's executor, never on gRPC's threads,
// and may block (e.g. in a nested rpc_sync). The futures rpc_async returns
// complete on gRPC's callback thread: a continuation attached with Then or
// OnComplete must not block; to do blocking work, hand it to an executor.
// Tensors travel with the zero-copy wire encoding.
//
// Graceful Shutdown is collective: every worker of the group must call it
// (concurrently, from its own thread or process), as in torch.distributed.rpc.
//
// Errors are values naming the worker and function:
//   NotFound          unknown function / worker name or id
//   InvalidArgument   wrong argument count or types, malformed envelope
//   DeadlineExceeded  the call's timeout (default Options::rpc_timeout) passed
//   Unavailable       the peer is unreachable or died mid-call
//   Cancelled         non-graceful shutdown with the call in flight
//   <any>             the function's own error, with its code
//
// Shutdown(graceful=true): waits for this worker's outgoing calls, then meets
// every worker in the store (a barrier), then stops the server (draining the
// calls it is serving) and the executor. Shutdown(graceful=false) fails
// outgoing calls with Cancelled and stops at once. Idempotent; the destructor
// does a non-graceful shutdown if none happened.
//
// Several agents may live in one process (each has its own server, executor
// and channels; nothing is process-wide).
//
// Thread safety: all public methods are safe from any thread, including from
// functions the agent is running.
#ifndef FERRY_RPC_AGENT_H_
#define FERRY_RPC_AGENT_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/executor.h"
#include "common/future.h"
#include "common/sync.h"
#include "rpc/function_registry.h"
#include "rpc/stats.h"
#include "store/store.h"
#include "tensor/value.h"
#include "tensor/wire.h"

namespace ferry::rpc {

struct WorkerInfo {
  std::string name;
  int id = -1;  // The rank.
  std::string address;
};

// Names a peer: by name, id (rank) or WorkerInfo.
class WorkerRef {
 public:
  WorkerRef(const char* name) : ref_(std::string(name)) {}  // NOLINT
  WorkerRef(std::string name) : ref_(std::move(name)) {}    // NOLINT
  WorkerRef(int id) : ref_(id) {}                           // NOLINT
  WorkerRef(const WorkerInfo& info) : ref_(info.id) {}      // NOLINT
  const std::variant<std::string, int>& ref() const { return ref_; }

 private:
  std::variant<std::string, int> ref_;
};

struct RpcAgentOptions {
  int num_worker_threads = 16;
  absl::Duration rpc_timeout = absl::Seconds(60);
  // How long Start waits for the other workers (store rendezvous).
  absl::Duration join_timeout = absl::Seconds(300);
  // Largest message sent or received (bytes). gRPC's own ceiling is 2 GiB - 1.
  int max_message_bytes = 0x7fffffff;
  std::string listen_address = "127.0.0.1:0";
  // Queue bound of the executor running functions.
  size_t max_pending_calls = 1 << 16;
  WireLimits wire_limits;
};

class RpcAgent {
 public:
  // Starts a worker. `store` is shared by every worker of the group (its keys
  // live under "rpc/"). `registry` may be shared with other agents; null
  // creates one. Register functions peers call right away before Start.
  static absl::StatusOr<std::unique_ptr<RpcAgent>> Start(
      std::string name, int rank, int world_size, std::shared_ptr<Store> store,
      RpcAgentOptions options = {},
      std::shared_ptr<FunctionRegistry> registry = nullptr);

  ~RpcAgent();
  RpcAgent(const RpcAgent&) = delete;
  RpcAgent& operator=(const RpcAgent&) = delete;

  FunctionRegistry& registry() { return *registry_; }
  template <typename F>
  absl::Status Register(std::string name, F f, std::string doc = "") {
    return registry_->Register(std::move(name), std::move(f), std::move(doc));
  }

  const WorkerInfo& self() const { return self_; }
  int world_size() const { return static_cast<int>(workers_.size()); }
  absl::StatusOr<WorkerInfo> GetWorkerInfo(const WorkerRef& ref) const;
  const std::vector<WorkerInfo>& GetWorkerInfos() const { return workers_; }

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
  template <typename R = Value, typename... A>
  Result<R> rpc_sync(const WorkerRef& to, const std::string& function,
                     A&&... args) {
    return rpc_async<R>(to, function, std::forward<A>(args)...).Get();
  }
  // The same with a per-call timeout instead of Options::rpc_timeout.
  template <typename R = Value, typename... A>
  Future<R> rpc_async_for(absl::Duration timeout, const WorkerRef& to,
                          const std::string& function, A&&... args) {
    return Typed<R>(CallAsync(
        to, function, Value::List{ToValue(std::forward<A>(args))...}, timeout));
  }
  template <typename R = Value, typename... A>
  Result<R> rpc_sync_for(absl::Duration timeout, const WorkerRef& to,
                         const std::string& function, A&&... args) {
    return rpc_async_for<R>(timeout, to, function, std::forward<A>(args)...)
        .Get();
  }

  // See the header comment. `timeout` bounds the whole shutdown.
  absl::Status Shutdown(bool graceful = true,
                        absl::Duration timeout = absl::Seconds(60));

  // The gRPC address this worker serves on ("127.0.0.1:port").
  const std::string& address() const { return self_.address; }

  const RpcStats& stats() const { return stats_; }

 private:
  class WorkerService;
  class AdminService;
  struct Peer;
  struct OutgoingCall;

  RpcAgent(std::string name, int rank, std::shared_ptr<Store> store,
           RpcAgentOptions options, std::shared_ptr<FunctionRegistry> registry);

  absl::Status StartServer();
  absl::Status Rendezvous(int world_size);

  template <typename R>
  static Future<R> Typed(Future<Value> f) {
    if constexpr (std::is_same_v<R, Value>) {
      return f;
    } else if constexpr (std::is_void_v<R>) {
      return f.Then(
          [](const Result<Value>& v) -> absl::Status { return v.status(); });
    } else {
      return f.Then([](const Result<Value>& v) -> absl::StatusOr<R> {
        if (!v.ok()) return v.status();
        return FromValue<R>(*v);
      });
    }
  }

  // Serves one incoming request (on the executor).
  void Serve(const CallContext& ctx, const std::string& function, Value args,
             Promise<Value> reply);

  void CallDone(OutgoingCall* call, const grpc::Status& status);

  absl::StatusOr<std::shared_ptr<Peer>> PeerFor(const WorkerRef& to);

  const RpcAgentOptions options_;
  const std::shared_ptr<Store> store_;
  const std::shared_ptr<FunctionRegistry> registry_;
  const absl::Time start_time_;
  WorkerInfo self_;
  // Written once by Rendezvous, before any call; read-only afterwards.
  std::vector<WorkerInfo> workers_;
  std::map<std::string, int> ids_by_name_;
  std::vector<std::shared_ptr<Peer>> peers_;

  RpcStats stats_;
  std::unique_ptr<ThreadPoolExecutor> executor_;
  std::unique_ptr<WorkerService> worker_service_;
  std::unique_ptr<AdminService> admin_service_;
  std::unique_ptr<grpc::Server> server_;
  std::atomic<uint64_t> next_request_id_{1};

  Mutex mu_;
  // Outgoing calls not yet completed; Shutdown waits for or cancels them.
  std::map<uint64_t, OutgoingCall*> outgoing_ ABSL_GUARDED_BY(mu_);
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  Mutex shutdown_mu_ ABSL_ACQUIRED_BEFORE(mu_);
};

}  // namespace ferry::rpc

#endif  // FERRY_RPC_AGENT_H_
