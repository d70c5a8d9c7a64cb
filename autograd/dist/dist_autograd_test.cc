#include "autograd/dist/dist_autograd.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "autograd/engine.h"
#include "autograd/ops.h"
#include "gtest/gtest.h"
#include "rpc/testing/in_process.h"

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
      auto c = DistAutogradContainer::Install(net_->agent(i),
                                              {.rpc_timeout = absl::Seconds(30)});
      ASSERT_TRUE(c.ok()) << c.status();
      dist_.push_back(*c);
    }
  }
  rpc::Agent& agent(int i) { return net_->agent(i); }
  DistAutogradContainer& dist(int i) { return *dist_[i]; }
  void ExpectNoContexts() {
    for (int i = 0; i < net_->size(); ++i) {
      if (net_->IsDead(agent(i).self().name)) continue;
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
    ASSERT_TRUE(agent(2)
                    .Register("layer_c",
                              [this](Tensor s) { return matmul(s, wc_); })
                    .ok());
    ASSERT_TRUE(agent(1)
                    .Register("layer_b",
                              [this](Tensor h) -> absl::StatusOr<Tensor> {
                                EXPECT_TRUE(RequiresGrad(h));
                                Tensor s = sigmoid(matmul(h, wb_));
                                absl::StatusOr<Tensor> r =
                                    agent(1).rpc_sync<Tensor>("c", "layer_c", s);
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
  ASSERT_TRUE(agent(1)
                  .Register("requires_grad",
                            [](Tensor t) { return RequiresGrad(t); })
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

}  // namespace
}  // namespace ferry::autograd::dist
