// ferry_run: environment, prefixed output, fail-fast job semantics, and a
// real Ferry program under it: examples/rpc_tensors (tools/run_job
// --rpc_tensors runs it with 3 workers, optimized; tools/run_job's default,
// the parameter-server job, is tested in //tests/parameter_server).
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "ferry/tests/util/subprocess.h"

namespace ferry {
namespace {

using testutil::RunCommand;
using testutil::RunfilePath;

// Runs ferry_run with `args` (flags, "--", program...): {exit code, output}.
std::pair<int, std::string> RunLauncher(std::vector<std::string> args) {
  args.insert(args.begin(), RunfilePath("tools/launcher/ferry_run"));
  return RunCommand(std::move(args), {}, absl::Minutes(2));
}

TEST(FerryRun, GivesEachRankItsEnvironmentAndPrefixesOutput) {
  auto [code, out] =
      RunLauncher({"--nproc", "3", "--", "/bin/sh", "-c",
                   "echo \"r=$RANK w=$WORLD_SIZE l=$LOCAL_RANK m=$MASTER_ADDR "
                   "p=${MASTER_PORT:+set}\""});
  EXPECT_EQ(code, 0) << out;
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(absl::StrContains(
        out,
        absl::StrCat("[", r, "]: r=", r, " w=3 l=", r, " m=127.0.0.1 p=set")))
        << out;
  }
}

// --node_relay: the workers' MASTER_ADDR/PORT name the node's relay, and a
// real job rendezvouses through it.
TEST(FerryRun, NodeRelayServesTheLocalWorkers) {
  auto [code, out] =
      RunLauncher({"--nproc", "2", "--node_relay", "--", "/bin/sh", "-c",
                   "echo \"at=$MASTER_ADDR:$MASTER_PORT\""});
  ASSERT_EQ(code, 0) << out;
  const std::string kLine = "store relay for local workers on ";
  const size_t at = out.find(kLine);
  ASSERT_NE(at, std::string::npos) << out;
  const size_t begin = at + kLine.size();
  const std::string relay = out.substr(begin, out.find(' ', begin) - begin);
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(absl::StrContains(out, absl::StrCat("[", r, "]: at=", relay)))
        << relay << "\n" << out;
  }
  auto [job_code, job_out] =
      RunLauncher({"--nproc", "3", "--node_relay", "--timeout_s", "100", "--",
                   RunfilePath("examples/rpc_tensors/rpc_tensors")});
  ASSERT_EQ(job_code, 0) << job_out;
  EXPECT_TRUE(absl::StrContains(job_out, kLine)) << job_out;
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(
        absl::StrContains(job_out, absl::StrCat("[", r, "]: worker", r, ": done")))
        << job_out;
  }
}

// --node_relay with the store's secret: the relay proves it to the
// launcher's store and the workers prove it to the relay.
TEST(FerryRun, NodeRelayCarriesTheStoreSecret) {
  ASSERT_EQ(setenv("FERRY_STORE_SECRET", "launcher-test-secret", 1), 0);
  auto [code, out] =
      RunLauncher({"--nproc", "3", "--node_relay", "--timeout_s", "100", "--",
                   RunfilePath("examples/rpc_tensors/rpc_tensors")});
  unsetenv("FERRY_STORE_SECRET");
  ASSERT_EQ(code, 0) << out;
  EXPECT_TRUE(absl::StrContains(out, "store relay for local workers on "))
      << out;
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(
        absl::StrContains(out, absl::StrCat("[", r, "]: worker", r, ": done")))
        << out;
  }
}

TEST(FerryRun, OneFailingRankStopsTheJobWithItsExitCode) {
  absl::Time start = absl::Now();
  auto [code, out] =
      RunLauncher({"--nproc", "3", "--grace_s", "2", "--", "/bin/sh", "-c",
                   "if [ \"$RANK\" = 1 ]; then exit 7; fi; exec sleep 60"});
  EXPECT_EQ(code, 7) << out;
  EXPECT_TRUE(absl::StrContains(out, "rank 1 failed with exit code 7")) << out;
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
}

TEST(FerryRun, MissingProgramIsAnError) {
  auto [code, out] =
      RunLauncher({"--nproc", "1", "--", "/nonexistent/program"});
  EXPECT_NE(code, 0) << out;
  EXPECT_TRUE(absl::StrContains(out, "cannot exec /nonexistent/program"))
      << out;
}

// The main job: 3 Ferry workers rendezvous through the launcher's store,
// compute matmul shards over gRPC (checked against a local result by rank 0),
// greet each other in a ring and shut down together.
TEST(FerryRun, RunsTheMainJob) {
  auto [code, out] =
      RunLauncher({"--nproc", "3", "--timeout_s", "100", "--",
                   RunfilePath("examples/rpc_tensors/rpc_tensors")});
  ASSERT_EQ(code, 0) << out;
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(absl::StrContains(
        out, absl::StrCat("shard ", r, " of x @ W from worker", r)))
        << out;
    EXPECT_TRUE(absl::StrContains(
        out,
        absl::StrCat("[", r, "]: worker", r, " -> worker", (r + 1) % 3,
                     ": worker", (r + 1) % 3, " got worker", r, "'s tensor")))
        << out;
    EXPECT_TRUE(
        absl::StrContains(out, absl::StrCat("[", r, "]: worker", r, ": done")))
        << out;
  }
  EXPECT_FALSE(absl::StrContains(out, "matches local: NO")) << out;
  const std::vector<std::string> pieces =
      absl::StrSplit(out, "matches local: yes");
  EXPECT_EQ(pieces.size(), 4u) << out;  // One per shard.
}

}  // namespace
}  // namespace ferry
