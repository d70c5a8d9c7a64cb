// ferry_run: environment, prefixed output, and fail-fast job semantics.
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace {

std::string Launcher() {
  return absl::StrCat(std::getenv("TEST_SRCDIR"), "/",
                      std::getenv("TEST_WORKSPACE"),
                      "/tools/launcher/ferry_run");
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

TEST(FerryRun, GivesEachRankItsEnvironmentAndPrefixesOutput) {
  auto [code, out] =
      RunShell(Launcher() +
               " --nproc 3 -- /bin/sh -c 'echo \"r=$RANK w=$WORLD_SIZE "
               "l=$LOCAL_RANK m=$MASTER_ADDR p=${MASTER_PORT:+set}\"'");
  EXPECT_EQ(code, 0) << out;
  for (int r = 0; r < 3; ++r) {
    EXPECT_NE(out.find(absl::StrCat("[", r, "]: r=", r, " w=3 l=", r,
                                    " m=127.0.0.1 p=set")),
              std::string::npos)
        << out;
  }
}

TEST(FerryRun, OneFailingRankStopsTheJobWithItsExitCode) {
  absl::Time start = absl::Now();
  auto [code, out] =
      RunShell(Launcher() +
               " --nproc 3 --grace_s 2 -- /bin/sh -c "
               "'if [ \"$RANK\" = 1 ]; then exit 7; fi; exec sleep 60'");
  EXPECT_EQ(code, 7) << out;
  EXPECT_NE(out.find("rank 1 failed with exit code 7"), std::string::npos)
      << out;
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
}

TEST(FerryRun, MissingProgramIsAnError) {
  auto [code, out] =
      RunShell(Launcher() + " --nproc 1 -- /nonexistent/program");
  EXPECT_NE(code, 0) << out;
  EXPECT_NE(out.find("cannot exec /nonexistent/program"), std::string::npos)
      << out;
}

}  // namespace
