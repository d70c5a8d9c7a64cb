#include "ferry/rpc/testing/in_process.h"

#include <algorithm>
#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ferry/common/logging.h"

namespace ferry::rpc::testing {
namespace {

[[noreturn]] void Die(const std::string& why) {
  FERRY_LOG(ERROR) << "InProcessNetwork: " << why;
  std::abort();
}

}  // namespace

// ---------------------------------------------------------------------------
// InProcessAgent.

InProcessAgent::InProcessAgent(InProcessNetwork* network, Options options,
                               std::shared_ptr<FunctionRegistry> registry)
    : Agent(std::move(options), std::move(registry)), network_(network) {}

InProcessAgent::~InProcessAgent() {
  Shutdown(/*graceful=*/false).IgnoreError();
}

Future<Message> InProcessAgent::Transmit(const WorkerInfo& to, Message request,
                                         absl::Duration timeout) {
  return network_->Transmit(self().id, to, std::move(request), timeout);
}

absl::Status InProcessAgent::Shutdown(bool graceful, absl::Duration timeout) {
  MutexLock serial(&shutdown_mu_);
  if (shut_down_) return absl::OkStatus();
  const absl::Time deadline = absl::Now() + timeout;
  absl::Status result;
  if (graceful) {
    result = network_->AwaitNoCallsFrom(self().id, deadline);
    if (result.ok()) result = network_->Barrier(self().id, deadline);
  }
  network_->MarkStopped(self().id);
  network_->CancelCallsFrom(self().id);
  StopExecutor(/*drain=*/graceful);
  shut_down_ = true;
  return result;
}

absl::Status InProcessAgent::Leave(absl::Duration timeout) {
  MutexLock serial(&shutdown_mu_);
  if (shut_down_) return absl::OkStatus();
  const absl::Time deadline = absl::Now() + timeout;
  absl::Status result = network_->AwaitNoCallsFrom(self().id, deadline);
  if (result.ok()) {
    for (const auto& [peer, why] : Announce(MembershipChange::kLeft, self(),
                                            GetWorkerInfos(), deadline)) {
      FERRY_LOG(WARNING) << "worker '" << self().name << "' leaving: worker '"
                         << peer.name << "' was not told: " << why;
    }
  }
  network_->MarkStopped(self().id, /*left=*/true);
  network_->CancelCallsFrom(self().id);
  BeginStop("leaving the group");
  StopExecutor(/*drain=*/true);
  shut_down_ = true;
  return result;
}

// ---------------------------------------------------------------------------
// Queue summaries.

std::string QueuedMessage::DebugString() const {
  std::string s =
      absl::StrCat("#", seq, " ", from, "->", to, " ",
                   is_reply ? "reply to " : "", MessageTypeName(type));
  if (!function.empty()) absl::StrAppend(&s, " '", function, "'");
  if (!error.ok()) absl::StrAppend(&s, " error: ", error.ToString());
  return s;
}

MessagePredicate Matching(const std::string& from, const std::string& to) {
  return [from, to](const QueuedMessage& m) {
    return !m.is_reply && (from.empty() || m.from == from) &&
           (to.empty() || m.to == to);
  };
}

MessagePredicate RepliesTo(const std::string& to) {
  return [to](const QueuedMessage& m) { return m.is_reply && m.to == to; };
}

// ---------------------------------------------------------------------------
// InProcessNetwork.

InProcessNetwork::InProcessNetwork(const std::vector<std::string>& names,
                                   Options options)
    : options_(std::move(options)), auto_deliver_(options_.auto_deliver) {
  if (names.size() > static_cast<size_t>(kMaxWorkers)) {
    Die(absl::StrCat(names.size(), " workers; at most ", kMaxWorkers));
  }
  agents_.resize(kMaxWorkers);
  std::vector<WorkerInfo> workers;
  MutexLock lock(&mu_);
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i].empty() || ids_.count(names[i]) != 0) {
      Die(absl::StrCat("worker names must be unique and non-empty: '", names[i],
                       "'"));
    }
    ids_[names[i]] = static_cast<int>(i);
    workers.push_back(
        WorkerInfo{names[i], static_cast<int>(i), "inproc:" + names[i]});
  }
  for (const WorkerInfo& w : workers) {
    agents_[w.id].reset(
        new InProcessAgent(this, options_.agent, options_.registry));
    agents_[w.id]->SetGroup(w, workers);
  }
  size_.store(static_cast<int>(workers.size()), std::memory_order_release);
  timer_ = std::thread([this] { TimerLoop(); });
}

InProcessNetwork::~InProcessNetwork() {
  for (int i = 0; i < size(); ++i) {
    agents_[i]->Shutdown(/*graceful=*/false).IgnoreError();
  }
  {
    MutexLock lock(&mu_);
    stop_timer_ = true;
    queue_.clear();
  }
  timer_.join();
  agents_.clear();
}

int InProcessNetwork::IdOf(const std::string& name) const {
  MutexLock lock(&mu_);
  auto it = ids_.find(name);
  return it == ids_.end() ? -1 : it->second;
}

InProcessAgent& InProcessNetwork::agent(const std::string& name) {
  const int id = IdOf(name);
  if (id < 0) Die(absl::StrCat("no worker named '", name, "'"));
  return *agents_[id];
}

absl::StatusOr<InProcessAgent*> InProcessNetwork::Join(const std::string& name,
                                                       absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  InProcessAgent* joiner = nullptr;
  std::vector<WorkerInfo> members;
  {
    MutexLock lock(&mu_);
    if (name.empty()) {
      return absl::InvalidArgumentError("cannot join: empty worker name");
    }
    auto it = ids_.find(name);
    if (it != ids_.end() && left_.count(it->second) == 0) {
      return absl::AlreadyExistsError(
          absl::StrCat("cannot join as '", name, "': worker id ", it->second,
                       " has that name and has not left"));
    }
    if (BarrierCompleteLocked()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot join as '", name,
          "': the group is shutting down (every worker reached its shutdown "
          "barrier); only a running group can be joined"));
    }
    const int id = size();
    if (id >= kMaxWorkers) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "cannot join as '", name, "': all ", kMaxWorkers, " ids are used"));
    }
    for (int i = 0; i < id; ++i) {
      if (left_.count(i) == 0) members.push_back(agents_[i]->self());
    }
    const WorkerInfo self{name, id, "inproc:" + name};
    members.push_back(self);
    agents_[id].reset(
        new InProcessAgent(this, options_.agent, options_.registry));
    agents_[id]->SetGroup(self, members);
    ids_[name] = id;
    joiner = agents_[id].get();
    size_.store(id + 1, std::memory_order_release);
    // Dead and shut-down workers are not told (they stay in its table).
    members.erase(std::remove_if(members.begin(), members.end(),
                                 [this](const WorkerInfo& w) {
                                   mu_.AssertHeld();
                                   return killed_.count(w.id) > 0 ||
                                          stopped_.count(w.id) > 0;
                                 }),
                  members.end());
  }
  for (const auto& [peer, why] : joiner->Announce(
           MembershipChange::kJoined, joiner->self(), members, deadline)) {
    FERRY_LOG(WARNING) << "worker '" << name << "' joining: worker '"
                       << peer.name << "' was not told: " << why;
  }
  return joiner;
}

InProcessAgent& InProcessNetwork::agent(int id) {
  if (id < 0 || id >= size()) Die(absl::StrCat("no worker with id ", id));
  return *agents_[id];
}

std::vector<QueuedMessage> InProcessNetwork::Queued() const {
  MutexLock lock(&mu_);
  std::vector<QueuedMessage> out;
  for (const auto& [seq, e] : queue_) out.push_back(e.summary);
  return out;
}

absl::StatusOr<QueuedMessage> InProcessNetwork::AwaitQueued(
    const MessagePredicate& match, absl::Duration timeout) const {
  MutexLock lock(&mu_);
  const QueuedMessage* found = nullptr;
  auto has = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const auto& [seq, e] : queue_) {
      if (match(e.summary)) {
        found = &e.summary;
        return true;
      }
    }
    return false;
  };
  if (!mu_.AwaitWithTimeout(absl::Condition(&has), timeout)) {
    std::vector<std::string> queued;
    for (const auto& [seq, e] : queue_)
      queued.push_back(e.summary.DebugString());
    return absl::DeadlineExceededError(absl::StrCat(
        "no matching message queued after ", absl::FormatDuration(timeout),
        " (queued: ", absl::StrJoin(queued, "; "), ")"));
  }
  return *found;
}

void InProcessNetwork::SetAutoDeliver(bool on) {
  {
    MutexLock lock(&mu_);
    auto_deliver_ = on;
  }
  if (on) DeliverAll();
}

void InProcessNetwork::Hold(MessagePredicate hold) {
  std::vector<uint64_t> release;
  {
    MutexLock lock(&mu_);
    hold_ = std::move(hold);
    if (hold_ == nullptr && auto_deliver_) {
      for (const auto& [seq, e] : queue_) release.push_back(seq);
    }
  }
  for (uint64_t seq : release) Deliver(seq).IgnoreError();
}

int InProcessNetwork::ignored_replies() const {
  MutexLock lock(&mu_);
  return ignored_replies_;
}

absl::Status InProcessNetwork::Deliver(uint64_t seq) {
  Envelope e;
  {
    MutexLock lock(&mu_);
    auto it = queue_.find(seq);
    if (it == queue_.end()) {
      return absl::NotFoundError(
          absl::StrCat("message #", seq, " is not queued"));
    }
    e = std::move(it->second);
    queue_.erase(it);
  }
  DeliverEnvelope(std::move(e));
  return absl::OkStatus();
}

absl::Status InProcessNetwork::Drop(uint64_t seq) {
  MutexLock lock(&mu_);
  if (queue_.erase(seq) == 0) {
    return absl::NotFoundError(
        absl::StrCat("message #", seq, " is not queued"));
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> InProcessNetwork::Duplicate(uint64_t seq) {
  Envelope copy;
  {
    MutexLock lock(&mu_);
    auto it = queue_.find(seq);
    if (it == queue_.end()) {
      return absl::NotFoundError(
          absl::StrCat("message #", seq, " is not queued"));
    }
    copy = it->second;
    copy.summary.seq = next_seq_++;
    if (!auto_deliver_) {
      const uint64_t s = copy.summary.seq;
      queue_.emplace(s, std::move(copy));
      return s;
    }
  }
  const uint64_t s = copy.summary.seq;
  DeliverEnvelope(std::move(copy));
  return s;
}

int InProcessNetwork::DeliverAll(int max_messages) {
  int n = 0;
  while (n < max_messages) {
    uint64_t seq;
    {
      MutexLock lock(&mu_);
      if (queue_.empty()) break;
      seq = queue_.begin()->first;
    }
    if (Deliver(seq).ok()) ++n;
  }
  return n;
}

absl::Status InProcessNetwork::Kill(const std::string& worker) {
  const int id = IdOf(worker);
  if (id < 0) {
    return absl::NotFoundError(absl::StrCat("no worker named '", worker, "'"));
  }
  std::vector<std::pair<Promise<Message>, absl::Status>> failed;
  std::vector<int> survivors;
  {
    MutexLock lock(&mu_);
    killed_.insert(id);
    for (auto q = queue_.begin(); q != queue_.end();) {
      if (q->second.from_id == id || q->second.to_id == id) {
        q = queue_.erase(q);
      } else {
        ++q;
      }
    }
    failed = TakeCalls([&](const CallKey& key, const PendingCall& call) {
      if (call.callee != id && key.first != id) return absl::OkStatus();
      return absl::UnavailableError(absl::StrCat(
          call.target, " is unavailable: worker '", worker, "' died"));
    });
    ++generation_;
    for (int i = 0; i < size(); ++i) {
      if (killed_.count(i) == 0) survivors.push_back(i);
    }
  }
  for (auto& [p, s] : failed) p.SetError(s);
  const absl::Status died = absl::UnavailableError(
      absl::StrCat("worker '", worker, "' (rank ", id, ") was killed"));
  for (int i : survivors) agents_[i]->PeerDied(id, died);
  return absl::OkStatus();
}

bool InProcessNetwork::IsKilled(const std::string& worker) const {
  const int id = IdOf(worker);
  MutexLock lock(&mu_);
  return id >= 0 && killed_.count(id) > 0;
}

std::vector<std::pair<Promise<Message>, absl::Status>>
InProcessNetwork::TakeCalls(
    const std::function<absl::Status(const CallKey&, const PendingCall&)>&
        error_for) {
  std::vector<std::pair<Promise<Message>, absl::Status>> out;
  for (auto c = calls_.begin(); c != calls_.end();) {
    absl::Status s = error_for(c->first, c->second);
    if (s.ok()) {
      ++c;
      continue;
    }
    out.emplace_back(c->second.promise, std::move(s));
    c = calls_.erase(c);
  }
  return out;
}

// ---------------------------------------------------------------------------
// Messages.

Future<Message> InProcessNetwork::Transmit(int from, const WorkerInfo& to,
                                           Message request,
                                           absl::Duration timeout) {
  const std::string target = DescribeTarget(to.name, request);
  const CallKey key{from, request.id.value()};
  Envelope e;
  e.summary.from = agents_[from]->self().name;
  e.summary.to = to.name;
  e.summary.type = request.type;
  e.summary.function = request.function;
  e.summary.id = request.id;
  e.from_id = from;
  e.to_id = to.id;
  Promise<Message> promise;
  Future<Message> out = promise.GetFuture();
  {
    MutexLock lock(&mu_);
    if (killed_.count(from) || stopped_.count(from)) {
      return MakeErrorFuture<Message>(absl::UnavailableError(
          absl::StrCat("worker '", e.summary.from, "' is ", StateOf(from),
                       "; cannot reach ", target)));
    }
    if (killed_.count(to.id) || stopped_.count(to.id)) {
      return MakeErrorFuture<Message>(absl::UnavailableError(
          absl::StrCat(target, " at ", to.address, " is unavailable: worker '",
                       to.name, "' is ", StateOf(to.id))));
    }
    calls_.emplace(
        key, PendingCall{promise, to.id, target, timeout, request.deadline});
    ++generation_;
  }
  e.body = std::move(request);
  Post(std::move(e));
  return out;
}

void InProcessNetwork::Post(Envelope e) {
  {
    MutexLock lock(&mu_);
    if (killed_.count(e.from_id) || killed_.count(e.to_id)) return;
    e.summary.seq = next_seq_++;
    if (!auto_deliver_ || (hold_ != nullptr && hold_(e.summary))) {
      const uint64_t seq = e.summary.seq;
      queue_.emplace(seq, std::move(e));
      return;
    }
  }
  DeliverEnvelope(std::move(e));
}

void InProcessNetwork::DeliverEnvelope(Envelope e) {
  if (e.summary.is_reply) {
    CompleteCall({e.to_id, e.summary.id.value()}, std::move(e.body));
    return;
  }
  {
    MutexLock lock(&mu_);
    if (killed_.count(e.to_id) || killed_.count(e.from_id)) return;
    if (stopped_.count(e.to_id)) {
      // Answered like a refused connection.
      e.body = absl::UnavailableError(
          absl::StrCat("worker '", e.summary.to, "' is ", StateOf(e.to_id)));
    }
  }
  if (!e.body.ok()) {
    CompleteCall({e.from_id, e.summary.id.value()}, e.body.status());
    return;
  }
  Envelope reply;
  reply.summary = e.summary;
  reply.summary.is_reply = true;
  reply.summary.from = e.summary.to;
  reply.summary.to = e.summary.from;
  reply.from_id = e.to_id;
  reply.to_id = e.from_id;
  agents_[e.to_id]
      ->Receive(*std::move(e.body))
      .OnComplete(
          [this, reply = std::move(reply)](const Result<Message>& r) mutable {
            reply.body = r;
            reply.summary.error = r.status();
            Post(std::move(reply));
          });
}

void InProcessNetwork::CompleteCall(CallKey key, Result<Message> result) {
  Promise<Message> promise;
  {
    MutexLock lock(&mu_);
    auto it = calls_.find(key);
    if (it == calls_.end()) {
      ++ignored_replies_;
      return;
    }
    promise = it->second.promise;
    calls_.erase(it);
  }
  promise.Set(std::move(result));
}

// ---------------------------------------------------------------------------
// Time and shutdown.

void InProcessNetwork::TimerLoop() {
  MutexLock lock(&mu_);
  while (!stop_timer_) {
    absl::Time next = absl::InfiniteFuture();
    for (const auto& [key, call] : calls_) next = std::min(next, call.deadline);
    const uint64_t seen = generation_;
    auto changed = [this, seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stop_timer_ || generation_ != seen;
    };
    if (mu_.AwaitWithDeadline(absl::Condition(&changed), next)) continue;
    const absl::Time now = absl::Now();
    auto expired = TakeCalls([&](const CallKey& key, const PendingCall& call) {
      if (call.deadline > now) return absl::OkStatus();
      return absl::DeadlineExceededError(
          absl::StrCat("call to ", call.target, " timed out after ",
                       absl::FormatDuration(call.timeout), " (request ",
                       GlobalId::FromValue(key.second).ToString(), ")"));
    });
    mu_.Unlock();
    for (auto& [p, s] : expired) p.SetError(s);
    mu_.Lock();
  }
}

absl::Status InProcessNetwork::AwaitNoCallsFrom(int from, absl::Time deadline) {
  MutexLock lock(&mu_);
  auto idle = [this, from]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = calls_.lower_bound({from, 0});
    return it == calls_.end() || it->first.first != from;
  };
  if (!mu_.AwaitWithDeadline(absl::Condition(&idle), deadline)) {
    return absl::DeadlineExceededError(
        absl::StrCat("worker '", agents_[from]->self().name,
                     "' shutdown: outgoing calls still running"));
  }
  return absl::OkStatus();
}

bool InProcessNetwork::BarrierCompleteLocked() const {
  if (at_barrier_.empty()) return false;
  for (int i = 0; i < size(); ++i) {
    if (!at_barrier_.count(i) && !killed_.count(i) && !left_.count(i)) {
      return false;
    }
  }
  return true;
}

int InProcessNetwork::ArrivedAtShutdownBarrier() const {
  MutexLock lock(&mu_);
  return static_cast<int>(at_barrier_.size());
}

absl::Status InProcessNetwork::Barrier(int id, absl::Time deadline) {
  MutexLock lock(&mu_);
  at_barrier_.insert(id);
  auto all = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return BarrierCompleteLocked();
  };
  if (!mu_.AwaitWithDeadline(absl::Condition(&all), deadline)) {
    return absl::DeadlineExceededError(
        absl::StrCat("worker '", agents_[id]->self().name,
                     "' shutdown barrier: not every worker shut down"));
  }
  return absl::OkStatus();
}

void InProcessNetwork::MarkStopped(int id, bool left) {
  MutexLock lock(&mu_);
  stopped_.insert(id);
  if (left) left_.insert(id);
}

std::string InProcessNetwork::StateOf(int id) const {
  if (killed_.count(id)) return "dead";
  return left_.count(id) ? "gone (it left the group)" : "shut down";
}

void InProcessNetwork::CancelCallsFrom(int from) {
  std::vector<std::pair<Promise<Message>, absl::Status>> cancelled;
  {
    MutexLock lock(&mu_);
    const std::string me = agents_[from]->self().name;
    cancelled = TakeCalls([&](const CallKey& key, const PendingCall& call) {
      if (key.first != from) return absl::OkStatus();
      return absl::CancelledError(absl::StrCat("call to ", call.target,
                                               " cancelled (worker '", me,
                                               "' shutting down)"));
    });
    ++generation_;
  }
  for (auto& [p, s] : cancelled) p.SetError(s);
}

}  // namespace ferry::rpc::testing
