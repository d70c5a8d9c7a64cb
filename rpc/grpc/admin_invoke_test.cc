// The admin service's Invoke (JSON in, JSON out; off by default), its
// GetStats additions, and the health service's descriptors in the pool.
#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/time/time.h"
#include "ferry/common/poll.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "ferry/proto/admin.grpc.pb.h"
#include "ferry/rpc/grpc/agent.h"
#include "ferry/store/hash_store.h"
#include "ferry/tensor/tensor.h"

namespace ferry::rpc {
namespace {

using ferry::admin::v1::Admin;
using ferry::admin::v1::InvokeRequest;
using ferry::admin::v1::InvokeResponse;

std::unique_ptr<GrpcAgent> StartWorker(bool enable_invoke) {
  auto registry = std::make_shared<FunctionRegistry>();
  EXPECT_TRUE(
      registry
          ->Register("concat", [](std::string a,
                                  int64_t b) { return a + std::to_string(b); })
          .ok());
  EXPECT_TRUE(
      registry->Register("add", [](Tensor a, Tensor b) { return a.add(b); })
          .ok());
  EXPECT_TRUE(registry
                  ->Register("ramp",
                             [](int64_t n) {
                               return arange(0, static_cast<double>(n), 1,
                                             DType::kFloat32);
                             })
                  .ok());
  GrpcAgentOptions options;
  options.enable_admin_invoke = enable_invoke;
  auto agent = GrpcAgent::Start("w", 0, 1, std::make_shared<HashStore>(),
                                options, registry);
  EXPECT_TRUE(agent.ok()) << agent.status();
  return agent.ok() ? *std::move(agent) : nullptr;
}

// Calls Invoke with a request written in JSON, as grpcurl -d would send it.
grpc::Status Invoke(GrpcAgent& agent, const std::string& json,
                    InvokeResponse* out) {
  InvokeRequest request;
  auto parsed = google::protobuf::util::JsonStringToMessage(json, &request);
  EXPECT_TRUE(parsed.ok()) << parsed.ToString();
  auto stub = Admin::NewStub(
      grpc::CreateChannel(agent.address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  return stub->Invoke(&context, request, out);
}

std::string Json(const google::protobuf::Value& v) {
  std::string json;
  EXPECT_TRUE(google::protobuf::util::MessageToJsonString(v, &json).ok());
  return json;
}

TEST(AdminInvoke, OffByDefault) {
  auto agent = StartWorker(/*enable_invoke=*/false);
  ASSERT_NE(agent, nullptr);
  InvokeResponse out;
  grpc::Status s =
      Invoke(*agent, R"({"function": "concat", "args": ["x", 1]})", &out);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_TRUE(absl::StrContains(s.error_message(), "enable_admin_invoke"))
      << s.error_message();
  EXPECT_EQ(agent->stats().Snapshot().total_calls_in(), 0u);
  EXPECT_TRUE(agent->Shutdown().ok());
}

TEST(AdminInvoke, CallsRegisteredFunctionsWithJson) {
  auto agent = StartWorker(/*enable_invoke=*/true);
  ASSERT_NE(agent, nullptr);
  InvokeResponse out;
  grpc::Status s =
      Invoke(*agent, R"({"function": "concat", "args": ["x", 3]})", &out);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(Json(out.result()), R"("x3")");
  EXPECT_GT(out.latency_us(), 0);

  // Tensors in (dtype, shape, data) and out (dtype, shape, preview).
  s = Invoke(*agent,
             R"({"function": "add", "args": [
                  {"dtype": "float32", "shape": [2, 2], "data": [1, 2, 3, 4]},
                  {"dtype": "float32", "shape": [2, 2], "data": [10, 20, 30, 40]}]})",
             &out);
  ASSERT_TRUE(s.ok()) << s.error_message();
  {
    const auto& f = out.result().struct_value().fields();
    EXPECT_EQ(f.at("dtype").string_value(), "float32") << Json(out.result());
    EXPECT_EQ(Json(f.at("shape")), "[2,2]");
    EXPECT_EQ(Json(f.at("preview")), "[11,22,33,44]");
    EXPECT_EQ(f.at("numel").number_value(), 4);
    EXPECT_FALSE(f.at("truncated").bool_value());
  }

  // A large result is previewed, not sent whole.
  s = Invoke(*agent, R"({"function": "ramp", "args": [100000]})", &out);
  ASSERT_TRUE(s.ok()) << s.error_message();
  const auto& fields = out.result().struct_value().fields();
  EXPECT_EQ(fields.at("numel").number_value(), 100000);
  EXPECT_EQ(fields.at("preview").list_value().values_size(), 16);
  EXPECT_EQ(fields.at("preview").list_value().values(15).number_value(), 15);
  EXPECT_TRUE(fields.at("truncated").bool_value());
  EXPECT_TRUE(agent->Shutdown().ok());
}

TEST(AdminInvoke, ErrorsNameTheFunctionAndArgument) {
  auto agent = StartWorker(/*enable_invoke=*/true);
  ASSERT_NE(agent, nullptr);
  InvokeResponse out;
  grpc::Status s = Invoke(*agent, R"({"function": "nope", "args": []})", &out);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
  EXPECT_TRUE(absl::StrContains(s.error_message(), "'nope'"));
  s = Invoke(*agent, R"({"function": "concat", "args": [1, "x"]})", &out);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
      << s.error_message();
  s = Invoke(*agent,
             R"({"function": "add", "args": [
                  {"dtype": "float32", "shape": [3], "data": [1, 2]}, 1]})",
             &out);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
      << s.error_message();
  EXPECT_TRUE(absl::StrContains(s.error_message(), "args[0]"))
      << s.error_message();
  s = Invoke(*agent,
             R"({"function": "add", "args": [
                  {"dtype": "float32", "shape": [1e9, 1e9], "data": []}, 1]})",
             &out);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
      << s.error_message();
  EXPECT_TRUE(agent->Shutdown().ok());
}

TEST(AdminStats, ReportsInFlightQueueAndPeers) {
  auto agent = StartWorker(/*enable_invoke=*/false);
  ASSERT_NE(agent, nullptr);
  ASSERT_TRUE(agent->rpc_sync<std::string>("w", "concat", "a", 1).ok());
  // The callee frees the call's slot after sending the reply, so the caller
  // can hold the reply a moment before the count drops.
  PollUntil([&] { return agent->calls_in_flight() == 0; }, absl::Seconds(10));
  auto stub = Admin::NewStub(grpc::CreateChannel(
      agent->address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  ferry::admin::v1::GetStatsResponse stats;
  ASSERT_TRUE(stub->GetStats(&context, {}, &stats).ok());
  EXPECT_EQ(stats.calls_in_flight(), 0u);
  EXPECT_EQ(stats.executor_queue_depth(), 0u);
  ASSERT_EQ(stats.peers_size(), 1);
  EXPECT_EQ(stats.peers(0).name(), "w");
  // The call above went through the channel to itself.
  EXPECT_EQ(stats.peers(0).state(), "READY");
  EXPECT_TRUE(agent->Shutdown().ok());
}

// gRPC serves grpc.health.v1.Health without descriptors; the agent links
// them so reflection can describe Check and Watch (the Node reflection test
// checks this over the wire).
TEST(HealthDescriptors, InTheGeneratedPool) {
  auto agent = StartWorker(false);
  ASSERT_NE(agent, nullptr);
  const google::protobuf::ServiceDescriptor* health =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
          "grpc.health.v1.Health");
  ASSERT_NE(health, nullptr);
  ASSERT_NE(health->FindMethodByName("Check"), nullptr);
  const auto* watch = health->FindMethodByName("Watch");
  ASSERT_NE(watch, nullptr);
  EXPECT_TRUE(watch->server_streaming());
  EXPECT_EQ(watch->output_type()->full_name(),
            "grpc.health.v1.HealthCheckResponse");
  EXPECT_TRUE(agent->Shutdown().ok());
}

}  // namespace
}  // namespace ferry::rpc
