#include "ferry/autograd/engine.h"

#include <map>
#include <thread>

#include "absl/strings/match.h"
#include "ferry/autograd/grad_mode.h"
#include "ferry/autograd/node.h"
#include "ferry/autograd/ops.h"
#include "gtest/gtest.h"

namespace ferry::autograd {
namespace {

Tensor Leaf(std::vector<double> v, std::vector<int64_t> shape = {}) {
  Tensor t = from_vector<double>(v, shape);
  SetRequiresGrad(t);
  return t;
}

std::vector<double> Vals(const Tensor& t) { return t.to_vector<double>(); }

TEST(EngineTest, ChainRuleIntoLeaves) {
  Tensor a = Leaf({2, 3}), b = Leaf({5, 7});
  Tensor y = sum(add(mul(a, b), a));  // dy/da = b + 1, dy/db = a
  ASSERT_TRUE(RequiresGrad(y));
  EXPECT_FALSE(IsLeaf(y));
  ASSERT_TRUE(Backward({y}).ok());
  EXPECT_EQ(Vals(GradOf(a)), (std::vector<double>{6, 8}));
  EXPECT_EQ(Vals(GradOf(b)), (std::vector<double>{2, 3}));
}

TEST(EngineTest, TensorUsedTwiceSumsGradients) {
  Tensor a = Leaf({3});
  Tensor y = mul(a, a);  // 2a
  ASSERT_TRUE(Backward({y}).ok());
  EXPECT_EQ(GradOf(a).item<double>(), 6);
}

TEST(EngineTest, RetainGraphAllowsSecondPassAndAccumulates) {
  Tensor a = Leaf({3});
  Tensor y = mul(a, a);
  ASSERT_TRUE(Backward({y}, {}, /*retain_graph=*/true).ok());
  ASSERT_TRUE(Backward({y}).ok());
  EXPECT_EQ(GradOf(a).item<double>(), 12);
}

TEST(EngineTest, SecondPassOverFreedGraphFails) {
  Tensor a = Leaf({3});
  Tensor y = mul(a, a);
  ASSERT_TRUE(Backward({y}).ok());
  absl::Status s = Backward({y});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(s.message(), "MulBackward")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "freed")) << s;
  EXPECT_EQ(GradOf(a).item<double>(), 6);  // Unchanged by the failure.
}

TEST(EngineTest, NoGradGuardRecordsNothingAndRestores) {
  Tensor a = Leaf({1, 2});
  {
    NoGradGuard g;
    EXPECT_FALSE(GradMode::IsEnabled());
    { NoGradGuard nested; }
    EXPECT_FALSE(GradMode::IsEnabled());
    Tensor y = mul(a, 2.0);
    EXPECT_FALSE(RequiresGrad(y));
    EXPECT_EQ(GradFn(y), nullptr);
  }
  EXPECT_TRUE(GradMode::IsEnabled());
  EXPECT_TRUE(RequiresGrad(mul(a, 2.0)));
}

TEST(EngineTest, DetachSharesElementsWithoutGrad) {
  Tensor a = Leaf({1, 2});
  Tensor y = mul(a, 3.0);
  Tensor d = Detach(y);
  EXPECT_FALSE(RequiresGrad(d));
  EXPECT_TRUE(d.storage().is_same(y.storage()));
  EXPECT_TRUE(RequiresGrad(y));
  EXPECT_FALSE(RequiresGrad(mul(d, 2.0)));
}

TEST(EngineTest, SetRequiresGradFalseStopsGradient) {
  Tensor a = Leaf({1}), b = Leaf({2});
  SetRequiresGrad(b, false);
  Tensor y = mul(a, b);
  ASSERT_TRUE(Backward({y}).ok());
  EXPECT_EQ(GradOf(a).item<double>(), 2);
  EXPECT_FALSE(GradOf(b).defined());
}

TEST(EngineTest, InPlaceChangeOfSavedTensorIsReported) {
  Tensor a = Leaf({1, 2}), b = Leaf({3, 4});
  Tensor y = sum(mul(a, b));
  b.mul_(2.0);  // MulBackward saved b as 'other'.
  absl::Status s = Backward({y});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(s.message(), "MulBackward")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "'other'")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "in-place")) << s;
}

TEST(EngineTest, InPlaceChangeThroughViewIsReported) {
  Tensor a = Leaf({1, 2, 3, 4}, {2, 2});
  Tensor w = exp(a);                // ExpBackward saves its result.
  Detach(w).select(0, 1).fill_(0);  // Writes through another view.
  absl::Status s = Backward({sum(w)});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "ExpBackward")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "'result'")) << s;
}

TEST(EngineTest, NonScalarRootNeedsGradient) {
  Tensor a = Leaf({1, 2});
  Tensor y = mul(a, 2.0);
  EXPECT_EQ(Backward({y}).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(Backward({y}, {from_vector<double>({1, 10})}).ok());
  EXPECT_EQ(Vals(GradOf(a)), (std::vector<double>{2, 20}));
  Tensor plain = ones({2}, DType::kFloat64);
  EXPECT_EQ(Backward({plain}).code(), absl::StatusCode::kInvalidArgument);
}

TEST(EngineTest, GradReturnsGradientsWithoutTouchingDotGrad) {
  Tensor a = Leaf({2}), b = Leaf({3});
  Tensor h = mul(a, b);
  Tensor y = mul(h, h);  // dy/dh = 2h = 12, dy/da = 2h*b = 36
  absl::StatusOr<std::vector<Tensor>> g = Grad({y}, {a, h});
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ((*g)[0].item<double>(), 36);
  EXPECT_EQ((*g)[1].item<double>(), 12);
  EXPECT_FALSE(GradOf(a).defined());
  EXPECT_FALSE(GradOf(b).defined());
}

TEST(EngineTest, HooksFireOncePerPassWithTheGradient) {
  Tensor a = Leaf({2});
  Tensor h = mul(a, 3.0);
  Tensor y = mul(h, h);  // dy/dh = 2h = 12
  int hook_calls = 0, leaf_calls = 0, post_calls = 0;
  double seen = 0, seen_leaf = 0, grad_after = 0;
  RegisterHook(h, [&](const Tensor& g) {
    ++hook_calls;
    seen = g.item<double>();
    return g.mul(2.0);  // Replaces the gradient flowing on.
  });
  RegisterHook(a, [&](const Tensor& g) {
    ++leaf_calls;
    seen_leaf = g.item<double>();
    return Tensor();  // Keeps it.
  });
  RegisterPostAccumulateHook(a, [&](const Tensor& leaf) {
    ++post_calls;
    grad_after = GradOf(leaf).item<double>();
  });
  ASSERT_TRUE(Backward({y}).ok());
  EXPECT_EQ(hook_calls, 1);
  EXPECT_EQ(leaf_calls, 1);
  EXPECT_EQ(post_calls, 1);
  EXPECT_EQ(seen, 12);
  EXPECT_EQ(seen_leaf, 72);  // 2 * 12 * 3
  EXPECT_EQ(grad_after, 72);
  EXPECT_EQ(GradOf(a).item<double>(), 72);
}

// A node defined outside the engine (as distributed autograd's send/recv
// nodes will be): scales the gradient and fails on request.
class ScaleNode : public Node {
 public:
  ScaleNode(double scale, bool fail)
      : Node("ScaleNode", 1), scale_(scale), fail_(fail) {}
  absl::StatusOr<std::vector<Tensor>> Apply(GraphTask&,
                                            std::vector<Tensor> g) override {
    if (fail_) return absl::UnavailableError("peer went away");
    return std::vector<Tensor>{g[0].mul(scale_)};
  }

 private:
  double scale_;
  bool fail_;
};

// Collects leaf gradients per leaf instead of writing .grad.
class MapSink : public GradientSink {
 public:
  absl::Status Deliver(const Tensor& leaf, const Tensor& grad) override {
    got[leaf.data_ptr()] = grad.item<double>();
    return absl::OkStatus();
  }
  std::map<void*, double> got;
};

TEST(EngineTest, GraphTaskFromArbitraryNodeIntoCustomSink) {
  Tensor a = Leaf({2}), b = Leaf({5});
  Tensor y = mul(a, b);
  auto scale = std::make_shared<ScaleNode>(10.0, false);
  scale->set_next_edges({GradientEdge(y)});
  MapSink sink;
  GraphTask task(&sink, /*retain_graph=*/false);
  ASSERT_TRUE(task.Execute({{Edge{scale, 0}, from_vector<double>({1})}}).ok());
  EXPECT_EQ(sink.got[a.data_ptr()], 50);
  EXPECT_EQ(sink.got[b.data_ptr()], 20);
  EXPECT_FALSE(GradOf(a).defined());
}

TEST(EngineTest, NodeErrorEndsPassNamingNodeAndShapes) {
  Tensor a = Leaf({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor y = sum(a);
  auto failing = std::make_shared<ScaleNode>(1.0, true);
  failing->set_next_edges({GradientEdge(y)});
  failing->set_input_shapes({{2, 3}});
  AccumulateSink sink;
  GraphTask task(&sink, false);
  absl::Status s = task.Execute({{Edge{failing, 0}, from_vector<double>({1})}});
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(s.message(), "ScaleNode")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "[2, 3]")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "peer went away")) << s;
  EXPECT_FALSE(GradOf(a).defined());
}

TEST(EngineTest, ConcurrentPassesOverSeparateGraphs) {
  constexpr int kThreads = 4, kIters = 50;
  std::vector<Tensor> leaves;
  for (int t = 0; t < kThreads; ++t) leaves.push_back(Leaf({1.0 + t, 2.0}));
  std::vector<std::thread> threads;
  std::vector<absl::Status> results(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kIters && results[t].ok(); ++i) {
        Tensor y = sum(mul(tanh(leaves[t]), leaves[t]));
        results[t] = Backward({y});
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    ASSERT_TRUE(results[t].ok()) << results[t];
    std::vector<double> x = Vals(leaves[t]), g = Vals(GradOf(leaves[t]));
    for (size_t j = 0; j < x.size(); ++j) {
      const double th = std::tanh(x[j]);
      EXPECT_NEAR(g[j], kIters * (th + x[j] * (1 - th * th)), 1e-9);
    }
  }
}

TEST(EngineTest, ConcurrentPassesSharingALeafAccumulateEveryGradient) {
  constexpr int kThreads = 4, kIters = 50;
  Tensor w = Leaf({0.5, -1.0});
  std::vector<std::thread> threads;
  std::vector<absl::Status> results(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kIters && results[t].ok(); ++i)
        results[t] = Backward({sum(mul(w, static_cast<double>(t + 1)))});
    });
  }
  for (auto& th : threads) th.join();
  for (const absl::Status& s : results) ASSERT_TRUE(s.ok()) << s;
  // Every pass adds (t + 1) per element: 50 * (1 + 2 + 3 + 4).
  EXPECT_EQ(Vals(GradOf(w)), (std::vector<double>{500, 500}));
}

TEST(EngineTest, AutogradStateTravelsWithTheTensorHandle) {
  Tensor a = Leaf({4});
  Tensor copy = a;  // Same tensor object, e.g. inside an RPC Value.
  EXPECT_TRUE(RequiresGrad(copy));
  ASSERT_TRUE(Backward({mul(copy, 2.0)}).ok());
  EXPECT_EQ(GradOf(a).item<double>(), 2);
}

}  // namespace
}  // namespace ferry::autograd
