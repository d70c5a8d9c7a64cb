// The standalone daemon: ferry_store serves clients, prints --stats lines
// and stops cleanly on SIGTERM.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gtest/gtest.h"
#include "store/tcp_store.h"

extern char** environ;

namespace ferry {
namespace {

std::string g_daemon;  // path of ferry_store (argv[1])

TEST(FerryStoreDaemonTest, ServesReportsStatsAndStopsOnSigterm) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
  posix_spawn_file_actions_addclose(&actions, fds[0]);
  std::vector<std::string> args = {g_daemon, "--host=127.0.0.1", "--port=0",
                                   "--stats=0.05", "--max_value_bytes=1024"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  ASSERT_EQ(posix_spawn(&pid, g_daemon.c_str(), &actions, nullptr, argv.data(),
                        environ),
            0);
  posix_spawn_file_actions_destroy(&actions);
  ::close(fds[1]);
  FILE* out = ::fdopen(fds[0], "r");
  char buf[512];
  ASSERT_NE(::fgets(buf, sizeof(buf), out), nullptr);
  std::string first(absl::StripTrailingAsciiWhitespace(buf));
  std::vector<std::string> words = absl::StrSplit(first, ' ');
  int port = 0;
  ASSERT_TRUE(absl::StartsWith(first, "ferry_store listening on ")) << first;
  ASSERT_TRUE(absl::SimpleAtoi(words.back(), &port)) << first;

  TcpStoreOptions o;
  o.host = "127.0.0.1";
  o.port = port;
  o.timeout = absl::Seconds(20);
  auto store = TcpStore::Create(o);
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE((*store)->Set("k", "v").ok());
  EXPECT_EQ((*store)->Get("k").value_or("?"), "v");
  // The --max_value_bytes flag reaches the server: an oversized value from a
  // client with looser limits gets that client dropped.
  auto loose = TcpStore::Create(o);
  ASSERT_TRUE(loose.ok());
  ASSERT_TRUE((*loose)->Set("big", std::string(2048, 'x')).ok());
  EXPECT_FALSE((*loose)->Add("n", 1).ok());

  // A stats line showing the connected client and the key appears.
  bool saw_stats = false;
  for (int i = 0; i < 200 && !saw_stats; ++i) {
    if (::fgets(buf, sizeof(buf), out) == nullptr) break;
    const std::string line(buf);
    saw_stats = absl::StrContains(line, "keys=1") &&
                absl::StrContains(line, "dropped=1") &&
                absl::StrContains(line, "ops/s=");
  }
  EXPECT_TRUE(saw_stats);
  store->reset();
  ASSERT_EQ(::kill(pid, SIGTERM), 0);
  bool stopped = false;
  while (::fgets(buf, sizeof(buf), out) != nullptr) {
    stopped = stopped || absl::StartsWith(buf, "ferry_store stopped");
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_TRUE(stopped);
  ::fclose(out);
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc > 1) ferry::g_daemon = argv[1];
  return RUN_ALL_TESTS();
}
