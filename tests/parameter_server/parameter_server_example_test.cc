// examples/parameter_server under ferry_run: the two-node seed example's loss
// falls, and the parameter-server job (servers + asynchronous trainers,
// distributed autograd, DistributedOptimizer) reaches its held-out accuracy
// at a small size, as tools/run_job runs it at full size.
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "tests/util/subprocess.h"

namespace ferry {
namespace {

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

// A size the flags cannot make: the job refuses it before joining, naming
// the arithmetic, instead of waiting for workers that never come.
TEST(ParameterServerExample, WorldSizeMismatchIsAClearError) {
  auto [code, out] = Launch(3, "examples/parameter_server/parameter_server",
                            {"--servers=2", "--trainers=2"});
  EXPECT_NE(code, 0) << out;
  EXPECT_TRUE(absl::StrContains(out, "--servers=2 --trainers=2 need 4")) << out;
}

}  // namespace
}  // namespace ferry
