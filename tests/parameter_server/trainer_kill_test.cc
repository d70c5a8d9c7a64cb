// The parameter-server job's fault-tolerant mode (--fault_tolerant) under
// ferry_run --elastic_ranks: in each trial one trainer SIGKILLs itself
// (kill(getpid(), SIGKILL), --kill_trainer/--kill_at_step) at a step drawn
// from a seeded generator: in even trials between its forward and backward
// passes, in odd ones a drawn 1..20000 us after the step began
// (--kill_after_us: in its forward, its backward or a later step); the
// launcher reports it and goes on, both servers find it dead and release its
// autograd contexts, optimizer and RRef forks (their log line names the
// trainer, its last step and what was released), the other trainer reaches
// the target accuracy and the job exits 0. Real processes; every wait is on
// a process's exit (ferry_run's --timeout_s and RunCommand's limit bound it).
#include <cstdlib>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "ferry/tests/util/subprocess.h"

namespace ferry {
namespace {

using testutil::RunCommand;
using testutil::RunfilePath;

constexpr int kTrials = 10;
constexpr int kIterations = 150;

std::pair<int, std::string> RunTrial(int victim, int step, int after_us) {
  std::vector<std::string> argv = {
      RunfilePath("tools/launcher/ferry_run"),
      "--nproc=4",
      "--timeout_s=60",
      "--elastic_ranks=2-3",  // The trainers.
      "--",
      RunfilePath("examples/parameter_server/parameter_server"),
      "--servers=2",
      "--trainers=2",
      absl::StrCat("--iterations=", kIterations),
      "--log_every=50",
      "--vocab=200",
      "--target_accuracy=0.85",
      "--fault_tolerant",
      absl::StrCat("--kill_trainer=", victim),
      absl::StrCat("--kill_at_step=", step),
      absl::StrCat("--kill_after_us=", after_us)};
  return RunCommand(std::move(argv), {}, absl::Seconds(90));
}

TEST(TrainerKill, AKilledTrainerIsReleasedAndTheJobReachesItsAccuracy) {
  std::mt19937 rng(20261127);  // The trials' seed: the same draws each run.
  std::uniform_int_distribution<int> pick_victim(0, 1);
  std::uniform_int_distribution<int> pick_step(1, kIterations - 10);
  std::uniform_int_distribution<int> pick_delay(1, 20000);
  for (int trial = 0; trial < kTrials; ++trial) {
    const int victim = pick_victim(rng);
    const int step = pick_step(rng);
    const int delay = pick_delay(rng);
    const int after_us = trial % 2 == 1 ? delay : 0;
    const int survivor = 1 - victim;
    SCOPED_TRACE(absl::StrCat("trial ", trial, ": trainer", victim,
                              " killed in iteration ", step,
                              after_us > 0 ? absl::StrCat(" after ", after_us,
                                                          " us")
                                           : " after its forward pass"));
    auto [code, out] = RunTrial(victim, step, after_us);
    ASSERT_EQ(code, 0) << out;
    const std::string dead = absl::StrCat("trainer", victim);
    // The kill happened (a real SIGKILL, seen by the launcher)...
    EXPECT_TRUE(absl::StrContains(
        out, after_us == 0
                 ? absl::StrCat("]: ", dead, ": killing itself (SIGKILL) in "
                                "iteration ", step, " at unix_us ")
                 : absl::StrCat("]: ", dead, ": killing itself (SIGKILL) ",
                                after_us, " us into iteration ", step,
                                " at unix_us ")))
        << out;
    EXPECT_TRUE(absl::StrContains(
        out, absl::StrCat("rank ", 2 + victim, " (pid ")))
        << out;
    EXPECT_TRUE(absl::StrContains(out, ") died with signal 9 (Killed) at "))
        << out;
    EXPECT_TRUE(absl::StrContains(
        out, "all 4 workers finished (1 failure(s) handled by the policy)"))
        << out;
    EXPECT_FALSE(absl::StrContains(out, absl::StrCat(dead, " done:"))) << out;
    // ...each server released what it held of the dead trainer: its step
    // count there is exactly the iterations it completed, its context of
    // the interrupted step and its optimizer went, nothing of it is left.
    for (int m = 0; m < 2; ++m) {
      const std::string prefix =
          absl::StrCat("[", m, "]: ps", m, ": ", dead, " (id ");
      const size_t at = out.find(prefix);
      ASSERT_NE(at, std::string::npos) << prefix << "\n" << out;
      const std::string line = out.substr(at, out.find('\n', at) - at);
      // Its steps here: exactly those before the interrupted one, or (a
      // kill at a time) at least those.
      const size_t s_at = line.find(") died at its step ");
      ASSERT_NE(s_at, std::string::npos) << line;
      const int steps = std::atoi(line.c_str() + s_at + 19);
      if (after_us == 0) {
        EXPECT_EQ(steps, step - 1) << line;
        // The interrupted step's context was alive here.
        EXPECT_FALSE(absl::StrContains(line, "released 0 autograd contexts"))
            << line;
      } else {
        EXPECT_GE(steps, step - 1) << line;
        EXPECT_LT(steps, kIterations) << line;
      }
      EXPECT_TRUE(absl::StrContains(line, " autograd contexts, 1 optimizers"))
          << line;
      EXPECT_TRUE(absl::StrContains(
          line,
          "it still holds here: 0 RRef forks, 0 autograd contexts, "
          "0 optimizers"))
          << line;
      EXPECT_TRUE(absl::StrContains(
          out, absl::StrCat("[", m, "]: ps", m,
                            ": all 2 trainers are gone (1 left, 1 died)")))
          << out;
      // The same, as the Admin service's Inspect shows it to an operator.
      const std::string inspect =
          absl::StrCat("[", m, "]: ps", m,
                       ": inspect parameter_server: server name=ps", m,
                       " restart=0 applied_step=");
      const size_t i_at = out.find(inspect);
      ASSERT_NE(i_at, std::string::npos) << inspect << "\n" << out;
      const std::string row = out.substr(i_at, out.find('\n', i_at) - i_at);
      EXPECT_TRUE(absl::StrContains(
          row, " restored_step=0 trainers_left=1 trainers_died=1"))
          << row;
    }
    // The other trainer did not notice (it finished every step) and
    // reached the target.
    const std::string alive = absl::StrCat("trainer", survivor);
    EXPECT_TRUE(absl::StrContains(
        out, absl::StrCat(alive, " done: ", kIterations, " iterations")))
        << out;
    EXPECT_TRUE(absl::StrContains(out, "target 0.85 reached")) << out;
    EXPECT_FALSE(absl::StrContains(out, "NOT reached")) << out;
    if (HasFailure()) return;  // One trial's output is enough to read.
  }
}

}  // namespace
}  // namespace ferry
