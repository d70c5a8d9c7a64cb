// Autograd on device tensors: ops, backward and gradient accumulation
// dispatched through the DeviceOps of the operands' storage, compared with
// CPU autograd. Each test runs on two backends: "host" (FakeDeviceApi
// memory, host loops over kernel_math.h: runs everywhere) and "cuda" (the
// CUDA kernels and cuBLAS: skips without a GPU, naming CUDA's reason).
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "ferry/autograd/engine.h"
#include "ferry/autograd/gradcheck.h"
#include "ferry/autograd/nn.h"
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
namespace nn = ::ferry::nn;

constexpr uint64_t kFakeCapacity = uint64_t{1} << 28;

class AutogradDispatchTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "host") {
      auto c = CreateHostComputeContext(
          std::make_shared<FakeDeviceApi>(2, kFakeCapacity), {});
      ASSERT_TRUE(c.ok()) << c.status();
      ctx_ = *std::move(c);
      return;
    }
    auto c = CreateComputeContext({});
    if (!c.ok()) GTEST_SKIP() << "no CUDA device: " << c.status();
    ctx_ = *std::move(c);
    // cuBLAS is loaded on first use; without it matmul cannot run.
    Tensor a = Dev(ones({1, 1}));
    absl::StatusOr<Tensor> p = ctx_->compute()->Matmul(a, a, false, false);
    if (!p.ok()) GTEST_SKIP() << "cuBLAS unavailable: " << p.status();
  }

  Device dev() const { return Device::CUDA(0); }
  // `t` on cuda:0 (a leaf, without autograd state).
  Tensor Dev(const Tensor& t) {
    absl::StatusOr<Tensor> d = ctx_->To(t, dev());
    EXPECT_TRUE(d.ok()) << d.status();
    return d.ok() ? *d : Tensor();
  }
  // `t` on the CPU (a strided view compacted on the device first).
  Tensor Host(const Tensor& t) {
    absl::StatusOr<Tensor> c =
        t.is_contiguous() ? absl::StatusOr<Tensor>(t)
                          : ctx_->compute()->Unary(math::UnaryOp::kCopy, t);
    EXPECT_TRUE(c.ok()) << c.status();
    if (!c.ok()) return Tensor();
    absl::StatusOr<Tensor> h = ctx_->To(*c, Device::CPU());
    EXPECT_TRUE(h.ok()) << h.status();
    return h.ok() ? *h : Tensor();
  }
  void ExpectClose(const Tensor& cpu, const Tensor& device,
                   const std::string& what, double rtol = 1e-4,
                   double atol = 1e-5) {
    ASSERT_TRUE(device.defined()) << what;
    EXPECT_TRUE(device.device().is_cuda()) << what;
    Tensor h = Host(device);
    ASSERT_EQ(h.sizes(), cpu.sizes()) << what;
    EXPECT_TRUE(h.allclose(cpu, rtol, atol))
        << what << "\ndevice: " << h.ToString(6) << "\ncpu: " << cpu.ToString(6);
  }

  // Runs `f` on CPU leaves and on device copies of them, backward from the
  // sum of f * w (w fixed), and compares the outputs and every gradient.
  void Compare(const std::string& what,
               const std::function<Tensor(const std::vector<Tensor>&)>& f,
               const std::vector<Tensor>& inputs, double rtol = 1e-4,
               double atol = 1e-5) {
    std::vector<Tensor> cpu, device;
    for (const Tensor& x : inputs) {
      cpu.push_back(x.clone());
      device.push_back(Dev(x));
      if (x.dtype() == DType::kFloat32 || x.dtype() == DType::kFloat64) {
        ag::SetRequiresGrad(cpu.back());
        ag::SetRequiresGrad(device.back());
      }
    }
    Tensor yc = f(cpu);
    Tensor yd = f(device);
    ExpectClose(yc, yd, what + " forward", rtol, atol);
    Tensor w = rand(yc.sizes(), 77, yc.dtype()).add(0.5);
    ASSERT_TRUE(ag::Backward({ag::sum(ag::mul(yc, w))}).ok());
    absl::Status s = ag::Backward({ag::sum(ag::mul(yd, Dev(w)))});
    ASSERT_TRUE(s.ok()) << what << ": " << s;
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (!ag::RequiresGrad(cpu[i])) continue;
      Tensor gd = ag::GradOf(device[i]);
      ASSERT_TRUE(gd.defined()) << what << " input " << i << " got no grad";
      ExpectClose(ag::GradOf(cpu[i]), gd,
                  what + " grad of input " + std::to_string(i), rtol, atol);
    }
  }

  std::unique_ptr<CudaContext> ctx_;
};

TEST_P(AutogradDispatchTest, ElementwiseAndBroadcast) {
  const Tensor a = randn({3, 4}, 1), b = randn({3, 4}, 2), bias = randn({4}, 3);
  const Tensor pos = rand({3, 4}, 4).add(0.5);
  Compare("add", [](auto& v) { return ag::add(v[0], v[1]); }, {a, b});
  Compare("sub bcast", [](auto& v) { return ag::sub(v[0], v[1]); }, {a, bias});
  Compare("mul bcast", [](auto& v) { return ag::mul(v[1], v[0]); }, {a, bias});
  Compare("div", [](auto& v) { return ag::div(v[0], v[1]); }, {a, pos});
  Compare("scalars",
          [](auto& v) {
            return ag::div(ag::sub(ag::mul(ag::add(v[0], 2.0), 3.0), 1.0), 4.0);
          },
          {a});
  Compare("neg", [](auto& v) { return ag::neg(v[0]); }, {a});
  Compare("exp", [](auto& v) { return ag::exp(v[0]); }, {a});
  Compare("log", [](auto& v) { return ag::log(v[0]); }, {pos});
  Compare("sqrt", [](auto& v) { return ag::sqrt(v[0]); }, {pos});
  Compare("tanh", [](auto& v) { return ag::tanh(v[0]); }, {a});
  Compare("sigmoid", [](auto& v) { return ag::sigmoid(v[0]); }, {a});
  Compare("relu", [](auto& v) { return ag::relu(v[0]); }, {a});
  Compare("mse_loss", [](auto& v) { return ag::mse_loss(v[0], v[1]); },
          {a, b});
}

TEST_P(AutogradDispatchTest, ReductionsViewsSoftmax) {
  const Tensor a = randn({2, 3, 4}, 5);
  Compare("sum", [](auto& v) { return ag::sum(v[0]); }, {a});
  Compare("mean", [](auto& v) { return ag::mean(v[0]); }, {a});
  Compare("sum dims",
          [](auto& v) { return ag::sum(v[0], {0, 2}, false); }, {a});
  Compare("mean keepdim",
          [](auto& v) { return ag::mean(v[0], {1}, true); }, {a});
  Compare("transpose reshape",
          [](auto& v) {
            return ag::reshape(ag::transpose(v[0], 0, 2), {4, 6});
          },
          {a});
  Compare("softmax", [](auto& v) { return ag::softmax(v[0], -1); }, {a});
  Compare("log_softmax", [](auto& v) { return ag::log_softmax(v[0], 2); },
          {a});
}

TEST_P(AutogradDispatchTest, MlpStepMatchesCpu) {
  // Linear (x W^T + b, W^T a transposed view) -> ReLU -> Linear ->
  // cross-entropy: the ops train_mlp runs.
  const Tensor x = randn({8, 5}, 10), w1 = randn({6, 5}, 11).mul(0.4),
               b1 = randn({6}, 12), w2 = randn({3, 6}, 13).mul(0.4),
               b2 = randn({3}, 14);
  const Tensor y = from_vector<int64_t>({0, 1, 2, 2, 1, 0, 1, 2}, {8});
  Compare("mlp",
          [](auto& v) {
            Tensor h = ag::relu(ag::add(
                ag::matmul(v[0], ag::transpose(v[1], 0, 1)), v[2]));
            Tensor logits =
                ag::add(ag::matmul(h, ag::transpose(v[3], 0, 1)), v[4]);
            return ag::cross_entropy(logits, v[5]);
          },
          {x, w1, b1, w2, b2, y});
  Compare("embedding",
          [](auto& v) { return ag::tanh(ag::embedding(v[0], v[1])); },
          {randn({5, 3}, 17), from_vector<int64_t>({4, 0, 4, 2, 1, 4}, {2, 3})});
  Compare("matmul plain", [](auto& v) { return ag::matmul(v[0], v[1]); },
          {randn({4, 3}, 15), randn({3, 2}, 16)});
}

TEST_P(AutogradDispatchTest, TransformerOpsMatchCpu) {
  // The ops an MLP / transformer block adds to the above: GELU, N-D
  // matmul (x W^T over [B, T, D], attention's batched products), softmax
  // over a non-last dim, cat/stack/slice/select, where, pow, nll_loss.
  const Tensor x = randn({2, 3, 4}, 50), w = randn({5, 4}, 51);
  const Tensor pos = rand({2, 3, 4}, 52).add(0.5);
  Compare("gelu", [](auto& v) { return ag::gelu(v[0]); }, {x});
  Compare("pow 3", [](auto& v) { return ag::pow(v[0], 3.0); }, {x});
  Compare("pow 0.5", [](auto& v) { return ag::pow(v[0], 0.5); }, {pos});
  Compare("pow -1.5", [](auto& v) { return ag::pow(v[0], -1.5); }, {pos});
  Compare("matmul 3-D x W^T",
          [](auto& v) { return ag::matmul(v[0], ag::transpose(v[1], 0, 1)); },
          {x, w});
  Compare("matmul 3-D x 2-D", [](auto& v) { return ag::matmul(v[0], v[1]); },
          {x, randn({4, 2}, 53)});
  Compare("bmm 3-D", [](auto& v) { return ag::matmul(v[0], v[1]); },
          {x, randn({2, 4, 3}, 54)});
  Compare("bmm 4-D (q k^T)",
          [](auto& v) {
            return ag::matmul(v[0], ag::transpose(v[1], 2, 3));
          },
          {randn({2, 2, 3, 4}, 55), randn({2, 2, 5, 4}, 56)});
  // Transposed views go to the batched GEMM as transpose flags (no copy);
  // a permuted (non-swap) view is copied first.
  Compare("bmm a^T b^T",
          [](auto& v) {
            return ag::matmul(ag::transpose(v[0], 1, 2),
                              ag::transpose(v[1], 1, 2));
          },
          {randn({2, 4, 3}, 65), randn({2, 5, 4}, 66)});
  Compare("bmm a^T b",
          [](auto& v) { return ag::matmul(ag::transpose(v[0], 1, 2), v[1]); },
          {randn({2, 4, 3}, 67), randn({2, 4, 5}, 68)});
  Compare("bmm permuted",
          [](auto& v) {
            return ag::matmul(ag::permute(v[0], {1, 0, 2}), v[1]);
          },
          {randn({3, 2, 4}, 69), randn({2, 4, 5}, 71)});
  Compare("softmax dim 0", [](auto& v) { return ag::softmax(v[0], 0); }, {x});
  Compare("softmax dim 1", [](auto& v) { return ag::softmax(v[0], 1); }, {x});
  Compare("log_softmax dim 1",
          [](auto& v) { return ag::log_softmax(v[0], 1); }, {x});
  Compare("cat dim 1",
          [](auto& v) { return ag::cat({v[0], v[1], v[0]}, 1); },
          {x, randn({2, 2, 4}, 57)});
  Compare("cat dim -1", [](auto& v) { return ag::cat({v[0], v[1]}, -1); },
          {x, randn({2, 3, 1}, 58)});
  // cat of index tensors (int64) and masks (bool): the bytes are copied.
  Tensor ids = ag::cat({Dev(from_vector<int64_t>({1, 2, 3, 4}, {2, 2})),
                        Dev(from_vector<int64_t>({5, 6}, {2, 1}))},
                       1);
  EXPECT_EQ(Host(ids).to_vector<int64_t>(),
            (std::vector<int64_t>{1, 2, 5, 3, 4, 6}));
  Tensor mask = ag::cat({Dev(from_vector<bool>({true}, {1})),
                         Dev(from_vector<bool>({false, true}, {2}))},
                        0);
  EXPECT_TRUE(Host(mask).equal(from_vector<bool>({true, false, true}, {3})));
  Compare("stack dim 1", [](auto& v) { return ag::stack({v[0], v[1]}, 1); },
          {x, randn({2, 3, 4}, 59)});
  Compare("slice step 2",
          [](auto& v) { return ag::slice(v[0], 2, 1, 4, 2); }, {x});
  Compare("select", [](auto& v) { return ag::select(v[0], 1, 2); }, {x});
  Compare("narrow and permute",
          [](auto& v) {
            return ag::permute(ag::slice(v[0], 1, 0, 2, 1), {2, 0, 1});
          },
          {x});
  const Tensor cond = from_vector<bool>(
      {true, false, false, true, true, false, true, true, false, false, true,
       false},
      {3, 4});
  Compare("where", [](auto& v) { return ag::where(v[2], v[0], v[1]); },
          {randn({3, 4}, 60), randn({3, 4}, 61), cond});
  Compare("nll_loss(log_softmax)",
          [](auto& v) { return ag::nll_loss(ag::log_softmax(v[0], 1), v[1]); },
          {randn({5, 4}, 62), from_vector<int64_t>({3, 0, 1, 3, 2}, {5})});
  // A transformer-style block: LN-free attention, GELU MLP, residuals.
  Compare("attention block",
          [](auto& v) {
            Tensor q = ag::matmul(v[0], ag::transpose(v[1], 0, 1));
            Tensor att = ag::softmax(
                ag::div(ag::matmul(q, ag::transpose(v[0], 1, 2)), 2.0), -1);
            Tensor h = ag::add(v[0], ag::matmul(att, v[0]));
            return ag::add(h, ag::gelu(ag::matmul(h, v[2])));
          },
          {x, randn({4, 4}, 63).mul(0.5), randn({4, 4}, 64).mul(0.5)});
}

TEST_P(AutogradDispatchTest, DropoutUsesThePhiloxMask) {
  // The backend's mask is math::DropoutScale at each position (so a CUDA
  // kernel and the host backend draw the same mask from one seed).
  DeviceOps* ops = ctx_->compute();
  absl::StatusOr<Tensor> m =
      ops->DropoutMask({40, 50}, DType::kFloat32, dev(), 0.3, 9, 0);
  ASSERT_TRUE(m.ok()) << m.status();
  const std::vector<float> mask = Host(*m).to_vector<float>();
  std::vector<float> expected(mask.size());
  int kept = 0;
  for (size_t i = 0; i < mask.size(); ++i) {
    expected[i] = math::DropoutScale<float>(9, i, 0.3);
    kept += expected[i] != 0;
  }
  EXPECT_EQ(mask, expected);
  EXPECT_NEAR(kept / 2000.0, 0.7, 0.04);
  // An offset continues the same stream.
  absl::StatusOr<Tensor> shifted =
      ops->DropoutMask({10}, DType::kFloat64, dev(), 0.3, 9, 1990);
  ASSERT_TRUE(shifted.ok()) << shifted.status();
  const std::vector<double> tail = Host(*shifted).to_vector<double>();
  for (size_t i = 0; i < tail.size(); ++i) {
    EXPECT_EQ(tail[i] != 0, mask[1990 + i] != 0) << i;
  }
  // autograd's dropout on the device: a * mask, gradient mask * g.
  const Tensor a = randn({40, 50}, 70);
  Tensor ad = Dev(a);
  ag::SetRequiresGrad(ad);
  Tensor y = ag::dropout(ad, 0.3, /*training=*/true, /*seed=*/9);
  const Tensor mask_cpu = from_vector<float>(expected, {40, 50});
  ExpectClose(a.mul(mask_cpu), y, "dropout forward", 1e-6, 1e-7);
  ASSERT_TRUE(ag::Backward({ag::sum(y)}).ok());
  ExpectClose(mask_cpu, ag::GradOf(ad), "dropout grad", 1e-6, 1e-7);
  // Not training, p = 0: the input itself; p = 1: zeros.
  EXPECT_TRUE(ag::dropout(ad, 0.3, false, 9).is_same(ad));
  ExpectClose(zeros({40, 50}), ag::dropout(ad, 1.0, true, 9), "p = 1");
  absl::StatusOr<Tensor> bad =
      ops->DropoutMask({2}, DType::kFloat32, dev(), 1.5, 9, 0);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("dropout_mask"), std::string::npos)
      << bad.status();
}

TEST_P(AutogradDispatchTest, GradientsAccumulateOnDevice) {
  Tensor w = Dev(randn({3, 2}, 20));
  ag::SetRequiresGrad(w);
  // Used twice in one graph (the engine sums on the device) ...
  Tensor loss = ag::sum(ag::add(ag::mul(w, 3.0), ag::mul(w, w)));
  ASSERT_TRUE(ag::Backward({loss}).ok());
  // ... and a second pass adds into .grad on the device.
  ASSERT_TRUE(ag::Backward({ag::sum(ag::mul(w, 3.0))}).ok());
  Tensor g = ag::GradOf(w);
  ASSERT_TRUE(g.defined());
  EXPECT_TRUE(g.device().is_cuda());
  Tensor hw = Host(w);
  ExpectClose(hw.mul(2.0).add(6.0), g, "accumulated grad");
}

TEST_P(AutogradDispatchTest, DoubleGradcheckThroughTo) {
  // Inputs on the CPU in float64; f copies them to the device (to() is
  // differentiable), computes there and copies back, so GradCheck's
  // backward runs every device backward in between.
  DeviceOps* ops = ctx_->compute();
  const Device d = dev();
  auto on_dev = [ops, d](const Tensor& t) { return ag::to(t, d, ops); };
  auto back = [](const Tensor& t) { return ag::to(t, Device::CPU()); };
  struct Case {
    const char* name;
    ag::GradCheckFn f;
    std::vector<Tensor> inputs;
  };
  const std::vector<Case> cases = {
      {"mul bcast",
       [&](const std::vector<Tensor>& v) {
         return back(ag::mul(on_dev(v[0]), on_dev(v[1])));
       },
       {randn({2, 3}, 30, DType::kFloat64), randn({3}, 31, DType::kFloat64)}},
      {"div",
       [&](const std::vector<Tensor>& v) {
         return back(ag::div(on_dev(v[0]), on_dev(v[1])));
       },
       {randn({2, 3}, 32, DType::kFloat64),
        rand({2, 3}, 33, DType::kFloat64).add(1.0)}},
      {"tanh sigmoid exp",
       [&](const std::vector<Tensor>& v) {
         Tensor x = on_dev(v[0]);
         return back(ag::add(ag::tanh(x), ag::sigmoid(ag::exp(x))));
       },
       {randn({2, 3}, 34, DType::kFloat64)}},
      {"matmul transposed",
       [&](const std::vector<Tensor>& v) {
         return back(ag::matmul(on_dev(v[0]),
                                ag::transpose(on_dev(v[1]), 0, 1)));
       },
       {randn({3, 4}, 35, DType::kFloat64), randn({2, 4}, 36, DType::kFloat64)}},
      {"softmax log_softmax",
       [&](const std::vector<Tensor>& v) {
         Tensor x = on_dev(v[0]);
         return back(ag::add(ag::softmax(x, 1), ag::log_softmax(x, 1)));
       },
       {randn({3, 4}, 37, DType::kFloat64)}},
      {"cross_entropy",
       [&](const std::vector<Tensor>& v) {
         return back(ag::cross_entropy(on_dev(v[0]), on_dev(v[1])));
       },
       {randn({4, 3}, 38, DType::kFloat64),
        from_vector<int64_t>({2, 0, 1, 2}, {4})}},
      {"sum dims sqrt log",
       [&](const std::vector<Tensor>& v) {
         Tensor x = on_dev(v[0]);
         return back(ag::sum(ag::log(ag::sqrt(x)), {1}, true));
       },
       {rand({3, 4}, 39, DType::kFloat64).add(0.5)}},
      {"gelu pow",
       [&](const std::vector<Tensor>& v) {
         Tensor x = on_dev(v[0]);
         return back(ag::add(ag::gelu(x), ag::pow(ag::exp(x), 1.5)));
       },
       {randn({2, 3}, 80, DType::kFloat64)}},
      {"matmul 3-D x W^T, bmm",
       [&](const std::vector<Tensor>& v) {
         Tensor x = on_dev(v[0]);
         Tensor q = ag::matmul(x, ag::transpose(on_dev(v[1]), 0, 1));
         return back(ag::matmul(q, ag::transpose(x, 1, 2)));
       },
       {randn({2, 3, 4}, 81, DType::kFloat64),
        randn({4, 4}, 82, DType::kFloat64)}},
      {"softmax dim 0, log_softmax dim 1",
       [&](const std::vector<Tensor>& v) {
         Tensor x = on_dev(v[0]);
         return back(ag::add(ag::softmax(x, 0), ag::log_softmax(x, 1)));
       },
       {randn({3, 4, 2}, 83, DType::kFloat64)}},
      {"cat stack slice select",
       [&](const std::vector<Tensor>& v) {
         Tensor a = on_dev(v[0]), b = on_dev(v[1]);
         Tensor c = ag::cat({a, ag::slice(b, 1, 0, 3, 2)}, 1);
         return back(ag::stack({ag::select(c, 0, 1), ag::select(c, 0, 0)}, 0));
       },
       {randn({2, 3}, 84, DType::kFloat64), randn({2, 4}, 85, DType::kFloat64)}},
      {"where",
       [&](const std::vector<Tensor>& v) {
         return back(ag::where(on_dev(v[2]), on_dev(v[0]), on_dev(v[1])));
       },
       {randn({2, 3}, 86, DType::kFloat64), randn({2, 3}, 87, DType::kFloat64),
        from_vector<bool>({true, false, true, true, false, false}, {2, 3})}},
      {"nll_loss",
       [&](const std::vector<Tensor>& v) {
         return back(
             ag::nll_loss(ag::log_softmax(on_dev(v[0]), 1), on_dev(v[1])));
       },
       {randn({4, 3}, 88, DType::kFloat64),
        from_vector<int64_t>({1, 0, 2, 2}, {4})}},
      {"dropout (fixed seed)",
       [&](const std::vector<Tensor>& v) {
         return back(ag::dropout(on_dev(v[0]), 0.4, true, 5));
       },
       {randn({3, 4}, 89, DType::kFloat64)}},
  };
  for (const Case& c : cases) {
    absl::Status s = ag::GradCheck(c.name, c.f, c.inputs);
    EXPECT_TRUE(s.ok()) << s;
  }
}

TEST_P(AutogradDispatchTest, OptimizerStepsMatchHostRules) {
  // The backend's SGD (momentum) and AdamW steps against kernel_math's
  // per-element rules applied on the CPU.
  const Tensor p0 = randn({5}, 40), g0 = randn({5}, 41);
  math::SgdParams sgd{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01};
  Tensor p = Dev(p0), buf = Dev(zeros({5}));
  ASSERT_TRUE(ctx_->compute()->SgdStep(p, Dev(g0), buf, sgd).ok());
  std::vector<float> ep = p0.to_vector<float>(), eg = g0.to_vector<float>();
  std::vector<float> eb(5, 0);
  for (int i = 0; i < 5; ++i) math::SgdElement(sgd, ep[i], eg[i], eb[i]);
  ExpectClose(from_vector<float>(ep), p, "sgd param", 1e-6, 1e-7);
  ExpectClose(from_vector<float>(eb), buf, "sgd buf", 1e-6, 1e-7);

  const math::AdamParams adam = math::AdamForStep(
      {.lr = 0.01, .weight_decay = 0.1, .decoupled = true}, 1);
  Tensor q = Dev(p0), m = Dev(zeros({5})), v = Dev(zeros({5}));
  ASSERT_TRUE(ctx_->compute()->AdamStep(q, Dev(g0), m, v, adam).ok());
  std::vector<float> eq = p0.to_vector<float>(), em(5, 0), ev(5, 0);
  for (int i = 0; i < 5; ++i) math::AdamElement(adam, eq[i], eg[i], em[i], ev[i]);
  ExpectClose(from_vector<float>(eq), q, "adamw param", 1e-6, 1e-7);
  ExpectClose(from_vector<float>(ev), v, "adamw exp_avg_sq", 1e-6, 1e-7);
}

TEST_P(AutogradDispatchTest, BadInputNamesOpAndDevices) {
  // CUDA does not survive fork(): each death test re-runs this binary in a
  // fresh process instead of forking this one (which has a CUDA context).
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Tensor d = Dev(ones({2, 2}));
  Tensor c = ones({2, 2});
  EXPECT_DEATH(ag::add(d, c),
               "add: operands on different devices \\(float32 \\[2, 2\\] on "
               "cuda:0, float32 \\[2, 2\\] on cpu\\)");
  EXPECT_DEATH(ag::matmul(c, d), "matmul: operands on different devices");
  // A target outside [0, C): a Status from the backend, aborting the
  // forward with the op's name.
  EXPECT_DEATH(ag::cross_entropy(Dev(ones({2, 3})),
                                 Dev(from_vector<int64_t>({0, 3}, {2}))),
               "cross_entropy: .*outside \\[0, 3\\)");
  EXPECT_DEATH(ag::embedding(Dev(ones({3, 2})),
                             Dev(from_vector<int64_t>({1, 3}, {2}))),
               "embedding: .*outside \\[0, 3\\)");
  EXPECT_DEATH(ag::nll_loss(Dev(ones({2, 3})),
                            Dev(from_vector<int64_t>({0, 3}, {2}))),
               "nll_loss: .*outside \\[0, 3\\)");
  EXPECT_DEATH(ag::matmul(Dev(ones({2, 3, 4})), Dev(ones({3, 4, 2}))),
               "matmul: batch dims must match \\(float32 \\[2, 3, 4\\] on "
               "cuda:0, float32 \\[3, 4, 2\\] on cuda:0\\)");
  EXPECT_DEATH(ag::matmul(Dev(ones({2, 3, 4})), Dev(ones({3, 2}))),
               "matmul: inner sizes 4 and 3 differ");
  EXPECT_DEATH(ag::where(from_vector<bool>({true, false}, {2}),
                         Dev(ones({2})), Dev(ones({2}))),
               "where: operands on different devices \\(bool \\[2\\] on cpu");
  EXPECT_DEATH(ag::where(Dev(ones({2})), Dev(ones({2})), Dev(ones({2}))),
               "where: expected a bool cond");
  EXPECT_DEATH(ag::cat({Dev(ones({2})), ones({2})}, 0),
               "cat: operands on different devices");
  EXPECT_DEATH(ag::softmax(Dev(ones({2, 3})), 2),
               "softmax: dimension 2 out of range");
  // Wrong dtypes: the backend's Status, naming the op and the operands.
  EXPECT_DEATH(ag::gelu(Dev(from_vector<int64_t>({1, 2}))),
               "gelu: .*(dtype|float32 or float64).*int64 \\[2\\] on cuda:0");
  EXPECT_DEATH(ag::where(Dev(from_vector<bool>({true, false})),
                         Dev(ones({2})), Dev(ones({2}, DType::kFloat64))),
               "where: .*dtype.*float64 \\[2\\] on cuda:0");
  EXPECT_DEATH(ag::nll_loss(Dev(ones({2, 3})), Dev(ones({2}))),
               "nll_loss: .*(dtype|int64).*float32 \\[2\\] on cuda:0");
  // A gradient on the wrong device for the root.
  Tensor w = Dev(ones({2}));
  ag::SetRequiresGrad(w);
  absl::Status s = ag::Backward({ag::mul(w, 2.0)}, {ones({2})});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("on cpu for root 0 [2] float32 on cuda:0"),
            std::string::npos)
      << s;
}

TEST(AutogradDispatchHostOnly, ModuleToCudaNeedsABackend) {
  nn::Linear layer(2, 2, 1);
  absl::Status s = layer.to(Device::CUDA(0));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("no compute backend to move parameter 'weight' "
                             "(float32 [2, 2] on cpu) to cuda:0"),
            std::string::npos)
      << s;
}

TEST(AutogradDispatchHostOnly, TwoDevicesAndDestroyedContext) {
  auto c = CreateHostComputeContext(
      std::make_shared<FakeDeviceApi>(2, kFakeCapacity), {});
  ASSERT_TRUE(c.ok()) << c.status();
  std::unique_ptr<CudaContext> ctx = *std::move(c);
  Tensor a = *ctx->To(ones({3}), Device::CUDA(0));
  Tensor b = *ctx->To(ones({3}), Device::CUDA(1));
  EXPECT_DEATH(ag::mul(a, b),
               "mul: operands on different devices \\(float32 \\[3\\] on "
               "cuda:0, float32 \\[3\\] on cuda:1\\)");
  EXPECT_DEATH(ag::to(ones({3}), Device::CUDA(2), ctx->compute()),
               "to: .*cuda:2 is not one of the 2 fake devices");
  // The storage outlives the context: ops on it fail, naming the reason.
  ctx.reset();
  EXPECT_DEATH(ag::relu(a), "relu: .*the CudaContext that made the operands "
                            "is gone");
}

INSTANTIATE_TEST_SUITE_P(Backends, AutogradDispatchTest,
                         ::testing::Values("host", "cuda"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace cuda
}  // namespace ferry
