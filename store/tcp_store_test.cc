// TcpStore client tests: the Store conformance suite (Ferry client against
// the libuv server, current protocol and the is_server handle), connection
// retry, wait_for_workers, limits, the legacy (PyTorch 1.13) client option
// and the init_method factory.
#include "ferry/store/tcp_store.h"

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "ferry/common/status.h"
#include "gtest/gtest.h"
#include "ferry/store/testing/store_conformance.h"
#include "ferry/store/tcp_store_server.h"
#include "ferry/store/testing/tcp_store_testing.h"
#include "ferry/tests/util/held_port.h"

namespace ferry {
namespace {

// A fresh server per test; clients connect to it.
class TcpFixture : public StoreFixture {
 public:
  explicit TcpFixture(bool legacy) : legacy_(legacy) {
    TcpStoreServer::Options o;
    o.host = "127.0.0.1";
    auto server = TcpStoreServer::Start(o);
    if (server.ok()) server_ = *std::move(server);
  }
  absl::StatusOr<std::unique_ptr<Store>> Connect() override {
    if (server_ == nullptr) return absl::InternalError("server did not start");
    TcpStoreOptions o;
    o.host = "127.0.0.1";
    o.port = server_->port();
    o.timeout = absl::Seconds(20);
    o.legacy_protocol = legacy_;
    ASSIGN_OR_RETURN(std::unique_ptr<TcpStore> s, TcpStore::Create(o));
    return std::unique_ptr<Store>(std::move(s));
  }
  int64_t BlockedCalls(Store&) override { return server_->GetStats().waiting; }

 private:
  bool legacy_;
  std::unique_ptr<TcpStoreServer> server_;
};

// The handle that hosts the server in-process (PyTorch's is_server rank).
class ServerHandleFixture : public StoreFixture {
 public:
  absl::StatusOr<std::unique_ptr<Store>> Connect() override {
    TcpStoreOptions o;
    o.host = "127.0.0.1";
    o.port = 0;
    o.is_server = true;
    o.timeout = absl::Seconds(20);
    ASSIGN_OR_RETURN(std::unique_ptr<TcpStore> s, TcpStore::Create(o));
    return std::unique_ptr<Store>(std::move(s));
  }
  // Clones share the first handle's server.
  int64_t BlockedCalls(Store& waiter) override {
    return static_cast<TcpStore&>(waiter).server()->GetStats().waiting;
  }
};

INSTANTIATE_TEST_SUITE_P(
    TCPStore, StoreConformanceTest,
    ::testing::Values(
        StoreConformanceParam{
            "TCPStore", [] { return std::make_unique<TcpFixture>(false); }},
        StoreConformanceParam{
            "TCPStoreServerHandle",
            [] { return std::make_unique<ServerHandleFixture>(); }}),
    StoreConformanceParamName);

TcpStoreOptions ClientOptions(int port) {
  TcpStoreOptions o;
  o.host = "127.0.0.1";
  o.port = port;
  o.timeout = absl::Seconds(20);
  return o;
}

TEST(TcpStoreTest, ConnectGivesUpNamingHostPortAndAttempts) {
  testutil::HeldPort held;  // Reserved; nothing listens until a server does.
  const int port = held.port();
  ASSERT_GT(port, 0);
  TcpStoreOptions o = ClientOptions(port);
  o.timeout = absl::Milliseconds(300);
  const absl::Time start = absl::Now();
  auto store = TcpStore::Create(o);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kUnavailable);
  const std::string msg(store.status().message());
  EXPECT_TRUE(absl::StrContains(msg, absl::StrCat("127.0.0.1:", port))) << msg;
  EXPECT_TRUE(absl::StrContains(msg, "attempt")) << msg;
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(250));
}

TEST(TcpStoreTest, ConnectRetriesUntilTheServerComesUp) {
  testutil::HeldPort held;  // Reserved; nothing listens until a server does.
  const int port = held.port();
  ASSERT_GT(port, 0);
  absl::StatusOr<std::unique_ptr<TcpStore>> client;
  std::thread t([&] { client = TcpStore::Create(ClientOptions(port)); });
  TcpStoreOptions so = ClientOptions(port);
  so.is_server = true;
  auto server = TcpStore::Create(so);
  t.join();
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->Set("k", "v").ok());
  EXPECT_EQ((*server)->Get("k").value_or("?"), "v");
}

TEST(TcpStoreTest, WaitForWorkers) {
  TcpStoreOptions so = ClientOptions(0);
  so.is_server = true;
  so.world_size = 4;
  testutil::HeldPort held;  // Reserved; nothing listens until a server does.
  const int port = held.port();
  ASSERT_GT(port, 0);
  so.port = port;
  std::vector<std::thread> workers;
  std::atomic<int> ok{0};
  for (int i = 0; i < 3; ++i) {
    workers.emplace_back([&] {
      TcpStoreOptions o = ClientOptions(port);
      o.world_size = 4;
      if (TcpStore::Create(o).ok()) ++ok;
    });
  }
  auto server = TcpStore::Create(so);
  for (auto& t : workers) t.join();
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_EQ(ok.load(), 3);
  // PyTorch-visible join counter (unprefixed "init/").
  EXPECT_EQ((*server)->server()->GetStats().keys, 1);
}

TEST(TcpStoreTest, WaitForWorkersFailsClearlyWhenTheyDoNotCome) {
  TcpStoreOptions so = ClientOptions(0);
  so.is_server = true;
  so.world_size = 3;
  so.timeout = absl::Milliseconds(200);
  auto server = TcpStore::Create(so);
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(
      absl::StrContains(server.status().message(), "1/3 workers joined"))
      << server.status();
}

TEST(TcpStoreTest, ClientSideLimitsNameTheLimit) {
  TcpStoreOptions so = ClientOptions(0);
  so.is_server = true;
  so.limits.max_key_bytes = 8;
  so.limits.max_value_bytes = 16;
  so.limits.max_keys_per_request = 2;
  auto store = TcpStore::Create(so);
  ASSERT_TRUE(store.ok()) << store.status();
  absl::Status s = (*store)->Set("a-long-key", "v");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.message(), "key limit of 8")) << s;
  s = (*store)->Set("k", std::string(17, 'v'));
  EXPECT_TRUE(absl::StrContains(s.message(), "value limit of 16")) << s;
  s = (*store)->Wait({"a", "b", "c"}, absl::Seconds(1));
  EXPECT_TRUE(absl::StrContains(s.message(), "limit of 2 keys")) << s;
  EXPECT_TRUE((*store)->Set("k", "fine").ok());
  EXPECT_EQ((*store)->Get("k").value_or("?"), "fine");
}

// A client whose limits are looser than the server's is disconnected by the
// server; other clients carry on, and the offender reconnects on its next
// operation.
TEST(TcpStoreTest, ServerLimitViolationDropsOnlyThatClient) {
  TcpStoreServer::Options so;
  so.host = "127.0.0.1";
  so.limits.max_value_bytes = 1024;
  auto server = TcpStoreServer::Start(so);
  ASSERT_TRUE(server.ok());
  auto good = TcpStore::Create(ClientOptions((*server)->port()));
  auto bad = TcpStore::Create(ClientOptions((*server)->port()));
  ASSERT_TRUE(good.ok() && bad.ok());
  ASSERT_TRUE(
      (*bad)->Set("big", std::string(4096, 'x')).ok());  // fire and forget
  absl::StatusOr<int64_t> r = (*bad)->Add("n", 1);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_EQ((*good)->Add("n", 1).value_or(-1), 1);
  EXPECT_EQ((*bad)->Add("n", 1).value_or(-1), 2);  // reconnected
  EXPECT_FALSE((*good)->Check({"big"}).value_or(true));
  EXPECT_EQ((*server)->GetStats().dropped, 1);
}

TEST(TcpStoreTest, CloneOutlivesTheServerHandle) {
  TcpStoreOptions so = ClientOptions(0);
  so.is_server = true;
  auto server = TcpStore::Create(so);
  ASSERT_TRUE(server.ok());
  auto clone = (*server)->Clone();
  ASSERT_TRUE(clone.ok());
  ASSERT_TRUE((*server)->Set("k", "v").ok());
  server->reset();
  EXPECT_EQ((*clone)->Get("k").value_or("?"), "v");
}

TEST(TcpStoreTest, PingAndDescribe) {
  TcpStoreOptions so = ClientOptions(0);
  so.is_server = true;
  auto store = TcpStore::Create(so);
  ASSERT_TRUE(store.ok());
  EXPECT_TRUE((*store)->Ping().ok());
  EXPECT_EQ((*store)->Describe(),
            absl::StrCat("tcp://127.0.0.1:", (*store)->port()));
}

TEST(TcpStoreTest, TimeoutErrorNamesMissingKeysAndConnectionStaysUsable) {
  TcpStoreOptions so = ClientOptions(0);
  so.is_server = true;
  auto store = TcpStore::Create(so);
  ASSERT_TRUE(store.ok());
  ASSERT_TRUE((*store)->Set("present", "1").ok());
  absl::Status s =
      (*store)->Wait({"present", "absent"}, absl::Milliseconds(50));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(absl::StrContains(s.message(), "absent")) << s;
  EXPECT_FALSE(absl::StrContains(s.message(), "present")) << s;
  EXPECT_EQ((*store)->Add("after", 1).value_or(-1), 1);
}

// The legacy option speaks PyTorch 1.13's numbering; against a Ferry server
// it behaves like the current client except for queues.
TEST(TcpStoreTest, LegacyClientOption) {
  TcpStoreServer::Options so;
  so.host = "127.0.0.1";
  auto server = TcpStoreServer::Start(so);
  ASSERT_TRUE(server.ok());
  TcpStoreOptions o = ClientOptions((*server)->port());
  o.legacy_protocol = true;
  o.world_size = 1;
  auto store = TcpStore::Create(o);
  ASSERT_TRUE(store.ok()) << store.status();
  TcpStore& s = **store;
  ASSERT_TRUE(s.Set("a", "1").ok());
  EXPECT_EQ(s.Get("a").value_or("?"), "1");
  EXPECT_EQ(s.Add("n", 3).value_or(-1), 3);
  EXPECT_EQ(s.CompareSet("a", "1", "2").value_or("?"), "2");
  ASSERT_TRUE(s.Append("a", "x").ok());
  EXPECT_EQ(s.Get("a").value_or("?"), "2x");
  ASSERT_TRUE(s.MultiSet({"m1", "m2"}, {"v1", "v2"}).ok());
  auto mg = s.MultiGet({"m2", "m1"});
  ASSERT_TRUE(mg.ok());
  EXPECT_EQ((*mg)[0], "v2");
  EXPECT_EQ(s.NumKeys().value_or(-1), 5);  // init/, a, n, m1, m2
  EXPECT_TRUE(s.DeleteKey("m1").value_or(false));
  EXPECT_EQ(s.QueuePush("q", "x").code(), absl::StatusCode::kUnimplemented);
  absl::Status w = s.Wait({"never"}, absl::Milliseconds(50));
  EXPECT_EQ(w.code(), absl::StatusCode::kDeadlineExceeded) << w;
  EXPECT_TRUE(absl::StrContains(w.message(), "never")) << w;
  EXPECT_EQ(s.Add("n", 1).value_or(-1), 4);  // usable after the timeout
  std::thread setter([&] {
    auto other = s.Clone();
    ASSERT_TRUE(other.ok());
    ASSERT_TRUE((*other)->Set("later", "L").ok());
  });
  EXPECT_EQ(s.Get("later").value_or("?"), "L");
  setter.join();
  EXPECT_EQ((*server)->GetStats().dropped, 0);
}

// Timed waits in a loop (how elastic rendezvous polls), then the keys
// appear: with either protocol the handle stays in step, the server drops
// nobody and holds no abandoned wait.
TEST(TcpStoreTest, TimedWaitsInALoopStayInStep) {
  TcpStoreServer::Options so;
  so.host = "127.0.0.1";
  auto server = TcpStoreServer::Start(so);
  ASSERT_TRUE(server.ok());
  for (bool legacy : {false, true}) {
    SCOPED_TRACE(legacy ? "legacy" : "current");
    TcpStoreOptions o = ClientOptions((*server)->port());
    o.legacy_protocol = legacy;
    auto poller = TcpStore::Create(o);
    auto setter = TcpStore::Create(o);
    ASSERT_TRUE(poller.ok() && setter.ok());
    const std::string p = legacy ? "leg/" : "cur/";
    for (int i = 0; i < 5; ++i) {
      absl::Status w =
          (*poller)->Wait({absl::StrCat(p, i)}, absl::Milliseconds(20));
      EXPECT_EQ(w.code(), absl::StatusCode::kDeadlineExceeded) << w;
    }
    EXPECT_EQ((*server)->GetStats().waiting, 0);
    for (int i = 0; i < 5; ++i) {
      ASSERT_TRUE((*setter)->Set(absl::StrCat(p, i), "v").ok());
    }
    EXPECT_EQ((*poller)->Add(p + "n", 2).value_or(-1), 2);
    EXPECT_EQ((*poller)->Get(p + "4").value_or("?"), "v");
    EXPECT_TRUE((*poller)->Check({p + "0", p + "n"}).value_or(false));
  }
  EXPECT_EQ((*server)->GetStats().dropped, 0);
}

// The receive buffer starts small and grows on demand: values from a byte to
// megabytes, alone and several in one response, then small answers again.
TEST(TcpStoreTest, ValuesOfEverySizeThroughTheGrowingReceiveBuffer) {
  TcpStoreOptions so = ClientOptions(0);
  so.is_server = true;
  auto store = TcpStore::Create(so);
  ASSERT_TRUE(store.ok());
  std::vector<std::string> keys;
  std::vector<std::string> values;
  for (size_t size : {size_t{1}, size_t{2047}, size_t{2049}, size_t{5000},
                      size_t{100000}, size_t{3} << 20}) {
    keys.push_back(absl::StrCat("size/", size));
    values.push_back(std::string(size, static_cast<char>('a' + keys.size())));
    ASSERT_TRUE((*store)->Set(keys.back(), values.back()).ok());
    EXPECT_EQ((*store)->Get(keys.back()).value_or("?"), values.back());
  }
  auto all = (*store)->MultiGet(keys);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(*all, values);
  EXPECT_EQ((*store)->Add("size/n", 1).value_or(-1), 1);
  EXPECT_EQ((*store)->Get(keys.front()).value_or("?"), values.front());
}

TEST(TcpStoreTest, FactoryMakesServerAndClients) {
  auto factory = MakeTcpStoreFactory();
  testutil::HeldPort held;  // Reserved; nothing listens until a server does.
  const int port = held.port();
  ASSERT_GT(port, 0);
  absl::StatusOr<std::unique_ptr<Store>> client;
  std::thread t([&] {
    client = factory("127.0.0.1", port, false, 2, absl::Seconds(20));
  });
  auto server = factory("127.0.0.1", port, true, 2, absl::Seconds(20));
  t.join();
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->Set("x", "y").ok());
  EXPECT_EQ((*server)->Get("x").value_or("?"), "y");
  EXPECT_EQ((*server)->Timeout(), absl::Seconds(20));
}

TEST(TcpStoreTest, InvalidArguments) {
  TcpStoreOptions o = ClientOptions(0);
  EXPECT_EQ(TcpStore::Create(o).status().code(),
            absl::StatusCode::kInvalidArgument);
  o.port = 70000;
  EXPECT_EQ(TcpStore::Create(o).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ferry
