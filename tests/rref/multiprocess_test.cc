// RRefs across real processes over the gRPC agent: the test is rank 0 of a
// group whose other ranks are worker_main processes, meeting through a
// TCPStore served by the test.
#include <signal.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "gtest/gtest.h"
#include "rpc/grpc/init.h"
#include "rref/rref.h"
#include "store/tcp_store_server.h"
#include "tests/rref/counter.h"
#include "tests/util/subprocess.h"

namespace ferry::rref {
namespace {

using testing::Counter;

constexpr absl::Duration kWait = absl::Seconds(30);

class Group {
 public:
  // Starts ranks 1..world-1 as processes; the test joins as rank 0.
  absl::Status Start(int world) {
    TcpStoreServer::Options so;
    so.host = "127.0.0.1";
    ASSIGN_OR_RETURN(server_, TcpStoreServer::Start(so));
    const std::string port = std::to_string(server_->port());
    for (int r = 1; r < world; ++r) {
      testutil::SpawnOptions spawn;
      spawn.env = {{"RANK", std::to_string(r)},
                   {"WORLD_SIZE", std::to_string(world)},
                   {"MASTER_ADDR", "127.0.0.1"},
                   {"MASTER_PORT", port},
                   {"FERRY_USE_AGENT_STORE", "1"}};
      ASSIGN_OR_RETURN(
          auto child,
          testutil::Subprocess::Spawn(
              {testutil::RunfilePath("tests/rref/worker_main")}, spawn));
      workers_.push_back(std::move(child));
    }
    rpc::GrpcAgentOptions options;
    options.join_timeout = absl::Seconds(60);
    options.before_serving = [this](rpc::Agent& agent) {
      return testing::InstallRRefTestLayer(agent, &ctx_);
    };
    setenv("FERRY_USE_AGENT_STORE", "1", 1);
    ASSIGN_OR_RETURN(
        agent_, rpc::InitRpc("worker0", absl::StrCat("tcp://127.0.0.1:", port),
                             0, world, options));
    return absl::OkStatus();
  }

  // Worker i's (0-based) exit code; an error if it was killed or is still
  // running after `timeout`.
  absl::StatusOr<int> Wait(size_t i, absl::Duration timeout) {
    return workers_[i]->Wait(absl::Now() + timeout);
  }

  ~Group() {
    ctx_.reset();
    if (agent_) agent_->Shutdown(/*graceful=*/false).IgnoreError();
    // Workers still running are killed by their Subprocess destructors.
  }

  rpc::Agent& agent() { return *agent_; }
  RRefContext& ctx() { return *ctx_; }
  size_t workers() const { return workers_.size(); }
  testutil::Subprocess& worker(size_t i) { return *workers_[i]; }

 private:
  std::unique_ptr<TcpStoreServer> server_;
  std::unique_ptr<rpc::GrpcAgent> agent_;
  std::shared_ptr<RRefContext> ctx_;
  std::vector<std::unique_ptr<testutil::Subprocess>> workers_;
};

TEST(MultiProcessRRef, RemoteObjectsAndForksAcrossProcesses) {
  Group g;
  absl::Status started = g.Start(3);
  ASSERT_TRUE(started.ok()) << started;
  {
    RRef<Counter> c = remote<Counter>(g.ctx(), "worker1", "Counter", 10);
    absl::StatusOr<int64_t> v = c.rpc_sync(kWait).call<int64_t>("add", 5);
    ASSERT_TRUE(v.ok()) << v.status();
    EXPECT_EQ(*v, 15);
    // worker2 uses worker1's object through a fork it received from us.
    absl::StatusOr<int64_t> w =
        g.agent().rpc_sync<int64_t>("worker2", "counter_add", c, 7);
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_EQ(*w, 22);
    RRef<int64_t> got = c.remote(kWait).call<int64_t>("get");
    absl::StatusOr<int64_t> here = got.to_here(kWait);
    ASSERT_TRUE(here.ok()) << here.status();
    EXPECT_EQ(*here, 22);
    EXPECT_EQ(got.owner_name(), "worker1");

    RRef<int64_t> sum = remote<int64_t>(g.ctx(), "worker2", "add", 2, 3);
    absl::StatusOr<int64_t> s =
        g.agent().rpc_sync<int64_t>("worker1", "fetch", sum);
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(*s, 5);
    RRef<int64_t> mine = MakeLocalRRef<int64_t>(g.ctx(), 99);
    absl::StatusOr<int64_t> m =
        g.agent().rpc_sync<int64_t>("worker2", "fetch", mine);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(*m, 99);
    // The creation error of a remote() reaches the holder, not a crash.
    RRef<int64_t> bad = remote<int64_t>(g.ctx(), "worker1", "no_such_fn");
    EXPECT_EQ(bad.to_here(kWait).status().code(), absl::StatusCode::kNotFound);
  }
  // Collective: every process releases its users, settles, and reports no
  // leaked OwnerRRef (workers exit 1 otherwise).
  absl::Status down = g.ctx().Shutdown(absl::Seconds(60));
  EXPECT_TRUE(down.ok()) << down;
  for (size_t i = 0; i < g.workers(); ++i) {
    absl::StatusOr<int> code = g.Wait(i, absl::Seconds(60));
    ASSERT_TRUE(code.ok()) << code.status();
    EXPECT_EQ(*code, 0) << "worker" << i + 1;
  }
}

TEST(MultiProcessRRef, OwnerKilledMidUseFailsHoldersWithoutHanging) {
  Group g;
  absl::Status started = g.Start(2);
  ASSERT_TRUE(started.ok()) << started;
  RRef<Counter> c = remote<Counter>(g.ctx(), "worker1", "Counter", 1);
  RRef<int64_t> v = remote<int64_t>(g.ctx(), "worker1", "add", 1, 1);
  ASSERT_TRUE(c.creation().Get(kWait).ok());
  ASSERT_TRUE(v.creation().Get(kWait).ok());
  ASSERT_EQ(*c.rpc_sync(kWait).call<int64_t>("add", 1), 2);
  const absl::Time killed = absl::Now();
  ASSERT_TRUE(g.worker(0).Signal(SIGKILL).ok());
  absl::StatusOr<int64_t> m = c.rpc_sync(kWait).call<int64_t>("get");
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kUnavailable) << m.status();
  EXPECT_NE(m.status().message().find("worker1"), std::string::npos)
      << m.status();
  EXPECT_NE(m.status().message().find(c.rref_id().ToString()),
            std::string::npos)
      << m.status();
  absl::StatusOr<int64_t> h = v.to_here(kWait);
  ASSERT_FALSE(h.ok());
  EXPECT_NE(h.status().message().find(v.rref_id().ToString()),
            std::string::npos)
      << h.status();
  RRef<int64_t> late = remote<int64_t>(g.ctx(), "worker1", "add", 1, 1);
  EXPECT_FALSE(late.creation().Get(kWait).ok());
  EXPECT_LT(absl::Now() - killed, kWait);
}

}  // namespace
}  // namespace ferry::rref
