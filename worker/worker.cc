#include "ferry/worker/worker.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "ferry/common/future.h"
#include "ferry/common/logging.h"
#include "ferry/common/status.h"
#include "ferry/proto/admin.pb.h"
#include "ferry/rpc/grpc/agent.h"
#include "ferry/rpc/grpc/init.h"
#include "ferry/store/init_method.h"
#include "ferry/store/tcp_store.h"
#include "ferry/tensor/cuda/device_api.h"
#include "ferry/worker/device_header.h"
#include "ferry/worker/device_ipc.h"
#include "ferry/worker/device_stage.h"

namespace ferry {

struct Worker::Impl {
  WorkerOptions options;
  // Set by before_serving (the agent is not returned yet then), then owned.
  rpc::Agent* agent = nullptr;
  std::unique_ptr<rpc::GrpcAgent> grpc;
  std::shared_ptr<rpc::FunctionRegistry> registry;
  std::shared_ptr<autograd::dist::DistAutogradContainer> dist;
  std::shared_ptr<rref::RRefContext> rrefs;
  std::shared_ptr<optim::DistOptimizerService> optimizers;
  DeviceOptions devices;  // Parsed from options.
  DevicePlan device_plan;
  // Stages CUDA tensors through host memory (its interceptors hold it
  // weakly); every worker has one, also without devices, to refuse them.
  std::shared_ptr<DeviceStage> stage;
  bool ended = false;
};

namespace {

absl::Status Invalid(const WorkerOptions& o, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("InitWorker('", o.name, "'): ", what));
}

absl::Status Validate(const WorkerOptions& o) {
  if (o.name.empty()) return Invalid(o, "WorkerOptions::name is empty");
  absl::StatusOr<InitMethod> m = ParseInitMethod(o.init_method);
  if (!m.ok()) {
    return Invalid(o, absl::StrCat("WorkerOptions::init_method '",
                                   o.init_method, "': ", m.status().message()));
  }
  if (o.join && (o.rank >= 0 || o.world_size >= 0)) {
    return Invalid(
        o, absl::StrCat("WorkerOptions::join with rank ", o.rank,
                        " and world_size ", o.world_size,
                        ": a joining worker gets its id from the group"));
  }
  if (o.world_size == 0 || o.world_size < -1) {
    return Invalid(o, absl::StrCat("WorkerOptions::world_size ", o.world_size));
  }
  if (o.rank < -1 || (o.world_size > 0 && o.rank >= o.world_size)) {
    return Invalid(o, absl::StrCat("WorkerOptions::rank ", o.rank,
                                   " is outside world_size ", o.world_size));
  }
  if (!o.join && o.world_size < 0 && m->world_size.has_value() &&
      o.rank >= *m->world_size) {
    return Invalid(o, absl::StrCat("WorkerOptions::rank ", o.rank,
                                   " is outside the init method's world size ",
                                   *m->world_size));
  }
  if (o.num_worker_threads <= 0) {
    return Invalid(o, absl::StrCat("WorkerOptions::num_worker_threads ",
                                   o.num_worker_threads));
  }
  if (o.max_message_bytes <= 0) {
    return Invalid(o, absl::StrCat("WorkerOptions::max_message_bytes ",
                                   o.max_message_bytes));
  }
  return absl::OkStatus();
}

// env:// with a rank or world size given in the options: those override
// the launcher's variables (a job with elastic workers launches more
// processes than its static group), as the URL's query does.
std::string StaticInitMethod(const WorkerOptions& o) {
  absl::StatusOr<InitMethod> m = ParseInitMethod(o.init_method);
  if (!m.ok() || m->scheme != InitMethod::Scheme::kEnv ||
      (o.rank < 0 && o.world_size < 0)) {
    return o.init_method;
  }
  const int rank = o.rank >= 0 ? o.rank : m->rank.value_or(-1);
  const int world =
      o.world_size >= 0 ? o.world_size : m->world_size.value_or(-1);
  std::string query;
  if (rank >= 0) query = absl::StrCat("rank=", rank);
  if (world >= 0) {
    absl::StrAppend(&query, query.empty() ? "" : "&", "world_size=", world);
  }
  return absl::StrCat("env://?", query);
}

rpc::GrpcAgentOptions AgentOptions(const WorkerOptions& o) {
  rpc::GrpcAgentOptions a;
  a.num_worker_threads = o.num_worker_threads;
  a.rpc_timeout = o.rpc_timeout;
  a.join_timeout = o.join_timeout;
  a.listen_address = o.listen_address;
  a.advertise_address = o.advertise_address;
  a.tls.ca_file = o.tls.ca_file;
  a.tls.cert_file = o.tls.cert_file;
  a.tls.key_file = o.tls.key_file;
  a.tls.require_client_cert = o.tls.require_client_cert;
  a.tls.server_name = o.tls.server_name;
  a.secret = o.store_secret;
  a.max_message_bytes = o.max_message_bytes;
  a.same_host.enabled = o.same_host;
  a.stream.after_piece_received = o.after_piece_received;
  a.enable_admin_invoke = o.enable_admin_invoke;
  return a;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Worker>> InitWorker(WorkerOptions options) {
  RETURN_IF_ERROR(Validate(options));
  auto impl = std::make_unique<Worker::Impl>();
  impl->options = std::move(options);
  const WorkerOptions& o = impl->options;
  ASSIGN_OR_RETURN(
      impl->devices,
      ParseDeviceOptions(
          o.name, o.devices, o.device_maps, o.stage_unmapped_to_cpu,
          o.cuda_transport,
          o.device_api != nullptr ? o.device_api->DeviceCount() : -1));
  ASSIGN_OR_RETURN(impl->stage,
                   DeviceStage::Create(o.name, impl->devices, o.device_api,
                                       o.device_compute));
  impl->registry = o.registry != nullptr
                       ? o.registry
                       : std::make_shared<rpc::FunctionRegistry>();
  std::unique_ptr<Worker> worker(new Worker(std::move(impl)));
  Worker::Impl& w = *worker->impl_;
  rpc::GrpcAgentOptions agent_options = AgentOptions(o);
  // Staged tensors of large messages land while they arrive.
  agent_options.stream.observer = w.stage->landing();
  // The layers, in the order they need: distributed autograd (its
  // interceptors record sends), RRefs, the optimizer service (reads the
  // autograd contexts); then the user's hook sees a complete worker.
  agent_options.before_serving =
      [&w, worker = worker.get()](rpc::Agent& agent) -> absl::Status {
    w.agent = &agent;
    // Landing runs before the layers see a received message and staging
    // after they saw an outgoing one, so they see tensors on the device.
    agent.AddInterceptor(DeviceStage::ReceiveInterceptor(w.stage));
    ASSIGN_OR_RETURN(w.dist,
                     autograd::dist::DistAutogradContainer::Install(
                         agent, {.rpc_timeout = w.options.rpc_timeout}));
    ASSIGN_OR_RETURN(w.rrefs, rref::RRefContext::Install(agent));
    ASSIGN_OR_RETURN(w.optimizers,
                     optim::DistOptimizerService::Install(
                         agent, {.param_mutex = w.options.optimizer_param_mutex,
                                 .after_update =
                                     w.options.optimizer_after_update,
                                 .dist = w.dist}));
    // Every worker publishes its devices (a peer mapping to one without
    // CUDA then learns it has none); settled before serving, so the
    // inspector below never reads it while it is written.
    auto* grpc = dynamic_cast<rpc::GrpcAgent*>(&agent);
    if (grpc == nullptr) {
      return absl::InternalError(absl::StrCat(
          "InitWorker('", w.options.name, "'): the agent is not a GrpcAgent"));
    }
    ASSIGN_OR_RETURN(w.device_plan,
                     DevicePlan::Settle(w.options.name, w.devices,
                                        grpc->store(), w.options.join_timeout));
    agent.AddInterceptor(DeviceStage::SendInterceptor(w.stage));
    // Its header (reply acknowledgements) is read by the landing
    // interceptor; the message itself needs only an answer.
    RETURN_IF_ERROR(agent.RegisterHandler(
        static_cast<rpc::MessageType>(kDeviceIpcAckType),
        [](rpc::Message) { return MakeReadyFuture<rpc::Message>(
                               rpc::Message()); }));
    // Requests to peers on this host by CUDA IPC, when the device API
    // supports it (worker/device_ipc.h); held tensors go back on the
    // acknowledging reply, the deadline or the peer's failure.
    if (const std::shared_ptr<DeviceIpc>& ipc = w.stage->ipc()) {
      std::vector<std::string> peers;
      for (const PeerDevicePlan& p : w.device_plan.peers()) {
        if (p.path == CudaPath::kIpc) peers.push_back(p.peer);
      }
      ipc->set_max_held_reply_bytes(w.options.ipc_reply_hold_bytes);
      absl::Status usable = ipc->UsePeers(peers, w.devices.devices[0].index);
      if (!usable.ok() && !peers.empty()) {
        FERRY_LOG(WARNING) << usable << "; tensors to " << peers.size()
                           << " peer(s) on this host are staged instead";
      } else if (usable.ok() && !peers.empty()) {
        // Replies this worker copied by IPC are acknowledged on its next
        // request to their callee, or in a DEVICE_IPC_ACK message.
        ipc->StartAckFlusher([&agent, me = w.options.name](
                                 const std::string& peer) {
          rpc::Message m;
          m.type = static_cast<rpc::MessageType>(kDeviceIpcAckType);
          agent.Send(peer, std::move(m))
              .OnComplete([me, peer](const Result<rpc::Message>& r) {
                if (!r.ok()) {
                  FERRY_LOG(WARNING) << "worker '" << me << "': acknowledging "
                                     << "IPC replies to '" << peer
                                     << "': " << r.status();
                }
              });
        });
      }
      // A peer down for any reason (transport, departure, a detector's
      // report, exhausted retries) acknowledges nothing more: its holds and
      // the mappings of its memory go, once, at its first entry.
      agent.AddPeerDownListener(
          [weak = std::weak_ptr<DeviceIpc>(ipc)](const rpc::PeerDown& down) {
            if (!down.first) return;
            if (std::shared_ptr<DeviceIpc> s = weak.lock()) {
              s->PeerFailed(down.peer.name);
            }
          });
    }
    RETURN_IF_ERROR(agent.inspectors().Register("devices", [&w] {
      const std::shared_ptr<DeviceIpc>& ipc = w.stage->ipc();
      std::vector<rpc::InspectionRow> rows = w.device_plan.Inspect(
          ipc != nullptr ? ipc->unavailable()
                         : "the device API has no CUDA IPC");
      for (rpc::InspectionRow& r : w.stage->Inspect()) {
        rows.push_back(std::move(r));
      }
      if (ipc != nullptr) {
        for (rpc::InspectionRow& r : ipc->Inspect()) {
          rows.push_back(std::move(r));
        }
      }
      return rows;
    }));
    return w.options.before_serving ? w.options.before_serving(*worker)
                                    : absl::OkStatus();
  };
  absl::StatusOr<std::unique_ptr<rpc::GrpcAgent>> agent =
      o.join ? rpc::JoinRpc(o.name, o.init_method, std::move(agent_options),
                            w.registry)
             : rpc::InitRpc(o.name, StaticInitMethod(o), o.rank, o.world_size,
                            std::move(agent_options), w.registry);
  if (!agent.ok()) {
    // Layers installed before the failure hold the agent only weakly; drop
    // them before the worker goes (the agent already stopped).
    if (const std::shared_ptr<DeviceIpc>& ipc = w.stage->ipc()) {
      ipc->StopAckFlusher();  // It sent through the agent.
    }
    w.optimizers.reset();
    w.rrefs.reset();
    w.dist.reset();
    w.agent = nullptr;
    w.ended = true;
    return agent.status();
  }
  w.grpc = *std::move(agent);
  w.agent = w.grpc.get();
  return worker;
}

Worker::Worker(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Worker::~Worker() {
  if (impl_->grpc != nullptr && !impl_->ended) {
    // Abrupt: the program did not end the worker; peers see it fail.
    impl_->grpc->Shutdown(/*graceful=*/false, absl::Seconds(5)).IgnoreError();
  }
  StopAckFlusher();  // It sends through the agent.
  // Layers before the agent: their handlers hold them weakly.
  impl_->optimizers.reset();
  impl_->rrefs.reset();
  impl_->dist.reset();
  impl_->grpc.reset();
}

const std::string& Worker::name() const { return impl_->options.name; }
int Worker::rank() const { return impl_->agent->self().id; }
int Worker::world_size() const { return impl_->agent->world_size(); }
const std::string& Worker::address() const {
  return impl_->agent->self().address;
}
rpc::Agent& Worker::agent() const { return *impl_->agent; }
rpc::FunctionRegistry& Worker::registry() const { return *impl_->registry; }
rref::RRefContext& Worker::rrefs() const { return *impl_->rrefs; }
autograd::dist::DistAutogradContainer& Worker::dist_autograd() const {
  return *impl_->dist;
}
const std::shared_ptr<autograd::dist::DistAutogradContainer>&
Worker::dist_autograd_ptr() const {
  return impl_->dist;
}
const std::shared_ptr<optim::DistOptimizerService>&
Worker::optimizer_service_ptr() const {
  return impl_->optimizers;
}
optim::DistOptimizerService& Worker::optimizer_service() const {
  return *impl_->optimizers;
}

const DevicePlan& Worker::device_plan() const { return impl_->device_plan; }

cuda::CachingDeviceAllocator* Worker::device_allocator() const {
  return impl_->stage->allocator();
}

StagedTraffic Worker::staged_traffic(const std::string& peer) const {
  return impl_->stage->Traffic(peer);
}

IpcTraffic Worker::ipc_traffic(const std::string& peer) const {
  const std::shared_ptr<DeviceIpc>& ipc = impl_->stage->ipc();
  return ipc != nullptr ? ipc->Traffic(peer) : IpcTraffic{};
}

WorkerStats Worker::stats() const {
  WorkerStats s;
  if (impl_->grpc == nullptr) return s;
  const rpc::GrpcAgent& g = *impl_->grpc;
  const admin::v1::GetStatsResponse r = g.stats().Snapshot();
  s.calls_in = r.total_calls_in();
  s.calls_out = r.total_calls_out();
  s.errors = r.total_errors();
  s.bytes_in = r.total_bytes_in();
  s.bytes_out = r.total_bytes_out();
  s.identity_refusals =
      g.identity_refusals() + g.same_host().stats().refused.load();
  s.calls_in_flight = static_cast<uint64_t>(g.calls_in_flight());
  s.executor_queue_depth = g.executor_queue_depth();
  s.same_host_payloads_sent = g.same_host().stats().payloads_sent.load();
  s.same_host_payloads_received =
      g.same_host().stats().payloads_received.load();
  return s;
}

absl::StatusOr<std::unique_ptr<Store>> OpenGroupStore(
    const std::string& init_method, absl::Duration timeout) {
  ASSIGN_OR_RETURN(InitMethod method, ParseInitMethod(init_method));
  // A client whatever this process's rank: the group's store is served by
  // its rank 0 (or ferry_run).
  method.rank = 1;
  method.world_size = 2;
  StoreFactories factories;
  factories.tcp = [base = MakeTcpStoreFactory()](const std::string& host,
                                                 int port, bool, int,
                                                 absl::Duration timeout) {
    return base(host, port, /*is_server=*/false, /*world_size=*/-1, timeout);
  };
  ASSIGN_OR_RETURN(std::unique_ptr<Store> store,
                   CreateStore(method, -1, -1, timeout, factories));
  if (GetEnv("FERRY_USE_AGENT_STORE").value_or("") != "1") return store;
  return ScopeToLauncherGeneration(std::move(store));
}

absl::StatusOr<std::unique_ptr<Store>> Worker::OpenStore() const {
  return OpenGroupStore(impl_->options.init_method,
                        impl_->options.join_timeout);
}

void Worker::StopAckFlusher() {
  // Owed IPC reply acknowledgements are dropped: the callees release their
  // holds when this worker is gone.
  if (const std::shared_ptr<DeviceIpc>& ipc = impl_->stage->ipc()) {
    ipc->StopAckFlusher();
  }
}

absl::Status Worker::Shutdown(absl::Duration timeout) {
  if (impl_->ended) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker '", name(), "' already ended"));
  }
  impl_->ended = true;
  StopAckFlusher();
  // Background context releases still queued go before the group ends.
  if (absl::Status s = impl_->dist->FlushReleases(timeout); !s.ok()) {
    FERRY_LOG(WARNING) << s;
  }
  return impl_->rrefs->Shutdown(timeout);
}

absl::Status Worker::Leave(absl::Duration timeout) {
  if (impl_->ended) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker '", name(), "' already ended"));
  }
  impl_->ended = true;
  StopAckFlusher();
  if (absl::Status s = impl_->dist->FlushReleases(timeout); !s.ok()) {
    FERRY_LOG(WARNING) << s;
  }
  return impl_->rrefs->Leave(timeout);
}

}  // namespace ferry
