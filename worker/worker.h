// InitWorker: the one way to start a Ferry worker (PyTorch's init_rpc).
//
//   ferry::WorkerOptions o;
//   o.name = "trainer0";                 // init_method "env://" by default
//   ASSIGN_OR_RETURN(std::unique_ptr<ferry::Worker> w, ferry::InitWorker(o));
//   ASSIGN_OR_RETURN(int64_t sum, w->rpc_sync("ps0", kAdd, 2, 3));
//   RETURN_IF_ERROR(w->Shutdown());      // collective, as rpc.shutdown()
//
// The worker comes with its layers installed, in the order they need, before
// it serves: the gRPC agent, the RRef context, distributed autograd and the
// DistributedOptimizer's owner service. Rank, world size and the store come
// from the init method alone (env:// reads RANK/WORLD_SIZE, Open MPI's and
// Slurm's variables: store/init_method.h), so one program runs unchanged
// under ferry_run, mpirun and srun. `join` starts an elastic worker that
// joins a running group instead (world_size=None in PyTorch).
//
// Vocabulary: Shutdown ends a static group's worker (collective: every
// static worker calls it); Leave ends an elastic one (not collective).
//
// Errors: InitWorker returns InvalidArgument naming the option and its value
// (empty name, malformed init method, rank outside the world size, join with
// a rank or world size); the agent's errors name the worker (AlreadyExists
// for a name taken, DeadlineExceeded when the group does not form). A
// failed InitWorker leaves no thread running and no port bound.
//
// Thread safety: every method may be called from any thread once InitWorker
// returned; Shutdown/Leave once. The Worker owns its layers and must outlive
// every RRef, context and optimizer made through it.
// Design: docs/design/worker.md.
#ifndef FERRY_WORKER_WORKER_H_
#define FERRY_WORKER_WORKER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ferry/autograd/dist/dist_autograd.h"
#include "ferry/common/sync.h"
#include "ferry/optim/distributed_optimizer.h"
#include "ferry/rpc/agent.h"
#include "ferry/rpc/function_registry.h"
#include "ferry/rpc/remote_function.h"
#include "ferry/rref/rref.h"
#include "ferry/rref/rref_context.h"
#include "ferry/store/store.h"
#include "ferry/worker/device_plan.h"
#include "ferry/worker/device_stage.h"

namespace ferry {

namespace cuda {
class CachingDeviceAllocator;
class DeviceMemoryApi;
}  // namespace cuda

class Worker;

// TLS / mutual TLS; plaintext when all three files are empty (then the
// FERRY_TLS_* variables apply, as rpc/grpc/tls.h).
struct WorkerTlsOptions {
  std::string ca_file;    // PEM file of the CA that signs peers' certificates
  std::string cert_file;  // PEM file of this worker's certificate
  std::string key_file;   // PEM file of this worker's private key
  bool require_client_cert = false;  // Servers require clients' certificates.
  // Name checked in servers' certificates instead of the dialled host.
  std::string server_name;
};

// What InitWorker needs; only `name` is required.
struct WorkerOptions {
  std::string name;  // Required; unique in the group.
  // env://, tcp://host:port, file:///path (store/init_method.h).
  std::string init_method = "env://";
  // < 0: from the init method. world_size may be set alone (a job with
  // elastic workers launches more processes than its static group).
  int rank = -1;
  int world_size = -1;  // < 0: from the init method (see rank).
  // Join the running group as an elastic worker (rank and world_size must
  // stay -1: the group gives the id).
  bool join = false;
  // How long to wait for the group to form (or, joining, to exist).
  absl::Duration join_timeout = absl::Seconds(300);
  // Default timeout of calls, RRef and autograd messages.
  absl::Duration rpc_timeout = absl::Seconds(60);
  int num_worker_threads = 16;  // Threads of the agent's executor.
  // host:port to bind and to publish; empty: chosen as rpc/grpc/init.h says
  // (FERRY_LISTEN_ADDR, FERRY_ADVERTISE_ADDR, the store's route).
  std::string listen_address;
  std::string advertise_address;  // See listen_address.
  WorkerTlsOptions tls;           // Plaintext by default.
  // The job's shared secret (store/store_auth.h): authenticates the store
  // and binds each worker's name to its connections (docs/security.md).
  // Empty: FERRY_STORE_SECRET_FILE / FERRY_STORE_SECRET, else none.
  std::string store_secret;
  // Largest message sent or received, in bytes.
  int max_message_bytes = 0x7fffffff;
  // Tensor payloads to workers on this host through cross-memory attach.
  bool same_host = true;
  /// For tests: called on gRPC's thread after each received piece of a
  /// streamed payload (rpc/grpc/stream_pieces.h's StreamOptions), with the
  /// bytes received so far and the total; a slow hook is a slow receiver.
  std::function<void(uint64_t received, uint64_t total)> after_piece_received;
  // Serve the admin Invoke method (operators run functions with grpcurl).
  bool enable_admin_invoke = false;
  // The functions this worker serves; null: a new registry. Register what
  // peers may call at once before InitWorker (or in before_serving).
  std::shared_ptr<rpc::FunctionRegistry> registry;
  // Held while an optimizer of this worker steps (parameter servers share
  // it with the code that reads parameters); may be null.
  std::shared_ptr<Mutex> optimizer_param_mutex;
  // With optimizer_param_mutex: called under it after each parameter an
  // optimizer of this worker updated (DistOptimizerService::Options::
  // after_update); may be empty.
  std::function<void(const Tensor& param)> optimizer_after_update;
  // CUDA tensors over RPC (issue #32, worker/device_plan.h,
  // worker/device_stage.h): checked and planned at InitWorker; a CUDA
  // tensor in a message lands on the device this worker's map names, by
  // CUDA IPC with a peer on this host (requests, their replies and returned
  // gradients; worker/device_ipc.h), staged through host memory otherwise.
  // The CUDA devices this worker uses ("cuda:N"), which must exist on
  // device_api.
  std::vector<std::string> devices;
  // Per peer: this worker's device -> the peer's ("cuda:0" -> "cuda:1"),
  // 1:1; checked against the devices the peer publishes.
  std::map<std::string, std::map<std::string, std::string>> device_maps;
  // An unmapped CUDA tensor lands on the peer's CPU instead of failing.
  bool stage_unmapped_to_cpu = false;
  // "auto" (IPC on one host, staged otherwise), "ipc" or "staged".
  std::string cuda_transport = "auto";
  // Most bytes of IPC replies held for one caller until it acknowledges
  // them (worker/device_ipc.h); further replies to it are staged.
  uint64_t ipc_reply_hold_bytes = uint64_t{4} << 30;
  // Where `devices` live (cuda/cuda_device_api.h on a GPU machine);
  // required when `devices` is not empty.
  std::shared_ptr<cuda::DeviceMemoryApi> device_api;
  // The compute backend recorded in the tensors landed on `devices` (a
  // CudaContext's shared_compute() over the same device_api), so autograd
  // and optimizers compute on them (distributed autograd with CUDA tensors
  // needs it on every worker with devices); null: they carry none.
  std::shared_ptr<DeviceComputeInterface> device_compute;
  // Runs once the layers are installed and before the worker serves:
  // register remote classes, interceptors, membership listeners. An error
  // fails InitWorker.
  std::function<absl::Status(Worker&)> before_serving;
};

// Counters of a worker's traffic (monotonic) and its load now.
struct WorkerStats {
  uint64_t calls_in = 0;              // requests served
  uint64_t calls_out = 0;             // requests sent
  uint64_t errors = 0;                // calls in or out that failed
  uint64_t bytes_in = 0;              // payload bytes received
  uint64_t bytes_out = 0;             // payload bytes sent
  uint64_t calls_in_flight = 0;       // requests being served now
  uint64_t executor_queue_depth = 0;  // handler runs waiting for a thread now
  uint64_t same_host_payloads_sent = 0;      // through cross-memory attach
  uint64_t same_host_payloads_received = 0;  // through cross-memory attach
  // Requests refused because the declared caller was not the connection's
  // proven identity, and same-host descriptors refused (docs/security.md).
  uint64_t identity_refusals = 0;
};

// Starts a worker as the top of this file says: its layers installed, the
// group formed (or joined), serving. Errors: see the top of this file.
absl::StatusOr<std::unique_ptr<Worker>> InitWorker(WorkerOptions options);

// A client of the store of the group `init_method` names (served by its
// rank 0 or by ferry_run), for a job's own keys, before or without a
// worker; under ferry_run in the attempt's key space, as the agents' keys.
// Errors: the init method's (InvalidArgument) and the store's.
absl::StatusOr<std::unique_ptr<Store>> OpenGroupStore(
    const std::string& init_method = "env://",
    absl::Duration timeout = absl::Seconds(300));

// A running worker of a group, made by InitWorker: its agent and the layers
// installed on it, and the calls user code makes through them.
class Worker {
 public:
  ~Worker();  // Stops the agent abruptly if Shutdown/Leave did not run.
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  const std::string& name() const;  // WorkerOptions::name.
  int rank() const;        // This worker's id in the group.
  int world_size() const;  // Present members.
  // The address peers reach this worker's gRPC server at ("host:port").
  const std::string& address() const;

  // The agent (rpc/agent.h). Each layer below is owned by the worker and
  // valid while it lives.
  rpc::Agent& agent() const;
  // The functions this worker serves (WorkerOptions::registry).
  rpc::FunctionRegistry& registry() const;
  // The RRef context (rref/rref_context.h).
  rref::RRefContext& rrefs() const;
  // Distributed autograd's container (autograd/dist/dist_autograd.h).
  autograd::dist::DistAutogradContainer& dist_autograd() const;
  // The same container, shared (for DistributedOptimizer::Create).
  const std::shared_ptr<autograd::dist::DistAutogradContainer>&
  dist_autograd_ptr() const;
  // The owner side of DistributedOptimizer (optim/distributed_optimizer.h).
  optim::DistOptimizerService& optimizer_service() const;
  // The same service, shared (for listeners that may outlive the worker).
  const std::shared_ptr<optim::DistOptimizerService>& optimizer_service_ptr()
      const;
  // The traffic counters now.
  WorkerStats stats() const;
  // Where this worker's CUDA tensors land on each mapped peer and by which
  // path (see WorkerOptions::devices); empty without device maps.
  const DevicePlan& device_plan() const;
  // The allocator CUDA tensors received on this worker's devices come from
  // (tensor/cuda/caching_allocator.h); null without `devices`.
  cuda::CachingDeviceAllocator* device_allocator() const;
  // The CUDA tensors staged with `peer` so far (worker/device_stage.h).
  StagedTraffic staged_traffic(const std::string& peer) const;
  // The CUDA tensors carried by IPC with `peer` so far, handles opened, and
  // requests whose tensors are held now (worker/device_ipc.h).
  IpcTraffic ipc_traffic(const std::string& peer) const;

  // rpc_sync / rpc_async through a typed handle (rpc/remote_function.h) or
  // by name (rpc/agent.h); remote() returns an RRef the callee owns.
  template <typename... A>
  auto rpc_sync(const rpc::WorkerRef& to, A&&... args) const {
    return agent().rpc_sync(to, std::forward<A>(args)...);
  }
  // By name: the result converted to R.
  template <typename R, typename... A>
  Result<R> rpc_sync(const rpc::WorkerRef& to, const std::string& function,
                     A&&... args) const {
    return agent().rpc_sync<R>(to, function, std::forward<A>(args)...);
  }
  // Agent::rpc_async (typed or by name): the future of the result.
  template <typename... A>
  auto rpc_async(const rpc::WorkerRef& to, A&&... args) const {
    return agent().rpc_async(to, std::forward<A>(args)...);
  }
  // By name: the future of the result converted to R.
  template <typename R, typename... A>
  Future<R> rpc_async(const rpc::WorkerRef& to, const std::string& function,
                      A&&... args) const {
    return agent().rpc_async<R>(to, function, std::forward<A>(args)...);
  }
  // Runs `f` on `to`, which keeps the result: an RRef to it, owned by `to`.
  template <typename R, typename... P, typename... A>
  requires rpc::CallableWith<rpc::RemoteFunction<R(P...)>, A...> rref::RRef<R>
  remote(const rpc::WorkerRef& to, const rpc::RemoteFunction<R(P...)>& f,
         A&&... args)
  const {
    return rref::remote<R>(rrefs(), to, f.name(), P{std::forward<A>(args)}...);
  }
  // By name: an RRef to the result, a T, owned by `to`.
  template <typename T, typename... A>
  rref::RRef<T> remote(const rpc::WorkerRef& to, const std::string& function,
                       A&&... args) const {
    return rref::remote<T>(rrefs(), to, function, std::forward<A>(args)...);
  }

  // OpenGroupStore of this worker's init method.
  absl::StatusOr<std::unique_ptr<Store>> OpenStore() const;

  // A static worker's graceful, collective end: releases its RRefs, waits
  // for every static worker, stops serving. `timeout` bounds each step.
  absl::Status Shutdown(absl::Duration timeout = absl::Seconds(60));
  // An elastic (or static) worker's departure, not collective: releases its
  // RRefs and waits for their owners, then leaves the group; the others go
  // on. Release its autograd contexts and optimizers first.
  absl::Status Leave(absl::Duration timeout = absl::Seconds(60));

 private:
  friend absl::StatusOr<std::unique_ptr<Worker>> InitWorker(WorkerOptions);
  struct Impl;
  explicit Worker(std::unique_ptr<Impl> impl);
  void StopAckFlusher();  // worker/device_ipc.h's, before the agent stops.
  std::unique_ptr<Impl> impl_;
};

}  // namespace ferry

#endif  // FERRY_WORKER_WORKER_H_
