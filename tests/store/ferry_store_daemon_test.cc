// The standalone daemon: ferry_store serves clients, prints --stats lines
// and stops cleanly on SIGTERM.
#include <signal.h>

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "ferry/store/tcp_store.h"
#include "ferry/tests/util/subprocess.h"

namespace ferry {
namespace {

std::string g_daemon;  // path of ferry_store (argv[1])

TEST(FerryStoreDaemonTest, ServesReportsStatsAndStopsOnSigterm) {
  auto daemon =
      testutil::Subprocess::Spawn({g_daemon, "--host=127.0.0.1", "--port=0",
                                   "--stats=0.05", "--max_value_bytes=1024"},
                                  testutil::SpawnOptions().CaptureStdout());
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  testutil::Subprocess& d = **daemon;
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  const std::string first = d.ReadLine(deadline);
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
    const std::string line = d.ReadLine(deadline);
    if (line.empty()) break;
    saw_stats = absl::StrContains(line, "keys=1") &&
                absl::StrContains(line, "dropped=1") &&
                absl::StrContains(line, "ops/s=");
  }
  EXPECT_TRUE(saw_stats);
  store->reset();
  ASSERT_TRUE(d.Signal(SIGTERM).ok());
  const std::string rest = d.ReadAll(deadline);
  absl::StatusOr<int> code = d.Wait(deadline);
  EXPECT_EQ(code.value_or(-1), 0) << code.status();
  EXPECT_TRUE(absl::StrContains(rest, "ferry_store stopped")) << rest;
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc > 1) ferry::g_daemon = argv[1];
  return RUN_ALL_TESTS();
}
