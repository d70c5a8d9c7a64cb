#include "ferry/rpc/remote_function.h"

#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "ferry/rpc/agent.h"
#include "ferry/rpc/function_registry.h"
#include "ferry/rpc/testing/agent_cluster.h"
#include "ferry/tensor/tensor.h"
#include "gtest/gtest.h"

namespace ferry::rpc {
namespace {

const RemoteFunction<int64_t(int64_t, int64_t)> kAdd("add");
const RemoteFunction<std::string(std::string, int32_t)> kRepeat("repeat");
const RemoteFunction<void(int64_t)> kCheckPositive("check_positive");

// The compile-time checks, stated as facts the compiler must agree with.
static_assert(CallableWith<decltype(kAdd), int, int>);  // literals widen
static_assert(CallableWith<decltype(kAdd), int64_t, int32_t>);
static_assert(!CallableWith<decltype(kAdd), int64_t>);  // count
static_assert(!CallableWith<decltype(kAdd), int64_t, int64_t, int64_t>);
static_assert(!CallableWith<decltype(kAdd), std::string, int64_t>);
static_assert(!CallableWith<decltype(kAdd), double, int64_t>);  // narrowing
static_assert(CallableWith<decltype(kRepeat), const char*, int>);
static_assert(!CallableWith<decltype(kRepeat), const char*, int64_t>);
static_assert(
    std::is_same_v<decltype(std::declval<Agent&>().rpc_sync("w", kAdd, 2, 3)),
                   Result<int64_t>>);
static_assert(std::is_same_v<
              decltype(std::declval<Agent&>().rpc_async("w", kRepeat, "x", 2)),
              Future<std::string>>);
static_assert(std::is_same_v<
              decltype(std::declval<Agent&>().rpc_sync("w", kCheckPositive, 1)),
              absl::Status>);

class RemoteFunctionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    registry_ = std::make_shared<FunctionRegistry>();
    ASSERT_TRUE(
        registry_->Register(kAdd, [](int64_t a, int64_t b) { return a + b; })
            .ok());
    // The implementation may take its parameters by reference and return
    // a StatusOr; the wire still carries the handle's types.
    ASSERT_TRUE(registry_
                    ->Register(kRepeat,
                               [](const std::string& s,
                                  int32_t n) -> absl::StatusOr<std::string> {
                                 if (n < 0) {
                                   return absl::InvalidArgumentError("n < 0");
                                 }
                                 std::string out;
                                 for (int i = 0; i < n; ++i) out += s;
                                 return out;
                               })
                    .ok());
    ASSERT_TRUE(registry_
                    ->Register(kCheckPositive,
                               [](const CallContext& ctx, int64_t v) {
                                 return v > 0 ? absl::OkStatus()
                                              : absl::InvalidArgumentError(
                                                    ctx.function + ": " +
                                                    std::to_string(v));
                               })
                    .ok());
    absl::StatusOr<std::unique_ptr<testing::AgentCluster>> cluster =
        testing::StartInProcessCluster({{"w0", "w1"}, registry_, {}});
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = *std::move(cluster);
  }
  void TearDown() override {
    if (cluster_) {
      EXPECT_TRUE(cluster_->ShutdownAll().ok());
    }
  }

  std::shared_ptr<FunctionRegistry> registry_;
  std::unique_ptr<testing::AgentCluster> cluster_;
};

TEST_F(RemoteFunctionTest, TypedCallsReachTheImplementation) {
  Agent& a = cluster_->agent(0);
  Result<int64_t> sum = a.rpc_sync("w1", kAdd, 2, 3);
  ASSERT_TRUE(sum.ok()) << sum.status();
  EXPECT_EQ(*sum, 5);
  Result<std::string> s = a.rpc_async("w1", kRepeat, "ab", 3).Get();
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(*s, "ababab");
  EXPECT_TRUE(a.rpc_sync("w1", kCheckPositive, 7).ok());
  EXPECT_TRUE(
      a.rpc_sync_for(absl::Seconds(30), "w1", kAdd, int64_t{1}, 2).ok());
}

TEST_F(RemoteFunctionTest, ErrorsOfTheImplementationReachTheCaller) {
  Agent& a = cluster_->agent(0);
  Result<std::string> s = a.rpc_sync("w1", kRepeat, "ab", -1);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("n < 0"), std::string::npos);
  absl::Status neg = a.rpc_sync("w1", kCheckPositive, -4);
  EXPECT_EQ(neg.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(neg.message().find("check_positive: -4"), std::string::npos);
}

TEST_F(RemoteFunctionTest, TypedAndByNameCallersReachTheSameFunction) {
  Result<int64_t> by_name =
      cluster_->agent(1).rpc_sync<int64_t>("w0", "add", int64_t{4}, 5);
  ASSERT_TRUE(by_name.ok()) << by_name.status();
  EXPECT_EQ(*by_name, 9);
  // The registry shows the handle's signature, not the lambda's.
  std::shared_ptr<const FunctionEntry> e = registry_->Find("repeat");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->signature, "(string, int64) -> string");
}

TEST_F(RemoteFunctionTest, UndeclaredFunctionFailsAtRunTimeNamingIt) {
  const RemoteFunction<int64_t(int64_t)> missing("not_registered");
  Result<int64_t> r = cluster_->agent(0).rpc_sync("w1", missing, 1);
  EXPECT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("not_registered"), std::string::npos);
}

TEST(RemoteFunctionDefine, DeducesTheSignatureAndRefusesATakenName) {
  FunctionRegistry registry;
  auto scale = registry.Define(
      "scale",
      [](const CallContext&, Tensor t, double f) -> absl::StatusOr<Tensor> {
        return t.mul(f);
      });
  ASSERT_TRUE(scale.ok()) << scale.status();
  static_assert(
      std::is_same_v<decltype(scale),
                     absl::StatusOr<RemoteFunction<Tensor(Tensor, double)>>>);
  EXPECT_EQ(scale->name(), "scale");
  auto again = registry.Define("scale", [](int64_t x) { return x; });
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists);
  auto none = registry.Define("nothing", [](int64_t) {});
  static_assert(std::is_same_v<decltype(none),
                               absl::StatusOr<RemoteFunction<void(int64_t)>>>);
  EXPECT_TRUE(none.ok());
}

}  // namespace
}  // namespace ferry::rpc
