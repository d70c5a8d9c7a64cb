#include "ferry/tests/util/subprocess.h"

#include <signal.h>

#include "gtest/gtest.h"

namespace ferry::testutil {
namespace {

const absl::Duration kLong = absl::Seconds(20);

TEST(Subprocess, ExitCodeAndOutput) {
  auto [code, out] =
      RunCommand({"/bin/sh", "-c", "echo hi; echo err >&2; exit 3"}, {}, kLong);
  EXPECT_EQ(code, 3);
  EXPECT_EQ(out, "hi\nerr\n");
}

TEST(Subprocess, EnvironmentIsLaidOverTheParents) {
  auto [code, out] = RunCommand({"/bin/sh", "-c", "echo $FERRY_X"},
                                {{"FERRY_X", "set"}}, kLong);
  EXPECT_EQ(code, 0);
  EXPECT_EQ(out, "set\n");
}

TEST(Subprocess, ReadLineKeepsTheRest) {
  auto child = Subprocess::Spawn({"/bin/sh", "-c", "printf 'a\\nb\\nc'"},
                                 SpawnOptions().CaptureStdout());
  ASSERT_TRUE(child.ok()) << child.status();
  const absl::Time deadline = absl::Now() + kLong;
  EXPECT_EQ((*child)->ReadLine(deadline), "a");
  EXPECT_EQ((*child)->ReadLine(deadline), "b");
  EXPECT_EQ((*child)->ReadAll(deadline), "c");
  EXPECT_EQ((*child)->Wait(deadline).value_or(-1), 0);
}

TEST(Subprocess, ClosingStdinEndsACat) {
  auto child = Subprocess::Spawn({"/bin/cat"}, SpawnOptions().PipeStdin());
  ASSERT_TRUE(child.ok()) << child.status();
  // Still running: cat waits for input.
  EXPECT_EQ((*child)->Wait(absl::Now()).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  (*child)->CloseStdin();
  EXPECT_EQ((*child)->Wait(absl::Now() + kLong).value_or(-1), 0);
}

TEST(Subprocess, SignalledChildIsReportedAsAborted) {
  auto child = Subprocess::Spawn({"/bin/cat"}, SpawnOptions().PipeStdin());
  ASSERT_TRUE(child.ok()) << child.status();
  ASSERT_TRUE((*child)->Signal(SIGTERM).ok());
  absl::StatusOr<int> code = (*child)->Wait(absl::Now() + kLong);
  EXPECT_EQ(code.status().code(), absl::StatusCode::kAborted) << code.status();
}

TEST(Subprocess, MissingBinaryIsAnError) {
  auto child = Subprocess::Spawn({"/nonexistent/ferry"});
  // posix_spawn reports exec failure either as an error or as exit 127.
  if (child.ok()) {
    EXPECT_EQ((*child)->Wait(absl::Now() + kLong).value_or(-1), 127);
  } else {
    EXPECT_EQ(child.status().code(), absl::StatusCode::kInternal);
  }
}

}  // namespace
}  // namespace ferry::testutil
