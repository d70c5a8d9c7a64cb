// Shared-secret authentication of TCPStore connections (store_auth.h):
// accepted with the secret, refused without it or with another one, before
// any key is touched; PyTorch-style clients keep working when it is off.
#include "ferry/store/store_auth.h"

#include <fstream>
#include <map>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "ferry/store/tcp_store.h"
#include "ferry/store/tcp_store_server.h"
#include "ferry/store/testing/tcp_store_testing.h"

namespace ferry {
namespace {

using tcpstore::Generation;
using tcpstore::Op;
using testutil::RawClient;

std::unique_ptr<TcpStoreServer> StartServer(const std::string& secret) {
  TcpStoreServer::Options o;
  o.host = "127.0.0.1";
  o.secret = secret;
  auto server = TcpStoreServer::Start(o);
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

absl::StatusOr<std::unique_ptr<TcpStore>> Connect(int port,
                                                  const std::string& secret,
                                                  bool legacy = false) {
  TcpStoreOptions o;
  o.host = "127.0.0.1";
  o.port = port;
  o.secret = secret;
  o.legacy_protocol = legacy;
  o.timeout = absl::Seconds(5);
  return TcpStore::Create(o);
}

TEST(StoreAuth, ClientsWithTheSecretAreServedInBothGenerations) {
  auto server = StartServer("s3cret");
  ASSERT_NE(server, nullptr);
  for (bool legacy : {false, true}) {
    auto store = Connect(server->port(), "s3cret", legacy);
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->Set("k", "v").ok());
    EXPECT_EQ((*store)->Get("k").value_or("?"), "v");
  }
  EXPECT_EQ(server->GetStats().refused, 0);
}

TEST(StoreAuth, ClientWithoutTheSecretIsRefusedBeforeAnyKeyIsTouched) {
  auto server = StartServer("s3cret");
  ASSERT_NE(server, nullptr);
  auto store = Connect(server->port(), "");
  ASSERT_TRUE(store.ok()) << store.status();  // connecting sends no query
  // SET has no response, so the refusal shows on the next query.
  (*store)->Set("k", "v").IgnoreError();
  EXPECT_FALSE((*store)->NumKeys().ok());
  EXPECT_EQ(server->GetStats().keys, 0);
  EXPECT_GE(server->GetStats().refused, 1);

  // A raw PyTorch 1.13-style client: its first query drops it, unanswered.
  RawClient raw;
  ASSERT_TRUE(raw.Connect(server->port()).ok());
  ASSERT_TRUE(
      raw.Send(testutil::SetFrame(Generation::kLegacy, "/k", "v"))
          .ok());
  EXPECT_TRUE(raw.ClosedByPeer());
  EXPECT_EQ(server->GetStats().keys, 0);
}

TEST(StoreAuth, WrongSecretIsRefusedOnBothSides) {
  auto server = StartServer("s3cret");
  ASSERT_NE(server, nullptr);
  // The Ferry client checks the server's proof first and gives up.
  auto store = Connect(server->port(), "guess");
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kPermissionDenied)
      << store.status();
  EXPECT_TRUE(absl::StrContains(store.status().message(),
                                "store authentication failed"))
      << store.status();

  // A client that skips that check and sends a wrong proof: refused (one
  // byte), then disconnected, and counted.
  RawClient raw;
  ASSERT_TRUE(raw.Connect(server->port()).ok());
  const std::string nonce = tcpstore::RandomNonce();
  ASSERT_TRUE(raw.Send(testutil::Validate() +
                       testutil::KeyFrame(Generation::kCurrent,
                                                   Op::kAuthChallenge, nonce))
                  .ok());
  absl::StatusOr<std::string> server_nonce = raw.RecvBytes();
  ASSERT_TRUE(server_nonce.ok()) << server_nonce.status();
  absl::StatusOr<std::string> server_proof = raw.RecvBytes();
  ASSERT_TRUE(server_proof.ok()) << server_proof.status();
  // The server proved it knows the secret, bound to both nonces.
  EXPECT_TRUE(tcpstore::ProofsEqual(
      *server_proof,
      tcpstore::AuthProof("s3cret", "server", nonce, *server_nonce)));
  EXPECT_FALSE(tcpstore::ProofsEqual(
      *server_proof,
      tcpstore::AuthProof("s3cret", "client", nonce, *server_nonce)));
  ASSERT_TRUE(raw.Send(testutil::KeyFrame(
                           Generation::kCurrent, Op::kAuthProof,
                           tcpstore::AuthProof("guess", "client", nonce,
                                               *server_nonce)))
                  .ok());
  EXPECT_EQ(raw.RecvU8().value_or(0xff), tcpstore::kAuthRefused);
  EXPECT_TRUE(raw.ClosedByPeer());
  EXPECT_GE(server->GetStats().refused, 1);
  EXPECT_EQ(server->GetStats().keys, 0);
}

TEST(StoreAuth, ClientWithASecretRefusesAServerWithout) {
  auto server = StartServer("");
  ASSERT_NE(server, nullptr);
  auto store = Connect(server->port(), "s3cret");
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kPermissionDenied)
      << store.status();
  EXPECT_TRUE(absl::StrContains(store.status().message(), "has no secret"))
      << store.status();
}

// Off by default: a PyTorch-style client (no handshake) is served.
TEST(StoreAuth, WithoutASecretPyTorchClientsAreServed) {
  auto server = StartServer("");
  ASSERT_NE(server, nullptr);
  RawClient raw;
  ASSERT_TRUE(raw.Connect(server->port()).ok());
  ASSERT_TRUE(
      raw.Send(testutil::SetFrame(Generation::kLegacy, "/k", "v") +
               testutil::GetFrame(Generation::kLegacy, "/k"))
          .ok());
  EXPECT_EQ(raw.RecvBytes().value_or("?"), "v");
}

TEST(StoreAuth, SecretFromEnvironment) {
  const std::string file = ::testing::TempDir() + "/secret";
  std::ofstream(file) << "from-file\n";
  const std::string empty = ::testing::TempDir() + "/empty";
  std::ofstream(empty) << "\n";
  std::map<std::string, std::string> env;
  auto lookup = [&env](absl::string_view n) -> std::optional<std::string> {
    auto it = env.find(std::string(n));
    if (it == env.end()) return std::nullopt;
    return it->second;
  };
  EXPECT_EQ(tcpstore::StoreSecretFromEnv(lookup).value_or("?"), "");
  env["FERRY_STORE_SECRET"] = "from-env";
  EXPECT_EQ(tcpstore::StoreSecretFromEnv(lookup).value_or("?"), "from-env");
  env["FERRY_STORE_SECRET_FILE"] = file;
  EXPECT_EQ(tcpstore::StoreSecretFromEnv(lookup).value_or("?"), "from-file");
  env["FERRY_STORE_SECRET_FILE"] = empty;
  EXPECT_EQ(tcpstore::StoreSecretFromEnv(lookup).status().code(),
            absl::StatusCode::kInvalidArgument);
  env["FERRY_STORE_SECRET_FILE"] = file + ".missing";
  EXPECT_EQ(tcpstore::StoreSecretFromEnv(lookup).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(StoreAuth, ProofsDependOnEveryInput) {
  const std::string a = tcpstore::RandomNonce(), b = tcpstore::RandomNonce();
  EXPECT_EQ(a.size(), tcpstore::kAuthNonceBytes);
  EXPECT_NE(a, b);
  const std::string p = tcpstore::AuthProof("k", "client", a, b);
  EXPECT_EQ(p.size(), 32u);  // SHA-256
  EXPECT_EQ(p, tcpstore::AuthProof("k", "client", a, b));
  EXPECT_NE(p, tcpstore::AuthProof("K", "client", a, b));
  EXPECT_NE(p, tcpstore::AuthProof("k", "server", a, b));
  EXPECT_NE(p, tcpstore::AuthProof("k", "client", b, a));
}

}  // namespace
}  // namespace ferry
