// examples/ddp under `ferry_run --nproc N`: trains, reports progress from
// rank 0 only, and ends with parameters bit-identical across ranks.
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace {

std::string Runfile(const std::string& path) {
  return absl::StrCat(std::getenv("TEST_SRCDIR"), "/",
                      std::getenv("TEST_WORKSPACE"), "/", path);
}

// Runs a shell command, returning (exit code, stdout+stderr).
std::pair<int, std::string> RunShell(const std::string& cmd) {
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

std::string Job(int nproc, const std::string& flags) {
  return absl::StrCat(Runfile("tools/launcher/ferry_run"), " --nproc ", nproc,
                      " --timeout_s 120 -- ", Runfile("examples/ddp/ddp"),
                      " --steps=120 --log_every=40 ", flags);
}

TEST(DdpExample, TwoRanksTrainAndEndBitIdentical) {
  auto [code, out] = RunShell(Job(2, ""));
  EXPECT_EQ(code, 0) << out;
  EXPECT_TRUE(absl::StrContains(out, "[0]: step 120 loss")) << out;
  EXPECT_FALSE(absl::StrContains(out, "[1]: step")) << out;  // Rank 0 only.
  EXPECT_TRUE(absl::StrContains(out, "[0]: parameters bit-identical across 2"))
      << out;
}

TEST(DdpExample, FourRanksWithFp16Compression) {
  auto [code, out] = RunShell(Job(4, "--fp16 --bucket_view=false"));
  EXPECT_EQ(code, 0) << out;
  EXPECT_TRUE(absl::StrContains(out, "[0]: parameters bit-identical across 4"))
      << out;
}

// examples/ddp:ddp_elastic under ferry_run: rank 2 is SIGKILLed in step
// 10's backward, ferry_run restarts it (the same RANK, FERRY_RUN_RESTART=1),
// the survivors re-form without it and go on; at step 20 they wait for the
// replacement (--hold_at_step: a restart takes longer than the 40 steps),
// which joins and takes its state from rank 0: all three end at the last
// step, bit-identical.
TEST(DdpExample, ElasticRankKilledIsRestartedAndRejoins) {
  const std::string cmd = absl::StrCat(
      Runfile("tools/launcher/ferry_run"),
      " --nproc 3 --timeout_s 120 --restart_ranks 0-2 --rank_restarts 1 -- ",
      Runfile("examples/ddp/ddp_elastic"),
      " --steps=40 --probe --die_rank=2 --die_at_step=10",
      " --hold_at_step=20 --hold_until_size=3");
  auto [code, out] = RunShell(cmd);
  EXPECT_EQ(code, 0) << out;
  EXPECT_TRUE(absl::StrContains(out, "DYING id=rank2.0")) << out;
  // The replacement is "rank2.1"; every member reports the final step with
  // parameters identical across the group (an all-gather compare).
  for (const char* id : {"rank0.0", "rank1.0", "rank2.1"}) {
    EXPECT_TRUE(absl::StrContains(out, absl::StrCat("FINAL id=", id)))
        << id << "\n" << out;
  }
  EXPECT_TRUE(absl::StrContains(out, "size=3 step=40 identical=1")) << out;
  EXPECT_FALSE(absl::StrContains(out, "identical=0")) << out;
}

}  // namespace
