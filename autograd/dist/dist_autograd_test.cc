#include "ferry/autograd/dist/dist_autograd.h"

#include <map>
#include <optional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ferry/autograd/engine.h"
#include "ferry/common/poll.h"
#include "ferry/common/sync.h"
#include "ferry/autograd/ops.h"
#include "gtest/gtest.h"
#include "ferry/rpc/testing/in_process.h"

namespace ferry::autograd::dist {
namespace {

using rpc::MessageType;
using rpc::testing::InProcessNetwork;
using rpc::testing::QueuedMessage;

constexpr DType kF64 = DType::kFloat64;

Tensor Param(const std::vector<int64_t>& sizes, uint64_t seed) {
  Tensor t = randn(sizes, seed, kF64);
  SetRequiresGrad(t);
  return t;
}

// A fresh leaf with the same values (the single-process reference model).
Tensor Copy(const Tensor& t) {
  Tensor c = Detach(t).clone();
  SetRequiresGrad(c);
  return c;
}

// Gradient checks: the distributed gradient equals the local one.
void ExpectGrad(const GradientMap& grads, const Tensor& leaf,
                const Tensor& expected, const std::string& what) {
  Tensor g = grads.Get(leaf);
  ASSERT_TRUE(g.defined()) << what << ": no gradient";
  ASSERT_TRUE(expected.defined()) << what << ": no reference gradient";
  EXPECT_TRUE(g.allclose(expected, 1e-9, 1e-12))
      << what << "\n got " << g.ToString() << "\n want " << expected.ToString();
}

class DistAutogradTest : public ::testing::Test {
 protected:
  void Start(const std::vector<std::string>& names) {
    rpc::testing::InProcessOptions o;
    o.agent.rpc_timeout = absl::Seconds(30);
    net_ = std::make_unique<InProcessNetwork>(names, o);
    for (int i = 0; i < net_->size(); ++i) {
      auto c = DistAutogradContainer::Install(
          net_->agent(i), {.rpc_timeout = absl::Seconds(30)});
      ASSERT_TRUE(c.ok()) << c.status();
      dist_.push_back(*c);
    }
  }
  rpc::Agent& agent(int i) { return net_->agent(i); }
  DistAutogradContainer& dist(int i) { return *dist_[i]; }
  void ExpectNoContexts() {
    for (int i = 0; i < net_->size(); ++i) {
      if (net_->IsKilled(agent(i).self().name)) continue;
      EXPECT_EQ(dist(i).NumContexts(), 0u) << "worker " << agent(i).self().name;
    }
  }

  std::unique_ptr<InProcessNetwork> net_;
  std::vector<std::shared_ptr<DistAutogradContainer>> dist_;
};

TEST_F(DistAutogradTest, InstallTwiceFails) {
  Start({"a"});
  auto again = DistAutogradContainer::Install(agent(0));
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists);
}

// The current context travels as the autograd header's typed field, never
// as a context string, and is current again in the callee's handler.
TEST_F(DistAutogradTest, ContextTravelsAsATypedHeaderField) {
  Start({"a", "b"});
  ASSERT_TRUE(agent(1)
                  .Register("current",
                            [] {
                              return rpc::CurrentContextValue(kContextKey)
                                  .value_or("none");
                            })
                  .ok());
  struct Seen {
    Mutex mu;
    std::vector<std::pair<bool, std::optional<GlobalId>>> sent
        ABSL_GUARDED_BY(mu);
  };
  auto seen = std::make_shared<Seen>();
  // Added after the container's interceptor: sees what goes on the wire.
  agent(0).AddInterceptor([seen](rpc::InterceptPoint p,
                                 const rpc::WorkerInfo&, rpc::Message& m) {
    if (p != rpc::InterceptPoint::kSendRequest) return absl::OkStatus();
    absl::StatusOr<AutogradHeader> h = AutogradHeaderOf(m);
    EXPECT_TRUE(h.ok()) << h.status();
    MutexLock l(&seen->mu);
    seen->sent.emplace_back(m.context.count(kContextKey) > 0,
                            h.ok() ? h->context : std::nullopt);
    return absl::OkStatus();
  });
  EXPECT_EQ(*agent(0).rpc_sync<std::string>("b", "current"), "none");
  GlobalId id;
  {
    ContextScope ctx(dist(0));
    id = ctx.id();
    absl::StatusOr<std::string> current =
        agent(0).rpc_sync<std::string>("b", "current");
    ASSERT_TRUE(current.ok()) << current.status();
    EXPECT_EQ(*current, std::to_string(id.value()));
  }
  MutexLock l(&seen->mu);
  ASSERT_GE(seen->sent.size(), 2u);
  EXPECT_EQ(seen->sent[0], std::make_pair(false, std::optional<GlobalId>()));
  EXPECT_EQ(seen->sent[1], std::make_pair(false, std::optional<GlobalId>(id)));
}

TEST_F(DistAutogradTest, ContextIdsCarryWorkerIdAndAreUnique) {
  Start({"a", "b"});
  absl::StatusOr<GlobalId> a1 = dist(0).NewContext();
  absl::StatusOr<GlobalId> a2 = dist(0).NewContext();
  absl::StatusOr<GlobalId> b1 = dist(1).NewContext();
  ASSERT_TRUE(a1.ok() && a2.ok() && b1.ok());
  EXPECT_NE(*a1, *a2);
  EXPECT_EQ(a1->worker_id(), 0);
  EXPECT_EQ(b1->worker_id(), 1);
  EXPECT_EQ(dist(0).NumContexts(), 2u);
  EXPECT_TRUE(dist(0).Release(*a1).Get().ok());
  EXPECT_TRUE(dist(0).Release(*a2).Get().ok());
  EXPECT_TRUE(dist(1).Release(*b1).Get().ok());
  ExpectNoContexts();
}

// A -> B -> C: h = tanh(x Wa) on a; b computes s = sigmoid(h Wb) and asks c
// for s Wc; b returns tanh of that; a's loss uses the result and h again
// (so a's TanhBackward waits for both the local path and b's gradient).
class ChainTest : public DistAutogradTest {
 protected:
  void SetUp() override {
    Start({"a", "b", "c"});
    x_ = Param({5, 3}, 1);
    wa_ = Param({3, 4}, 2);
    wb_ = Param({4, 4}, 3);
    wc_ = Param({4, 2}, 4);
    ASSERT_TRUE(
        agent(2)
            .Register("layer_c", [this](Tensor s) { return matmul(s, wc_); })
            .ok());
    ASSERT_TRUE(agent(1)
                    .Register("layer_b",
                              [this](Tensor h) -> absl::StatusOr<Tensor> {
                                Tensor s = sigmoid(matmul(h, wb_));
                                absl::StatusOr<Tensor> r =
                                    agent(1).rpc_sync<Tensor>("c", "layer_c",
                                                              s);
                                if (!r.ok()) return r.status();
                                return tanh(*r);
                              })
                    .ok());
  }

  // The same model in one process.
  Tensor LocalLoss(const Tensor& x, const Tensor& wa, const Tensor& wb,
                   const Tensor& wc) {
    Tensor h = tanh(matmul(x, wa));
    Tensor y = tanh(matmul(sigmoid(matmul(h, wb)), wc));
    return add(sum(mul(y, y)), sum(h));
  }

  absl::StatusOr<Tensor> DistLoss() {
    Tensor h = tanh(matmul(x_, wa_));
    absl::StatusOr<Tensor> y = agent(0).rpc_sync<Tensor>("b", "layer_b", h);
    if (!y.ok()) return y.status();
    return add(sum(mul(*y, *y)), sum(h));
  }

  Tensor x_, wa_, wb_, wc_;
};

TEST_F(ChainTest, GradientsEqualSingleProcess) {
  Tensor x = Copy(x_), wa = Copy(wa_), wb = Copy(wb_), wc = Copy(wc_);
  Tensor ref_loss = LocalLoss(x, wa, wb, wc);
  ASSERT_TRUE(Backward({ref_loss}).ok());

  std::weak_ptr<DistAutogradContext> on_c;
  {
    ContextScope ctx(dist(0));
    absl::StatusOr<Tensor> loss = DistLoss();
    ASSERT_TRUE(loss.ok()) << loss.status();
    EXPECT_TRUE(loss->allclose(ref_loss, 1e-12));
    absl::Status s = dist(0).Backward(ctx.id(), {*loss});
    ASSERT_TRUE(s.ok()) << s;

    absl::StatusOr<GradientMap> ga = dist(0).GetGradients(ctx.id());
    absl::StatusOr<GradientMap> gb = dist(1).GetGradients(ctx.id());
    absl::StatusOr<GradientMap> gc = dist(2).GetGradients(ctx.id());
    ASSERT_TRUE(ga.ok() && gb.ok() && gc.ok());
    ExpectGrad(*ga, x_, GradOf(x), "x on a");
    ExpectGrad(*ga, wa_, GradOf(wa), "wa on a");
    ExpectGrad(*gb, wb_, GradOf(wb), "wb on b");
    ExpectGrad(*gc, wc_, GradOf(wc), "wc on c");
    EXPECT_EQ(ga->size(), 2u);
    EXPECT_EQ(gb->size(), 1u);
    EXPECT_EQ(gc->size(), 1u);
    // Gradients live in the context, not in .grad.
    EXPECT_FALSE(GradOf(wa_).defined());
    EXPECT_FALSE(GradOf(wb_).defined());
    // Every worker the forward reached knows the context.
    EXPECT_EQ(dist(1).NumContexts(), 1u);
    EXPECT_EQ(dist(2).NumContexts(), 1u);
    on_c = dist(2).Find(ctx.id());
    EXPECT_EQ(on_c.lock()->num_recv_nodes(), 1u);
    EXPECT_EQ(on_c.lock()->num_send_nodes(), 1u);
  }
  ExpectNoContexts();
  EXPECT_TRUE(on_c.expired()) << "c's context outlived its release";
}

TEST_F(ChainTest, RetainGraphAllowsASecondPassThatAccumulates) {
  Tensor x = Copy(x_), wa = Copy(wa_), wb = Copy(wb_), wc = Copy(wc_);
  ASSERT_TRUE(Backward({LocalLoss(x, wa, wb, wc)}).ok());
  ContextScope ctx(dist(0));
  absl::StatusOr<Tensor> loss = DistLoss();
  ASSERT_TRUE(loss.ok()) << loss.status();
  ASSERT_TRUE(dist(0).Backward(ctx.id(), {*loss}, /*retain_graph=*/true).ok());
  absl::Status second = dist(0).Backward(ctx.id(), {*loss});
  ASSERT_TRUE(second.ok()) << second;
  ExpectGrad(*dist(2).GetGradients(ctx.id()), wc_, mul(GradOf(wc), 2.0), "wc");
  ExpectGrad(*dist(0).GetGradients(ctx.id()), x_, mul(GradOf(x), 2.0), "x");
  // The graph is freed now: a third pass fails, naming the op and worker.
  absl::Status third = dist(0).Backward(ctx.id(), {*loss});
  EXPECT_FALSE(third.ok());
  EXPECT_NE(third.message().find("worker '"), std::string::npos) << third;
}

TEST_F(ChainTest, LocalBackwardThroughReceivedTensorFails) {
  ContextScope ctx(dist(0));
  absl::StatusOr<Tensor> loss = DistLoss();
  ASSERT_TRUE(loss.ok());
  absl::Status s = Backward({*loss});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("RecvRpcBackward"), std::string::npos) << s;
}

TEST_F(ChainTest, ArgumentsRequireGradOnTheCalleeOnlyInsideAContext) {
  ASSERT_TRUE(
      agent(1)
          .Register("requires_grad", [](Tensor t) { return RequiresGrad(t); })
          .ok());
  absl::StatusOr<bool> outside =
      agent(0).rpc_sync<bool>("b", "requires_grad", wa_);
  ASSERT_TRUE(outside.ok()) << outside.status();
  EXPECT_FALSE(*outside);
  ExpectNoContexts();
  {
    ContextScope ctx(dist(0));
    absl::StatusOr<bool> inside =
        agent(0).rpc_sync<bool>("b", "requires_grad", wa_);
    ASSERT_TRUE(inside.ok()) << inside.status();
    EXPECT_TRUE(*inside);
    absl::StatusOr<bool> no_grad =
        agent(0).rpc_sync<bool>("b", "requires_grad", Detach(wa_));
    ASSERT_TRUE(no_grad.ok());
    EXPECT_FALSE(*no_grad);
    EXPECT_EQ(dist(0).Find(ctx.id())->num_send_nodes(), 1u);
    EXPECT_EQ(dist(1).Find(ctx.id())->num_recv_nodes(), 1u);
  }
  ExpectNoContexts();
}

// A call that comes back to its caller: a -> b -> a -> b returns -> a.
TEST_F(DistAutogradTest, CallThatComesBackToTheCaller) {
  Start({"a", "b"});
  Tensor x = Param({2, 3}, 11), wa = Param({2, 3}, 12), wb = Param({2, 3}, 13);
  ASSERT_TRUE(agent(0)
                  .Register("on_a", [&](Tensor u) { return tanh(mul(u, wa)); })
                  .ok());
  ASSERT_TRUE(agent(1)
                  .Register("on_b",
                            [&](Tensor t) -> absl::StatusOr<Tensor> {
                              absl::StatusOr<Tensor> v =
                                  agent(1).rpc_sync<Tensor>("a", "on_a",
                                                            mul(t, wb));
                              if (!v.ok()) return v.status();
                              return add(*v, t);
                            })
                  .ok());
  Tensor rx = Copy(x), rwa = Copy(wa), rwb = Copy(wb);
  Tensor rt = sigmoid(rx);
  Tensor ref = sum(mul(add(tanh(mul(mul(rt, rwb), rwa)), rt), rx));
  ASSERT_TRUE(Backward({ref}).ok());
  {
    ContextScope ctx(dist(0));
    Tensor t = sigmoid(x);
    absl::StatusOr<Tensor> y = agent(0).rpc_sync<Tensor>("b", "on_b", t);
    ASSERT_TRUE(y.ok()) << y.status();
    Tensor loss = sum(mul(*y, x));
    EXPECT_TRUE(loss.allclose(ref, 1e-12));
    absl::Status s = dist(0).Backward(ctx.id(), {loss});
    ASSERT_TRUE(s.ok()) << s;
    GradientMap ga = *dist(0).GetGradients(ctx.id());
    ExpectGrad(ga, x, GradOf(rx), "x on a");
    ExpectGrad(ga, wa, GradOf(rwa), "wa on a (through b's call back)");
    ExpectGrad(*dist(1).GetGradients(ctx.id()), wb, GradOf(rwb), "wb on b");
  }
  ExpectNoContexts();
}

// b keeps one intermediate and returns it in two calls: b's TanhBackward is
// reached from two send nodes and must run once with the summed gradient
// (retain_graph=false would fail a second run). The two gradients are
// delivered to b in reverse order, the first answered before the second
// arrives.
TEST_F(DistAutogradTest, SharedCalleeNodeWaitsForEveryGradientInAnyOrder) {
  Start({"a", "b"});
  Tensor x = Param({3, 2}, 21), wb = Param({2, 2}, 22);
  Tensor stash;
  ASSERT_TRUE(agent(1)
                  .Register("stash",
                            [&](Tensor in) {
                              stash = tanh(matmul(in, wb));
                              return stash;
                            })
                  .ok());
  ASSERT_TRUE(
      agent(1).Register("again", [&]() { return mul(stash, 3.0); }).ok());
  Tensor rx = Copy(x), rwb = Copy(wb);
  Tensor rh = tanh(matmul(rx, rwb));
  ASSERT_TRUE(Backward({sum(mul(rh, mul(rh, 3.0)))}).ok());

  ContextScope ctx(dist(0));
  absl::StatusOr<Tensor> h1 = agent(0).rpc_sync<Tensor>("b", "stash", x);
  absl::StatusOr<Tensor> h2 = agent(0).rpc_sync<Tensor>("b", "again");
  ASSERT_TRUE(h1.ok() && h2.ok());
  Tensor loss = sum(mul(*h1, *h2));

  net_->SetAutoDeliver(false);
  absl::Status result = absl::UnknownError("not run");
  std::thread backward([&] { result = dist(0).Backward(ctx.id(), {loss}); });
  auto to_b = [](const QueuedMessage& q) {
    return !q.is_reply && q.to == "b" && q.type == kBackward;
  };
  absl::StatusOr<QueuedMessage> first =
      net_->AwaitQueued(to_b, absl::Seconds(20));
  ASSERT_TRUE(first.ok()) << first.status();
  const uint64_t first_seq = first->seq;
  absl::StatusOr<QueuedMessage> second = net_->AwaitQueued(
      [&](const QueuedMessage& q) { return to_b(q) && q.seq != first_seq; },
      absl::Seconds(20));
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_TRUE(net_->Deliver(second->seq).ok());
  absl::StatusOr<QueuedMessage> reply =
      net_->AwaitQueued(rpc::testing::RepliesTo("a"), absl::Seconds(20));
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_TRUE(reply->error.ok()) << reply->error;
  // The shared node has not run yet: no gradient for wb on b.
  EXPECT_EQ(dist(1).GetGradients(ctx.id())->size(), 0u);
  ASSERT_TRUE(net_->Deliver(reply->seq).ok());
  ASSERT_TRUE(net_->Deliver(first_seq).ok());
  net_->SetAutoDeliver(true);
  net_->DeliverAll();
  backward.join();
  ASSERT_TRUE(result.ok()) << result;
  ExpectGrad(*dist(1).GetGradients(ctx.id()), wb, GradOf(rwb), "wb on b");
  ExpectGrad(*dist(0).GetGradients(ctx.id()), x, GradOf(rx), "x on a");
}

// Threads on two trainers run their own contexts through the same
// parameter on ps at once; each context's gradient matches its own input's.
TEST_F(DistAutogradTest, ConcurrentContextsFromSeveralThreadsAndTrainers) {
  Start({"t0", "t1", "ps"});
  Tensor wb = Param({4, 3}, 31);
  ASSERT_TRUE(
      agent(2)
          .Register("forward", [&](Tensor in) { return tanh(matmul(in, wb)); })
          .ok());
  constexpr int kThreads = 4;
  constexpr int kRounds = 5;
  std::vector<Tensor> inputs, expected;
  for (int t = 0; t < kThreads; ++t) {
    inputs.push_back(randn({2, 4}, 100 + t, kF64));
    Tensor rwb = Copy(wb);
    ASSERT_TRUE(Backward({sum(tanh(matmul(inputs[t], rwb)))}).ok());
    expected.push_back(GradOf(rwb));
  }
  std::vector<std::vector<Tensor>> got(kThreads);
  std::vector<absl::Status> errors(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const int trainer = t % 2;
      for (int r = 0; r < kRounds && errors[t].ok(); ++r) {
        ContextScope ctx(dist(trainer));
        absl::StatusOr<Tensor> y =
            agent(trainer).rpc_sync<Tensor>("ps", "forward", inputs[t]);
        if (!y.ok()) {
          errors[t] = y.status();
          break;
        }
        errors[t] = dist(trainer).Backward(ctx.id(), {sum(*y)});
        absl::StatusOr<GradientMap> g = dist(2).GetGradients(ctx.id());
        if (errors[t].ok() && g.ok()) got[t].push_back(g->Get(wb));
        errors[t].Update(g.status());
        errors[t].Update(ctx.Release());
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    ASSERT_TRUE(errors[t].ok()) << "thread " << t << ": " << errors[t];
    ASSERT_EQ(got[t].size(), static_cast<size_t>(kRounds));
    for (const Tensor& g : got[t]) {
      ASSERT_TRUE(g.defined());
      EXPECT_TRUE(g.allclose(expected[t], 1e-9, 1e-12)) << "thread " << t;
    }
  }
  ExpectNoContexts();
}

// A custom op (a Node defined outside autograd/) whose backward fails.
Tensor FailingOp(const Tensor& in) {
  Tensor out = Detach(in).clone();
  auto node = std::make_shared<FunctionNode>(
      "InjectedFailureBackward", std::vector<SavedTensor>{},
      [](const Tensor&, const std::vector<Tensor>&,
         const std::vector<bool>&) -> absl::StatusOr<std::vector<Tensor>> {
        return absl::InternalError("injected failure");
      });
  node->set_next_edges({GradientEdge(in)});
  auto meta = std::make_shared<AutogradMeta>();
  meta->grad_fn = node;
  out.set_autograd_meta(meta);
  return out;
}

TEST_F(DistAutogradTest, RemoteBackwardErrorReachesTheInitiator) {
  Start({"a", "b", "c"});
  Tensor wc = Param({2, 2}, 41);
  ASSERT_TRUE(
      agent(2)
          .Register("bad", [&](Tensor in) { return FailingOp(matmul(in, wc)); })
          .ok());
  ASSERT_TRUE(agent(1)
                  .Register("relay",
                            [&](Tensor in) {
                              return agent(1).rpc_sync<Tensor>("c", "bad",
                                                               tanh(in));
                            })
                  .ok());
  {
    ContextScope ctx(dist(0));
    Tensor x = Param({2, 2}, 42);
    absl::StatusOr<Tensor> y = agent(0).rpc_sync<Tensor>("b", "relay", x);
    ASSERT_TRUE(y.ok()) << y.status();
    absl::Status s = dist(0).Backward(ctx.id(), {sum(*y)});
    EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
    EXPECT_NE(s.message().find("worker 'c'"), std::string::npos) << s;
    EXPECT_NE(s.message().find("InjectedFailureBackward"), std::string::npos)
        << s;
    EXPECT_NE(s.message().find("injected failure"), std::string::npos) << s;
    EXPECT_NE(s.message().find(ctx.id().ToString()), std::string::npos) << s;
    // Nothing reached wc or x.
    EXPECT_EQ(dist(2).GetGradients(ctx.id())->size(), 0u);
    EXPECT_EQ(dist(0).GetGradients(ctx.id())->size(), 0u);
  }
  ExpectNoContexts();
}

// c dies while b's gradients to it are in flight: a's pass fails naming c
// well within the timeout, and releasing still clears the live workers.
TEST_F(DistAutogradTest, WorkerKilledDuringBackwardFailsThePass) {
  Start({"a", "b", "c"});
  Tensor wb = Param({2, 2}, 51), wc = Param({2, 2}, 52);
  ASSERT_TRUE(
      agent(2).Register("c_fn", [&](Tensor in) { return mul(in, wc); }).ok());
  ASSERT_TRUE(agent(1)
                  .Register("b_fn",
                            [&](Tensor in) {
                              return agent(1).rpc_sync<Tensor>("c", "c_fn",
                                                               mul(in, wb));
                            })
                  .ok());
  ContextScope ctx(dist(0));
  Tensor x = Param({2, 2}, 53);
  absl::StatusOr<Tensor> y = agent(0).rpc_sync<Tensor>("b", "b_fn", x);
  ASSERT_TRUE(y.ok()) << y.status();
  Tensor loss = sum(*y);

  net_->SetAutoDeliver(false);
  absl::Status result = absl::UnknownError("not run");
  const absl::Time start = absl::Now();
  std::thread backward([&] { result = dist(0).Backward(ctx.id(), {loss}); });
  auto backward_to = [](std::string to) {
    return [to](const QueuedMessage& q) {
      return !q.is_reply && q.to == to && q.type == kBackward;
    };
  };
  absl::StatusOr<QueuedMessage> to_b =
      net_->AwaitQueued(backward_to("b"), absl::Seconds(20));
  ASSERT_TRUE(to_b.ok()) << to_b.status();
  ASSERT_TRUE(net_->Deliver(to_b->seq).ok());
  absl::StatusOr<QueuedMessage> to_c =
      net_->AwaitQueued(backward_to("c"), absl::Seconds(20));
  ASSERT_TRUE(to_c.ok()) << to_c.status();
  ASSERT_TRUE(net_->Kill("c").ok());
  net_->SetAutoDeliver(true);
  net_->DeliverAll();
  backward.join();
  EXPECT_EQ(result.code(), absl::StatusCode::kUnavailable) << result;
  EXPECT_NE(result.message().find("'c'"), std::string::npos) << result;
  EXPECT_LT(absl::Now() - start, absl::Seconds(15)) << "took the timeout";
  absl::Status released = ctx.Release();
  EXPECT_FALSE(released.ok()) << "release cannot reach the dead worker";
  ExpectNoContexts();
}

// A scope that releases in the background ends before any other worker has
// its release: with delivery stopped, a has dropped the context at once while
// b and c still hold it; delivering the release to b frees it there and b
// forwards it to c (the transitive reach is unchanged).
TEST_F(ChainTest, BackgroundReleaseEndsTheScopeWithoutWaiting) {
  auto cleanup = [](std::string from, std::string to) {
    return [from, to](const QueuedMessage& q) {
      return !q.is_reply && q.from == from && q.to == to &&
             q.type == kCleanupAutogradContext;
    };
  };
  auto reply = [](std::string from, std::string to) {
    return [from, to](const QueuedMessage& q) {
      return q.is_reply && q.from == from && q.to == to &&
             q.type == kCleanupAutogradContext;
    };
  };
  const absl::Time start = absl::Now();
  {
    ContextScope ctx(dist(0), ContextScope::OnExit::kReleaseInBackground);
    absl::StatusOr<Tensor> loss = DistLoss();
    ASSERT_TRUE(loss.ok()) << loss.status();
    ASSERT_TRUE(dist(0).Backward(ctx.id(), {*loss}).ok());
    net_->SetAutoDeliver(false);
  }
  // Waiting for b would take the 30 s rpc_timeout and then fail.
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_EQ(dist(0).NumContexts(), 0u);
  EXPECT_EQ(dist(1).NumContexts(), 1u);
  EXPECT_EQ(dist(2).NumContexts(), 1u);
  absl::StatusOr<QueuedMessage> to_b =
      net_->AwaitQueued(cleanup("a", "b"), absl::Seconds(20));
  ASSERT_TRUE(to_b.ok()) << to_b.status();
  ASSERT_TRUE(net_->Deliver(to_b->seq).ok());
  absl::StatusOr<QueuedMessage> to_c =
      net_->AwaitQueued(cleanup("b", "c"), absl::Seconds(20));
  ASSERT_TRUE(to_c.ok()) << to_c.status();
  EXPECT_EQ(dist(1).NumContexts(), 0u);
  ASSERT_TRUE(net_->Deliver(to_c->seq).ok());
  // c answers once its release ran.
  ASSERT_TRUE(net_->AwaitQueued(reply("c", "b"), absl::Seconds(20)).ok());
  net_->SetAutoDeliver(true);
  net_->DeliverAll();
  ExpectNoContexts();
}

// After release, calls made on the scope's thread carry no context, and a
// released id cannot come back to life on a callee.
TEST_F(ChainTest, ReleasedContextIsNotRevivedByLaterCalls) {
  ContextScope ctx(dist(0));
  absl::StatusOr<Tensor> y = DistLoss();
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_EQ(dist(2).NumContexts(), 1u);
  ASSERT_TRUE(ctx.Release().ok());
  ExpectNoContexts();
  absl::StatusOr<Tensor> again = DistLoss();
  ASSERT_TRUE(again.ok()) << again.status();
  ExpectNoContexts();
  // Even a thread that still names the released id does not revive it.
  rpc::ScopedContextEntry stale(kContextKey, std::to_string(ctx.id().value()));
  ASSERT_TRUE(DistLoss().ok());
  ExpectNoContexts();
}

// Malformed or misdirected backward messages are refused with errors naming
// the worker and context, and leave the pass state untouched.
TEST_F(DistAutogradTest, BackwardMessagesAreValidated) {
  Start({"a", "b"});
  ASSERT_TRUE(agent(1).Register("echo", [](Tensor t) { return t; }).ok());
  ContextScope ctx(dist(0));
  Tensor x = Param({2, 2}, 91);
  absl::StatusOr<Tensor> y = agent(0).rpc_sync<Tensor>("b", "echo", x);
  ASSERT_TRUE(y.ok()) << y.status();
  // y's grad_fn is a's RecvNode, paired with b's SendNode for the reply.
  auto recv = std::dynamic_pointer_cast<RecvNode>(GradFn(*y));
  ASSERT_NE(recv, nullptr);
  EXPECT_EQ(recv->peer_name(), "b");

  auto send_backward = [&](GlobalId context, GlobalId message, Tensor grad) {
    rpc::Message m;
    m.type = kBackward;
    SetAutogradFields(m, AutogradFields{context, message, false, {}});
    m.payload = Value::FromList(
        {Value::Int(77), Value::FromList({Value::FromTensor(grad)})});
    return agent(0).Send("b", m).Get(absl::Seconds(20)).status();
  };
  absl::Status wrong_shape =
      send_backward(ctx.id(), recv->message_id(), ones({3}, kF64));
  EXPECT_EQ(wrong_shape.code(), absl::StatusCode::kInvalidArgument)
      << wrong_shape;
  EXPECT_NE(wrong_shape.message().find("worker 'b'"), std::string::npos);
  absl::Status wrong_dtype =
      send_backward(ctx.id(), recv->message_id(), ones({2, 2}));
  EXPECT_EQ(wrong_dtype.code(), absl::StatusCode::kInvalidArgument)
      << wrong_dtype;
  absl::Status unknown_message =
      send_backward(ctx.id(), GlobalId(1, 999), ones({2, 2}, kF64));
  EXPECT_EQ(unknown_message.code(), absl::StatusCode::kNotFound)
      << unknown_message;
  absl::Status unknown_context =
      send_backward(GlobalId(0, 999), recv->message_id(), ones({2, 2}, kF64));
  EXPECT_EQ(unknown_context.code(), absl::StatusCode::kNotFound)
      << unknown_context;
  EXPECT_EQ(dist(1).NumContexts(), 1u) << "a refused message created one";

  // The real pass is unaffected.
  absl::Status s = dist(0).Backward(ctx.id(), {sum(mul(*y, *y))});
  ASSERT_TRUE(s.ok()) << s;
  Tensor g = dist(0).GetGradients(ctx.id())->Get(x);
  ASSERT_TRUE(g.defined());
  EXPECT_TRUE(g.allclose(mul(x, 2.0), 1e-12));
}

// Rewrites the autograd header of the next requests `from` sends (added
// after the container's interceptor, so it has the last word on the wire).
class HeaderTamperer {
 public:
  explicit HeaderTamperer(rpc::Agent& from) {
    from.AddInterceptor([state = state_](rpc::InterceptPoint p,
                                         const rpc::WorkerInfo&,
                                         rpc::Message& m) {
      if (p != rpc::InterceptPoint::kSendRequest) return absl::OkStatus();
      MutexLock l(&state->mu);
      if (state->bytes.has_value()) {
        m.SetHeader(kAutogradHeader, *state->bytes);
      }
      return absl::OkStatus();
    });
  }
  // The header bytes of later requests; nullopt: leave them alone.
  void Set(std::optional<std::string> bytes) {
    MutexLock l(&state_->mu);
    state_->bytes = std::move(bytes);
  }
  void Set(const AutogradHeader& h) {
    rpc::Message m;
    SetAutogradHeader(m, h);
    Set(*m.FindHeader(kAutogradHeader));
  }

 private:
  struct State {
    Mutex mu;
    std::optional<std::string> bytes ABSL_GUARDED_BY(mu);
  };
  std::shared_ptr<State> state_ = std::make_shared<State>();
};

// A request whose autograd header is malformed is refused with
// InvalidArgument naming both workers; the callee serves on.
TEST_F(DistAutogradTest, MalformedHeadersAreRefusedAndTheCalleeServesOn) {
  Start({"a", "b"});
  ASSERT_TRUE(agent(1).Register("twice", [](Tensor t) {
    return mul(t, 2.0);
  }).ok());
  HeaderTamperer tamper(agent(0));
  AutogradHeader unordered;
  unordered.fields = AutogradFields{GlobalId(0, 1), GlobalId(0, 2), false,
                                    {1, 0}};
  AutogradHeader no_ids;
  no_ids.releases = AutogradReleases{0, 1, {}};
  std::vector<std::pair<std::string, std::string>> cases;
  cases.emplace_back("garbage", std::string("\xff\xff\xff", 3));
  for (const AutogradHeader* h : {&unordered, &no_ids}) {
    rpc::Message m;
    SetAutogradHeader(m, *h);
    cases.emplace_back(h == &unordered ? "unordered" : "no ids",
                       *m.FindHeader(kAutogradHeader));
  }
  for (const auto& [what, bytes] : cases) {
    tamper.Set(bytes);
    ContextScope ctx(dist(0));
    absl::StatusOr<Tensor> y =
        agent(0).rpc_sync<Tensor>("b", "twice", Param({2}, 5));
    ASSERT_EQ(y.status().code(), absl::StatusCode::kInvalidArgument)
        << what << ": " << y.status();
    EXPECT_NE(y.status().message().find("malformed autograd header"),
              std::string::npos) << what << ": " << y.status();
    EXPECT_NE(y.status().message().find("worker 'b'"), std::string::npos)
        << what << ": " << y.status();
    EXPECT_NE(y.status().message().find("from 'a'"), std::string::npos)
        << what << ": " << y.status();
  }
  tamper.Set(std::nullopt);
  {
    ContextScope ctx(dist(0));
    absl::StatusOr<Tensor> y =
        agent(0).rpc_sync<Tensor>("b", "twice", Param({2}, 5));
    ASSERT_TRUE(y.ok()) << y.status();
    EXPECT_TRUE(RequiresGrad(*y));
  }
  ExpectNoContexts();
}

// A carried release is acted on only when its sender is the worker that
// sent it and its receiver is this worker: "c" cannot release, by naming
// "a" as the sender, a context "a" holds on "b".
TEST_F(DistAutogradTest, CarriedReleasesNeedTheirSenderAndReceiver) {
  Start({"a", "b", "c"});
  ASSERT_TRUE(agent(1).Register("twice", [](Tensor t) {
    return mul(t, 2.0);
  }).ok());
  ASSERT_TRUE(agent(1).Register("noop", [] {}).ok());
  ContextScope ctx(dist(0));
  ASSERT_TRUE(agent(0).rpc_sync<Tensor>("b", "twice", Param({2}, 7)).ok());
  ASSERT_EQ(dist(1).NumContexts(), 1u);
  HeaderTamperer tamper(agent(2));
  const int a = agent(0).self().id, b = agent(1).self().id,
            c = agent(2).self().id;
  AutogradHeader h;
  for (auto [sender, receiver] : {std::pair{a, b}, std::pair{c, a},
                                  std::pair{b, b}}) {
    h.releases = AutogradReleases{sender, receiver, {ctx.id()}};
    tamper.Set(h);
    ASSERT_TRUE(agent(2).rpc_sync<void>("b", "noop").ok());
    EXPECT_EQ(dist(1).NumContexts(), 1u)
        << "released by a list from " << sender << " to " << receiver
        << " that came from " << c;
  }
  // Addressed right, the same list is honoured (before the request's own
  // work: the check can pass).
  h.releases = AutogradReleases{c, b, {ctx.id()}};
  tamper.Set(h);
  ASSERT_TRUE(agent(2).rpc_sync<void>("b", "noop").ok());
  EXPECT_EQ(dist(1).NumContexts(), 0u);
}

// A request made in a context is overtaken by the context's release: the
// callee serves it outside any context and does not revive the context.
TEST_F(DistAutogradTest, RequestOvertakenByItsReleaseDoesNotReviveIt) {
  Start({"a", "b"});
  ASSERT_TRUE(
      agent(1)
          .Register("requires_grad", [](Tensor t) { return RequiresGrad(t); })
          .ok());
  net_->SetAutoDeliver(false);
  Tensor x = Param({2}, 95);
  Future<bool> call;
  absl::Status released;
  {
    ContextScope ctx(dist(0));
    call = agent(0).rpc_async<bool>("b", "requires_grad", x);
    absl::StatusOr<QueuedMessage> request =
        net_->AwaitQueued(rpc::testing::Matching("a", "b"), absl::Seconds(20));
    ASSERT_TRUE(request.ok()) << request.status();
    // The container's release is asynchronous: no thread needed.
    Future<void> release = dist(0).Release(ctx.id());
    auto is_cleanup = [](const QueuedMessage& q) {
      return q.type == kCleanupAutogradContext && !q.is_reply;
    };
    absl::StatusOr<QueuedMessage> cleanup =
        net_->AwaitQueued(is_cleanup, absl::Seconds(20));
    ASSERT_TRUE(cleanup.ok()) << cleanup.status();
    ASSERT_TRUE(net_->Deliver(cleanup->seq).ok());  // Release first...
    absl::StatusOr<QueuedMessage> done =
        net_->AwaitQueued(rpc::testing::RepliesTo("a"), absl::Seconds(20));
    ASSERT_TRUE(done.ok()) << done.status();
    ASSERT_TRUE(net_->Deliver(done->seq).ok());
    released = release.Get(absl::Seconds(20));
    ASSERT_TRUE(net_->Deliver(request->seq).ok());  // ...then the request.
    net_->SetAutoDeliver(true);
    net_->DeliverAll();
  }
  EXPECT_TRUE(released.ok()) << released;
  absl::StatusOr<bool> requires_grad = call.Get(absl::Seconds(20));
  ASSERT_TRUE(requires_grad.ok()) << requires_grad.status();
  EXPECT_FALSE(*requires_grad);
  ExpectNoContexts();
}

// Background releases (ReleaseInBackground): "a" runs a context through "b"
// and ends it in the background; "b" counts, before its container sees
// them, every release of the context that reaches it, carried on a request
// (the header's releases) or alone (CLEANUP).
class BackgroundReleaseTest : public ::testing::Test {
 protected:
  void Start(absl::Duration release_delay) {
    net_ = std::make_unique<InProcessNetwork>(std::vector<std::string>{"a", "b"});
    // Added before the container's interceptor, so it sees the entry first.
    net_->agent(1).AddInterceptor([counts = counts_](rpc::InterceptPoint point,
                                                     const rpc::WorkerInfo&,
                                                     rpc::Message& m) {
      if (point != rpc::InterceptPoint::kReceiveRequest) return absl::OkStatus();
      MutexLock l(&counts->mu);
      absl::StatusOr<AutogradHeader> h = AutogradHeaderOf(m);
      if (m.type == kCleanupAutogradContext && h.ok() && h->fields) {
        ++counts->alone[h->fields->context_id.value()];
      }
      if (h.ok() && h->releases) {
        for (GlobalId id : h->releases->context_ids) {
          ++counts->carried[id.value()];
        }
      }
      return absl::OkStatus();
    });
    for (int i = 0; i < 2; ++i) {
      auto c = DistAutogradContainer::Install(
          net_->agent(i), {.rpc_timeout = absl::Seconds(30),
                           .release_delay = release_delay});
      ASSERT_TRUE(c.ok()) << c.status();
      dist_.push_back(*c);
    }
    ASSERT_TRUE(net_->agent(1).Register("twice", [](Tensor t) {
      return mul(t, 2.0);
    }).ok());
    ASSERT_TRUE(net_->agent(1).Register("noop", [] {}).ok());
  }
  // A context that reached "b", ended in the background; returns its id.
  GlobalId RunContext() {
    ContextScope ctx(*dist_[0], ContextScope::OnExit::kReleaseInBackground);
    auto y = net_->agent(0).rpc_sync<Tensor>("b", "twice", Param({2}, 3));
    EXPECT_TRUE(y.ok()) << y.status();
    EXPECT_EQ(dist_[1]->NumContexts(), 1u);
    return ctx.id();
  }
  std::pair<int, int> Counts(GlobalId id) {
    MutexLock l(&counts_->mu);
    return {counts_->carried[id.value()], counts_->alone[id.value()]};
  }

  struct Counts_ {
    Mutex mu;
    std::map<uint64_t, int> carried ABSL_GUARDED_BY(mu);
    std::map<uint64_t, int> alone ABSL_GUARDED_BY(mu);
  };
  std::shared_ptr<Counts_> counts_ = std::make_shared<Counts_>();
  std::unique_ptr<InProcessNetwork> net_;
  std::vector<std::shared_ptr<DistAutogradContainer>> dist_;
};

// The next request to "b" carries the release: delivered once, no CLEANUP.
TEST_F(BackgroundReleaseTest, RidesOnTheNextRequestExactlyOnce) {
  Start(absl::Hours(1));  // Never alone within the test.
  const GlobalId id = RunContext();
  EXPECT_EQ(dist_[0]->NumContexts(), 0u);
  EXPECT_EQ(dist_[1]->NumContexts(), 1u);
  EXPECT_EQ(dist_[0]->NumPendingReleases(), 1u);
  ASSERT_TRUE(net_->agent(0).rpc_sync<void>("b", "noop").ok());
  EXPECT_EQ(dist_[1]->NumContexts(), 0u);
  EXPECT_EQ(dist_[0]->NumPendingReleases(), 0u);  // Its reply confirmed it.
  // Later requests carry nothing more.
  ASSERT_TRUE(net_->agent(0).rpc_sync<void>("b", "noop").ok());
  ASSERT_TRUE(dist_[0]->FlushReleases(absl::Seconds(10)).ok());
  EXPECT_EQ(Counts(id), std::make_pair(1, 0));
}

// Nothing goes to "b": the release goes alone after the delay, once.
TEST_F(BackgroundReleaseTest, GoesAloneAfterTheDelayExactlyOnce) {
  Start(absl::Milliseconds(1));
  const GlobalId id = RunContext();
  ASSERT_TRUE(PollUntil(
      [&] {
        return dist_[1]->NumContexts() == 0 &&
               dist_[0]->NumPendingReleases() == 0;
      },
      absl::Seconds(20)));
  ASSERT_TRUE(net_->agent(0).rpc_sync<void>("b", "noop").ok());
  EXPECT_EQ(Counts(id), std::make_pair(0, 1));
}

// FlushReleases (shutdown) sends what is queued alone, once, and waits.
TEST_F(BackgroundReleaseTest, FlushOnShutdownDeliversExactlyOnce) {
  Start(absl::Hours(1));
  const GlobalId id = RunContext();
  EXPECT_EQ(dist_[1]->NumContexts(), 1u);
  ASSERT_TRUE(dist_[0]->FlushReleases(absl::Seconds(20)).ok());
  EXPECT_EQ(dist_[0]->NumPendingReleases(), 0u);
  EXPECT_EQ(dist_[1]->NumContexts(), 0u);
  ASSERT_TRUE(net_->agent(0).rpc_sync<void>("b", "noop").ok());
  EXPECT_EQ(Counts(id), std::make_pair(0, 1));
}

// A carrier that is lost (dropped; its call times out) is followed by the
// release alone: never lost.
TEST_F(BackgroundReleaseTest, LostCarrierIsFollowedByTheReleaseAlone) {
  Start(absl::Hours(1));
  const GlobalId id = RunContext();
  net_->Hold([](const QueuedMessage& q) {
    return !q.is_reply && q.function == "noop";
  });
  Future<void> call = net_->agent(0).rpc_async_for<void>(
      absl::Milliseconds(200), "b", "noop");
  absl::StatusOr<QueuedMessage> carrier = net_->AwaitQueued(
      [](const QueuedMessage& q) { return q.function == "noop"; },
      absl::Seconds(20));
  ASSERT_TRUE(carrier.ok()) << carrier.status();
  ASSERT_TRUE(net_->Drop(carrier->seq).ok());
  EXPECT_EQ(call.Get(absl::Seconds(20)).code(),
            absl::StatusCode::kDeadlineExceeded);
  ASSERT_TRUE(PollUntil(
      [&] {
        return dist_[1]->NumContexts() == 0 &&
               dist_[0]->NumPendingReleases() == 0;
      },
      absl::Seconds(20)));
  EXPECT_EQ(Counts(id), std::make_pair(0, 1));
  net_->Hold(nullptr);
}

}  // namespace
}  // namespace ferry::autograd::dist
