// RPC across real processes: the test is rank 0 of a group whose other ranks
// are worker_main processes, meeting through a TCPStore served by the test.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "gtest/gtest.h"
#include "rpc/context.h"
#include "rpc/grpc/init.h"
#include "store/tcp_store_server.h"
#include "tensor/tensor.h"
#include "tests/rpc/toy_layer.h"

namespace ferry::rpc {
namespace {

std::string WorkerBinary() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* ws = std::getenv("TEST_WORKSPACE");
  return absl::StrCat(srcdir ? srcdir : ".", "/", ws ? ws : "ferry",
                      "/tests/rpc/worker_main");
}

class Group {
 public:
  // Starts ranks 1..world-1 as processes; the test joins as rank 0.
  absl::Status Start(int world) {
    TcpStoreServer::Options so;
    so.host = "127.0.0.1";
    ASSIGN_OR_RETURN(server_, TcpStoreServer::Start(so));
    const std::string port = std::to_string(server_->port());
    for (int r = 1; r < world; ++r) {
      pid_t pid = fork();
      if (pid == 0) {
        setenv("RANK", std::to_string(r).c_str(), 1);
        setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
        setenv("MASTER_ADDR", "127.0.0.1", 1);
        setenv("MASTER_PORT", port.c_str(), 1);
        setenv("FERRY_USE_AGENT_STORE", "1", 1);
        std::string bin = WorkerBinary();
        execl(bin.c_str(), bin.c_str(), nullptr);
        _exit(127);
      }
      pids_.push_back(pid);
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

  // Waits for a child; returns its wait status, or -1 after `timeout`.
  int Reap(size_t i, absl::Duration timeout) {
    absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      int status;
      if (waitpid(pids_[i], &status, WNOHANG) == pids_[i]) {
        pids_[i] = -1;
        return status;
      }
      absl::SleepFor(absl::Milliseconds(10));  // Polling a child's exit.
    }
    return -1;
  }

  ~Group() {
    if (agent_) agent_->Shutdown(/*graceful=*/false).IgnoreError();
    for (pid_t pid : pids_) {
      if (pid > 0) {
        kill(pid, SIGKILL);
        waitpid(pid, nullptr, 0);
      }
    }
  }

  Agent& agent() { return *agent_; }
  std::vector<pid_t>& pids() { return pids_; }

 private:
  std::unique_ptr<TcpStoreServer> server_;
  std::unique_ptr<GrpcAgent> agent_;
  std::vector<pid_t> pids_;
};

TEST(MultiProcessRpc, CallsBetweenProcessesAndGracefulShutdown) {
  Group g;
  absl::Status started = g.Start(3);
  ASSERT_TRUE(started.ok()) << started;
  for (int r = 1; r < 3; ++r) {
    auto pid = g.agent().rpc_sync<int64_t>(r, "pid");
    ASSERT_TRUE(pid.ok()) << pid.status();
    EXPECT_EQ(*pid, g.pids()[r - 1]);
    auto sum = g.agent().rpc_sync<Tensor>(r, "add", full({1000}, 1.5),
                                          full({1000}, r));
    ASSERT_TRUE(sum.ok()) << sum.status();
    EXPECT_TRUE(sum->equal(full({1000}, 1.5 + r)));
  }
  ASSERT_TRUE(g.agent().Shutdown().ok());
  for (size_t i = 0; i < g.pids().size(); ++i) {
    int status = g.Reap(i, absl::Seconds(60));
    ASSERT_TRUE(WIFEXITED(status)) << status;
    EXPECT_EQ(WEXITSTATUS(status), 0);
  }
}

// A layer's own message type (registered by the worker processes before they
// serve) crosses processes with its tensor, RRef fields and context.
TEST(MultiProcessRpc, LayerDefinedMessageTypeAcrossProcesses) {
  Group g;
  absl::Status started = g.Start(3);
  ASSERT_TRUE(started.ok()) << started;
  for (int r = 1; r < 3; ++r) {
    RRefFields rref{GlobalId(0, 100 + r), GlobalId(0, 200 + r), 0, r, "Toy"};
    ScopedContextEntry tag("toy/tag", absl::StrCat("tag", r));
    auto d = toy::Double(g.agent(), r, full({5}, 1.0 + r), rref)
                 .Get(absl::Seconds(60));
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_TRUE(d->tensor.equal(full({5}, 2.0 + 2 * r)));
    EXPECT_EQ(d->rref, rref);
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
  for (size_t i = 0; i < g.pids().size(); ++i) {
    int status = g.Reap(i, absl::Seconds(60));
    ASSERT_TRUE(WIFEXITED(status)) << status;
    EXPECT_EQ(WEXITSTATUS(status), 0);
  }
}

TEST(MultiProcessRpc, KilledPeerFailsTheCallWithinTheTimeout) {
  Group g;
  absl::Status started = g.Start(2);
  ASSERT_TRUE(started.ok()) << started;
  Future<Value> blocked =
      g.agent().CallAsync("worker1", "block", {}, absl::Seconds(30));
  // Make sure the call reached the peer before killing it.
  ASSERT_TRUE(g.agent().rpc_sync<int64_t>("worker1", "pid").ok());
  absl::Time killed = absl::Now();
  kill(g.pids()[0], SIGKILL);
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

}  // namespace
}  // namespace ferry::rpc
