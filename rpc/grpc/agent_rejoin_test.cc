// A worker restarted under its name (rpc/grpc/agent.h, Join): a static
// member that dies without leaving is evicted by a joiner of the same name
// once its health probe fails; calls by name then reach the new process, and
// Agent::WaitForWorker lets a caller wait (bounded) for it to be back.
// Design: docs/design/checkpoints.md ("Rejoining under a name").
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "ferry/rpc/grpc/agent.h"
#include "ferry/rpc/testing/grpc_cluster.h"
#include "ferry/store/hash_store.h"
#include "gtest/gtest.h"

namespace ferry::rpc {
namespace {

std::shared_ptr<FunctionRegistry> Incarnation(int64_t n) {
  auto reg = std::make_shared<FunctionRegistry>();
  EXPECT_TRUE(reg->Register("incarnation", [n] { return n; }).ok());
  return reg;
}

GrpcAgentOptions Options() {
  GrpcAgentOptions o;
  o.join_timeout = absl::Seconds(30);
  o.peer_probe_timeout = absl::Seconds(2);
  o.rpc_timeout = absl::Seconds(20);
  return o;
}

// A static group of "trainer" and "ps0" on `store`, each serving
// "incarnation" = 1.
absl::StatusOr<std::vector<std::unique_ptr<GrpcAgent>>> StartTrainerAndPs(
    std::shared_ptr<HashStore> store) {
  testing::GrpcGroupSpec spec;
  spec.names = {"trainer", "ps0"};
  spec.registry = Incarnation(1);
  spec.store = std::move(store);
  spec.options = [](int) { return Options(); };
  return testing::StartGrpcGroup(spec);
}

TEST(GrpcRejoin, ARestartedWorkerTakesItsNameBack) {
  auto store = std::make_shared<HashStore>();
  absl::StatusOr<std::vector<std::unique_ptr<GrpcAgent>>> group =
      StartTrainerAndPs(store);
  ASSERT_TRUE(group.ok()) << group.status();
  GrpcAgent& trainer = *(*group)[0];
  Result<int64_t> first = trainer.rpc_sync<int64_t>("ps0", "incarnation");
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(*first, 1);
  const int old_id = (*group)[1]->self().id;

  // SIGKILL's stand-in in one process: the server stops without leaving
  // (no leave event, no notice; its port closes).
  ASSERT_TRUE((*group)[1]->Shutdown(/*graceful=*/false).ok());
  (*group)[1].reset();
  Result<int64_t> lost = trainer.rpc_sync<int64_t>("ps0", "incarnation");
  ASSERT_FALSE(lost.ok());
  EXPECT_EQ(lost.status().code(), absl::StatusCode::kUnavailable)
      << lost.status();
  EXPECT_NE(lost.status().message().find("ps0"), std::string::npos)
      << lost.status();

  // Nobody back yet: the wait is bounded and names the worker.
  absl::StatusOr<WorkerInfo> early =
      trainer.WaitForWorker("ps0", absl::Milliseconds(200), old_id);
  EXPECT_EQ(early.status().code(), absl::StatusCode::kDeadlineExceeded)
      << early.status();
  EXPECT_NE(early.status().message().find("'ps0'"), std::string::npos)
      << early.status();

  // The trainer waits while the server restarts under its name.
  absl::StatusOr<WorkerInfo> back = absl::UnknownError("not returned");
  std::thread waiter(
      [&] { back = trainer.WaitForWorker("ps0", absl::Seconds(60), old_id); });
  absl::StatusOr<std::unique_ptr<GrpcAgent>> restarted =
      GrpcAgent::Join("ps0", store, Options(), Incarnation(2));
  waiter.join();
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  const int new_id = (*restarted)->self().id;
  EXPECT_NE(new_id, old_id);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->id, new_id);
  EXPECT_EQ(back->address, (*restarted)->address());
  EXPECT_TRUE(trainer.HasLeft(old_id));

  // Calls by name reach the new process.
  Result<int64_t> second = trainer.rpc_sync<int64_t>("ps0", "incarnation");
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(*second, 2);
  // And the restarted worker reaches the trainer.
  EXPECT_EQ(*(*restarted)->rpc_sync<int64_t>("trainer", "incarnation"), 1);

  // A live holder keeps its name: a second joiner is refused.
  GrpcAgentOptions dup_options = Options();
  dup_options.join_timeout = absl::Seconds(10);
  absl::StatusOr<std::unique_ptr<GrpcAgent>> dup =
      GrpcAgent::Join("ps0", store, dup_options, Incarnation(3));
  ASSERT_FALSE(dup.ok());
  EXPECT_EQ(dup.status().code(), absl::StatusCode::kAlreadyExists)
      << dup.status();
  EXPECT_NE(dup.status().message().find("answers its health probe"),
            std::string::npos)
      << dup.status();
  Result<int64_t> still = trainer.rpc_sync<int64_t>("ps0", "incarnation");
  ASSERT_TRUE(still.ok()) << still.status();
  EXPECT_EQ(*still, 2);

  // The group ends gracefully: the joined worker leaves, and the static
  // group's barrier counts the evicted member as arrived.
  EXPECT_TRUE((*restarted)->Leave(absl::Seconds(30)).ok());
  absl::Status down = trainer.Shutdown(/*graceful=*/true, absl::Seconds(30));
  EXPECT_TRUE(down.ok()) << down;
}

// A restarted worker bound to its predecessor's fixed address must not take
// its own health answer for the dead holder's: the eviction probe asks for
// the holder's identity service, which only the holder's server knows.
TEST(GrpcRejoin, ARestartedWorkerOnTheSameFixedAddressTakesItsNameBack) {
  auto store = std::make_shared<HashStore>();
  absl::StatusOr<std::vector<std::unique_ptr<GrpcAgent>>> group =
      StartTrainerAndPs(store);
  ASSERT_TRUE(group.ok()) << group.status();
  GrpcAgent& trainer = *(*group)[0];
  const std::string address = (*group)[1]->address();
  ASSERT_TRUE((*group)[1]->Shutdown(/*graceful=*/false).ok());
  (*group)[1].reset();
  GrpcAgentOptions same = Options();
  same.listen_address = address;
  absl::StatusOr<std::unique_ptr<GrpcAgent>> restarted =
      GrpcAgent::Join("ps0", store, same, Incarnation(2));
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  EXPECT_EQ((*restarted)->address(), address);
  Result<int64_t> second = trainer.rpc_sync<int64_t>("ps0", "incarnation");
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(*second, 2);
  EXPECT_TRUE((*restarted)->Leave(absl::Seconds(30)).ok());
  EXPECT_TRUE(trainer.Shutdown(/*graceful=*/true, absl::Seconds(30)).ok());
}

TEST(GrpcRejoin, WaitForWorkerReturnsALiveWorkerAtOnce) {
  testing::GrpcGroupSpec spec;
  spec.names = {"a", "b"};
  spec.options = [](int) { return Options(); };
  absl::StatusOr<std::vector<std::unique_ptr<GrpcAgent>>> group =
      testing::StartGrpcGroup(spec);
  ASSERT_TRUE(group.ok()) << group.status();
  absl::StatusOr<WorkerInfo> b =
      (*group)[0]->WaitForWorker("b", absl::Seconds(10));
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->id, 1);
  absl::StatusOr<WorkerInfo> none =
      (*group)[0]->WaitForWorker("zz", absl::Milliseconds(50));
  EXPECT_EQ(none.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(testing::ShutdownGrpcGroup(*group).ok());
}

}  // namespace
}  // namespace ferry::rpc
