// The Agent's member table and membership notices (rpc/agent.h, "Membership").
#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ferry/common/logging.h"
#include "ferry/common/status.h"
#include "ferry/rpc/agent.h"

namespace ferry::rpc {

// One immutable version of the member table.
struct Agent::Group {
  struct Entry {
    WorkerInfo info;
    bool left = false;
  };
  // Indexed by id; nullopt for ids never seen.
  std::vector<std::optional<Entry>> by_id;
  std::map<std::string, int> present_by_name;
  // Departed workers by name (the latest id), for error texts.
  std::map<std::string, int> departed_by_name;
  std::vector<WorkerInfo> present;  // By id.
  uint64_t version = 0;

  const Entry* Find(int id) const {
    if (id < 0 || id >= static_cast<int>(by_id.size()) || !by_id[id]) {
      return nullptr;
    }
    return &*by_id[id];
  }
  Entry& Slot(int id) {
    if (id >= static_cast<int>(by_id.size())) by_id.resize(id + 1);
    if (!by_id[id]) by_id[id] = Entry{WorkerInfo{"", id, ""}, false};
    return *by_id[id];
  }
  void Rebuild() {
    present.clear();
    present_by_name.clear();
    for (const std::optional<Entry>& e : by_id) {
      if (!e || e->left) continue;
      present.push_back(e->info);
      present_by_name[e->info.name] = e->info.id;
    }
  }
};

namespace {

absl::Status LeftError(const WorkerInfo& w) {
  return absl::UnavailableError(
      absl::StrCat("worker '", w.name, "' (id ", w.id, ") left the group"));
}

}  // namespace

std::shared_ptr<const Agent::Group> Agent::group() const {
  MutexLock lock(&group_mu_);
  // Before SetWorkers (rare: early requests, failed starts): no members.
  return group_ != nullptr ? group_ : std::make_shared<const Group>();
}

bool Agent::EditGroup(absl::FunctionRef<bool(Group&)> edit) {
  MutexLock lock(&group_mu_);
  auto copy =
      group_ ? std::make_shared<Group>(*group_) : std::make_shared<Group>();
  if (!edit(*copy)) return false;
  ++copy->version;
  copy->Rebuild();
  group_ = std::move(copy);
  return true;
}

void Agent::SetWorkers(std::vector<WorkerInfo> workers) {
  auto g = std::make_shared<Group>();
  for (WorkerInfo& w : workers) g->Slot(w.id).info = std::move(w);
  g->Rebuild();
  if (const Group::Entry* me = g->Find(self_.id)) {
    self_.address = me->info.address;
  }
  {
    MutexLock lock(&group_mu_);
    group_ = std::move(g);
  }
  MutexLock lock(&mu_);  // Wakes the requests waiting in AwaitGroup.
  group_known_ = true;
  has_group_.store(true, std::memory_order_release);
}

int Agent::world_size() const {
  return static_cast<int>(group()->present.size());
}

std::vector<WorkerInfo> Agent::GetWorkerInfos() const {
  return group()->present;
}

bool Agent::HasLeft(int id) const {
  const Group::Entry* e = group()->Find(id);
  return e != nullptr && e->left;
}

uint64_t Agent::membership_version() const { return group()->version; }

absl::StatusOr<WorkerInfo> Agent::GetWorkerInfo(const WorkerRef& ref) const {
  std::shared_ptr<const Group> g = group();
  if (const int* id = std::get_if<int>(&ref.ref())) {
    const Group::Entry* e = g->Find(*id);
    if (e == nullptr) {
      return absl::NotFoundError(absl::StrCat(
          "no worker with id ", *id, " (world size ", g->present.size(), ")"));
    }
    if (e->left) return LeftError(e->info);
    return e->info;
  }
  const std::string& name = std::get<std::string>(ref.ref());
  auto it = g->present_by_name.find(name);
  if (it != g->present_by_name.end()) return g->Find(it->second)->info;
  auto gone = g->departed_by_name.find(name);
  if (gone != g->departed_by_name.end()) {
    return LeftError(g->Find(gone->second)->info);
  }
  std::vector<std::string> known;
  for (const WorkerInfo& w : g->present) known.push_back(w.name);
  return absl::NotFoundError(
      absl::StrCat("no worker named '", name,
                   "' (known: ", absl::StrJoin(known, ", "), ")"));
}

WorkerInfo Agent::PeerInfo(int id, const std::string& name) const {
  if (has_group_.load(std::memory_order_acquire)) {
    std::shared_ptr<const Group> g = group();
    const Group::Entry* e = g->Find(id);
    if (e != nullptr && e->info.name == name) return e->info;
  }
  return WorkerInfo{name, id, ""};
}

WorkerInfo Agent::KnownWorker(int id) const {
  std::shared_ptr<const Group> g = group();
  const Group::Entry* e = g->Find(id);
  return e != nullptr ? e->info : WorkerInfo{"", id, ""};
}

// ---------------------------------------------------------------------------
// Changes.

void Agent::AddMembershipListener(MembershipListener listener) {
  MutexLock lock(&mu_);
  membership_listeners_.push_back(std::move(listener));
}

void Agent::TellMembershipListeners(const WorkerInfo& worker,
                                    MembershipChange change) {
  std::vector<MembershipListener> listeners;
  {
    MutexLock lock(&mu_);
    listeners = membership_listeners_;
  }
  FERRY_LOG(INFO) << "worker '" << self_.name << "': worker '" << worker.name
                  << "' (id " << worker.id << ") "
                  << (change == MembershipChange::kJoined ? "joined" : "left");
  for (const MembershipListener& l : listeners) l(worker, change);
}

absl::StatusOr<WorkerInfo> Agent::WaitForWorker(const std::string& name,
                                                absl::Duration timeout,
                                                int stale_id) const {
  std::optional<WorkerInfo> found;
  bool stopped = false;
  // Re-checked whenever mu_ is released: every table change tells the
  // listeners under mu_, and the peer-state table is written under it.
  auto back = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (stopping_) {
      stopped = true;
      return true;
    }
    std::shared_ptr<const Group> g = group();
    auto it = g->present_by_name.find(name);
    if (it == g->present_by_name.end() || it->second == stale_id ||
        IsPeerDownLocked(it->second, static_cast<PeerDownReasons>(
                                         PeerDownReason::kTransportFailure))) {
      return false;
    }
    found = g->Find(it->second)->info;
    return true;
  };
  MutexLock lock(&mu_);
  if (!mu_.AwaitWithTimeout(absl::Condition(&back), timeout)) {
    return absl::DeadlineExceededError(absl::StrCat(
        "worker '", self_.name, "': no live worker named '", name,
        "' came back within ", absl::FormatDuration(timeout),
        stale_id >= 0 ? absl::StrCat(" (id ", stale_id, " failed)") : ""));
  }
  if (stopped) {
    return absl::UnavailableError(absl::StrCat(
        "worker '", self_.name, "' is ", stop_state_,
        ": stopped waiting for worker '", name, "'"));
  }
  return *found;
}

bool Agent::AddMember(const WorkerInfo& worker) {
  if (worker.id < 0 || worker.name.empty()) return false;
  std::optional<WorkerInfo> replaced;
  const bool added = EditGroup([&](Group& g) {
    if (g.Find(worker.id) != nullptr) return false;  // Known or departed.
    auto same = g.present_by_name.find(worker.name);
    if (same != g.present_by_name.end()) {
      // The group let a new worker take the name: the old one left (its own
      // notice is late).
      Group::Entry& old = g.Slot(same->second);
      old.left = true;
      g.departed_by_name[old.info.name] = old.info.id;
      replaced = old.info;
    }
    g.Slot(worker.id).info = worker;
    return true;
  });
  if (!added) return false;
  if (replaced) {
    TellMembershipListeners(*replaced, MembershipChange::kLeft);
    RecordDeparture(*replaced);
  }
  TellMembershipListeners(worker, MembershipChange::kJoined);
  return true;
}

bool Agent::RemoveMember(const WorkerInfo& worker) {
  if (worker.id < 0 || worker.id == self_.id) return false;
  WorkerInfo gone = worker;
  const bool removed = EditGroup([&](Group& g) {
    Group::Entry& e = g.Slot(worker.id);
    if (e.left) return false;
    if (e.info.name.empty()) e.info = worker;  // Its join notice is late.
    e.left = true;
    gone = e.info;
    g.departed_by_name[e.info.name] = e.info.id;
    return true;
  });
  if (removed) {
    TellMembershipListeners(gone, MembershipChange::kLeft);
    RecordDeparture(gone);
  }
  return removed;
}

void Agent::RecordDeparture(const WorkerInfo& worker) {
  std::optional<NewPeerDown> news;
  {
    MutexLock lock(&mu_);
    news = RecordPeerDown(worker, PeerDownReason::kDeparted,
                          LeftError(worker));
  }
  if (news) TellPeerDownListeners(*news);
}

// ---------------------------------------------------------------------------
// Notices: a MEMBERSHIP request whose payload is [change, id, name, address].

std::vector<std::pair<WorkerInfo, absl::Status>> Agent::Announce(
    MembershipChange change, const WorkerInfo& subject,
    const std::vector<WorkerInfo>& targets, absl::Time deadline) {
  std::vector<std::pair<WorkerInfo, Future<Message>>> sent;
  for (const WorkerInfo& t : targets) {
    // A peer reported failed cannot take a notice: trying costs a failed
    // connect and a warning per notice, for every later join and leave.
    if (t.id == self_.id || IsPeerFailed(t.id)) continue;
    Message m;
    m.type = MessageType::kMembership;
    m.payload = Value::FromList(
        {Value::Int(static_cast<int64_t>(change)), Value::Int(subject.id),
         Value::String(subject.name), Value::String(subject.address)});
    sent.emplace_back(
        t, Send(t.id, std::move(m),
                std::max(deadline - absl::Now(), absl::Milliseconds(1))));
  }
  std::vector<std::pair<WorkerInfo, absl::Status>> failed;
  for (auto& [t, f] : sent) {
    // Send's own deadline bounds the wait; the margin covers its timer.
    Result<Message> r = f.Get(deadline - absl::Now() + absl::Seconds(5));
    if (!r.ok()) failed.emplace_back(t, r.status());
  }
  return failed;
}

Future<Message> Agent::ServeMembership(Message request) {
  const Value::List* f = request.payload.if_list();
  const int64_t* change = f && f->size() == 4 ? (*f)[0].if_int() : nullptr;
  const int64_t* id = change ? (*f)[1].if_int() : nullptr;
  const std::string* name = id ? (*f)[2].if_string() : nullptr;
  const std::string* address = name ? (*f)[3].if_string() : nullptr;
  if (address == nullptr || *id < 0 || *id > 0xffff ||
      (*change != static_cast<int64_t>(MembershipChange::kJoined) &&
       *change != static_cast<int64_t>(MembershipChange::kLeft))) {
    return MakeErrorFuture<Message>(absl::InvalidArgumentError(absl::StrCat(
        "worker '", self_.name, "': malformed MEMBERSHIP notice from '",
        request.caller_name, "'")));
  }
  const WorkerInfo subject{*name, static_cast<int>(*id), *address};
  if (*change == static_cast<int64_t>(MembershipChange::kJoined)) {
    // A worker that began to stop takes no joiner: it says so at once.
    std::optional<std::string> state;
    {
      MutexLock lock(&mu_);
      if (stopping_) state = stop_state_;
    }
    if (state) {
      return MakeErrorFuture<Message>(absl::FailedPreconditionError(
          absl::StrCat("worker '", self_.name, "' (id ", self_.id, ") is ",
                       *state, ": it does not take joiner '", subject.name,
                       "' (id ", subject.id, ")")));
    }
    AddMember(subject);
  } else {
    RemoveMember(subject);
  }
  return MakeReadyFuture<Message>(Message());
}

absl::Status Agent::Leave(absl::Duration) {
  return absl::UnimplementedError(absl::StrCat(
      "worker '", self_.name, "': this agent cannot leave its group"));
}

}  // namespace ferry::rpc
