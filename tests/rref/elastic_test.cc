// Dynamic membership across processes (rpc/agent.h, Membership): the test is
// worker0 of a running static group of two (worker1 is a worker_main
// process) that owns a Counter; elastic trainer processes
// (elastic_trainer_main) join it with JoinRpc, use it through RRefs, and
// leave while it keeps running. The test steps each trainer through its
// stdin and reads its stdout: no sleeps, every wait bounded.
#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "ferry/common/status.h"
#include "ferry/common/sync.h"
#include "gtest/gtest.h"
#include "ferry/rpc/grpc/agent.h"
#include "ferry/rref/rref.h"
#include "ferry/tests/rref/counter.h"
#include "ferry/tests/util/worker_processes.h"
#include "ferry/tests/util/subprocess.h"

namespace ferry::rref {
namespace {

using testutil::Counter;

constexpr absl::Duration kWait = absl::Seconds(60);

// A trainer process stepped through its stdin.
class Trainer {
 public:
  static absl::StatusOr<std::unique_ptr<Trainer>> Spawn(
      const std::string& name, const std::string& port) {
    testutil::SpawnOptions spawn;
    spawn.env = {{"MASTER_ADDR", "127.0.0.1"},
                 {"MASTER_PORT", port},
                 {"FERRY_USE_AGENT_STORE", "1"}};
    spawn.PipeStdin().CaptureStdout();
    auto t = std::unique_ptr<Trainer>(new Trainer);
    t->name_ = name;
    ASSIGN_OR_RETURN(
        t->process_,
        testutil::Subprocess::Spawn(
            {testutil::RunfilePath("tests/rref/elastic_trainer_main"), name},
            spawn));
    return t;
  }
  // Its id once it printed "joined <id> <world size>".
  absl::StatusOr<int> Joined() {
    std::vector<std::string> f = absl::StrSplit(Line(), ' ');
    int id = -1;
    if (f.size() != 3 || f[0] != "joined" || !absl::SimpleAtoi(f[1], &id)) {
      return absl::InternalError(
          absl::StrCat(name_, " did not join: '", absl::StrJoin(f, " "), "'"));
    }
    return id;
  }
  // Sends `command`; returns the line it answered.
  std::string Do(const std::string& command) {
    absl::Status sent = process_->WriteStdin(command + "\n");
    if (!sent.ok()) return sent.ToString();
    return Line();
  }
  absl::StatusOr<int> Exit() { return process_->Wait(absl::Now() + kWait); }

 private:
  Trainer() = default;
  std::string Line() { return process_->ReadLine(absl::Now() + kWait); }
  std::string name_;
  std::unique_ptr<testutil::Subprocess> process_;
};

// What worker0's agent heard, by worker name.
struct Heard {
  Mutex mu;
  std::map<std::string, std::vector<rpc::MembershipChange>> changes
      ABSL_GUARDED_BY(mu);
};

class ElasticGroup : public ::testing::Test {
 protected:
  void SetUp() override {
    rpc::GrpcAgentOptions options;
    options.before_serving = [this](rpc::Agent& agent) {
      RETURN_IF_ERROR(testutil::InstallRRefTestLayer(agent, &ctx_));
      // Hands each trainer a fork of the counter this worker owns.
      RETURN_IF_ERROR(agent.Register("get_counter", [this] {
        MutexLock lock(&mu_);
        return counter_;
      }));
      agent.AddMembershipListener(
          [this](const rpc::WorkerInfo& w, rpc::MembershipChange change) {
            MutexLock lock(&heard_.mu);
            heard_.changes[w.name].push_back(change);
          });
      return absl::OkStatus();
    };
    absl::Status started =
        procs_.Start(2, "tests/rref/worker_main", std::move(options));
    ASSERT_TRUE(started.ok()) << started;
    MutexLock lock(&mu_);
    counter_ = remote<Counter>(*ctx_, "worker0", "Counter", 0);
  }

  void TearDown() override {
    {
      MutexLock lock(&mu_);
      counter_ = RRef<Counter>();
    }
    ctx_.reset();  // procs_ shuts the agent down after.
  }

  // Forks of the counter registered at worker0, by holder id.
  std::vector<int> CounterHolders() {
    GlobalId id;
    {
      MutexLock lock(&mu_);
      id = counter_.rref_id();
    }
    std::vector<int> out;
    for (const RRefContext::OwnedInfo& o : ctx_->Owned()) {
      if (o.rref_id != id) continue;
      for (const auto& [fork, holder] : o.forks) out.push_back(holder);
    }
    return out;
  }
  std::vector<rpc::MembershipChange> HeardOf(const std::string& name) {
    MutexLock lock(&heard_.mu);
    return heard_.changes[name];
  }

  std::shared_ptr<RRefContext> ctx_;
  Mutex mu_;
  RRef<Counter> counter_ ABSL_GUARDED_BY(mu_);
  Heard heard_;
  // Worker1 beside this worker0; declared last, so its agent stops before
  // the members its listeners use go.
  testutil::WorkerProcesses procs_;
};

TEST_F(ElasticGroup, TrainersJoinWorkAndLeaveWhileTheGroupRuns) {
  using rpc::MembershipChange;
  std::vector<std::unique_ptr<Trainer>> trainers;
  std::vector<int> ids;
  for (const char* name : {"trainer1", "trainer2"}) {
    absl::StatusOr<std::unique_ptr<Trainer>> t =
        Trainer::Spawn(name, procs_.port());
    ASSERT_TRUE(t.ok()) << t.status();
    trainers.push_back(*std::move(t));
  }
  for (size_t i = 0; i < trainers.size(); ++i) {
    absl::StatusOr<int> id = trainers[i]->Joined();
    ASSERT_TRUE(id.ok()) << id.status();
    ids.push_back(*id);
    // worker0 knew the trainer before its Join returned.
    const std::string name = absl::StrCat("trainer", i + 1);
    absl::StatusOr<rpc::WorkerInfo> info = procs_.agent().GetWorkerInfo(name);
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->id, *id);
    EXPECT_GE(*id, 2);  // After the static ranks.
  }
  EXPECT_NE(ids[0], ids[1]);
  EXPECT_EQ(procs_.agent().world_size(), 4);
  EXPECT_EQ(trainers[0]->Do("work 5"), "did 5 10");
  EXPECT_EQ(trainers[1]->Do("work 7"), "did 12 14");
  std::vector<int> holders = CounterHolders();
  std::vector<int> sorted_ids = ids;
  std::sort(holders.begin(), holders.end());
  std::sort(sorted_ids.begin(), sorted_ids.end());
  EXPECT_EQ(holders, sorted_ids);
  // worker0 calls a trainer too.
  absl::StatusOr<int64_t> sum = procs_.agent().rpc_sync<int64_t>(
      "trainer2", "add", int64_t{1}, int64_t{2});
  ASSERT_TRUE(sum.ok()) << sum.status();
  EXPECT_EQ(*sum, 3);

  // They leave still holding their forks: their Leave releases them.
  for (auto& t : trainers) {
    EXPECT_EQ(t->Do("leave"), "left");
    absl::StatusOr<int> code = t->Exit();
    ASSERT_TRUE(code.ok()) << code.status();
    EXPECT_EQ(*code, 0);
  }
  EXPECT_TRUE(CounterHolders().empty());
  EXPECT_EQ(procs_.agent().world_size(), 2);
  for (int id : ids) EXPECT_TRUE(procs_.agent().HasLeft(id));
  EXPECT_EQ(HeardOf("trainer1"),
            (std::vector<MembershipChange>{MembershipChange::kJoined,
                                           MembershipChange::kLeft}));
  absl::Status gone = procs_.agent().rpc_sync("trainer1", "pid").status();
  EXPECT_EQ(gone.code(), absl::StatusCode::kUnavailable) << gone;
  EXPECT_TRUE(absl::StrContains(gone.message(), "'trainer1'")) << gone;
  EXPECT_TRUE(absl::StrContains(gone.message(), "left the group")) << gone;

  // The group goes on: worker1 uses the counter, and a trainer of the same
  // name joins again with a new id.
  RRef<Counter> counter;
  {
    MutexLock lock(&mu_);
    counter = counter_;
  }
  absl::StatusOr<int64_t> from_worker1 =
      procs_.agent().rpc_sync<int64_t>("worker1", "counter_add", counter, 1);
  ASSERT_TRUE(from_worker1.ok()) << from_worker1.status();
  EXPECT_EQ(*from_worker1, 13);
  absl::StatusOr<std::unique_ptr<Trainer>> again =
      Trainer::Spawn("trainer1", procs_.port());
  ASSERT_TRUE(again.ok()) << again.status();
  absl::StatusOr<int> id = (*again)->Joined();
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_GT(*id, std::max(ids[0], ids[1]));
  EXPECT_EQ((*again)->Do("work 2"), "did 15 4");
  EXPECT_EQ((*again)->Do("leave"), "left");
  absl::StatusOr<int> code = (*again)->Exit();
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0);
  EXPECT_TRUE(CounterHolders().empty());

  // The static group shuts down as before (collective, no leak reported).
  counter = RRef<Counter>();
  {
    MutexLock lock(&mu_);
    counter_ = RRef<Counter>();
  }
  absl::Status down = ctx_->Shutdown(kWait);
  EXPECT_TRUE(down.ok()) << down;
  absl::StatusOr<int> w1 = procs_.Wait(0, kWait);
  ASSERT_TRUE(w1.ok()) << w1.status();
  EXPECT_EQ(*w1, 0);
}

}  // namespace
}  // namespace ferry::rref
