// c10d across processes: N c10d_worker processes meet through a FileStore
// (file:// init method) or a TCPStore served by this test, run every
// collective on gloo and check the results; a rank that never starts makes
// the others fail with DeadlineExceeded instead of hanging.
#include <dirent.h>
#include <unistd.h>

#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "ferry/store/tcp_store.h"
#include "ferry/store/testing/loopback_store.h"
#include "ferry/tests/util/subprocess.h"

namespace ferry {
namespace {

std::string g_worker;  // Path of c10d_worker (argv[1]).

// Runs `world` c10d_worker processes (all but `skip_rank`), rank r with the
// arguments how(r), and expects each to exit 0 within two minutes.
void RunJob(int world, const std::function<std::vector<std::string>(int)>& how,
            int skip_rank = -1) {
  std::vector<std::unique_ptr<testutil::Subprocess>> workers;
  for (int r = 0; r < world; ++r) {
    if (r == skip_rank) continue;
    std::vector<std::string> args = {g_worker};
    for (std::string& a : how(r)) args.push_back(std::move(a));
    args.push_back(absl::StrCat("--rank=", r));
    args.push_back(absl::StrCat("--world_size=", world));
    auto child = testutil::Subprocess::Spawn(std::move(args));
    ASSERT_TRUE(child.ok()) << child.status();
    workers.push_back(*std::move(child));
  }
  const absl::Time deadline = absl::Now() + absl::Minutes(2);
  for (auto& w : workers) {
    absl::StatusOr<int> code = w->Wait(deadline);
    EXPECT_EQ(code.value_or(-1), 0)
        << "worker pid " << w->pid() << ": " << code.status();
  }
}

std::string FreshPath(const std::string& name) {
  std::string path =
      absl::StrCat(::testing::TempDir(), "/", name, "_", ::getpid());
  std::remove(path.c_str());
  return path;
}

TEST(C10dMultiProcessTest, FileInitMethodTwoAndFourRanks) {
  for (int world : {2, 4}) {
    std::string path = FreshPath(absl::StrCat("c10d_file_", world));
    RunJob(world, [&](int) {
      return std::vector<std::string>{
          absl::StrCat("--init_method=file://", path)};
    });
  }
}

TEST(C10dMultiProcessTest, TcpStoreThreeRanks) {
  auto server = testutil::StartLoopbackStore();
  ASSERT_TRUE(server.ok()) << server.status();
  int port = (*server)->port();
  RunJob(3, [&](int) {
    return std::vector<std::string>{absl::StrCat("--tcp_port=", port)};
  });
}

// The issue this guards: under ferry_run, rank 0 tried to host a second
// store on MASTER_PORT (EADDRINUSE). Three workers via env:// must pass.
TEST(C10dMultiProcessTest, EnvInitUnderFerryRun) {
  auto [code, out] = testutil::RunCommand(
      {testutil::RunfilePath("tools/launcher/ferry_run"), "--nproc=3",
       "--timeout_s=110", "--", g_worker, "--init_method=env://"},
      {}, absl::Minutes(2));
  EXPECT_EQ(code, 0) << out;
  EXPECT_EQ(out.find("EADDRINUSE"), std::string::npos) << out;
}

// torchrun's contract: the agent serves the store on MASTER_PORT, sets
// TORCHELASTIC_USE_AGENT_STORE=True, and keys live under
// /worker/attempt_<restart count>. This test plays the agent.
TEST(C10dMultiProcessTest, EnvInitWithTorchelasticAgentStore) {
  auto server = testutil::StartLoopbackStore();
  ASSERT_TRUE(server.ok()) << server.status();
  const int world = 2;
  std::vector<std::unique_ptr<testutil::Subprocess>> workers;
  for (int r = 0; r < world; ++r) {
    testutil::SpawnOptions so;
    so.env = {{"MASTER_ADDR", "127.0.0.1"},
              {"MASTER_PORT", absl::StrCat((*server)->port())},
              {"RANK", absl::StrCat(r)},
              {"WORLD_SIZE", absl::StrCat(world)},
              {"TORCHELASTIC_USE_AGENT_STORE", "True"},
              {"TORCHELASTIC_RESTART_COUNT", "3"},
              {"FERRY_USE_AGENT_STORE", "0"}};
    auto child = testutil::Subprocess::Spawn({g_worker, "--init_method=env://"},
                                             std::move(so));
    ASSERT_TRUE(child.ok()) << child.status();
    workers.push_back(*std::move(child));
  }
  const absl::Time deadline = absl::Now() + absl::Minutes(2);
  for (auto& w : workers) {
    absl::StatusOr<int> code = w->Wait(deadline);
    EXPECT_EQ(code.value_or(-1), 0)
        << "worker pid " << w->pid() << ": " << code.status();
  }
  // The default backend's rendezvous key for rank 0 (its store namespace is
  // the registered name, "auto") went to this attempt's namespace.
  const std::string key = "default_pg/auto/rank_0";
  auto in_attempt = (*server)->Check({"/worker/attempt_3/" + key});
  auto bare = (*server)->Check({key});
  ASSERT_TRUE(in_attempt.ok() && bare.ok());
  EXPECT_TRUE(*in_attempt);
  EXPECT_FALSE(*bare);
}

TEST(C10dMultiProcessTest, RankThatNeverStartsGivesDeadlineExceeded) {
  std::string path = FreshPath("c10d_missing");
  RunJob(
      3,
      [&](int) {
        return std::vector<std::string>{
            absl::StrCat("--init_method=file://", path), "--timeout_ms=1000",
            "--mode=expect_deadline"};
      },
      /*skip_rank=*/2);
  std::remove(path.c_str());
}

// /dev/shm entries whose names start with `prefix`.
std::vector<std::string> ShmSegments(const std::string& prefix) {
  std::vector<std::string> out;
  DIR* dir = ::opendir("/dev/shm");
  if (dir == nullptr) return out;
  while (dirent* e = ::readdir(dir)) {
    if (std::string(e->d_name).rfind(prefix, 0) == 0) out.push_back(e->d_name);
  }
  ::closedir(dir);
  return out;
}

// Runs 3 ranks of c10d_worker --mode=shm_kill --shm_op=`op` (broadcasts
// larger than a slot run as `broadcast` says: stream or rounds): the last
// rank SIGKILLs itself during its fourth call; the others must fail within
// the timeout (not hang), and no segment may be left in /dev/shm.
void RunShmKill(const std::string& op, const std::string& broadcast = "auto") {
  const std::string prefix =
      absl::StrCat("ferry-c10d-kill-", op, "-", broadcast, "-", ::getpid());
  const std::string path =
      FreshPath(absl::StrCat("c10d_shm_kill_", op, "_", broadcast));
  const int world = 3;
  std::vector<std::unique_ptr<testutil::Subprocess>> workers;
  for (int r = 0; r < world; ++r) {
    auto child = testutil::Subprocess::Spawn(
        {g_worker, absl::StrCat("--init_method=file://", path),
         "--mode=shm_kill", absl::StrCat("--shm_op=", op),
         absl::StrCat("--shm_prefix=/", prefix),
         absl::StrCat("--shm_broadcast=", broadcast), "--timeout_ms=20000",
         absl::StrCat("--rank=", r), absl::StrCat("--world_size=", world)});
    ASSERT_TRUE(child.ok()) << child.status();
    workers.push_back(*std::move(child));
  }
  const absl::Time deadline = absl::Now() + absl::Minutes(2);
  for (int r = 0; r < world; ++r) {
    absl::StatusOr<int> code = workers[r]->Wait(deadline);
    if (r == world - 1) {
      EXPECT_EQ(code.status().code(), absl::StatusCode::kAborted)
          << "the victim should die of SIGKILL: " << code.status();
    } else {
      EXPECT_EQ(code.value_or(-1), 0) << "rank " << r << ": " << code.status();
    }
  }
  EXPECT_TRUE(ShmSegments(prefix).empty());
  std::remove(path.c_str());
}

// A rank SIGKILLed during a shared-memory all-reduce.
TEST(C10dMultiProcessTest, ShmRankKilledMidAllreduce) {
  RunShmKill("allreduce");
}

// The root SIGKILLed while streaming a broadcast: the readers waiting on its
// progress fail. (Forced: with more ranks than cores the default is rounds.)
TEST(C10dMultiProcessTest, ShmRootKilledMidStreamedBroadcast) {
  RunShmKill("broadcast", "stream");
}

// The root SIGKILLed during a broadcast in rounds (the default with more
// ranks than cores): the readers waiting at the round's barrier fail.
TEST(C10dMultiProcessTest, ShmRootKilledMidBroadcastInRounds) {
  RunShmKill("broadcast", "rounds");
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s <path to c10d_worker>\n", argv[0]);
    return 2;
  }
  ferry::g_worker = argv[1];
  return RUN_ALL_TESTS();
}
