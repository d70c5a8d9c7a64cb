// CUDA ops on a GPU: agreement with the CPU ops (float32 tolerance), a
// double-precision gradient check of every backward kernel against central
// differences of its forward kernel, and bad input. Without a GPU every test
// skips, naming CUDA's reason (tools/gpu_check runs them on one).
#include "ferry/tensor/cuda/ops.h"

#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "ferry/autograd/engine.h"
#include "ferry/autograd/node.h"
#include "ferry/autograd/ops.h"
#include "ferry/tensor/cuda/context.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ferry {
namespace cuda {
namespace {

using math::BackwardOp;
using math::BinaryOp;
using math::UnaryOp;
using ::testing::HasSubstr;

class CudaOpsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<CudaContext>> c = CudaContext::Create({});
    if (!c.ok()) GTEST_SKIP() << "no CUDA device: " << c.status();
    ctx_ = *std::move(c);
  }
  // `t` on cuda:0.
  Tensor Dev(const Tensor& t) {
    absl::StatusOr<Tensor> d = ctx_->To(t, Device::CUDA(0));
    EXPECT_TRUE(d.ok()) << d.status();
    return d.ok() ? *d : Tensor();
  }
  // An op's device result, on the CPU (undefined, after a failure, if the
  // op failed).
  Tensor Host(const absl::StatusOr<Tensor>& t) {
    EXPECT_TRUE(t.ok()) << t.status();
    if (!t.ok()) return Tensor();
    absl::StatusOr<Tensor> h = ctx_->To(*t, Device::CPU());
    EXPECT_TRUE(h.ok()) << h.status();
    return h.ok() ? *h : Tensor();
  }
  // Expects `gpu` (a device op's result) to match `cpu` at float32 tolerance.
  void ExpectClose(const Tensor& cpu, const absl::StatusOr<Tensor>& gpu,
                   const std::string& what, double rtol = 1e-4,
                   double atol = 1e-5) {
    Tensor h = Host(gpu);
    ASSERT_TRUE(h.defined()) << what;
    ASSERT_EQ(h.sizes(), cpu.sizes()) << what;
    EXPECT_TRUE(h.allclose(cpu, rtol, atol))
        << what << "\ngpu: " << h.ToString(6) << "\ncpu: " << cpu.ToString(6);
  }
  // CPU gradient of sum(w * f(x)) with respect to x, by autograd.
  static Tensor CpuGrad(const std::function<Tensor(const Tensor&)>& f,
                        const Tensor& x, const Tensor& w) {
    Tensor xl = x.clone();
    autograd::SetRequiresGrad(xl);
    Tensor y = f(xl);
    absl::StatusOr<std::vector<Tensor>> g = autograd::Grad({y}, {xl}, {w});
    EXPECT_TRUE(g.ok()) << g.status();
    return g.ok() ? (*g)[0] : Tensor();
  }
  // Central differences of sum(w * fwd(x)) (fwd on the GPU, in double)
  // against `analytic`, the backward kernel's gradient for upstream w.
  void GradCheck(const std::string& op,
                 const std::function<absl::StatusOr<Tensor>(const Tensor&)>&
                     fwd,
                 const Tensor& x, const Tensor& w, const Tensor& analytic) {
    ASSERT_EQ(x.dtype(), DType::kFloat64);
    ASSERT_LE(x.numel(), 64) << "keep gradchecks small";
    ASSERT_EQ(analytic.sizes(), x.sizes()) << op;
    const double h = 1e-6;
    auto f = [&](const Tensor& xs) {
      Tensor y = Host(fwd(Dev(xs)));
      return y.defined() ? y.mul(w).sum().item() : NAN;
    };
    for (int64_t i = 0; i < x.numel(); ++i) {
      Tensor xp = x.clone(), xm = x.clone();
      xp.data<double>()[i] += h;
      xm.data<double>()[i] -= h;
      const double numeric = (f(xp) - f(xm)) / (2 * h);
      const double an = analytic.data<double>()[i];
      EXPECT_NEAR(an, numeric, 1e-5 + 1e-4 * std::abs(numeric))
          << op << " element " << i;
    }
  }
  // Skips, naming why, where cuBLAS cannot be loaded (context.h); the
  // caller returns when IsSkipped().
  void SkipWithoutCublas() {
    Tensor one = Dev(ones({1, 1}));
    absl::StatusOr<Tensor> r = Matmul(*ctx_, one, one);
    if (r.status().code() == absl::StatusCode::kFailedPrecondition) {
      GTEST_SKIP() << "no cuBLAS: " << r.status();
    }
  }
  std::unique_ptr<CudaContext> ctx_;
};

TEST_F(CudaOpsTest, RoundTripAndContiguous) {
  Tensor x = randn({3, 5}, 1);
  Tensor d = Dev(x);
  EXPECT_TRUE(d.device() == Device::CUDA(0));
  EXPECT_TRUE(Host(d).equal(x));
  // A transposed view compacted on the device.
  ExpectClose(x.t().contiguous(), Contiguous(*ctx_, d.t()), "contiguous");
}

TEST_F(CudaOpsTest, BinaryBroadcastsLikeTheCpu) {
  Tensor a = randn({2, 3, 4}, 2), b = randn({3, 1}, 3).add(3.0);
  const std::pair<BinaryOp, Tensor (*)(const Tensor&, const Tensor&)> ops[] = {
      {BinaryOp::kAdd, autograd::add}, {BinaryOp::kSub, autograd::sub},
      {BinaryOp::kMul, autograd::mul}, {BinaryOp::kDiv, autograd::div}};
  for (const auto& [op, cpu] : ops) {
    ExpectClose(cpu(a, b), Binary(*ctx_, op, Dev(a), Dev(b)),
                "binary " + std::to_string(static_cast<int>(op)));
    // Strided operand: a transposed view.
    Tensor at = a.transpose(0, 2);  // [4, 3, 2]
    Tensor c = randn({4, 1, 2}, 4).add(3.0);
    ExpectClose(cpu(at, c), Binary(*ctx_, op, Dev(a).transpose(0, 2), Dev(c)),
                "binary on a view");
  }
}

TEST_F(CudaOpsTest, ScalarAndUnaryLikeTheCpu) {
  Tensor x = rand({4, 7}, 5).add(0.1);  // Positive: log and sqrt.
  Tensor d = Dev(x);
  ExpectClose(x.add(2.5), Scalar(*ctx_, BinaryOp::kAdd, d, 2.5), "add");
  ExpectClose(x.sub(2.5), Scalar(*ctx_, BinaryOp::kSub, d, 2.5), "sub");
  ExpectClose(x.mul(2.5), Scalar(*ctx_, BinaryOp::kMul, d, 2.5), "mul");
  ExpectClose(x.div(2.5), Scalar(*ctx_, BinaryOp::kDiv, d, 2.5), "div");
  Tensor s = randn({4, 7}, 6);
  Tensor ds = Dev(s);
  ExpectClose(autograd::neg(s), Unary(*ctx_, UnaryOp::kNeg, ds), "neg");
  ExpectClose(autograd::relu(s), Unary(*ctx_, UnaryOp::kRelu, ds), "relu");
  ExpectClose(autograd::tanh(s), Unary(*ctx_, UnaryOp::kTanh, ds), "tanh");
  ExpectClose(autograd::sigmoid(s), Unary(*ctx_, UnaryOp::kSigmoid, ds),
              "sigmoid");
  ExpectClose(autograd::exp(s), Unary(*ctx_, UnaryOp::kExp, ds), "exp");
  ExpectClose(autograd::log(x), Unary(*ctx_, UnaryOp::kLog, d), "log");
  ExpectClose(autograd::sqrt(x), Unary(*ctx_, UnaryOp::kSqrt, d), "sqrt");
}

TEST_F(CudaOpsTest, ActivationBackwardLikeTheCpu) {
  Tensor x = randn({5, 6}, 7), w = randn({5, 6}, 8);
  Tensor dx = Dev(x), dw = Dev(w);
  ExpectClose(CpuGrad(autograd::relu, x, w),
              UnaryBackward(*ctx_, BackwardOp::kRelu, dw, dx), "relu");
  ExpectClose(CpuGrad(autograd::tanh, x, w),
              UnaryBackward(*ctx_, BackwardOp::kTanh, dw,
                            *Unary(*ctx_, UnaryOp::kTanh, dx)),
              "tanh");
  ExpectClose(CpuGrad(autograd::sigmoid, x, w),
              UnaryBackward(*ctx_, BackwardOp::kSigmoid, dw,
                            *Unary(*ctx_, UnaryOp::kSigmoid, dx)),
              "sigmoid");
}

TEST_F(CudaOpsTest, ReductionsLikeTheCpu) {
  // Enough elements for every block of the two-pass sum.
  Tensor big = randn({1000, 131}, 9);
  ExpectClose(autograd::sum(big), Sum(*ctx_, Dev(big)), "sum", 1e-4, 1e-2);
  ExpectClose(autograd::mean(big), Mean(*ctx_, Dev(big)), "mean");
  Tensor x = randn({3, 4, 5}, 10);
  Tensor d = Dev(x);
  for (int64_t dim : {0, 1, 2, -1}) {
    for (bool keep : {false, true}) {
      const std::string what = "dim " + std::to_string(dim);
      ExpectClose(autograd::sum(x, {dim}, keep), SumDim(*ctx_, d, dim, keep),
                  "sum " + what);
      ExpectClose(autograd::mean(x, {dim}, keep), MeanDim(*ctx_, d, dim, keep),
                  "mean " + what);
    }
  }
  // A reduction of a view.
  ExpectClose(autograd::sum(x.transpose(0, 2), {0}, false),
              SumDim(*ctx_, d.transpose(0, 2), 0, false), "sum of a view");
}

TEST_F(CudaOpsTest, SoftmaxFamilyLikeTheCpu) {
  Tensor x = randn({5, 300}, 11).mul(4.0), w = randn({5, 300}, 12);
  Tensor dx = Dev(x), dw = Dev(w);
  for (bool log : {false, true}) {
    auto cpu = [log](const Tensor& t) {
      return log ? autograd::log_softmax(t, 1) : autograd::softmax(t, 1);
    };
    const std::string what = log ? "log_softmax" : "softmax";
    ExpectClose(cpu(x), Softmax(*ctx_, dx, log), what);
    absl::StatusOr<Tensor> y = Softmax(*ctx_, dx, log);
    ASSERT_TRUE(y.ok()) << y.status();
    ExpectClose(CpuGrad(cpu, x, w), SoftmaxBackward(*ctx_, dw, *y, log),
                what + " backward");
  }
  Tensor target = from_vector<int64_t>({3, 0, 299, 17, 150});
  absl::StatusOr<CrossEntropyResult> ce =
      CrossEntropy(*ctx_, dx, Dev(target));
  ASSERT_TRUE(ce.ok()) << ce.status();
  ExpectClose(autograd::cross_entropy(x, target), ce->loss, "cross_entropy");
  Tensor g = full({}, 1.7);
  ExpectClose(CpuGrad([&](const Tensor& t) {
                return autograd::cross_entropy(t, target);
              }, x, g),
              CrossEntropyBackward(*ctx_, dx, Dev(target), ce->lse, Dev(g)),
              "cross_entropy backward");
}

TEST_F(CudaOpsTest, EmbeddingLikeTheCpu) {
  Tensor weight = randn({10, 6}, 13);
  Tensor idx = from_vector<int64_t>({1, 4, 1, 9, 0, 4}, {2, 3});
  Tensor w = randn({2, 3, 6}, 14);
  ExpectClose(autograd::embedding(weight, idx),
              Embedding(*ctx_, Dev(weight), Dev(idx)), "embedding");
  ExpectClose(CpuGrad([&](const Tensor& t) {
                return autograd::embedding(t, idx);
              }, weight, w),
              EmbeddingBackward(*ctx_, Dev(w), Dev(idx), 10),
              "embedding backward (repeated indices accumulate)");
}

TEST_F(CudaOpsTest, MatmulAndLinearLikeTheCpu) {
  SkipWithoutCublas();
  if (IsSkipped()) return;
  Tensor a = randn({7, 5}, 15), b = randn({5, 9}, 16);
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      Tensor as = ta ? a.t().contiguous() : a, bs = tb ? b.t().contiguous() : b;
      ExpectClose(autograd::matmul(a, b), Matmul(*ctx_, Dev(as), Dev(bs), ta, tb),
                  "matmul ta=" + std::to_string(ta) + " tb=" +
                      std::to_string(tb));
    }
  }
  Tensor x = randn({4, 5}, 17), weight = randn({3, 5}, 18),
         bias = randn({3}, 19);
  ExpectClose(autograd::add(autograd::matmul(x, weight.t()), bias),
              Linear(*ctx_, Dev(x), Dev(weight), Dev(bias)), "linear");
}

TEST_F(CudaOpsTest, BatchedMatmulLikeTheCpu) {
  SkipWithoutCublas();
  if (IsSkipped()) return;
  for (int64_t batch : {1, 3}) {  // 1: the plain GEMM path.
    Tensor a = randn({batch, 4, 6}, 24), b = randn({batch, 6, 5}, 25);
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        Tensor as = ta ? a.transpose(1, 2).contiguous() : a;
        Tensor bs = tb ? b.transpose(1, 2).contiguous() : b;
        ExpectClose(autograd::matmul(a, b),
                    BatchedMatmul(*ctx_, Dev(as), Dev(bs), ta, tb),
                    "batched_matmul batch=" + std::to_string(batch) +
                        " ta=" + std::to_string(ta) +
                        " tb=" + std::to_string(tb));
      }
    }
  }
  absl::StatusOr<Tensor> r = BatchedMatmul(*ctx_, Dev(randn({2, 3, 4}, 26)),
                                           Dev(randn({3, 4, 2}, 26)));
  EXPECT_THAT(r.status().message(), HasSubstr("one batch size"));
}

TEST_F(CudaOpsTest, OptimizerStepsMatchTheHostRule) {
  Tensor p = randn({33}, 20), g = randn({33}, 21);
  math::SgdParams sgd;
  sgd.lr = 0.1;
  sgd.momentum = 0.9;
  sgd.nesterov = true;
  sgd.weight_decay = 0.01;
  math::AdamParams adam;
  adam.weight_decay = 0.1;
  adam.decoupled = true;
  Tensor sp = Dev(p), sb = Dev(zeros({33})), ap = Dev(p), am = Dev(zeros({33})),
         av = Dev(zeros({33})), dg = Dev(g);
  std::vector<float> hp = p.to_vector<float>(), hb(33, 0), ap_h = hp,
                     am_h(33, 0), av_h(33, 0);
  const std::vector<float> hg = g.to_vector<float>();
  for (int64_t t = 1; t <= 3; ++t) {
    sgd.first = t == 1;
    ASSERT_TRUE(SgdStep(*ctx_, sp, dg, sb, sgd).ok());
    const math::AdamParams at = math::AdamForStep(adam, t);
    ASSERT_TRUE(AdamStep(*ctx_, ap, dg, am, av, at).ok());
    for (int i = 0; i < 33; ++i) {
      math::SgdElement(sgd, hp[i], hg[i], hb[i]);
      math::AdamElement(at, ap_h[i], hg[i], am_h[i], av_h[i]);
    }
  }
  ExpectClose(from_vector(hp), sp, "sgd");
  ExpectClose(from_vector(ap_h), ap, "adam");
}

// Double-precision gradient checks of each backward kernel on the GPU.
TEST_F(CudaOpsTest, GradCheckEveryBackwardKernel) {
  Tensor x = randn({3, 4}, 22, DType::kFloat64);
  // Keep ReLU's inputs away from the kink at 0.
  Tensor xr = x.add(from_vector<double>({0.3, -0.3, 0.3, -0.3}, {4}));
  Tensor w = randn({3, 4}, 23, DType::kFloat64);
  Tensor dw = Dev(w);
  for (auto [fwd, bwd, saves_output] :
       {std::tuple{UnaryOp::kRelu, BackwardOp::kRelu, false},
        std::tuple{UnaryOp::kTanh, BackwardOp::kTanh, true},
        std::tuple{UnaryOp::kSigmoid, BackwardOp::kSigmoid, true}}) {
    Tensor in = fwd == UnaryOp::kRelu ? xr : x;
    Tensor din = Dev(in);
    Tensor saved = saves_output ? *Unary(*ctx_, fwd, din) : din;
    GradCheck("unary " + std::to_string(static_cast<int>(fwd)),
              [&, f = fwd](const Tensor& t) { return Unary(*ctx_, f, t); },
              in, w, Host(UnaryBackward(*ctx_, bwd, dw, saved)));
  }
  for (bool log : {false, true}) {
    Tensor y = *Softmax(*ctx_, Dev(x), log);
    GradCheck(log ? "log_softmax" : "softmax",
              [&](const Tensor& t) { return Softmax(*ctx_, t, log); }, x, w,
              Host(SoftmaxBackward(*ctx_, dw, y, log)));
  }
  Tensor target = Dev(from_vector<int64_t>({2, 0, 3}));
  Tensor g = full({}, 0.8, DType::kFloat64);
  absl::StatusOr<CrossEntropyResult> ce = CrossEntropy(*ctx_, Dev(x), target);
  ASSERT_TRUE(ce.ok()) << ce.status();
  GradCheck("cross_entropy",
            [&](const Tensor& t) -> absl::StatusOr<Tensor> {
              absl::StatusOr<CrossEntropyResult> r =
                  CrossEntropy(*ctx_, t, target);
              if (!r.ok()) return r.status();
              return r->loss;
            },
            x, g,
            Host(CrossEntropyBackward(*ctx_, Dev(x), target, ce->lse,
                                      Dev(g))));
  Tensor idx = Dev(from_vector<int64_t>({1, 2, 1, 0, 1}));
  Tensor we = randn({5, 4}, 24, DType::kFloat64);
  GradCheck("embedding",
            [&](const Tensor& t) { return Embedding(*ctx_, t, idx); }, x, we,
            Host(EmbeddingBackward(*ctx_, Dev(we), idx, 3)));
}

TEST_F(CudaOpsTest, GradCheckMatmul) {
  SkipWithoutCublas();
  if (IsSkipped()) return;
  Tensor x = randn({3, 4}, 22, DType::kFloat64);
  // matmul: d(a@b)/da = g b^T, d(a@b)/db = a^T g.
  Tensor b = randn({4, 2}, 25, DType::kFloat64),
         gm = randn({3, 2}, 26, DType::kFloat64);
  Tensor da = Dev(x), db = Dev(b), dgm = Dev(gm);
  GradCheck("matmul a",
            [&](const Tensor& t) { return Matmul(*ctx_, t, db); }, x, gm,
            Host(Matmul(*ctx_, dgm, db, false, true)));
  GradCheck("matmul b",
            [&](const Tensor& t) { return Matmul(*ctx_, da, t); }, b, gm,
            Host(Matmul(*ctx_, da, dgm, true, false)));
}

TEST_F(CudaOpsTest, GeluPowWhereCopyIntoLikeTheCpu) {
  Tensor s = randn({4, 7}, 40), x = rand({4, 7}, 41).add(0.1);
  Tensor ds = Dev(s), dx = Dev(x), w = randn({4, 7}, 42);
  ExpectClose(autograd::gelu(s), Unary(*ctx_, UnaryOp::kGelu, ds), "gelu");
  ExpectClose(CpuGrad(autograd::gelu, s, w),
              UnaryBackward(*ctx_, BackwardOp::kGelu, Dev(w), ds),
              "gelu backward");
  ExpectClose(autograd::pow(x, 2.7), Scalar(*ctx_, BinaryOp::kPow, dx, 2.7),
              "pow");
  const std::vector<bool> row = {true, false, true, true, false, false, true};
  std::vector<bool> rows;
  for (int i = 0; i < 4; ++i) rows.insert(rows.end(), row.begin(), row.end());
  ExpectClose(autograd::where(from_vector<bool>(rows, {4, 7}), s, x),
              Where(*ctx_, Dev(from_vector<bool>(row, {7})), ds, dx),
              "where broadcasting cond");
  // Into a column slice of a zeroed [4, 9]: the rest stays 0.
  Tensor big = *ctx_->Empty({4, 9}, DType::kFloat32, Device::CUDA(0));
  ASSERT_TRUE(Fill(*ctx_, big, 0).ok());
  ASSERT_TRUE(CopyInto(*ctx_, big.slice(1, 1, 8), ds).ok());
  Tensor expected = zeros({4, 9});
  expected.slice(1, 1, 8).copy_(s);
  ExpectClose(expected, big, "copy_into");
}

// float32/float64 <-> float16/bfloat16 round like the CPU's conversions:
// the same bits, not merely close.
TEST_F(CudaOpsTest, CastRoundsLikeTheCpu) {
  const Tensor x = randn({3, 33}, 44).mul(100.0);
  const Tensor x64 = randn({5, 7}, 45, DType::kFloat64);
  for (DType to : {DType::kFloat16, DType::kBFloat16}) {
    for (const Tensor& from : {x, x64}) {
      Tensor h = Host(Cast(*ctx_, Dev(from), to));
      ASSERT_TRUE(h.defined());
      EXPECT_TRUE(h.equal(from.to(to)))
          << DTypeName(from.dtype()) << " -> " << DTypeName(to);
      // And back, exactly (16-bit values are exact in float32).
      Tensor back = Host(Cast(*ctx_, Dev(from.to(to)), DType::kFloat32));
      EXPECT_TRUE(back.equal(from.to(to).to(DType::kFloat32)));
    }
  }
  // A strided source converts in place order.
  ExpectClose(x.t().to(DType::kFloat64),
              Cast(*ctx_, Dev(x).t(), DType::kFloat64), "strided cast", 0, 0);
  EXPECT_EQ(Cast(*ctx_, Dev(from_vector<int64_t>({1, 2})), DType::kFloat32)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(CudaOpsTest, NllLossAndDropoutMask) {
  Tensor lp = randn({5, 4}, 43, DType::kFloat64);
  Tensor target = from_vector<int64_t>({3, 0, 1, 3, 2}, {5});
  Tensor dt = Dev(target);
  ExpectClose(autograd::nll_loss(lp, target), NllLoss(*ctx_, Dev(lp), dt),
              "nll_loss");
  ExpectClose(CpuGrad([&](const Tensor& t) {
                return autograd::nll_loss(t, target);
              }, lp, full({}, 0.7, DType::kFloat64)),
              NllLossBackward(*ctx_, dt, Dev(full({}, 0.7, DType::kFloat64)),
                              4),
              "nll_loss backward");
  GradCheck("nll_loss",
            [&](const Tensor& t) { return NllLoss(*ctx_, t, dt); }, lp,
            full({}, 0.7, DType::kFloat64),
            Host(NllLossBackward(*ctx_, dt,
                                 Dev(full({}, 0.7, DType::kFloat64)), 4)));
  absl::StatusOr<Tensor> bad = NllLoss(*ctx_, Dev(lp),
                                       Dev(from_vector<int64_t>({0, 1, 4, 0, 0})));
  EXPECT_THAT(bad.status().message(), HasSubstr("outside [0, 4)"));
  // The kernel's mask is kernel_math's, element by element (a grid-stride
  // loop over more elements than one launch's threads).
  const int64_t n = 70000;
  Tensor m = Host(DropoutMask(*ctx_, {n}, DType::kFloat32, Device::CUDA(0),
                              0.2, 123, 7));
  ASSERT_TRUE(m.defined());
  const float* pm = m.data<float>();
  int64_t mismatches = 0;
  for (int64_t i = 0; i < n; ++i) {
    mismatches += pm[i] != math::DropoutScale<float>(123, 7 + i, 0.2);
  }
  EXPECT_EQ(mismatches, 0);
}

TEST_F(CudaOpsTest, BadInputIsAStatusNamingTheOp) {
  Tensor a = Dev(randn({2, 3}, 27)), b = Dev(randn({4}, 28));
  absl::StatusOr<Tensor> r = Binary(*ctx_, BinaryOp::kAdd, a, b);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("do not broadcast"));
  EXPECT_THAT(r.status().message(), HasSubstr("[2, 3]"));
  r = Matmul(*ctx_, a, a);  // Checked before cuBLAS is needed.
  EXPECT_THAT(r.status().message(), HasSubstr("inner sizes 3 and 2"));
  Tensor logits = Dev(randn({2, 3}, 29));
  absl::StatusOr<CrossEntropyResult> ce =
      CrossEntropy(*ctx_, logits, Dev(from_vector<int64_t>({0, 3})));
  EXPECT_EQ(ce.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ce.status().message(), HasSubstr("outside [0, 3)"));
  r = Embedding(*ctx_, logits, Dev(from_vector<int64_t>({-1})));
  EXPECT_THAT(r.status().message(), HasSubstr("outside [0, 2)"));
  r = Where(*ctx_, a, a, a);  // cond is not bool.
  EXPECT_THAT(r.status().message(), HasSubstr("cuda where: cond must be bool"));
  absl::Status st = CopyInto(*ctx_, a, b);
  EXPECT_THAT(st.message(), HasSubstr("cuda copy_into: src does not broadcast"));
  r = DropoutMask(*ctx_, {2}, DType::kFloat32, Device::CUDA(0), -0.5, 1, 0);
  EXPECT_THAT(r.status().message(), HasSubstr("dropout_mask: needs p in"));
  r = Binary(*ctx_, BinaryOp::kAdd, a, randn({2, 3}, 30));
  EXPECT_THAT(r.status().message(), HasSubstr("not on a CUDA device"));
  if (ctx_->device_count() >= 2) {
    absl::StatusOr<Tensor> other = ctx_->To(randn({2, 3}, 31),
                                            Device::CUDA(1));
    ASSERT_TRUE(other.ok()) << other.status();
    r = Binary(*ctx_, BinaryOp::kAdd, a, *other);
    EXPECT_THAT(r.status().message(), HasSubstr("different devices"));
  }
}

}  // namespace
}  // namespace cuda
}  // namespace ferry
