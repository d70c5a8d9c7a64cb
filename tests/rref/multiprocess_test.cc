// RRefs across real processes over the gRPC agent: the test is rank 0 of a
// group whose other ranks are worker_main processes, meeting through a
// TCPStore served by the test.
#include <signal.h>

#include <memory>
#include <string>
#include <vector>

#include "ferry/common/status.h"
#include "gtest/gtest.h"
#include "ferry/rpc/grpc/agent.h"
#include "ferry/rref/rref.h"
#include "ferry/tests/rref/counter.h"
#include "ferry/tests/util/worker_processes.h"
#include "ferry/tests/util/subprocess.h"

namespace ferry::rref {
namespace {

using testutil::Counter;

constexpr absl::Duration kWait = absl::Seconds(30);

// Worker processes of tests/rref/worker_main beside this one (worker0).
class Group {
 public:
  absl::Status Start(int world) {
    rpc::GrpcAgentOptions options;
    options.before_serving = [this](rpc::Agent& agent) {
      return testutil::InstallRRefTestLayer(agent, &ctx_);
    };
    return procs_.Start(world, "tests/rref/worker_main", std::move(options));
  }
  absl::StatusOr<int> Wait(size_t i, absl::Duration timeout) {
    return procs_.Wait(i, timeout);
  }
  ~Group() { ctx_.reset(); }  // Before procs_ shuts the agent down.

  rpc::Agent& agent() { return procs_.agent(); }
  RRefContext& ctx() { return *ctx_; }
  size_t workers() const { return procs_.workers(); }
  testutil::Subprocess& worker(size_t i) { return procs_.worker(i); }

 private:
  std::shared_ptr<RRefContext> ctx_;
  testutil::WorkerProcesses procs_;
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
