// The parameter-server job's server death path (--fault_tolerant with
// --checkpoint_dir) under ferry_run --restart_ranks: in each trial a server
// (ps1 in even trials, ps0, which also owns the dense head, in odd ones)
// SIGKILLs itself (kill(getpid(), SIGKILL), --kill_server/
// --kill_server_at_step) right after applying a step drawn from a seeded
// generator; the launcher restarts it alone (FERRY_RUN_RESTART=1), it
// restores its latest valid checkpoint, rejoins under its name, every
// trainer waits for it, re-creates its optimizer there and goes on, and
// the job ends with both trainers at the target accuracy.
//
// What is checked, from the processes' logs (real processes; every wait is
// on a process's exit, bounded by ferry_run's --timeout_s and RunCommand's
// limit):
// - the kill happened at the drawn applied step, the launcher restarted
//   the victim's rank once;
// - the restored applied-step counter R is a checkpoint ps1 took (same
//   counter and same parameter fingerprint as a "checkpoint ... taken"
//   line), at most the kill step K, at least the newest checkpoint written
//   before the kill;
// - no update applied twice or lost beyond the checkpoint: the restarted
//   server applied exactly the steps the trainers completed on it (the sum
//   of their "steps completed on its new instance"); its dead instance
//   applied every step the trainers completed before (K >= 2 * iterations -
//   that sum + 1, the +1 being the step it died in) and at most the failed
//   steps more; the other server, never killed, applied every completed
//   step once (2 * iterations) plus at most the failed steps (whose part
//   there may have been applied before the victim's death failed them).
#include <cstdio>
#include <cstdlib>
#include <random>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "ferry/tests/util/subprocess.h"

namespace ferry {
namespace {

using testutil::RunCommand;
using testutil::RunfilePath;

constexpr int kTrials = 16;
constexpr int kIterations = 150;
constexpr int kTrainers = 2;
constexpr int kEvery = 10;  // --checkpoint_every
constexpr int kAllSteps = kTrainers * kIterations;

std::pair<int, std::string> RunTrial(int trial, int victim, int kill_at) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir =
      absl::StrCat(tmp ? tmp : "/tmp", "/server_kill_trial", trial);
  std::vector<std::string> argv = {
      RunfilePath("tools/launcher/ferry_run"),
      "--nproc=4",
      "--timeout_s=60",
      "--elastic_ranks=2-3",  // The trainers.
      "--restart_ranks=0-1",  // The servers.
      "--rank_restarts=1",
      "--",
      RunfilePath("examples/parameter_server/parameter_server"),
      "--servers=2",
      absl::StrCat("--trainers=", kTrainers),
      absl::StrCat("--iterations=", kIterations),
      "--log_every=50",
      "--vocab=200",
      "--target_accuracy=0.85",
      "--fault_tolerant",
      "--server_wait_s=30",
      absl::StrCat("--checkpoint_dir=", dir),
      absl::StrCat("--checkpoint_every=", kEvery),
      absl::StrCat("--kill_server=", victim),
      absl::StrCat("--kill_server_at_step=", kill_at)};
  return RunCommand(std::move(argv), {}, absl::Seconds(90));
}

// The first match of `re` in `out` (its groups), or empty.
std::smatch Find(const std::string& out, const std::string& re) {
  std::smatch m;
  std::regex_search(out, m, std::regex(re));
  return m;
}

int CountMatches(const std::string& out, const std::string& re) {
  const std::regex r(re);
  return static_cast<int>(std::distance(
      std::sregex_iterator(out.begin(), out.end(), r), std::sregex_iterator()));
}

TEST(ServerKill, AKilledServerRestoresItsCheckpointAndTheJobCompletes) {
  std::mt19937 rng(20261127);  // The trials' seed: the same draws each run.
  std::uniform_int_distribution<int> pick_step(3 * kEvery, kAllSteps - 60);
  const absl::Time begin = absl::Now();
  for (int trial = 0; trial < kTrials; ++trial) {
    const int kill_at = pick_step(rng);
    const int victim = trial % 2 == 0 ? 1 : 0;
    const int other = 1 - victim;
    const std::string v = absl::StrCat("ps", victim);
    // "[R]: psR: " (ferry_run prefixes a line with its worker's rank).
    const std::string vp = absl::StrCat(R"(\[)", victim, R"(\]: )", v, ": ");
    SCOPED_TRACE(absl::StrCat("trial ", trial, ": ", v,
                              " killed at its applied step ", kill_at));
    const absl::Time t0 = absl::Now();
    auto [code, out] = RunTrial(trial, victim, kill_at);
    ASSERT_EQ(code, 0) << out;

    // The kill (a real SIGKILL, seen by the launcher) and the restart.
    std::smatch killed = Find(
        out, absl::StrCat(vp, R"(killing itself \(SIGKILL\) at )"
                              R"(applied step )",
                          kill_at, R"( \(newest checkpoint written: step )"
                                   R"((-?\d+)\))"));
    ASSERT_FALSE(killed.empty()) << out;
    const int written = std::atoi(killed[1].str().c_str());
    EXPECT_TRUE(absl::StrContains(out, "died with signal 9 (Killed)")) << out;
    EXPECT_TRUE(absl::StrContains(out, "FERRY_RUN_RESTART=1")) << out;

    // The restore: a checkpoint ps1 took, not older than one written
    // before the kill.
    std::smatch restored =
        Find(out, vp + R"(restarted \(FERRY_RUN_RESTART=1\): restored )"
                       R"(applied step (\d+) from (\S+) \(fingerprint (\S+)\))");
    ASSERT_FALSE(restored.empty()) << out;
    const int r = std::atoi(restored[1].str().c_str());
    EXPECT_TRUE(absl::EndsWith(restored[2].str(), "/" + v + ".ckpt") ||
                absl::EndsWith(restored[2].str(), "/" + v + ".prev.ckpt"))
        << restored[0];
    EXPECT_LE(r, kill_at);
    EXPECT_GE(r, written);
    EXPECT_EQ(r % kEvery, 0) << r;
    EXPECT_TRUE(absl::StrContains(
        out, absl::StrCat(v, ": checkpoint of applied step ", r,
                          " taken (fingerprint ", restored[3].str(), ")")))
        << "restored step " << r << " fingerprint " << restored[3] << "\n"
        << out;
    EXPECT_FALSE(
        Find(out, vp + R"(rejoined the group under its name as worker \d+)")
            .empty())
        << out;
    // The restarted instance's Admin inspector: its generation and the step
    // it restored.
    EXPECT_FALSE(
        Find(out, absl::StrCat(vp, "inspect parameter_server: server name=", v,
                               R"( restart=1 applied_step=\d+ restored_step=)",
                               r, " trainers_left="))
            .empty())
        << out;

    // The trainers: each waited for ps1 and re-created its optimizer there,
    // finished every iteration and reached the target.
    int on_new = 0;
    for (int t = 0; t < kTrainers; ++t) {
      std::smatch rec = Find(
          out, absl::StrCat(R"(trainer)", t, ": ", v,
                            R"( restarted: recovered in iteration )"
                            R"(\d+, (\d+) steps completed on its new )"
                            R"(instance)"));
      ASSERT_FALSE(rec.empty()) << "trainer" << t << "\n" << out;
      on_new += std::atoi(rec[1].str().c_str());
      EXPECT_TRUE(absl::StrContains(
          out, absl::StrCat("trainer", t, " done: ", kIterations,
                            " iterations")))
          << out;
    }
    const int failed_steps =
        CountMatches(out, absl::StrCat(": ", v, R"( \(id \d+\) is gone \()"));
    EXPECT_GE(failed_steps, 1) << out;
    EXPECT_EQ(CountMatches(out, "target 0.85 reached"), kTrainers) << out;
    EXPECT_FALSE(absl::StrContains(out, "NOT reached")) << out;

    // Applied-step accounting.
    std::smatch end1 =
        Find(out, vp + R"(applied-step counter (\d+) at the end )"
                       R"(\(restored (\d+), (\d+) applied by this process\))");
    ASSERT_FALSE(end1.empty()) << out;
    EXPECT_EQ(std::atoi(end1[2].str().c_str()), r);
    const int since = std::atoi(end1[3].str().c_str());
    EXPECT_EQ(since, on_new) << "the restarted " << v << " applied " << since
                             << " steps, the trainers completed " << on_new
                             << " on it";
    const int before = kAllSteps - on_new;  // Completed on the old ps1.
    EXPECT_GE(kill_at, before + 1);
    EXPECT_LE(kill_at, before + failed_steps);
    std::smatch end0 =
        Find(out, absl::StrCat(R"(\[)", other, R"(\]: ps)", other,
                               R"(: applied-step counter (\d+) at the end )"));
    ASSERT_FALSE(end0.empty()) << out;
    const int a0 = std::atoi(end0[1].str().c_str());
    EXPECT_GE(a0, kAllSteps);
    EXPECT_LE(a0, kAllSteps + failed_steps);
    std::printf(
        "trial %d: %s killed at applied step %d, restored %d (newest written "
        "before the kill: %d): %d steps lost; %d failed trainer steps; "
        "%.1f s\n",
        trial, v.c_str(), kill_at, r, written, kill_at - r, failed_steps,
        absl::ToDoubleSeconds(absl::Now() - t0));
    if (HasFailure()) return;  // One trial's output is enough to read.
  }
  std::printf("%d trials in %.1f s\n", kTrials,
              absl::ToDoubleSeconds(absl::Now() - begin));
}

}  // namespace
}  // namespace ferry
