#include "ferry/rref/rref_context.h"

#include <algorithm>
#include <functional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "ferry/common/logging.h"
#include "ferry/common/status.h"
#include "ferry/rpc/context.h"

namespace ferry::rref {

using rpc::Message;
using rpc::MessageType;
using rpc::WorkerInfo;

namespace {

// "the owner 'ps0' (id 1) is dead": the instance, as a worker restarted under
// its name has another id (and does not hold the value).
std::string DeadOwner(const WorkerInfo& owner) {
  return absl::StrCat("the owner '", owner.name, "' (id ", owner.id,
                      ") is dead");
}

void ForEachHandle(Value& v, const std::function<void(RRefHandle&)>& fn) {
  if (RRefHandle* h = v.mutable_rref()) {
    fn(*h);
  } else if (Value::List* l = v.mutable_list()) {
    for (Value& x : *l) ForEachHandle(x, fn);
  } else if (Value::Dict* d = v.mutable_dict()) {
    for (auto& [k, x] : *d) ForEachHandle(x, fn);
  }
}

Message Control(MessageType type, GlobalId rref_id, GlobalId fork_id,
                int owner_id, int peer_id = -1, std::string type_name = "") {
  Message m;
  m.type = type;
  SetFields(m, RRefFields{rref_id, fork_id, owner_id, peer_id,
                          std::move(type_name), {}});
  return m;
}

Future<Message> ErrorReply(absl::Status s) {
  return MakeErrorFuture<Message>(std::move(s));
}

// A request's RRef header: InvalidArgument naming the message and its sender
// when it is missing or malformed.
absl::StatusOr<RRefFields> RequestFields(const Message& m) {
  absl::StatusOr<std::optional<RRefFields>> f = FieldsOf(m);
  if (!f.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(f.status().message(),
                                                   " from '", m.caller_name,
                                                   "'"));
  }
  if (!f->has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("no rref header on ", m.DebugString()));
  }
  return **std::move(f);
}

constexpr char kMethodPrefix = '@';

// Adds what `v` would cost inline to `*bytes`; false when it must not go
// inline (an RRef, a protobuf message, a tensor with autograd state).
bool AddInlineCost(const Value& v, size_t* bytes) {
  if (const Tensor* t = v.if_tensor()) {
    if (!t->defined() || t->autograd_meta() != nullptr) return false;
    *bytes += t->nbytes();
  } else if (const std::string* str = v.if_string()) {
    *bytes += str->size();
  } else if (const Bytes* b = v.if_bytes()) {
    *bytes += b->data.size();
  } else if (const Value::List* l = v.if_list()) {
    for (const Value& x : *l) {
      if (!AddInlineCost(x, bytes)) return false;
    }
  } else if (const Value::Dict* d = v.if_dict()) {
    for (const auto& [k, x] : *d) {
      *bytes += k.size();
      if (!AddInlineCost(x, bytes)) return false;
    }
  } else if (v.if_rref() != nullptr || v.if_message() != nullptr) {
    return false;
  }
  return true;
}

bool Inlinable(const Value& v, size_t limit) {
  size_t bytes = 0;
  return limit > 0 && AddInlineCost(v, &bytes) && bytes <= limit;
}

}  // namespace

// ---------------------------------------------------------------------------
// RRefState

RRefState::~RRefState() {
  if (released_.exchange(true)) return;
  if (std::shared_ptr<RRefContext> ctx = ctx_.lock()) {
    ctx->OnStateDropped(is_owner_, owner_, rref_id_, fork_id_, created_);
  }
}

std::string RRefState::DebugString() const {
  return absl::StrCat(
      "RRef ", rref_id_.ToString(), " owned by '", owner_.name, "'",
      is_owner_ ? "" : absl::StrCat(" (fork ", fork_id_.ToString(), ")"));
}

// ---------------------------------------------------------------------------
// Setup

RRefContext::RRefContext(rpc::Agent* agent, Options options)
    : agent_(agent),
      options_(std::move(options)),
      classes_(options_.classes ? options_.classes
                                : std::make_shared<ClassRegistry>()),
      ids_(static_cast<uint16_t>(agent->self().id), /*first_local=*/1),
      sender_(
          [agent](int to, Message m, absl::Duration timeout) {
            return agent->Send(to, std::move(m), timeout);
          },
          InternalSender::Options{options_.internal_timeout,
                                  options_.max_attempts}),
      owned_(agent->self().name),
      batcher_(options_.delete_flush_delay) {}

RRefContext::~RRefContext() {
  {
    MutexLock lock(&mu_);
    stop_flusher_ = true;
    batcher_.Poke();
  }
  if (!flusher_.joinable()) return;
  // The flusher may hold the last reference briefly (a send's completion).
  if (flusher_.get_id() == std::this_thread::get_id()) {
    flusher_.detach();
  } else {
    flusher_.join();
  }
}

absl::StatusOr<std::shared_ptr<RRefContext>> RRefContext::Install(
    rpc::Agent& agent_ref, Options options) {
  rpc::Agent* agent = &agent_ref;
  if (agent->self().id < 0) {
    return absl::FailedPreconditionError(
        "RRefContext needs a joined agent (self() unknown)");
  }
  RETURN_IF_ERROR(ClaimMessages());
  std::shared_ptr<RRefContext> ctx(new RRefContext(agent, std::move(options)));
  RETURN_IF_ERROR(ctx->Install());
  if (ctx->options_.delete_flush_delay > absl::ZeroDuration()) {
    ctx->flusher_ =
        std::thread([raw = ctx.get(), weak = std::weak_ptr<RRefContext>(ctx)] {
          raw->FlushLoop(weak);
        });
  }
  return ctx;
}

absl::Status RRefContext::Install() {
  std::weak_ptr<RRefContext> weak = weak_from_this();
  const std::string self = agent_->self().name;
  using Method = Future<Message> (RRefContext::*)(Message);
  const std::pair<MessageType, Method> handlers[] = {
      {kRemoteCall, &RRefContext::HandleRemoteCall},
      {kRRefFetch, &RRefContext::HandleFetch},
      {kRRefForkRequest, &RRefContext::HandleForkRequest},
      {kRRefChildAccept, &RRefContext::HandleChildAccept},
      {kRRefUserDelete, &RRefContext::HandleUserDelete},
      {kRRefMethod, &RRefContext::HandleMethod},
  };
  for (const auto& [type, method] : handlers) {
    RETURN_IF_ERROR(agent_->RegisterHandler(
        type, [weak, method = method, self](Message m) -> Future<Message> {
          std::shared_ptr<RRefContext> ctx = weak.lock();
          if (ctx == nullptr) {
            return ErrorReply(absl::UnavailableError(absl::StrCat(
                "worker '", self, "' has no RRef context any more")));
          }
          return ((*ctx).*method)(std::move(m));
        }));
  }
  agent_->AddInterceptor(
      [weak](rpc::InterceptPoint point, const WorkerInfo& peer, Message& m) {
        std::shared_ptr<RRefContext> ctx = weak.lock();
        return ctx ? ctx->Intercept(point, peer, m) : absl::OkStatus();
      });
  // A peer down in the agent's table, for any reason, is known dead here:
  // a transport failure, a departure (its own Leave released what it could
  // first), a detector's report, or this context's exhausted retries. Its
  // forks and the children sent to it go once, at its first entry.
  agent_->AddPeerDownListener([weak](const rpc::PeerDown& down) {
    if (!down.first) return;
    if (std::shared_ptr<RRefContext> ctx = weak.lock()) {
      ctx->DropPeer(down.peer.id);
    }
  });
  return agent_->inspectors().Register("rref", [weak] {
    std::shared_ptr<RRefContext> ctx = weak.lock();
    return ctx ? ctx->Inspect() : std::vector<rpc::InspectionRow>{};
  });
}

absl::StatusOr<GlobalId> RRefContext::NextId() { return ids_.Next(); }

absl::StatusOr<WorkerInfo> RRefContext::Worker(int id) const {
  return agent_->GetWorkerInfo(id);
}

std::string RRefContext::Describe(GlobalId rref_id,
                                  const std::string& owner) const {
  return absl::StrCat("RRef ", rref_id.ToString(), " owned by '", owner,
                      "' (on worker '", agent_->self().name, "')");
}

RRefHandle RRefContext::MakeHandle(const std::shared_ptr<RRefState>& state) {
  RRefHandle h;
  if (state == nullptr) return h;
  h.owner_id = state->owner().id;
  h.rref_id = state->rref_id();
  h.fork_id = state->fork_id();
  h.type_name = state->type_name();
  h.local = state;
  return h;
}

// ---------------------------------------------------------------------------
// Handles travelling in messages

absl::Status RRefContext::Intercept(rpc::InterceptPoint point,
                                    const WorkerInfo& peer, Message& message) {
  const bool sending = point == rpc::InterceptPoint::kSendRequest ||
                       point == rpc::InterceptPoint::kSendReply;
  if (point == rpc::InterceptPoint::kReceiveRequest) {
    RETURN_IF_ERROR(ApplyPiggybackedDeletes(peer, message));
  }
  absl::Status status;
  ForEachHandle(message.payload, [&](RRefHandle& h) {
    if (!status.ok()) return;
    status = sending ? ForkForSend(h, peer.id) : AcceptReceived(h, peer.id);
  });
  return status;
}

absl::Status RRefContext::ForkForSend(RRefHandle& handle, int to) {
  if (handle.local == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker '", agent_->self().name, "' cannot send RRef ",
        handle.rref_id.ToString(),
        ": the handle holds no reference on this worker (build it from an "
        "RRef)"));
  }
  auto state = std::static_pointer_cast<RRefState>(handle.local);
  ASSIGN_OR_RETURN(GlobalId fork, NextId());
  {
    MutexLock lock(&mu_);
    if (state->is_owner()) {
      if (!owned_.AddSentFork(state->rref_id(), fork, to)) {  // Early.
        return absl::InternalError(absl::StrCat(
            state->DebugString(), ": owner handle alive but not registered"));
      }
    } else {
      users_.AddChild(fork, state, to);  // I2
    }
  }
  handle.owner_id = state->owner().id;
  handle.rref_id = state->rref_id();
  handle.fork_id = fork;
  handle.type_name = state->type_name();
  handle.local.reset();  // May drop this worker's reference: outside mu_.
  return absl::OkStatus();
}

absl::Status RRefContext::AcceptReceived(RRefHandle& handle, int parent) {
  const int self = agent_->self().id;
  const GlobalId rref_id = handle.rref_id;
  const GlobalId fork = handle.fork_id;
  if (handle.owner_id == self) {
    std::shared_ptr<RRefState> state;
    {
      // The handle may overtake the REMOTE_CALL creating the value (a user
      // sharing an unconfirmed RRef): a placeholder waits for it.
      MutexLock lock(&mu_);
      ASSIGN_OR_RETURN(std::shared_ptr<Slot> slot,
                       owned_.SlotFor(rref_id, handle.type_name));
      state = NewOwnerHandle(rref_id, handle.type_name, slot);
    }
    if (parent == self) {
      DeleteFork(rref_id, fork, self);  // Our own early registration.
    } else {
      SendInternal(parent,
                   Control(kRRefChildAccept, rref_id, fork, self),
                   nullptr);
    }
    handle.local = std::move(state);
    return absl::OkStatus();
  }
  {
    MutexLock lock(&mu_);
    if (std::shared_ptr<RRefState> s = users_.Find(fork)) {
      handle.local = std::move(s);  // A duplicate of a delivered handle.
      return absl::OkStatus();
    }
  }
  ASSIGN_OR_RETURN(WorkerInfo owner, Worker(static_cast<int>(handle.owner_id)));
  if (parent == owner.id) {
    handle.local =
        NewUser(owner, rref_id, fork, handle.type_name, MakeReadyFuture());
    return absl::OkStatus();
  }
  Promise<void> confirmed;
  handle.local =
      NewUser(owner, rref_id, fork, handle.type_name, confirmed.GetFuture());
  Message request = Control(kRRefForkRequest, rref_id, fork, owner.id,
                            parent, handle.type_name);
  std::weak_ptr<RRefContext> weak = weak_from_this();
  const std::string what = absl::StrCat("confirming fork ", fork.ToString(),
                                        " of ", Describe(rref_id, owner.name));
  SendInternal(
      owner.id, std::move(request),
      [weak, confirmed, parent, rref_id, fork, what,
       owner_id = owner.id](const Result<Message>& r) mutable {
        confirmed.Set(r.ok() ? absl::OkStatus() : Annotate(r.status(), what));
        if (std::shared_ptr<RRefContext> ctx = weak.lock()) {
          ctx->SendInternal(
              parent,
              Control(kRRefChildAccept, rref_id, fork, owner_id),
              nullptr);
        }
      });
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Owner side

std::shared_ptr<RRefState> RRefContext::NewOwnerHandle(
    GlobalId rref_id, const std::string& type_name,
    const std::shared_ptr<Slot>& slot) {
  owned_.AddLocalHandle(rref_id);  // After SlotFor: the entry exists.
  std::shared_ptr<RRefState> s(new RRefState());
  s->ctx_ = weak_from_this();
  s->is_owner_ = true;
  s->owner_ = agent_->self();
  s->rref_id_ = rref_id;
  s->type_name_ = type_name;
  s->created_ = slot->value.Then(
      [](const Result<Value>& v) -> absl::Status { return v.status(); });
  return s;
}

void RRefContext::DeleteFork(GlobalId rref_id, GlobalId fork_id, int sender) {
  std::shared_ptr<Slot> doomed;  // Dies after the lock is released.
  MutexLock lock(&mu_);
  absl::StatusOr<std::shared_ptr<Slot>> deleted =
      owned_.DeleteFork(rref_id, fork_id, sender);
  if (!deleted.ok()) {
    FERRY_LOG(WARNING) << "ignored a fork deletion: " << deleted.status();
    return;
  }
  doomed = *std::move(deleted);
}

void RRefContext::OnCreated(GlobalId rref_id) {
  std::shared_ptr<Slot> doomed;
  MutexLock lock(&mu_);
  doomed = owned_.MaybeDelete(rref_id);
}

Future<Message> RRefContext::HandleRemoteCall(Message request) {
  absl::StatusOr<RRefFields> fields = RequestFields(request);
  if (!fields.ok()) return ErrorReply(fields.status());
  const RRefFields& f = *fields;
  std::shared_ptr<Slot> slot;
  bool start = false;
  {
    MutexLock lock(&mu_);
    if (f.fork_id != GlobalId() &&
        owned_.IsForkDeleted(f.fork_id, request.caller_id)) {
      return MakeReadyFuture<Message>(Message());  // The user is gone (I4).
    }
    absl::StatusOr<std::shared_ptr<Slot>> s =
        owned_.SlotFor(f.rref_id, f.type_name);
    if (!s.ok()) return ErrorReply(s.status());
    slot = *s;
    if (f.fork_id != GlobalId()) {
      owned_.AddFork(f.rref_id, f.fork_id, request.caller_id);
    }
    start = !slot->started.exchange(true);
  }
  if (start) {
    std::weak_ptr<RRefContext> weak = weak_from_this();
    const std::string what =
        absl::StrCat("worker '", agent_->self().name, "' creating RRef ",
                     f.rref_id.ToString(), " with '", request.function, "'");
    RunCreation(slot, request)
        .OnComplete([slot, weak, what, id = f.rref_id](const Result<Value>& r) {
          slot->promise.Set(r.ok() ? r : Annotate(r.status(), what));
          if (std::shared_ptr<RRefContext> ctx = weak.lock()) {
            ctx->OnCreated(id);
          }
        });
  }
  return CreationReply(slot);
}

Future<Message> RRefContext::CreationReply(
    const std::shared_ptr<Slot>& slot) const {
  return slot->value.Then(
      [slot, limit = options_.inline_value_bytes](
          const Result<Value>& v) -> absl::StatusOr<Message> {
        if (!v.ok()) return v.status();
        Message reply;
        if (slot->object == nullptr && Inlinable(*v, limit)) {
          SetFields(reply, RRefFields{});  // Marks the value as carried.
          reply.payload = *v;
        }
        return reply;
      });
}

Future<Value> RRefContext::RunCreation(const std::shared_ptr<Slot>& slot,
                                       const Message& request) {
  const std::string& fn = request.function;
  if (!fn.empty() && fn[0] == kMethodPrefix) {
    const Value::List* p = request.payload.if_list();
    if (p == nullptr || p->size() != 2 || p->at(0).if_int() == nullptr) {
      return MakeErrorFuture<Value>(
          absl::InvalidArgumentError("malformed remote method call"));
    }
    const GlobalId target = GlobalId::FromValue(*p->at(0).if_int());
    absl::StatusOr<std::shared_ptr<Slot>> t;
    {
      MutexLock lock(&mu_);
      t = owned_.SlotFor(target, "");
    }
    if (!t.ok()) return MakeErrorFuture<Value>(t.status());
    std::weak_ptr<RRefContext> weak = weak_from_this();
    return (*t)->value.Then(
        [weak, t = *t, method = fn.substr(1),
         args = p->at(1)](const Result<Value>& v) -> Future<Value> {
          if (!v.ok()) return MakeErrorFuture<Value>(v.status());
          std::shared_ptr<RRefContext> ctx = weak.lock();
          if (ctx == nullptr) {
            return MakeErrorFuture<Value>(absl::UnavailableError("shut down"));
          }
          return ctx->RunMethod(t, method, args);
        });
  }
  if (std::shared_ptr<const ClassInfo> cls = classes_->Find(fn)) {
    if (!cls->construct) {
      return MakeErrorFuture<Value>(absl::FailedPreconditionError(
          absl::StrCat("class '", fn, "' has no registered constructor")));
    }
    absl::StatusOr<std::shared_ptr<void>> object =
        cls->construct(request.payload);
    if (!object.ok()) return MakeErrorFuture<Value>(object.status());
    slot->object = *std::move(object);
    slot->cls = std::move(cls);
    return MakeReadyFuture<Value>(Value::None());
  }
  std::shared_ptr<const rpc::FunctionEntry> entry = agent_->registry().Find(fn);
  if (entry == nullptr) {
    return MakeErrorFuture<Value>(absl::NotFoundError(
        absl::StrCat("worker '", agent_->self().name,
                     "' has no function or class '", fn, "'")));
  }
  rpc::CallContext cc;
  cc.caller_name = request.caller_name;
  cc.caller_id = request.caller_id;
  cc.function = fn;
  cc.request_id = request.id.value();
  cc.deadline = request.deadline;
  return entry->fn(cc, request.payload);
}

Future<Value> RRefContext::RunMethod(const std::shared_ptr<Slot>& slot,
                                     const std::string& method,
                                     const Value& args) {
  if (slot->object == nullptr || slot->cls == nullptr) {
    return MakeErrorFuture<Value>(absl::FailedPreconditionError(absl::StrCat(
        "worker '", agent_->self().name, "': cannot call method '", method,
        "': the RRef holds a value, not an object of a registered class")));
  }
  auto it = slot->cls->methods.find(method);
  if (it == slot->cls->methods.end()) {
    return MakeErrorFuture<Value>(absl::NotFoundError(
        absl::StrCat("class '", slot->cls->name, "' has no method '", method,
                     "' (on worker '", agent_->self().name, "')")));
  }
  if (slot->cls->serialized) {
    MutexLock lock(&slot->method_mu);
    return it->second(slot->object.get(), args);
  }
  return it->second(slot->object.get(), args);
}

Future<Message> RRefContext::HandleFetch(Message request) {
  absl::StatusOr<RRefFields> f = RequestFields(request);
  if (!f.ok()) return ErrorReply(f.status());
  const GlobalId id = f->rref_id;
  std::shared_ptr<Slot> slot;
  {
    MutexLock lock(&mu_);
    absl::StatusOr<std::shared_ptr<Slot>> s = owned_.SlotFor(id, f->type_name);
    if (!s.ok()) return ErrorReply(s.status());
    slot = *s;
  }
  const std::string what = Describe(id, agent_->self().name);
  return slot->value.Then(
      [slot, what](const Result<Value>& v) -> absl::StatusOr<Message> {
        if (!v.ok()) return v.status();
        if (slot->object != nullptr) {
          return absl::FailedPreconditionError(absl::StrCat(
              what, " holds an object of class '", slot->cls->name,
              "', which does not travel; call its methods through rpc_sync()"));
        }
        Message reply;
        reply.payload = *v;
        return reply;
      });
}

Future<Message> RRefContext::HandleMethod(Message request) {
  absl::StatusOr<RRefFields> f = RequestFields(request);
  if (!f.ok()) return ErrorReply(f.status());
  std::shared_ptr<Slot> slot;
  {
    MutexLock lock(&mu_);
    absl::StatusOr<std::shared_ptr<Slot>> s = owned_.SlotFor(f->rref_id, "");
    if (!s.ok()) return ErrorReply(s.status());
    slot = *s;
  }
  std::weak_ptr<RRefContext> weak = weak_from_this();
  return slot->value
      .Then([weak, slot, method = request.function,
             args = request.payload](const Result<Value>& v) -> Future<Value> {
        if (!v.ok()) return MakeErrorFuture<Value>(v.status());
        std::shared_ptr<RRefContext> ctx = weak.lock();
        if (ctx == nullptr) {
          return MakeErrorFuture<Value>(absl::UnavailableError("shut down"));
        }
        return ctx->RunMethod(slot, method, args);
      })
      .Then([](const Result<Value>& v) -> absl::StatusOr<Message> {
        if (!v.ok()) return v.status();
        Message reply;
        reply.payload = *v;
        return reply;
      });
}

Future<Message> RRefContext::HandleForkRequest(Message request) {
  absl::StatusOr<RRefFields> fields = RequestFields(request);
  if (!fields.ok()) return ErrorReply(fields.status());
  const RRefFields& f = *fields;
  MutexLock lock(&mu_);
  if (owned_.IsForkDeleted(f.fork_id, request.caller_id)) {
    return MakeReadyFuture<Message>(Message());  // The user is gone (I4).
  }
  absl::StatusOr<std::shared_ptr<Slot>> s =
      owned_.SlotFor(f.rref_id, f.type_name);
  if (!s.ok()) return ErrorReply(s.status());
  owned_.AddFork(f.rref_id, f.fork_id, request.caller_id);
  return MakeReadyFuture<Message>(Message());
}

Future<Message> RRefContext::HandleChildAccept(Message request) {
  absl::StatusOr<RRefFields> f = RequestFields(request);
  if (!f.ok()) return ErrorReply(f.status());
  PendingChild child;  // Released after the lock (it may be the last ref).
  {
    MutexLock lock(&mu_);
    child = users_.TakeChild(f->fork_id);
  }
  return MakeReadyFuture<Message>(Message());
}

Future<Message> RRefContext::HandleUserDelete(Message request) {
  absl::StatusOr<RRefFields> f = RequestFields(request);
  if (!f.ok()) return ErrorReply(f.status());
  // More (rref, fork) pairs of a batch follow in the payload as ints.
  std::vector<std::pair<GlobalId, GlobalId>> forks = {
      {f->rref_id, f->fork_id}};
  if (const Value::List* more = request.payload.if_list()) {
    for (size_t i = 0; i + 1 < more->size(); i += 2) {
      const int64_t* r = (*more)[i].if_int();
      const int64_t* f = (*more)[i + 1].if_int();
      if (r == nullptr || f == nullptr) break;
      forks.emplace_back(GlobalId::FromValue(static_cast<uint64_t>(*r)),
                         GlobalId::FromValue(static_cast<uint64_t>(*f)));
    }
    if (forks.size() != 1 + more->size() / 2 || more->size() % 2 != 0) {
      return ErrorReply(absl::InvalidArgumentError(absl::StrCat(
          "worker '", agent_->self().name,
          "': malformed RREF_USER_DELETE "
          "batch from '",
          request.caller_name, "' (expected (rref id, fork id) int pairs)")));
    }
  } else if (!request.payload.is_none()) {
    return ErrorReply(absl::InvalidArgumentError(absl::StrCat(
        "worker '", agent_->self().name, "': malformed RREF_USER_DELETE from '",
        request.caller_name, "'")));
  }
  for (const auto& [rref_id, fork_id] : forks) {
    DeleteFork(rref_id, fork_id, request.caller_id);
  }
  return MakeReadyFuture<Message>(Message());
}

// ---------------------------------------------------------------------------
// User side

std::shared_ptr<RRefState> RRefContext::NewUser(
    const WorkerInfo& owner, GlobalId rref_id, GlobalId fork_id,
    std::string type_name, Future<void> created,
    std::optional<Future<std::optional<Value>>> creation_value) {
  std::shared_ptr<RRefState> s(new RRefState());
  s->creation_value_ = std::move(creation_value);
  s->ctx_ = weak_from_this();
  s->owner_ = owner;
  s->rref_id_ = rref_id;
  s->fork_id_ = fork_id;
  s->type_name_ = std::move(type_name);
  s->created_ = std::move(created);
  MutexLock lock(&mu_);
  users_.Add(fork_id, s);
  return s;
}

void RRefContext::OnStateDropped(bool is_owner, const WorkerInfo& owner,
                                 GlobalId rref_id, GlobalId fork_id,
                                 const Future<void>& created) {
  if (is_owner) {
    std::shared_ptr<Slot> doomed;
    MutexLock lock(&mu_);
    doomed = owned_.DropLocalHandle(rref_id);
    return;
  }
  {
    MutexLock lock(&mu_);
    users_.Forget(fork_id);
    if (owner.id < 0 || IsPeerDown(owner.id)) return;
    users_.AddPendingDelete();
  }
  // I1: the deletion goes out once the owner confirmed the fork (or its
  // confirmation failed: USER_DELETE is idempotent and tombstones the fork).
  std::weak_ptr<RRefContext> weak = weak_from_this();
  created.OnComplete(
      [weak, owner_id = owner.id, rref_id, fork_id](const absl::Status&) {
        if (std::shared_ptr<RRefContext> ctx = weak.lock()) {
          ctx->QueueUserDelete(owner_id, rref_id, fork_id);
        }
      });
}

void RRefContext::QueueUserDelete(int owner, GlobalId rref_id,
                                  GlobalId fork_id) {
  DeleteBatch batch;
  {
    MutexLock lock(&mu_);
    if (IsPeerDown(owner)) {
      users_.SettleDeletes(1);  // Its forks were dropped with it.
      return;
    }
    // Unless it goes now, it rides on the next batch or request to `owner`,
    // or the flusher sends it.
    batch = batcher_.Queue(owner, rref_id, fork_id, absl::Now());
    if (batch.empty()) return;
  }
  SendUserDeletes(owner, std::move(batch));
}

DeleteBatch RRefContext::EndBatch(int owner) {
  DeleteBatcher::Ended ended = batcher_.EndBatch(owner, IsPeerDown(owner));
  users_.SettleDeletes(ended.dropped);
  return std::move(ended.next);
}

void RRefContext::SendUserDeletes(int owner, DeleteBatch batch) {
  Message m = Control(kRRefUserDelete, batch[0].first,
                      batch[0].second, owner);
  if (batch.size() > 1) {
    Value::List more;
    more.reserve(2 * (batch.size() - 1));
    for (size_t i = 1; i < batch.size(); ++i) {
      more.push_back(Value::Int(static_cast<int64_t>(batch[i].first.value())));
      more.push_back(Value::Int(static_cast<int64_t>(batch[i].second.value())));
    }
    m.payload = Value::FromList(std::move(more));
  }
  const int n = static_cast<int>(batch.size());
  std::weak_ptr<RRefContext> weak = weak_from_this();
  SendInternal(owner, std::move(m), [weak, owner](const Result<Message>&) {
    std::shared_ptr<RRefContext> ctx = weak.lock();
    if (ctx == nullptr) return;
    DeleteBatch next;
    {
      MutexLock lock(&ctx->mu_);
      next = ctx->EndBatch(owner);
    }
    if (!next.empty()) ctx->SendUserDeletes(owner, std::move(next));
  });
  // Counted by in_flight_ now (SendInternal), so settling sees no gap.
  MutexLock lock(&mu_);
  users_.SettleDeletes(n);
}

DeleteBatch RRefContext::AttachDeletes(int owner, Message& m) {
  DeleteBatch batch;
  {
    MutexLock lock(&mu_);
    if (IsPeerDown(owner)) return batch;
    batch = batcher_.Attach(owner);
    if (batch.empty()) return batch;
  }
  // `m` is this worker's own request to the owner: its header decodes.
  absl::StatusOr<std::optional<RRefFields>> f = FieldsOf(m);
  RRefFields fields =
      f.ok() && f->has_value() ? **std::move(f) : RRefFields{};
  fields.deletes = batch;
  SetFields(m, fields);
  return batch;
}

void RRefContext::CarrierDone(int owner, DeleteBatch batch,
                              const absl::Status& s) {
  if (batch.empty()) return;
  if (!s.ok() && !IsPeerDown(owner)) {
    // Delivered or not, the batch goes again alone (deletions are
    // idempotent, I4); it stays the batch in flight.
    SendUserDeletes(owner, std::move(batch));
    return;
  }
  DeleteBatch next;
  {
    MutexLock lock(&mu_);
    users_.SettleDeletes(static_cast<int>(batch.size()));
    next = EndBatch(owner);
  }
  if (!next.empty()) SendUserDeletes(owner, std::move(next));
}

Future<Message> RRefContext::SendCarrying(int owner, Message m,
                                          absl::Duration timeout) {
  DeleteBatch batch = AttachDeletes(owner, m);
  Future<Message> reply = agent_->Send(owner, std::move(m), timeout);
  if (batch.empty()) return reply;
  std::weak_ptr<RRefContext> weak = weak_from_this();
  reply.OnComplete([weak, owner, batch = std::move(batch)](
                       const Result<Message>& r) mutable {
    if (std::shared_ptr<RRefContext> ctx = weak.lock()) {
      ctx->CarrierDone(owner, std::move(batch), r.status());
    }
  });
  return reply;
}

absl::Status RRefContext::ApplyPiggybackedDeletes(const WorkerInfo& peer,
                                                  Message& m) {
  // Only the RRef layer's own requests carry deletions (SendCarrying,
  // remote()): a header on any other type (a plain CALL, which an
  // unauthenticated connection may send) deletes nothing.
  if (m.type != kRemoteCall && m.type != kRRefFetch && m.type != kRRefMethod) {
    return absl::OkStatus();
  }
  if (m.FindHeader(kRRefHeader) == nullptr) return absl::OkStatus();
  absl::StatusOr<std::optional<RRefFields>> f = FieldsOf(m);
  if (!f.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker '", agent_->self().name, "': ",
                     f.status().message(), " from '", peer.name, "'"));
  }
  // The header belongs to this message alone (never a handler's nested
  // call), so its deletions are the sender's own.
  for (const auto& [rref_id, fork_id] : (*f)->deletes) {
    DeleteFork(rref_id, fork_id, peer.id);
  }
  return absl::OkStatus();
}

void RRefContext::FlushLoop(const std::weak_ptr<RRefContext>& weak) {
  // `this` stays valid while the destructor has not begun elsewhere (it joins
  // this thread). The sends hold a strong reference: a send's completion may
  // run inline and drop what was the last other one, and SendUserDeletes
  // still uses `this` after SendInternal returns. Releasing `self` may run
  // the destructor here; `weak` then tells, without touching `this`.
  for (;;) {
    std::vector<std::pair<int, DeleteBatch>> due;
    {
      MutexLock lock(&mu_);
      if (!AwaitDueDeletes(due)) return;
    }
    // Null when the destructor has begun on another thread: it waits for
    // this thread, so the sends below are still safe.
    std::shared_ptr<RRefContext> self = weak.lock();
    for (auto& [owner, batch] : due) SendUserDeletes(owner, std::move(batch));
    self.reset();
    if (weak.expired()) return;
  }
}

bool RRefContext::AwaitDueDeletes(
    std::vector<std::pair<int, DeleteBatch>>& due) {
  while (!stop_flusher_) {
    const absl::Time next = batcher_.NextFlush(absl::Now());
    const uint64_t seen = batcher_.changes();
    auto changed = [this, seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stop_flusher_ || batcher_.changes() != seen;
    };
    if (mu_.AwaitWithDeadline(absl::Condition(&changed), next)) continue;
    int dropped = 0;  // Queued for owners known dead: their forks went.
    due = batcher_.TakeDue(
        absl::Now(),
        [this](int owner) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return IsPeerDown(owner);  // Called by TakeDue, under mu_.
        },
        &dropped);
    users_.SettleDeletes(dropped);
    if (!due.empty()) return true;
  }
  return false;
}

std::shared_ptr<RRefState> RRefContext::Remote(const rpc::WorkerRef& to,
                                               const std::string& function,
                                               Value::List args,
                                               std::string type_name,
                                               absl::Duration timeout) {
  return RemoteImpl(to, function, std::move(args), std::move(type_name),
                    timeout, nullptr);
}

std::shared_ptr<RRefState> RRefContext::RemoteImpl(
    const rpc::WorkerRef& to, const std::string& function, Value::List args,
    std::string type_name, absl::Duration timeout,
    std::shared_ptr<RRefState> keep_alive) {
  Message m;
  m.type = kRemoteCall;
  m.function = function;
  m.payload = Value::FromList(std::move(args));
  absl::StatusOr<WorkerInfo> owner = agent_->GetWorkerInfo(to);
  absl::StatusOr<GlobalId> rref_id = NextId();
  absl::StatusOr<GlobalId> fork_id = NextId();
  absl::Status bad = !owner.ok()     ? owner.status()
                     : !rref_id.ok() ? rref_id.status()
                                     : fork_id.status();
  if (!bad.ok()) {
    // A handle that fails at its first use, never a crash.
    return NewUser(WorkerInfo{"?", -1, ""}, GlobalId(), GlobalId(),
                   std::move(type_name),
                   MakeErrorFuture<void>(Annotate(
                       bad, absl::StrCat("remote('", function, "')"))));
  }
  const int self = agent_->self().id;
  if (owner->id == self) {
    std::shared_ptr<RRefState> state;
    std::shared_ptr<Slot> slot;
    {
      MutexLock lock(&mu_);
      slot = *owned_.SlotFor(*rref_id, type_name);  // A fresh id: never deleted.
      state = NewOwnerHandle(*rref_id, type_name, slot);
    }
    SetFields(m, RRefFields{*rref_id, GlobalId(), self, -1, type_name, {}});
    std::weak_ptr<RRefContext> weak = weak_from_this();
    agent_->Send(self, std::move(m), timeout)
        .OnComplete([slot, weak, id = *rref_id,
                     keep_alive](const Result<Message>& r) mutable {
          keep_alive.reset();
          if (r.ok()) return;
          slot->promise.Set(r.status());  // Never ran: fail the creation.
          if (std::shared_ptr<RRefContext> ctx = weak.lock())
            ctx->OnCreated(id);
        });
    return state;
  }
  Promise<void> created;
  Promise<std::optional<Value>> value;
  std::shared_ptr<RRefState> state =
      NewUser(*owner, *rref_id, *fork_id, type_name, created.GetFuture(),
              value.GetFuture());
  SetFields(m, RRefFields{*rref_id, *fork_id, owner->id, -1, type_name, {}});
  DeleteBatch carried = AttachDeletes(owner->id, m);
  std::weak_ptr<RRefContext> weak = weak_from_this();
  // One attempt: a retried REMOTE_CALL would fork its RRef arguments again.
  SendInternal(
      owner->id, std::move(m),
      [created, value, keep_alive, weak, owner_id = owner->id,
       carried = std::move(carried)](const Result<Message>& r) mutable {
        if (std::shared_ptr<RRefContext> ctx = weak.lock()) {
          ctx->CarrierDone(owner_id, std::move(carried), r.status());
        }
        keep_alive.reset();
        created.Set(r.status());
        if (r.ok() && r->FindHeader(kRRefHeader) != nullptr) {
          value.SetValue(r->payload);
        } else {
          value.SetValue(std::nullopt);
        }
      },
      timeout, /*retry_timeouts=*/false);
  return state;
}

std::shared_ptr<RRefState> RRefContext::RemoteMethod(
    const std::shared_ptr<RRefState>& target, const std::string& method,
    Value::List args, std::string type_name, absl::Duration timeout) {
  Value::List payload{
      Value::Int(static_cast<int64_t>(target->rref_id().value())),
      Value::FromList(std::move(args))};
  // The target stays referenced until the owner replied (the method ran),
  // so its deletion cannot overtake the call.
  return RemoteImpl(target->owner().id, std::string(1, kMethodPrefix) + method,
                    std::move(payload), std::move(type_name), timeout, target);
}

std::shared_ptr<RRefState> RRefContext::Local(Value value,
                                              std::string type_name) {
  absl::StatusOr<GlobalId> id = NextId();
  if (!id.ok()) {
    return NewUser(WorkerInfo{"?", -1, ""}, GlobalId(), GlobalId(),
                   std::move(type_name), MakeErrorFuture<void>(id.status()));
  }
  MutexLock lock(&mu_);
  std::shared_ptr<Slot> slot = *owned_.SlotFor(*id, type_name);
  slot->started = true;
  slot->promise.SetValue(std::move(value));
  return NewOwnerHandle(*id, type_name, slot);
}

// ---------------------------------------------------------------------------
// Use

Future<Value> RRefContext::Fetch(const std::shared_ptr<RRefState>& state,
                                 absl::Duration timeout) {
  const std::string what = Describe(state->rref_id(), state->owner().name);
  if (state->is_owner()) {
    std::shared_ptr<Slot> slot;
    {
      MutexLock lock(&mu_);
      slot = owned_.Find(state->rref_id());
    }
    if (slot == nullptr) {
      return MakeErrorFuture<Value>(
          absl::InternalError(absl::StrCat(what, ": not registered")));
    }
    return slot->value.Then(
        [slot, what](const Result<Value>& v) -> absl::StatusOr<Value> {
          if (!v.ok()) return v.status();
          if (slot->object != nullptr) {
            return absl::FailedPreconditionError(absl::StrCat(
                what, " holds an object of class '", slot->cls->name,
                "'; use local_value() or its methods"));
          }
          return *v;
        });
  }
  if (IsPeerDown(state->owner().id)) {
    return MakeErrorFuture<Value>(absl::UnavailableError(
        absl::StrCat("to_here of ", what, ": ", DeadOwner(state->owner()))));
  }
  if (state->created().IsReady() && !state->created().status().ok()) {
    return MakeErrorFuture<Value>(
        Annotate(state->created().status(), absl::StrCat("to_here of ", what)));
  }
  if (state->creation_value_.has_value() &&
      !state->creation_value_->IsReady()) {
    // Issued before the creation reply: served by the value it carries.
    // A fetch sent later, from the reply's thread, still carries the
    // caller's context (a distributed autograd context records it).
    std::weak_ptr<RRefContext> weak = weak_from_this();
    return state->creation_value_->Then(
        [weak, state = state, timeout, context = rpc::CurrentContext()](
            const Result<std::optional<Value>>& v) mutable -> Future<Value> {
          // Released here, before the caller sees the value: the future
          // destroys this continuation only after waking the caller, and a
          // handle the caller dropped meanwhile would then die on this
          // thread, its deletion racing the caller's next request to the
          // owner (which would have carried it).
          std::shared_ptr<RRefState> held = std::move(state);
          if (v.ok() && v->has_value()) return MakeReadyFuture<Value>(**v);
          std::shared_ptr<RRefContext> ctx = weak.lock();
          if (ctx == nullptr) {
            return MakeErrorFuture<Value>(absl::UnavailableError(
                absl::StrCat("to_here of ", held->DebugString(),
                             ": the RRef context is gone")));
          }
          rpc::ScopedContext installed(context);
          return ctx->Fetch(held, timeout);  // Not carried, or failed.
        });
  }
  return FetchFromOwner(state, timeout);
}

Future<Value> RRefContext::FetchFromOwner(
    const std::shared_ptr<RRefState>& state, absl::Duration timeout) {
  const std::string what = Describe(state->rref_id(), state->owner().name);
  Message m = Control(kRRefFetch, state->rref_id(), state->fork_id(),
                      state->owner().id, -1, state->type_name());
  return SendCarrying(state->owner().id, std::move(m), timeout)
      .Then([what, timeout, state = state](
                const Result<Message>& r) mutable -> absl::StatusOr<Value> {
        // `state` is held until the reply, so a deletion cannot overtake the
        // fetch; released before the caller sees the result.
        state.reset();
        if (!r.ok()) {
          return Annotate(r.status(),
                          absl::StrCat("to_here of ", what, " (limit ",
                                       absl::FormatDuration(timeout), ")"));
        }
        return r->payload;
      });
}

absl::StatusOr<std::shared_ptr<RRefContext::Slot>> RRefContext::CreatedSlot(
    const RRefState& state, absl::Duration timeout, const char* kind) {
  const std::string what = Describe(state.rref_id(), state.owner().name);
  if (!state.is_owner()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "local_value() of ", what, ": only the owner has the ", kind));
  }
  std::shared_ptr<Slot> slot;
  {
    MutexLock lock(&mu_);
    slot = owned_.Find(state.rref_id());
  }
  if (slot == nullptr) {
    return absl::InternalError(absl::StrCat(what, ": not registered"));
  }
  if (!slot->value.Wait(timeout).ok()) {
    return absl::DeadlineExceededError(
        absl::StrCat("local_value() of ", what, ": creation not done after ",
                     absl::FormatDuration(timeout)));
  }
  if (!slot->value.status().ok()) return slot->value.status();
  return slot;
}

absl::StatusOr<Value> RRefContext::LocalValue(const RRefState& state,
                                              absl::Duration timeout) {
  ASSIGN_OR_RETURN(std::shared_ptr<Slot> slot,
                   CreatedSlot(state, timeout, "value"));
  if (slot->object != nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(Describe(state.rref_id(), state.owner().name),
                     " holds an object of class '", slot->cls->name, "'"));
  }
  return *slot->value.result();
}

absl::StatusOr<std::shared_ptr<void>> RRefContext::LocalObject(
    const RRefState& state, std::type_index type, absl::Duration timeout) {
  ASSIGN_OR_RETURN(std::shared_ptr<Slot> slot,
                   CreatedSlot(state, timeout, "object"));
  if (slot->object == nullptr || slot->cls->type != type) {
    return absl::FailedPreconditionError(
        absl::StrCat(Describe(state.rref_id(), state.owner().name),
                     " does not hold an object of the requested class"));
  }
  return slot->object;
}

Future<Value> RRefContext::CallMethod(const std::shared_ptr<RRefState>& state,
                                      const std::string& method,
                                      Value::List args,
                                      absl::Duration timeout) {
  const std::string what =
      absl::StrCat("method '", method, "' of ",
                   Describe(state->rref_id(), state->owner().name));
  if (IsPeerDown(state->owner().id)) {
    return MakeErrorFuture<Value>(
        absl::UnavailableError(absl::StrCat(what, ": ", DeadOwner(state->owner()))));
  }
  if (state->created().IsReady() && !state->created().status().ok()) {
    return MakeErrorFuture<Value>(Annotate(state->created().status(), what));
  }
  Message m = Control(kRRefMethod, state->rref_id(), state->fork_id(),
                      state->owner().id);
  m.function = method;
  m.payload = Value::FromList(std::move(args));
  return SendCarrying(state->owner().id, std::move(m), timeout)
      .Then([what, state = state](
                const Result<Message>& r) mutable -> absl::StatusOr<Value> {
        state.reset();  // As in Fetch.
        if (!r.ok()) return Annotate(r.status(), what);
        return r->payload;
      });
}

// ---------------------------------------------------------------------------
// Internal messages

void RRefContext::SendInternal(int to, Message message, Done done,
                               std::optional<absl::Duration> timeout,
                               bool retry_timeouts) {
  // Completions hold the context weakly: once it is gone they only run
  // `done` (the flusher may send while the destructor waits for it).
  sender_.Send(*this, weak_from_this(), to, std::move(message),
               std::move(done), timeout, retry_timeouts);
}

bool RRefContext::BeginMessage(int to) {
  MutexLock lock(&mu_);
  if (IsPeerDown(to)) return false;
  ++in_flight_;
  return true;
}

void RRefContext::CountAttempt(MessageType type) {
  MutexLock lock(&mu_);
  ++sent_[type];
}

void RRefContext::EndMessage() {
  MutexLock lock(&mu_);
  --in_flight_;
}

// ---------------------------------------------------------------------------
// Failures, shutdown, inspection

void RRefContext::DropPeer(int id) {
  std::vector<std::shared_ptr<Slot>> doomed;
  std::vector<PendingChild> released;
  MutexLock lock(&mu_);
  if (id == agent_->self().id) return;
  doomed = owned_.DropHolder(id);
  released = users_.DropChildrenTo(id);
  // `doomed` and `released` die after the lock is released.
}

void RRefContext::GaveUp(int to, const absl::Status& last) {
  // This worker itself is refused by the agent (InvalidArgument), as the
  // context's own copy ignored it before the agent held the table.
  agent_->ReportPeerDown(to, rpc::PeerDownReason::kRetriesExhausted, last)
      .IgnoreError();
}

bool RRefContext::IsPeerDown(int id) const { return agent_->IsPeerDown(id); }

absl::Status RRefContext::AwaitSettled(absl::Duration timeout) const {
  MutexLock lock(&mu_);
  auto settled = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return in_flight_ == 0 && users_.settled();
  };
  if (mu_.AwaitWithTimeout(absl::Condition(&settled), timeout)) {
    return absl::OkStatus();
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "worker '", agent_->self().name, "': RRef protocol not settled after ",
      absl::FormatDuration(timeout), ": ", in_flight_, " messages in flight, ",
      users_.num_children(), " pending children, ", users_.pending_deletes(),
      " deletions waiting for confirmation"));
}

absl::Status RRefContext::Shutdown(absl::Duration timeout) {
  return Stop(timeout, /*leave=*/false);
}

absl::Status RRefContext::Leave(absl::Duration timeout) {
  return Stop(timeout, /*leave=*/true);
}

absl::Status RRefContext::Stop(absl::Duration timeout, bool leave) {
  {
    MutexLock lock(&mu_);
    batcher_.FlushAll();  // Queued deletions go now.
  }
  // Children first (I2): parents are released only once their children are.
  absl::Status settled = AwaitSettled(timeout);
  std::vector<std::shared_ptr<RRefState>> users;
  {
    MutexLock lock(&mu_);
    for (auto& [fork, s] : users_.Live()) users.push_back(std::move(s));
  }
  for (const std::shared_ptr<RRefState>& s : users) {
    if (!s->released_.exchange(true)) {
      OnStateDropped(false, s->owner(), s->rref_id(), s->fork_id(),
                     s->created());
    }
  }
  users.clear();
  if (settled.ok()) settled = AwaitSettled(timeout);
  absl::Status stopped = leave ? agent_->Leave(timeout)
                               : agent_->Shutdown(/*graceful=*/true, timeout);
  OwnerTable::Drained dropped;
  {
    MutexLock lock(&mu_);
    dropped = owned_.Drain();
  }
  dropped.slots.clear();  // Outside the lock (I3).
  std::vector<std::string> leaked;
  for (const OwnedInfo& info : dropped.leaked) {
    leaked.push_back(info.DebugString());
  }
  RETURN_IF_ERROR(settled);
  RETURN_IF_ERROR(stopped);
  if (!leaked.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker '", agent_->self().name, "' ",
        leave ? "left the group while other workers held " : "leaked ",
        leaked.size(), " OwnerRRef(s): ", absl::StrJoin(leaked, "; ")));
  }
  return absl::OkStatus();
}

std::string RRefContext::WorkerName(int id) const {
  absl::StatusOr<WorkerInfo> w = agent_->GetWorkerInfo(id);
  return w.ok() ? w->name : absl::StrCat("#", id);
}

std::vector<rpc::InspectionRow> RRefContext::Inspect() const {
  struct User {
    std::shared_ptr<RRefState> state;
    int pending_forks = 0;
  };
  std::vector<OwnedInfo> owned = Owned();
  std::map<GlobalId, User> users;  // By fork id.
  std::vector<std::pair<GlobalId, PendingChild>> children;
  int in_flight = 0, pending_deletes = 0;
  {
    MutexLock lock(&mu_);
    for (auto& [fork, s] : users_.Live()) users[fork].state = std::move(s);
    children = users_.Children();
    in_flight = in_flight_;
    pending_deletes = users_.pending_deletes();
  }
  std::vector<rpc::InspectionRow> rows;
  rows.push_back(rpc::InspectionRow{
      "rref_context",
      {{"owned", absl::StrCat(owned.size())},
       {"users", absl::StrCat(users.size())},
       {"pending_forks", absl::StrCat(children.size())},
       {"messages_in_flight", absl::StrCat(in_flight)},
       {"deletions_waiting", absl::StrCat(pending_deletes)}}});
  for (const OwnedInfo& o : owned) {
    std::vector<std::string> holders;
    for (const auto& [fork, holder] : o.forks) {
      holders.push_back(absl::StrCat(WorkerName(holder), "/", fork.ToString()));
    }
    rows.push_back(
        rpc::InspectionRow{"owned_rref",
                           {{"id", o.rref_id.ToString()},
                            {"type", o.type_name},
                            {"holders", absl::StrJoin(holders, ",")},
                            {"local_handles", absl::StrCat(o.local_handles)},
                            {"created", o.created ? "true" : "false"}}});
  }
  for (const auto& [fork, child] : children) {
    auto it = users.find(child.parent->fork_id());
    if (it != users.end()) ++it->second.pending_forks;
    rows.push_back(
        rpc::InspectionRow{"pending_fork",
                           {{"id", child.parent->rref_id().ToString()},
                            {"fork", fork.ToString()},
                            {"to", WorkerName(child.to)},
                            {"owner", child.parent->owner().name}}});
  }
  for (const auto& [fork, u] : users) {
    const Future<void>& created = u.state->created();
    rows.push_back(
        rpc::InspectionRow{"user_rref",
                           {{"id", u.state->rref_id().ToString()},
                            {"fork", fork.ToString()},
                            {"type", u.state->type_name()},
                            {"owner", u.state->owner().name},
                            {"confirmed", !created.IsReady()      ? "pending"
                                          : created.status().ok() ? "true"
                                                                  : "failed"},
                            {"pending_forks", absl::StrCat(u.pending_forks)}}});
  }
  return rows;
}

std::vector<RRefContext::OwnedInfo> RRefContext::Owned() const {
  MutexLock lock(&mu_);
  return owned_.Owned();
}

size_t RRefContext::num_owned() const {
  MutexLock lock(&mu_);
  return owned_.size();
}

size_t RRefContext::num_users() const {
  MutexLock lock(&mu_);
  return users_.num_live();
}

size_t RRefContext::num_pending_children() const {
  MutexLock lock(&mu_);
  return users_.num_children();
}

int RRefContext::num_in_flight() const {
  MutexLock lock(&mu_);
  return in_flight_;
}

std::map<MessageType, int> RRefContext::messages_sent() const {
  MutexLock lock(&mu_);
  return sent_;
}

}  // namespace ferry::rref
