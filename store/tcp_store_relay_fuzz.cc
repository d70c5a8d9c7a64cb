// libFuzzer target: a live TcpStoreRelay (on loopback, in front of a live
// TcpStoreServer) fed one local client's bytes, while an honest client
// holds a WAIT through the same relay.
//
// The first input byte picks how the bytes start: even, as given (a legacy
// client, or garbage); odd, after VALIDATE (a current client). Seeds:
// store/testdata/tcp_store_relay (tcp_store_relay_corpus_gen) and the
// server's corpus (whose setting byte reads the same way here).
//
// Checks, for any input: the relay survives and keeps its upstream (no
// upstream loss: a local client's bytes never break the shared connection);
// the client's connection is closed once it stops sending (no hang); the
// honest client's WAIT is still served afterwards, and a fresh client gets
// its PING answered through the relay.
#include <sys/socket.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "ferry/common/logging.h"
#include "ferry/store/tcp_store_protocol.h"
#include "ferry/store/tcp_store_relay.h"
#include "ferry/store/tcp_store_server.h"
#include "ferry/store/testing/tcp_store_testing.h"

namespace {

using ferry::TcpStoreRelay;
using ferry::TcpStoreServer;
using ferry::testutil::RawClient;
namespace tcpstore = ferry::tcpstore;
namespace t = ferry::testutil;

constexpr absl::Duration kBound = absl::Seconds(10);

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "tcp_store_relay_fuzz: %s\n", what.c_str());
  std::abort();
}

tcpstore::Limits SmallLimits() {
  // Small, so that inputs of a few kilobytes reach them.
  tcpstore::Limits limits;
  limits.max_key_bytes = 64;
  limits.max_value_bytes = 256;
  limits.max_keys_per_request = 16;
  limits.max_frame_bytes = 4096;
  return limits;
}

// One server and relay for the whole run (a fresh pair per input would spend
// the run connecting).
struct Rig {
  std::unique_ptr<TcpStoreServer> server;
  std::unique_ptr<TcpStoreRelay> relay;
};

Rig& GetRig() {
  static Rig* rig = [] {
    ferry::SetLogLevel(ferry::LogLevel::kError);
    auto* r = new Rig;
    TcpStoreServer::Options so;
    so.host = "127.0.0.1";
    so.limits = SmallLimits();
    auto server = TcpStoreServer::Start(so);
    if (!server.ok()) Fail(server.status().ToString());
    r->server = *std::move(server);
    TcpStoreRelay::Options ro;
    ro.upstream_port = r->server->port();
    ro.limits = SmallLimits();
    ro.max_pending_write_bytes = 1 << 20;
    ro.max_pending_requests = 256;
    auto relay = TcpStoreRelay::Start(ro);
    if (!relay.ok()) Fail(relay.status().ToString());
    r->relay = *std::move(relay);
    return r;
  }();
  return *rig;
}

RawClient Connect(const TcpStoreRelay& relay) {
  RawClient client;
  absl::Status s = client.Connect(relay.port());
  if (!s.ok()) Fail(absl::StrCat("connect: ", s.ToString()));
  // Close with a reset: thousands of inputs a second would otherwise leave
  // as many sockets in TIME_WAIT.
  const linger reset{1, 0};
  ::setsockopt(client.fd(), SOL_SOCKET, SO_LINGER, &reset, sizeof(reset));
  return client;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  Rig& rig = GetRig();
  const bool validate = (data[0] & 1) != 0;
  const absl::string_view bytes(reinterpret_cast<const char*>(data) + 1,
                                size - 1);
  // An honest waiter on a key nobody else uses.
  static uint64_t round = 0;
  const std::string key = absl::StrCat("/honest", ++round);
  RawClient honest = Connect(*rig.relay);
  if (!honest.Send(t::Validate() + t::KeysFrame(tcpstore::Generation::kCurrent,
                                                tcpstore::Op::kWait, {key}))
           .ok())
    Fail("send the honest WAIT");
  {
    RawClient client = Connect(*rig.relay);
    if (validate && !client.Send(t::Validate()).ok()) Fail("send VALIDATE");
    // The relay may drop the client part way; sending the rest then fails.
    (void)client.Send(bytes);
    ::shutdown(client.fd(), SHUT_WR);
    if (!client.ClosedByPeer(kBound))
      Fail("the relay kept the connection open after the client's EOF");
  }
  if (rig.relay->GetStats().upstream_losses != 0)
    Fail("a local client's bytes broke the relay's upstream");
  // The honest waiter is still served: set its key through a fresh client,
  // whose PING round trip also shows the relay answering.
  RawClient setter = Connect(*rig.relay);
  std::string frames = t::Validate() +
                       t::SetFrame(tcpstore::Generation::kCurrent, key, "v") +
                       t::BareFrame(tcpstore::Generation::kCurrent,
                                    tcpstore::Op::kPing);
  tcpstore::PutU32(&frames, 0x5eed1234);
  if (!setter.Send(frames).ok()) Fail("send SET and PING");
  absl::StatusOr<std::string> echo = setter.Recv(4, kBound);
  if (!echo.ok() || tcpstore::LoadU32(echo->data()) != 0x5eed1234)
    Fail("the relay stopped serving after the fuzzed client");
  absl::StatusOr<uint8_t> woke = honest.RecvU8(kBound);
  if (!woke.ok() || *woke != tcpstore::kStopWaiting)
    Fail("the honest client's WAIT was not answered");
  return 0;
}
