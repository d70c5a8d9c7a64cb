// Expected values were computed by hand (a calculator session applying the
// PyTorch 1.13 update rules quoted in optim.cc), not by this code.
#include "ferry/optim/optim.h"

#include "ferry/autograd/node.h"
#include "gtest/gtest.h"

namespace ferry::optim {
namespace {

Tensor P(std::vector<double> v) {
  return from_vector<double>(v, {static_cast<int64_t>(v.size())});
}

TEST(SgdTest, MomentumDampeningWeightDecayTwoSteps) {
  Tensor p = P({1.0, -2.0});
  SgdState st;
  SgdOptions o{.lr = 0.1,
               .momentum = 0.9,
               .dampening = 0.1,
               .nesterov = false,
               .weight_decay = 0.01};
  ASSERT_TRUE(SgdStep({p}, {P({0.5, 1.0})}, st, o).ok());
  // g = 0.5 + 0.01*1 = 0.51, b = g, p = 1 - 0.1*0.51.
  EXPECT_NEAR(p.to_vector<double>()[0], 0.949, 1e-12);
  EXPECT_NEAR(p.to_vector<double>()[1], -2.098, 1e-12);
  ASSERT_TRUE(SgdStep({p}, {P({0.2, -0.4})}, st, o).ok());
  // g = 0.2 + 0.00949; b = 0.9*0.51 + 0.9*g = 0.647541; p = 0.949 - 0.0647541.
  EXPECT_NEAR(p.to_vector<double>()[0], 0.8842459, 1e-12);
  EXPECT_NEAR(p.to_vector<double>()[1], -2.1483118, 1e-12);
  EXPECT_NEAR(st.momentum_buffer[0].to_vector<double>()[0], 0.647541, 1e-12);
}

TEST(SgdTest, Nesterov) {
  Tensor p = P({1.0});
  SgdState st;
  SgdOptions o{.lr = 0.1, .momentum = 0.9, .nesterov = true};
  ASSERT_TRUE(SgdStep({p}, {P({0.5})}, st, o).ok());
  EXPECT_NEAR(p.item<double>(), 0.905, 1e-12);  // g + 0.9*b = 0.95
  ASSERT_TRUE(SgdStep({p}, {P({0.2})}, st, o).ok());
  EXPECT_NEAR(p.item<double>(), 0.8265, 1e-12);  // b = 0.65, g = 0.785
}

TEST(SgdTest, PlainAndFloat32) {
  Tensor p = from_vector<float>({1.f, 2.f});
  SgdState st;
  ASSERT_TRUE(
      SgdStep({p}, {from_vector<float>({10.f, -10.f})}, st, {.lr = 0.5}).ok());
  EXPECT_EQ(p.to_vector<float>(), (std::vector<float>{-4.f, 7.f}));
  EXPECT_FALSE(st.momentum_buffer[0].defined());
}

TEST(AdamTest, TwoSteps) {
  Tensor p = P({1.0});
  AdamState st;
  AdamOptions o{.lr = 0.1};
  ASSERT_TRUE(AdamStep({p}, {P({0.5})}, st, o).ok());
  EXPECT_NEAR(p.item<double>(), 0.900000002, 1e-12);
  ASSERT_TRUE(AdamStep({p}, {P({-0.3})}, st, o).ok());
  EXPECT_NEAR(p.item<double>(), 0.8808501989417752, 1e-12);
  EXPECT_EQ(st.step[0], 2);
}

TEST(AdamTest, L2WeightDecay) {
  Tensor p = P({1.0});
  AdamState st;
  AdamOptions o{.lr = 0.1, .weight_decay = 0.1};
  ASSERT_TRUE(AdamStep({p}, {P({0.5})}, st, o).ok());
  EXPECT_NEAR(p.item<double>(), 0.9000000016666666, 1e-12);
  ASSERT_TRUE(AdamStep({p}, {P({-0.3})}, st, o).ok());
  EXPECT_NEAR(p.item<double>(), 0.8613529972101512, 1e-12);
}

TEST(AdamWTest, DecoupledWeightDecay) {
  Tensor p = P({1.0});
  AdamW opt({p}, {.lr = 0.1, .weight_decay = 0.1});
  autograd::SetRequiresGrad(p);
  autograd::SetGrad(p, P({0.5}));
  ASSERT_TRUE(opt.Step().ok());
  EXPECT_NEAR(p.item<double>(), 0.890000002, 1e-12);
  autograd::SetGrad(p, P({-0.3}));
  ASSERT_TRUE(opt.Step().ok());
  EXPECT_NEAR(p.item<double>(), 0.8619501989217752, 1e-12);
}

TEST(AdagradTest, LrDecayAndInitialAccumulator) {
  Tensor p = P({1.0});
  AdagradState st;
  AdagradOptions o{
      .lr = 0.1, .lr_decay = 0.5, .initial_accumulator_value = 0.1};
  ASSERT_TRUE(AdagradStep({p}, {P({0.5})}, st, o).ok());
  EXPECT_NEAR(p.item<double>(), 0.9154845745414341, 1e-12);
  ASSERT_TRUE(AdagradStep({p}, {P({-0.3})}, st, o).ok());
  EXPECT_NEAR(p.item<double>(), 0.945635708994665, 1e-12);
}

TEST(OptimizerTest, ParamsWithoutGradAreSkipped) {
  Tensor a = P({1.0}), b = P({2.0});
  autograd::SetRequiresGrad(a);
  autograd::SetRequiresGrad(b);
  SGD sgd({a, b}, {.lr = 1.0, .momentum = 0.5});
  autograd::SetGrad(a, P({0.25}));
  ASSERT_TRUE(sgd.Step().ok());
  EXPECT_EQ(a.item<double>(), 0.75);
  EXPECT_EQ(b.item<double>(), 2.0);
  EXPECT_FALSE(sgd.state().momentum_buffer[1].defined());
  sgd.ZeroGrad();
  EXPECT_FALSE(autograd::GradOf(a).defined());
  const uint64_t v = a.version();
  ASSERT_TRUE(sgd.Step().ok());  // No grads: nothing changes.
  EXPECT_EQ(a.version(), v);
}

TEST(OptimizerTest, MismatchedGradIsAnErrorAndUpdatesNothing) {
  Tensor a = P({1.0}), b = P({2.0});
  SgdState st;
  absl::Status s = SgdStep({a, b}, {P({1.0}), P({1.0, 2.0})}, st, {.lr = 1});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a.item<double>(), 1.0);
  EXPECT_EQ(SgdStep({a}, {}, st, {}).code(),
            absl::StatusCode::kInvalidArgument);
}

// A parameter labelled as on cuda:0 (over host bytes, so a missing check
// would compute on them rather than crash), made without a compute backend
// and with a CPU gradient, is refused naming both devices; so is one
// without a backend, for Adagrad too.
TEST(OptimizerTest, DeviceParamIsAnErrorNamingTheDevice) {
  Tensor host = P({1.0, 2.0});
  Tensor dev = *Tensor::FromStorage(
      Storage::Wrap(host.data_ptr(), host.nbytes(), Device::CUDA(0), nullptr),
      host.dtype(), {2}, {1});
  SgdState st;
  absl::Status s = SgdStep({dev}, {P({1.0, 1.0})}, st, {.lr = 1});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("SgdStep: param 0 (float64 [2] on cuda:0) and "
                             "its grad (float64 [2] on cpu) must be on one "
                             "CUDA device"),
            std::string::npos)
      << s;
  EXPECT_EQ(host.to_vector<double>(), (std::vector<double>{1.0, 2.0}));
  AdamState ast;
  EXPECT_EQ(AdamStep({host}, {dev}, ast, {}).code(),
            absl::StatusCode::kInvalidArgument);
  AdagradState agst;
  absl::Status ag = AdagradStep({dev}, {dev}, agst, {});
  EXPECT_EQ(ag.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(ag.message().find("AdagradStep: param 0 (float64 [2] on cuda:0)"),
            std::string::npos)
      << ag;
}

}  // namespace
}  // namespace ferry::optim
