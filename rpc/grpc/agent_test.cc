#include "ferry/rpc/grpc/agent.h"

#include <grpcpp/generic/generic_stub.h>

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "ferry/common/poll.h"
#include "ferry/common/sync.h"
#include "gtest/gtest.h"
#include "ferry/proto/admin.grpc.pb.h"
#include "ferry/proto/rpc.pb.h"
#include "ferry/rpc/testing/grpc_cluster.h"
#include "ferry/rpc/grpc/codec.h"
#include "ferry/store/hash_store.h"
#include "ferry/store/prefix_store.h"
#include "ferry/tensor/tensor.h"

namespace ferry::rpc {
namespace {

using Agents = std::vector<std::unique_ptr<GrpcAgent>>;

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

// Waits (bounded) until `cond` holds; polls observable state.
bool Eventually(const std::function<bool()>& cond,
                absl::Duration limit = absl::Seconds(30)) {
  return PollUntil(cond, limit);
}

// One Worker/Call with raw bytes, as a foreign client would send it.
class RawCall {
 public:
  RawCall(grpc::GenericStub& stub, grpc::ByteBuffer request,
          absl::Duration timeout)
      : request_(std::move(request)) {
    context_.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    stub.UnaryCall(&context_, "/ferry.rpc.v1.Worker/Call", grpc::StubOptions(),
                   &request_, &response_, [this](grpc::Status s) {
                     MutexLock lock(&mu_);
                     status_ = std::move(s);
                   });
  }
  // Waits for the call's end (gRPC's deadline bounds it).
  grpc::Status Wait() {
    MutexLock lock(&mu_);
    auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return status_.has_value();
    };
    mu_.Await(absl::Condition(&done));
    return *status_;
  }
  const grpc::ByteBuffer& response() const { return response_; }

 private:
  grpc::ClientContext context_;
  grpc::ByteBuffer request_;
  grpc::ByteBuffer response_;
  Mutex mu_;
  std::optional<grpc::Status> status_ ABSL_GUARDED_BY(mu_);
};

grpc::ByteBuffer BytesOf(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

TEST(GrpcAgent, DuplicateNameFailsOnEveryWorker) {
  auto store = std::make_shared<HashStore>();
  GrpcAgentOptions opts;
  opts.join_timeout = absl::Seconds(30);
  auto agents = testing::StartGrpcGroup({"x", "y", "x"}, BasicRegistry(), opts, store);
  ASSERT_FALSE(agents.ok());
  EXPECT_EQ(agents.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(agents.status().message().find(
                "worker name 'x' is used by ranks 0 and 2"),
            std::string::npos)
      << agents.status();
}

TEST(GrpcAgent, DuplicateRankFailsOnEveryWorker) {
  auto store = std::make_shared<HashStore>();
  GrpcAgentOptions opts;
  std::vector<absl::Status> results(3);
  std::vector<std::thread> ts;
  const int ranks[] = {0, 1, 1};
  const char* names[] = {"p", "q", "r"};
  for (int i = 0; i < 3; ++i) {
    ts.emplace_back([&, i] {
      results[i] =
          GrpcAgent::Start(names[i], ranks[i], 3, store, opts).status();
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

TEST(GrpcAgent, MissingWorkerTimesOutJoining) {
  auto store = std::make_shared<HashStore>();
  GrpcAgentOptions opts;
  opts.join_timeout = absl::Milliseconds(300);
  auto a = GrpcAgent::Start("lonely", 0, 2, store, opts);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kDeadlineExceeded)
      << a.status();
  EXPECT_NE(a.status().message().find(
                "worker 'lonely' (rank 0) waiting for 2 workers"),
            std::string::npos)
      << a.status();
}

// Join needs a running group: without one it fails at its join_timeout,
// naming the worker.
TEST(GrpcAgent, JoinWithoutARunningGroupTimesOut) {
  auto store = std::make_shared<HashStore>();
  GrpcAgentOptions opts;
  opts.join_timeout = absl::Milliseconds(300);
  auto a = GrpcAgent::Join("late", store, opts);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kDeadlineExceeded)
      << a.status();
  EXPECT_NE(a.status().message().find(
                "worker 'late' joining: no running group formed"),
            std::string::npos)
      << a.status();
}

TEST(GrpcAgent, MalformedEnvelopesAreRejectedAndTheServerLives) {
  auto agents = testing::StartGrpcGroup({"a", "b"}, BasicRegistry());
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
    grpc::Status status =
        RawCall(stub, BytesOf(bytes), absl::Seconds(30)).Wait();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << status.error_message();
    EXPECT_NE(status.error_message().find("worker 'b'"), std::string::npos)
        << status.error_message();
  }
  EXPECT_EQ(
      *(*agents)[0]->rpc_sync<std::string>("b", "concat", std::string("ok"), 1),
      "ok1");
  EXPECT_TRUE(testing::ShutdownGrpcGroup(*agents).ok());
}

TEST(GrpcAgent, AdminServiceReportsWorkersFunctionsAndStats) {
  auto agents = testing::StartGrpcGroup({"a", "b"}, BasicRegistry());
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
  EXPECT_TRUE(testing::ShutdownGrpcGroup(*agents).ok());
}

// Admin Inspect serves what layers registered on the agent (rpc/inspect.h):
// one inspector by name or all; an unknown one is NOT_FOUND naming those
// registered.
TEST(GrpcAgent, AdminInspectServesRegisteredInspectors) {
  auto agents = testing::StartGrpcGroup({"a", "b"}, BasicRegistry());
  ASSERT_TRUE(agents.ok()) << agents.status();
  std::atomic<int> live{3};
  ASSERT_TRUE(
      (*agents)[1]
          ->inspectors()
          .Register("toy",
                    [&live] {
                      return std::vector<InspectionRow>{
                          {"counter", {{"live", std::to_string(live.load())}}}};
                    })
          .ok());
  auto channel = grpc::CreateChannel((*agents)[1]->address(),
                                     grpc::InsecureChannelCredentials());
  auto admin = ferry::admin::v1::Admin::NewStub(channel);
  for (int expect : {3, 5}) {
    live = expect;
    grpc::ClientContext ctx;
    ferry::admin::v1::InspectRequest req;
    req.set_inspector("toy");
    ferry::admin::v1::InspectResponse resp;
    grpc::Status s = admin->Inspect(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(resp.worker(), "b");
    ASSERT_EQ(resp.inspections_size(), 1);
    EXPECT_EQ(resp.inspections(0).inspector(), "toy");
    ASSERT_EQ(resp.inspections(0).rows_size(), 1);
    EXPECT_EQ(resp.inspections(0).rows(0).kind(), "counter");
    EXPECT_EQ(resp.inspections(0).rows(0).fields().at("live"),
              std::to_string(expect));
  }
  {
    grpc::ClientContext ctx;
    ferry::admin::v1::InspectRequest req;
    req.set_inspector("nope");
    ferry::admin::v1::InspectResponse resp;
    grpc::Status s = admin->Inspect(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
    EXPECT_NE(s.error_message().find("toy"), std::string::npos)
        << s.error_message();
  }
  {
    // Worker a has none: an empty list, not an error.
    auto ca = grpc::CreateChannel((*agents)[0]->address(),
                                  grpc::InsecureChannelCredentials());
    grpc::ClientContext ctx;
    ferry::admin::v1::InspectResponse resp;
    ASSERT_TRUE(
        ferry::admin::v1::Admin::NewStub(ca)->Inspect(&ctx, {}, &resp).ok());
    EXPECT_EQ(resp.inspections_size(), 0);
  }
  EXPECT_TRUE(testing::ShutdownGrpcGroup(*agents).ok());
}

// Every message type with a handler is served; others are refused naming
// the worker and the type, and the server lives on.
TEST(GrpcAgent, ServesRegisteredMessageTypesAndRefusesOthers) {
  auto agents = testing::StartGrpcGroup({"a", "b"}, BasicRegistry());
  ASSERT_TRUE(agents.ok()) << agents.status();
  constexpr auto kToy = static_cast<MessageType>(1001);
  ASSERT_TRUE((*agents)[1]
                  ->RegisterHandler(kToy,
                                    [](Message m) {
                                      Message reply;
                                      reply.payload = Value::String(
                                          m.caller_name + ":" + m.function);
                                      return MakeReadyFuture<Message>(reply);
                                    })
                  .ok());
  auto channel = grpc::CreateChannel((*agents)[1]->address(),
                                     grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  auto raw_call = [&](uint32_t type) {
    ferry::rpc::v1::RpcRequest header;
    header.set_type(static_cast<ferry::rpc::v1::MessageType>(type));
    header.set_function("f");
    header.set_caller_name("grpcurl");
    return RawCall(stub, BytesOf(header.SerializeAsString()), absl::Seconds(30))
        .Wait();
  };
  grpc::Status served = raw_call(1001);
  EXPECT_TRUE(served.ok()) << served.error_message();
  for (uint32_t type : {1002u, 10u, 0u}) {
    grpc::Status refused = raw_call(type);
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNIMPLEMENTED);
    EXPECT_NE(refused.error_message().find("worker 'b' does not serve"),
              std::string::npos)
        << refused.error_message();
  }
  // Through the agent, the same type works with its payload.
  Message m;
  m.type = kToy;
  m.function = "hello";
  auto r = (*agents)[0]->Send("b", m).Get(absl::Seconds(30));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r->payload.if_string(), "a:hello");
  EXPECT_TRUE(testing::ShutdownGrpcGroup(*agents).ok());
}

// A request that reaches a worker before it knows its group (its server is
// up and its join record written, the other worker not there yet) waits for
// the group and then sees it, or fails at its deadline; it never runs against
// an empty group. The test plays the fast peer with raw calls.
TEST(GrpcAgent, RequestsBeforeTheGroupIsKnownWaitForIt) {
  auto store = std::make_shared<HashStore>();
  std::atomic<Agent*> b_agent{nullptr};
  GrpcAgentOptions options;
  options.before_serving = [&b_agent](Agent& agent) {
    b_agent = &agent;
    return agent.Register(
        "group",
        [&agent](const CallContext& ctx) -> absl::StatusOr<std::string> {
          absl::StatusOr<WorkerInfo> caller =
              agent.GetWorkerInfo(ctx.caller_id);
          if (!caller.ok()) return caller.status();
          return absl::StrCat(agent.world_size(), " workers, caller ",
                              caller->name);
        });
  };
  options.join_timeout = absl::Seconds(60);
  options.enable_admin_invoke = true;
  absl::StatusOr<std::unique_ptr<GrpcAgent>> b;
  std::thread b_starts(
      [&] { b = GrpcAgent::Start("b", 1, 2, store, options); });
  absl::Cleanup join_b = [&b_starts] {
    if (b_starts.joinable()) b_starts.join();
  };
  // b joined first (join record 0), so it serves and waits for rank 0.
  PrefixStore rendezvous("rpc/", store);
  ASSERT_TRUE(rendezvous.Wait({"join/0"}, absl::Seconds(30)).ok());
  std::vector<std::string> record =
      absl::StrSplit(*rendezvous.Get("join/0"), '\n');
  ASSERT_EQ(record.size(), 3u);
  auto channel =
      grpc::CreateChannel(record[2], grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  auto request = [](absl::Duration timeout) {
    Message m;
    m.type = MessageType::kCall;
    m.function = "group";
    m.id = GlobalId(0, 1);
    m.caller_name = "a";
    m.caller_id = 0;
    m.deadline = absl::Now() + timeout;
    m.payload = Value::FromList({});
    return grpc_agent::EncodeRequest(m, absl::Now(), WireLimits{})->buffer;
  };
  auto awaiting = [&b_agent](int n) {
    return Eventually(
        [&] { return b_agent.load()->requests_awaiting_group() == n; });
  };
  // Waits, then fails at its deadline: the callee fails it in band (gRPC's
  // own deadline is set later, so that reply decides).
  RawCall short_call(stub, request(absl::Milliseconds(300)), absl::Seconds(30));
  ASSERT_TRUE(awaiting(1));
  const grpc::Status short_status = short_call.Wait();
  ASSERT_TRUE(short_status.ok()) << short_status.error_message();
  uint64_t short_bytes = 0;
  auto short_reply = grpc_agent::DecodeReply(short_call.response(),
                                             WireLimits{}, &short_bytes);
  ASSERT_TRUE(short_reply.ok()) << short_reply.status();
  EXPECT_EQ(short_reply->status().code(), absl::StatusCode::kDeadlineExceeded)
      << short_reply->status();
  EXPECT_NE(short_reply->status().message().find("before it knew its group"),
            absl::string_view::npos)
      << short_reply->status();
  ASSERT_TRUE(awaiting(0));
  // Waits, then runs once the group forms, seeing all of it.
  RawCall long_call(stub, request(absl::Seconds(60)), absl::Seconds(60));
  ASSERT_TRUE(awaiting(1));
  // The admin service reads the group only once it is known (an Invoke
  // looked its own worker up in the group while SetWorkers wrote it).
  {
    auto admin = ferry::admin::v1::Admin::NewStub(channel);
    grpc::ClientContext ctx;
    ferry::admin::v1::InvokeRequest invoke;
    invoke.set_function("group");
    ferry::admin::v1::InvokeResponse out;
    grpc::Status s = admin->Invoke(&ctx, invoke, &out);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
    EXPECT_EQ(s.error_message(), "worker 'b' has not joined its group yet");
  }
  absl::StatusOr<std::unique_ptr<GrpcAgent>> a =
      GrpcAgent::Start("a", 0, 2, store);
  b_starts.join();
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  grpc::Status status = long_call.Wait();
  ASSERT_TRUE(status.ok()) << status.error_message();
  uint64_t bytes = 0;
  absl::StatusOr<Result<Message>> reply =
      grpc_agent::DecodeReply(long_call.response(), WireLimits{}, &bytes);
  ASSERT_TRUE(reply.ok()) << reply.status();
  ASSERT_TRUE(reply->ok()) << reply->status();
  ASSERT_NE((*reply)->payload.if_string(), nullptr);
  EXPECT_EQ(*(*reply)->payload.if_string(), "2 workers, caller a");
  EXPECT_EQ((*b)->requests_awaiting_group(), 0);
  Agents agents;
  agents.push_back(*std::move(a));
  agents.push_back(*std::move(b));
  EXPECT_TRUE(testing::ShutdownGrpcGroup(agents).ok());
}

// A function registered non-blocking is served on gRPC's thread: it answers
// while the callee's only executor thread is held by a blocking function that
// waits for exactly that answer (on the executor it would wait for the
// thread it holds, until the timeout).
TEST(GrpcAgent, NonBlockingFunctionRunsWhileTheExecutorIsBusy) {
  auto reg = std::make_shared<FunctionRegistry>();
  auto started = std::make_shared<Notification>();
  auto opened = std::make_shared<Notification>();
  ASSERT_TRUE(reg->Register("wait_open",
                            [started, opened] {
                              started->Notify();
                              return opened->WaitForNotificationWithTimeout(
                                  absl::Seconds(20));
                            })
                  .ok());
  ASSERT_TRUE(
      reg->RegisterNonBlocking("open", [opened] { opened->Notify(); }).ok());
  GrpcAgentOptions opts;
  opts.num_worker_threads = 1;
  auto agents = testing::StartGrpcGroup({"a", "b"}, reg, opts);
  ASSERT_TRUE(agents.ok()) << agents.status();
  Future<bool> waiting = (*agents)[0]->rpc_async<bool>("b", "wait_open");
  ASSERT_TRUE(started->WaitForNotificationWithTimeout(absl::Seconds(30)));
  absl::Status opening =
      (*agents)[0]->rpc_sync_for<void>(absl::Seconds(10), "b", "open");
  EXPECT_TRUE(opening.ok()) << opening;
  Result<bool> waited = waiting.Get(absl::Seconds(30));
  ASSERT_TRUE(waited.ok()) << waited.status();
  EXPECT_TRUE(*waited);
  EXPECT_TRUE(testing::ShutdownGrpcGroup(*agents).ok());
}

}  // namespace
}  // namespace ferry::rpc
