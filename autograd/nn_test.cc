#include "ferry/autograd/nn.h"

#include <cmath>

#include "ferry/autograd/engine.h"
#include "ferry/autograd/node.h"
#include "ferry/autograd/ops.h"
#include "gtest/gtest.h"

namespace ferry::nn {
namespace {

namespace ag = ::ferry::autograd;

std::shared_ptr<Sequential> Mlp(uint64_t seed) {
  return std::make_shared<Sequential>(std::vector<std::shared_ptr<Module>>{
      std::make_shared<Linear>(4, 8, seed), std::make_shared<ReLU>(),
      std::make_shared<Linear>(8, 3, seed + 10)});
}

TEST(NnTest, NamedParametersInStableOrder) {
  auto m = Mlp(1);
  auto named = m->named_parameters();
  ASSERT_EQ(named.size(), 4u);
  EXPECT_EQ(named[0].first, "0.weight");
  EXPECT_EQ(named[1].first, "0.bias");
  EXPECT_EQ(named[2].first, "2.weight");
  EXPECT_EQ(named[3].first, "2.bias");
  EXPECT_EQ(named[0].second.sizes(), (std::vector<int64_t>{8, 4}));
  EXPECT_EQ(named[3].second.sizes(), (std::vector<int64_t>{3}));
  for (const Tensor& p : m->parameters()) {
    EXPECT_TRUE(ag::RequiresGrad(p));
    EXPECT_TRUE(ag::IsLeaf(p));
  }
}

TEST(NnTest, LinearInitIsSeededKaimingUniform) {
  Linear a(16, 32, 7), b(16, 32, 7), c(16, 32, 8);
  EXPECT_TRUE(a.weight().equal(b.weight()));
  EXPECT_TRUE(a.bias().equal(b.bias()));
  EXPECT_FALSE(a.weight().equal(c.weight()));
  const double bound = 1.0 / std::sqrt(16.0);
  double lo = 1, hi = -1;
  for (float w : a.weight().to_vector<float>()) {
    lo = std::min<double>(lo, w);
    hi = std::max<double>(hi, w);
  }
  EXPECT_GE(lo, -bound);
  EXPECT_LE(hi, bound);
  // 512 uniform draws cover most of the interval.
  EXPECT_LT(lo, -0.9 * bound);
  EXPECT_GT(hi, 0.9 * bound);
}

TEST(NnTest, LinearForwardAndBackwardByHand) {
  Linear lin(2, 1, 3, true, DType::kFloat64);
  Tensor w = lin.weight(), b = lin.bias();
  Tensor x = from_vector<double>({1, 2, 3, 4}, {2, 2});
  Tensor y = lin.Forward(x);
  const std::vector<double> wv = w.to_vector<double>();
  const double bv = b.item<double>();
  std::vector<double> yv = y.to_vector<double>();
  EXPECT_NEAR(yv[0], wv[0] * 1 + wv[1] * 2 + bv, 1e-12);
  EXPECT_NEAR(yv[1], wv[0] * 3 + wv[1] * 4 + bv, 1e-12);
  ASSERT_TRUE(ag::Backward({ag::sum(y)}).ok());
  EXPECT_EQ(ag::GradOf(w).to_vector<double>(), (std::vector<double>{4, 6}));
  EXPECT_EQ(ag::GradOf(b).item<double>(), 2);
  lin.ZeroGrad();
  EXPECT_FALSE(ag::GradOf(w).defined());
}

TEST(NnTest, StateDictRoundTrip) {
  auto a = Mlp(1), b = Mlp(100);
  Tensor x = randn({5, 4}, 9);
  EXPECT_FALSE(a->Forward(x).equal(b->Forward(x)));
  absl::StatusOr<std::string> bytes = a->SaveStateDict();
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  ASSERT_TRUE(b->LoadStateDict(*bytes).ok());
  EXPECT_TRUE(a->Forward(x).equal(b->Forward(x)));
  auto pa = a->parameters(), pb = b->parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_TRUE(pa[i].equal(pb[i]));
    EXPECT_FALSE(pa[i].storage().is_same(pb[i].storage()));
  }
}

TEST(NnTest, StateDictMismatchesAreErrors) {
  auto a = Mlp(1);
  Sequential other(std::vector<std::shared_ptr<Module>>{
      std::make_shared<Linear>(4, 9, 1), std::make_shared<ReLU>(),
      std::make_shared<Linear>(9, 3, 2)});
  absl::StatusOr<std::string> bytes = other.SaveStateDict();
  ASSERT_TRUE(bytes.ok());
  Tensor before = a->parameters()[0].clone();
  absl::Status s = a->LoadStateDict(*bytes);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("0.weight"), std::string::npos) << s;
  EXPECT_TRUE(a->parameters()[0].equal(before));  // Nothing written.
  EXPECT_EQ(a->LoadStateDict("not a state dict").code(),
            absl::StatusCode::kInvalidArgument);
  Linear single(4, 8, 1);
  EXPECT_EQ(single.LoadStateDict(*a->SaveStateDict()).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(NnTest, TrainEvalControlsDropout) {
  auto drop = std::make_shared<Dropout>(0.5, 11);
  Sequential seq(std::vector<std::shared_ptr<Module>>{drop});
  Tensor x = ones({200});
  EXPECT_TRUE(seq.is_training());
  Tensor y = seq.Forward(x);
  int zeros_seen = 0;
  for (float v : y.to_vector<float>()) zeros_seen += v == 0;
  EXPECT_GT(zeros_seen, 50);
  EXPECT_LT(zeros_seen, 150);
  EXPECT_FALSE(seq.Forward(x).equal(y));  // Next call, next mask.
  seq.eval();
  EXPECT_FALSE(drop->is_training());
  EXPECT_TRUE(seq.Forward(x).equal(x));
}

TEST(NnTest, EmbeddingAndLosses) {
  Embedding emb(5, 3, 4, DType::kFloat64);
  Tensor idx = from_vector<int64_t>({4, 4, 0});
  Tensor out = emb.Forward(idx);
  EXPECT_EQ(out.sizes(), (std::vector<int64_t>{3, 3}));
  EXPECT_TRUE(out.select(0, 0).equal(emb.weight().select(0, 4)));
  ASSERT_TRUE(ag::Backward({ag::sum(out)}).ok());
  std::vector<double> g = ag::GradOf(emb.weight()).to_vector<double>();
  EXPECT_EQ(g[4 * 3], 2);  // Row 4 used twice.
  EXPECT_EQ(g[0], 1);
  EXPECT_EQ(g[3], 0);
  Tensor p = from_vector<double>({1, 2}), t = from_vector<double>({0, 4});
  EXPECT_DOUBLE_EQ(MSELoss()(p, t).item<double>(), (1 + 4) / 2.0);
  Tensor logits = from_vector<double>({0, 0}, {1, 2});
  EXPECT_NEAR(
      CrossEntropyLoss()(logits, from_vector<int64_t>({1}, {1})).item<double>(),
      std::log(2.0), 1e-12);
}

}  // namespace
}  // namespace ferry::nn
