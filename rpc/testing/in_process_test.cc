#include "ferry/rpc/testing/in_process.h"

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "ferry/common/sync.h"
#include "gtest/gtest.h"

namespace ferry::rpc::testing {
namespace {

constexpr absl::Duration kWait = absl::Seconds(30);

// Records the order in which "log" calls run on their callee.
struct Log {
  Mutex mu;
  std::vector<std::string> entries ABSL_GUARDED_BY(mu);
  std::vector<std::string> Get() {
    MutexLock lock(&mu);
    return entries;
  }
};

InProcessOptions Manual(std::shared_ptr<Log> log) {
  InProcessOptions o;
  o.auto_deliver = false;
  o.registry = std::make_shared<FunctionRegistry>();
  EXPECT_TRUE(o.registry
                  ->Register("log",
                             [log](std::string s) {
                               MutexLock lock(&log->mu);
                               log->entries.push_back(s);
                               return s + "!";
                             })
                  .ok());
  return o;
}

TEST(InProcessNetwork, DeliversInTheOrderTheTestChooses) {
  auto log = std::make_shared<Log>();
  InProcessNetwork net({"a", "b", "c"}, Manual(log));
  auto f1 = net.agent("a").rpc_async<std::string>("c", "log", std::string("1"));
  auto f2 = net.agent("b").rpc_async<std::string>("c", "log", std::string("2"));
  auto m1 = net.AwaitQueued(Matching("a", "c"), kWait);
  auto m2 = net.AwaitQueued(Matching("b", "c"), kWait);
  ASSERT_TRUE(m1.ok() && m2.ok());
  EXPECT_EQ(m1->function, "log");
  EXPECT_EQ(net.Queued().size(), 2u);
  // The later message first.
  ASSERT_TRUE(net.Deliver(m2->seq).ok());
  auto r2 = net.AwaitQueued(RepliesTo("b"), kWait);
  ASSERT_TRUE(r2.ok()) << r2.status();
  EXPECT_EQ(log->Get(), std::vector<std::string>{"2"});
  EXPECT_FALSE(f2.IsReady());  // Its reply is still queued.
  ASSERT_TRUE(net.Deliver(r2->seq).ok());
  EXPECT_EQ(*f2.Get(kWait), "2!");
  EXPECT_FALSE(f1.IsReady());
  ASSERT_TRUE(net.Deliver(m1->seq).ok());
  auto r1 = net.AwaitQueued(RepliesTo("a"), kWait);
  ASSERT_TRUE(r1.ok()) << r1.status();
  ASSERT_TRUE(net.Deliver(r1->seq).ok());
  EXPECT_EQ(*f1.Get(kWait), "1!");
  EXPECT_EQ(log->Get(), (std::vector<std::string>{"2", "1"}));
  EXPECT_EQ(net.Deliver(m1->seq).code(), absl::StatusCode::kNotFound);
}

TEST(InProcessNetwork, DuplicatedRequestRunsTwiceAndTheExtraReplyIsIgnored) {
  auto log = std::make_shared<Log>();
  InProcessNetwork net({"a", "b"}, Manual(log));
  auto f = net.agent("a").rpc_async<std::string>("b", "log", std::string("x"));
  auto m = net.AwaitQueued(Matching("a", "b"), kWait);
  ASSERT_TRUE(m.ok());
  auto copy = net.Duplicate(m->seq);
  ASSERT_TRUE(copy.ok());
  EXPECT_NE(*copy, m->seq);
  ASSERT_TRUE(net.Deliver(m->seq).ok());
  ASSERT_TRUE(net.Deliver(*copy).ok());
  // Two replies come back; the first completes the call.
  ASSERT_TRUE(
      net.AwaitQueued([](const QueuedMessage& q) { return q.is_reply; }, kWait)
          .ok());
  int delivered = 0;
  for (int i = 0; i < 100 && delivered < 2; ++i) {
    auto r = net.AwaitQueued(RepliesTo("a"), kWait);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE(net.Deliver(r->seq).ok());
    ++delivered;
  }
  EXPECT_EQ(*f.Get(kWait), "x!");
  EXPECT_EQ(log->Get(), (std::vector<std::string>{"x", "x"}));
  EXPECT_EQ(net.ignored_replies(), 1);
}

TEST(InProcessNetwork, DroppedMessageTimesOutInsteadOfHanging) {
  auto log = std::make_shared<Log>();
  InProcessNetwork net({"a", "b"}, Manual(log));
  auto f = net.agent("a").rpc_async_for<std::string>(
      absl::Milliseconds(100), "b", "log", std::string("lost"));
  auto m = net.AwaitQueued(Matching("a", "b"), kWait);
  ASSERT_TRUE(m.ok());
  ASSERT_TRUE(net.Drop(m->seq).ok());
  Result<std::string> r = f.Get(kWait);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(r.status().message().find("worker 'b' function 'log'"),
            std::string::npos)
      << r.status();
  EXPECT_TRUE(log->Get().empty());
  EXPECT_TRUE(net.Queued().empty());
}

TEST(InProcessNetwork, DelayedReplyArrivesAfterLaterTraffic) {
  auto log = std::make_shared<Log>();
  InProcessNetwork net({"a", "b"}, Manual(log));
  auto slow =
      net.agent("a").rpc_async<std::string>("b", "log", std::string("s"));
  auto m = net.AwaitQueued(Matching("a", "b"), kWait);
  ASSERT_TRUE(net.Deliver(m->seq).ok());
  auto held = net.AwaitQueued(RepliesTo("a"), kWait);
  ASSERT_TRUE(held.ok());
  // While the reply is held, a second call makes the full round trip.
  auto fast =
      net.agent("a").rpc_async<std::string>("b", "log", std::string("f"));
  for (int i = 0; i < 100 && !fast.IsReady(); ++i) {
    auto next = net.AwaitQueued(
        [&](const QueuedMessage& q) { return q.seq != held->seq; }, kWait);
    ASSERT_TRUE(next.ok()) << next.status();
    ASSERT_TRUE(net.Deliver(next->seq).ok());
  }
  EXPECT_EQ(*fast.Get(kWait), "f!");
  EXPECT_FALSE(slow.IsReady());
  ASSERT_TRUE(net.Deliver(held->seq).ok());
  EXPECT_EQ(*slow.Get(kWait), "s!");
}

TEST(InProcessNetwork, KilledWorkerFailsPendingAndLaterCalls) {
  auto log = std::make_shared<Log>();
  InProcessNetwork net({"a", "b", "c"}, Manual(log));
  auto to_b =
      net.agent("a").rpc_async<std::string>("b", "log", std::string("1"));
  auto from_b =
      net.agent("b").rpc_async<std::string>("c", "log", std::string("2"));
  auto c_to_a =
      net.agent("c").rpc_async<std::string>("a", "log", std::string("3"));
  ASSERT_TRUE(net.AwaitQueued(Matching("a", "b"), kWait).ok());
  ASSERT_TRUE(net.AwaitQueued(Matching("b", "c"), kWait).ok());
  ASSERT_TRUE(net.Kill("b").ok());
  EXPECT_TRUE(net.IsKilled("b"));
  for (auto* f : {&to_b, &from_b}) {
    Result<std::string> r = f->Get(kWait);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
    EXPECT_NE(r.status().message().find("worker 'b' died"), std::string::npos)
        << r.status();
  }
  // Later calls to the dead worker fail at once; others still work.
  Result<std::string> later =
      net.agent("c").rpc_sync<std::string>("b", "log", std::string("4"));
  EXPECT_EQ(later.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(later.status().message().find("worker 'b'"), std::string::npos)
      << later.status();
  auto req = net.AwaitQueued(Matching("c", "a"), kWait);
  ASSERT_TRUE(req.ok()) << req.status();
  ASSERT_TRUE(net.Deliver(req->seq).ok());
  auto rep = net.AwaitQueued(RepliesTo("c"), kWait);
  ASSERT_TRUE(rep.ok()) << rep.status();
  ASSERT_TRUE(net.Deliver(rep->seq).ok());
  EXPECT_EQ(*c_to_a.Get(kWait), "3!");
  EXPECT_EQ(net.Kill("nobody").code(), absl::StatusCode::kNotFound);
}

TEST(InProcessNetwork, SwitchingToAutoDeliversWhatIsQueued) {
  auto log = std::make_shared<Log>();
  InProcessNetwork net({"a", "b"}, Manual(log));
  auto f = net.agent("a").rpc_async<std::string>("b", "log", std::string("q"));
  ASSERT_TRUE(net.AwaitQueued(Matching("a", "b"), kWait).ok());
  net.SetAutoDeliver(true);
  EXPECT_EQ(*f.Get(kWait), "q!");
  EXPECT_EQ(*net.agent("b").rpc_sync<std::string>("a", "log", std::string("r")),
            "r!");
}

TEST(InProcessNetwork, HoldDelaysMatchingMessagesInAutoMode) {
  auto log = std::make_shared<Log>();
  InProcessOptions o = Manual(log);
  o.auto_deliver = true;
  InProcessNetwork net({"a", "b", "c"}, o);
  net.Hold(Matching("a", ""));  // Everything a sends waits.
  auto held =
      net.agent("a").rpc_async<std::string>("b", "log", std::string("a"));
  // Other traffic flows without stepping.
  EXPECT_EQ(*net.agent("c").rpc_sync<std::string>("b", "log", std::string("c")),
            "c!");
  auto q = net.AwaitQueued(Matching("a", "b"), kWait);
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_FALSE(held.IsReady());
  EXPECT_EQ(log->Get(), std::vector<std::string>{"c"});
  net.Hold(nullptr);
  EXPECT_EQ(*held.Get(kWait), "a!");
  EXPECT_EQ(log->Get(), (std::vector<std::string>{"c", "a"}));
}

}  // namespace
}  // namespace ferry::rpc::testing
