#include "rpc/agent.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/health_check_service_interface.h>
#include <unistd.h>

#include <algorithm>
#include <mutex>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/status.h"
#include "proto/admin.grpc.pb.h"
#include "proto/rpc.grpc.pb.h"
#include "rpc/envelope.h"
#include "store/prefix_store.h"

namespace ferry::rpc {
namespace {

constexpr char kCallMethod[] = "/ferry.rpc.v1.Worker/Call";
constexpr char kVersion[] = "ferry 0.1";

// gRPC's reflection and health services are switched on through process-wide
// registration calls; doing it once is all they need.
void EnableServerPlugins() {
  static std::once_flag once;
  std::call_once(once, [] {
    grpc::reflection::InitProtoReflectionServerBuilderPlugin();
    grpc::EnableDefaultHealthCheckService(true);
  });
}

std::string HostOf(const std::string& address) {
  size_t colon = address.rfind(':');
  return colon == std::string::npos ? address : address.substr(0, colon);
}

}  // namespace

struct RpcAgent::Peer {
  WorkerInfo info;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<grpc::GenericStub> stub;
};

struct RpcAgent::OutgoingCall {
  uint64_t id = 0;
  std::string function;
  std::string peer;
  std::string peer_address;
  absl::Duration timeout;
  absl::Time start;
  grpc::ClientContext context;
  grpc::ByteBuffer request;
  grpc::ByteBuffer response;
  uint64_t bytes_out = 0;
  Promise<Value> promise;
};

// ---------------------------------------------------------------------------
// Server side.

class RpcAgent::WorkerService final
    : public ferry::rpc::v1::Worker::WithRawCallbackMethod_Call<
          ferry::rpc::v1::Worker::Service> {
 public:
  explicit WorkerService(RpcAgent* agent) : agent_(agent) {}

  grpc::ServerUnaryReactor* Call(grpc::CallbackServerContext* context,
                                 const grpc::ByteBuffer* request,
                                 grpc::ByteBuffer* response) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    const absl::Time start = absl::Now();
    const std::string& me = agent_->self_.name;
    absl::StatusOr<EnvelopeParts> parts = SplitEnvelope(*request);
    ferry::rpc::v1::RpcRequest header;
    if (parts.ok() && !header.ParseFromString(parts->header)) {
      parts =
          absl::InvalidArgumentError("envelope: malformed RpcRequest fields");
    }
    if (!parts.ok()) {
      reactor->Finish(ToGrpcStatus(
          Annotate(parts.status(), absl::StrCat("worker '", me, "'"))));
      return reactor;
    }
    if (header.type() != ferry::rpc::v1::CALL) {
      reactor->Finish(grpc::Status(
          grpc::StatusCode::UNIMPLEMENTED,
          absl::StrCat("worker '", me, "' does not serve message type ",
                       ferry::rpc::v1::MessageType_Name(header.type()), " (",
                       static_cast<int>(header.type()), ")")));
      return reactor;
    }
    std::shared_ptr<const FunctionEntry> entry =
        agent_->registry_->Find(header.function());
    if (entry == nullptr) {
      std::vector<std::string> names;
      for (const auto& e : agent_->registry_->List()) names.push_back(e->name);
      reactor->Finish(grpc::Status(
          grpc::StatusCode::NOT_FOUND,
          absl::StrCat("worker '", me, "' has no function '", header.function(),
                       "' (registered: ", absl::StrJoin(names, ", "), ")")));
      agent_->stats_.Record(RpcStats::Direction::kIn, header.function(),
                            absl::Now() - start, true, parts->total_bytes, 0);
      return reactor;
    }

    CallContext ctx;
    ctx.caller_name = header.caller_name();
    ctx.caller_id = static_cast<int>(header.caller_id());
    ctx.function = header.function();
    ctx.request_id = header.request_id();
    ctx.deadline = header.timeout_ms() > 0
                       ? start + absl::Milliseconds(header.timeout_ms())
                       : absl::InfiniteFuture();
    const uint64_t bytes_in = parts->total_bytes;
    auto payload = std::make_shared<EnvelopeParts>(*std::move(parts));

    // The reply: encode the result and finish the RPC. Runs wherever the
    // function's future completes.
    Promise<Value> reply;
    RpcAgent* agent = agent_;
    std::string function = header.function();
    reply.GetFuture().OnComplete([agent, reactor, response, start, bytes_in,
                                  function](const Result<Value>& result) {
      ferry::rpc::v1::RpcResponse out;
      Value value;
      if (result.ok()) {
        value = *result;
      } else {
        out.set_error_code(static_cast<int>(result.status().code()));
        out.set_error_message(std::string(result.status().message()));
      }
      absl::StatusOr<EncodedValue> encoded =
          EncodeValue(value, agent->options_.wire_limits);
      if (!encoded.ok()) {
        agent->stats_.Record(RpcStats::Direction::kIn, function,
                             absl::Now() - start, true, bytes_in, 0);
        reactor->Finish(ToGrpcStatus(Annotate(
            encoded.status(),
            absl::StrCat("worker '", agent->self_.name,
                         "' encoding the result of '", function, "'"))));
        return;
      }
      const uint64_t bytes_out = encoded->total_bytes();
      *response = EncodeEnvelope(out, *std::move(encoded));
      agent->stats_.Record(RpcStats::Direction::kIn, function,
                           absl::Now() - start, !result.ok(), bytes_in,
                           bytes_out);
      reactor->Finish(grpc::Status::OK);
    });

    absl::Status submitted = agent_->executor_->Submit(
        [agent, ctx = std::move(ctx), payload, reply]() mutable {
          absl::StatusOr<Value> args =
              payload->payload.empty()
                  ? absl::StatusOr<Value>(Value::FromList({}))
                  : DecodeValue(absl::MakeConstSpan(payload->payload),
                                agent->options_.wire_limits);
          payload.reset();
          if (!args.ok()) {
            reply.SetError(Annotate(args.status(), "decoding the arguments"));
            return;
          }
          agent->Serve(ctx, ctx.function, *std::move(args), reply);
        },
        [reply](const absl::Status& s) mutable { reply.SetError(s); });
    if (!submitted.ok()) reply.SetError(submitted);
    return reactor;
  }

 private:
  RpcAgent* const agent_;
};

class RpcAgent::AdminService final
    : public ferry::admin::v1::Admin::CallbackService {
 public:
  explicit AdminService(RpcAgent* agent) : agent_(agent) {}

  grpc::ServerUnaryReactor* GetWorkerInfo(
      grpc::CallbackServerContext* context,
      const ferry::admin::v1::WorkerInfoRequest*,
      ferry::admin::v1::WorkerInfo* out) override {
    Fill(agent_->self_, out);
    out->set_uptime_seconds(
        absl::ToDoubleSeconds(absl::Now() - agent_->start_time_));
    out->set_pid(static_cast<int>(getpid()));
    return Done(context);
  }

  grpc::ServerUnaryReactor* ListWorkers(
      grpc::CallbackServerContext* context,
      const ferry::admin::v1::ListWorkersRequest*,
      ferry::admin::v1::ListWorkersResponse* out) override {
    for (const WorkerInfo& w : agent_->workers_) Fill(w, out->add_workers());
    return Done(context);
  }

  grpc::ServerUnaryReactor* ListFunctions(
      grpc::CallbackServerContext* context,
      const ferry::admin::v1::ListFunctionsRequest*,
      ferry::admin::v1::ListFunctionsResponse* out) override {
    for (const auto& e : agent_->registry_->List()) {
      auto* f = out->add_functions();
      f->set_name(e->name);
      f->set_signature(e->signature);
      f->set_doc(e->doc);
      f->set_is_async(e->is_async);
    }
    return Done(context);
  }

  grpc::ServerUnaryReactor* GetStats(
      grpc::CallbackServerContext* context,
      const ferry::admin::v1::GetStatsRequest*,
      ferry::admin::v1::GetStatsResponse* out) override {
    *out = agent_->stats_.Snapshot();
    return Done(context);
  }

 private:
  void Fill(const WorkerInfo& w, ferry::admin::v1::WorkerInfo* out) {
    out->set_name(w.name);
    out->set_rank(w.id);
    out->set_world_size(agent_->world_size());
    out->set_address(w.address);
    out->set_version(kVersion);
  }
  static grpc::ServerUnaryReactor* Done(grpc::CallbackServerContext* context) {
    grpc::ServerUnaryReactor* r = context->DefaultReactor();
    r->Finish(grpc::Status::OK);
    return r;
  }

  RpcAgent* const agent_;
};

// ---------------------------------------------------------------------------
// Life cycle.

RpcAgent::RpcAgent(std::string name, int rank, std::shared_ptr<Store> store,
                   RpcAgentOptions options,
                   std::shared_ptr<FunctionRegistry> registry)
    : options_(std::move(options)),
      store_(std::move(store)),
      registry_(registry ? std::move(registry)
                         : std::make_shared<FunctionRegistry>()),
      start_time_(absl::Now()) {
  self_.name = std::move(name);
  self_.id = rank;
}

absl::StatusOr<std::unique_ptr<RpcAgent>> RpcAgent::Start(
    std::string name, int rank, int world_size, std::shared_ptr<Store> store,
    RpcAgentOptions options, std::shared_ptr<FunctionRegistry> registry) {
  if (name.empty() || name.find('\n') != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker name '", name, "' is empty or contains a newline"));
  }
  if (world_size <= 0 || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(absl::StrCat("worker '", name, "': rank ",
                                                   rank, " is outside [0, ",
                                                   world_size, ")"));
  }
  if (store == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker '", name, "': no store"));
  }
  std::unique_ptr<RpcAgent> agent(
      new RpcAgent(std::move(name), rank, std::move(store), std::move(options),
                   std::move(registry)));
  ThreadPoolExecutor::Options eo;
  eo.name = absl::StrCat("rpc-", agent->self_.name);
  eo.num_threads = std::max(1, agent->options_.num_worker_threads);
  eo.max_queue = agent->options_.max_pending_calls;
  eo.log_label = absl::StrCat(agent->self_.name, ":", rank);
  agent->executor_ = std::make_unique<ThreadPoolExecutor>(std::move(eo));
  RETURN_IF_ERROR(agent->StartServer());
  absl::Status joined = agent->Rendezvous(world_size);
  if (!joined.ok()) {
    agent->Shutdown(/*graceful=*/false).IgnoreError();
    return joined;
  }
  FERRY_LOG(INFO) << "worker '" << agent->self_.name << "' (rank " << rank
                  << "/" << world_size << ") serving on "
                  << agent->self_.address;
  return agent;
}

absl::Status RpcAgent::StartServer() {
  EnableServerPlugins();
  worker_service_ = std::make_unique<WorkerService>(this);
  admin_service_ = std::make_unique<AdminService>(this);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(options_.listen_address,
                           grpc::InsecureServerCredentials(), &port);
  builder.SetMaxReceiveMessageSize(options_.max_message_bytes);
  builder.SetMaxSendMessageSize(options_.max_message_bytes);
  builder.RegisterService(worker_service_.get());
  builder.RegisterService(admin_service_.get());
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat("worker '", self_.name,
                                               "' cannot listen on ",
                                               options_.listen_address));
  }
  self_.address = absl::StrCat(HostOf(options_.listen_address), ":", port);
  if (auto* health = server_->GetHealthCheckService()) {
    health->SetServingStatus("ferry.rpc.v1.Worker", true);
    health->SetServingStatus("ferry.admin.v1.Admin", true);
  }
  return absl::OkStatus();
}

absl::Status RpcAgent::Rendezvous(int world_size) {
  PrefixStore store("rpc/", store_);
  store.SetTimeout(options_.join_timeout);
  const std::string who =
      absl::StrCat("worker '", self_.name, "' (rank ", self_.id, ")");
  ASSIGN_OR_RETURN(int64_t seq, store.Add("join_count", 1));
  --seq;
  RETURN_IF_ERROR(
      store.Set(absl::StrCat("join/", seq),
                absl::StrCat(self_.id, "\n", self_.name, "\n", self_.address)));
  if (seq >= world_size) {
    return absl::FailedPreconditionError(
        absl::StrCat(who, " joined a group of world size ", world_size,
                     " that already has ", world_size, " workers"));
  }
  std::vector<std::string> keys;
  for (int i = 0; i < world_size; ++i) keys.push_back(absl::StrCat("join/", i));
  absl::Status waited = store.Wait(keys, options_.join_timeout);
  if (!waited.ok()) {
    return Annotate(waited, absl::StrCat(who, " waiting for ", world_size,
                                         " workers to join"));
  }
  ASSIGN_OR_RETURN(std::vector<std::string> records, store.MultiGet(keys));

  // Parse, then check in rank order so every worker reports the same thing.
  std::vector<WorkerInfo> joined;
  std::vector<std::string> problems;
  for (const std::string& r : records) {
    std::vector<std::string> f = absl::StrSplit(r, absl::MaxSplits('\n', 2));
    int rank;
    if (f.size() != 3 || !absl::SimpleAtoi(f[0], &rank) || rank < 0 ||
        rank >= world_size) {
      problems.push_back(absl::StrCat("malformed join record '", r, "'"));
      continue;
    }
    joined.push_back(WorkerInfo{f[1], rank, f[2]});
  }
  std::sort(joined.begin(), joined.end(),
            [](const WorkerInfo& a, const WorkerInfo& b) {
              return std::tie(a.id, a.name) < std::tie(b.id, b.name);
            });
  std::vector<WorkerInfo> by_rank(world_size);
  std::map<std::string, int> names;
  for (WorkerInfo& w : joined) {
    if (!by_rank[w.id].name.empty()) {
      problems.push_back(absl::StrCat("rank ", w.id, " is claimed by workers '",
                                      by_rank[w.id].name, "' and '", w.name,
                                      "'"));
      continue;
    }
    auto [it, fresh] = names.emplace(w.name, w.id);
    if (!fresh) {
      problems.push_back(absl::StrCat("worker name '", w.name,
                                      "' is used by ranks ", it->second,
                                      " and ", w.id));
    }
    by_rank[w.id] = std::move(w);
  }
  for (int i = 0; i < world_size; ++i) {
    if (by_rank[i].name.empty())
      problems.push_back(absl::StrCat("no worker has rank ", i));
  }
  if (!problems.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, ": invalid worker group: ", absl::StrJoin(problems, "; ")));
  }

  workers_ = std::move(by_rank);
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options_.max_message_bytes);
  args.SetMaxSendMessageSize(options_.max_message_bytes);
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  for (const WorkerInfo& w : workers_) {
    ids_by_name_[w.name] = w.id;
    auto peer = std::make_shared<Peer>();
    peer->info = w;
    peer->channel = grpc::CreateCustomChannel(
        w.address, grpc::InsecureChannelCredentials(), args);
    peer->stub = std::make_unique<grpc::GenericStub>(peer->channel);
    peers_.push_back(std::move(peer));
  }
  return absl::OkStatus();
}

RpcAgent::~RpcAgent() { Shutdown(/*graceful=*/false).IgnoreError(); }

absl::Status RpcAgent::Shutdown(bool graceful, absl::Duration timeout) {
  MutexLock serial(&shutdown_mu_);
  {
    MutexLock lock(&mu_);
    if (shut_down_) return absl::OkStatus();
  }
  const absl::Time deadline = absl::Now() + timeout;
  absl::Status result;
  if (graceful) {
    // 1. Our own calls finish while every peer still serves.
    {
      MutexLock lock(&mu_);
      auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return outgoing_.empty();
      };
      if (!mu_.AwaitWithDeadline(absl::Condition(&idle), deadline)) {
        result = absl::DeadlineExceededError(absl::StrCat(
            "worker '", self_.name, "' shutdown: ", outgoing_.size(),
            " outgoing calls still running after ",
            absl::FormatDuration(timeout)));
      }
    }
    // 2. Meet everyone: after this no worker issues new calls.
    if (result.ok()) {
      PrefixStore store("rpc/", store_);
      absl::StatusOr<int64_t> n = store.Add("shutdown_count", 1);
      absl::Status s = n.status();
      if (s.ok() && *n == world_size()) s = store.Set("shutdown_done", "1");
      if (s.ok())
        s = store.Wait({std::string("shutdown_done")}, deadline - absl::Now());
      if (!s.ok())
        result = Annotate(
            s, absl::StrCat("worker '", self_.name, "' shutdown barrier"));
    }
  }
  // 3. Stop: fail what is still outgoing, drain (or cut) what we serve.
  if (server_ != nullptr) {
    if (auto* health = server_->GetHealthCheckService()) health->SetServingStatus(false);
  }
  {
    MutexLock lock(&mu_);
    shutting_down_ = true;
    for (auto& [id, call] : outgoing_) call->context.TryCancel();
  }
  if (server_ != nullptr) {
    server_->Shutdown(
        absl::ToChronoTime(graceful && result.ok() ? deadline : absl::Now()));
    server_->Wait();
  }
  if (executor_ != nullptr) {
    executor_
        ->Shutdown(graceful ? ThreadPoolExecutor::ShutdownMode::kDrain
                            : ThreadPoolExecutor::ShutdownMode::kCancelPending)
        .IgnoreError();
  }
  {
    MutexLock lock(&mu_);
    auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return outgoing_.empty();
    };
    mu_.AwaitWithTimeout(absl::Condition(&idle), absl::Seconds(10));
    shut_down_ = true;
  }
  return result;
}

// ---------------------------------------------------------------------------
// Calls.

absl::StatusOr<WorkerInfo> RpcAgent::GetWorkerInfo(const WorkerRef& ref) const {
  if (const int* id = std::get_if<int>(&ref.ref())) {
    if (*id < 0 || *id >= world_size()) {
      return absl::NotFoundError(absl::StrCat(
          "no worker with id ", *id, " (world size ", world_size(), ")"));
    }
    return workers_[*id];
  }
  const std::string& name = std::get<std::string>(ref.ref());
  auto it = ids_by_name_.find(name);
  if (it == ids_by_name_.end()) {
    std::vector<std::string> known;
    for (const WorkerInfo& w : workers_) known.push_back(w.name);
    return absl::NotFoundError(
        absl::StrCat("no worker named '", name,
                     "' (known: ", absl::StrJoin(known, ", "), ")"));
  }
  return workers_[it->second];
}

absl::StatusOr<std::shared_ptr<RpcAgent::Peer>> RpcAgent::PeerFor(
    const WorkerRef& to) {
  ASSIGN_OR_RETURN(WorkerInfo info, GetWorkerInfo(to));
  return peers_[info.id];
}

Future<Value> RpcAgent::CallAsync(const WorkerRef& to,
                                  const std::string& function, Value::List args,
                                  std::optional<absl::Duration> timeout) {
  absl::StatusOr<std::shared_ptr<Peer>> peer = PeerFor(to);
  if (!peer.ok()) {
    return MakeErrorFuture<Value>(
        Annotate(peer.status(), absl::StrCat("calling '", function, "'")));
  }
  const absl::Duration limit = timeout.value_or(options_.rpc_timeout);
  auto call = std::make_unique<OutgoingCall>();
  call->id = next_request_id_.fetch_add(1);
  call->function = function;
  call->peer = (*peer)->info.name;
  call->peer_address = (*peer)->info.address;
  call->timeout = limit;
  call->start = absl::Now();

  ferry::rpc::v1::RpcRequest header;
  header.set_type(ferry::rpc::v1::CALL);
  header.set_function(function);
  header.set_caller_id(static_cast<uint32_t>(self_.id));
  header.set_caller_name(self_.name);
  header.set_request_id(call->id);
  header.set_timeout_ms(absl::ToInt64Milliseconds(limit));
  absl::StatusOr<EncodedValue> encoded =
      EncodeValue(Value::FromList(std::move(args)), options_.wire_limits);
  if (!encoded.ok()) {
    return MakeErrorFuture<Value>(Annotate(
        encoded.status(), absl::StrCat("encoding the arguments of '", function,
                                       "' for worker '", call->peer, "'")));
  }
  call->bytes_out = encoded->total_bytes();
  call->request = EncodeEnvelope(header, *std::move(encoded));
  if (limit != absl::InfiniteDuration()) {
    call->context.set_deadline(absl::ToChronoTime(call->start + limit));
  }
  Future<Value> result = call->promise.GetFuture();
  OutgoingCall* raw = call.get();
  {
    MutexLock lock(&mu_);
    if (shutting_down_) {
      return MakeErrorFuture<Value>(absl::UnavailableError(
          absl::StrCat("worker '", self_.name, "' is shut down; cannot call '",
                       function, "' on worker '", raw->peer, "'")));
    }
    outgoing_.emplace(raw->id, call.release());
  }
  (*peer)->stub->UnaryCall(
      &raw->context, kCallMethod, grpc::StubOptions(), &raw->request,
      &raw->response,
      [this, raw](grpc::Status status) { CallDone(raw, status); });
  return result;
}

void RpcAgent::CallDone(OutgoingCall* raw, const grpc::Status& status) {
  std::unique_ptr<OutgoingCall> call(raw);
  const std::string where =
      absl::StrCat("worker '", call->peer, "' function '", call->function, "'");
  absl::StatusOr<Value> result;
  uint64_t bytes_in = 0;
  if (status.ok()) {
    absl::StatusOr<EnvelopeParts> parts = SplitEnvelope(call->response);
    ferry::rpc::v1::RpcResponse header;
    if (parts.ok() && !header.ParseFromString(parts->header)) {
      parts =
          absl::InvalidArgumentError("envelope: malformed RpcResponse fields");
    }
    if (!parts.ok()) {
      result = Annotate(parts.status(), absl::StrCat("reply from ", where));
    } else if (header.error_code() != 0) {
      int code = header.error_code();
      result = absl::Status(code > 0 && code <= 16
                                ? static_cast<absl::StatusCode>(code)
                                : absl::StatusCode::kUnknown,
                            absl::StrCat(where, ": ", header.error_message()));
    } else {
      bytes_in = parts->total_bytes;
      result = parts->payload.empty()
                   ? absl::StatusOr<Value>(Value::None())
                   : DecodeValue(absl::MakeConstSpan(parts->payload),
                                 options_.wire_limits);
      if (!result.ok())
        result = Annotate(result.status(), absl::StrCat("reply from ", where));
    }
  } else {
    absl::Status s = FromGrpcStatus(status);
    switch (status.error_code()) {
      case grpc::StatusCode::DEADLINE_EXCEEDED:
        result = absl::DeadlineExceededError(absl::StrCat(
            "call to ", where, " timed out after ",
            absl::FormatDuration(call->timeout), " (request ", call->id, ")"));
        break;
      case grpc::StatusCode::UNAVAILABLE:
        result = absl::UnavailableError(
            absl::StrCat(where, " at ", call->peer_address,
                         " is unavailable: ", s.message()));
        break;
      case grpc::StatusCode::CANCELLED:
        result = absl::CancelledError(
            absl::StrCat("call to ", where, " cancelled (worker '", self_.name,
                         "' shutting down)"));
        break;
      case grpc::StatusCode::RESOURCE_EXHAUSTED:
        result = absl::ResourceExhaustedError(absl::StrCat(
            "call to ", where, ": ", s.message(), " (message limit ",
            options_.max_message_bytes, " bytes)"));
        break;
      default:
        // Agent-level errors from the peer already name it.
        result = absl::Status(
            s.code(),
            absl::StrCat("calling '", call->function, "': ", s.message()));
    }
  }
  stats_.Record(RpcStats::Direction::kOut, call->function,
                absl::Now() - call->start, !result.ok(), bytes_in,
                call->bytes_out);
  Promise<Value> promise = call->promise;
  {
    MutexLock lock(&mu_);
    outgoing_.erase(call->id);
  }
  call.reset();
  // Completed here, on gRPC's callback thread: completing on the executor
  // could deadlock when every executor thread is a function blocked in
  // rpc_sync waiting for exactly this completion.
  promise.Set(std::move(result));
}

void RpcAgent::Serve(const CallContext& ctx, const std::string& function,
                     Value args, Promise<Value> reply) {
  if (absl::Now() > ctx.deadline) {
    reply.SetError(absl::DeadlineExceededError(absl::StrCat(
        "the caller's deadline passed before '", function, "' started")));
    return;
  }
  std::shared_ptr<const FunctionEntry> entry = registry_->Find(function);
  if (entry == nullptr) {
    reply.SetError(
        absl::NotFoundError(absl::StrCat("no function '", function, "'")));
    return;
  }
  ScopedLogLabel label(absl::StrCat(self_.name, ":", self_.id));
  entry->fn(ctx, args).OnComplete(
      [reply](const Result<Value>& r) mutable { reply.Set(r); });
}

}  // namespace ferry::rpc
