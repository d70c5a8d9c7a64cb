// Server death, end to end at toy scale (issue #33; docs/design/
// checkpoints.md): the test is worker0 (the trainer) of a static group whose
// "ps0" is a ps_shard_main process checkpointing every 5 steps. The trainer
// applies steps, SIGKILLs ps0 at a random step, starts a new ps_shard_main
// that restores the latest checkpoint and joins under the name "ps0", waits
// for it (Agent::WaitForWorker), reads its applied-step counter, and goes on
// from there. Checked: calls fail with Unavailable naming ps0 while it is
// down; the restored counter is a checkpoint's (a multiple of 5, at most the
// steps applied); the shard equals its counter
// (no update applied twice or half-restored); the job reaches its last step.
#include <signal.h>

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "ferry/common/poll.h"
#include "ferry/rpc/grpc/agent.h"
#include "ferry/tests/util/subprocess.h"
#include "ferry/tests/util/worker_processes.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

constexpr absl::Duration kWait = absl::Seconds(60);
constexpr int64_t kEvery = 5;
constexpr int64_t kSteps = 60;

TEST(ServerRestart, KilledServerRestoresItsShardAndTheTrainerGoesOn) {
  const uint32_t seed = static_cast<uint32_t>(absl::ToUnixMicros(absl::Now()));
  std::mt19937 rng(seed);
  const int64_t kill_at = std::uniform_int_distribution<int64_t>(6, 40)(rng);
  SCOPED_TRACE(absl::StrCat("seed ", seed, ", kill at step ", kill_at));

  testutil::WorkerProcesses procs;
  absl::Status started =
      procs.Start(2, "tests/fault/ps_shard_main", rpc::GrpcAgentOptions{});
  ASSERT_TRUE(started.ok()) << started;
  rpc::GrpcAgent& trainer = procs.agent();
  absl::StatusOr<rpc::WorkerInfo> ps = trainer.GetWorkerInfo("ps0");
  ASSERT_TRUE(ps.ok()) << ps.status();
  const int old_id = ps->id;

  for (int64_t step = 1; step <= kill_at; ++step) {
    absl::StatusOr<int64_t> r = trainer.rpc_sync<int64_t>("ps0", "apply", step);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(*r, step);
  }
  // At least one checkpoint is on disk before the kill (the writer runs
  // behind the steps): its step bounds what the restart may lose.
  int64_t written = -1;
  ASSERT_TRUE(PollUntil(
      [&] {
        absl::StatusOr<int64_t> w =
            trainer.rpc_sync<int64_t>("ps0", "checkpointed");
        written = w.ok() ? *w : -1;
        return written >= kEvery;
      },
      kWait));
  const absl::Time killed = absl::Now();
  ASSERT_TRUE(procs.worker(0).Signal(SIGKILL).ok());
  EXPECT_FALSE(procs.Wait(0, kWait).ok());
  absl::StatusOr<int64_t> down =
      trainer.rpc_sync<int64_t>("ps0", "apply", kill_at + 1);
  ASSERT_FALSE(down.ok());
  EXPECT_EQ(down.status().code(), absl::StatusCode::kUnavailable)
      << down.status();
  EXPECT_NE(down.status().message().find("ps0"), std::string::npos)
      << down.status();

  testutil::SpawnOptions spawn;
  spawn.env = {{"MASTER_ADDR", "127.0.0.1"},
               {"MASTER_PORT", procs.port()},
               {"FERRY_USE_AGENT_STORE", "1"}};
  spawn.PipeStdin().CaptureStdout();
  absl::StatusOr<std::unique_ptr<testutil::Subprocess>> restarted =
      testutil::Subprocess::Spawn(
          {testutil::RunfilePath("tests/fault/ps_shard_main"), "join"}, spawn);
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  const std::string restored = (*restarted)->ReadLine(absl::Now() + kWait);
  std::vector<std::string> f = absl::StrSplit(restored, ' ');
  int64_t from_file = -1;
  ASSERT_TRUE(f.size() == 4 && f[0] == "restored" &&
              absl::SimpleAtoi(f[1], &from_file))
      << restored;
  const std::string serving = (*restarted)->ReadLine(absl::Now() + kWait);
  ASSERT_EQ(serving.rfind("serving ", 0), 0u) << serving;

  absl::StatusOr<rpc::WorkerInfo> back =
      trainer.WaitForWorker("ps0", kWait, old_id);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_NE(back->id, old_id);
  absl::StatusOr<int64_t> applied = trainer.rpc_sync<int64_t>("ps0", "applied");
  ASSERT_TRUE(applied.ok()) << applied.status();
  const absl::Duration recovery = absl::Now() - killed;
  EXPECT_EQ(*applied, from_file);
  EXPECT_EQ(*applied % kEvery, 0);
  EXPECT_LE(*applied, kill_at);
  // The newest file is at least the one seen written before the kill. How
  // far behind the steps it is has no bound in steps: snapshots taken while
  // one is being written supersede each other (a step here takes about a
  // millisecond, a write with fsync longer).
  EXPECT_GE(*applied, written);
  absl::StatusOr<bool> consistent = trainer.rpc_sync<bool>("ps0", "check");
  ASSERT_TRUE(consistent.ok()) << consistent.status();
  EXPECT_TRUE(*consistent);
  std::printf("killed at step %lld (checkpoint of step %lld written), "
              "restored step %lld: %lld steps lost; kill to restored server "
              "answering: %s\n",
              static_cast<long long>(kill_at), static_cast<long long>(written),
              static_cast<long long>(*applied),
              static_cast<long long>(kill_at - *applied),
              absl::FormatDuration(recovery).c_str());

  // A step the server already applied is refused, not applied twice.
  if (*applied > 0) {
    absl::StatusOr<int64_t> again =
        trainer.rpc_sync<int64_t>("ps0", "apply", *applied);
    EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition)
        << again.status();
  }
  // The trainer redoes the lost steps and finishes.
  for (int64_t step = *applied + 1; step <= kSteps; ++step) {
    absl::StatusOr<int64_t> r = trainer.rpc_sync<int64_t>("ps0", "apply", step);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(*r, step);
  }
  consistent = trainer.rpc_sync<bool>("ps0", "check");
  ASSERT_TRUE(consistent.ok()) << consistent.status();
  EXPECT_TRUE(*consistent);

  ASSERT_TRUE((*restarted)->WriteStdin("quit\n").ok());
  EXPECT_EQ((*restarted)->ReadLine(absl::Now() + kWait), "done");
  absl::StatusOr<int> code = (*restarted)->Wait(absl::Now() + kWait);
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0);
}

}  // namespace
}  // namespace ferry
