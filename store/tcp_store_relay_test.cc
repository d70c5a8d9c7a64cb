// TcpStoreRelay tests: the Store conformance suite through a relay (both
// client protocol generations), coalesced reads and combined ADDs counted in
// the relay's stats, shared upstream WAITs, a lost server failing waits at
// once and the relay reconnecting to a restarted one, a client leaving
// mid-wait, and hostile bytes. The killed relay process and PyTorch's
// client through a relay are in tests/store.
#include "ferry/store/tcp_store_relay.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "ferry/common/poll.h"
#include "ferry/common/status.h"
#include "ferry/store/testing/store_conformance.h"
#include "ferry/store/tcp_store.h"
#include "ferry/store/tcp_store_server.h"
#include "ferry/store/testing/tcp_store_testing.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

using tcpstore::Generation;
using tcpstore::Op;
using testutil::RawClient;
namespace t = testutil;

constexpr absl::Duration kLimit = absl::Seconds(20);

std::unique_ptr<TcpStoreServer> StartServer(int port = 0) {
  TcpStoreServer::Options o;
  o.host = "127.0.0.1";
  o.port = port;
  auto server = TcpStoreServer::Start(o);
  if (!server.ok()) return nullptr;
  return *std::move(server);
}

std::unique_ptr<TcpStoreRelay> StartRelay(
    int upstream_port,
    const std::function<void(TcpStoreRelay::Options&)>& edit = nullptr) {
  TcpStoreRelay::Options o;
  o.upstream_port = upstream_port;
  if (edit) edit(o);
  o.connect_timeout = absl::Seconds(10);
  auto relay = TcpStoreRelay::Start(o);
  if (!relay.ok()) return nullptr;
  return *std::move(relay);
}

absl::StatusOr<std::unique_ptr<TcpStore>> Client(int port, bool legacy = false,
                                                 absl::Duration timeout =
                                                     kLimit) {
  TcpStoreOptions o;
  o.host = "127.0.0.1";
  o.port = port;
  o.timeout = timeout;
  o.legacy_protocol = legacy;
  return TcpStore::Create(o);
}

// A server and a relay in front of it; clients connect to the relay.
// (The suite needs queues, which the legacy client lacks; legacy clients
// through a relay: EveryOperationThroughTheRelay and tests/store.)
class RelayFixture : public StoreFixture {
 public:
  explicit RelayFixture(bool legacy) : legacy_(legacy) {
    server_ = StartServer();
    if (server_ != nullptr) relay_ = StartRelay(server_->port());
  }
  absl::StatusOr<std::unique_ptr<Store>> Connect() override {
    if (relay_ == nullptr) return absl::InternalError("relay did not start");
    ASSIGN_OR_RETURN(std::unique_ptr<TcpStore> s,
                     Client(relay_->port(), legacy_));
    return std::unique_ptr<Store>(std::move(s));
  }
  int64_t BlockedCalls(Store&) override { return relay_->GetStats().waiting; }

 private:
  bool legacy_;
  std::unique_ptr<TcpStoreServer> server_;
  std::unique_ptr<TcpStoreRelay> relay_;
};

INSTANTIATE_TEST_SUITE_P(
    TCPStoreRelay, StoreConformanceTest,
    ::testing::Values(
        StoreConformanceParam{
            "Relay", [] { return std::make_unique<RelayFixture>(false); }}),
    StoreConformanceParamName);

class RelayTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = StartServer();
    ASSERT_NE(server_, nullptr);
    relay_ = StartRelay(server_->port());
    ASSERT_NE(relay_, nullptr);
  }
  std::unique_ptr<TcpStore> NewClient(bool legacy = false) {
    auto c = Client(relay_->port(), legacy);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *std::move(c) : nullptr;
  }
  RawClient Raw(Generation gen) {
    RawClient raw;
    EXPECT_TRUE(raw.Connect(relay_->port()).ok());
    if (gen == Generation::kCurrent) {
      EXPECT_TRUE(raw.Send(t::Validate()).ok());
    }
    return raw;
  }

  std::unique_ptr<TcpStoreServer> server_;
  std::unique_ptr<TcpStoreRelay> relay_;
};

class RelayOpsTest : public RelayTest,
                     public ::testing::WithParamInterface<bool> {};

TEST_P(RelayOpsTest, EveryOperationThroughTheRelay) {
  auto c = NewClient(/*legacy=*/GetParam());
  ASSERT_NE(c, nullptr);
  ASSERT_TRUE(c->Set("a", "1").ok());
  EXPECT_EQ(c->Get("a").value_or("?"), "1");
  EXPECT_EQ(c->Add("n", 5).value_or(0), 5);
  EXPECT_EQ(c->Add("n", -2).value_or(0), 3);
  EXPECT_EQ(c->CompareSet("a", "1", "2").value_or("?"), "2");
  EXPECT_EQ(c->CompareSet("a", "1", "3").value_or("?"), "2");
  ASSERT_TRUE(c->Append("ap", "x").ok());
  ASSERT_TRUE(c->Append("ap", "y").ok());
  EXPECT_EQ(c->Get("ap").value_or("?"), "xy");
  EXPECT_TRUE(c->DeleteKey("ap").value_or(false));
  ASSERT_TRUE(c->MultiSet({"x", "y"}, {"X", "Y"}).ok());
  EXPECT_EQ(c->MultiGet({"x", "y", "a"}).value_or(std::vector<std::string>{}),
            (std::vector<std::string>{"X", "Y", "2"}));
  ASSERT_TRUE(c->Wait({"x", "y"}).ok());
  EXPECT_EQ(c->NumKeys().value_or(0), 4);
  EXPECT_TRUE(c->DeleteKey("x").value_or(false));
  EXPECT_FALSE(c->Check({"x"}).value_or(true));
  EXPECT_EQ(c->NumKeys().value_or(0), 3);
  if (!GetParam()) {
    ASSERT_TRUE(c->Ping().ok());  // current generation only
  }
  // The keys are the server's: a direct client sees them.
  auto direct = Client(server_->port());
  ASSERT_TRUE(direct.ok());
  EXPECT_EQ((*direct)->Get("y").value_or("?"), "Y");
  EXPECT_EQ(relay_->GetStats().dropped, 0);
}

INSTANTIATE_TEST_SUITE_P(BothGenerations, RelayOpsTest,
                         ::testing::Values(false, true),
                         [](const auto& info) {
                           return info.param ? "Legacy" : "Current";
                         });

// Pipelined identical reads and same-key ADDs in one write travel upstream
// once; each ADD still gets its own result, as if run one after another.
TEST_F(RelayTest, PipelinedReadsAndAddsAreCoalesced) {
  auto c = NewClient();
  ASSERT_TRUE(c->Set("k", "value").ok());
  ASSERT_TRUE(c->Add("sum", 10).ok());
  const TcpStoreRelay::Stats before = relay_->GetStats();
  const int64_t server_ops_before = server_->GetStats().ops;
  constexpr int kN = 100;
  std::string frames;
  for (int i = 0; i < kN; ++i) frames += t::GetFrame(Generation::kCurrent, "/k");
  for (int i = 0; i < kN; ++i)
    frames += t::AddFrame(Generation::kCurrent, "/sum", 1);
  RawClient raw = Raw(Generation::kCurrent);
  ASSERT_TRUE(raw.Send(frames).ok());
  for (int i = 0; i < kN; ++i) {
    EXPECT_EQ(raw.RecvBytes().value_or("?"), "value");
  }
  for (int i = 0; i < kN; ++i) {
    EXPECT_EQ(raw.RecvI64().value_or(-1), 11 + i);
  }
  const TcpStoreRelay::Stats after = relay_->GetStats();
  EXPECT_EQ(after.local_requests - before.local_requests, 2 * kN + 1);
  // One read of the frames gives one GET and one ADD upstream; a read split
  // by the kernel gives a few more, never one per request.
  const int64_t upstream = after.upstream_requests - before.upstream_requests;
  EXPECT_LE(upstream, 10) << "upstream requests for " << 2 * kN << " local";
  EXPECT_GE(after.coalesced - before.coalesced, 2 * kN - 10);
  EXPECT_LE(server_->GetStats().ops - server_ops_before, 11);
  EXPECT_EQ(c->Get("sum").value_or("?"), absl::StrCat(10 + kN));
}

// A combined ADD the server refuses (the value is not a number) is sent
// again one by one before anything its client sent after it: the adds are
// refused, then the SET applies, as in the client's own order. Before the
// fix the adds went after the SET and both succeeded on "5".
TEST_F(RelayTest, RefusedCombinedAddKeepsTheClientsOrder) {
  auto c = NewClient();
  ASSERT_TRUE(c->Set("k", "abc").ok());
  const TcpStoreRelay::Stats before = relay_->GetStats();
  std::string frames = t::AddFrame(Generation::kCurrent, "/k", 1) +
                       t::AddFrame(Generation::kCurrent, "/k", 1) +
                       t::SetFrame(Generation::kCurrent, "/k", "5") +
                       t::GetFrame(Generation::kCurrent, "/k");
  RawClient raw = Raw(Generation::kCurrent);
  ASSERT_TRUE(raw.Send(frames).ok());
  constexpr int64_t kRefused = std::numeric_limits<int64_t>::min();
  EXPECT_EQ(raw.RecvI64().value_or(-1), kRefused);
  EXPECT_EQ(raw.RecvI64().value_or(-1), kRefused);
  EXPECT_EQ(raw.RecvBytes().value_or("?"), "5");
  // The two adds did ride one upstream request (one read of the frames).
  EXPECT_GE(relay_->GetStats().coalesced - before.coalesced, 1);
  EXPECT_EQ(c->Get("k").value_or("?"), "5");
  // The client goes on after its release.
  ASSERT_TRUE(raw.Send(t::AddFrame(Generation::kCurrent, "/k", 2)).ok());
  EXPECT_EQ(raw.RecvI64().value_or(-1), 7);
}

// A listening socket that accepts nothing until Drain(): the relay's
// connection sits in its backlog and nothing it writes is read.
class StalledServer {
 public:
  StalledServer() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    if (bind(fd_, reinterpret_cast<sockaddr*>(&a), len) == 0 &&
        listen(fd_, 4) == 0 &&
        getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
      port_ = ntohs(a.sin_port);
    }
  }
  ~StalledServer() {
    if (drainer_.joinable()) drainer_.join();
    close(fd_);
  }
  int port() const { return port_; }
  // Accepts the relay and reads (and drops) everything until it closes.
  void Drain() {
    drainer_ = std::thread([this] {
      const int c = accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      std::vector<char> buf(1 << 20);
      while (read(c, buf.data(), buf.size()) > 0) {
      }
      close(c);
    });
  }

 private:
  int fd_ = -1;
  int port_ = 0;
  std::thread drainer_;
};

// A client flooding SETs at a server that reads nothing: the relay stops
// reading from its clients once max_upstream_queue_bytes are queued (the
// queue stays bounded), and reads again once the server drains.
TEST(RelayBackpressureTest, AFloodingClientCannotGrowTheUpstreamQueue) {
  StalledServer server;
  ASSERT_NE(server.port(), 0);
  constexpr size_t kLimit = 1 << 20;
  auto relay = StartRelay(server.port(), [](TcpStoreRelay::Options& o) {
    o.max_upstream_queue_bytes = kLimit;
  });
  ASSERT_NE(relay, nullptr);
  constexpr int kSets = 400;  // 100 MiB in all
  const std::string value(256 * 1024, 'v');
  RawClient flood;
  ASSERT_TRUE(flood.Connect(relay->port()).ok());
  std::atomic<bool> sent{false};
  std::thread flooder([&] {
    bool ok = flood.Send(t::Validate()).ok();
    for (int i = 0; ok && i < kSets; ++i) {
      ok = flood.Send(t::SetFrame(Generation::kCurrent, "/flood", value)).ok();
    }
    sent = ok;
  });
  EXPECT_TRUE(PollUntil([&] { return relay->GetStats().throttles >= 1; },
                        absl::Seconds(30)));
  // Throttled: the queue stays near the limit (beyond it: what one loop
  // turn read, libuv reading a stream up to 32 times per turn), far below
  // the 100 MiB sent.
  const size_t bound = kLimit + (4 << 20);
  EXPECT_FALSE(PollUntil(
      [&] { return relay->GetStats().upstream_queue_bytes > int64_t{bound}; },
      absl::Seconds(2)))
      << relay->GetStats().upstream_queue_bytes << " bytes queued";
  EXPECT_FALSE(sent.load());  // The flooder is held back.
  server.Drain();
  EXPECT_TRUE(PollUntil([&] { return sent.load(); }, absl::Seconds(60)));
  flooder.join();
  EXPECT_TRUE(PollUntil(
      [&] { return relay->GetStats().local_requests >= kSets; },
      absl::Seconds(30)));
  EXPECT_LE(relay->GetStats().upstream_queue_bytes, int64_t{bound});
}

// With the store's secret: the relay proves it upstream (on the main and
// the WAIT side connections) and requires it of its clients; a client with
// a wrong secret or none is refused, and a relay with a wrong secret fails
// to start, naming the server.
TEST(RelayAuthTest, TheSecretIsProvedOnBothSides) {
  TcpStoreServer::Options so;
  so.host = "127.0.0.1";
  so.secret = "job-secret";
  auto server = TcpStoreServer::Start(so);
  ASSERT_TRUE(server.ok()) << server.status();
  auto relay = StartRelay((*server)->port(), [](TcpStoreRelay::Options& o) {
    o.secret = "job-secret";
  });
  ASSERT_NE(relay, nullptr);
  auto client = [&](const std::string& secret) {
    TcpStoreOptions o;
    o.host = "127.0.0.1";
    o.port = relay->port();
    o.timeout = kLimit;
    o.secret = secret;
    return TcpStore::Create(o);
  };
  auto good = client("job-secret");
  ASSERT_TRUE(good.ok()) << good.status();
  ASSERT_TRUE((*good)->Set("k", "v").ok());
  EXPECT_EQ((*good)->Get("k").value_or("?"), "v");
  EXPECT_EQ((*good)->Add("n", 3).value_or(-1), 3);
  // A WAIT travels on a side connection, which authenticates too.
  auto other = client("job-secret");
  ASSERT_TRUE(other.ok()) << other.status();
  std::thread setter([&] {
    ASSERT_TRUE(PollUntil([&] { return relay->GetStats().waiting >= 1; },
                          kLimit));
    EXPECT_TRUE((*other)->Set("late", "1").ok());
  });
  EXPECT_TRUE((*good)->Wait({"late"}, kLimit).ok());
  setter.join();

  auto wrong = client("not-it");
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kPermissionDenied)
      << wrong.status();
  // No secret: the first query is refused and the connection dropped.
  const int64_t dropped = relay->GetStats().dropped;
  RawClient raw;
  ASSERT_TRUE(raw.Connect(relay->port()).ok());
  ASSERT_TRUE(raw.Send(t::Validate() +
                       t::GetFrame(Generation::kCurrent, "/k")).ok());
  EXPECT_TRUE(raw.ClosedByPeer());
  EXPECT_GT(relay->GetStats().dropped, dropped);
  EXPECT_EQ((*good)->Get("k").value_or("?"), "v");  // The others go on.

  TcpStoreRelay::Options bad;
  bad.upstream_port = (*server)->port();
  bad.secret = "not-it";
  bad.connect_timeout = absl::Seconds(10);
  auto refused = TcpStoreRelay::Start(bad);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied)
      << refused.status();
  EXPECT_TRUE(absl::StrContains(refused.status().message(),
                                absl::StrCat((*server)->port())))
      << refused.status();
}

// Many clients adding at once: every result distinct, the final sum right.
TEST_F(RelayTest, ConcurrentAddsGetDistinctResults) {
  constexpr int kClients = 16;
  constexpr int kAdds = 200;
  std::vector<std::vector<int64_t>> results(kClients);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      auto c = Client(relay_->port());
      if (!c.ok()) {
        ++failures;
        return;
      }
      for (int j = 0; j < kAdds; ++j) {
        auto v = (*c)->Add("counter", 1);
        if (!v.ok()) {
          ++failures;
          return;
        }
        results[i].push_back(*v);
      }
    });
  }
  for (std::thread& th : threads) th.join();
  ASSERT_EQ(failures.load(), 0);
  std::set<int64_t> all;
  for (const auto& r : results) {
    EXPECT_TRUE(std::is_sorted(r.begin(), r.end()));
    all.insert(r.begin(), r.end());
  }
  EXPECT_EQ(all.size(), kClients * kAdds);
  EXPECT_EQ(*all.begin(), 1);
  EXPECT_EQ(*all.rbegin(), kClients * kAdds);
  auto c = NewClient();
  EXPECT_EQ(c->Get("counter").value_or("?"), absl::StrCat(kClients * kAdds));
}

// Waiters on one key share one upstream WAIT, and all wake on its SET.
TEST_F(RelayTest, WaitsOnAKeyShareOneUpstreamWait) {
  constexpr int kWaiters = 20;
  std::vector<RawClient> raws;
  for (int i = 0; i < kWaiters; ++i) {
    raws.push_back(Raw(Generation::kCurrent));
    ASSERT_TRUE(
        raws.back().Send(t::KeysFrame(Generation::kCurrent, Op::kWait, {"/go"}))
            .ok());
  }
  ASSERT_TRUE(PollUntil(
      [&] { return relay_->GetStats().waiting == kWaiters; }, kLimit));
  ASSERT_TRUE(
      PollUntil([&] { return server_->GetStats().waiting == 1; }, kLimit));
  EXPECT_EQ(relay_->GetStats().upstream_waits, 1);
  auto c = NewClient();
  ASSERT_TRUE(c->Set("go", "1").ok());
  for (RawClient& r : raws) {
    EXPECT_EQ(r.RecvU8().value_or(99), tcpstore::kStopWaiting);
  }
  EXPECT_EQ(relay_->GetStats().waiting, 0);
}

// A WAIT on more distinct keys than max_wait_connections: the relay holds
// at most that many upstream WAITs, queues the other keys, and answers once
// every key is set; idle wait connections beyond max_idle_wait_connections
// (0 here) are closed, so only the main connection stays.
TEST(RelayWaitCapTest, ManyKeysShareABoundedSetOfWaitConnections) {
  std::unique_ptr<TcpStoreServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  std::unique_ptr<TcpStoreRelay> relay =
      StartRelay(server->port(), [](TcpStoreRelay::Options& o) {
        o.max_wait_connections = 2;
        o.max_idle_wait_connections = 0;
      });
  ASSERT_NE(relay, nullptr);
  const std::vector<std::string> keys = {"/k0", "/k1", "/k2", "/k3", "/k4"};
  RawClient raw;
  ASSERT_TRUE(raw.Connect(relay->port()).ok());
  ASSERT_TRUE(raw.Send(t::Validate()).ok());
  ASSERT_TRUE(
      raw.Send(t::KeysFrame(Generation::kCurrent, Op::kWait, keys)).ok());
  ASSERT_TRUE(PollUntil([&] { return relay->GetStats().waiting == 1; },
                        kLimit));
  ASSERT_TRUE(
      PollUntil([&] { return server->GetStats().waiting == 2; }, kLimit));
  auto setter = Client(relay->port());
  ASSERT_TRUE(setter.ok()) << setter.status();
  for (size_t i = 0; i < keys.size(); ++i) {
    // At most 2 upstream WAITs at any time (checked before each set).
    EXPECT_LE(server->GetStats().waiting, 2);
    EXPECT_EQ(relay->GetStats().waiting, 1) << "after " << i << " keys set";
    ASSERT_TRUE((*setter)->Set(keys[i].substr(1), "1").ok());
  }
  EXPECT_EQ(raw.RecvU8().value_or(99), tcpstore::kStopWaiting);
  EXPECT_EQ(relay->GetStats().waiting, 0);
  // Only the main upstream connection is left at the server.
  EXPECT_TRUE(
      PollUntil([&] { return server->GetStats().clients == 1; }, kLimit))
      << server->GetStats().clients << " connections at the server";
}

// A query pipelined behind a pending WAIT is answered first (as the server
// does); CANCEL_WAIT frees the upstream wait and answers in order.
TEST_F(RelayTest, PipelinedQueryBehindWaitAndCancel) {
  RawClient raw = Raw(Generation::kCurrent);
  ASSERT_TRUE(raw.Send(t::KeysFrame(Generation::kCurrent, Op::kWait, {"/w"}) +
                       t::BareFrame(Generation::kCurrent, Op::kGetNumKeys))
                  .ok());
  EXPECT_EQ(raw.RecvI64().value_or(-1), 0);
  ASSERT_TRUE(
      PollUntil([&] { return server_->GetStats().waiting == 1; }, kLimit));
  ASSERT_TRUE(
      raw.Send(t::BareFrame(Generation::kCurrent, Op::kCancelWait)).ok());
  EXPECT_EQ(raw.RecvU8().value_or(99), tcpstore::kWaitCanceled);
  ASSERT_TRUE(
      PollUntil([&] { return server_->GetStats().waiting == 0; }, kLimit));
  auto c = NewClient();
  ASSERT_TRUE(c->Set("w", "1").ok());
  ASSERT_EQ(c->Get("w").value_or("?"), "1");
  EXPECT_TRUE(raw.Quiet(absl::Milliseconds(200)));  // no stale STOP_WAITING
}

// PyTorch 1.13 (legacy) gives up a timed wait by sending its next query: the
// abandoned wait never answers, through the relay as on the server.
TEST_F(RelayTest, LegacyAbandonedWaitNeverAnswers) {
  RawClient raw = Raw(Generation::kLegacy);
  ASSERT_TRUE(
      raw.Send(t::KeysFrame(Generation::kLegacy, Op::kWait, {"/old"})).ok());
  ASSERT_TRUE(PollUntil([&] { return relay_->GetStats().waiting == 1; },
                        kLimit));
  ASSERT_TRUE(
      raw.Send(t::KeysFrame(Generation::kLegacy, Op::kWait, {"/new"})).ok());
  auto c = NewClient();
  ASSERT_TRUE(c->Set("old", "1").ok());
  ASSERT_EQ(c->Get("old").value_or("?"), "1");  // the SET was handled
  ASSERT_TRUE(raw.Send(t::BareFrame(Generation::kLegacy, Op::kGetNumKeys)).ok());
  EXPECT_EQ(raw.RecvI64().value_or(-1), 1);  // not a stale wait byte
  ASSERT_TRUE(c->Set("new", "1").ok());
  ASSERT_EQ(c->Get("new").value_or("?"), "1");
  EXPECT_TRUE(raw.Quiet(absl::Milliseconds(200)));  // the GETNUMKEYS gave it up
}

// A client leaving mid-wait frees its wait on the relay and the server.
TEST_F(RelayTest, DisconnectMidWaitFreesTheUpstreamWait) {
  {
    RawClient raw = Raw(Generation::kCurrent);
    ASSERT_TRUE(
        raw.Send(t::KeysFrame(Generation::kCurrent, Op::kWait, {"/never"}))
            .ok());
    ASSERT_TRUE(
        PollUntil([&] { return server_->GetStats().waiting == 1; }, kLimit));
  }
  EXPECT_TRUE(PollUntil(
      [&] {
        return relay_->GetStats().waiting == 0 &&
               relay_->GetStats().upstream_waits == 0 &&
               server_->GetStats().waiting == 0;
      },
      kLimit));
  // The freed wait connection serves the next wait.
  auto c = NewClient();
  ASSERT_TRUE(c->Set("k", "v").ok());
  ASSERT_TRUE(c->Wait({"k"}).ok());
}

// The server going away fails every waiting call at once (not at its
// timeout); the relay reconnects when a server is back on the port.
TEST_F(RelayTest, LostServerFailsWaitsPromptlyAndRelayReconnects) {
  constexpr int kWaiters = 4;
  std::vector<std::unique_ptr<TcpStore>> clients;
  for (int i = 0; i < kWaiters; ++i) {
    auto c = Client(relay_->port(), false, absl::Seconds(120));
    ASSERT_TRUE(c.ok());
    clients.push_back(*std::move(c));
  }
  std::vector<absl::Status> results(kWaiters);
  std::vector<std::thread> threads;
  for (int i = 0; i < kWaiters; ++i) {
    threads.emplace_back(
        [&, i] { results[i] = clients[i]->Wait({absl::StrCat("key", i)}); });
  }
  ASSERT_TRUE(PollUntil(
      [&] { return relay_->GetStats().waiting == kWaiters; }, kLimit));
  const int port = server_->port();
  const absl::Time killed = absl::Now();
  server_->Stop();
  for (std::thread& th : threads) th.join();
  EXPECT_LT(absl::Now() - killed, absl::Seconds(10));
  for (const absl::Status& s : results) {
    EXPECT_TRUE(absl::IsUnavailable(s)) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), relay_->address()) ||
                absl::StrContains(s.message(), absl::StrCat(relay_->port())))
        << s;
  }
  EXPECT_EQ(relay_->GetStats().upstream_losses, 1);
  // A server back on the same port: the relay reconnects, and the clients'
  // next calls (which reopen their connections) succeed.
  server_ = StartServer(port);
  ASSERT_NE(server_, nullptr) << "port " << port << " was taken meanwhile";
  ASSERT_TRUE(PollUntil([&] { return relay_->GetStats().upstream_connected; },
                        kLimit));
  ASSERT_TRUE(clients[0]->Set("back", "1").ok());
  EXPECT_EQ(clients[1]->Get("back").value_or("?"), "1");
}

// Garbage from one client drops that client only.
TEST_F(RelayTest, HostileBytesDropOnlyThatClient) {
  auto good = NewClient();
  ASSERT_TRUE(good->Set("k", "v").ok());
  const std::vector<std::string> hostile = {
      std::string("\x00\xff\xff\xff\xff\xff\xff\xff\xff", 9),  // bad handshake
      t::Validate() + std::string("\x7f", 1),                   // unknown op
      t::Validate() + t::GetFrame(Generation::kCurrent, "") .substr(0, 1) +
          std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8),  // 2^63 key
      t::Validate() + std::string(1, static_cast<char>(0xF0)) +
          std::string(8, '\0'),  // AUTH to a relay
  };
  for (const std::string& bytes : hostile) {
    RawClient raw;
    ASSERT_TRUE(raw.Connect(relay_->port()).ok());
    ASSERT_TRUE(raw.Send(bytes).ok());
    EXPECT_TRUE(raw.ClosedByPeer());
  }
  EXPECT_EQ(relay_->GetStats().dropped, static_cast<int64_t>(hostile.size()));
  EXPECT_EQ(good->Get("k").value_or("?"), "v");
  EXPECT_EQ(relay_->GetStats().upstream_losses, 0);
  EXPECT_EQ(server_->GetStats().dropped, 0);
}

// An APPEND the server refuses (past its value limit) makes the server drop
// the connection it came on: the relay sends APPENDs on a side connection,
// so only the appending client is dropped, and the client's requests after
// its APPEND see it.
TEST(RelayAppendTest, RefusedAppendDropsOnlyThatClient) {
  TcpStoreServer::Options so;
  so.host = "127.0.0.1";
  so.limits.max_value_bytes = 16;
  auto server = TcpStoreServer::Start(so);
  ASSERT_TRUE(server.ok());
  auto relay = StartRelay((*server)->port());
  ASSERT_NE(relay, nullptr);
  auto other = Client(relay->port());
  ASSERT_TRUE(other.ok());
  ASSERT_TRUE((*other)->Set("k", "v").ok());
  RawClient raw;
  ASSERT_TRUE(raw.Connect(relay->port()).ok());
  ASSERT_TRUE(
      raw.Send(t::Validate() +
               t::KeyValueFrame(Generation::kCurrent, Op::kAppend, "/a",
                                "0123456789") +
               t::GetFrame(Generation::kCurrent, "/a") +
               t::KeyValueFrame(Generation::kCurrent, Op::kAppend, "/a",
                                "0123456789") +
               t::GetFrame(Generation::kCurrent, "/a"))
          .ok());
  EXPECT_EQ(raw.RecvBytes().value_or("?"), "0123456789");
  EXPECT_TRUE(raw.ClosedByPeer());
  EXPECT_EQ(relay->GetStats().dropped, 1);
  EXPECT_EQ(relay->GetStats().upstream_losses, 0);
  EXPECT_EQ((*other)->Get("k").value_or("?"), "v");
  EXPECT_EQ((*other)->Get("a").value_or("?"), "0123456789");
}

TEST(RelayStartTest, UnreachableServerFailsStartNamingIt) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  const int port = server->port();
  server->Stop();
  TcpStoreRelay::Options o;
  o.upstream_port = port;
  o.connect_timeout = absl::Milliseconds(300);
  auto relay = TcpStoreRelay::Start(o);
  ASSERT_FALSE(relay.ok());
  EXPECT_TRUE(absl::IsUnavailable(relay.status())) << relay.status();
  EXPECT_TRUE(absl::StrContains(relay.status().message(),
                                absl::StrCat("127.0.0.1:", port)))
      << relay.status();
}

}  // namespace
}  // namespace ferry
