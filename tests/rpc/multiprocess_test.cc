// RPC across real processes: the test is rank 0 of a group whose other ranks
// are worker_main processes, meeting through a TCPStore served by the test.
#include <signal.h>

#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ferry/common/poll.h"
#include "ferry/common/status.h"
#include "gtest/gtest.h"
#include "ferry/rpc/context.h"
#include "ferry/rpc/grpc/init.h"
#include "ferry/store/tcp_store_server.h"
#include "ferry/tensor/tensor.h"
#include "ferry/tests/rpc/toy_layer.h"
#include "ferry/tests/util/subprocess.h"

namespace ferry::rpc {
namespace {

class Group {
 public:
  // Starts ranks 1..world-1 as processes; the test joins as rank 0.
  absl::Status Start(int world,
                     const std::map<std::string, std::string>& env = {}) {
    TcpStoreServer::Options so;
    so.host = "127.0.0.1";
    ASSIGN_OR_RETURN(server_, TcpStoreServer::Start(so));
    const std::string port = std::to_string(server_->port());
    for (int r = 1; r < world; ++r) {
      testutil::SpawnOptions options;
      options.env = {{"RANK", std::to_string(r)},
                     {"WORLD_SIZE", std::to_string(world)},
                     {"MASTER_ADDR", "127.0.0.1"},
                     {"MASTER_PORT", port},
                     {"FERRY_USE_AGENT_STORE", "1"}};
      for (const auto& [k, v] : env) options.env[k] = v;
      ASSIGN_OR_RETURN(
          auto child,
          testutil::Subprocess::Spawn(
              {testutil::RunfilePath("tests/rpc/worker_main")}, options));
      workers_.push_back(std::move(child));
    }
    GrpcAgentOptions options;
    options.join_timeout = absl::Seconds(60);
    // The test serves the store; rank 0 must not host a second one.
    setenv("FERRY_USE_AGENT_STORE", "1", 1);
    ASSIGN_OR_RETURN(
        agent_, InitRpc("worker0", absl::StrCat("tcp://127.0.0.1:", port), 0,
                        world, options));
    return absl::OkStatus();
  }

  // Workers still running are killed by their Subprocess destructors.
  ~Group() {
    if (agent_) agent_->Shutdown(/*graceful=*/false).IgnoreError();
  }

  Agent& agent() { return *agent_; }
  GrpcAgent& grpc_agent() { return *agent_; }
  // Rank r's process (r >= 1).
  testutil::Subprocess& worker(int r) { return *workers_[r - 1]; }
  int workers() const { return static_cast<int>(workers_.size()); }

 private:
  std::unique_ptr<TcpStoreServer> server_;
  std::unique_ptr<GrpcAgent> agent_;
  std::vector<std::unique_ptr<testutil::Subprocess>> workers_;
};

TEST(MultiProcessRpc, CallsBetweenProcessesAndGracefulShutdown) {
  Group g;
  absl::Status started = g.Start(3);
  ASSERT_TRUE(started.ok()) << started;
  for (int r = 1; r < 3; ++r) {
    auto pid = g.agent().rpc_sync<int64_t>(r, "pid");
    ASSERT_TRUE(pid.ok()) << pid.status();
    EXPECT_EQ(*pid, g.worker(r).pid());
    auto sum = g.agent().rpc_sync<Tensor>(r, "add", full({1000}, 1.5),
                                          full({1000}, r));
    ASSERT_TRUE(sum.ok()) << sum.status();
    EXPECT_TRUE(sum->equal(full({1000}, 1.5 + r)));
  }
  ASSERT_TRUE(g.agent().Shutdown().ok());
  for (int r = 1; r <= g.workers(); ++r) {
    absl::StatusOr<int> code =
        g.worker(r).Wait(absl::Now() + absl::Seconds(60));
    EXPECT_EQ(code.value_or(-1), 0) << code.status();
  }
}

// A layer's own message type (registered by the worker processes before they
// serve) crosses processes with its tensor, layer header and context.
TEST(MultiProcessRpc, LayerDefinedMessageTypeAcrossProcesses) {
  Group g;
  absl::Status started = g.Start(3);
  ASSERT_TRUE(started.ok()) << started;
  for (int r = 1; r < 3; ++r) {
    const std::string header =
        absl::StrCat(std::string("toy\0", 4), r, "\xff");
    ScopedContextEntry tag("toy/tag", absl::StrCat("tag", r));
    auto d = toy::Double(g.agent(), r, full({5}, 1.0 + r), header)
                 .Get(absl::Seconds(60));
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_TRUE(d->tensor.equal(full({5}, 2.0 + 2 * r)));
    EXPECT_EQ(d->header, header);
    EXPECT_EQ(d->tag, absl::StrCat("tag", r));
  }
  // This process did not install the toy layer: refused, naming it.
  Message m;
  m.type = toy::kToyDouble;
  auto refused = g.agent().Send("worker0", m).Get(absl::Seconds(60));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnimplemented)
      << refused.status();
  EXPECT_NE(refused.status().message().find("worker 'worker0'"),
            std::string::npos)
      << refused.status();
  ASSERT_TRUE(g.agent().Shutdown().ok());
  for (int r = 1; r <= g.workers(); ++r) {
    absl::StatusOr<int> code =
        g.worker(r).Wait(absl::Now() + absl::Seconds(60));
    EXPECT_EQ(code.value_or(-1), 0) << code.status();
  }
}

TEST(MultiProcessRpc, KilledPeerFailsTheCallWithinTheTimeout) {
  Group g;
  absl::Status started = g.Start(2);
  ASSERT_TRUE(started.ok()) << started;
  Future<Value> blocked =
      g.agent().CallAsync("worker1", "block", {}, absl::Seconds(30));
  // Proof that the call reached the peer (is running there) before the kill:
  // the peer counts "block" calls that have started. Bounded by a deadline.
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  int64_t running = 0;
  while (running == 0 && absl::Now() < deadline) {
    auto n = g.agent().rpc_sync<int64_t>("worker1", "blocked");
    ASSERT_TRUE(n.ok()) << n.status();
    running = *n;
  }
  ASSERT_EQ(running, 1) << "the blocking call never started on worker1";
  absl::Time killed = absl::Now();
  ASSERT_TRUE(g.worker(1).Signal(SIGKILL).ok());
  Result<Value> r = blocked.Get(absl::Seconds(60));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_NE(r.status().message().find("worker 'worker1'"), std::string::npos)
      << r.status();
  EXPECT_LT(absl::Now() - killed, absl::Seconds(30));
  // Later calls fail fast too, never hang.
  auto again = g.agent().rpc_sync<int64_t>("worker1", "pid");
  EXPECT_EQ(again.status().code(), absl::StatusCode::kUnavailable)
      << again.status();
}

// The peer dies while a large argument streams to it (it reads slowly, so the
// stream is still running): the call fails within the timeout naming it.
TEST(MultiProcessRpc, PeerKilledMidStreamFailsTheCallNamingIt) {
  Group g;
  // The worker refuses the same-host channel, so the arguments stream.
  absl::Status started = g.Start(
      2, {{"FERRY_TEST_SLOW_STREAM", "1"}, {"FERRY_RPC_SAME_HOST", "0"}});
  ASSERT_TRUE(started.ok()) << started;
  constexpr int64_t kBytes = int64_t{128} << 20;  // Each of 2 arguments.
  Tensor big = ones({kBytes / 4});
  const StreamStats& out = g.grpc_agent().stream_stats();
  Future<Value> call = g.agent().CallAsync(
      "worker1", "add", {Value::FromTensor(big), Value::FromTensor(big)},
      absl::Seconds(60));
  // Mid-stream: some pieces written, far from all (the peer takes >= 0.5 s).
  PollUntil([&] { return out.bytes_sent.load() >= (uint64_t{8} << 20); },
            absl::Seconds(30));
  const uint64_t sent = out.bytes_sent.load();
  ASSERT_GE(sent, uint64_t{8} << 20) << "the stream never started";
  absl::Time killed = absl::Now();
  ASSERT_TRUE(g.worker(1).Signal(SIGKILL).ok());
  EXPECT_LT(sent, uint64_t{2 * kBytes}) << "the stream ended before the kill";
  Result<Value> r = call.Get(absl::Seconds(90));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_NE(r.status().message().find("worker 'worker1'"), std::string::npos)
      << r.status();
  EXPECT_LT(absl::Now() - killed, absl::Seconds(30));
  EXPECT_EQ(out.requests_sent.load(), 1u);
}

}  // namespace
}  // namespace ferry::rpc
