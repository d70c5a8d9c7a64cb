// A worker killed while tensors cross the same-host channel: the survivor's
// calls fail within their timeout naming the peer, its leases end, and
// nothing is left behind (no /dev/shm entry, no shared-memory descriptor).
// The test is rank 0; same_host_peer_main is rank 1, on this host.
#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <deque>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "ferry/common/poll.h"
#include "ferry/common/status.h"
#include "gtest/gtest.h"
#include "ferry/rpc/grpc/init.h"
#include "ferry/store/tcp_store_server.h"
#include "ferry/tensor/tensor.h"
#include "ferry/tests/util/subprocess.h"

namespace ferry::rpc {
namespace {

constexpr int64_t kBytes = int64_t{128} << 20;
// Long enough for a 128 MiB echo under TSAN on a loaded machine; a killed
// peer fails calls with Unavailable or Aborted long before it.
constexpr absl::Duration kRpcTimeout = absl::Seconds(60);

std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) names.push_back(e->d_name);
    closedir(d);
  }
  return names;
}

// What the channel must never leave: a descriptor of this process on
// /dev/shm or a memfd. (It creates no named object at all; /dev/shm names
// are not checked by pid because other tests' segments share /dev/shm and,
// inside PID namespaces, their names can contain the same small numbers.)
void ExpectNothingShared() {
  for (const std::string& fd : ListDir("/proc/self/fd")) {
    char target[4096];
    const std::string link = "/proc/self/fd/" + fd;
    ssize_t n = readlink(link.c_str(), target, sizeof(target) - 1);
    if (n <= 0) continue;
    const std::string t(target, n);
    EXPECT_FALSE(absl::StartsWith(t, "/dev/shm/") ||
                 absl::StartsWith(t, "/memfd:"))
        << link << " -> " << t;
  }
}

class Pair {
 public:
  absl::Status Start(const std::string& role,
                     std::shared_ptr<FunctionRegistry> registry) {
    TcpStoreServer::Options so;
    so.host = "127.0.0.1";
    ASSIGN_OR_RETURN(server_, TcpStoreServer::Start(so));
    const std::string port = std::to_string(server_->port());
    testutil::SpawnOptions options;
    options.env = {{"RANK", "1"},
                   {"WORLD_SIZE", "2"},
                   {"MASTER_ADDR", "127.0.0.1"},
                   {"MASTER_PORT", port},
                   {"FERRY_USE_AGENT_STORE", "1"},
                   {"ROLE", role},
                   {"BYTES", absl::StrCat(kBytes)}};
    options.pipe_stdin = true;
    options.capture_stdout = true;
    ASSIGN_OR_RETURN(
        peer_,
        testutil::Subprocess::Spawn(
            {testutil::RunfilePath("tests/rpc/same_host_peer_main")}, options));
    GrpcAgentOptions o;
    o.join_timeout = absl::Seconds(60);
    o.rpc_timeout = kRpcTimeout;
    // Short, so unread replies end within the test; not so short that a
    // loaded machine's first 128 MiB copy into fresh memory outlasts it.
    o.same_host.lease_timeout = absl::Seconds(5);
    setenv("FERRY_USE_AGENT_STORE", "1", 1);
    ASSIGN_OR_RETURN(
        agent_, InitRpc("worker0", absl::StrCat("tcp://127.0.0.1:", port), 0, 2,
                        o, std::move(registry)));
    return absl::OkStatus();
  }
  ~Pair() {
    if (agent_) agent_->Shutdown(/*graceful=*/false).IgnoreError();
  }
  GrpcAgent& agent() { return *agent_; }
  testutil::Subprocess& peer() { return *peer_; }

 private:
  std::unique_ptr<TcpStoreServer> server_;
  std::unique_ptr<GrpcAgent> agent_;
  std::unique_ptr<testutil::Subprocess> peer_;
};

std::shared_ptr<FunctionRegistry> EchoRegistry(
    std::shared_ptr<std::atomic<int>> served) {
  auto registry = std::make_shared<FunctionRegistry>();
  EXPECT_TRUE(registry
                  ->Register("echo",
                             [served](Tensor t) {
                               served->fetch_add(1);
                               return t;
                             })
                  .ok());
  return registry;
}

TEST(SameHostKill, CalleeKilledMidTransferFailsTheCallsNamingIt) {
  Pair p;
  auto served = std::make_shared<std::atomic<int>>(0);
  absl::Status started = p.Start("callee", EchoRegistry(served));
  ASSERT_TRUE(started.ok()) << started;
  ASSERT_EQ(p.peer().ReadLine(absl::Now() + absl::Seconds(60)), "ready");
  if (p.agent().same_host().usable_peers() != 2) {
    GTEST_SKIP() << "cross-memory attach is refused on this machine";
  }
  Tensor t = full({kBytes / 4}, 2.0);
  std::deque<Future<Value>> inflight;
  int ok = 0;
  // Two calls always in flight; a few complete, then the kill lands while
  // two are under way (most of their time is copying payloads).
  for (int i = 0; i < 100 && ok < 3; ++i) {
    while (inflight.size() < 2) {
      inflight.push_back(
          p.agent().CallAsync("worker1", "echo", {Value::FromTensor(t)}));
    }
    auto r = inflight.front().Get(absl::Seconds(60));
    inflight.pop_front();
    ASSERT_TRUE(r.ok()) << r.status();
    ok += 1;
  }
  ASSERT_EQ(ok, 3);
  while (inflight.size() < 2) {
    inflight.push_back(
        p.agent().CallAsync("worker1", "echo", {Value::FromTensor(t)}));
  }
  ASSERT_GE(p.agent().same_host().stats().payloads_sent.load(), 3u);
  const absl::Time killed = absl::Now();
  ASSERT_TRUE(p.peer().Signal(SIGKILL).ok());
  int failed = 0;
  for (auto& f : inflight) {
    auto r = f.Get(absl::Seconds(60));
    if (r.ok()) continue;  // It completed before the kill.
    ++failed;
    EXPECT_TRUE(r.status().code() == absl::StatusCode::kUnavailable ||
                r.status().code() == absl::StatusCode::kAborted)
        << r.status();
    EXPECT_NE(r.status().message().find("worker1"), std::string::npos)
        << r.status();
  }
  EXPECT_GE(failed, 1);
  EXPECT_LT(absl::Now() - killed, kRpcTimeout);
  EXPECT_EQ(p.agent().same_host().live_leases(), 0);
  ExpectNothingShared();
}

TEST(SameHostKill, CallerKilledMidTransferLeavesNoLease) {
  Pair p;
  auto served = std::make_shared<std::atomic<int>>(0);
  absl::Status started = p.Start("caller", EchoRegistry(served));
  ASSERT_TRUE(started.ok()) << started;
  if (p.agent().same_host().usable_peers() != 2) {
    GTEST_SKIP() << "cross-memory attach is refused on this machine";
  }
  // The caller prints a line per echo: wait for three, then kill it while
  // its next two calls are in flight.
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(absl::StartsWith(
        p.peer().ReadLine(absl::Now() + absl::Seconds(60)), "echoed"));
  }
  ASSERT_TRUE(p.peer().Signal(SIGKILL).ok());
  auto code = p.peer().Wait(absl::Now() + absl::Seconds(30));
  EXPECT_EQ(code.status().code(), absl::StatusCode::kAborted) << code.status();
  EXPECT_GE(served->load(), 3);
  // Replies the dead caller never read end at lease_timeout (5 s).
  EXPECT_TRUE(
      PollUntil([&] { return p.agent().same_host().live_leases() == 0; },
                absl::Seconds(30)))
      << p.agent().same_host().live_leases() << " leases still live";
  ExpectNothingShared();
  // The survivor still serves and calls (itself, over the channel).
  Tensor x = full({1 << 20}, 4.0);
  auto r = p.agent().rpc_sync<Tensor>("worker0", "echo", x);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->equal(x));
}

}  // namespace
}  // namespace ferry::rpc
