#include "rpc/agent.h"

#include <grpcpp/generic/generic_stub.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/sync.h"
#include "gtest/gtest.h"
#include "proto/admin.grpc.pb.h"
#include "store/hash_store.h"
#include "tensor/tensor.h"

namespace ferry::rpc {
namespace {

using Agents = std::vector<std::unique_ptr<RpcAgent>>;

// Starts `names.size()` agents concurrently (Start blocks until all join).
absl::StatusOr<Agents> StartGroup(const std::vector<std::string>& names,
                                  std::shared_ptr<FunctionRegistry> registry,
                                  RpcAgentOptions options = {},
                                  std::shared_ptr<Store> store = nullptr) {
  if (!store) store = std::make_shared<HashStore>();
  const int n = static_cast<int>(names.size());
  std::vector<absl::StatusOr<std::unique_ptr<RpcAgent>>> results(n);
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      results[i] = RpcAgent::Start(names[i], i, n, store, options, registry);
    });
  }
  for (auto& t : threads) t.join();
  Agents agents;
  for (auto& r : results) {
    if (!r.ok()) return r.status();
    agents.push_back(*std::move(r));
  }
  return agents;
}

// Graceful shutdown is collective (a barrier), so every agent shuts down at
// once, each from its own thread.
void ShutdownAll(Agents& agents) {
  std::vector<std::thread> ts;
  for (auto& a : agents) {
    if (a) ts.emplace_back([&a] { EXPECT_TRUE(a->Shutdown().ok()); });
  }
  for (auto& t : ts) t.join();
}

std::shared_ptr<FunctionRegistry> BasicRegistry() {
  auto reg = std::make_shared<FunctionRegistry>();
  EXPECT_TRUE(
      reg->Register("add", [](Tensor a, Tensor b) { return a.add(b); }).ok());
  EXPECT_TRUE(
      reg->Register("concat", [](std::string a,
                                 int64_t b) { return a + std::to_string(b); })
          .ok());
  EXPECT_TRUE(
      reg->Register("whoami",
                    [](const CallContext& ctx) { return ctx.caller_name; })
          .ok());
  EXPECT_TRUE(reg->Register("fail",
                            [](std::string why) -> absl::StatusOr<int64_t> {
                              return absl::PermissionDeniedError(why);
                            })
                  .ok());
  EXPECT_TRUE(reg->Register("noop", [] {}).ok());
  return reg;
}

TEST(RpcAgent, SyncAndAsyncCallsWithTensors) {
  auto agents = StartGroup({"w0", "w1", "w2"}, BasicRegistry());
  ASSERT_TRUE(agents.ok()) << agents.status();
  RpcAgent& w0 = *(*agents)[0];
  Tensor a = arange(0.0, 4.0, 1.0, DType::kFloat32);
  Tensor b = full({4}, 10.0);
  absl::StatusOr<Tensor> sum = w0.rpc_sync<Tensor>("w1", "add", a, b);
  ASSERT_TRUE(sum.ok()) << sum.status();
  EXPECT_EQ(sum->to_vector<float>(), (std::vector<float>{10, 11, 12, 13}));

  Future<std::string> s =
      w0.rpc_async<std::string>(2, "concat", std::string("x"), 7);
  EXPECT_EQ(*s.Get(absl::Seconds(30)), "x7");
  // By WorkerInfo, and to self.
  EXPECT_EQ(*w0.rpc_sync<std::string>(w0.GetWorkerInfos()[1], "whoami"), "w0");
  EXPECT_EQ(*w0.rpc_sync<std::string>("w0", "whoami"), "w0");
  EXPECT_TRUE(w0.rpc_sync<void>("w2", "noop").ok());
  EXPECT_EQ(w0.GetWorkerInfos().size(), 3u);
  ShutdownAll(*agents);
}

TEST(RpcAgent, ErrorsNameWorkerAndFunction) {
  auto agents = StartGroup({"a", "b"}, BasicRegistry());
  ASSERT_TRUE(agents.ok()) << agents.status();
  RpcAgent& a = *(*agents)[0];

  auto unknown = a.rpc_sync<Value>("b", "nope");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(unknown.status().message().find("worker 'b'"), std::string::npos)
      << unknown.status();
  EXPECT_NE(unknown.status().message().find("'nope'"), std::string::npos);

  auto wrong_count = a.rpc_sync<std::string>("b", "concat", std::string("x"));
  EXPECT_EQ(wrong_count.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(wrong_count.status().message().find("concat"), std::string::npos)
      << wrong_count.status();

  auto wrong_type = a.rpc_sync<std::string>("b", "concat", 1, 2);
  EXPECT_EQ(wrong_type.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(wrong_type.status().message().find("expected string"),
            std::string::npos)
      << wrong_type.status();

  auto own = a.rpc_sync<int64_t>("b", "fail", std::string("no access"));
  EXPECT_EQ(own.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(
      own.status().message().find("worker 'b' function 'fail': no access"),
      std::string::npos)
      << own.status();

  auto no_worker = a.rpc_sync<Value>("zed", "noop");
  EXPECT_EQ(no_worker.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(no_worker.status().message().find("'zed'"), std::string::npos);
  EXPECT_EQ(a.rpc_sync<Value>(5, "noop").status().code(),
            absl::StatusCode::kNotFound);

  // Result type mismatch on the caller side.
  auto mismatch = a.rpc_sync<Tensor>("b", "concat", std::string("x"), 1);
  EXPECT_EQ(mismatch.status().code(), absl::StatusCode::kInvalidArgument);
  ShutdownAll(*agents);
}

TEST(RpcAgent, TimeoutIsDeadlineExceededNamingTheCall) {
  auto reg = BasicRegistry();
  auto release = std::make_shared<Notification>();
  ASSERT_TRUE(reg->Register("block",
                            [release] {
                              release->WaitForNotificationWithTimeout(
                                  absl::Seconds(30));
                            })
                  .ok());
  auto agents = StartGroup({"a", "b"}, reg);
  ASSERT_TRUE(agents.ok()) << agents.status();
  Future<Value> f =
      (*agents)[0]->CallAsync("b", "block", {}, absl::Milliseconds(200));
  Result<Value> r = f.Get(absl::Seconds(30));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded)
      << r.status();
  EXPECT_NE(r.status().message().find("worker 'b' function 'block'"),
            std::string::npos)
      << r.status();
  EXPECT_NE(r.status().message().find("200ms"), std::string::npos)
      << r.status();
  auto typed = (*agents)[0]->rpc_sync_for<void>(absl::Milliseconds(100), "b", "block");
  EXPECT_EQ(typed.code(), absl::StatusCode::kDeadlineExceeded) << typed;
  EXPECT_NE(typed.message().find("100ms"), std::string::npos) << typed;
  release->Notify();
  ShutdownAll(*agents);
}

TEST(RpcAgent, AsyncFunctionDoesNotHoldAThread) {
  // One worker thread: if "wait_for_signal" held it, "signal" could never run.
  auto reg = std::make_shared<FunctionRegistry>();
  auto pending = std::make_shared<Promise<int64_t>>();
  ASSERT_TRUE(reg->Register("wait_for_signal",
                            [pending] { return pending->GetFuture(); })
                  .ok());
  ASSERT_TRUE(
      reg->Register("signal", [pending](int64_t v) { pending->SetValue(v); })
          .ok());
  RpcAgentOptions opts;
  opts.num_worker_threads = 1;
  auto agents = StartGroup({"a", "b"}, reg, opts);
  ASSERT_TRUE(agents.ok()) << agents.status();
  RpcAgent& a = *(*agents)[0];
  Future<int64_t> waiting = a.rpc_async<int64_t>("b", "wait_for_signal");
  ASSERT_TRUE(a.rpc_sync<void>("b", "signal", 42).ok());
  EXPECT_EQ(*waiting.Get(absl::Seconds(30)), 42);
  ShutdownAll(*agents);
}

TEST(RpcAgent, NestedCallsAndCallbacksToTheCaller) {
  auto reg = std::make_shared<FunctionRegistry>();
  // Filled once the agents exist; functions only run after that.
  // (Atomic: the hand-off to the serving thread goes through gRPC, whose
  // synchronization TSAN cannot see.)
  auto agents_ptr = std::make_shared<std::atomic<Agents*>>(nullptr);
  ASSERT_TRUE(reg->Register("leaf", [](int64_t x) { return x * 2; }).ok());
  ASSERT_TRUE(
      reg->Register("relay",
                    [agents_ptr](const CallContext& ctx,
                                 int64_t x) -> absl::StatusOr<int64_t> {
                      Agents& ag = *agents_ptr->load();
                      RpcAgent& me = *ag[1];
                      // Call a third worker, then call back the caller.
                      ASSIGN_OR_RETURN(int64_t y,
                                       me.rpc_sync<int64_t>("c", "leaf", x));
                      return me.rpc_sync<int64_t>(ctx.caller_name, "leaf", y);
                    })
          .ok());
  RpcAgentOptions opts;
  opts.num_worker_threads = 2;
  auto agents = StartGroup({"a", "b", "c"}, reg, opts);
  ASSERT_TRUE(agents.ok()) << agents.status();
  agents_ptr->store(&*agents);
  EXPECT_EQ(*(*agents)[0]->rpc_sync<int64_t>("b", "relay", 5), 20);
  // Several at once, more than the worker threads.
  std::vector<Future<int64_t>> fs;
  for (int i = 0; i < 8; ++i)
    fs.push_back((*agents)[0]->rpc_async<int64_t>("b", "relay", i));
  auto all = CollectAll(fs).Get(absl::Seconds(60));
  ASSERT_TRUE(all.ok()) << all.status();
  for (int i = 0; i < 8; ++i) EXPECT_EQ((*all)[i], 4 * i);
  ShutdownAll(*agents);
}

TEST(RpcAgent, ThousandsOfConcurrentAsyncCalls) {
  auto agents = StartGroup({"a", "b"}, BasicRegistry());
  ASSERT_TRUE(agents.ok()) << agents.status();
  constexpr int kCalls = 3000;
  std::vector<Future<std::string>> fs;
  fs.reserve(kCalls);
  for (int i = 0; i < kCalls; ++i) {
    fs.push_back((*agents)[i % 2]->rpc_async<std::string>(1 - i % 2, "concat",
                                                          std::string("n"), i));
  }
  auto all = CollectAll(fs).Get(absl::Seconds(120));
  ASSERT_TRUE(all.ok()) << all.status();
  for (int i = 0; i < kCalls; ++i)
    ASSERT_EQ((*all)[i], "n" + std::to_string(i));
  ShutdownAll(*agents);
}

TEST(RpcAgent, DuplicateNameFailsOnEveryWorker) {
  auto store = std::make_shared<HashStore>();
  RpcAgentOptions opts;
  opts.join_timeout = absl::Seconds(30);
  auto agents = StartGroup({"x", "y", "x"}, BasicRegistry(), opts, store);
  ASSERT_FALSE(agents.ok());
  EXPECT_EQ(agents.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(agents.status().message().find(
                "worker name 'x' is used by ranks 0 and 2"),
            std::string::npos)
      << agents.status();
}

TEST(RpcAgent, DuplicateRankFailsOnEveryWorker) {
  auto store = std::make_shared<HashStore>();
  RpcAgentOptions opts;
  std::vector<absl::Status> results(3);
  std::vector<std::thread> ts;
  const int ranks[] = {0, 1, 1};
  const char* names[] = {"p", "q", "r"};
  for (int i = 0; i < 3; ++i) {
    ts.emplace_back([&, i] {
      results[i] = RpcAgent::Start(names[i], ranks[i], 3, store, opts).status();
    });
  }
  for (auto& t : ts) t.join();
  for (const absl::Status& s : results) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find("rank 1 is claimed by workers"),
              std::string::npos)
        << s;
    EXPECT_NE(s.message().find("no worker has rank 2"), std::string::npos) << s;
  }
}

TEST(RpcAgent, MissingWorkerTimesOutJoining) {
  auto store = std::make_shared<HashStore>();
  RpcAgentOptions opts;
  opts.join_timeout = absl::Milliseconds(300);
  auto a = RpcAgent::Start("lonely", 0, 2, store, opts);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kDeadlineExceeded)
      << a.status();
  EXPECT_NE(a.status().message().find(
                "worker 'lonely' (rank 0) waiting for 2 workers"),
            std::string::npos)
      << a.status();
}

TEST(RpcAgent, DeadPeerGivesUnavailableNotAHang) {
  auto agents = StartGroup({"a", "b"}, BasicRegistry());
  ASSERT_TRUE(agents.ok()) << agents.status();
  ASSERT_TRUE((*agents)[1]->Shutdown(/*graceful=*/false).ok());
  (*agents)[1].reset();
  Future<Value> f = (*agents)[0]->CallAsync("b", "noop", {}, absl::Seconds(20));
  Result<Value> r = f.Get(absl::Seconds(30));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_NE(r.status().message().find("worker 'b'"), std::string::npos)
      << r.status();
  EXPECT_TRUE((*agents)[0]->Shutdown(/*graceful=*/false).ok());
}

TEST(RpcAgent, MalformedEnvelopesAreRejectedAndTheServerLives) {
  auto agents = StartGroup({"a", "b"}, BasicRegistry());
  ASSERT_TRUE(agents.ok()) << agents.status();
  auto channel = grpc::CreateChannel((*agents)[1]->address(),
                                     grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  const std::vector<std::string> bad = {
      std::string("\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff",
                  11),                             // Endless varint.
      std::string("\x7a\x80\x80\x80\x80\x10", 6),  // Payload of 4 GiB, absent.
      std::string("\x0b\x00", 2),                  // Group wire type.
      std::string("\x12\x03no", 4),                // Truncated function name.
      std::string("\x08\x01\x12\x04noop\x7a\x04FRY1",
                  14),  // Truncated value stream.
  };
  for (const std::string& bytes : bad) {
    grpc::Slice slice(bytes);
    grpc::ByteBuffer request(&slice, 1), response;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(30));
    Notification done;
    grpc::Status status;
    stub.UnaryCall(&ctx, "/ferry.rpc.v1.Worker/Call", grpc::StubOptions(),
                   &request, &response, [&](grpc::Status s) {
                     status = s;
                     done.Notify();
                   });
    done.WaitForNotification();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << status.error_message();
    EXPECT_NE(status.error_message().find("worker 'b'"), std::string::npos)
        << status.error_message();
  }
  EXPECT_EQ(
      *(*agents)[0]->rpc_sync<std::string>("b", "concat", std::string("ok"), 1),
      "ok1");
  ShutdownAll(*agents);
}

TEST(RpcAgent, NonGracefulShutdownCancelsCallsInFlight) {
  auto reg = BasicRegistry();
  auto release = std::make_shared<Notification>();
  ASSERT_TRUE(reg->Register("block",
                            [release] {
                              release->WaitForNotificationWithTimeout(
                                  absl::Seconds(30));
                            })
                  .ok());
  auto agents = StartGroup({"a", "b"}, reg);
  ASSERT_TRUE(agents.ok()) << agents.status();
  Future<Value> f = (*agents)[0]->CallAsync("b", "block", {});
  ASSERT_TRUE((*agents)[0]->Shutdown(/*graceful=*/false).ok());
  Result<Value> r = f.Get(absl::Seconds(30));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kCancelled) << r.status();
  EXPECT_EQ((*agents)[0]->rpc_sync<Value>("b", "noop").status().code(),
            absl::StatusCode::kUnavailable);
  release->Notify();
  EXPECT_TRUE((*agents)[0]->Shutdown().ok());  // Idempotent.
  EXPECT_TRUE((*agents)[1]->Shutdown(/*graceful=*/false).ok());
}

TEST(RpcAgent, GracefulShutdownDrainsCallsInFlight) {
  auto reg = BasicRegistry();
  auto gate = std::make_shared<Notification>();
  ASSERT_TRUE(reg->Register("slow",
                            [gate](int64_t x) {
                              gate->WaitForNotificationWithTimeout(
                                  absl::Seconds(30));
                              return x + 1;
                            })
                  .ok());
  auto agents = StartGroup({"a", "b"}, reg);
  ASSERT_TRUE(agents.ok()) << agents.status();
  std::vector<Future<int64_t>> fs;
  for (int i = 0; i < 4; ++i)
    fs.push_back((*agents)[0]->rpc_async<int64_t>("b", "slow", i));
  // b's graceful shutdown waits at the barrier for a, whose calls are still
  // running on b; a finishes only once the gate opens.
  std::thread b_down([&] { EXPECT_TRUE((*agents)[1]->Shutdown().ok()); });
  gate->Notify();
  EXPECT_TRUE((*agents)[0]->Shutdown().ok());
  b_down.join();
  for (int i = 0; i < 4; ++i) EXPECT_EQ(*fs[i].Get(absl::Seconds(1)), i + 1);
}

TEST(RpcAgent, AdminServiceReportsWorkersFunctionsAndStats) {
  auto agents = StartGroup({"a", "b"}, BasicRegistry());
  ASSERT_TRUE(agents.ok()) << agents.status();
  ASSERT_TRUE((*agents)[0]
                  ->rpc_sync<std::string>("b", "concat", std::string("s"), 1)
                  .ok());
  auto channel = grpc::CreateChannel((*agents)[1]->address(),
                                     grpc::InsecureChannelCredentials());
  auto admin = ferry::admin::v1::Admin::NewStub(channel);
  {
    grpc::ClientContext ctx;
    ferry::admin::v1::WorkerInfo info;
    ASSERT_TRUE(admin->GetWorkerInfo(&ctx, {}, &info).ok());
    EXPECT_EQ(info.name(), "b");
    EXPECT_EQ(info.rank(), 1);
    EXPECT_EQ(info.world_size(), 2);
  }
  {
    grpc::ClientContext ctx;
    ferry::admin::v1::ListFunctionsResponse fns;
    ASSERT_TRUE(admin->ListFunctions(&ctx, {}, &fns).ok());
    bool found = false;
    for (const auto& f : fns.functions()) {
      if (f.name() == "concat") {
        found = true;
        EXPECT_EQ(f.signature(), "(string, int64) -> string");
      }
    }
    EXPECT_TRUE(found);
  }
  {
    grpc::ClientContext ctx;
    ferry::admin::v1::GetStatsResponse stats;
    ASSERT_TRUE(admin->GetStats(&ctx, {}, &stats).ok());
    EXPECT_EQ(stats.total_calls_in(), 1u);
    ASSERT_EQ(stats.functions_size(), 1);
    EXPECT_EQ(stats.functions(0).function(), "concat");
    EXPECT_GT(stats.functions(0).bytes_in(), 0u);
  }
  ShutdownAll(*agents);
}

}  // namespace
}  // namespace ferry::rpc
