#include "ferry/rpc/grpc/agent.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/health_check_service_interface.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "ferry/common/grpc_status.h"
#include "ferry/common/host_address.h"
#include "ferry/common/logging.h"
#include "ferry/common/status.h"
#include "ferry/common/tsan.h"
#include "ferry/proto/health.pb.h"
#include "ferry/rpc/grpc/admin.h"
#include "ferry/rpc/grpc/codec.h"
#include "ferry/rpc/grpc/identity.h"
#include "ferry/rpc/grpc/membership.h"
#include "ferry/rpc/grpc/rendezvous.h"
#include "ferry/rpc/grpc/service.h"

namespace ferry::rpc {
namespace {

constexpr char kCallMethod[] = "/ferry.rpc.v1.Worker/Call";
constexpr char kHealthCheckMethod[] = "/grpc.health.v1.Health/Check";

// gRPC's reflection and health services are switched on through process-wide
// registration calls; doing it once is all they need.
void EnableServerPlugins() {
  static std::once_flag once;
  std::call_once(once, [] {
    grpc::reflection::InitProtoReflectionServerBuilderPlugin();
    grpc::EnableDefaultHealthCheckService(true);
    // gRPC serves the health service without protobuf descriptors; touching
    // ours links them into the pool, so reflection can describe it.
    grpc::health::v1::HealthCheckRequest::descriptor();
  });
}

std::string HostOf(const std::string& address) {
  size_t colon = address.rfind(':');
  return colon == std::string::npos ? address : address.substr(0, colon);
}

// "calling 'f'" / "sending RREF_FETCH": the prefix of errors a peer already
// worded.
std::string Sending(MessageType type, const std::string& function) {
  return type == MessageType::kCall
             ? absl::StrCat("calling '", function, "'")
             : absl::StrCat("sending ", MessageTypeName(type));
}

constexpr int64_t kMinHttp2Window = int64_t{64} << 10;
constexpr int64_t kMaxHttp2Window = 0x7fffffff;

// A fixed HTTP/2 receive window (GrpcAgentOptions::http2_window_bytes) set
// through `set_int` (a channel's or a server builder's arguments); 0 leaves
// gRPC's automatic one.
template <typename SetInt>
void ApplyHttp2Window(int64_t window, SetInt set_int) {
  if (window == 0) return;
  set_int(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  set_int(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, static_cast<int>(window));
}

}  // namespace

struct GrpcAgent::Peer {
  WorkerInfo info;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<grpc::GenericStub> stub;
  // This worker's name proof on the channel ("" without a secret).
  std::string proof;
  std::atomic<bool> probing{false};  // One health probe at a time.
};

struct GrpcAgent::OutgoingCall {
  uint64_t id = 0;
  MessageType type = MessageType::kUnspecified;
  std::string function;  // The request's (the stats key of a call).
  // The channel the call went on; its info names the peer in errors (texts
  // are made only when needed).
  std::shared_ptr<Peer> peer;
  absl::Duration timeout;
  absl::Time start;
  grpc::ClientContext context;
  grpc::ByteBuffer request;
  grpc::ByteBuffer response;
  // Set for a streamed call (request and response unused).
  std::shared_ptr<grpc_agent::ClientStream> stream;
  uint64_t bytes_out = 0;
  // Keeps a same-host payload readable until the call ends.
  std::shared_ptr<void> same_host_lease;
  Promise<Message> promise;
  absl::Time deadline;
  // Set by the sweeper when it cancels the call at its deadline.
  std::atomic<bool> expired{false};
  // Links of the CallList holding the call (under the agent's mu_).
  CallList* list = nullptr;
  OutgoingCall* prev = nullptr;
  OutgoingCall* next = nullptr;

  // DescribeTarget of the request.
  std::string Target() const {
    return DescribeTarget(peer->info.name, type, function);
  }
};

struct GrpcAgent::Probe {
  int peer = -1;
  std::shared_ptr<Peer> channel;
  absl::Status why;  // The failed call that started the probe.
  grpc::ClientContext context;
  grpc::ByteBuffer request;  // An empty HealthCheckRequest: the whole server.
  grpc::ByteBuffer response;
};

void GrpcAgent::CallList::PushBack(OutgoingCall* call) {
  call->list = this;
  call->prev = tail;
  call->next = nullptr;
  (tail != nullptr ? tail->next : head) = call;
  tail = call;
  ++size;
}

void GrpcAgent::CallList::InsertByDeadline(OutgoingCall* call) {
  OutgoingCall* after = tail;
  while (after != nullptr && after->deadline > call->deadline) {
    after = after->prev;
  }
  call->list = this;
  call->prev = after;
  call->next = after != nullptr ? after->next : head;
  (call->next != nullptr ? call->next->prev : tail) = call;
  (after != nullptr ? after->next : head) = call;
  ++size;
}

void GrpcAgent::CallList::Remove(OutgoingCall* call) {
  (call->prev != nullptr ? call->prev->next : head) = call->next;
  (call->next != nullptr ? call->next->prev : tail) = call->prev;
  call->list = nullptr;
  call->prev = call->next = nullptr;
  --size;
}

// ---------------------------------------------------------------------------
// Life cycle.

GrpcAgent::GrpcAgent(std::shared_ptr<Store> store, GrpcAgentOptions options,
                     std::shared_ptr<FunctionRegistry> registry)
    : Agent(options, std::move(registry)),
      grpc_options_(std::move(options)),
      store_(std::move(store)),
      start_time_(absl::Now()) {}

absl::Status GrpcAgent::NegotiateSameHost(const std::vector<WorkerInfo>& group,
                                          int rank) {
  absl::Status s =
      same_host_->Negotiate(*store_, group, rank, grpc_options_.join_timeout);
  if (!s.ok()) {
    return Annotate(s, absl::StrCat("worker '", group[rank].name,
                                    "' negotiating the same-host channel"));
  }
  FERRY_LOG(INFO) << "worker '" << group[rank].name
                  << "': same-host channel to " << same_host_->usable_peers()
                  << " of " << group.size() << " workers";
  return absl::OkStatus();
}

absl::Status GrpcAgent::CheckArguments(const std::string& name,
                                       const Store* store,
                                       const GrpcAgentOptions& options) {
  if (name.empty() || name.find('\n') != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker name '", name, "' is empty or contains a newline"));
  }
  if (store == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker '", name, "': no store"));
  }
  const int64_t window = options.http2_window_bytes;
  if (window != 0 && (window < kMinHttp2Window || window > kMaxHttp2Window)) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker '", name, "': http2_window_bytes is ", window,
                     ", outside [", kMinHttp2Window, ", ", kMaxHttp2Window,
                     "] (0: gRPC's automatic window)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> GrpcAgent::Serve(const WorkerInfo& self) {
  // The executor exists before the server can take a request.
  SetSelf(self);
  grpc_agent::SameHostOptions same_host = grpc_options_.same_host;
  same_host.enabled = same_host.enabled && !grpc_options_.tls.enabled();
  same_host.max_message_bytes = grpc_options_.max_message_bytes;
  same_host_ = std::make_shared<grpc_agent::SameHostChannel>(
      same_host, self.name, receive_pool_);
  // Pairs with workers that join later are settled as they come
  // (shm_channel.h); the listener runs before the joiner is answered.
  AddMembershipListener(
      [channel = std::weak_ptr<grpc_agent::SameHostChannel>(same_host_),
       store = store_, self](const WorkerInfo& w, MembershipChange change) {
        std::shared_ptr<grpc_agent::SameHostChannel> c = channel.lock();
        if (c == nullptr) return;
        if (change == MembershipChange::kLeft) return c->RemovePeer(w.id);
        absl::Status added = c->AddJoiner(*store, w, self.id);
        if (!added.ok()) {
          FERRY_LOG(WARNING)
              << "worker '" << self.name << "': same-host channel to '"
              << w.name << "' off: " << added;
        }
      });
  if (grpc_options_.before_serving) {
    absl::Status installed = grpc_options_.before_serving(*this);
    if (!installed.ok()) {
      return Annotate(installed, absl::StrCat("worker '", self.name,
                                              "' installing handlers"));
    }
  }
  ASSIGN_OR_RETURN(std::string address, StartServer(self.name));
  // Answers an identity probe (ProbeWorker with check_identity): another
  // process at the same address does not know this service name.
  if (auto* health = server_->GetHealthCheckService()) {
    health->SetServingStatus(IdentityHealthService(self.id), true);
  }
  return address;
}

absl::StatusOr<std::unique_ptr<GrpcAgent>> GrpcAgent::Start(
    std::string name, int rank, int world_size, std::shared_ptr<Store> store,
    GrpcAgentOptions options, std::shared_ptr<FunctionRegistry> registry) {
  RETURN_IF_ERROR(CheckArguments(name, store.get(), options));
  if (world_size <= 0 || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(absl::StrCat("worker '", name, "': rank ",
                                                   rank, " is outside [0, ",
                                                   world_size, ")"));
  }
  std::unique_ptr<GrpcAgent> agent(
      new GrpcAgent(std::move(store), std::move(options), std::move(registry)));
  agent->static_size_ = world_size;
  absl::StatusOr<std::string> address =
      agent->Serve(WorkerInfo{name, rank, ""});
  if (!address.ok()) return address.status();
  absl::Status published = agent->same_host_->Publish(*agent->store_, rank);
  if (!published.ok()) {
    agent->Shutdown(/*graceful=*/false).IgnoreError();
    return Annotate(published, absl::StrCat("worker '", name, "' joining"));
  }
  // The server runs: self() is not written again (SetWorkers fills in its
  // address along with the group, which handlers wait for).
  absl::StatusOr<std::vector<WorkerInfo>> group =
      grpc_agent::FormGroup(agent->store_, WorkerInfo{name, rank, *address},
                            world_size, agent->grpc_options_.join_timeout);
  absl::Status negotiated =
      group.ok() ? agent->NegotiateSameHost(*group, rank) : group.status();
  if (!negotiated.ok()) {
    agent->Shutdown(/*graceful=*/false).IgnoreError();
    return negotiated;
  }
  agent->SetWorkers(*std::move(group));
  agent->OpenChannels();
  if (rank == 0) {
    // Tells joiners (GrpcAgent::Join) the group runs; the static group
    // itself does not need it.
    absl::Status published =
        grpc_agent::PublishStaticSize(agent->store_, world_size);
    if (!published.ok()) {
      FERRY_LOG(WARNING) << "worker '" << name
                         << "': workers cannot join this group: " << published;
    }
  }
  FERRY_LOG(INFO) << "worker '" << name << "' (rank " << rank << "/"
                  << world_size << ") serving on " << *address;
  return agent;
}

absl::StatusOr<std::string> GrpcAgent::StartServer(const std::string& name) {
  const std::string listen = grpc_options_.listen_address.empty()
                                 ? "127.0.0.1:0"
                                 : grpc_options_.listen_address;
  std::string host = grpc_options_.advertise_address;
  if (host.empty()) host = HostOf(listen);
  if (IsWildcardHost(host)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker '", name, "' listens on every interface (", listen,
        ") but has no advertise_address for its peers (InitRpc reads "
        "FERRY_ADVERTISE_ADDR or FERRY_SOCKET_IFNAME)"));
  }
  EnableServerPlugins();
  absl::StatusOr<grpc_agent::Credentials> credentials =
      grpc_agent::LoadCredentials(grpc_options_.tls, name);
  if (!credentials.ok()) return credentials.status();
  credentials_ = *std::move(credentials);
  grpc_agent::WarnIfPlaintextExposed(grpc_options_.tls, listen, name);
  verifier_ = std::make_unique<grpc_agent::CallerVerifier>(
      name, grpc_options_.secret, grpc_options_.tls.enabled());
  gates_ = std::make_unique<ThreadPoolExecutor>(ThreadPoolExecutor::Options{
      .name = absl::StrCat("gates-", name),
      .num_threads = 1,
      .max_queue = size_t{1} << 16,
      .log_label = absl::StrCat(name, ":gates")});
  worker_service_ = std::make_unique<grpc_agent::WorkerService>(this);
  admin_service_ = std::make_unique<grpc_agent::AdminService>(this);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(listen, credentials_.server, &port);
  builder.SetMaxReceiveMessageSize(grpc_options_.max_message_bytes);
  builder.SetMaxSendMessageSize(grpc_options_.max_message_bytes);
  ApplyHttp2Window(grpc_options_.http2_window_bytes,
                   [&](const char* key, int value) {
                     builder.AddChannelArgument(key, value);
                   });
  builder.RegisterService(worker_service_.get());
  builder.RegisterService(admin_service_.get());
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || port == 0) {
    return absl::UnavailableError(
        absl::StrCat("worker '", name, "' cannot listen on ", listen,
                     grpc_options_.tls.enabled()
                         ? " with TLS (do cert_file and key_file match?)"
                         : ""));
  }
  if (auto* health = server_->GetHealthCheckService()) {
    health->SetServingStatus("ferry.rpc.v1.Worker", true);
    health->SetServingStatus("ferry.admin.v1.Admin", true);
  }
  sweeper_ = std::thread([this] { SweepLoop(); });
  return JoinHostPort(host, port);
}

void GrpcAgent::OpenChannels() {
  MutexLock lock(&mu_);
  for (const WorkerInfo& w : GetWorkerInfos()) PeerFor(w);
}

std::shared_ptr<GrpcAgent::Peer> GrpcAgent::PeerFor(const WorkerInfo& to) {
  if (to.id >= static_cast<int>(peers_.size())) peers_.resize(to.id + 1);
  std::shared_ptr<Peer>& peer = peers_[to.id];
  if (peer != nullptr) return peer;
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(grpc_options_.max_message_bytes);
  args.SetMaxSendMessageSize(grpc_options_.max_message_bytes);
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  ApplyHttp2Window(
      grpc_options_.http2_window_bytes,
      [&](const char* key, int value) { args.SetInt(key, value); });
  credentials_.apply_channel_args(args);
  peer = std::make_shared<Peer>();
  peer->info = to;
  peer->channel =
      grpc::CreateCustomChannel(to.address, credentials_.channel, args);
  peer->stub = std::make_unique<grpc::GenericStub>(peer->channel);
  peer->proof = verifier_->MakeProof(self().name, to.name);
  return peer;
}

std::string GrpcAgent::ChannelState(int rank) const {
  std::shared_ptr<Peer> peer;
  {
    MutexLock lock(&mu_);
    if (rank >= 0 && rank < static_cast<int>(peers_.size())) {
      peer = peers_[rank];
    }
  }
  if (peer == nullptr) return "NONE";
  switch (peer->channel->GetState(/*try_to_connect=*/false)) {
    case GRPC_CHANNEL_IDLE:
      return "IDLE";
    case GRPC_CHANNEL_CONNECTING:
      return "CONNECTING";
    case GRPC_CHANNEL_READY:
      return "READY";
    case GRPC_CHANNEL_TRANSIENT_FAILURE:
      return "TRANSIENT_FAILURE";
    case GRPC_CHANNEL_SHUTDOWN:
      return "SHUTDOWN";
  }
  return "UNKNOWN";
}

int64_t GrpcAgent::calls_in_flight() const {
  return worker_service_ ? worker_service_->limiter().in_flight() : 0;
}

GrpcAgent::~GrpcAgent() { Shutdown(/*graceful=*/false).IgnoreError(); }

absl::Status GrpcAgent::Shutdown(bool graceful, absl::Duration timeout) {
  // A worker that joined late is not in the static barrier: it leaves.
  if (graceful && has_group() && self().id >= static_size_) return Leave(timeout);
  MutexLock serial(&shutdown_mu_);
  {
    MutexLock lock(&mu_);
    if (shut_down_) return absl::OkStatus();
  }
  const absl::Time deadline = absl::Now() + timeout;
  absl::Status result;
  if (graceful) {
    // 1. Our own calls finish while every peer still serves.
    result = AwaitOutgoingCalls(deadline, timeout);
    // 2. Meet everyone: after this no worker issues new calls.
    if (result.ok()) {
      result = grpc_agent::ShutdownBarrier(store_, self().name, self().id,
                                           static_size_,
                                           deadline);
    }
  }
  // 3. Stop: fail what is still outgoing, drain (or cut) what we serve.
  StopServing(graceful, graceful && result.ok() ? deadline : absl::Now());
  return result;
}

absl::Status GrpcAgent::AwaitOutgoingCalls(absl::Time deadline,
                                           absl::Duration timeout) {
  MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return swept_.size + unswept_.size == 0;
  };
  if (mu_.AwaitWithDeadline(absl::Condition(&idle), deadline)) {
    return absl::OkStatus();
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "worker '", self().name, "' shutdown: ", swept_.size + unswept_.size,
      " outgoing calls still running after ", absl::FormatDuration(timeout)));
}

void GrpcAgent::StopServing(bool drain, absl::Time server_deadline) {
  if (server_ != nullptr) {
    if (auto* health = server_->GetHealthCheckService())
      health->SetServingStatus(false);
  }
  BeginStop();  // Failures of peers leaving now are not failures.
  {
    MutexLock lock(&mu_);
    shutting_down_ = true;
    for (CallList* list : {&swept_, &unswept_}) {
      for (OutgoingCall* c = list->head; c != nullptr; c = c->next) {
        c->context.TryCancel();
      }
    }
    for (Probe* probe : probes_) probe->context.TryCancel();
  }
  StopSweeper();
  if (server_ != nullptr) {
    server_->Shutdown(absl::ToChronoTime(server_deadline));
    server_->Wait();
    // Wait returned after every call's OnDone (rpc/grpc/service.h).
    FERRY_TSAN_ACQUIRE(worker_service_.get());
  }
  StopExecutor(drain);
  MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return swept_.size + unswept_.size == 0 && probes_.empty() &&
           finishing_ == 0;
  };
  mu_.AwaitWithTimeout(absl::Condition(&idle), absl::Seconds(10));
  shut_down_ = true;
}

void GrpcAgent::StopSweeper() {
  {
    MutexLock lock(&mu_);
    sweeper_stop_ = true;
    sweeper_wake_.Signal();
  }
  if (sweeper_.joinable()) sweeper_.join();
}

void GrpcAgent::SweepLoop() {
  MutexLock lock(&mu_);
  while (!sweeper_stop_) {
    const absl::Time now = absl::Now();
    while (swept_.head != nullptr && swept_.head->deadline <= now) {
      OutgoingCall* late = swept_.head;
      swept_.Remove(late);
      unswept_.PushBack(late);
      // Read by CallDone after gRPC completes the cancelled call.
      late->expired.store(true, std::memory_order_release);
      late->context.TryCancel();
    }
    // Asleep until the oldest call's deadline or, with none, for a whole
    // timeout (at least 1 ms): a call made meanwhile has a later deadline,
    // so Transmit never needs to wake the sweeper.
    if (swept_.head != nullptr) {
      sweeper_wake_.WaitWithDeadline(&mu_, swept_.head->deadline);
    } else if (options().rpc_timeout != absl::InfiniteDuration()) {
      sweeper_wake_.WaitWithTimeout(
          &mu_, std::max(options().rpc_timeout, absl::Milliseconds(1)));
    } else {
      sweeper_wake_.Wait(&mu_);  // No call is ever swept.
    }
  }
}

// ---------------------------------------------------------------------------
// Calls.

Future<Message> GrpcAgent::Transmit(const WorkerInfo& to, Message request,
                                    absl::Duration timeout) {
  auto call = std::make_unique<OutgoingCall>();
  call->id = request.id.value();
  call->type = request.type;
  call->timeout = timeout;
  call->start = absl::Now();
  absl::StatusOr<grpc_agent::EncodedParts> encoded =
      grpc_agent::EncodeRequestParts(request, call->start,
                                     grpc_options_.wire_limits);
  uint64_t payload_bytes = 0;
  if (encoded.ok()) {
    payload_bytes = encoded->bytes();
    // Payloads still being written (pipelined device staging) are waited for
    // whole unless streamed, which waits piece by piece (stream_pieces.h).
    if ((same_host_ != nullptr && same_host_->UsableTo(to.id)) ||
        !grpc_agent::ShouldStream(grpc_options_.stream, payload_bytes)) {
      if (absl::Status ready = WaitPayloadsReady(encoded->payload);
          !ready.ok()) {
        encoded = std::move(ready);
      }
    }
  }
  if (encoded.ok()) {
    // The same-host channel takes precedence over streaming: what it takes
    // leaves a small envelope.
    grpc_agent::OfferSameHost(*encoded, {same_host_.get(), to.id},
                              &call->same_host_lease);
  }
  // An empty payload (no arguments) is never streamed: nothing to stream.
  const bool streamed =
      encoded.ok() && encoded->bytes() > 0 &&
      grpc_agent::ShouldStream(grpc_options_.stream, encoded->bytes());
  if (streamed) {
    absl::Status size = grpc_agent::CheckStreamSize(
        encoded->bytes(), grpc_options_.max_message_bytes,
        grpc_options_.wire_limits, "the payload");
    if (!size.ok()) encoded = size;
  }
  if (!encoded.ok()) {
    return MakeErrorFuture<Message>(Annotate(
        encoded.status(),
        request.type == MessageType::kCall
            ? absl::StrCat("encoding the arguments of '", request.function,
                           "' for worker '", to.name, "'")
            : absl::StrCat("encoding ", request.DebugString(), " for worker '",
                           to.name, "'")));
  }
  call->bytes_out = payload_bytes;
  if (streamed) {
    OutgoingCall* raw = call.get();
    call->stream = std::make_shared<grpc_agent::ClientStream>(
        *std::move(encoded),
        grpc_agent::ClientStream::Config{&grpc_options_.stream,
                                         &grpc_options_.wire_limits,
                                         grpc_options_.max_message_bytes,
                                         &stream_stats_, receive_pool_.get(),
                                         to.name, gates_.get()},
        [this, raw](const grpc::Status& status) { CallDone(raw, status); });
  } else {
    call->request = grpc_agent::ToEnvelope(*std::move(encoded)).buffer;
  }
  // The sweeper keeps the default timeout (see agent.h).
  call->deadline = request.deadline;
  const bool swept = request.deadline != absl::InfiniteFuture() &&
                     timeout == options().rpc_timeout;
  if (!swept && request.deadline != absl::InfiniteFuture()) {
    call->context.set_deadline(absl::ToChronoTime(request.deadline));
  }
  Future<Message> result = call->promise.GetFuture();
  call->function = std::move(request.function);
  OutgoingCall* raw = call.get();
  {
    MutexLock lock(&mu_);
    if (shutting_down_) {
      // Worded as before the seam for calls.
      return MakeErrorFuture<Message>(absl::UnavailableError(absl::StrCat(
          "worker '", self().name, "' is shut down; cannot ",
          request.type == MessageType::kCall
              ? absl::StrCat("call '", raw->function, "' on")
              : absl::StrCat("send ", MessageTypeName(request.type), " to"),
          " worker '", to.name, "'")));
    }
    call->peer = PeerFor(to);
    if (swept) {
      swept_.InsertByDeadline(call.release());
    } else {
      unswept_.PushBack(call.release());
    }
  }
  if (!raw->peer->proof.empty()) {
    raw->context.AddMetadata(grpc_agent::kProofMetadata, raw->peer->proof);
  }
  // Read before the hand-off: OnDone may delete `raw` once gRPC has it (the
  // stream's reactor stays alive until Start returns).
  std::shared_ptr<grpc_agent::ClientStream> stream = raw->stream;
  grpc::GenericStub* stub = raw->peer->stub.get();
  // gRPC runs the completion callback on its own thread once the call is
  // done; its completion queue orders that after this hand-off.
  FERRY_TSAN_RELEASE(raw);
  if (stream != nullptr) {
    stream->Start(stub, &raw->context);
    return result;
  }
  stub->UnaryCall(&raw->context, kCallMethod, grpc::StubOptions(),
                  &raw->request, &raw->response,
                  [this, raw](grpc::Status status) { CallDone(raw, status); });
  return result;
}

void GrpcAgent::CallDone(OutgoingCall* raw, const grpc::Status& status) {
  FERRY_TSAN_ACQUIRE(raw);  // Pairs with the release in Transmit.
  std::unique_ptr<OutgoingCall> call(raw);
  uint64_t bytes_in = 0;
  Result<Message> result = CallResult(*call, status, &bytes_in);
  stats_.Record(RpcStats::Direction::kOut,
                call->type == MessageType::kCall ? call->function
                                                 : MessageTypeName(call->type),
                absl::Now() - call->start, !result.ok(), bytes_in,
                call->bytes_out);
  Promise<Message> promise = std::move(call->promise);
  {
    MutexLock lock(&mu_);
    raw->list->Remove(raw);
    ++finishing_;
  }
  DestroyFinished(std::move(call));
  // Completed here, on gRPC's callback thread: completing on the executor
  // could deadlock when every executor thread is a handler blocked in
  // rpc_sync waiting for exactly this completion.
  promise.Set(std::move(result));
}

Result<Message> GrpcAgent::CallResult(const OutgoingCall& call,
                                      const grpc::Status& status,
                                      uint64_t* bytes_in) {
  // A stream that failed on this side cancelled its call: its error counts.
  if (!status.ok() && !(call.stream && !call.stream->error().ok())) {
    return CallError(call, status);
  }
  const int peer = call.peer->info.id;
  absl::StatusOr<Result<Message>> reply =
      call.stream
          ? call.stream->DecodeReply(bytes_in, {same_host_.get(), peer})
          : grpc_agent::DecodeReply(call.response, grpc_options_.wire_limits,
                                    bytes_in, {same_host_.get(), peer});
  if (!reply.ok()) {
    return Annotate(reply.status(), absl::StrCat("reply from ", call.Target()));
  }
  return *std::move(reply);
}

absl::Status GrpcAgent::CallError(const OutgoingCall& call,
                                  const grpc::Status& status) {
  const std::string where = call.Target();
  absl::Status s = FromGrpcStatus(status);
  grpc::StatusCode code = status.error_code();
  // Cancelled by the sweeper at its deadline (see agent.h).
  if (code == grpc::StatusCode::CANCELLED &&
      call.expired.load(std::memory_order_acquire)) {
    code = grpc::StatusCode::DEADLINE_EXCEEDED;
  }
  switch (code) {
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return absl::DeadlineExceededError(
          absl::StrCat("call to ", where, " timed out after ",
                       absl::FormatDuration(call.timeout), " (request ",
                       GlobalId::FromValue(call.id).ToString(), ")"));
    case grpc::StatusCode::UNAVAILABLE: {
      absl::Status e = absl::UnavailableError(absl::StrCat(
          where, " at ", call.peer->info.address,
          " is unavailable: ", s.message(),
          grpc_agent::TlsFailureHint(grpc_options_.tls, s.message())));
      ProbePeer(call.peer->info.id, e);
      return e;
    }
    case grpc::StatusCode::CANCELLED:
      return absl::CancelledError(
          absl::StrCat("call to ", where, " cancelled (worker '", self().name,
                       "' shutting down)"));
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      // The peer's in-flight refusals name their limit already.
      return absl::ResourceExhaustedError(absl::StrCat(
          "call to ", where, ": ", s.message(),
          absl::StrContains(s.message(), "max_inflight_calls") ||
                  absl::StrContains(s.message(), "max_message_bytes")
              ? ""
              : absl::StrCat(" (message limit ",
                             grpc_options_.max_message_bytes, " bytes)")));
    default:
      // Agent-level errors from the peer already name it.
      return absl::Status(
          s.code(),
          absl::StrCat(Sending(call.type, call.function), ": ", s.message()));
  }
}

// ---------------------------------------------------------------------------
// Peer failures.

void GrpcAgent::ProbePeer(int id, const absl::Status& why) {
  std::shared_ptr<Peer> channel;
  {
    MutexLock lock(&mu_);
    if (id >= 0 && id < static_cast<int>(peers_.size())) channel = peers_[id];
  }
  // A departed worker's calls fail as it leaves; it has not failed.
  if (channel == nullptr || HasLeft(id)) return;
  Peer& peer = *channel;
  if (IsPeerFailed(id) || peer.probing.exchange(true)) return;
  auto probe = std::make_unique<Probe>();
  probe->peer = id;
  probe->channel = channel;
  probe->why = why;
  grpc::Slice empty;
  probe->request = grpc::ByteBuffer(&empty, 1);
  probe->context.set_deadline(
      absl::ToChronoTime(absl::Now() + grpc_options_.peer_probe_timeout));
  Probe* raw = probe.get();
  {
    MutexLock lock(&mu_);
    if (shutting_down_) {
      peer.probing = false;
      return;
    }
    probes_.insert(probe.release());
  }
  // As for calls: gRPC orders its callback after this hand-off.
  FERRY_TSAN_RELEASE(raw);
  peer.stub->UnaryCall(
      &raw->context, kHealthCheckMethod, grpc::StubOptions(), &raw->request,
      &raw->response,
      [this, raw](grpc::Status status) { ProbeDone(raw, status); });
}

std::string GrpcAgent::IdentityHealthService(int id) {
  return absl::StrCat("ferry.rpc.v1.Worker/id/", id);
}

absl::Status GrpcAgent::ProbeWorker(const WorkerInfo& worker,
                                    bool check_identity) {
  std::shared_ptr<Peer> peer;
  {
    MutexLock lock(&mu_);
    if (shutting_down_) {
      return absl::UnavailableError(absl::StrCat(
          "worker '", self().name, "' is shutting down: not probing '",
          worker.name, "'"));
    }
    peer = PeerFor(worker);
  }
  grpc::ClientContext context;
  context.set_deadline(
      absl::ToChronoTime(absl::Now() + grpc_options_.peer_probe_timeout));
  std::string bytes;
  if (check_identity) {
    grpc::health::v1::HealthCheckRequest asked;
    asked.set_service(IdentityHealthService(worker.id));
    asked.SerializeToString(&bytes);
  }
  grpc::Slice slice(bytes);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  Notification done;
  grpc::Status status;
  peer->stub->UnaryCall(&context, kHealthCheckMethod, grpc::StubOptions(),
                        &request, &response, [&](grpc::Status s) {
                          status = std::move(s);
                          done.Notify();
                        });
  // gRPC's deadline ends the call; the margin covers its timer. Cancelled
  // otherwise, and gRPC then always runs the callback.
  if (!done.WaitForNotificationWithTimeout(grpc_options_.peer_probe_timeout +
                                           absl::Seconds(5))) {
    context.TryCancel();
    done.WaitForNotification();
  }
  // As ProbeDone: any answer shows the server is there.
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE ||
      status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    return absl::UnavailableError(absl::StrCat(
        "worker '", worker.name, "' (id ", worker.id, ") at ", worker.address,
        ": health probe failed: ", FromGrpcStatus(status).ToString()));
  }
  // A server that does not know the worker's identity service is another
  // process at its address (a restarted worker on a fixed port, a reused
  // port): the worker itself is gone.
  if (check_identity && status.error_code() == grpc::StatusCode::NOT_FOUND) {
    return absl::UnavailableError(absl::StrCat(
        "worker '", worker.name, "' (id ", worker.id, ") at ", worker.address,
        ": another process answers there"));
  }
  return absl::OkStatus();
}

void GrpcAgent::ProbeDone(Probe* raw, const grpc::Status& status) {
  FERRY_TSAN_ACQUIRE(raw);  // Pairs with the release in ProbePeer.
  std::unique_ptr<Probe> probe(raw);
  // An answer, even NOT_SERVING or an error status from the health service,
  // shows the peer's server is there; only transport failures count.
  const bool failed =
      status.error_code() == grpc::StatusCode::UNAVAILABLE ||
      status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
  if (failed) {
    ReportPeerFailure(probe->peer, absl::UnavailableError(absl::StrCat(
                                       probe->why.message(),
                                       "; its health probe failed too: ",
                                       FromGrpcStatus(status).ToString())));
  }
  probe->channel->probing = false;
  {
    MutexLock lock(&mu_);
    probes_.erase(raw);
    ++finishing_;
  }
  DestroyFinished(std::move(probe));
}

template <typename T>
void GrpcAgent::DestroyFinished(std::unique_ptr<T> finished) {
  finished.reset();
  MutexLock lock(&mu_);
  --finishing_;
}

}  // namespace ferry::rpc
