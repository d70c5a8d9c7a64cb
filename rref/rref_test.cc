// RRef API on in-process agents in auto-deliver mode: creation, to_here,
// local values, RRefs as arguments and results in every direction, remote
// objects, errors, failures and shutdown.
#include "ferry/rref/rref.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ferry/common/poll.h"
#include "gtest/gtest.h"
#include "ferry/rpc/testing/in_process.h"
#include "ferry/tensor/tensor.h"

namespace ferry::rref {
namespace {

using rpc::testing::InProcessNetwork;

constexpr absl::Duration kWait = absl::Seconds(10);

class Counter {
 public:
  explicit Counter(int64_t start) : total_(start) {}
  int64_t Add(int64_t x) {
    MutexLock lock(&mu_);
    total_ += x;
    return total_;
  }
  int64_t Get() const {
    MutexLock lock(&mu_);
    return total_;
  }
  absl::StatusOr<int64_t> Fail() const {
    return absl::InvalidArgumentError("counter refuses");
  }

 private:
  mutable Mutex mu_;
  int64_t total_ ABSL_GUARDED_BY(mu_);
};

class RRefTest : public ::testing::Test {
 protected:
  RRefTest() : net_({"a", "b", "c"}) {
    for (const char* n : {"a", "b", "c"}) {
      auto ctx = RRefContext::Install(net_.agent(n));
      EXPECT_TRUE(ctx.ok()) << ctx.status();
      ctx_[n] = *ctx;
    }
    for (const char* n : {"a", "b", "c"}) {
      rpc::Agent& agent = net_.agent(n);
      RRefContext* ctx = ctx_[n].get();
      EXPECT_TRUE(
          agent.Register("add", [](int64_t x, int64_t y) { return x + y; })
              .ok());
      EXPECT_TRUE(agent
                      .Register("fail",
                                []() -> absl::StatusOr<int64_t> {
                                  return absl::InternalError("boom");
                                })
                      .ok());
      EXPECT_TRUE(agent
                      .Register("fetch",
                                [](RRef<int64_t> r) -> absl::StatusOr<int64_t> {
                                  return r.to_here(kWait);
                                })
                      .ok());
      EXPECT_TRUE(
          agent
              .Register(
                  "sum_all",
                  [](std::vector<RRef<int64_t>> rs) -> absl::StatusOr<int64_t> {
                    int64_t s = 0;
                    for (const auto& r : rs) {
                      absl::StatusOr<int64_t> v = r.to_here(kWait);
                      if (!v.ok()) return v.status();
                      s += *v;
                    }
                    return s;
                  })
              .ok());
      EXPECT_TRUE(agent
                      .Register("is_owner",
                                [](RRef<int64_t> r) { return r.is_owner(); })
                      .ok());
      EXPECT_TRUE(agent
                      .Register("own",
                                [ctx](int64_t v) {
                                  return MakeLocalRRef<int64_t>(*ctx, v);
                                })
                      .ok());
      EXPECT_TRUE(
          agent.Register("echo", [](RRef<int64_t> r) { return r; }).ok());
      ctx->classes()
          .RegisterClass<Counter>("Counter")
          .Constructor<int64_t>()
          .Method("add", &Counter::Add)
          .Method("get", &Counter::Get)
          .Method("fail", &Counter::Fail);
    }
  }

  // Within kWait, every worker's protocol settles and every owner's table
  // empties. (A completed future's continuation may hold a reference a little
  // after the caller got its result, hence the bounded wait, not a check.)
  void ExpectAllReleased() {
    auto released = [&] {
      for (auto& [n, c] : ctx_) {
        if (c->num_owned() != 0 || c->num_pending_children() != 0 ||
            c->num_users() != 0 || c->num_in_flight() != 0) {
          return false;
        }
      }
      return true;
    };
    PollUntil(released, kWait);
    for (auto& [n, c] : ctx_) {
      EXPECT_TRUE(c->AwaitSettled(absl::ZeroDuration()).ok()) << n;
      EXPECT_EQ(c->num_owned(), 0u) << n;
      for (const auto& o : c->Owned())
        ADD_FAILURE() << n << ": " << o.DebugString();
      EXPECT_EQ(c->num_pending_children(), 0u) << n;
      EXPECT_EQ(c->num_users(), 0u) << n;
    }
  }

  InProcessNetwork net_;
  std::map<std::string, std::shared_ptr<RRefContext>> ctx_;
};

TEST_F(RRefTest, RemoteThenToHere) {
  {
    RRef<int64_t> r = remote<int64_t>(*ctx_["a"], "b", "add", 2, 3);
    EXPECT_FALSE(r.is_owner());
    EXPECT_EQ(r.owner_name(), "b");
    EXPECT_EQ(r.owner().id, 1);
    absl::StatusOr<int64_t> v = r.to_here(kWait);
    ASSERT_TRUE(v.ok()) << v.status();
    EXPECT_EQ(*v, 5);
    ASSERT_TRUE(r.creation().Get(kWait).ok());
    EXPECT_TRUE(r.confirmed_by_owner());
    ASSERT_EQ(ctx_["b"]->Owned().size(), 1u);
    EXPECT_EQ(ctx_["b"]->Owned()[0].forks.size(), 1u);
    EXPECT_EQ(ctx_["b"]->Owned()[0].rref_id, r.rref_id());
  }
  ExpectAllReleased();
}

// A to_here() issued before the creation reply is served by the value the
// reply carries. Its continuation must let go of the handle before the caller
// gets the value: otherwise a handle the caller then drops dies later on the
// reply's thread, and its deletion misses the caller's next request to the
// owner and goes alone (one extra request per remote()+to_here() in
// bench/rref's remote_to_here_messages). Checked at once, without waiting.
TEST_F(RRefTest, ToHereKeepsNoReferenceAfterReturning) {
  for (int i = 0; i < 50; ++i) {
    {
      RRef<int64_t> r = remote<int64_t>(*ctx_["a"], "b", "add", i, 1);
      absl::StatusOr<int64_t> v = r.to_here(kWait);
      ASSERT_TRUE(v.ok()) << v.status();
      EXPECT_EQ(*v, i + 1);
    }
    ASSERT_EQ(ctx_["a"]->num_users(), 0u) << "after call " << i;
  }
  ExpectAllReleased();
}

TEST_F(RRefTest, LocalRRefAndLocalValue) {
  RRef<int64_t> r = MakeLocalRRef<int64_t>(*ctx_["a"], 41);
  EXPECT_TRUE(r.is_owner());
  EXPECT_TRUE(r.confirmed_by_owner());
  absl::StatusOr<int64_t> v = r.local_value(kWait);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, 41);
  EXPECT_EQ(*r.to_here(kWait), 41);
  EXPECT_EQ(ctx_["a"]->num_owned(), 1u);
  r = RRef<int64_t>();
  EXPECT_EQ(ctx_["a"]->num_owned(), 0u);
}

TEST_F(RRefTest, LocalValueOnUserFails) {
  RRef<int64_t> r = remote<int64_t>(*ctx_["a"], "b", "add", 1, 1);
  absl::StatusOr<int64_t> v = r.local_value(kWait);
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(v.status().message().find("'b'"), std::string::npos) << v.status();
  EXPECT_NE(v.status().message().find(r.rref_id().ToString()),
            std::string::npos);
}

TEST_F(RRefTest, RemoteToSelfIsOwner) {
  {
    RRef<int64_t> r = remote<int64_t>(*ctx_["a"], "a", "add", 4, 4);
    EXPECT_TRUE(r.is_owner());
    EXPECT_EQ(*r.local_value(kWait), 8);
    EXPECT_EQ(*r.to_here(kWait), 8);
  }
  ExpectAllReleased();
}

TEST_F(RRefTest, CreationErrorSurfacesAtUse) {
  RRef<int64_t> r = remote<int64_t>(*ctx_["a"], "b", "fail");
  absl::StatusOr<int64_t> v = r.to_here(kWait);
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), absl::StatusCode::kInternal);
  EXPECT_NE(v.status().message().find("boom"), std::string::npos);
  EXPECT_FALSE(r.creation().Get(kWait).ok());
  EXPECT_FALSE(r.confirmed_by_owner());

  RRef<int64_t> missing = remote<int64_t>(*ctx_["a"], "b", "no_such_fn");
  absl::StatusOr<int64_t> m = missing.to_here(kWait);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(m.status().message().find("no_such_fn"), std::string::npos);

  RRef<int64_t> nowhere = remote<int64_t>(*ctx_["a"], "zz", "add", 1, 2);
  absl::StatusOr<int64_t> n = nowhere.to_here(kWait);
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.status().code(), absl::StatusCode::kNotFound);
  r = missing = nowhere = RRef<int64_t>();
  ExpectAllReleased();
}

TEST_F(RRefTest, UserToUserAsArgument) {
  {
    RRef<int64_t> r = remote<int64_t>(*ctx_["a"], "b", "add", 20, 1);
    absl::StatusOr<int64_t> v =
        net_.agent("a").rpc_sync<int64_t>("c", "fetch", r);
    ASSERT_TRUE(v.ok()) << v.status();
    EXPECT_EQ(*v, 21);
  }
  ExpectAllReleased();
}

TEST_F(RRefTest, UserToOwnerBecomesOwnerHandle) {
  {
    RRef<int64_t> r = remote<int64_t>(*ctx_["a"], "b", "add", 1, 2);
    absl::StatusOr<bool> owner =
        net_.agent("a").rpc_sync<bool>("b", "is_owner", r);
    ASSERT_TRUE(owner.ok()) << owner.status();
    EXPECT_TRUE(*owner);
    absl::StatusOr<bool> user =
        net_.agent("a").rpc_sync<bool>("c", "is_owner", r);
    ASSERT_TRUE(user.ok()) << user.status();
    EXPECT_FALSE(*user);
  }
  ExpectAllReleased();
}

TEST_F(RRefTest, OwnerToUserAsResult) {
  {
    absl::StatusOr<RRef<int64_t>> r =
        net_.agent("a").rpc_sync<RRef<int64_t>>("b", "own", 77);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_FALSE(r->is_owner());
    EXPECT_EQ(r->owner_name(), "b");
    EXPECT_TRUE(r->confirmed_by_owner());  // Forked by the owner.
    EXPECT_EQ(*r->to_here(kWait), 77);
    // And back through a user->user->... echo chain.
    absl::StatusOr<RRef<int64_t>> back =
        net_.agent("a").rpc_sync<RRef<int64_t>>("c", "echo", *r);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->rref_id(), r->rref_id());
    EXPECT_NE(back->fork_id(), r->fork_id());
    EXPECT_EQ(*back->to_here(kWait), 77);
  }
  ExpectAllReleased();
}

TEST_F(RRefTest, NestedInLists) {
  {
    std::vector<RRef<int64_t>> rs;
    for (int i = 0; i < 4; ++i) {
      rs.push_back(
          remote<int64_t>(*ctx_["a"], i % 2 ? "b" : "c", "add", i, 10));
    }
    rs.push_back(MakeLocalRRef<int64_t>(*ctx_["a"], 100));
    absl::StatusOr<int64_t> s =
        net_.agent("a").rpc_sync<int64_t>("b", "sum_all", rs);
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(*s, 0 + 1 + 2 + 3 + 40 + 100);
  }
  ExpectAllReleased();
}

TEST_F(RRefTest, RemoteObjectProxies) {
  {
    RRef<Counter> c = remote<Counter>(*ctx_["a"], "b", "Counter", 10);
    absl::StatusOr<int64_t> v = c.rpc_sync(kWait).call<int64_t>("add", 5);
    ASSERT_TRUE(v.ok()) << v.status();
    EXPECT_EQ(*v, 15);
    Future<int64_t> f = c.rpc_async(kWait).call<int64_t>("add", 1);
    ASSERT_TRUE(f.Get(kWait).ok());
    EXPECT_EQ(*f.Get(kWait), 16);
    RRef<int64_t> got = c.remote(kWait).call<int64_t>("get");
    EXPECT_EQ(*got.to_here(kWait), 16);
    absl::StatusOr<int64_t> bad = c.rpc_sync(kWait).call<int64_t>("fail");
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(bad.status().message().find("counter refuses"),
              std::string::npos);
    absl::StatusOr<int64_t> none = c.rpc_sync(kWait).call<int64_t>("nope");
    ASSERT_FALSE(none.ok());
    EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
    EXPECT_FALSE(c.local_value(kWait).ok());  // a is a user.
    // On the owner, local_value gives the object itself.
    RRef<Counter> mine = remote<Counter>(*ctx_["b"], "b", "Counter", 3);
    absl::StatusOr<std::shared_ptr<Counter>> obj = mine.local_value(kWait);
    ASSERT_TRUE(obj.ok()) << obj.status();
    EXPECT_EQ((*obj)->Add(1), 4);
    EXPECT_EQ(*mine.rpc_sync(kWait).call<int64_t>("get"), 4);
  }
  ExpectAllReleased();
}

TEST_F(RRefTest, ConcurrentMethodCallsOnOneObject) {
  RRef<Counter> c = remote<Counter>(*ctx_["a"], "b", "Counter", 0);
  std::vector<Future<int64_t>> fs;
  for (int i = 0; i < 50; ++i)
    fs.push_back(c.rpc_async(kWait).call<int64_t>("add", 1));
  for (auto& f : fs) ASSERT_TRUE(f.Get(kWait).ok());
  EXPECT_EQ(*c.rpc_sync(kWait).call<int64_t>("get"), 50);
}

TEST_F(RRefTest, OwnerDeathFailsHoldersNamingOwner) {
  RRef<int64_t> r = remote<int64_t>(*ctx_["a"], "b", "add", 1, 2);
  ASSERT_TRUE(r.creation().Get(kWait).ok());
  RRef<Counter> c = remote<Counter>(*ctx_["a"], "b", "Counter", 0);
  ASSERT_TRUE(c.creation().Get(kWait).ok());
  ASSERT_TRUE(net_.Kill("b").ok());
  absl::StatusOr<int64_t> v = r.to_here(absl::Seconds(5));
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(v.status().message().find("'b'"), std::string::npos) << v.status();
  EXPECT_NE(v.status().message().find(r.rref_id().ToString()),
            std::string::npos)
      << v.status();
  absl::StatusOr<int64_t> m = c.rpc_sync(absl::Seconds(5)).call<int64_t>("get");
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kUnavailable);
  // A creation sent to the dead owner fails too.
  RRef<int64_t> late = remote<int64_t>(*ctx_["a"], "b", "add", 1, 2);
  EXPECT_EQ(late.creation().Get(kWait).code(), absl::StatusCode::kUnavailable);
  // Dropping them sends nothing more and does not hang.
  r = late = RRef<int64_t>();
  c = RRef<Counter>();
  EXPECT_TRUE(ctx_["a"]->AwaitSettled(kWait).ok());
}

TEST_F(RRefTest, UserDeathReleasesItsForks) {
  RRef<int64_t> r = remote<int64_t>(*ctx_["c"], "b", "add", 1, 2);
  ASSERT_TRUE(r.creation().Get(kWait).ok());
  ASSERT_TRUE(net_.agent("c").rpc_sync<int64_t>("a", "fetch", r).ok());
  // a's fork is deleted once a's handler is done with it: only c's is left.
  // c settled means c's pending child was accepted, so the owner registered
  // a's fork before this point; from then on, forks == {c} means a's fork
  // was also deleted (counting forks alone can see c's before a's arrives).
  ASSERT_TRUE(ctx_["c"]->AwaitSettled(kWait).ok());
  auto holders = [&] {
    std::vector<int> out;
    for (const auto& info : ctx_["b"]->Owned()) {
      for (const auto& [fork, holder] : info.forks) out.push_back(holder);
    }
    return out;
  };
  PollUntil([&] { return holders() == std::vector<int>{2}; }, kWait);
  ASSERT_EQ(holders(), std::vector<int>{2});  // c is rank 2.
  // The agent reports c's death to b's context, which drops c's fork.
  ASSERT_TRUE(net_.Kill("c").ok());
  EXPECT_TRUE(net_.agent("b").IsPeerDown(2));
  EXPECT_EQ(ctx_["b"]->num_owned(), 0u);
}

// An outside failure detector reports c down to the owner's agent (say, a
// launcher saw c's process exit): the owner's context, which holds no copy
// of the peer state, drops c's fork from that report alone, and treats c as
// dead; the agent itself does not (c is not "failed").
TEST_F(RRefTest, DetectorReportToTheAgentReleasesTheWorkersForks) {
  RRef<int64_t> r = remote<int64_t>(*ctx_["c"], "b", "add", 1, 2);
  ASSERT_TRUE(r.creation().Get(kWait).ok());
  ASSERT_TRUE(ctx_["c"]->AwaitSettled(kWait).ok());
  ASSERT_EQ(ctx_["b"]->num_owned(), 1u);
  rpc::Agent& b = net_.agent("b");
  ASSERT_TRUE(b.ReportPeerDown(2, rpc::PeerDownReason::kDetectorReport,
                               absl::UnavailableError("launcher: c exited"))
                  .ok());
  EXPECT_EQ(ctx_["b"]->num_owned(), 0u);
  EXPECT_TRUE(b.IsPeerDown(2));
  EXPECT_FALSE(b.IsPeerFailed(2));
  // A second reason for c is not a second release (nothing to see but
  // that nothing breaks), and b still owns what others create.
  ASSERT_TRUE(b.ReportPeerDown(2, rpc::PeerDownReason::kRetriesExhausted,
                               absl::UnavailableError("spent"))
                  .ok());
  RRef<int64_t> other = remote<int64_t>(*ctx_["a"], "b", "add", 2, 2);
  EXPECT_EQ(*other.to_here(kWait), 4);
  EXPECT_EQ(ctx_["b"]->num_owned(), 1u);
}

// a's deletions to b fail with Unavailable at every attempt (an interceptor
// refuses them): a's context gives up and reports b to a's agent as
// kRetriesExhausted, with the last error; from then on a's context treats b
// as dead (to_here fails at once, naming b), while the agent still calls b.
TEST_F(RRefTest, ExhaustedRetriesAreReportedToTheAgent) {
  rpc::Agent& a = net_.agent("a");
  RRef<int64_t> kept = remote<int64_t>(*ctx_["a"], "b", "add", 1, 1);
  RRef<int64_t> r = remote<int64_t>(*ctx_["a"], "b", "add", 1, 2);
  ASSERT_TRUE(kept.creation().Get(kWait).ok());
  ASSERT_TRUE(r.creation().Get(kWait).ok());
  a.AddInterceptor([](rpc::InterceptPoint point, const rpc::WorkerInfo& peer,
                      rpc::Message& m) {
    if (point == rpc::InterceptPoint::kSendRequest && peer.id == 1 &&
        m.type == kRRefUserDelete) {
      return absl::UnavailableError("test: deletions to b refused");
    }
    return absl::OkStatus();
  });
  EXPECT_FALSE(a.IsPeerDown(1));
  r = RRef<int64_t>();  // Its deletion is refused at every attempt.
  ASSERT_TRUE(PollUntil(
      [&] {
        return a.IsPeerDown(1,
                            static_cast<rpc::PeerDownReasons>(
                                rpc::PeerDownReason::kRetriesExhausted));
      },
      kWait));
  std::vector<rpc::PeerDown> table = a.PeersDown();
  ASSERT_EQ(table.size(), 1u);
  EXPECT_EQ(table[0].peer.name, "b");
  EXPECT_TRUE(table[0].first);
  EXPECT_EQ(table[0].cause.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(table[0].why.message().find("retries exhausted"),
            std::string::npos)
      << table[0].why;
  EXPECT_NE(table[0].why.message().find("deletions to b refused"),
            std::string::npos)
      << table[0].why;
  absl::StatusOr<int64_t> v = kept.to_here(kWait);
  EXPECT_EQ(v.status().code(), absl::StatusCode::kUnavailable) << v.status();
  EXPECT_NE(v.status().message().find("'b'"), std::string::npos)
      << v.status();
  EXPECT_NE(v.status().message().find("is dead"), std::string::npos)
      << v.status();
  EXPECT_FALSE(a.IsPeerFailed(1));
  EXPECT_EQ(*a.rpc_sync<int64_t>("b", "add", 2, 3), 5);
}

TEST_F(RRefTest, GracefulShutdownReleasesUsersAndReportsNoLeak) {
  RRef<int64_t> r1 = remote<int64_t>(*ctx_["a"], "b", "add", 1, 2);
  RRef<int64_t> r2 = remote<int64_t>(*ctx_["c"], "a", "add", 1, 2);
  ASSERT_TRUE(r1.creation().Get(kWait).ok());
  ASSERT_TRUE(r2.creation().Get(kWait).ok());
  // The program still holds r1 and r2: shutdown releases them itself.
  std::vector<std::thread> threads;
  std::map<std::string, absl::Status> results;
  Mutex mu;
  for (const char* n : {"a", "b", "c"}) {
    threads.emplace_back([&, n] {
      absl::Status s = ctx_[n]->Shutdown(kWait);
      MutexLock lock(&mu);
      results[n] = s;
    });
  }
  for (auto& t : threads) t.join();
  for (auto& [n, s] : results) EXPECT_TRUE(s.ok()) << n << ": " << s;
  EXPECT_EQ(ctx_["b"]->num_owned(), 0u);
  EXPECT_EQ(ctx_["a"]->num_owned(), 0u);
}

// Elastic workers (rpc/agent.h, Membership): worker "t" joins the running
// group, holds RRefs owned by "b" and leaves.
class ElasticRRefTest : public RRefTest {
 protected:
  void SetUp() override {
    absl::StatusOr<rpc::testing::InProcessAgent*> t = net_.Join("t");
    ASSERT_TRUE(t.ok()) << t.status();
    t_ = *t;
    absl::StatusOr<std::shared_ptr<RRefContext>> ctx = RRefContext::Install(*t_);
    ASSERT_TRUE(ctx.ok()) << ctx.status();
    tctx_ = *ctx;
  }
  // Workers holding forks of b's RRefs, by id.
  std::vector<int> HoldersAtB() {
    std::vector<int> out;
    for (const auto& info : ctx_["b"]->Owned()) {
      for (const auto& [fork, holder] : info.forks) out.push_back(holder);
    }
    return out;
  }
  rpc::testing::InProcessAgent* t_ = nullptr;
  std::shared_ptr<RRefContext> tctx_;
};

// The leaver's own protocol releases what it holds before it goes: the
// owner deletes the value through USER_DELETE, then learns of the departure.
TEST_F(ElasticRRefTest, LeaveReleasesHeldRRefsThroughTheProtocol) {
  RRef<int64_t> r = remote<int64_t>(*tctx_, "b", "add", 1, 2);
  absl::StatusOr<int64_t> v = r.to_here(kWait);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, 3);
  ASSERT_EQ(HoldersAtB(), std::vector<int>{t_->self().id});
  ASSERT_TRUE(tctx_->Leave(kWait).ok());  // The program still holds r.
  EXPECT_EQ(tctx_->messages_sent()[kRRefUserDelete], 1);
  EXPECT_EQ(ctx_["b"]->num_owned(), 0u);
  EXPECT_TRUE(net_.agent("b").HasLeft(t_->self().id));
  // The group goes on.
  RRef<int64_t> after = remote<int64_t>(*ctx_["a"], "b", "add", 2, 2);
  EXPECT_EQ(*after.to_here(kWait), 4);
  r = after = RRef<int64_t>();
  ctx_["t"] = tctx_;
  ExpectAllReleased();
}

// A worker that leaves without its RRef context's help (its agent alone):
// the owner drops its forks when it hears of the departure.
TEST_F(ElasticRRefTest, OwnerDropsForksOfAWorkerThatLeft) {
  RRef<int64_t> r = remote<int64_t>(*tctx_, "b", "add", 1, 2);
  ASSERT_TRUE(r.creation().Get(kWait).ok());
  ASSERT_EQ(HoldersAtB(), std::vector<int>{t_->self().id});
  ASSERT_TRUE(t_->Leave(kWait).ok());
  EXPECT_TRUE(net_.agent("b").IsPeerDown(
      t_->self().id,
      static_cast<rpc::PeerDownReasons>(rpc::PeerDownReason::kDeparted)));
  EXPECT_EQ(ctx_["b"]->num_owned(), 0u);
  // Dropping the stale handle sends nothing the owner counts, and ends.
  r = RRef<int64_t>();
  EXPECT_TRUE(tctx_->AwaitSettled(kWait).ok());
  EXPECT_EQ(ctx_["b"]->num_owned(), 0u);
}

// An owner that leaves says which of its RRefs others still held; their uses
// then fail at once naming it.
TEST_F(ElasticRRefTest, OwnerLeavingReportsHeldRRefsAndUsesFailNamingIt) {
  ASSERT_TRUE(t_->Register("seven", [] { return int64_t{7}; }).ok());
  RRef<int64_t> held = remote<int64_t>(*ctx_["a"], "t", "seven");
  ASSERT_TRUE(held.creation().Get(kWait).ok());
  absl::Status left = tctx_->Leave(kWait);
  EXPECT_EQ(left.code(), absl::StatusCode::kFailedPrecondition) << left;
  EXPECT_NE(left.message().find("left the group while other workers held 1"),
            std::string::npos)
      << left;
  absl::StatusOr<int64_t> v = held.to_here(kWait);
  EXPECT_EQ(v.status().code(), absl::StatusCode::kUnavailable) << v.status();
  EXPECT_NE(v.status().message().find("'t'"), std::string::npos) << v.status();
}

TEST_F(RRefTest, ShutdownReportsLeakedOwner) {
  // A fork registered for a user that never deletes it: c's reference is
  // created by hand through the owner's early registration, then c is cut off
  // from the protocol by destroying its context.
  absl::StatusOr<RRef<int64_t>> r =
      net_.agent("c").rpc_sync<RRef<int64_t>>("b", "own", 5);
  ASSERT_TRUE(r.ok());
  ctx_["c"].reset();  // c's handle now never reports its deletion.
  r = absl::UnknownError("dropped");
  std::vector<std::thread> threads;
  absl::Status b_status;
  threads.emplace_back([&] { b_status = ctx_["b"]->Shutdown(kWait); });
  threads.emplace_back([&] { EXPECT_TRUE(ctx_["a"]->Shutdown(kWait).ok()); });
  threads.emplace_back([&] { (void)net_.agent("c").Shutdown(true, kWait); });
  for (auto& t : threads) t.join();
  ASSERT_EQ(b_status.code(), absl::StatusCode::kFailedPrecondition) << b_status;
  EXPECT_NE(b_status.message().find("leaked 1 OwnerRRef"), std::string::npos)
      << b_status;
}

}  // namespace
}  // namespace ferry::rref
