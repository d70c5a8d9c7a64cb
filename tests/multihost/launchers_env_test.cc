// env:// under existing launchers, without RANK / WORLD_SIZE: a real
// OpenMPI mpirun (skipped where it is not installed) and the variables Slurm's
// srun sets (no Slurm daemon needed). Each runs job_main: RPC, a Gloo
// all-reduce and the store across 3 processes, and checks the log line that
// names the launcher.
#include <unistd.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "ferry/tests/util/held_port.h"
#include "ferry/tests/util/subprocess.h"

namespace ferry {
namespace {

using testutil::HeldPort;
using testutil::RunCommand;
using testutil::RunfilePath;
using testutil::SpawnOptions;
using testutil::Subprocess;

constexpr int kWorld = 3;

void ExpectJobRan(const std::string& out, const std::string& source) {
  for (int rank = 0; rank < kWorld; ++rank) {
    for (const char* step :
         {"rpc ok", "allreduce ok sum=6", "store ok", "done"}) {
      EXPECT_TRUE(
          absl::StrContains(out, absl::StrCat("rank ", rank, ": ", step)))
          << "rank " << rank << " missing '" << step << "' in\n"
          << out;
    }
  }
  EXPECT_TRUE(absl::StrContains(out, absl::StrCat("from ", source, ";")))
      << "no log line naming " << source << " in\n"
      << out;
}

std::string FindMpirun() {
  for (const char* p : {"/usr/bin/mpirun", "/usr/local/bin/mpirun"}) {
    if (access(p, X_OK) == 0) return p;
  }
  return "";
}

TEST(LauncherEnv, OpenMpiMpirunRunsTheJob) {
  const std::string mpirun = FindMpirun();
  if (mpirun.empty()) {
    GTEST_SKIP() << "mpirun not installed (Debian package openmpi-bin; "
                    "tools/setup installs it)";
  }
  HeldPort rpc_port, c10d_port;
  ASSERT_NE(rpc_port.port(), 0);
  ASSERT_NE(c10d_port.port(), 0);
  // Root in CI: mpirun refuses root without --allow-run-as-root.
  auto [code, out] = RunCommand(
      {mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
       "-np", std::to_string(kWorld), "-x", "MASTER_ADDR=127.0.0.1", "-x",
       absl::StrCat("MASTER_PORT=", rpc_port.port()), "-x",
       "FERRY_LOG_LEVEL=info", RunfilePath("tests/multihost/job_main"),
       absl::StrCat("--c10d_master_port=", c10d_port.port())},
      {}, absl::Seconds(90));
  ASSERT_EQ(code, 0) << out;
  ExpectJobRan(out, "OpenMPI");
}

TEST(LauncherEnv, SlurmVariablesRunTheJob) {
  HeldPort rpc_port, c10d_port;
  ASSERT_NE(rpc_port.port(), 0);
  ASSERT_NE(c10d_port.port(), 0);
  std::vector<std::unique_ptr<Subprocess>> procs;
  for (int rank = 0; rank < kWorld; ++rank) {
    // What srun -n 3 sets on one node; the store host comes from the step's
    // node list (a bracket range), as MASTER_ADDR is not set.
    SpawnOptions o = SpawnOptions().CaptureStdout().MergeStderr();
    o.env = {{"SLURM_PROCID", std::to_string(rank)},
             {"SLURM_NTASKS", std::to_string(kWorld)},
             {"SLURM_LOCALID", std::to_string(rank)},
             {"SLURM_STEP_NODELIST", "127.0.0.[1-2]"},
             {"SLURM_JOB_ID", "4242"},
             {"MASTER_PORT", std::to_string(rpc_port.port())},
             {"FERRY_LOG_LEVEL", "info"}};
    auto p = Subprocess::Spawn(
        {RunfilePath("tests/multihost/job_main"),
         absl::StrCat("--c10d_master_port=", c10d_port.port())},
        o);
    ASSERT_TRUE(p.ok()) << p.status();
    procs.push_back(*std::move(p));
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(90);
  std::string all;
  for (int rank = 0; rank < kWorld; ++rank) {
    std::string out = procs[rank]->ReadAll(deadline);
    absl::StatusOr<int> code = procs[rank]->Wait(deadline);
    EXPECT_TRUE(code.ok() && *code == 0) << "rank " << rank << ": " << out;
    all += out;
  }
  ExpectJobRan(all, "Slurm");
  EXPECT_TRUE(absl::StrContains(all, "from first host of SLURM_STEP_NODELIST"))
      << all;
}

}  // namespace
}  // namespace ferry
