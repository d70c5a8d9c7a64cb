#include "ferry/rpc/grpc/rendezvous.h"

#include <algorithm>
#include <map>
#include <string>
#include <tuple>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "ferry/common/status.h"
#include "ferry/store/prefix_store.h"

namespace ferry::rpc::grpc_agent {
namespace {

// Parses the join records and checks them in rank order, so that every
// worker reports the same problems.
absl::StatusOr<std::vector<WorkerInfo>> CheckGroup(
    const std::vector<std::string>& records, int world_size,
    const std::string& who) {
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
  return by_rank;
}

}  // namespace

absl::StatusOr<std::vector<WorkerInfo>> FormGroup(std::shared_ptr<Store> base,
                                                  const WorkerInfo& self,
                                                  int world_size,
                                                  absl::Duration timeout) {
  PrefixStore store("rpc/", std::move(base));
  store.SetTimeout(timeout);
  const std::string who =
      absl::StrCat("worker '", self.name, "' (rank ", self.id, ")");
  ASSIGN_OR_RETURN(int64_t seq, store.Add("join_count", 1));
  --seq;
  RETURN_IF_ERROR(
      store.Set(absl::StrCat("join/", seq),
                absl::StrCat(self.id, "\n", self.name, "\n", self.address)));
  if (seq >= world_size) {
    return absl::FailedPreconditionError(
        absl::StrCat(who, " joined a group of world size ", world_size,
                     " that already has ", world_size, " workers"));
  }
  std::vector<std::string> keys;
  for (int i = 0; i < world_size; ++i) keys.push_back(absl::StrCat("join/", i));
  absl::Status waited = store.Wait(keys, timeout);
  if (!waited.ok()) {
    return Annotate(waited, absl::StrCat(who, " waiting for ", world_size,
                                         " workers to join"));
  }
  ASSIGN_OR_RETURN(std::vector<std::string> records, store.MultiGet(keys));
  return CheckGroup(records, world_size, who);
}

absl::Status ArriveAtShutdownBarrier(std::shared_ptr<Store> base,
                                     int world_size, int id) {
  PrefixStore store("rpc/", std::move(base));
  absl::StatusOr<int64_t> once =
      store.Add(absl::StrCat("shutdown_arrived/", id), 1);
  if (!once.ok()) return once.status();
  if (*once != 1) return absl::OkStatus();
  absl::StatusOr<int64_t> n = store.Add("shutdown_count", 1);
  if (n.ok() && *n == world_size) return store.Set("shutdown_done", "1");
  return n.status();
}

absl::Status ShutdownBarrier(std::shared_ptr<Store> base,
                             const std::string& self_name, int self_id,
                             int world_size, absl::Time deadline) {
  absl::Status s = ArriveAtShutdownBarrier(base, world_size, self_id);
  PrefixStore store("rpc/", std::move(base));
  if (s.ok())
    s = store.Wait({std::string("shutdown_done")}, deadline - absl::Now());
  if (!s.ok()) {
    return Annotate(s,
                    absl::StrCat("worker '", self_name, "' shutdown barrier"));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> ShutdownBarrierDone(std::shared_ptr<Store> base) {
  PrefixStore store("rpc/", std::move(base));
  return store.Check({std::string("shutdown_done")});
}

absl::StatusOr<int64_t> ShutdownBarrierArrivals(std::shared_ptr<Store> base) {
  PrefixStore store("rpc/", std::move(base));
  return store.Add("shutdown_count", 0);
}

}  // namespace ferry::rpc::grpc_agent
