#include "ferry/rpc/agent.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/utility/utility.h"
#include "ferry/common/logging.h"
#include "ferry/common/status.h"

namespace ferry::rpc {

Agent::Agent(Options options, std::shared_ptr<FunctionRegistry> registry)
    : options_(std::move(options)),
      registry_(registry ? std::move(registry)
                         : std::make_shared<FunctionRegistry>()) {
  handlers_[MessageType::kCall] = [this](Message request) {
    return ServeCall(std::move(request));
  };
  handlers_[MessageType::kMembership] = [this](Message request) {
    return ServeMembership(std::move(request));
  };
}

Agent::~Agent() { StopExecutor(/*drain=*/false); }

void Agent::SetSelf(WorkerInfo self) {
  self_ = std::move(self);
  log_label_ = absl::StrCat(self_.name, ":", self_.id);
  ids_ = std::make_unique<IdGenerator>(static_cast<uint16_t>(self_.id),
                                       /*first_local=*/1);
  ThreadPoolExecutor::Options eo;
  eo.name = absl::StrCat("rpc-", self_.name);
  eo.num_threads = std::max(1, options_.num_worker_threads);
  eo.max_queue = options_.max_pending_calls;
  eo.log_label = absl::StrCat(self_.name, ":", self_.id);
  executor_ = std::make_unique<ThreadPoolExecutor>(std::move(eo));
}

void Agent::BeginStop(absl::string_view state) {
  MutexLock lock(&mu_);
  if (stopping_) return;
  stopping_ = true;
  stop_state_ = std::string(state);
}

bool Agent::stopping() const {
  MutexLock lock(&mu_);
  return stopping_;
}

void Agent::StopExecutor(bool drain) {
  BeginStop();
  if (executor_ == nullptr) return;
  executor_
      ->Shutdown(drain ? ThreadPoolExecutor::ShutdownMode::kDrain
                       : ThreadPoolExecutor::ShutdownMode::kCancelPending)
      .IgnoreError();
}

absl::Status Agent::RegisterHandler(MessageType type, Handler handler) {
  if (type == MessageType::kUnspecified || handler == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker '", self_.name, "': cannot register a handler for ",
        MessageTypeName(type)));
  }
  MutexLock lock(&mu_);
  auto [it, fresh] = handlers_.emplace(type, std::move(handler));
  if (!fresh) {
    return absl::AlreadyExistsError(absl::StrCat("worker '", self_.name,
                                                 "' already has a handler for ",
                                                 MessageTypeName(type)));
  }
  return absl::OkStatus();
}

bool Agent::HasHandler(MessageType type) const {
  MutexLock lock(&mu_);
  return handlers_.count(type) > 0;
}

Handler Agent::FindHandler(MessageType type) const {
  MutexLock lock(&mu_);
  auto it = handlers_.find(type);
  return it == handlers_.end() ? nullptr : it->second;
}

void Agent::AddInterceptor(Interceptor interceptor) {
  MutexLock lock(&mu_);
  auto list = interceptors_
                  ? std::make_shared<std::vector<Interceptor>>(*interceptors_)
                  : std::make_shared<std::vector<Interceptor>>();
  list->push_back(std::move(interceptor));
  interceptors_ = std::move(list);
}

Agent::InterceptorList Agent::Interceptors() const {
  MutexLock lock(&mu_);
  return interceptors_;
}

absl::Status Agent::Intercept(const InterceptorList& list, InterceptPoint point,
                              const WorkerInfo& peer, Message& message) {
  if (list == nullptr) return absl::OkStatus();
  for (const Interceptor& i : *list) {
    RETURN_IF_ERROR(i(point, peer, message));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Peer state.

absl::string_view PeerDownReasonName(PeerDownReason reason) {
  switch (reason) {
    case PeerDownReason::kTransportFailure:
      return "transport failure";
    case PeerDownReason::kDeparted:
      return "departed";
    case PeerDownReason::kDetectorReport:
      return "reported by a detector";
    case PeerDownReason::kRetriesExhausted:
      return "retries exhausted";
  }
  return "unknown reason";
}

namespace {

bool Selects(PeerDownReasons reasons, PeerDownReason reason) {
  return (reasons & static_cast<PeerDownReasons>(reason)) != 0;
}

}  // namespace

std::optional<Agent::NewPeerDown> Agent::RecordPeerDown(
    const WorkerInfo& peer, PeerDownReason reason, const absl::Status& cause) {
  // Never this worker itself, whichever path reports it (a notice naming
  // this worker's id as replaced or departed included).
  if (peer.id == self_.id) return std::nullopt;
  std::vector<PeerDown>& entries = peers_down_[peer.id];
  for (const PeerDown& e : entries) {
    if (e.reason == reason) return std::nullopt;
  }
  NewPeerDown out;
  PeerDown& down = out.down;
  down.peer = peer;
  down.reason = reason;
  down.cause = cause;
  down.why = absl::Status(
      cause.code(),
      absl::StrCat("worker '", peer.name, "' (id ", peer.id, ") is down (",
                   PeerDownReasonName(reason), "): ", cause.message()));
  down.first = entries.empty();
  entries.push_back(down);
  any_peer_down_.store(true, std::memory_order_release);
  // Taken with the entry, so that a listener added after it learns of it
  // once, from the replay (AddPeerDownListener).
  for (const PeerDownSubscription& s : peer_down_listeners_) {
    if (Selects(s.reasons, reason)) out.listeners.push_back(s.listener);
  }
  return out;
}

bool Agent::IsPeerDownLocked(int id, PeerDownReasons reasons) const {
  auto it = peers_down_.find(id);
  if (it == peers_down_.end()) return false;
  for (const PeerDown& e : it->second) {
    if (Selects(reasons, e.reason)) return true;
  }
  return false;
}

void Agent::TellPeerDownListeners(const NewPeerDown& news) {
  for (const PeerDownListener& l : news.listeners) l(news.down);
}

void Agent::AddPeerDownListener(PeerDownListener listener,
                                PeerDownReasons reasons) {
  std::vector<PeerDown> known;
  {
    MutexLock lock(&mu_);
    peer_down_listeners_.push_back({reasons, listener});
    for (const auto& [id, entries] : peers_down_) {
      for (const PeerDown& e : entries) {
        if (Selects(reasons, e.reason)) known.push_back(e);
      }
    }
  }
  for (const PeerDown& e : known) listener(e);
}

bool Agent::IsPeerDown(int id, PeerDownReasons reasons) const {
  if (!any_peer_down_.load(std::memory_order_acquire)) return false;
  MutexLock lock(&mu_);
  return IsPeerDownLocked(id, reasons);
}

std::vector<PeerDown> Agent::PeersDown() const {
  std::vector<PeerDown> out;
  MutexLock lock(&mu_);
  for (const auto& [id, entries] : peers_down_) {
    out.insert(out.end(), entries.begin(), entries.end());
  }
  return out;
}

absl::Status Agent::ReportPeerDown(int id, PeerDownReason reason,
                                   const absl::Status& cause) {
  const std::string what =
      absl::StrCat("worker '", self_.name, "': reporting worker id ", id,
                   " down (", PeerDownReasonName(reason), ")");
  if (reason != PeerDownReason::kDetectorReport &&
      reason != PeerDownReason::kRetriesExhausted) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": only a detector's report or exhausted retries are taken "
              "here (the agent records transport failures and departures "
              "itself)"));
  }
  if (cause.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": the cause must be an error, not OK"));
  }
  if (id < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": worker ids are not negative"));
  }
  if (id == self_.id) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": a worker cannot report itself down"));
  }
  const WorkerInfo peer = KnownWorker(id);
  std::optional<NewPeerDown> news;
  {
    MutexLock lock(&mu_);
    news = RecordPeerDown(peer, reason, cause);
  }
  if (!news) return absl::OkStatus();
  FERRY_LOG(INFO) << "worker '" << self_.name << "': " << news->down.why;
  TellPeerDownListeners(*news);
  return absl::OkStatus();
}

void Agent::AddPeerFailureListener(PeerFailureListener listener) {
  AddPeerDownListener(
      [listener = std::move(listener)](const PeerDown& down) {
        listener(down.peer, down.cause);
      },
      static_cast<PeerDownReasons>(PeerDownReason::kTransportFailure));
}

bool Agent::IsPeerFailed(int id) const {
  return IsPeerDown(
      id, static_cast<PeerDownReasons>(PeerDownReason::kTransportFailure));
}

void Agent::ReportPeerFailure(int id, const absl::Status& why) {
  // Only present members fail: a departed worker left gracefully.
  absl::StatusOr<WorkerInfo> peer = GetWorkerInfo(id);
  if (!peer.ok()) return;
  std::optional<NewPeerDown> news;
  {
    MutexLock lock(&mu_);
    if (stopping_ || !group_known_ || id == self_.id) return;
    news = RecordPeerDown(*peer, PeerDownReason::kTransportFailure, why);
    if (!news) return;
  }
  FERRY_LOG(WARNING) << "worker '" << self_.name << "': peer '" << peer->name
                     << "' (rank " << id << ") failed: " << why;
  TellPeerDownListeners(*news);
}

// ---------------------------------------------------------------------------
// Sending.

Future<Message> Agent::Send(const WorkerRef& to, Message message,
                            std::optional<absl::Duration> timeout) {
  absl::StatusOr<WorkerInfo> peer = GetWorkerInfo(to);
  if (!peer.ok()) {
    std::string what = message.type == MessageType::kCall
                           ? absl::StrCat("calling '", message.function, "'")
                           : absl::StrCat("sending ", message.DebugString());
    return MakeErrorFuture<Message>(Annotate(peer.status(), what));
  }
  absl::StatusOr<GlobalId> id = ids_->Next();
  if (!id.ok()) return MakeErrorFuture<Message>(id.status());
  const absl::Duration limit = timeout.value_or(options_.rpc_timeout);
  message.id = *id;
  message.caller_name = self_.name;
  message.caller_id = self_.id;
  message.deadline = limit == absl::InfiniteDuration() ? absl::InfiniteFuture()
                                                       : absl::Now() + limit;
  for (const auto& [k, v] : CurrentContext()) message.context.emplace(k, v);
  InterceptorList interceptors = Interceptors();
  if (interceptors == nullptr) {
    return Transmit(*peer, std::move(message), limit);
  }
  absl::Status s =
      Intercept(interceptors, InterceptPoint::kSendRequest, *peer, message);
  if (!s.ok()) return MakeErrorFuture<Message>(s);
  return Transmit(*peer, std::move(message), limit)
      .Then([interceptors = std::move(interceptors), peer = *std::move(peer)](
                const Result<Message>& reply) -> absl::StatusOr<Message> {
        if (!reply.ok()) return reply.status();
        Message m = *reply;
        RETURN_IF_ERROR(
            Intercept(interceptors, InterceptPoint::kReceiveReply, peer, m));
        return m;
      });
}

namespace {

Message CallMessage(const std::string& function, Value::List args) {
  Message m;
  m.type = MessageType::kCall;
  m.function = function;
  m.payload = Value::FromList(std::move(args));
  return m;
}

}  // namespace

Future<Value> Agent::CallAsync(const WorkerRef& to, const std::string& function,
                               Value::List args,
                               std::optional<absl::Duration> timeout) {
  return Send(to, CallMessage(function, std::move(args)), timeout)
      .Then([](const Result<Message>& reply) -> absl::StatusOr<Value> {
        if (!reply.ok()) return reply.status();
        return reply->payload;
      });
}

Result<Value> Agent::CallSync(const WorkerRef& to, const std::string& function,
                              Value::List args,
                              std::optional<absl::Duration> timeout) {
  Future<Message> reply =
      Send(to, CallMessage(function, std::move(args)), timeout);
  // Unbounded: the call's own timeout ends it.
  reply.Wait().IgnoreError();
  const Result<Message>& r = reply.result();
  // Errors are handed out unshared, as Future::Get does.
  if (!r.ok()) return future_internal::Unshared(r.status());
  return r->payload;
}

// ---------------------------------------------------------------------------
// Receiving.

Future<Message> Agent::Dispatch(Message request) {
  const MessageType type = request.type;
  return Dispatch(type, [request = std::move(request)]() mutable {
    return absl::StatusOr<Message>(std::move(request));
  });
}

namespace {

// A future, and the ReplyCallback that completes it.
std::pair<Future<Message>, absl::AnyInvocable<void(Result<Message>)>>
FutureReply() {
  Promise<Message> reply;
  Future<Message> out = reply.GetFuture();
  return {std::move(out),
          [reply = std::move(reply)](Result<Message> r) mutable {
            reply.Set(std::move(r));
          }};
}

}  // namespace

Future<Message> Agent::Dispatch(MessageType type, Receiver receive) {
  auto [out, done] = FutureReply();
  DispatchTo(type, nullptr, nullptr, std::move(receive), std::move(done));
  return out;
}

Future<Message> Agent::Dispatch(MessageType type, const std::string& function,
                                Receiver receive) {
  auto [out, done] = FutureReply();
  Dispatch(type, function, std::move(receive), std::move(done));
  return out;
}

void Agent::Dispatch(MessageType type, const std::string& function,
                     Receiver receive, ReplyCallback done) {
  // kCall's handler is built in: a registered function is served directly
  // (one registry lookup); an unknown one by ServeCall, which names it.
  std::shared_ptr<const FunctionEntry> entry =
      type == MessageType::kCall ? registry_->Find(function) : nullptr;
  DispatchTo(type, std::move(entry), nullptr, std::move(receive),
             std::move(done));
}

void Agent::DispatchTo(MessageType type,
                       std::shared_ptr<const FunctionEntry> entry,
                       Handler handler, Receiver receive, ReplyCallback done) {
  // Before the group is known the request waits for it (AwaitGroup): on the
  // executor, never on the transport's thread.
  if (entry != nullptr && entry->non_blocking &&
      has_group_.load(std::memory_order_acquire)) {
    Serve([this,
           &entry](Message&& m) { return ServeFunction(*entry, std::move(m)); },
          receive(), std::move(done));
    return;
  }
  if (entry == nullptr && handler == nullptr) {
    handler = FindHandler(type);
    if (handler == nullptr) {
      done(absl::UnimplementedError(absl::StrCat(
          "worker '", self_.name, "' does not serve message type ",
          MessageTypeName(type), " (", static_cast<uint32_t>(type), ")")));
      return;
    }
  }
  // One allocation shared by the task and its cancellation: `done` is
  // called by whichever of them runs (or below, when the executor refuses).
  // The task captures only `pending`, so it is stored inline in the task.
  struct Pending {
    Agent* agent;
    std::shared_ptr<const FunctionEntry> entry;
    Handler handler;
    Receiver receive;
    ReplyCallback done;
  };
  auto pending = std::make_shared<Pending>(
      Pending{this, std::move(entry), std::move(handler), std::move(receive),
              std::move(done)});
  absl::Status submitted = executor_->Submit(
      [pending] {
        Pending& p = *pending;
        if (p.entry != nullptr) {
          p.agent->Serve(
              [&p](Message&& m) {
                return p.agent->ServeFunction(*p.entry, std::move(m));
              },
              p.receive(), std::move(p.done));
        } else {
          p.agent->Serve(
              [&p](Message&& m) -> Answer { return p.handler(std::move(m)); },
              p.receive(), std::move(p.done));
        }
      },
      [pending](const absl::Status& s) { pending->done(s); });
  if (!submitted.ok()) {
    pending->done(Annotate(submitted, absl::StrCat("worker '", self_.name,
                                                   "' queueing a request")));
  }
}

absl::Status Agent::AwaitGroup(const Message& request) {
  if (has_group_.load(std::memory_order_acquire)) return absl::OkStatus();
  MutexLock lock(&mu_);
  auto known_or_stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return group_known_ || stopping_;
  };
  ++awaiting_group_;
  mu_.AwaitWithDeadline(absl::Condition(&known_or_stopping), request.deadline);
  --awaiting_group_;
  if (group_known_) return absl::OkStatus();
  const std::string what =
      absl::StrCat(request.DebugString(), " reached worker '", self_.name,
                   "' before it knew its group");
  if (stopping_) {
    return absl::UnavailableError(
        absl::StrCat(what, ", and the worker stopped meanwhile"));
  }
  return absl::DeadlineExceededError(
      absl::StrCat(what, "; the caller's deadline passed waiting for it"));
}

int Agent::requests_awaiting_group() const {
  MutexLock lock(&mu_);
  return awaiting_group_;
}

namespace {

// Makes the handler's reply `r` the answer to request `id` of `type`, through
// the send interceptors (run with the request's `context` installed); an
// interceptor's error replaces it.
void FinishReply(
    Result<Message>& r, GlobalId id, MessageType type,
    const std::shared_ptr<const std::vector<Interceptor>>& interceptors,
    const WorkerInfo& peer, const ContextEntries& context) {
  if (!r.ok()) return;
  Message& m = *r;
  m.id = id;
  if (m.type == MessageType::kUnspecified) m.type = type;
  if (interceptors != nullptr) {
    ScopedContext installed(context);
    for (const Interceptor& i : *interceptors) {
      if (absl::Status s = i(InterceptPoint::kSendReply, peer, m); !s.ok()) {
        r = std::move(s);
        return;
      }
    }
  }
}

}  // namespace

void Agent::Serve(absl::FunctionRef<Answer(Message&&)> handler,
                  absl::StatusOr<Message>&& received, ReplyCallback done) {
  // The scopes ServeNow installs end before `done` runs.
  std::optional<Result<Message>> now = ServeNow(handler, received, done);
  if (now.has_value()) done(*std::move(now));
}

std::optional<Result<Message>> Agent::ServeNow(
    absl::FunctionRef<Answer(Message&&)> handler,
    absl::StatusOr<Message>& received, ReplyCallback& done) {
  if (!received.ok()) return Result<Message>(received.status());
  Message& request = *received;
  if (absl::Status known = AwaitGroup(request); !known.ok()) {
    return Result<Message>(known);
  }
  ScopedContext installed_context(request.context);
  ScopedLogLabel label(log_label_);
  if (absl::Now() > request.deadline) {
    return Result<Message>(absl::DeadlineExceededError(absl::StrCat(
        "the caller's deadline passed before ", request.DebugString(),
        " started on worker '", self_.name, "'")));
  }
  InterceptorList interceptors = Interceptors();
  WorkerInfo peer;
  // The handler runs with the context as the interceptors left it (a layer
  // restores its entry from its typed header there: distributed autograd's
  // context id). Nothing to install when both are empty, as most are.
  std::optional<ScopedContext> intercepted_context;
  if (interceptors != nullptr) {
    peer = PeerInfo(request.caller_id, request.caller_name);
    absl::Status s =
        Intercept(interceptors, InterceptPoint::kReceiveRequest, peer, request);
    if (!s.ok()) return Result<Message>(s);
    if (!request.context.empty() || !CurrentContext().empty()) {
      intercepted_context.emplace(request.context);
    }
  }
  const GlobalId id = request.id;
  const MessageType type = request.type;
  // The request's context again when the reply is intercepted, whichever
  // thread completes the handler.
  ContextEntries reply_context =
      interceptors != nullptr ? request.context : ContextEntries();
  Answer answer = handler(std::move(request));
  if (auto* ready = std::get_if<Result<Message>>(&answer)) {
    FinishReply(*ready, id, type, interceptors, peer, reply_context);
    return std::move(*ready);
  }
  Future<Message>& handled = std::get<Future<Message>>(answer);
  if (handled.IsReady()) {
    Result<Message> r = handled.result();
    FinishReply(r, id, type, interceptors, peer, reply_context);
    return r;
  }
  handled.OnComplete(
      [interceptors = std::move(interceptors), peer = std::move(peer),
       context = std::move(reply_context), id, type,
       done = std::move(done)](const Result<Message>& result) mutable {
        Result<Message> r = result;
        FinishReply(r, id, type, interceptors, peer, context);
        done(std::move(r));
      });
  return std::nullopt;
}

Future<Message> Agent::ServeCall(Message request) {
  std::shared_ptr<const FunctionEntry> entry =
      registry_->Find(request.function);
  if (entry == nullptr) {
    std::vector<std::string> names;
    for (const auto& e : registry_->List()) names.push_back(e->name);
    return MakeErrorFuture<Message>(absl::NotFoundError(absl::StrCat(
        "worker '", self_.name, "' has no function '", request.function,
        "' (registered: ", absl::StrJoin(names, ", "), ")")));
  }
  Answer answer = ServeFunction(*entry, std::move(request));
  if (auto* ready = std::get_if<Result<Message>>(&answer)) {
    return MakeReadyFuture<Message>(std::move(*ready));
  }
  return std::get<Future<Message>>(std::move(answer));
}

namespace {

// A function's result as the reply message; errors name the worker and
// function.
absl::StatusOr<Message> FunctionReply(const Result<Value>& r,
                                      const std::string& self,
                                      const std::string& function) {
  if (!r.ok()) {
    return absl::Status(r.status().code(),
                        absl::StrCat("worker '", self, "' function '", function,
                                     "': ", r.status().message()));
  }
  absl::StatusOr<Message> reply(absl::in_place);
  reply->payload = *r;
  return reply;
}

}  // namespace

Agent::Answer Agent::ServeFunction(const FunctionEntry& entry,
                                   Message&& request) {
  CallContext ctx;
  ctx.caller_name = std::move(request.caller_name);
  ctx.caller_id = request.caller_id;
  ctx.function = std::move(request.function);
  ctx.request_id = request.id.value();
  ctx.deadline = request.deadline;
  // The arguments go when the function returns, not with the request.
  const Value args = std::move(request.payload);
  Future<Value> result = entry.fn(ctx, args);
  if (result.IsReady()) {
    return FunctionReply(result.result(), self_.name, ctx.function);
  }
  return result.Then(
      [self = self_.name, function = std::move(ctx.function)](
          const Result<Value>& r) { return FunctionReply(r, self, function); });
}

}  // namespace ferry::rpc
