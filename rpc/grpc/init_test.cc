#include "ferry/rpc/grpc/init.h"

#include <cstdlib>
#include <functional>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "ferry/proto/admin.grpc.pb.h"
#include "ferry/store/tcp_store.h"
#include "ferry/tests/util/held_port.h"
#include "ferry/tests/util/run_ranks.h"
#include "ferry/tests/util/test_pki.h"

namespace ferry::rpc {
namespace {

// Starts `n` agents through InitRpc(url), one rank per thread, and checks
// each can call the next; `while_up` runs on rank 0 once the group has
// formed. Every rank then shuts down gracefully (collectively).
void RunGroup(
    const std::string& url, int n,
    const std::function<void(const GrpcAgent&)>& while_up =
        [](const GrpcAgent&) {}) {
  auto registry = std::make_shared<FunctionRegistry>();
  ASSERT_TRUE(
      registry->Register("twice", [](int64_t x) { return 2 * x; }).ok());
  testutil::RunRanks(
      n,
      [&](int i) {
        GrpcAgentOptions o;
        o.join_timeout = absl::Seconds(60);
        return InitRpc(absl::StrCat("w", i), url, i, n, o, registry);
      },
      [&](int i, absl::StatusOr<std::unique_ptr<GrpcAgent>>& agent) {
        ASSERT_TRUE(agent.ok()) << agent.status();
        EXPECT_EQ(
            (*agent)->rpc_sync<int64_t>((i + 1) % n, "twice", i).value_or(-1),
            2 * i);
        if (i == 0) while_up(**agent);
        EXPECT_TRUE((*agent)->Shutdown().ok());
      });
}

TEST(InitRpc, FileInitMethod) {
  std::string path = absl::StrCat(std::getenv("TEST_TMPDIR"), "/rpc_store");
  RunGroup("file://" + path, 3);
}

TEST(InitRpc, TcpInitMethodRankZeroHostsTheStore) {
  unsetenv("FERRY_USE_AGENT_STORE");
  // tcp:// needs a port every rank knows before rank 0's server exists.
  testutil::HeldPort held;
  ASSERT_GT(held.port(), 0);
  RunGroup(absl::StrCat("tcp://127.0.0.1:", held.port()), 3);
}

// The store secret and TLS come from the environment: a group forms and
// calls over mutual TLS with an authenticated store, while a store client
// without the secret and a plaintext gRPC client are refused.
TEST(InitRpc, SecretAndTlsFromEnvironment) {
  unsetenv("FERRY_USE_AGENT_STORE");
  auto pki =
      testutil::MakeTestPki(std::string(std::getenv("TEST_TMPDIR")) + "/pki");
  ASSERT_TRUE(pki.ok()) << pki.status();
  setenv("FERRY_STORE_SECRET", "shared-by-the-job", 1);
  setenv("FERRY_TLS_CA", pki->ca.c_str(), 1);
  setenv("FERRY_TLS_CERT", pki->alice.cert.c_str(), 1);
  setenv("FERRY_TLS_KEY", pki->alice.key.c_str(), 1);
  setenv("FERRY_TLS_REQUIRE_CLIENT_CERT", "1", 1);
  testutil::HeldPort held;
  ASSERT_GT(held.port(), 0);
  const int port = held.port();
  RunGroup(absl::StrCat("tcp://127.0.0.1:", port), 2,
           [port](const GrpcAgent& w0) {
             // The workers serve TLS only.
             auto admin = ferry::admin::v1::Admin::NewStub(grpc::CreateChannel(
                 w0.address(), grpc::InsecureChannelCredentials()));
             grpc::ClientContext context;
             context.set_deadline(
                 absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
             ferry::admin::v1::WorkerInfo info;
             EXPECT_FALSE(admin->GetWorkerInfo(&context, {}, &info).ok());
             // While the group is up (rank 0 hosts the store): no secret, no
             // entry.
             TcpStoreOptions o;
             o.port = port;
             o.timeout = absl::Seconds(5);
             auto intruder = TcpStore::Create(o);
             ASSERT_TRUE(intruder.ok()) << intruder.status();
             EXPECT_FALSE((*intruder)->NumKeys().ok());
           });
  for (const char* v : {"FERRY_STORE_SECRET", "FERRY_TLS_CA", "FERRY_TLS_CERT",
                        "FERRY_TLS_KEY", "FERRY_TLS_REQUIRE_CLIENT_CERT"}) {
    unsetenv(v);
  }
}

TEST(InitRpc, MalformedInitMethodIsAnError) {
  auto a = InitRpc("w", "udp://x:1", 0, 1);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument)
      << a.status();
  auto b = InitRpc("w", "tcp://127.0.0.1:notaport", 0, 1);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument)
      << b.status();
}

// The published address is the advertised host with the bound port; the
// environment chooses both when the options leave them empty.
TEST(InitRpc, PublishesTheAdvertisedAddress) {
  std::string path = absl::StrCat(std::getenv("TEST_TMPDIR"), "/adv_store");
  setenv("FERRY_LISTEN_ADDR", "127.0.0.1", 1);
  setenv("FERRY_ADVERTISE_ADDR", "localhost", 1);
  auto registry = std::make_shared<FunctionRegistry>();
  ASSERT_TRUE(registry->Register("one", [] { return int64_t{1}; }).ok());
  auto agent = InitRpc("w0", "file://" + path, 0, 1, {}, registry);
  unsetenv("FERRY_LISTEN_ADDR");
  unsetenv("FERRY_ADVERTISE_ADDR");
  ASSERT_TRUE(agent.ok()) << agent.status();
  EXPECT_TRUE(absl::StartsWith((*agent)->address(), "localhost:"))
      << (*agent)->address();
  // Peers (here: itself) reach it through the published name.
  EXPECT_EQ(*(*agent)->rpc_sync<int64_t>("w0", "one"), 1);
  EXPECT_TRUE((*agent)->Shutdown().ok());
}

TEST(InitRpc, WildcardListenWithoutAdvertisedAddressIsAnError) {
  std::string path = absl::StrCat(std::getenv("TEST_TMPDIR"), "/wild_store");
  GrpcAgentOptions o;
  o.listen_address = "0.0.0.0:0";  // Refused before anything binds.
  auto agent = InitRpc("w0", "file://" + path, 0, 1, o);
  EXPECT_EQ(agent.status().code(), absl::StatusCode::kInvalidArgument)
      << agent.status();
  EXPECT_TRUE(absl::StrContains(agent.status().message(), "worker 'w0'"))
      << agent.status();
  EXPECT_TRUE(
      absl::StrContains(agent.status().message(), "FERRY_ADVERTISE_ADDR"))
      << agent.status();
}

TEST(InitRpc, UnknownInterfaceIsAnErrorNamingIt) {
  std::string path = absl::StrCat(std::getenv("TEST_TMPDIR"), "/if_store");
  setenv("FERRY_SOCKET_IFNAME", "nosuch0", 1);
  auto agent = InitRpc("w0", "file://" + path, 0, 1);
  unsetenv("FERRY_SOCKET_IFNAME");
  EXPECT_EQ(agent.status().code(), absl::StatusCode::kNotFound)
      << agent.status();
  EXPECT_TRUE(absl::StrContains(agent.status().message(), "'nosuch0'"))
      << agent.status();
}

}  // namespace
}  // namespace ferry::rpc
