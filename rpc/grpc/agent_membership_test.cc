// GrpcAgent::Join against members in each shutdown state (rpc/grpc/agent.h,
// Membership): waiting in the shutdown barrier (the member takes the joiner at
// once), and past it (the join fails at once naming the group's state and
// the member that refused). The semantics every agent shares are in
// //rpc:agent_conformance_test.
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "ferry/common/poll.h"
#include "ferry/common/sync.h"
#include "gtest/gtest.h"
#include "ferry/rpc/grpc/agent.h"
#include "ferry/rpc/testing/grpc_cluster.h"
#include "ferry/rpc/grpc/rendezvous.h"
#include "ferry/store/hash_store.h"
#include "ferry/store/tcp_store.h"

namespace ferry::rpc {
namespace {

using Agents = std::vector<std::unique_ptr<GrpcAgent>>;
using StoreFor = std::function<std::shared_ptr<Store>()>;

// Starts the static group `names` concurrently, each worker on the store
// `store_for` gives it.
Agents StartGroup(const std::vector<std::string>& names,
                  const StoreFor& store_for, const GrpcAgentOptions& options,
                  std::shared_ptr<FunctionRegistry> registry = nullptr) {
  Agents agents;
  for (auto& s : testing::StartGrpcAgents(
           {.names = names,
            .registry = std::move(registry),
            .options = testing::EveryRank(options),
            .store = nullptr},
           [&](int) { return store_for(); })) {
    EXPECT_TRUE(s.ok()) << s.status();
    if (s.ok()) agents.push_back(*std::move(s));
  }
  return agents;
}

// A client of the TCPStore at `port`: one per worker, as in separate
// processes under ferry_run.
std::shared_ptr<Store> TcpClient(int port) {
  TcpStoreOptions o;
  o.port = port;
  o.timeout = absl::Seconds(60);
  absl::StatusOr<std::unique_ptr<TcpStore>> s = TcpStore::Create(o);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? std::shared_ptr<Store>(*std::move(s)) : nullptr;
}

// The member's own store connection waits in the barrier (a TCPStore handle
// serves one request at a time): the joiner's notice must not need it. It
// once did (the member settled the same-host channel on it), and the join
// then waited out its whole join_timeout.
TEST(GrpcMembership, AMemberInTheShutdownBarrierAnswersAJoinerAtOnce) {
  TcpStoreOptions so;
  so.port = 0;
  so.is_server = true;
  absl::StatusOr<std::unique_ptr<TcpStore>> server = TcpStore::Create(so);
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  GrpcAgentOptions o;
  o.join_timeout = absl::Seconds(60);
  Agents group = StartGroup(
      {"a", "b", "c"}, [port] { return TcpClient(port); }, o);
  ASSERT_EQ(group.size(), 3u);
  absl::Status b_down = absl::UnknownError("not returned");
  std::thread down([&] { b_down = group[1]->Shutdown(); });
  std::shared_ptr<Store> observer = TcpClient(port);
  const bool waiting = PollUntil(
      [&] {
        absl::StatusOr<int64_t> n =
            grpc_agent::ShutdownBarrierArrivals(observer);
        return n.ok() && *n == 1;
      },
      absl::Seconds(30));
  EXPECT_TRUE(waiting);
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<GrpcAgent>> t =
      GrpcAgent::Join("t", TcpClient(port), o);
  const absl::Duration took = absl::Now() - start;
  EXPECT_TRUE(t.ok()) << t.status();
  EXPECT_LT(took, absl::Seconds(20));  // The bug took all 60 s.
  if (t.ok()) {
    GrpcAgent& b = *group[1];
    EXPECT_TRUE(b.GetWorkerInfo("t").ok());
    // b settled the same-host pair with t on a store connection of its own.
    EXPECT_TRUE(b.same_host().UsableTo((*t)->self().id));
    EXPECT_TRUE((*t)->same_host().UsableTo(1));
    EXPECT_TRUE((*t)->Leave().ok());
  }
  std::thread c_down([&] { EXPECT_TRUE(group[2]->Shutdown().ok()); });
  EXPECT_TRUE(group[0]->Shutdown().ok());
  c_down.join();
  down.join();
  EXPECT_TRUE(b_down.ok()) << b_down;
}

// The static group shuts down while "t" joins: its notice to "b" waits in
// b's executor behind a slow call until b is past the barrier, and b then
// refuses it; the join fails at once, naming the group's state and b's, and
// the members that took "t" hear that it left.
TEST(GrpcMembership, AJoinFailsFastWhenTheGroupShutsDownMeanwhile) {
  auto store = std::make_shared<HashStore>();
  auto started = std::make_shared<Notification>();
  auto gate = std::make_shared<Notification>();
  auto registry = std::make_shared<FunctionRegistry>();
  ASSERT_TRUE(registry
                  ->Register("slow",
                             [started, gate](int64_t x) {
                               started->Notify();
                               gate->WaitForNotificationWithTimeout(
                                   absl::Seconds(60));
                               return x + 1;
                             })
                  .ok());
  GrpcAgentOptions o;
  o.num_worker_threads = 1;  // b's one thread runs "slow": notices queue.
  o.join_timeout = absl::Seconds(60);
  o.same_host.enabled = false;
  Agents group = StartGroup(
      {"a", "b"}, [store] { return store; }, o, registry);
  ASSERT_EQ(group.size(), 2u);
  GrpcAgent& b = *group[1];
  absl::StatusOr<std::unique_ptr<GrpcAgent>> j =
      GrpcAgent::Join("j", store, o, registry);
  ASSERT_TRUE(j.ok()) << j.status();
  Future<int64_t> slow = (*j)->rpc_async<int64_t>("b", "slow", int64_t{41});
  ASSERT_TRUE(started->WaitForNotificationWithTimeout(absl::Seconds(30)));

  absl::StatusOr<std::unique_ptr<GrpcAgent>> t =
      absl::UnknownError("not returned");
  absl::Duration took;
  std::thread joining([&] {
    const absl::Time start = absl::Now();
    t = GrpcAgent::Join("t", store, o, registry);
    took = absl::Now() - start;
  });
  EXPECT_TRUE(PollUntil([&] { return b.executor_queue_depth() == 1; },
                        absl::Seconds(30)));
  absl::Status a_down, b_down;
  std::thread down_a([&] { a_down = group[0]->Shutdown(); });
  std::thread down_b([&] { b_down = b.Shutdown(); });
  // Past the barrier, b drains the calls it received: "slow", the notice.
  EXPECT_TRUE(PollUntil([&] { return b.stopping(); }, absl::Seconds(30)));
  gate->Notify();
  joining.join();
  EXPECT_LT(took, absl::Seconds(20));
  EXPECT_EQ(t.status().code(), absl::StatusCode::kFailedPrecondition)
      << t.status();
  const std::string why(t.status().message());
  EXPECT_NE(why.find("worker 't' (id 3) joining: the group is shutting down"),
            std::string::npos)
      << why;
  EXPECT_NE(why.find("worker 'b' (id 1) is shutting down: it does not take "
                     "joiner 't' (id 3)"),
            std::string::npos)
      << why;
  EXPECT_TRUE((*j)->HasLeft(3));
  Result<int64_t> r = slow.Get(absl::Seconds(30));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, 42);
  down_a.join();
  down_b.join();
  EXPECT_TRUE(a_down.ok()) << a_down;
  EXPECT_TRUE(b_down.ok()) << b_down;
  EXPECT_TRUE((*j)->Leave().ok());
}

}  // namespace
}  // namespace ferry::rpc
