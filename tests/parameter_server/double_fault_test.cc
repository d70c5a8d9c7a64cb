// Two faults in one run of the parameter-server job (--fault_tolerant with
// --checkpoint_dir, under ferry_run --elastic_ranks for the trainers and
// --restart_ranks for the servers): trainer0 SIGKILLs itself at iteration
// 60, and ps1 at its applied step 200, a few steps later. Both servers
// release the dead trainer; ps1 is restarted, restores its checkpoint and
// rejoins under its name (it finds trainer0 dead in the table it joins); the
// two other trainers wait for ps1, go on and reach the target; the job
// exits 0. Real processes; every wait is on a process's exit (ferry_run's
// --timeout_s and RunCommand's limit bound it).
#include <cstdlib>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "ferry/tests/util/subprocess.h"

namespace ferry {
namespace {

using testutil::RunCommand;
using testutil::RunfilePath;

// The line of `out` that contains `needle` ("" when none).
std::string LineWith(const std::string& out, const std::string& needle) {
  const size_t at = out.find(needle);
  if (at == std::string::npos) return "";
  const size_t begin = out.rfind('\n', at);
  const size_t from = begin == std::string::npos ? 0 : begin + 1;
  return out.substr(from, out.find('\n', at) - from);
}

TEST(DoubleFault, ATrainerAndAServerDieInOneRunAndTheJobCompletes) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = absl::StrCat(tmp ? tmp : "/tmp", "/double_fault");
  auto [code, out] = RunCommand(
      {RunfilePath("tools/launcher/ferry_run"), "--nproc=5", "--timeout_s=60",
       "--elastic_ranks=2-4",  // The trainers.
       "--restart_ranks=0-1",  // The servers.
       "--rank_restarts=1", "--",
       RunfilePath("examples/parameter_server/parameter_server"),
       "--servers=2", "--trainers=3", "--iterations=150", "--log_every=50",
       "--vocab=200", "--target_accuracy=0.85", "--fault_tolerant",
       "--server_wait_s=30", absl::StrCat("--checkpoint_dir=", dir),
       "--checkpoint_every=10", "--kill_trainer=0", "--kill_at_step=60",
       "--kill_server=1", "--kill_server_at_step=200"},
      {}, absl::Seconds(90));
  ASSERT_EQ(code, 0) << out;
  // Both kills happened and the launcher handled each by its policy.
  EXPECT_TRUE(absl::StrContains(
      out, "trainer0: killing itself (SIGKILL) in iteration 60"))
      << out;
  EXPECT_TRUE(absl::StrContains(
      out, "ps1: killing itself (SIGKILL) at applied step 200"))
      << out;
  EXPECT_TRUE(absl::StrContains(out, ": reported (elastic rank), the job "
                                     "goes on"))
      << out;
  EXPECT_TRUE(absl::StrContains(out, ": restarted 1 of 1 (new pid "))
      << out;
  // The first instance of each server released the dead trainer.
  for (int m = 0; m < 2; ++m) {
    const std::string line =
        LineWith(out, absl::StrCat("[", m, "]: ps", m, ": trainer0 (id "));
    ASSERT_FALSE(line.empty()) << "ps" << m << "\n" << out;
    EXPECT_TRUE(absl::StrContains(
        line, "it still holds here: 0 RRef forks, 0 autograd contexts, "
              "0 optimizers"))
        << line;
  }
  // The restarted ps1 restored a checkpoint and rejoined under its name.
  std::smatch restored;
  ASSERT_TRUE(std::regex_search(
      out, restored,
      std::regex(R"(\[1\]: ps1: restarted \(FERRY_RUN_RESTART=1\): )"
                 R"(restored applied step (\d+))")))
      << out;
  const int r = std::atoi(restored[1].str().c_str());
  EXPECT_LE(r, 200);
  EXPECT_EQ(r % 10, 0) << r;
  EXPECT_TRUE(absl::StrContains(out, "[1]: ps1: rejoined the group under its "
                                     "name as worker "))
      << out;
  // The two other trainers recovered ps1 and reached the target.
  for (int t : {1, 2}) {
    EXPECT_TRUE(absl::StrContains(
        out, absl::StrCat("trainer", t, ": ps1 restarted: recovered in "
                          "iteration ")))
        << "trainer" << t << "\n" << out;
    EXPECT_TRUE(absl::StrContains(
        out, absl::StrCat("trainer", t, " done: 150 iterations")))
        << "trainer" << t << "\n" << out;
  }
  EXPECT_FALSE(absl::StrContains(out, "trainer0 done:")) << out;
  EXPECT_FALSE(absl::StrContains(out, "NOT reached")) << out;
  // What each server's Admin inspector shows at the end: both count one
  // dead trainer; the restarted ps1 its generation and restored step.
  const std::string ps0 =
      LineWith(out, "[0]: ps0: inspect parameter_server: server name=ps0 ");
  EXPECT_TRUE(absl::StrContains(ps0, " restart=0 ")) << ps0;
  EXPECT_TRUE(absl::StrContains(ps0, " trainers_left=2 trainers_died=1"))
      << ps0;
  const std::string ps1 =
      LineWith(out, "[1]: ps1: inspect parameter_server: server name=ps1 ");
  EXPECT_TRUE(absl::StrContains(ps1, " restart=1 ")) << ps1;
  EXPECT_TRUE(absl::StrContains(ps1, absl::StrCat(" restored_step=", r, " ")))
      << ps1;
  EXPECT_TRUE(absl::StrContains(ps1, " trainers_died=1")) << ps1;
}

}  // namespace
}  // namespace ferry
