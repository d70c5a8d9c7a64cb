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
  // `t` on the CPU.
  Tensor Host(const Tensor& t) {
    absl::StatusOr<Tensor> h = ctx_->To(t, Device::CPU());
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
