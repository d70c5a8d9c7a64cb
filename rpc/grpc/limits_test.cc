// Abuse limits of the gRPC agent's server: in-flight call caps (total and per
// connection), oversize messages, unregistered functions.
#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "ferry/common/poll.h"
#include "ferry/common/sync.h"
#include "gtest/gtest.h"
#include "ferry/proto/rpc.grpc.pb.h"
#include "ferry/rpc/grpc/agent.h"
#include "ferry/store/hash_store.h"
#include "ferry/tensor/tensor.h"

namespace ferry::rpc {
namespace {

// A function that blocks its executor thread until released, counting the
// calls that entered it.
struct Gate {
  Mutex mu;
  int entered ABSL_GUARDED_BY(mu) = 0;
  bool open ABSL_GUARDED_BY(mu) = false;

  int64_t Pass(int64_t x) {
    {
      // Released before awaiting: ferry::Mutex wakes waiters on Unlock, and
      // an Await that starts waiting does not (AwaitEntered would miss it).
      MutexLock lock(&mu);
      ++entered;
    }
    MutexLock lock(&mu);
    mu.AwaitWithTimeout(absl::Condition(&open), absl::Seconds(30));
    return x;
  }
  bool AwaitEntered(int n) {
    MutexLock lock(&mu);
    auto reached = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      return entered >= n;
    };
    return mu.AwaitWithTimeout(absl::Condition(&reached), absl::Seconds(30));
  }
  void Open() {
    MutexLock lock(&mu);
    open = true;
  }
};

std::vector<std::unique_ptr<GrpcAgent>> StartPair(GrpcAgentOptions server,
                                                  Gate* gate) {
  auto store = std::make_shared<HashStore>();
  auto registry = std::make_shared<FunctionRegistry>();
  EXPECT_TRUE(
      registry->Register("pass", [gate](int64_t x) { return gate->Pass(x); })
          .ok());
  EXPECT_TRUE(
      registry->Register("size", [](Tensor t) { return t.numel(); }).ok());
  std::vector<std::unique_ptr<GrpcAgent>> agents(2);
  std::thread t([&] {
    auto b = GrpcAgent::Start("b", 1, 2, store, server, registry);
    EXPECT_TRUE(b.ok()) << b.status();
    if (b.ok()) agents[1] = *std::move(b);
  });
  auto a = GrpcAgent::Start("a", 0, 2, store, {}, registry);
  EXPECT_TRUE(a.ok()) << a.status();
  if (a.ok()) agents[0] = *std::move(a);
  t.join();
  return agents;
}

void StopAll(std::vector<std::unique_ptr<GrpcAgent>>& agents) {
  for (auto& a : agents) {
    if (a) {
      EXPECT_TRUE(a->Shutdown(/*graceful=*/false).ok());
    }
  }
}

// Fills `limit` slots with blocked calls, checks that one more is refused
// naming `limit_name`, then releases them: all complete, and calls are
// served again.
void CheckInFlightCap(GrpcAgentOptions options, int limit,
                      const std::string& limit_name) {
  Gate gate;
  auto agents = StartPair(options, &gate);
  ASSERT_TRUE(agents[0] && agents[1]);
  GrpcAgent& a = *agents[0];
  std::vector<Future<int64_t>> held;
  for (int i = 0; i < limit; ++i) {
    held.push_back(a.rpc_async<int64_t>("b", "pass", int64_t{i}));
  }
  ASSERT_TRUE(gate.AwaitEntered(limit));
  EXPECT_EQ(agents[1]->calls_in_flight(), limit);
  Result<int64_t> over = a.rpc_sync<int64_t>("b", "pass", int64_t{99});
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted)
      << over.status();
  EXPECT_TRUE(absl::StrContains(over.status().message(), limit_name))
      << over.status();
  EXPECT_TRUE(absl::StrContains(over.status().message(), "worker 'b'"))
      << over.status();
  gate.Open();
  for (int i = 0; i < limit; ++i) EXPECT_EQ(held[i].Get().value_or(-1), i);
  EXPECT_EQ(a.rpc_sync<int64_t>("b", "pass", int64_t{7}).value_or(-1), 7);
  // The callee frees a call's slot after it has sent the reply, so the
  // caller can hold the reply a moment before the count drops.
  PollUntil([&] { return agents[1]->calls_in_flight() == 0; },
            absl::Seconds(10));
  EXPECT_EQ(agents[1]->calls_in_flight(), 0);
  StopAll(agents);
}

TEST(GrpcAgentLimits, PerConnectionInFlightCap) {
  GrpcAgentOptions options;
  options.max_inflight_calls_per_connection = 3;
  CheckInFlightCap(options, 3, "max_inflight_calls_per_connection = 3");
}

TEST(GrpcAgentLimits, TotalInFlightCap) {
  GrpcAgentOptions options;
  options.max_inflight_calls = 2;
  options.max_inflight_calls_per_connection = 0;  // unlimited
  CheckInFlightCap(options, 2, "max_inflight_calls = 2");
}

// A message over the receiver's limit is refused from its declared length
// (gRPC checks the frame header before reading the body), and the server
// carries on.
TEST(GrpcAgentLimits, OversizeMessageRefused) {
  Gate gate;
  GrpcAgentOptions options;
  options.max_message_bytes = 1 << 20;
  auto agents = StartPair(options, &gate);
  ASSERT_TRUE(agents[0] && agents[1]);
  // Through Ferry: the caller allows 2 GiB, the callee 1 MiB.
  Result<int64_t> big =
      agents[0]->rpc_sync<int64_t>("b", "size", zeros({1 << 19}));  // 2 MiB
  EXPECT_EQ(big.status().code(), absl::StatusCode::kResourceExhausted)
      << big.status();
  // A raw client with no send limit, sending a 4 MiB envelope.
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(-1);
  auto stub = ferry::rpc::v1::Worker::NewStub(grpc::CreateCustomChannel(
      agents[1]->address(), grpc::InsecureChannelCredentials(), args));
  ferry::rpc::v1::RpcRequest request;
  request.set_function(std::string(4 << 20, 'x'));
  ferry::rpc::v1::RpcResponse response;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  grpc::Status status = stub->Call(&ctx, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << status.error_message();
  EXPECT_EQ(agents[0]->rpc_sync<int64_t>("b", "size", zeros({4})).value_or(0),
            4);
  StopAll(agents);
}

// Only registered functions run: any other name is refused, naming it, and
// nothing runs on the callee.
TEST(GrpcAgentLimits, UnregisteredFunctionRefused) {
  Gate gate;
  auto agents = StartPair({}, &gate);
  ASSERT_TRUE(agents[0] && agents[1]);
  Result<Value> r = agents[0]->rpc_sync<Value>("b", "system", "rm -rf /");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "'system'"))
      << r.status();
  {
    MutexLock lock(&gate.mu);
    EXPECT_EQ(gate.entered, 0);
  }
  StopAll(agents);
}

}  // namespace
}  // namespace ferry::rpc
