// Deterministic protocol tests: the in-process network holds every message
// and the test chooses what is delivered, in which order, duplicated or
// dropped (PyTorch rref.md's scenarios, G1 and G2, idempotency, retries).
#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ferry/common/poll.h"
#include "gtest/gtest.h"
#include "ferry/rpc/context.h"
#include "ferry/rpc/layer.h"
#include "ferry/rpc/testing/in_process.h"
#include "ferry/rref/rref.h"

namespace ferry::rref {
namespace {

using rpc::MessageType;
using rpc::testing::InProcessNetwork;
using rpc::testing::QueuedMessage;

constexpr absl::Duration kWait = absl::Seconds(10);

class ProtocolTest : public ::testing::Test {
 protected:
  explicit ProtocolTest(size_t inline_value_bytes = 4096,
                        absl::Duration flush_delay = absl::Milliseconds(2))
      : net_({"a", "b", "c"}, Manual()) {
    RRefContext::Options o;
    o.delete_flush_delay = flush_delay;
    o.internal_timeout = absl::Milliseconds(300);  // Retries come quickly.
    o.max_attempts = 5;
    o.inline_value_bytes = inline_value_bytes;
    for (const char* n : {"a", "b", "c"}) {
      auto ctx = RRefContext::Install(net_.agent(n), o);
      EXPECT_TRUE(ctx.ok()) << ctx.status();
      ctx_[n] = *ctx;
      rpc::Agent& agent = net_.agent(n);
      RRefContext* c = ctx_[n].get();
      EXPECT_TRUE(
          agent.Register("add", [](int64_t x, int64_t y) { return x + y; })
              .ok());
      EXPECT_TRUE(agent
                      .Register("hold",
                                [this](RRef<int64_t> r) {
                                  MutexLock lock(&mu_);
                                  held_.push_back(std::move(r));
                                })
                      .ok());
      EXPECT_TRUE(agent
                      .Register("own",
                                [c](int64_t v) {
                                  return MakeLocalRRef<int64_t>(*c, v);
                                })
                      .ok());
    }
  }

  static InProcessNetwork::Options Manual() {
    InProcessNetwork::Options o;
    o.auto_deliver = false;
    return o;
  }

  // Waits for a request of `type` from `from` to `to` and delivers it.
  uint64_t Deliver(MessageType type, const std::string& from,
                   const std::string& to) {
    absl::StatusOr<QueuedMessage> m = net_.AwaitQueued(
        [&](const QueuedMessage& q) {
          return !q.is_reply && q.type == type && q.from == from && q.to == to;
        },
        kWait);
    EXPECT_TRUE(m.ok()) << m.status();
    if (!m.ok()) return 0;
    EXPECT_TRUE(net_.Deliver(m->seq).ok());
    return m->seq;
  }
  // Delivers request `seq` and waits until its handler replied (the reply is
  // queued, not delivered); returns the reply's seq.
  uint64_t Serve(uint64_t seq) {
    std::optional<QueuedMessage> req;
    for (const QueuedMessage& q : net_.Queued()) {
      if (q.seq == seq) req = q;
    }
    EXPECT_TRUE(req.has_value());
    if (!req) return 0;
    EXPECT_TRUE(net_.Deliver(seq).ok());
    absl::StatusOr<QueuedMessage> reply = net_.AwaitQueued(
        [&](const QueuedMessage& q) { return q.is_reply && q.id == req->id; },
        kWait);
    EXPECT_TRUE(reply.ok()) << reply.status();
    return reply.ok() ? reply->seq : 0;
  }
  uint64_t Serve(MessageType type, const std::string& from,
                 const std::string& to) {
    absl::StatusOr<QueuedMessage> m = net_.AwaitQueued(
        [&](const QueuedMessage& q) {
          return !q.is_reply && q.type == type && q.from == from && q.to == to;
        },
        kWait);
    EXPECT_TRUE(m.ok()) << m.status();
    return m.ok() ? Serve(m->seq) : 0;
  }
  // Waits (bounded) until `pred` holds; returns whether it did.
  static bool WaitUntil(const std::function<bool()>& pred) {
    return PollUntil(pred, kWait);
  }
  // Waits for the reply to a request of `type` travelling to `to`; delivers.
  void DeliverReply(MessageType type, const std::string& to) {
    absl::StatusOr<QueuedMessage> m = net_.AwaitQueued(
        [&](const QueuedMessage& q) {
          return q.is_reply && q.type == type && q.to == to;
        },
        kWait);
    ASSERT_TRUE(m.ok()) << m.status();
    ASSERT_TRUE(net_.Deliver(m->seq).ok());
  }
  // Round trip: request delivered, then its reply.
  void RoundTrip(MessageType type, const std::string& from,
                 const std::string& to) {
    uint64_t reply = Serve(type, from, to);
    ASSERT_TRUE(net_.Deliver(reply).ok());
  }
  int CountQueued(MessageType type) const {
    int n = 0;
    for (const QueuedMessage& q : net_.Queued()) n += q.type == type;
    return n;
  }
  // Delivers everything until every context is settled and the queue empty.
  void Settle() {
    for (int i = 0; i < 200; ++i) {
      net_.DeliverAll();
      bool settled = net_.Queued().empty();
      for (auto& [n, c] : ctx_) {
        settled = settled && c->AwaitSettled(absl::ZeroDuration()).ok();
      }
      if (settled) return;
      (void)net_.AwaitQueued([](const QueuedMessage&) { return true; },
                             absl::Milliseconds(200));
    }
    FAIL() << "protocol did not settle";
  }
  size_t HeldCount() {
    MutexLock lock(&mu_);
    return held_.size();
  }
  void DropHeld() {
    std::vector<RRef<int64_t>> doomed;
    {
      MutexLock lock(&mu_);
      doomed.swap(held_);
    }
  }
  // A confirmed user RRef on `user` owned by `owner`, made in manual mode.
  RRef<int64_t> Confirmed(const std::string& user, const std::string& owner) {
    RRef<int64_t> r = remote<int64_t>(*ctx_[user], owner, "add", 1, 2);
    RoundTrip(kRemoteCall, user, owner);
    EXPECT_TRUE(r.creation().Get(kWait).ok());
    return r;
  }

  InProcessNetwork net_;
  std::map<std::string, std::shared_ptr<RRefContext>> ctx_;
  Mutex mu_;
  std::vector<RRef<int64_t>> held_ ABSL_GUARDED_BY(mu_);
};

// G1: a user dropped before the owner confirmed it sends its deletion only
// after the confirmation, so the owner registers the fork first.
TEST_F(ProtocolTest, DeleteOfUnconfirmedUserWaitsForConfirmation) {
  { RRef<int64_t> r = remote<int64_t>(*ctx_["a"], "b", "add", 1, 2); }
  EXPECT_EQ(CountQueued(kRRefUserDelete), 0);
  EXPECT_EQ(CountQueued(kRemoteCall), 1);
  uint64_t reply = Serve(kRemoteCall, "a", "b");
  ASSERT_EQ(ctx_["b"]->Owned().size(), 1u);
  EXPECT_EQ(ctx_["b"]->Owned()[0].forks.size(), 1u);
  EXPECT_EQ(CountQueued(kRRefUserDelete), 0);
  ASSERT_TRUE(net_.Deliver(reply).ok());
  RoundTrip(kRRefUserDelete, "a", "b");
  EXPECT_EQ(ctx_["b"]->num_owned(), 0u);
  Settle();
}

// A fetch that overtakes the creation waits on the owner for the value. (The
// creator's own early to_here() waits for the creation reply instead, so the
// fetch comes from a user the creator shared the RRef with.)
TEST_F(ProtocolTest, FetchBeforeCreationWaitsForValue) {
  RRef<int64_t> r = remote<int64_t>(*ctx_["a"], "b", "add", 20, 22);
  Future<Value> call = net_.agent("a").rpc_async("c", "hold", r);
  RoundTrip(MessageType::kCall, "a", "c");
  ASSERT_TRUE(call.Get(kWait).ok());
  RRef<int64_t> held;
  {
    MutexLock lock(&mu_);
    ASSERT_EQ(held_.size(), 1u);
    held = held_[0];
  }
  Future<int64_t> f = held.to_here_async(kWait);
  Deliver(kRRefFetch, "c", "b");
  ASSERT_TRUE(WaitUntil([&] { return ctx_["b"]->num_owned() == 1; }));
  // A placeholder; the fetch's reply waits for the value.
  EXPECT_FALSE(ctx_["b"]->Owned()[0].created);
  EXPECT_FALSE(f.IsReady());
  Deliver(kRemoteCall, "a", "b");
  DeliverReply(kRRefFetch, "c");
  ASSERT_TRUE(f.Get(kWait).ok()) << f.Get(kWait).status();
  EXPECT_EQ(*f.Get(kWait), 42);
  r = RRef<int64_t>();
  held = RRef<int64_t>();
  DropHeld();
  Settle();
  EXPECT_EQ(ctx_["b"]->num_owned(), 0u);
}

// G2: user a shares its RRef with c and drops it at once. a's reference stays
// (a pending child) until c's fork is confirmed by the owner and c accepted;
// holding c's FORK_REQUEST back holds everything else back.
TEST_F(ProtocolTest, ParentKeptUntilChildConfirmed) {
  RRef<int64_t> r = Confirmed("a", "b");
  Future<Value> call = net_.agent("a").rpc_async("c", "hold", r);
  r = RRef<int64_t>();
  EXPECT_EQ(ctx_["a"]->num_pending_children(), 1u);
  RoundTrip(MessageType::kCall, "a", "c");
  ASSERT_TRUE(call.Get(kWait).ok());
  EXPECT_EQ(HeldCount(), 1u);
  // c's FORK_REQUEST to b is queued; deliver nothing else of the protocol.
  absl::StatusOr<QueuedMessage> fork = net_.AwaitQueued(
      [](const QueuedMessage& q) {
        return q.type == kRRefForkRequest && !q.is_reply;
      },
      kWait);
  ASSERT_TRUE(fork.ok());
  EXPECT_EQ(CountQueued(kRRefUserDelete), 0);
  EXPECT_EQ(CountQueued(kRRefChildAccept), 0);
  EXPECT_EQ(ctx_["a"]->num_pending_children(), 1u);
  ASSERT_EQ(ctx_["b"]->Owned().size(), 1u);
  EXPECT_EQ(ctx_["b"]->Owned()[0].forks.size(), 1u);  // a's only.
  // Now the owner learns of c's fork, then c accepts, then a deletes.
  uint64_t fork_reply = Serve(fork->seq);
  EXPECT_EQ(ctx_["b"]->Owned()[0].forks.size(), 2u);
  ASSERT_TRUE(net_.Deliver(fork_reply).ok());
  RoundTrip(kRRefChildAccept, "c", "a");
  EXPECT_EQ(ctx_["a"]->num_pending_children(), 0u);
  RoundTrip(kRRefUserDelete, "a", "b");
  ASSERT_EQ(ctx_["b"]->Owned().size(), 1u);  // c still holds it.
  EXPECT_EQ(ctx_["b"]->Owned()[0].forks.size(), 1u);
  DropHeld();
  RoundTrip(kRRefUserDelete, "c", "b");
  EXPECT_EQ(ctx_["b"]->num_owned(), 0u);
  Settle();
}

// Owner -> user: the fork is registered when sent; the user is confirmed on
// arrival and sends nothing until it deletes.
TEST_F(ProtocolTest, OwnerForkRegisteredEarly) {
  Future<RRef<int64_t>> f =
      net_.agent("a").rpc_async<RRef<int64_t>>("b", "own", 9);
  uint64_t reply = Serve(MessageType::kCall, "a", "b");
  // The owner's own handle is gone with the handler; the fork keeps it.
  ASSERT_EQ(ctx_["b"]->Owned().size(), 1u);
  ASSERT_EQ(ctx_["b"]->Owned()[0].forks.size(), 1u);
  EXPECT_EQ(ctx_["b"]->Owned()[0].forks.begin()->second, 0);  // Holder a.
  ASSERT_TRUE(net_.Deliver(reply).ok());
  absl::StatusOr<RRef<int64_t>> r = f.Get(kWait);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->confirmed_by_owner());
  EXPECT_TRUE(net_.Queued().empty());
  r = absl::CancelledError("dropped");
  f = Future<RRef<int64_t>>();  // The future kept a copy of the result.
  RoundTrip(kRRefUserDelete, "a", "b");
  EXPECT_EQ(ctx_["b"]->num_owned(), 0u);
}

// User -> owner: the owner takes a local handle and accepts the child; the
// fork is never registered.
TEST_F(ProtocolTest, UserToOwnerAccepts) {
  RRef<int64_t> r = Confirmed("a", "b");
  Future<Value> call = net_.agent("a").rpc_async("b", "hold", r);
  r = RRef<int64_t>();
  uint64_t call_reply = Serve(MessageType::kCall, "a", "b");
  ASSERT_EQ(HeldCount(), 1u);
  {
    MutexLock lock(&mu_);
    EXPECT_TRUE(held_[0].is_owner());
  }
  EXPECT_EQ(ctx_["b"]->Owned()[0].forks.size(), 1u);  // Still a's only.
  EXPECT_EQ(CountQueued(kRRefUserDelete), 0);
  RoundTrip(kRRefChildAccept, "b", "a");
  RoundTrip(kRRefUserDelete, "a", "b");
  EXPECT_EQ(ctx_["b"]->num_owned(), 1u);  // b's own handle.
  ASSERT_TRUE(net_.Deliver(call_reply).ok());
  ASSERT_TRUE(call.Get(kWait).ok());
  DropHeld();
  EXPECT_EQ(ctx_["b"]->num_owned(), 0u);
  Settle();
}

// A user shares an RRef it is still creating with the owner, and that
// message overtakes the REMOTE_CALL: the owner's handle waits for the value.
TEST_F(ProtocolTest, HandleOvertakesCreationOnOwner) {
  RRef<int64_t> r = remote<int64_t>(*ctx_["a"], "b", "add", 3, 4);
  Future<Value> call = net_.agent("a").rpc_async("b", "hold", r);
  r = RRef<int64_t>();
  uint64_t call_reply = Serve(MessageType::kCall, "a", "b");
  ASSERT_EQ(HeldCount(), 1u);
  RRef<int64_t> held;
  {
    MutexLock lock(&mu_);
    held = held_[0];
  }
  EXPECT_TRUE(held.is_owner());
  EXPECT_FALSE(held.creation().IsReady());
  EXPECT_EQ(held.local_value(absl::ZeroDuration()).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  RoundTrip(kRemoteCall, "a", "b");
  absl::StatusOr<int64_t> v = held.local_value(kWait);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, 7);
  ASSERT_TRUE(net_.Deliver(call_reply).ok());
  held = RRef<int64_t>();
  DropHeld();
  Settle();
  EXPECT_EQ(ctx_["b"]->num_owned(), 0u);
  EXPECT_EQ(ctx_["a"]->num_users(), 0u);
}

// Duplicated REMOTE_CALL, FORK_REQUEST and USER_DELETE delivered late
// neither resurrect the value nor run the function twice.
TEST_F(ProtocolTest, LateDuplicatesAreHarmless) {
  std::atomic<int> calls{0};
  ASSERT_TRUE(net_.agent("b")
                  .Register("count",
                            [&calls](int64_t x) {
                              calls.fetch_add(1);
                              return x;
                            })
                  .ok());
  RRef<int64_t> r = remote<int64_t>(*ctx_["a"], "b", "count", 5);
  absl::StatusOr<QueuedMessage> create = net_.AwaitQueued(
      [](const QueuedMessage& q) { return q.type == kRemoteCall; },
      kWait);
  ASSERT_TRUE(create.ok());
  absl::StatusOr<uint64_t> dup_create = net_.Duplicate(create->seq);
  ASSERT_TRUE(dup_create.ok());
  ASSERT_TRUE(net_.Deliver(Serve(create->seq)).ok());
  // Share with c so there is a FORK_REQUEST to duplicate.
  Future<Value> call = net_.agent("a").rpc_async("c", "hold", r);
  RoundTrip(MessageType::kCall, "a", "c");
  absl::StatusOr<QueuedMessage> fork = net_.AwaitQueued(
      [](const QueuedMessage& q) {
        return q.type == kRRefForkRequest && !q.is_reply;
      },
      kWait);
  ASSERT_TRUE(fork.ok());
  absl::StatusOr<uint64_t> dup_fork = net_.Duplicate(fork->seq);
  ASSERT_TRUE(dup_fork.ok());
  ASSERT_TRUE(net_.Deliver(Serve(fork->seq)).ok());
  r = RRef<int64_t>();
  DropHeld();
  // Deliver the protocol, holding back the two duplicates.
  for (int i = 0; i < 100; ++i) {
    bool progressed = false;
    for (const QueuedMessage& q : net_.Queued()) {
      if (q.seq == *dup_create || q.seq == *dup_fork) continue;
      progressed = net_.Deliver(q.seq).ok() || progressed;
    }
    if (ctx_["b"]->num_owned() == 0 && !progressed) break;
    if (!progressed) {
      (void)net_.AwaitQueued(
          [&](const QueuedMessage& q) {
            return q.seq != *dup_create && q.seq != *dup_fork;
          },
          absl::Milliseconds(200));
    }
  }
  ASSERT_EQ(ctx_["b"]->num_owned(), 0u);
  // Now the stale duplicates arrive.
  ASSERT_TRUE(net_.Deliver(*dup_create).ok());
  ASSERT_TRUE(net_.Deliver(*dup_fork).ok());
  Settle();
  EXPECT_EQ(ctx_["b"]->num_owned(), 0u);
  EXPECT_EQ(calls.load(), 1);
  // A duplicated deletion of a live fork removes it once.
  RRef<int64_t> r2 = Confirmed("a", "b");
  RRef<int64_t> r3 = Confirmed("c", "b");
  r2 = RRef<int64_t>();
  absl::StatusOr<QueuedMessage> del = net_.AwaitQueued(
      [](const QueuedMessage& q) {
        return q.type == kRRefUserDelete && !q.is_reply;
      },
      kWait);
  ASSERT_TRUE(del.ok());
  ASSERT_TRUE(net_.Duplicate(del->seq).ok());
  Settle();
  ASSERT_EQ(ctx_["b"]->Owned().size(), 1u);  // r3's value, untouched.
  EXPECT_EQ(ctx_["b"]->Owned()[0].forks.size(), 1u);
  Future<int64_t> v = r3.to_here_async(kWait);
  RoundTrip(kRRefFetch, "c", "b");
  ASSERT_TRUE(v.Get(kWait).ok()) << v.Get(kWait).status();
  EXPECT_EQ(*v.Get(kWait), 3);
}

// A dropped USER_DELETE is retried after the internal timeout.
TEST_F(ProtocolTest, DroppedDeleteIsRetried) {
  RRef<int64_t> r = Confirmed("a", "b");
  r = RRef<int64_t>();
  absl::StatusOr<QueuedMessage> del = net_.AwaitQueued(
      [](const QueuedMessage& q) {
        return q.type == kRRefUserDelete && !q.is_reply;
      },
      kWait);
  ASSERT_TRUE(del.ok());
  ASSERT_TRUE(net_.Drop(del->seq).ok());
  EXPECT_EQ(ctx_["b"]->num_owned(), 1u);
  // The retry appears once the first attempt's deadline passes.
  absl::StatusOr<QueuedMessage> retry = net_.AwaitQueued(
      [&](const QueuedMessage& q) {
        return q.type == kRRefUserDelete && !q.is_reply &&
               q.seq != del->seq;
      },
      kWait);
  ASSERT_TRUE(retry.ok()) << retry.status();
  ASSERT_TRUE(net_.Deliver(Serve(retry->seq)).ok());
  EXPECT_EQ(ctx_["b"]->num_owned(), 0u);
  EXPECT_GE(ctx_["a"]->messages_sent()[kRRefUserDelete], 2);
  Settle();
}

// A receiver that dies before accepting its fork: once its death is known
// (the agent reports it to the context), the parent's pending child goes and
// the parent deletes normally.
TEST_F(ProtocolTest, ReceiverDeathReleasesPendingChild) {
  RRef<int64_t> r = Confirmed("a", "b");
  Future<Value> call = net_.agent("a").rpc_async("c", "hold", r);
  r = RRef<int64_t>();
  EXPECT_EQ(ctx_["a"]->num_pending_children(), 1u);
  EXPECT_FALSE(net_.agent("a").IsPeerDown(2));
  ASSERT_TRUE(net_.Kill("c").ok());
  EXPECT_FALSE(call.Get(kWait).ok());
  EXPECT_TRUE(net_.agent("a").IsPeerDown(2));
  EXPECT_EQ(ctx_["a"]->num_pending_children(), 0u);
  RoundTrip(kRRefUserDelete, "a", "b");
  EXPECT_EQ(ctx_["b"]->num_owned(), 0u);
}

// Owner death fails a pending creation and a pending fetch, naming the owner.
TEST_F(ProtocolTest, OwnerDeathFailsPendingCreationAndFetch) {
  RRef<int64_t> r = remote<int64_t>(*ctx_["a"], "b", "add", 1, 1);
  Future<int64_t> f = r.to_here_async(kWait);
  ASSERT_TRUE(net_.Kill("b").ok());
  absl::Status created = r.creation().Get(kWait);
  EXPECT_EQ(created.code(), absl::StatusCode::kUnavailable) << created;
  EXPECT_NE(created.message().find("'b'"), std::string::npos) << created;
  Result<int64_t> v = f.Get(kWait);
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(v.status().message().find(r.rref_id().ToString()),
            std::string::npos)
      << v.status();
}

// A to_here() issued before the creation reply is served by the value that
// reply carries: one round trip, no RREF_FETCH. A later to_here() fetches.
TEST_F(ProtocolTest, CreationReplyServesEarlyToHere) {
  RRef<int64_t> r = remote<int64_t>(*ctx_["a"], "b", "add", 20, 22);
  Future<int64_t> early = r.to_here_async(kWait);
  uint64_t reply = Serve(kRemoteCall, "a", "b");
  EXPECT_FALSE(early.IsReady());
  EXPECT_EQ(CountQueued(kRRefFetch), 0);
  ASSERT_TRUE(net_.Deliver(reply).ok());
  ASSERT_TRUE(early.Get(kWait).ok()) << early.Get(kWait).status();
  EXPECT_EQ(*early.Get(kWait), 42);
  EXPECT_EQ(ctx_["a"]->messages_sent()[kRRefFetch], 0);
  Future<int64_t> late = r.to_here_async(kWait);
  RoundTrip(kRRefFetch, "a", "b");
  ASSERT_TRUE(late.Get(kWait).ok()) << late.Get(kWait).status();
  EXPECT_EQ(*late.Get(kWait), 42);
  r = RRef<int64_t>();
  Settle();
  EXPECT_EQ(ctx_["b"]->num_owned(), 0u);
}

// Owners that never put the value in the creation reply.
class NoInlineProtocolTest : public ProtocolTest {
 protected:
  NoInlineProtocolTest() : ProtocolTest(/*inline_value_bytes=*/0) {}
};

// A creation reply without the value (the owner does not inline) makes the
// early to_here() fall back to RREF_FETCH.
TEST_F(NoInlineProtocolTest, EarlyToHereFetchesWhenValueNotCarried) {
  RRef<int64_t> r = remote<int64_t>(*ctx_["a"], "b", "add", 1, 2);
  Future<int64_t> f = r.to_here_async(kWait);
  RoundTrip(kRemoteCall, "a", "b");
  EXPECT_FALSE(f.IsReady());
  RoundTrip(kRRefFetch, "a", "b");
  ASSERT_TRUE(f.Get(kWait).ok()) << f.Get(kWait).status();
  EXPECT_EQ(*f.Get(kWait), 3);
  r = RRef<int64_t>();
  Settle();
  EXPECT_EQ(ctx_["b"]->num_owned(), 0u);
}

// The fallback fetch leaves from the creation reply's thread, yet carries
// the context of the caller of to_here() (distributed autograd records the
// fetch through it).
TEST_F(NoInlineProtocolTest, EarlyToHereFetchCarriesTheCallersContext) {
  auto seen = std::make_shared<std::vector<std::string>>();
  net_.agent(1).AddInterceptor([seen](rpc::InterceptPoint point,
                                      const rpc::WorkerInfo&, rpc::Message& m) {
    if (point == rpc::InterceptPoint::kReceiveRequest &&
        m.type == kRRefFetch) {
      auto it = m.context.find("test/tag");
      seen->push_back(it == m.context.end() ? "<none>" : it->second);
    }
    return absl::OkStatus();
  });
  RRef<int64_t> r = remote<int64_t>(*ctx_["a"], "b", "add", 1, 2);
  Future<int64_t> f;
  {
    rpc::ScopedContextEntry tag("test/tag", "early");
    f = r.to_here_async(kWait);
  }
  RoundTrip(kRemoteCall, "a", "b");
  RoundTrip(kRRefFetch, "a", "b");
  ASSERT_TRUE(f.Get(kWait).ok()) << f.Get(kWait).status();
  EXPECT_EQ(*seen, std::vector<std::string>{"early"});
  r = RRef<int64_t>();
  Settle();
  EXPECT_EQ(ctx_["b"]->num_owned(), 0u);
}

// Deletions to one owner go one batch at a time: forks dropped while a
// USER_DELETE is in flight travel together in the next one.
TEST_F(ProtocolTest, UserDeletesAreBatchedPerOwner) {
  std::vector<RRef<int64_t>> refs;
  for (int i = 0; i < 4; ++i) refs.push_back(Confirmed("a", "b"));
  ASSERT_EQ(ctx_["b"]->num_owned(), 4u);
  refs[0] = RRef<int64_t>();
  absl::StatusOr<QueuedMessage> first = net_.AwaitQueued(
      [](const QueuedMessage& q) {
        return q.type == kRRefUserDelete && !q.is_reply;
      },
      kWait);
  ASSERT_TRUE(first.ok()) << first.status();
  refs.clear();  // Three more while the first is in flight.
  EXPECT_EQ(CountQueued(kRRefUserDelete), 1);
  EXPECT_FALSE(ctx_["a"]->AwaitSettled(absl::ZeroDuration()).ok());
  ASSERT_TRUE(net_.Deliver(Serve(first->seq)).ok());
  EXPECT_EQ(ctx_["b"]->num_owned(), 3u);
  RoundTrip(kRRefUserDelete, "a", "b");  // The batch of three.
  EXPECT_EQ(ctx_["b"]->num_owned(), 0u);
  EXPECT_EQ(ctx_["a"]->messages_sent()[kRRefUserDelete], 2);
  Settle();
}

// A malformed USER_DELETE batch is refused, naming the sender; nothing is
// deleted.
TEST_F(ProtocolTest, MalformedDeleteBatchIsRefused) {
  RRef<int64_t> r = Confirmed("a", "b");
  rpc::Message m;
  m.type = kRRefUserDelete;
  SetFields(m, RRefFields{r.rref_id(), GlobalId(), 1, -1, "", {}});
  m.payload = Value::FromList({Value::Int(1), Value::String("x")});
  Future<rpc::Message> f = net_.agent("c").Send("b", std::move(m), kWait);
  RoundTrip(kRRefUserDelete, "c", "b");
  ASSERT_FALSE(f.Get(kWait).ok());
  EXPECT_EQ(f.Get(kWait).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(f.Get(kWait).status().message().find("'c'"), std::string::npos)
      << f.Get(kWait).status();
  EXPECT_EQ(ctx_["b"]->num_owned(), 1u);
  r = RRef<int64_t>();
  Settle();
  EXPECT_EQ(ctx_["b"]->num_owned(), 0u);
}

// Deletions wait (here: for the whole test) for a request to their owner to
// ride on (RRefFields::deletes) instead of going alone.
class PiggybackTest : public ProtocolTest {
 protected:
  PiggybackTest() : ProtocolTest(4096, absl::Hours(1)) {}
  // Forks of RRefs b owns, as b's tables list them.
  size_t ForksOnB() {
    size_t n = 0;
    for (const auto& o : ctx_["b"]->Owned()) n += o.forks.size();
    return n;
  }
};

TEST_F(PiggybackTest, DeletionRidesOnTheNextRequestToItsOwner) {
  RRef<int64_t> kept = Confirmed("a", "b");
  RRef<int64_t> dropped = Confirmed("a", "b");
  dropped = RRef<int64_t>();
  EXPECT_EQ(CountQueued(kRRefUserDelete), 0);
  EXPECT_FALSE(ctx_["a"]->AwaitSettled(absl::ZeroDuration()).ok())
      << "the queued deletion counts until the owner has it";
  RRef<int64_t> next = remote<int64_t>(*ctx_["a"], "b", "add", 3, 4);
  uint64_t reply = Serve(kRemoteCall, "a", "b");
  // Applied on receipt: b holds kept and next only.
  EXPECT_EQ(ctx_["b"]->num_owned(), 2u);
  EXPECT_EQ(ForksOnB(), 2u);
  ASSERT_TRUE(net_.Deliver(reply).ok());
  ASSERT_TRUE(next.creation().Get(kWait).ok());
  EXPECT_EQ(ctx_["a"]->messages_sent()[kRRefUserDelete], 0);
  EXPECT_TRUE(ctx_["a"]->AwaitSettled(kWait).ok());
  // A fetch carries them too.
  kept = RRef<int64_t>();
  Future<int64_t> fetched = next.to_here_async(kWait);
  RoundTrip(kRRefFetch, "a", "b");
  ASSERT_TRUE(fetched.Get(kWait).ok());
  EXPECT_EQ(*fetched.Get(kWait), 7);
  EXPECT_EQ(ctx_["b"]->num_owned(), 1u);
  EXPECT_EQ(ctx_["a"]->messages_sent()[kRRefUserDelete], 0);
}

// A carrier that fails (here dropped, so its caller times out) hands its
// deletions to a USER_DELETE: they are never lost.
TEST_F(PiggybackTest, FailedCarrierResendsItsDeletions) {
  RRef<int64_t> dropped = Confirmed("a", "b");
  dropped = RRef<int64_t>();
  RRef<int64_t> lost = remote_for<int64_t>(*ctx_["a"], absl::Milliseconds(300),
                                           "b", "add", 1, 1);
  absl::StatusOr<QueuedMessage> carrier = net_.AwaitQueued(
      [](const QueuedMessage& q) {
        return !q.is_reply && q.type == kRemoteCall;
      },
      kWait);
  ASSERT_TRUE(carrier.ok()) << carrier.status();
  ASSERT_TRUE(net_.Drop(carrier->seq).ok());
  EXPECT_FALSE(lost.creation().Get(kWait).ok());
  RoundTrip(kRRefUserDelete, "a", "b");
  EXPECT_EQ(ctx_["b"]->num_owned(), 0u);
  EXPECT_EQ(ctx_["a"]->messages_sent()[kRRefUserDelete], 1);
}

// A duplicated carrier deletes nothing twice (I4) and resurrects nothing.
TEST_F(PiggybackTest, DuplicatedCarrierIsHarmless) {
  RRef<int64_t> kept = Confirmed("a", "b");
  RRef<int64_t> dropped = Confirmed("a", "b");
  dropped = RRef<int64_t>();
  RRef<int64_t> next = remote<int64_t>(*ctx_["a"], "b", "add", 3, 4);
  absl::StatusOr<QueuedMessage> carrier = net_.AwaitQueued(
      [](const QueuedMessage& q) {
        return !q.is_reply && q.type == kRemoteCall;
      },
      kWait);
  ASSERT_TRUE(carrier.ok()) << carrier.status();
  absl::StatusOr<uint64_t> copy = net_.Duplicate(carrier->seq);
  ASSERT_TRUE(copy.ok());
  ASSERT_TRUE(net_.Deliver(Serve(carrier->seq)).ok());
  ASSERT_TRUE(next.creation().Get(kWait).ok());
  Serve(*copy);
  net_.DeliverAll();
  EXPECT_EQ(ctx_["b"]->num_owned(), 2u);
  EXPECT_EQ(ForksOnB(), 2u);
}

// Deletions ride in the RRef header of the layer's own requests
// (REMOTE_CALL, RREF_FETCH, RREF_METHOD) and are their sender's own; the
// owner refuses a malformed header there naming the sender and applies
// nothing from it. On any other type (a plain CALL, which an
// unauthenticated connection may send) the header deletes nothing.
TEST_F(PiggybackTest, OnlyCarriersDeleteAndMalformedHeadersAreRefused) {
  RRef<int64_t> r = Confirmed("a", "b");
  RRef<int64_t> kept = Confirmed("a", "b");
  auto send = [&](MessageType type,
                  const std::function<void(rpc::Message&)>& edit) {
    rpc::Message m;
    m.type = type;
    m.function = "add";
    m.payload = Value::FromList({Value::Int(1), Value::Int(2)});
    edit(m);
    Future<rpc::Message> f = net_.agent("c").Send("b", std::move(m), kWait);
    net_.Deliver(Serve(type, "c", "b")).IgnoreError();
    return f.Get(kWait).status();
  };
  ASSERT_EQ(ForksOnB(), 2u);
  RRefFields f;
  f.deletes = {{r.rref_id(), r.fork_id()}};
  // A CALL's header deletes nothing.
  EXPECT_TRUE(send(MessageType::kCall,
                   [&](rpc::Message& m) { SetFields(m, f); })
                  .ok());
  EXPECT_EQ(ForksOnB(), 2u);
  // Field 6 (deletes) cut short, then with an odd count of ids.
  for (const std::string& bytes :
       {std::string("\x32\x05\x01", 3), std::string("\x32\x01\x05", 3)}) {
    absl::Status bad = send(
        kRRefFetch, [&](rpc::Message& m) { m.SetHeader(kRRefHeader, bytes); });
    EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(bad.message().find("'c'"), std::string::npos) << bad;
    EXPECT_NE(bad.message().find("RRef header"), std::string::npos) << bad;
  }
  EXPECT_EQ(ForksOnB(), 2u);
  // A USER_DELETE from "c" of a fork "a" holds deletes nothing: only a
  // fork's holder drops it.
  RRefFields other;
  other.rref_id = r.rref_id();
  other.fork_id = r.fork_id();
  EXPECT_TRUE(send(kRRefUserDelete, [&](rpc::Message& m) {
                SetFields(m, other);
                m.payload = Value::None();
              }).ok());
  EXPECT_EQ(ForksOnB(), 2u);
  // Deletions carried by real carriers: DuplicatedCarrierIsHarmless and the
  // tests above.
}

// The header's fields survive encoding, deletions included.
TEST(RRefHeader, RoundTripsAndIsAbsentUntilSet) {
  rpc::Message m;
  absl::StatusOr<std::optional<RRefFields>> none = FieldsOf(m);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  const RRefFields f{GlobalId(1, 2), GlobalId(3, 4), -1, 7, "T",
                     {{GlobalId(5, 6), GlobalId(7, 8)}}};
  SetFields(m, f);
  absl::StatusOr<std::optional<RRefFields>> back = FieldsOf(m);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_TRUE(back->has_value());
  EXPECT_EQ(**back, f);
  ASSERT_TRUE(ClaimMessages().ok());
  EXPECT_EQ(rpc::MessageTypeName(kRRefFetch), "RREF_FETCH");
  EXPECT_EQ(rpc::LayerOfType(static_cast<uint32_t>(kRRefMethod)), "rref");
}

}  // namespace
}  // namespace ferry::rref
