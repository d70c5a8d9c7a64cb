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

}  // namespace
