// TCPStore interop with PyTorch 1.13 (Debian's python3-torch), both ways:
//  * a PyTorch client joins and works against a Ferry TCPStore server;
//  * a Ferry client (legacy_protocol) works against a PyTorch server.
// Runs only when `/usr/bin/python3 -c "import torch"` works; otherwise every
// test is skipped with the reason. The default test run never installs torch.

#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "gtest/gtest.h"
#include "ferry/common/poll.h"
#include "ferry/store/tcp_store.h"
#include "ferry/store/tcp_store_relay.h"
#include "ferry/store/tcp_store_server.h"
#include "ferry/tests/util/subprocess.h"

namespace ferry {
namespace {

constexpr char kPython[] = "/usr/bin/python3";
std::string g_script;  // path of pytorch_interop.py (argv[1])

bool TorchAvailable() {
  static const bool available =
      std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") == 0;
  return available;
}

#define SKIP_WITHOUT_TORCH()                                                  \
  if (!TorchAvailable()) {                                                    \
    GTEST_SKIP() << "PyTorch not importable by /usr/bin/python3; install "    \
                    "Debian's python3-torch (apt-get install python3-torch) " \
                    "to run the PyTorch 1.13 interop tests";                  \
  }

// The python half, with its stdout captured; bounded waits throughout.
class Python {
 public:
  explicit Python(std::vector<std::string> args) {
    std::vector<std::string> argv = {kPython, g_script};
    for (std::string& a : args) argv.push_back(std::move(a));
    auto child = testutil::Subprocess::Spawn(
        std::move(argv), testutil::SpawnOptions().CaptureStdout());
    if (child.ok()) child_ = *std::move(child);
  }
  bool started() const { return child_ != nullptr; }
  // Next stdout line ("" at EOF).
  std::string ReadLine() { return child_->ReadLine(Deadline()); }
  // Waits for exit; returns the exit code (-1 on signal or timeout) and
  // collects the remaining output.
  int Wait(std::string* rest) {
    absl::StrAppend(rest, child_->ReadAll(Deadline()));
    return child_->Wait(Deadline()).value_or(-1);
  }

 private:
  static absl::Time Deadline() { return absl::Now() + absl::Seconds(90); }

  std::unique_ptr<testutil::Subprocess> child_;
};

// The Ferry half of the exchange; the python side mirrors it.
void FerrySide(Store& s) {
  ASSERT_TRUE(s.Add("counter", 1).ok());
  ASSERT_TRUE(s.Append("appended", "a").ok());
  ASSERT_TRUE(s.Append("appended", "b").ok());
  ASSERT_TRUE(s.Set("cas", "old").ok());
  ASSERT_TRUE(s.Set("gone", "x").ok());
  ASSERT_TRUE(s.Set("ferry_key", "from_ferry").ok());
  EXPECT_EQ(s.Get("py_key").value_or("<error>"), "from_py");
  ASSERT_TRUE(s.Wait({"py_done"}).ok());
  EXPECT_EQ(s.Get("counter").value_or("<error>"), "11");
  EXPECT_EQ(s.Get("cas").value_or("<error>"), "new");
  EXPECT_FALSE(s.Check({"gone"}).value_or(true));
  EXPECT_TRUE(s.Check({"py_key", "ferry_key"}).value_or(false));
}

// A Ferry server on port 0 (PyTorch learns the bound port), the python half
// in `mode` given that port, and a Ferry client handle.
// With `via_relay`, a TcpStoreRelay sits in front of the server and both the
// python half and the Ferry handle talk to the relay.
struct FerryServerAndPython {
  std::unique_ptr<TcpStoreServer> server;
  std::unique_ptr<TcpStoreRelay> relay;
  std::unique_ptr<Python> py;
  std::unique_ptr<TcpStore> store;
};

void StartFerryServerAndPython(const std::string& mode,
                               std::optional<int64_t> world_size,
                               FerryServerAndPython* out,
                               bool via_relay = false) {
  TcpStoreServer::Options so;
  so.host = "127.0.0.1";
  auto server = TcpStoreServer::Start(so);
  ASSERT_TRUE(server.ok()) << server.status();
  out->server = *std::move(server);
  int port = out->server->port();
  if (via_relay) {
    TcpStoreRelay::Options ro;
    ro.upstream_port = port;
    auto relay = TcpStoreRelay::Start(ro);
    ASSERT_TRUE(relay.ok()) << relay.status();
    out->relay = *std::move(relay);
    port = out->relay->port();
  }
  out->py = std::make_unique<Python>(
      std::vector<std::string>{mode, absl::StrCat(port)});
  ASSERT_TRUE(out->py->started());
  TcpStoreOptions o;
  o.host = "127.0.0.1";
  o.port = port;
  o.world_size = world_size;
  o.timeout = absl::Seconds(60);
  auto store = TcpStore::Create(o);
  ASSERT_TRUE(store.ok()) << store.status();
  out->store = *std::move(store);
}

// The python "client" half exchanges keys with FerrySide.
void ClientExchange(bool via_relay) {
  FerryServerAndPython s;
  ASSERT_NO_FATAL_FAILURE(
      StartFerryServerAndPython("client", 2, &s, via_relay));
  // Both Ferry's handle and the PyTorch client have joined through init/.
  ASSERT_TRUE(s.server->WaitForWorkers(2, absl::Seconds(60)).ok());
  FerrySide(*s.store);
  std::string out;
  EXPECT_EQ(s.py->Wait(&out), 0) << out;
  EXPECT_TRUE(absl::StrContains(out, "OK delete_key")) << out;
  EXPECT_EQ(s.server->GetStats().dropped, 0);
  if (via_relay) {
    EXPECT_EQ(s.relay->GetStats().dropped, 0);
  }
}

// PyTorch 1.13's timed wait() abandons its WAIT on the connection; the next
// WAIT replaces it on a Ferry server (and relay), and no stale reply follows
// when the abandoned keys appear (the python side checks every later
// response).
void TimedWaitsStayInStep(bool via_relay) {
  FerryServerAndPython s;
  ASSERT_NO_FATAL_FAILURE(
      StartFerryServerAndPython("timed_waits", std::nullopt, &s, via_relay));
  ASSERT_TRUE(s.store->Wait({"py_polled"}).ok());
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(s.store->Set(absl::StrCat("late", i), "v").ok());
  }
  ASSERT_TRUE(s.store->Set("marker", "m").ok());
  ASSERT_TRUE(s.store->Wait({"py_done"}).ok());
  std::string out;
  EXPECT_EQ(s.py->Wait(&out), 0) << out;
  EXPECT_TRUE(absl::StrContains(out, "OK num_keys in step")) << out;
  EXPECT_EQ(s.server->GetStats().dropped, 0);
  if (!via_relay) return;
  EXPECT_EQ(s.relay->GetStats().dropped, 0);
  // Nothing of the abandoned waits is left on the relay or the server.
  EXPECT_EQ(s.relay->GetStats().upstream_waits, 0);
  EXPECT_TRUE(PollUntil([&] { return s.server->GetStats().waiting == 0; },
                        absl::Seconds(20)));
}

TEST(PyTorchInteropTest, PyTorchClientAgainstFerryServer) {
  SKIP_WITHOUT_TORCH();
  ClientExchange(/*via_relay=*/false);
}

TEST(PyTorchInteropTest, PyTorchTimedWaitsInALoopStayInStep) {
  SKIP_WITHOUT_TORCH();
  TimedWaitsStayInStep(/*via_relay=*/false);
}

// The same two with a relay between the clients and the server.
TEST(PyTorchInteropTest, PyTorchClientThroughRelay) {
  SKIP_WITHOUT_TORCH();
  ClientExchange(/*via_relay=*/true);
}

TEST(PyTorchInteropTest, PyTorchTimedWaitsThroughRelayStayInStep) {
  SKIP_WITHOUT_TORCH();
  TimedWaitsStayInStep(/*via_relay=*/true);
}

TEST(PyTorchInteropTest, FerryLegacyClientAgainstPyTorchServer) {
  SKIP_WITHOUT_TORCH();
  Python py({"server"});
  ASSERT_TRUE(py.started());
  const std::string line = py.ReadLine();
  absl::string_view rest = line;
  int port = 0;
  ASSERT_TRUE(absl::ConsumePrefix(&rest, "PORT ") &&
              absl::SimpleAtoi(rest, &port))
      << "python said: " << line;
  TcpStoreOptions o;
  o.host = "127.0.0.1";
  o.port = port;
  o.legacy_protocol = true;
  o.world_size = 2;  // joins via init/ like a PyTorch 1.13 worker
  o.timeout = absl::Seconds(60);
  auto store = TcpStore::Create(o);
  ASSERT_TRUE(store.ok()) << store.status();
  FerrySide(**store);
  // A timed-out wait against 1.13 (no CANCEL_WAIT) recovers by reconnecting.
  absl::Status w = (*store)->Wait({"never"}, absl::Milliseconds(100));
  EXPECT_EQ(w.code(), absl::StatusCode::kDeadlineExceeded) << w;
  EXPECT_TRUE(absl::StrContains(w.message(), "never")) << w;
  EXPECT_EQ((*store)->Get("counter").value_or("<error>"), "11");
  ASSERT_TRUE((*store)->Set("ferry_done", "1").ok());
  std::string out;
  EXPECT_EQ(py.Wait(&out), 0) << out;
  EXPECT_TRUE(absl::StrContains(out, "OK Ferry's emulated append")) << out;
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc > 1) ferry::g_script = argv[1];
  return RUN_ALL_TESTS();
}
