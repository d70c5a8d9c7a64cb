// TLS and mutual TLS between gRPC agents, with a CA and certificates made
// by openssl at test time (tests/util/test_pki.h).
#include "ferry/rpc/grpc/tls.h"

#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "ferry/proto/admin.grpc.pb.h"
#include "ferry/rpc/grpc/agent.h"
#include "ferry/rpc/testing/grpc_cluster.h"
#include "ferry/store/hash_store.h"
#include "ferry/tests/util/test_pki.h"

namespace ferry::rpc {
namespace {

using testutil::TestIdentity;
using testutil::TestPki;

class TlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto pki = testutil::MakeTestPki(::testing::TempDir() + "/pki");
    ASSERT_TRUE(pki.ok()) << pki.status();
    pki_ = new TestPki(*std::move(pki));
  }
  static void TearDownTestSuite() { delete pki_; }

  static TlsOptions Tls(const TestIdentity& id, bool require_client_cert,
                        const std::string& ca = "") {
    TlsOptions tls;
    tls.ca_file = ca.empty() ? pki_->ca : ca;
    tls.cert_file = id.cert;
    tls.key_file = id.key;
    tls.require_client_cert = require_client_cert;
    return tls;
  }

  // Starts one agent per entry of `tls` (rank = index) over one store.
  static std::vector<std::unique_ptr<GrpcAgent>> StartGroup(
      const std::vector<TlsOptions>& tls) {
    auto store = std::make_shared<HashStore>();
    auto registry = std::make_shared<FunctionRegistry>();
    EXPECT_TRUE(
        registry
            ->Register("whoami",
                       [](const CallContext& ctx) { return ctx.caller_name; })
            .ok());
    std::vector<std::string> names;
    for (size_t i = 0; i < tls.size(); ++i) names.push_back(absl::StrCat("w", i));
    std::vector<std::unique_ptr<GrpcAgent>> agents;
    for (auto& agent : testing::StartGrpcAgents(
             {.names = names,
              .registry = registry,
              .options =
                  [&](int i) {
                    GrpcAgentOptions options;
                    options.tls = tls[i];
                    options.join_timeout = absl::Seconds(30);
                    return options;
                  },
              .store = store})) {
      EXPECT_TRUE(agent.ok()) << agent.status();
      agents.push_back(agent.ok() ? *std::move(agent) : nullptr);
    }
    return agents;
  }

  static Result<std::string> Whoami(GrpcAgent& from, int to) {
    return from.rpc_sync_for<std::string>(absl::Seconds(10), to, "whoami");
  }

  static TestPki* pki_;
};
TestPki* TlsTest::pki_ = nullptr;

TEST_F(TlsTest, MutualTlsPeersCallEachOther) {
  auto agents = StartGroup({Tls(pki_->alice, true), Tls(pki_->bob, true)});
  ASSERT_TRUE(agents[0] && agents[1]);
  EXPECT_EQ(Whoami(*agents[0], 1).value_or("?"), "w0");
  EXPECT_EQ(Whoami(*agents[1], 0).value_or("?"), "w1");
  EXPECT_TRUE(testing::StopGrpcGroup(agents).ok());
}

TEST_F(TlsTest, PlaintextPeerIsRefusedBothWays) {
  auto agents = StartGroup({Tls(pki_->alice, true), TlsOptions{}});
  ASSERT_TRUE(agents[0] && agents[1]);
  // The plaintext worker cannot reach the TLS one...
  Result<std::string> in = Whoami(*agents[1], 0);
  EXPECT_EQ(in.status().code(), absl::StatusCode::kUnavailable) << in.status();
  EXPECT_TRUE(absl::StrContains(in.status().message(), "worker 'w0'"))
      << in.status();
  // ...and the TLS worker refuses to talk plaintext to it, saying why.
  Result<std::string> out = Whoami(*agents[0], 1);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kUnavailable)
      << out.status();
  EXPECT_TRUE(absl::StrContains(out.status().message(), "TLS handshake failed"))
      << out.status();
  EXPECT_TRUE(testing::StopGrpcGroup(agents).ok());
}

// A worker whose certificate comes from another CA: each side refuses the
// other (it trusts our CA, but we do not trust its certificate).
TEST_F(TlsTest, CertificateFromAnotherCaIsRefusedBothWays) {
  auto agents = StartGroup({Tls(pki_->alice, true), Tls(pki_->rogue, true)});
  ASSERT_TRUE(agents[0] && agents[1]);
  Result<std::string> from_rogue = Whoami(*agents[1], 0);
  EXPECT_EQ(from_rogue.status().code(), absl::StatusCode::kUnavailable)
      << from_rogue.status();
  Result<std::string> to_rogue = Whoami(*agents[0], 1);
  EXPECT_EQ(to_rogue.status().code(), absl::StatusCode::kUnavailable)
      << to_rogue.status();
  EXPECT_TRUE(
      absl::StrContains(to_rogue.status().message(), "TLS handshake failed"))
      << to_rogue.status();
  EXPECT_TRUE(absl::StrContains(to_rogue.status().message(), pki_->ca))
      << to_rogue.status();
  EXPECT_TRUE(testing::StopGrpcGroup(agents).ok());
}

// A raw gRPC client (not a Ferry worker) that trusts the CA but shows no
// certificate: refused when client certificates are required, served when
// they are not.
grpc::Status AdminCallWithoutClientCert(const std::string& address,
                                        const std::string& ca_file) {
  std::ifstream in(ca_file);
  std::string ca((std::istreambuf_iterator<char>(in)),
                 std::istreambuf_iterator<char>());
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = ca;
  auto stub = ferry::admin::v1::Admin::NewStub(
      grpc::CreateChannel(address, grpc::SslCredentials(ssl)));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  ferry::admin::v1::WorkerInfo info;
  return stub->GetWorkerInfo(&context, {}, &info);
}

TEST_F(TlsTest, ClientWithoutCertificateRefusedOnlyWhenRequired) {
  for (bool required : {true, false}) {
    auto agents = StartGroup({Tls(pki_->alice, required)});
    ASSERT_TRUE(agents[0]);
    grpc::Status s = AdminCallWithoutClientCert(agents[0]->address(), pki_->ca);
    if (required) {
      EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE)
          << s.error_message();
    } else {
      EXPECT_TRUE(s.ok()) << s.error_message();
    }
    // A plaintext client is refused either way.
    auto plain = ferry::admin::v1::Admin::NewStub(grpc::CreateChannel(
        agents[0]->address(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    ferry::admin::v1::WorkerInfo info;
    EXPECT_FALSE(plain->GetWorkerInfo(&context, {}, &info).ok());
    EXPECT_TRUE(testing::StopGrpcGroup(agents).ok());
  }
}

TEST_F(TlsTest, BadOptionsFailStartNamingTheProblem) {
  auto store = std::make_shared<HashStore>();
  struct Case {
    TlsOptions tls;
    std::string want;
  };
  TlsOptions no_key = Tls(pki_->alice, false);
  no_key.key_file.clear();
  TlsOptions missing = Tls(pki_->alice, false);
  missing.cert_file = ::testing::TempDir() + "/no-such.pem";
  TlsOptions not_pem = Tls(pki_->alice, false);
  not_pem.ca_file = "/proc/self/cmdline";
  TlsOptions no_tls;
  no_tls.require_client_cert = true;
  TlsOptions mismatched = Tls(pki_->alice, false);
  mismatched.key_file = pki_->bob.key;
  for (const Case& c : std::vector<Case>{{no_key, "key_file is not set"},
                                         {missing, "cannot read TLS cert_file"},
                                         {not_pem, "is not PEM"},
                                         {no_tls, "require_client_cert needs"},
                                         {mismatched, "with TLS"}}) {
    GrpcAgentOptions options;
    options.tls = c.tls;
    auto agent = GrpcAgent::Start("bad", 0, 1, store, options);
    ASSERT_FALSE(agent.ok()) << c.want;
    EXPECT_TRUE(absl::StrContains(agent.status().message(), c.want))
        << agent.status();
    EXPECT_TRUE(absl::StrContains(agent.status().message(), "worker 'bad'"))
        << agent.status();
  }
}

TEST(Tls, OptionsFromEnvironment) {
  std::map<std::string, std::string> env = {
      {"FERRY_TLS_CA", "/ca.pem"},
      {"FERRY_TLS_CERT", "/c.pem"},
      {"FERRY_TLS_KEY", "/k.pem"},
      {"FERRY_TLS_REQUIRE_CLIENT_CERT", "1"},
      {"FERRY_TLS_SERVER_NAME", "node1"}};
  auto lookup = [&env](absl::string_view name) -> std::optional<std::string> {
    auto it = env.find(std::string(name));
    if (it == env.end()) return std::nullopt;
    return it->second;
  };
  absl::StatusOr<TlsOptions> tls = grpc_agent::TlsOptionsFromEnv(lookup);
  ASSERT_TRUE(tls.ok()) << tls.status();
  EXPECT_EQ(tls->ca_file, "/ca.pem");
  EXPECT_EQ(tls->cert_file, "/c.pem");
  EXPECT_EQ(tls->key_file, "/k.pem");
  EXPECT_EQ(tls->server_name, "node1");
  EXPECT_TRUE(tls->require_client_cert);
  env["FERRY_TLS_REQUIRE_CLIENT_CERT"] = "maybe";
  EXPECT_EQ(grpc_agent::TlsOptionsFromEnv(lookup).status().code(),
            absl::StatusCode::kInvalidArgument);
  env.clear();
  tls = grpc_agent::TlsOptionsFromEnv(lookup);
  ASSERT_TRUE(tls.ok());
  EXPECT_FALSE(tls->enabled());
}

TEST(Tls, WarnsOnlyForPlaintextOnNonLoopback) {
  TlsOptions plain;
  EXPECT_FALSE(grpc_agent::WarnIfPlaintextExposed(plain, "127.0.0.1:0", "w"));
  EXPECT_FALSE(grpc_agent::WarnIfPlaintextExposed(plain, "[::1]:5", "w"));
  EXPECT_FALSE(grpc_agent::WarnIfPlaintextExposed(plain, "localhost:5", "w"));
  EXPECT_TRUE(grpc_agent::WarnIfPlaintextExposed(plain, "0.0.0.0:0", "w"));
  EXPECT_TRUE(grpc_agent::WarnIfPlaintextExposed(plain, "[::]:0", "w"));
  EXPECT_TRUE(grpc_agent::WarnIfPlaintextExposed(plain, "10.1.2.3:0", "w"));
  TlsOptions tls;
  tls.ca_file = "x";
  EXPECT_FALSE(grpc_agent::WarnIfPlaintextExposed(tls, "0.0.0.0:0", "w"));
}

}  // namespace
}  // namespace ferry::rpc
