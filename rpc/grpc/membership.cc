#include "ferry/rpc/grpc/membership.h"

#include <map>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "ferry/common/status.h"
#include "ferry/rpc/grpc/rendezvous.h"
#include "ferry/store/prefix_store.h"

namespace ferry::rpc::grpc_agent {
namespace {

constexpr int kMaxId = 0xffff;

std::string EventKey(int64_t slot) { return absl::StrCat("members/", slot); }

struct Event {
  MembershipChange change = MembershipChange::kJoined;
  WorkerInfo worker;
};

absl::StatusOr<Event> ParseEvent(const std::string& record,
                                 const std::string& who) {
  std::vector<std::string> f = absl::StrSplit(record, absl::MaxSplits('\n', 3));
  Event e;
  if (f.size() != 4 || (f[0] != "join" && f[0] != "leave") ||
      !absl::SimpleAtoi(f[1], &e.worker.id) || e.worker.id < 0 ||
      e.worker.id > kMaxId || f[2].empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": malformed membership record '", record, "'"));
  }
  e.change =
      f[0] == "join" ? MembershipChange::kJoined : MembershipChange::kLeft;
  e.worker.name = std::move(f[2]);
  e.worker.address = std::move(f[3]);
  return e;
}

// The static group's records ("rank\nname\naddress", rendezvous.cc).
absl::StatusOr<std::map<int, WorkerInfo>> StaticMembers(
    Store& store, int static_size, const std::string& who) {
  std::vector<std::string> keys;
  for (int i = 0; i < static_size; ++i) {
    keys.push_back(absl::StrCat("join/", i));
  }
  ASSIGN_OR_RETURN(std::vector<std::string> records, store.MultiGet(keys));
  std::map<int, WorkerInfo> members;
  for (const std::string& r : records) {
    std::vector<std::string> f = absl::StrSplit(r, absl::MaxSplits('\n', 2));
    WorkerInfo w;
    if (f.size() != 3 || !absl::SimpleAtoi(f[0], &w.id) || w.id < 0 ||
        w.id >= static_size) {
      return absl::InvalidArgumentError(
          absl::StrCat(who, ": malformed join record '", r, "'"));
    }
    w.name = std::move(f[1]);
    w.address = std::move(f[2]);
    members[w.id] = std::move(w);
  }
  return members;
}

}  // namespace

absl::Status PublishStaticSize(std::shared_ptr<Store> base, int world_size) {
  PrefixStore store("rpc/", std::move(base));
  return store.Set("static_size", absl::StrCat(world_size));
}

absl::StatusOr<JoinerId> ReserveJoinerId(std::shared_ptr<Store> base,
                                         const std::string& name,
                                         absl::Duration timeout) {
  PrefixStore store("rpc/", std::move(base));
  const std::string who = absl::StrCat("worker '", name, "' joining");
  absl::Status running = store.Wait({std::string("static_size")}, timeout);
  if (!running.ok()) {
    return Annotate(running, absl::StrCat(who, ": no running group formed in ",
                                          absl::FormatDuration(timeout)));
  }
  ASSIGN_OR_RETURN(std::string size, store.Get("static_size"));
  JoinerId out;
  if (!absl::SimpleAtoi(size, &out.static_size) || out.static_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": malformed static_size '", size, "'"));
  }
  ASSIGN_OR_RETURN(int64_t n, store.Add("members/next_id", 1));
  if (out.static_size + n - 1 > kMaxId) {
    return absl::ResourceExhaustedError(absl::StrCat(
        who, ": every worker id up to ", kMaxId, " was handed out"));
  }
  out.id = static_cast<int>(out.static_size + n - 1);
  return out;
}

absl::StatusOr<int64_t> AppendMembershipEvent(std::shared_ptr<Store> base,
                                              MembershipChange change,
                                              const WorkerInfo& worker) {
  PrefixStore store("rpc/", std::move(base));
  ASSIGN_OR_RETURN(int64_t n, store.Add("members/count", 1));
  const int64_t slot = n - 1;
  RETURN_IF_ERROR(store.Set(
      EventKey(slot),
      absl::StrCat(change == MembershipChange::kJoined ? "join" : "leave", "\n",
                   worker.id, "\n", worker.name, "\n", worker.address)));
  return slot;
}

absl::Status EvictDeadMember(std::shared_ptr<Store> base, int static_size,
                             const WorkerInfo& dead) {
  RETURN_IF_ERROR(
      AppendMembershipEvent(base, MembershipChange::kLeft, dead).status());
  if (dead.id >= static_size) return absl::OkStatus();
  return ArriveAtShutdownBarrier(std::move(base), static_size, dead.id);
}

absl::StatusOr<std::vector<WorkerInfo>> ReadMembers(std::shared_ptr<Store> base,
                                                    int static_size,
                                                    int64_t slot,
                                                    const std::string& who,
                                                    absl::Duration timeout) {
  PrefixStore store("rpc/", std::move(base));
  ASSIGN_OR_RETURN(auto members, StaticMembers(store, static_size, who));
  std::vector<std::string> keys;
  for (int64_t i = 0; i < slot; ++i) keys.push_back(EventKey(i));
  std::vector<std::string> records;
  if (!keys.empty()) {
    // A slot is taken before its record is written.
    absl::Status waited = store.Wait(keys, timeout);
    if (!waited.ok()) {
      return Annotate(
          waited, absl::StrCat(who, " reading ", slot, " membership records"));
    }
    ASSIGN_OR_RETURN(records, store.MultiGet(keys));
  }
  for (const std::string& r : records) {
    ASSIGN_OR_RETURN(Event e, ParseEvent(r, who));
    if (e.change == MembershipChange::kLeft) {
      members.erase(e.worker.id);
      continue;
    }
    bool taken = false;
    for (const auto& [id, w] : members) taken |= w.name == e.worker.name;
    if (!taken) members.emplace(e.worker.id, std::move(e.worker));
  }
  std::vector<WorkerInfo> out;
  for (auto& [id, w] : members) out.push_back(std::move(w));
  return out;
}

}  // namespace ferry::rpc::grpc_agent
