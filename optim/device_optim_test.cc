// Module::to and the optimizers' device steps (Adam, SGD with momentum,
// Adagrad, three steps each)
// against the same model trained on the CPU: over the host-executing fake
// backend (runs everywhere) and over CUDA (skips without a GPU, naming
// CUDA's reason).
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "ferry/autograd/engine.h"
#include "ferry/autograd/nn.h"
#include "ferry/autograd/node.h"
#include "ferry/autograd/ops.h"
#include "ferry/optim/optim.h"
#include "ferry/tensor/cuda/fake_device_api.h"
#include "ferry/tensor/cuda/host_ops.h"
#include "ferry/tensor/cuda/ops.h"
#include "gtest/gtest.h"

namespace ferry::optim {
namespace {

namespace ag = ::ferry::autograd;

class DeviceOptimTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<cuda::CudaContext>> c =
        GetParam() == "host"
            ? cuda::CreateHostComputeContext(
                  std::make_shared<cuda::FakeDeviceApi>(1, uint64_t{1} << 26),
                  {})
            : cuda::CreateComputeContext({});
    if (!c.ok() && GetParam() == "cuda") {
      GTEST_SKIP() << "no CUDA device: " << c.status();
    }
    ASSERT_TRUE(c.ok()) << c.status();
    ctx_ = *std::move(c);
  }
  Tensor Dev(const Tensor& t) { return *ctx_->To(t, Device::CUDA(0)); }

  std::unique_ptr<cuda::CudaContext> ctx_;
};

TEST_P(DeviceOptimTest, ModuleToAndOptimizersMatchCpu) {
  // Two copies of one model: one stays on the CPU, one moves to the device;
  // three Adam, then SGD, then Adagrad steps on each give the same
  // parameters.
  auto make = [] {
    auto m = std::make_shared<nn::Sequential>(
        std::vector<std::shared_ptr<nn::Module>>{
            std::make_shared<nn::Linear>(4, 5, 50), std::make_shared<nn::Tanh>(),
            std::make_shared<nn::Linear>(5, 3, 52)});
    return m;
  };
  auto cpu = make(), device = make();
  ASSERT_TRUE(device->to(Device::CUDA(0), ctx_->compute()).ok());
  for (const Tensor& p : device->parameters()) {
    EXPECT_EQ(p.device(), Device::CUDA(0));
    EXPECT_TRUE(ag::RequiresGrad(p));
  }
  const Tensor x = randn({6, 4}, 53);
  const Tensor y = from_vector<int64_t>({0, 1, 2, 0, 1, 2}, {6});
  const Tensor xd = Dev(x), yd = Dev(y);
  optim::Adam adam_c(cpu->parameters(), {.lr = 0.05, .weight_decay = 0.01});
  optim::Adam adam_d(device->parameters(), {.lr = 0.05, .weight_decay = 0.01});
  optim::SGD sgd_c(cpu->parameters(), {.lr = 0.1, .momentum = 0.9});
  optim::SGD sgd_d(device->parameters(), {.lr = 0.1, .momentum = 0.9});
  const AdagradOptions ago{.lr = 0.1, .lr_decay = 0.01, .weight_decay = 0.01,
                           .initial_accumulator_value = 0.1};
  optim::Adagrad adagrad_c(cpu->parameters(), ago);
  optim::Adagrad adagrad_d(device->parameters(), ago);
  optim::Optimizer* on_cpu[] = {&adam_c, &sgd_c, &adagrad_c};
  optim::Optimizer* on_device[] = {&adam_d, &sgd_d, &adagrad_d};
  for (int step = 0; step < 9; ++step) {
    optim::Optimizer& oc = *on_cpu[step / 3];
    optim::Optimizer& od = *on_device[step / 3];
    oc.ZeroGrad();
    od.ZeroGrad();
    ASSERT_TRUE(ag::Backward({ag::cross_entropy(cpu->Forward(x), y)}).ok());
    ASSERT_TRUE(
        ag::Backward({ag::cross_entropy(device->Forward(xd), yd)}).ok());
    ASSERT_TRUE(oc.Step().ok());
    absl::Status s = od.Step();
    ASSERT_TRUE(s.ok()) << s;
  }
  const auto pc = cpu->named_parameters(), pd = device->named_parameters();
  ASSERT_EQ(pc.size(), pd.size());
  for (size_t i = 0; i < pc.size(); ++i) {
    absl::StatusOr<Tensor> h = ctx_->To(pd[i].second, Device::CPU());
    ASSERT_TRUE(h.ok()) << h.status();
    EXPECT_TRUE(h->allclose(pc[i].second, 1e-4, 1e-5))
        << pc[i].first << "\ndevice: " << h->ToString(6)
        << "\ncpu: " << pc[i].second.ToString(6);
  }
  // And back to the CPU through the parameters' own backend.
  ASSERT_TRUE(device->to(Device::CPU()).ok());
  EXPECT_TRUE(device->parameters()[0].device().is_cpu());
  EXPECT_TRUE(device->Forward(x).allclose(cpu->Forward(x), 1e-4, 1e-5));
}

INSTANTIATE_TEST_SUITE_P(Backends, DeviceOptimTest,
                         ::testing::Values("host", "cuda"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace ferry::optim
