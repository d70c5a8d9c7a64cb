// libFuzzer target: a live TcpStoreServer (on loopback) fed one client's
// bytes: the request parser of both protocol generations and the
// authentication frames (store_auth.h), through the server's own dispatch.
//
// The first input byte picks the setting, the rest is what the client sends:
//   0: a store without a secret (PyTorch-compatible);
//   1: a store with a secret, bytes from a client that never authenticated;
//   2: a store with a secret, after VALIDATE and an honest handshake
//      (current generation);
//   3: the same with the handshake as the first frame (legacy generation).
//
// Checks, for any input: the server survives (the process does not crash,
// and a fresh client then gets its PING answered); the client's connection
// is closed once it stops sending (no hang); and without authentication not
// one key is written.
#include <sys/socket.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "ferry/common/logging.h"
#include "ferry/store/store_auth.h"
#include "ferry/store/tcp_store_protocol.h"
#include "ferry/store/tcp_store_server.h"
#include "ferry/store/testing/tcp_store_testing.h"

namespace {

using ferry::TcpStoreServer;
using ferry::testutil::RawClient;
namespace tcpstore = ferry::tcpstore;

constexpr absl::string_view kSecret = "fuzz-secret";
// Far above any honest answer on loopback; reaching it is a hang.
constexpr absl::Duration kBound = absl::Seconds(10);

enum Mode : uint8_t { kOpen, kUnauthenticated, kAuthCurrent, kAuthLegacy };

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "tcp_store_server_fuzz: %s\n", what.c_str());
  std::abort();
}

std::unique_ptr<TcpStoreServer> StartServer(bool with_secret) {
  TcpStoreServer::Options options;
  options.host = "127.0.0.1";
  // Small limits, so that inputs of a few kilobytes reach them.
  options.limits.max_key_bytes = 64;
  options.limits.max_value_bytes = 256;
  options.limits.max_keys_per_request = 16;
  options.limits.max_frame_bytes = 4096;
  options.max_pending_write_bytes = 1 << 20;
  if (with_secret) options.secret = std::string(kSecret);
  auto server = TcpStoreServer::Start(options);
  if (!server.ok()) Fail(server.status().ToString());
  return *std::move(server);
}

RawClient Connect(const TcpStoreServer& server) {
  RawClient client;
  absl::Status s = client.Connect(server.port());
  if (!s.ok()) Fail(absl::StrCat("connect: ", s.ToString()));
  // Close with a reset: thousands of inputs a second would otherwise leave
  // as many sockets in TIME_WAIT and run out of ephemeral ports.
  const linger reset{1, 0};
  ::setsockopt(client.fd(), SOL_SOCKET, SO_LINGER, &reset, sizeof(reset));
  return client;
}

std::string Frame(tcpstore::Op op, absl::string_view bytes) {
  std::string frame;
  tcpstore::PutU8(&frame,
                  *tcpstore::WireCode(tcpstore::Generation::kCurrent, op));
  tcpstore::PutBytes(&frame, bytes);
  return frame;
}

// The client half of the handshake, as TcpStore does it.
void Authenticate(RawClient& client) {
  const std::string nonce = tcpstore::RandomNonce();
  if (!client.Send(Frame(tcpstore::Op::kAuthChallenge, nonce)).ok())
    Fail("sending AUTH_CHALLENGE");
  absl::StatusOr<std::string> server_nonce = client.RecvBytes(kBound);
  absl::StatusOr<std::string> proof = client.RecvBytes(kBound);
  if (!server_nonce.ok() || !proof.ok()) Fail("no answer to AUTH_CHALLENGE");
  if (!tcpstore::ProofsEqual(
          *proof, tcpstore::AuthProof(kSecret, "server", nonce, *server_nonce)))
    Fail("the server's proof is wrong");
  if (!client
           .Send(Frame(
               tcpstore::Op::kAuthProof,
               tcpstore::AuthProof(kSecret, "client", nonce, *server_nonce)))
           .ok())
    Fail("sending AUTH_PROOF");
  absl::StatusOr<uint8_t> verdict = client.RecvU8(kBound);
  if (!verdict.ok() || *verdict != tcpstore::kAuthAccepted)
    Fail("an honest handshake was refused");
}

// A fresh, honest client: VALIDATE, the handshake when needed, then PING.
void ExpectServing(const TcpStoreServer& server, bool with_secret) {
  RawClient client = Connect(server);
  if (!client.Send(ferry::testutil::Validate()).ok()) Fail("send VALIDATE");
  if (with_secret) Authenticate(client);
  std::string ping;
  tcpstore::PutU8(&ping, *tcpstore::WireCode(tcpstore::Generation::kCurrent,
                                             tcpstore::Op::kPing));
  tcpstore::PutU32(&ping, 0x5eed1234);
  if (!client.Send(ping).ok()) Fail("send PING");
  absl::StatusOr<std::string> echo = client.Recv(4, kBound);
  if (!echo.ok() || tcpstore::LoadU32(echo->data()) != 0x5eed1234)
    Fail("the server stopped serving after the fuzzed client");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static const bool quiet = [] {
    // Every dropped client is logged at WARNING; keep the fuzzer's output
    // readable.
    ferry::SetLogLevel(ferry::LogLevel::kError);
    return true;
  }();
  (void)quiet;
  const Mode mode = static_cast<Mode>(data[0] % 4);
  const absl::string_view bytes(reinterpret_cast<const char*>(data) + 1,
                                size - 1);
  const bool with_secret = mode != kOpen;
  std::unique_ptr<TcpStoreServer> server = StartServer(with_secret);
  {
    RawClient client = Connect(*server);
    if (mode == kAuthCurrent) {
      if (!client.Send(ferry::testutil::Validate()).ok())
        Fail("send VALIDATE");
    }
    if (mode == kAuthCurrent || mode == kAuthLegacy) Authenticate(client);
    // The server may drop the client part way; sending the rest then fails,
    // which is fine.
    (void)client.Send(bytes);
    ::shutdown(client.fd(), SHUT_WR);
    if (!client.ClosedByPeer(kBound))
      Fail("the server kept the connection open after the client's EOF");
  }
  if (mode == kUnauthenticated && server->GetStats().keys != 0)
    Fail("an unauthenticated client wrote a key");
  ExpectServing(*server, with_secret);
  return 0;
}
