// GrpcAgent::Join and Leave: the gRPC side of dynamic membership
// (rpc/agent.h; the store log is rpc/grpc/membership.h).
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ferry/common/logging.h"
#include "ferry/common/status.h"
#include "ferry/rpc/grpc/agent.h"
#include "ferry/rpc/grpc/membership.h"
#include "ferry/rpc/grpc/rendezvous.h"

namespace ferry::rpc {
namespace {

void WarnUntold(
    const std::string& who,
    const std::vector<std::pair<WorkerInfo, absl::Status>>& failed) {
  for (const auto& [peer, why] : failed) {
    FERRY_LOG(WARNING) << who << ": worker '" << peer.name << "' (id "
                       << peer.id << ") was not told: " << why;
  }
}

// FailedPrecondition once the group's shutdown barrier completed: `who`
// joins a group that is shutting down. `untold`: the members that did not
// take the joiner, and why.
absl::Status RefuseIfShuttingDown(
    std::shared_ptr<Store> store, const std::string& who,
    const std::vector<std::pair<WorkerInfo, absl::Status>>& untold = {}) {
  absl::StatusOr<bool> done = grpc_agent::ShutdownBarrierDone(std::move(store));
  if (!done.ok()) return Annotate(done.status(), who);
  if (!*done) return absl::OkStatus();
  std::string why = absl::StrCat(
      who,
      ": the group is shutting down (every static worker reached its shutdown "
      "barrier); only a running group can be joined");
  for (const auto& [peer, status] : untold) {
    absl::StrAppend(&why, "; worker '", peer.name, "' (id ", peer.id,
                    ") did not take it: ", status.ToString());
  }
  return absl::FailedPreconditionError(why);
}

}  // namespace

absl::Status GrpcAgent::AnnounceJoin(const std::vector<WorkerInfo>& members,
                                     absl::Time deadline,
                                     const std::string& who) {
  std::vector<std::pair<WorkerInfo, absl::Status>> untold =
      Announce(MembershipChange::kJoined, self(), members, deadline);
  // The barrier may have completed while the members were told.
  absl::Status open = RefuseIfShuttingDown(store_, who, untold);
  if (open.ok()) {
    WarnUntold(who, untold);
    return open;
  }
  // The members that took the joiner hear that it is gone (bounded: they
  // answered just now).
  std::vector<WorkerInfo> told;
  for (const WorkerInfo& w : members) {
    bool refused = false;
    for (const auto& [peer, why] : untold) refused |= peer.id == w.id;
    if (!refused) told.push_back(w);
  }
  Announce(MembershipChange::kLeft, self(), told,
           std::min(deadline, absl::Now() + grpc_options_.peer_probe_timeout));
  return open;
}

absl::StatusOr<std::unique_ptr<GrpcAgent>> GrpcAgent::Join(
    std::string name, std::shared_ptr<Store> store, GrpcAgentOptions options,
    std::shared_ptr<FunctionRegistry> registry) {
  RETURN_IF_ERROR(CheckArguments(name, store.get(), options));
  const absl::Duration timeout = options.join_timeout;
  const absl::Time deadline = absl::Now() + timeout;
  ASSIGN_OR_RETURN(grpc_agent::JoinerId id,
                   grpc_agent::ReserveJoinerId(store, name, timeout));
  const std::string who =
      absl::StrCat("worker '", name, "' (id ", id.id, ") joining");
  RETURN_IF_ERROR(RefuseIfShuttingDown(store, who));
  std::unique_ptr<GrpcAgent> agent(
      new GrpcAgent(store, std::move(options), std::move(registry)));
  agent->static_size_ = id.static_size;
  ASSIGN_OR_RETURN(std::string address,
                   agent->Serve(WorkerInfo{name, id.id, ""}));
  const WorkerInfo self{name, id.id, address};
  // Before the join event: a member that hears of it finds the record.
  absl::Status published = agent->same_host_->Publish(*store, id.id);
  if (!published.ok()) {
    agent->Shutdown(/*graceful=*/false).IgnoreError();
    return Annotate(published, who);
  }
  absl::StatusOr<int64_t> slot =
      grpc_agent::AppendMembershipEvent(store, MembershipChange::kJoined, self);
  // After its join event, a failed joiner records its departure too.
  auto fail = [&](absl::Status why) {
    if (slot.ok()) {
      grpc_agent::AppendMembershipEvent(store, MembershipChange::kLeft, self)
          .IgnoreError();
    }
    agent->Shutdown(/*graceful=*/false).IgnoreError();
    return why;
  };
  if (!slot.ok()) return fail(Annotate(slot.status(), who));
  absl::StatusOr<std::vector<WorkerInfo>> members = grpc_agent::ReadMembers(
      store, id.static_size, *slot, who, deadline - absl::Now());
  if (!members.ok()) return fail(members.status());
  // A present member holding the name: alive, the join is refused; dead
  // (its health probe fails at the transport), it is evicted (a leave event
  // on its behalf) and this joiner records its join again after that event,
  // so every reader of the log applies it. Bounded: another joiner may take
  // the freed name first.
  constexpr int kMaxEvictions = 3;
  for (int attempt = 0;; ++attempt) {
    const WorkerInfo* holder = nullptr;
    for (const WorkerInfo& w : *members) {
      if (w.name == name) holder = &w;
    }
    if (holder == nullptr) break;
    if (attempt == kMaxEvictions) {
      return fail(absl::AlreadyExistsError(absl::StrCat(
          who, ": worker id ", holder->id, " at ", holder->address,
          " took that name again after ", kMaxEvictions, " evictions")));
    }
    absl::Status alive = agent->ProbeWorker(*holder);
    if (alive.ok()) {
      return fail(absl::AlreadyExistsError(absl::StrCat(
          who, ": worker id ", holder->id, " at ", holder->address,
          " has that name and has not left (it answers its health probe)")));
    }
    FERRY_LOG(WARNING) << who << ": worker '" << name << "' (id "
                       << holder->id << ") at " << holder->address
                       << " is dead (" << alive << "); taking its name";
    absl::Status evicted = grpc_agent::EvictDeadMember(store, id.static_size,
                                                       *holder);
    if (!evicted.ok()) return fail(Annotate(evicted, who));
    slot = grpc_agent::AppendMembershipEvent(store, MembershipChange::kJoined,
                                             self);
    if (!slot.ok()) return fail(Annotate(slot.status(), who));
    members = grpc_agent::ReadMembers(store, id.static_size, *slot, who,
                                      deadline - absl::Now());
    if (!members.ok()) return fail(members.status());
  }
  absl::Status probed =
      agent->same_host_->ProbeMembers(*store, *members, id.id);
  if (!probed.ok()) return fail(Annotate(probed, who));
  members->push_back(self);
  agent->SetWorkers(*members);
  agent->OpenChannels();
  absl::Status announced = agent->AnnounceJoin(*members, deadline, who);
  if (!announced.ok()) return fail(announced);
  // The members told have answered: pairs missing an answer use gRPC.
  absl::Status settled = agent->same_host_->SettleJoin(*store, *members, id.id);
  if (!settled.ok()) {
    FERRY_LOG(WARNING) << who << ": same-host channel off: " << settled;
  }
  FERRY_LOG(INFO) << who << ": serving on " << address << " beside "
                  << members->size() - 1 << " workers";
  return agent;
}

absl::Status GrpcAgent::Leave(absl::Duration timeout) {
  MutexLock serial(&shutdown_mu_);
  {
    MutexLock lock(&mu_);
    if (shut_down_) return absl::OkStatus();
  }
  const absl::Time deadline = absl::Now() + timeout;
  absl::Status result = AwaitOutgoingCalls(deadline, timeout);
  if (result.ok()) result = AnnounceLeave(deadline);
  BeginStop("leaving the group");  // Joiners are refused from now on.
  // The calls it received before the members knew are answered.
  StopServing(/*drain=*/true, result.ok() ? deadline : absl::Now());
  return result;
}

absl::Status GrpcAgent::AnnounceLeave(absl::Time deadline) {
  const std::string who =
      absl::StrCat("worker '", self().name, "' (id ", self().id, ") leaving");
  absl::StatusOr<int64_t> slot = grpc_agent::AppendMembershipEvent(
      store_, MembershipChange::kLeft, self());
  if (!slot.ok()) return Annotate(slot.status(), who);
  if (self().id < static_size_) {
    RETURN_IF_ERROR(grpc_agent::ArriveAtShutdownBarrier(store_, static_size_,
                                                        self().id));
  }
  // Members whose join notice has not reached this worker yet are told too.
  absl::StatusOr<std::vector<WorkerInfo>> members = grpc_agent::ReadMembers(
      store_, static_size_, *slot, who, deadline - absl::Now());
  if (!members.ok()) return members.status();
  for (const WorkerInfo& w : *members) AddMember(w);
  WarnUntold(who, Announce(MembershipChange::kLeft, self(), GetWorkerInfos(),
                           deadline));
  return absl::OkStatus();
}

}  // namespace ferry::rpc
