// float16 and bfloat16 compute on device tensors, against the float32 op on
// the same (rounded) inputs. Each test runs on two backends: "host"
// (FakeDeviceApi memory, host loops over kernel_math.h: runs everywhere)
// and "cuda" (the kernels and cuBLAS: skips without a GPU, naming CUDA's
// reason), for each 16-bit dtype.
//
// Tolerances, from the formats: u is the unit roundoff, 2^-8 for bfloat16
// (8 significant bits) and 2^-11 for float16 (11). A 16-bit op widens its
// inputs to float, runs the float32 formula and rounds once, so on the same
// inputs it is within u (relative) of the float32 op; atol 1e-7 covers
// float16's subnormals (spacing 2^-24). Sums and products may add float32
// accumulation-order error on a GPU (k * 2^-24 * sum |terms|, far below u).
// Results that chain several rounded ops (the MLP step) get a few u per
// rounded stage.
#include <cmath>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "ferry/autograd/engine.h"
#include "ferry/autograd/node.h"
#include "ferry/autograd/ops.h"
#include "ferry/tensor/cuda/context.h"
#include "ferry/tensor/cuda/fake_device_api.h"
#include "ferry/tensor/cuda/host_ops.h"
#include "ferry/tensor/cuda/ops.h"
#include "gtest/gtest.h"

namespace ferry {
namespace cuda {
namespace {

namespace ag = ::ferry::autograd;

constexpr uint64_t kFakeCapacity = uint64_t{1} << 28;
constexpr double kSubnormalAtol = 1e-7;

class HalfOpsTest
    : public ::testing::TestWithParam<std::tuple<std::string, DType>> {
 protected:
  void SetUp() override {
    if (std::get<0>(GetParam()) == "host") {
      auto c = CreateHostComputeContext(
          std::make_shared<FakeDeviceApi>(1, kFakeCapacity), {});
      ASSERT_TRUE(c.ok()) << c.status();
      ctx_ = *std::move(c);
    } else {
      auto c = CreateComputeContext({});
      if (!c.ok()) GTEST_SKIP() << "no CUDA device: " << c.status();
      ctx_ = *std::move(c);
      Tensor a = Dev(ones({1, 1}), DType::kFloat32);
      absl::StatusOr<Tensor> p = ops()->Matmul(a, a, false, false);
      if (!p.ok()) GTEST_SKIP() << "cuBLAS unavailable: " << p.status();
    }
  }

  DType dtype() const { return std::get<1>(GetParam()); }
  // The unit roundoff of dtype().
  double u() const {
    return dtype() == DType::kBFloat16 ? std::ldexp(1.0, -8)
                                       : std::ldexp(1.0, -11);
  }
  DeviceOps* ops() const { return ctx_->compute(); }
  Device dev() const { return Device::CUDA(0); }

  // float32 `t` rounded to dtype() and widened back (exact).
  Tensor Round(const Tensor& t) const { return t.to(dtype()).to(DType::kFloat32); }
  // `t` as `dtype` on the device.
  Tensor Dev(const Tensor& t, DType dtype) {
    absl::StatusOr<Tensor> d = ctx_->To(t.to(dtype), dev());
    EXPECT_TRUE(d.ok()) << d.status();
    return d.ok() ? *d : Tensor();
  }
  // The 16-bit and the float32 device copies of the rounded `t`.
  std::pair<Tensor, Tensor> Both(const Tensor& t) {
    const Tensor r = Round(t);
    return {Dev(r, dtype()), Dev(r, DType::kFloat32)};
  }
  // Device `t` on the CPU as float32.
  Tensor HostF(const Tensor& t) {
    absl::StatusOr<Tensor> h = ctx_->To(t, Device::CPU());
    EXPECT_TRUE(h.ok()) << h.status();
    return h.ok() ? h->to(DType::kFloat32) : Tensor();
  }
  // Unwraps `r`, failing the test (and returning undefined) on error.
  Tensor Ok(absl::StatusOr<Tensor> r, const std::string& what) {
    EXPECT_TRUE(r.ok()) << what << ": " << r.status();
    return r.ok() ? *std::move(r) : Tensor();
  }
  // `half` (a dtype() device tensor) within rtol/atol of `f32` (float32).
  void ExpectNear(const Tensor& half, const Tensor& f32,
                  const std::string& what, double rtol, double atol) {
    ASSERT_TRUE(half.defined() && f32.defined()) << what;
    EXPECT_EQ(half.dtype(), dtype()) << what;
    EXPECT_EQ(f32.dtype(), DType::kFloat32) << what;
    const Tensor h = HostF(half), f = HostF(f32);
    ASSERT_EQ(h.sizes(), f.sizes()) << what;
    EXPECT_TRUE(h.allclose(f, rtol, atol))
        << what << " (rtol " << rtol << ", atol " << atol << ")\n"
        << DTypeName(dtype()) << ": " << h.ToString(6)
        << "\nfloat32: " << f.ToString(6);
  }
  // Within one rounding of the float32 op.
  void ExpectRoundedOnce(const Tensor& half, const Tensor& f32,
                         const std::string& what) {
    ExpectNear(half, f32, what, u(), kSubnormalAtol);
  }
  // The largest |element| of device `t`.
  double MaxAbs(const Tensor& t) {
    double m = 0;
    for (float v : HostF(t).contiguous().to_vector<float>()) {
      m = std::max(m, static_cast<double>(std::fabs(v)));
    }
    return m;
  }

  std::unique_ptr<CudaContext> ctx_;
};

TEST_P(HalfOpsTest, ElementwiseBroadcastAndActivationsRoundOnce) {
  auto [a, af] = Both(randn({6, 5}, 1).mul(2.0));
  auto [b, bf] = Both(rand({5}, 2).add(0.5));  // Broadcast over rows; > 0.
  using math::BinaryOp;
  using math::UnaryOp;
  for (BinaryOp op :
       {BinaryOp::kAdd, BinaryOp::kSub, BinaryOp::kMul, BinaryOp::kDiv}) {
    const std::string what = "binary " + std::to_string(static_cast<int>(op));
    Tensor h = Ok(ops()->Binary(op, a, b), what);
    EXPECT_EQ(h.sizes(), (std::vector<int64_t>{6, 5}));
    ExpectRoundedOnce(h, Ok(ops()->Binary(op, af, bf), what), what);
  }
  for (auto [op, s] : std::vector<std::pair<BinaryOp, double>>{
           {BinaryOp::kAdd, 3.0}, {BinaryOp::kMul, 0.1},
           {BinaryOp::kDiv, 7.0}, {BinaryOp::kPow, 2.0}}) {
    const std::string what = "scalar " + std::to_string(static_cast<int>(op));
    ExpectRoundedOnce(Ok(ops()->Scalar(op, a, s), what),
                      Ok(ops()->Scalar(op, af, s), what), what);
  }
  for (UnaryOp op : {UnaryOp::kNeg, UnaryOp::kRelu, UnaryOp::kGelu,
                     UnaryOp::kTanh, UnaryOp::kSigmoid, UnaryOp::kExp}) {
    const std::string what = "unary " + std::to_string(static_cast<int>(op));
    ExpectRoundedOnce(Ok(ops()->Unary(op, a), what),
                      Ok(ops()->Unary(op, af), what), what);
  }
  // Activation backward from the same rounded gradient and saved value
  // (the input for ReLU and GELU, the output for Tanh).
  auto [g, gf] = Both(randn({6, 5}, 3));
  auto [t, tf] = Both(rand({6, 5}, 4).mul(1.8).sub(0.9));  // A tanh's range.
  using math::BackwardOp;
  struct Case {
    BackwardOp op;
    Tensor saved, savedf;
  };
  for (const Case& c : {Case{BackwardOp::kRelu, a, af},
                        Case{BackwardOp::kGelu, a, af},
                        Case{BackwardOp::kTanh, t, tf}}) {
    const std::string what =
        "backward " + std::to_string(static_cast<int>(c.op));
    ExpectRoundedOnce(Ok(ops()->UnaryBackward(c.op, g, c.saved), what),
                      Ok(ops()->UnaryBackward(c.op, gf, c.savedf), what),
                      what);
  }
  // A strided (transposed) operand, and in-place accumulation.
  ExpectRoundedOnce(
      Ok(ops()->Binary(BinaryOp::kAdd, a.transpose(0, 1), g.transpose(0, 1)),
         "strided add"),
      Ok(ops()->Binary(BinaryOp::kAdd, af.transpose(0, 1), gf.transpose(0, 1)),
         "strided add"),
      "strided add");
  Tensor acc = Ok(ops()->Unary(UnaryOp::kCopy, a), "copy");
  Tensor accf = Ok(ops()->Unary(UnaryOp::kCopy, af), "copy");
  ASSERT_TRUE(ops()->AddInPlace(acc, g).ok());
  ASSERT_TRUE(ops()->AddInPlace(accf, gf).ok());
  ExpectRoundedOnce(acc, accf, "add_");
  ASSERT_TRUE(ops()->Fill(acc, 0.1).ok());
  ASSERT_TRUE(ops()->Fill(accf, 0.1).ok());
  ExpectRoundedOnce(acc, accf, "fill_");
}

TEST_P(HalfOpsTest, SumAndMeanAccumulateInFloat) {
  auto [x, xf] = Both(rand({64, 48}, 5).add(0.5));
  // Each sum is rounded once; float32 partial sums in another order differ
  // by far less than u.
  ExpectRoundedOnce(Ok(ops()->Sum(x), "sum"), Ok(ops()->Sum(xf), "sum"),
                    "sum");
  for (int64_t dim : {0, 1, -1}) {
    for (bool keep : {false, true}) {
      const std::string what = "sum dim " + std::to_string(dim);
      ExpectRoundedOnce(Ok(ops()->SumDim(x, dim, keep), what),
                        Ok(ops()->SumDim(xf, dim, keep), what), what);
    }
  }
  ExpectRoundedOnce(ag::mean(x), ag::mean(xf), "mean");
  ExpectRoundedOnce(ag::mean(x, {0}, false), ag::mean(xf, {0}, false),
                    "mean dim 0");
  // 4096 ones sum to 4096 exactly only with a float accumulator: a 16-bit
  // one stops growing at 256 (bfloat16) or 2048 (float16), where + 1 is a
  // tie that rounds to even.
  Tensor ones16 = Dev(ones({4096}), dtype());
  EXPECT_EQ(HostF(Ok(ops()->Sum(ones16), "sum of ones")).item<float>(), 4096);
  EXPECT_EQ(HostF(Ok(ops()->SumDim(ones16.reshape({1, 4096}), 1, false),
                     "sum of ones over dim 1"))
                .item<float>(),
            4096);
}

TEST_P(HalfOpsTest, SoftmaxFamilyAndCrossEntropy) {
  auto [x, xf] = Both(randn({8, 10}, 6).mul(3.0));
  for (bool log : {false, true}) {
    const std::string what = log ? "log_softmax" : "softmax";
    Tensor y = Ok(ops()->Softmax(x, log), what);
    Tensor yf = Ok(ops()->Softmax(xf, log), what);
    ExpectRoundedOnce(y, yf, what);
    // The backward from one rounded (g, y) pair.
    auto [g, gf] = Both(randn({8, 10}, 7));
    auto [yr, yrf] = Both(HostF(yf));
    ExpectRoundedOnce(Ok(ops()->SoftmaxBackward(g, yr, log), what + " grad"),
                      Ok(ops()->SoftmaxBackward(gf, yrf, log), what + " grad"),
                      what + " backward");
  }
  Tensor target = Ok(ctx_->To(from_vector<int64_t>({0, 3, 9, 2, 2, 5, 7, 1},
                                                   {8}),
                              dev()),
                     "target");
  absl::StatusOr<std::pair<Tensor, Tensor>> ce = ops()->CrossEntropy(x, target);
  absl::StatusOr<std::pair<Tensor, Tensor>> cef =
      ops()->CrossEntropy(xf, target);
  ASSERT_TRUE(ce.ok()) << ce.status();
  ASSERT_TRUE(cef.ok()) << cef.status();
  // The loss comes back in the input's dtype (as PyTorch's cross_entropy
  // outside autocast), computed in float: one rounding.
  ExpectRoundedOnce(ce->first, cef->first, "cross_entropy loss");
  ExpectRoundedOnce(ce->second, cef->second, "cross_entropy lse");
  // The backward reads the rounded lse: softmax's p moves by at most
  // p * u * |lse|, so the gradient ((p - onehot) * g / rows) by at most
  // u * max|lse| * g / rows, then rounds once.
  auto [gl, glf] = Both(full({}, 0.5));
  Tensor dx = Ok(ops()->CrossEntropyBackward(x, target, ce->second, gl),
                 "cross_entropy backward");
  Tensor dxf = Ok(ops()->CrossEntropyBackward(xf, target, cef->second, glf),
                  "cross_entropy backward");
  ExpectNear(dx, dxf, "cross_entropy backward", u(),
             u() * MaxAbs(cef->second) * 0.5 / 8 + kSubnormalAtol);
}

TEST_P(HalfOpsTest, MatmulAccumulatesInFloat) {
  const int64_t k = 64;
  auto [a, af] = Both(randn({16, k}, 8));
  auto [b, bf] = Both(randn({k, 24}, 9));
  auto [bt, btf] = Both(randn({24, k}, 10));
  // One rounding, plus float32 accumulation-order slack on a GPU.
  const double atol = k * std::ldexp(1.0, -24) * MaxAbs(af) *
                          std::max(MaxAbs(bf), MaxAbs(btf)) +
                      kSubnormalAtol;
  ExpectNear(Ok(ops()->Matmul(a, b, false, false), "matmul"),
             Ok(ops()->Matmul(af, bf, false, false), "matmul"), "matmul", u(),
             atol);
  ExpectNear(Ok(ops()->Matmul(a, bt, false, true), "matmul b^T"),
             Ok(ops()->Matmul(af, btf, false, true), "matmul b^T"),
             "matmul b^T", u(), atol);
  ExpectNear(Ok(ops()->Matmul(a, a, true, false), "matmul a^T a"),
             Ok(ops()->Matmul(af, af, true, false), "matmul a^T a"),
             "matmul a^T a", u(),
             16 * std::ldexp(1.0, -24) * MaxAbs(af) * MaxAbs(af) +
                 kSubnormalAtol);
  auto [p, pf] = Both(randn({3, 8, k}, 11));
  auto [q, qf] = Both(randn({3, k, 5}, 12));
  ExpectNear(Ok(ops()->BatchedMatmul(p, q, false, false), "batched"),
             Ok(ops()->BatchedMatmul(pf, qf, false, false), "batched"),
             "batched matmul", u(),
             k * std::ldexp(1.0, -24) * MaxAbs(pf) * MaxAbs(qf) +
                 kSubnormalAtol);
  // A 4096-long dot product of ones is 4096 only with a float accumulator.
  Tensor row = Dev(ones({1, 4096}), dtype());
  EXPECT_EQ(HostF(Ok(ops()->Matmul(row, row, false, true), "dot of ones"))
                .item<float>(),
            4096);
}

TEST_P(HalfOpsTest, OptimizerStepsRoundOnce) {
  auto [p, pf] = Both(randn({40}, 13));
  auto [g, gf] = Both(randn({40}, 14));
  auto [buf, buff] = Both(randn({40}, 15));
  math::SgdParams sgd;
  sgd.lr = 0.1;
  sgd.momentum = 0.9;
  sgd.weight_decay = 0.01;
  sgd.first = false;
  ASSERT_TRUE(ops()->SgdStep(p, g, buf, sgd).ok());
  ASSERT_TRUE(ops()->SgdStep(pf, gf, buff, sgd).ok());
  ExpectRoundedOnce(p, pf, "sgd param");
  ExpectRoundedOnce(buf, buff, "sgd momentum buffer");
  auto [m, mf] = Both(randn({40}, 16).mul(0.1));
  auto [v, vf] = Both(rand({40}, 17).mul(0.01));
  const math::AdamParams adam = math::AdamForStep(math::AdamParams{}, 3);
  ASSERT_TRUE(ops()->AdamStep(p, g, m, v, adam).ok());
  ASSERT_TRUE(ops()->AdamStep(pf, gf, mf, vf, adam).ok());
  // p's inputs were already equal to within one rounding: re-round them.
  ExpectNear(p, pf, "adam param", 2 * u(), kSubnormalAtol);
  ExpectRoundedOnce(m, mf, "adam exp_avg");
  ExpectRoundedOnce(v, vf, "adam exp_avg_sq");
  auto [q, qf] = Both(randn({40}, 18));
  auto [s, sf] = Both(rand({40}, 19));
  math::AdagradParams adagrad;
  adagrad.clr = 0.05;
  ASSERT_TRUE(ops()->AdagradStep(q, g, s, adagrad).ok());
  ASSERT_TRUE(ops()->AdagradStep(qf, gf, sf, adagrad).ok());
  ExpectRoundedOnce(q, qf, "adagrad param");
  ExpectRoundedOnce(s, sf, "adagrad sum");
}

// A two-hidden-layer MLP training step through autograd and an SGD step,
// in dtype() and in float32 from the same rounded weights and inputs.
TEST_P(HalfOpsTest, MlpTrainingStepMatchesFloat32) {
  const int64_t batch = 32, in = 20, hidden = 24, classes = 10;
  auto [x, xf] = Both(randn({batch, in}, 20));
  // Weights scaled by 1/sqrt(fan_in), so each layer keeps magnitudes O(1)
  // and the rounding errors do not grow from layer to layer.
  auto [w1, w1f] = Both(randn({hidden, in}, 21).mul(1 / std::sqrt(20.0)));
  auto [b1, b1f] = Both(randn({hidden}, 22).mul(0.1));
  auto [w2, w2f] = Both(randn({hidden, hidden}, 23).mul(1 / std::sqrt(24.0)));
  auto [b2, b2f] = Both(randn({hidden}, 24).mul(0.1));
  auto [w3, w3f] = Both(randn({classes, hidden}, 25).mul(1 / std::sqrt(24.0)));
  std::vector<int64_t> labels;
  for (int64_t i = 0; i < batch; ++i) labels.push_back((i * 7) % classes);
  Tensor target =
      Ok(ctx_->To(from_vector<int64_t>(labels, {batch}), dev()), "target");
  auto step = [&](std::vector<Tensor> params, const Tensor& input) {
    for (const Tensor& t : params) ag::SetRequiresGrad(t);
    auto linear = [](const Tensor& h, const Tensor& w, const Tensor& b) {
      Tensor y = ag::matmul(h, ag::transpose(w, 0, 1));
      return b.defined() ? ag::add(y, b) : y;
    };
    Tensor h = ag::relu(linear(input, params[0], params[1]));
    h = ag::gelu(linear(h, params[2], params[3]));
    Tensor loss = ag::cross_entropy(linear(h, params[4], Tensor()), target);
    EXPECT_TRUE(ag::Backward({loss}).ok());
    std::vector<Tensor> grads;
    for (const Tensor& t : params) grads.push_back(ag::GradOf(t));
    // The step optim::SGD takes on device parameters (plain SGD, lr 0.5).
    math::SgdParams o;
    o.lr = 0.5;
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_TRUE(ops()->SgdStep(params[i], grads[i], Tensor(), o).ok());
    }
    return std::make_pair(loss, grads);
  };
  std::vector<Tensor> params = {w1, b1, w2, b2, w3};
  std::vector<Tensor> paramsf = {w1f, b1f, w2f, b2f, w3f};
  auto [loss, grads] = step(params, x);
  auto [lossf, gradsf] = step(paramsf, xf);
  // About eight rounded stages (three linears, two activations, the loss
  // and their backward), each within u of float32 at O(1) magnitudes.
  const double r = 8 * u();
  ExpectNear(loss, lossf, "loss", r, kSubnormalAtol);
  const char* names[] = {"w1", "b1", "w2", "b2", "w3"};
  for (size_t i = 0; i < params.size(); ++i) {
    ASSERT_TRUE(grads[i].defined()) << names[i];
    EXPECT_EQ(grads[i].device(), dev()) << names[i];
    const double scale = MaxAbs(gradsf[i]);
    EXPECT_GT(scale, 1e-3) << names[i];  // A gradient worth comparing.
    ExpectNear(grads[i], gradsf[i], std::string("grad of ") + names[i], r,
               r * scale);
    // The SGD step (lr 0.5) moved each parameter by about its gradient:
    // within one rounding of the parameter plus lr times the gradient's
    // error.
    ExpectNear(params[i], paramsf[i], std::string("stepped ") + names[i],
               u(), 0.5 * r * scale + kSubnormalAtol);
  }
}

// Ops the 16-bit types do not support keep failing, naming op and dtype.
TEST_P(HalfOpsTest, UnsupportedOpsNameTheOpAndDtype) {
  const std::string name(DTypeName(dtype()));
  Tensor w = Dev(randn({5, 3}, 30), dtype());
  Tensor idx = Ok(ctx_->To(from_vector<int64_t>({1, 4}, {2}), dev()), "idx");
  auto expect_refused = [&](const absl::Status& s, const std::string& op,
                            const std::string& dtype_name) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find(op), std::string::npos) << s;
    EXPECT_NE(s.message().find(dtype_name), std::string::npos) << s;
  };
  expect_refused(ops()->Embedding(w, idx).status(), "embedding", name);
  expect_refused(ops()->NllLoss(w.slice(0, 0, 2), idx).status(), "nll_loss",
                 name);
  expect_refused(
      ops()->DropoutMask({4}, dtype(), dev(), 0.5, 1, 0).status(),
      "dropout_mask", name);
  // An integer dtype is still no compute dtype.
  Tensor i32 = Dev(ones({3}), DType::kInt32);
  expect_refused(ops()->Binary(math::BinaryOp::kAdd, i32, i32).status(),
                 "binary", "int32");
  // Mixed 16-bit and float32 operands are refused, not converted.
  Tensor f32 = Dev(ones({5, 3}), DType::kFloat32);
  expect_refused(ops()->Binary(math::BinaryOp::kAdd, w, f32).status(),
                 "binary", name);
}

INSTANTIATE_TEST_SUITE_P(
    Backends, HalfOpsTest,
    ::testing::Combine(::testing::Values("host", "cuda"),
                       ::testing::Values(DType::kFloat16, DType::kBFloat16)),
    [](const ::testing::TestParamInfo<HalfOpsTest::ParamType>& info) {
      return std::get<0>(info.param) + "_" +
             std::string(DTypeName(std::get<1>(info.param)));
    });

}  // namespace
}  // namespace cuda
}  // namespace ferry
