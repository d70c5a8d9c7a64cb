// A worker SIGKILLed and restarted under its name (rpc/grpc/agent.h, Join;
// docs/design/checkpoints.md): the test is worker0 of a static group of two
// whose worker1 (worker_main) owns a Counter. worker1 is killed; a new
// process (elastic_trainer_main named "worker1") joins under the name. The
// RRef owned by the dead instance fails naming the RRef and the dead owner
// (its old id) and is never sent to the new process; calls by name reach the
// new one once Agent::WaitForWorker says it is back.
#include <signal.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "ferry/common/status.h"
#include "ferry/rpc/grpc/agent.h"
#include "ferry/rref/rref.h"
#include "ferry/tests/rref/counter.h"
#include "ferry/tests/util/subprocess.h"
#include "ferry/tests/util/worker_processes.h"
#include "gtest/gtest.h"

namespace ferry::rref {
namespace {

using testutil::Counter;

constexpr absl::Duration kWait = absl::Seconds(60);

// This process as worker0 (with an RRef context in `ctx`) beside worker1, a
// worker_main process.
absl::Status StartGroup(testutil::WorkerProcesses& procs,
                        std::shared_ptr<RRefContext>& ctx) {
  rpc::GrpcAgentOptions options;
  options.before_serving = [&ctx](rpc::Agent& agent) {
    return testutil::InstallRRefTestLayer(agent, &ctx);
  };
  return procs.Start(2, "tests/rref/worker_main", std::move(options));
}

TEST(RejoinRRef, RestartedOwnerTakesTheNameAndOldRRefsFailNamingTheDeadOne) {
  std::shared_ptr<RRefContext> ctx;
  testutil::WorkerProcesses procs;
  absl::Status started = StartGroup(procs, ctx);
  ASSERT_TRUE(started.ok()) << started;
  rpc::GrpcAgent& agent = procs.agent();
  const int old_id = agent.GetWorkerInfo("worker1")->id;

  RRef<Counter> c = remote<Counter>(*ctx, "worker1", "Counter", 1);
  ASSERT_TRUE(c.creation().Get(kWait).ok());
  ASSERT_EQ(*c.rpc_sync(kWait).call<int64_t>("add", 1), 2);

  ASSERT_TRUE(procs.worker(0).Signal(SIGKILL).ok());
  EXPECT_FALSE(procs.Wait(0, kWait).ok());  // Killed: no exit code.

  // The restarted process joins under the dead one's name.
  absl::StatusOr<std::unique_ptr<testutil::Subprocess>> restarted =
      procs.SpawnJoiner({"tests/rref/elastic_trainer_main", "worker1"});
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  const std::string joined = (*restarted)->ReadLine(absl::Now() + kWait);
  std::vector<std::string> f = absl::StrSplit(joined, ' ');
  int new_id = -1;
  ASSERT_TRUE(f.size() == 3 && f[0] == "joined" &&
              absl::SimpleAtoi(f[1], &new_id))
      << joined;
  EXPECT_NE(new_id, old_id);

  absl::StatusOr<rpc::WorkerInfo> back =
      agent.WaitForWorker("worker1", kWait, old_id);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->id, new_id);
  EXPECT_TRUE(agent.HasLeft(old_id));

  // The dead instance's RRef fails at once, naming the RRef and the dead
  // owner (old id), and is not sent to the new process.
  absl::StatusOr<int64_t> old = c.rpc_sync(kWait).call<int64_t>("get");
  ASSERT_FALSE(old.ok());
  EXPECT_EQ(old.status().code(), absl::StatusCode::kUnavailable)
      << old.status();
  const std::string m(old.status().message());
  EXPECT_NE(m.find(c.rref_id().ToString()), std::string::npos) << m;
  EXPECT_NE(m.find(absl::StrCat("'worker1' (id ", old_id, ") is dead")),
            std::string::npos)
      << m;

  // Calls by name, and new RRefs, reach the new process.
  absl::StatusOr<int64_t> sum = agent.rpc_sync<int64_t>("worker1", "add", 2, 3);
  ASSERT_TRUE(sum.ok()) << sum.status();
  EXPECT_EQ(*sum, 5);
  RRef<Counter> fresh = remote<Counter>(*ctx, "worker1", "Counter", 10);
  absl::StatusOr<int64_t> added = fresh.rpc_sync(kWait).call<int64_t>("add", 1);
  ASSERT_TRUE(added.ok()) << added.status();
  EXPECT_EQ(*added, 11);
  EXPECT_EQ(fresh.owner_name(), "worker1");

  c = RRef<Counter>();
  fresh = RRef<Counter>();
  ASSERT_TRUE(ctx->AwaitSettled(kWait).ok());
  ASSERT_TRUE((*restarted)->WriteStdin("leave\n").ok());
  EXPECT_EQ((*restarted)->ReadLine(absl::Now() + kWait), "left");
  absl::StatusOr<int> code = (*restarted)->Wait(absl::Now() + kWait);
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0);
  ctx.reset();
}

// A holder that stalls (SIGSTOP) does not answer its health probe either:
// the joiner evicts it after peer_probe_timeout (5 s in the joiner) and
// takes the name; the stalled process, woken, is no longer the name's owner.
TEST(RejoinRRef, AStalledHolderIsEvictedLikeADeadOne) {
  std::shared_ptr<RRefContext> ctx;
  testutil::WorkerProcesses procs;
  absl::Status started = StartGroup(procs, ctx);
  ASSERT_TRUE(started.ok()) << started;
  rpc::GrpcAgent& agent = procs.agent();
  const int old_id = agent.GetWorkerInfo("worker1")->id;
  ASSERT_TRUE(procs.worker(0).Signal(SIGSTOP).ok());

  absl::StatusOr<std::unique_ptr<testutil::Subprocess>> restarted =
      procs.SpawnJoiner({"tests/rref/elastic_trainer_main", "worker1"});
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  const std::string joined = (*restarted)->ReadLine(absl::Now() + kWait);
  ASSERT_EQ(joined.rfind("joined ", 0), 0u) << joined;
  absl::StatusOr<rpc::WorkerInfo> back =
      agent.WaitForWorker("worker1", kWait, old_id);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_NE(back->id, old_id);
  EXPECT_TRUE(agent.HasLeft(old_id));
  absl::StatusOr<int64_t> sum = agent.rpc_sync<int64_t>("worker1", "add", 4, 4);
  ASSERT_TRUE(sum.ok()) << sum.status();
  EXPECT_EQ(*sum, 8);

  // Woken, the old process does not get its name back: calls by name still
  // reach the new one.
  ASSERT_TRUE(procs.worker(0).Signal(SIGCONT).ok());
  absl::StatusOr<rpc::WorkerInfo> still = agent.GetWorkerInfo("worker1");
  ASSERT_TRUE(still.ok()) << still.status();
  EXPECT_EQ(still->id, back->id);
  ASSERT_TRUE(procs.worker(0).Signal(SIGKILL).ok());

  ASSERT_TRUE((*restarted)->WriteStdin("leave\n").ok());
  EXPECT_EQ((*restarted)->ReadLine(absl::Now() + kWait), "left");
  absl::StatusOr<int> code = (*restarted)->Wait(absl::Now() + kWait);
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0);
  ctx.reset();
}

}  // namespace
}  // namespace ferry::rref
