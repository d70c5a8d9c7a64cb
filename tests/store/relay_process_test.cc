// The ferry_store_relay binary as a process of its own: clients through it
// work; killing it (SIGKILL) fails a waiting call at once and later calls
// until it is back; restarted on the same port, the same client handles
// carry on (Ferry's client reopens a broken connection on its next call).
#include <signal.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "ferry/common/poll.h"
#include "ferry/store/tcp_store.h"
#include "ferry/store/tcp_store_server.h"
#include "ferry/tests/util/subprocess.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

std::string g_relay;  // path of ferry_store_relay (argv[1])

absl::Time Deadline() { return absl::Now() + absl::Seconds(30); }

// Starts the relay; its port from the first line it prints (0 on failure).
std::unique_ptr<testutil::Subprocess> SpawnRelay(int upstream_port, int port,
                                                 int* bound) {
  auto relay = testutil::Subprocess::Spawn(
      {g_relay, absl::StrCat("--upstream=127.0.0.1:", upstream_port),
       absl::StrCat("--port=", port)},
      testutil::SpawnOptions().CaptureStdout());
  *bound = 0;
  if (!relay.ok()) return nullptr;
  const std::string line = (*relay)->ReadLine(Deadline());
  std::vector<std::string> words = absl::StrSplit(line, ' ');
  // "ferry_store_relay listening on ADDR port PORT upstream HOST:PORT"
  if (!absl::StartsWith(line, "ferry_store_relay listening on ") ||
      words.size() < 7 || !absl::SimpleAtoi(words[5], bound)) {
    ADD_FAILURE() << "relay said: " << line;
  }
  return *std::move(relay);
}

TEST(RelayProcessTest, KilledRelayFailsCallsThenRestartedRelayServes) {
  TcpStoreServer::Options so;
  so.host = "127.0.0.1";
  auto server = TcpStoreServer::Start(so);
  ASSERT_TRUE(server.ok()) << server.status();
  int port = 0;
  std::unique_ptr<testutil::Subprocess> relay =
      SpawnRelay((*server)->port(), 0, &port);
  ASSERT_NE(relay, nullptr);
  ASSERT_NE(port, 0);

  TcpStoreOptions o;
  o.host = "127.0.0.1";
  o.port = port;
  o.timeout = absl::Seconds(120);
  auto waiter = TcpStore::Create(o);
  ASSERT_TRUE(waiter.ok()) << waiter.status();
  o.timeout = absl::Seconds(2);
  auto client = TcpStore::Create(o);
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->Set("before", "1").ok());
  EXPECT_EQ((*waiter)->Get("before").value_or("?"), "1");

  absl::Status waited;
  std::thread wait_thread(
      [&] { waited = (*waiter)->Wait({"never"}, absl::Seconds(120)); });
  ASSERT_TRUE(PollUntil([&] { return (*server)->GetStats().waiting == 1; },
                        absl::Seconds(30)));
  const absl::Time killed = absl::Now();
  ASSERT_TRUE(relay->Signal(SIGKILL).ok());
  wait_thread.join();
  EXPECT_LT(absl::Now() - killed, absl::Seconds(10));
  EXPECT_TRUE(absl::IsUnavailable(waited)) << waited;
  EXPECT_TRUE(absl::StrContains(waited.message(), absl::StrCat(port)))
      << waited;
  EXPECT_FALSE(relay->Wait(Deadline()).ok());  // reaped: killed by SIGKILL
  // The server freed the dead relay's wait.
  EXPECT_TRUE(PollUntil([&] { return (*server)->GetStats().waiting == 0; },
                        absl::Seconds(30)));
  // While the relay is down a call fails (naming the relay) at its timeout.
  absl::StatusOr<std::string> down = (*client)->Get("before");
  EXPECT_FALSE(down.ok());
  EXPECT_TRUE(absl::StrContains(down.status().message(), absl::StrCat(port)))
      << down.status();

  int port2 = 0;
  relay = SpawnRelay((*server)->port(), port, &port2);
  ASSERT_NE(relay, nullptr);
  ASSERT_EQ(port2, port);
  EXPECT_EQ((*client)->Get("before").value_or("?"), "1");
  ASSERT_TRUE((*waiter)->Set("after", "2").ok());
  EXPECT_EQ((*client)->Get("after").value_or("?"), "2");
  ASSERT_TRUE(relay->Signal(SIGTERM).ok());
  EXPECT_EQ(relay->Wait(Deadline()).value_or(-1), 0);
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc > 1) ferry::g_relay = argv[1];
  return RUN_ALL_TESTS();
}
