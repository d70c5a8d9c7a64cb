// examples/parameter_server under ferry_run: the two-node seed example's loss
// falls, and the parameter-server job (servers + asynchronous trainers,
// distributed autograd, DistributedOptimizer) reaches its held-out accuracy
// at a small size, as tools/run_job runs it at full size, also with an
// elastic trainer that joins the running job and leaves before its end.
#include <unistd.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "ferry/tests/util/held_port.h"
#include "ferry/tests/util/subprocess.h"

namespace ferry {
namespace {

using testutil::HeldPort;
using testutil::RunCommand;
using testutil::RunfilePath;

std::pair<int, std::string> Launch(int nproc, const std::string& program,
                                   std::vector<std::string> flags) {
  std::vector<std::string> argv = {RunfilePath("tools/launcher/ferry_run"),
                                   "--nproc",
                                   absl::StrCat(nproc),
                                   "--timeout_s",
                                   "240",
                                   "--",
                                   RunfilePath(program)};
  argv.insert(argv.end(), flags.begin(), flags.end());
  return RunCommand(std::move(argv), {}, absl::Minutes(5));
}

// The numbers after "loss " on node A's iteration lines, in order.
std::vector<double> Losses(const std::string& out) {
  std::vector<double> losses;
  for (absl::string_view line : absl::StrSplit(out, '\n')) {
    if (!absl::StartsWith(line, "[0]: iteration ")) continue;
    const size_t at = line.find(" loss ");
    if (at == absl::string_view::npos) continue;
    losses.push_back(std::stod(std::string(line.substr(at + 6))));
  }
  return losses;
}

TEST(ParameterServerExample, SeedExampleLossFalls) {
  auto [code, out] =
      Launch(2, "examples/parameter_server/seed", {"--iterations=20"});
  ASSERT_EQ(code, 0) << out;
  const std::vector<double> losses = Losses(out);
  ASSERT_EQ(losses.size(), 20u) << out;
  EXPECT_LT(losses.back(), 0.5 * losses.front()) << out;
  EXPECT_TRUE(absl::StrContains(out, "[0]: loss fell from")) << out;
  EXPECT_FALSE(absl::StrContains(out, "[1]: iteration")) << out;  // A only.
}

TEST(ParameterServerExample, TwoServersTwoTrainersReachTheirAccuracy) {
  auto [code, out] =
      Launch(4, "examples/parameter_server/parameter_server",
             {"--servers=2", "--trainers=2", "--iterations=150",
              "--log_every=50", "--vocab=200", "--target_accuracy=0.85"});
  ASSERT_EQ(code, 0) << out;
  EXPECT_TRUE(absl::StrContains(out,
                                "[0]: ps0: owns embedding rows [0, 100) "
                                "and the dense head"))
      << out;
  EXPECT_TRUE(absl::StrContains(out,
                                "[1]: ps1: owns embedding rows [100, "
                                "200)\n"))
      << out;
  for (int t = 0; t < 2; ++t) {
    const std::string me = absl::StrCat("[", t + 2, "]: trainer", t);
    EXPECT_TRUE(absl::StrContains(out, absl::StrCat(me, " iteration 150 loss")))
        << out;
    EXPECT_TRUE(
        absl::StrContains(out, absl::StrCat(me, " done: 150 iterations")))
        << out;
  }
  const std::vector<std::string> reached =
      absl::StrSplit(out, "target 0.85 reached");
  EXPECT_EQ(reached.size(), 3u) << out;  // One per trainer.
}

// An elastic trainer joins the running job once ps0 served 40 forward
// passes, makes 30 steps through its own DistributedOptimizer and leaves;
// both servers' worker tables show it appear and disappear, the steps
// it asked for carried gradients (so they changed the parameters), nothing
// of it stays on the servers, and the fixed trainers still reach the
// target. Every wait is on state (the store key, the membership, the
// servers' counts), bounded by ferry_run's --timeout_s.
TEST(ParameterServerExample, ElasticTrainerJoinsStepsAndLeaves) {
  auto [code, out] = Launch(
      5, "examples/parameter_server/parameter_server",
      {"--servers=2", "--trainers=2", "--iterations=150", "--log_every=50",
       "--vocab=200", "--target_accuracy=0.85", "--elastic_trainers=1",
       "--join_after=40", "--elastic_iterations=30", "--timeout_s=200"});
  ASSERT_EQ(code, 0) << out;
  const size_t open = out.find(
      "[0]: ps0: elastic trainers may join (40 forward passes "
      "served)\n");
  ASSERT_NE(open, std::string::npos) << out;
  for (int m = 0; m < 2; ++m) {
    const std::string me = absl::StrCat("[", m, "]: ps", m, ": ");
    const size_t joined =
        out.find(absl::StrCat(me,
                              "elastic0 joined (id 4); workers: ps0 ps1 "
                              "trainer0 trainer1 elastic0\n"));
    const size_t left = out.find(
        absl::StrCat(me,
                     "elastic0 (id 4) left after 30 optimizer steps here "
                     "(30 with gradients); it still holds here: 0 RRef "
                     "forks, 0 autograd contexts, 0 optimizers; workers: "
                     "ps0 ps1 trainer0 trainer1\n"));
    ASSERT_NE(joined, std::string::npos) << me << out;
    ASSERT_NE(left, std::string::npos) << me << out;
    EXPECT_LT(open, joined) << out;
    EXPECT_LT(joined, left) << out;
  }
  EXPECT_TRUE(absl::StrContains(
      out, "[4]: elastic0: joined the running job as worker 4 (world size 5)"))
      << out;
  EXPECT_TRUE(absl::StrContains(out, "[4]: elastic0 iteration 30 loss")) << out;
  EXPECT_TRUE(absl::StrContains(out, "[4]: elastic0 done: 30 iterations"))
      << out;
  EXPECT_TRUE(absl::StrContains(out, "[4]: elastic0: left the job\n")) << out;
  for (int t = 0; t < 2; ++t) {
    EXPECT_TRUE(absl::StrContains(out, absl::StrCat("[", t + 2, "]: trainer", t,
                                                    " done: 150 iterations")))
        << out;
  }
  const std::vector<std::string> reached =
      absl::StrSplit(out, "target 0.85 reached");
  EXPECT_EQ(reached.size(), 3u) << out;  // The fixed trainers only.
}

// A size the flags cannot make: the job refuses it before joining, naming
// the arithmetic, instead of waiting for workers that never come.
TEST(ParameterServerExample, WorldSizeMismatchIsAClearError) {
  auto [code, out] = Launch(3, "examples/parameter_server/parameter_server",
                            {"--servers=2", "--trainers=2"});
  EXPECT_NE(code, 0) << out;
  EXPECT_TRUE(absl::StrContains(out, "--servers=2 --trainers=2 need 4")) << out;
  auto [elastic_code, elastic_out] =
      Launch(4, "examples/parameter_server/parameter_server",
             {"--servers=2", "--trainers=2", "--elastic_trainers=1"});
  EXPECT_NE(elastic_code, 0) << elastic_out;
  EXPECT_TRUE(absl::StrContains(
      elastic_out, "--servers=2 --trainers=2 --elastic_trainers=1 need 5"))
      << elastic_out;
}

// The CPU binary has no CUDA: --device=cuda is refused at once, naming the
// binary that has it (examples/parameter_server:parameter_server_cuda).
TEST(ParameterServerExample, DeviceCudaNeedsTheCudaBinary) {
  auto [code, out] = Launch(3, "examples/parameter_server/parameter_server",
                            {"--servers=1", "--trainers=2", "--device=cuda",
                             "--server_devices=cpu"});
  EXPECT_NE(code, 0) << out;
  EXPECT_TRUE(absl::StrContains(
      out, "this parameter_server binary is built without CUDA; "
           "--device=cuda needs //examples/parameter_server:"
           "parameter_server_cuda"))
      << out;
}

// The same job under Open MPI's mpirun, unchanged: rank and world size come
// from env://, which reads OMPI_COMM_WORLD_RANK / _SIZE (no RANK set), and
// rank 0 serves the store at MASTER_ADDR:MASTER_PORT.
TEST(ParameterServerExample, RunsUnderMpirun) {
  std::string mpirun;
  for (const char* p : {"/usr/bin/mpirun", "/usr/local/bin/mpirun"}) {
    if (access(p, X_OK) == 0) mpirun = p;
  }
  if (mpirun.empty()) {
    GTEST_SKIP() << "mpirun not installed (Debian package openmpi-bin; "
                    "tools/setup installs it)";
  }
  HeldPort port;
  ASSERT_NE(port.port(), 0);
  // Root in CI: mpirun refuses root without --allow-run-as-root.
  auto [code, out] = RunCommand(
      {mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
       "-np", "3", "-x", "MASTER_ADDR=127.0.0.1", "-x",
       absl::StrCat("MASTER_PORT=", port.port()),
       RunfilePath("examples/parameter_server/parameter_server"),
       "--servers=1", "--trainers=2", "--iterations=60", "--log_every=30",
       "--vocab=100", "--target_accuracy=0.5"},
      {}, absl::Minutes(4));
  ASSERT_EQ(code, 0) << out;
  for (int t = 0; t < 2; ++t) {
    EXPECT_TRUE(absl::StrContains(
        out, absl::StrCat("trainer", t, " done: 60 iterations")))
        << out;
  }
  EXPECT_TRUE(absl::StrContains(out, "ps0: owns embedding rows [0, 100)"))
      << out;
}

}  // namespace
}  // namespace ferry

