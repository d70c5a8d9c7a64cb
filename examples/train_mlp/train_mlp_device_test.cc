// train_mlp on "cuda:0" tensors of the host-executing fake backend
// (tensor/cuda/host_ops.h): the data, parameters, autograd and SGD steps
// all go through the device dispatch, and the run matches the CPU run.
#include <memory>

#include "ferry/examples/train_mlp/train_mlp.h"
#include "ferry/tensor/cuda/fake_device_api.h"
#include "ferry/tensor/cuda/host_ops.h"
#include "gtest/gtest.h"

namespace ferry::examples {
namespace {

TEST(TrainMlpDeviceTest, FakeDeviceRunMatchesCpuRun) {
  auto ctx = cuda::CreateHostComputeContext(
      std::make_shared<cuda::FakeDeviceApi>(1, uint64_t{1} << 28), {});
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  MlpConfig c;
  c.steps = 100;
  c.log_every = 0;
  absl::StatusOr<MlpResult> cpu = TrainMlp(c, nullptr);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  c.device = Device::CUDA(0);
  c.device_ops = (*ctx)->compute();
  absl::StatusOr<MlpResult> dev = TrainMlp(c, nullptr);
  ASSERT_TRUE(dev.ok()) << dev.status();
  EXPECT_GE(dev->test_accuracy, 0.9);
  EXPECT_NEAR(dev->test_accuracy, cpu->test_accuracy, 0.01);
  EXPECT_NEAR(dev->final_loss, cpu->final_loss, 1e-3 + 1e-2 * cpu->final_loss);
}

TEST(TrainMlpDeviceTest, CudaWithoutBackendIsAnError) {
  MlpConfig c;
  c.device = Device::CUDA(0);
  absl::StatusOr<MlpResult> r = TrainMlp(c, nullptr);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("cuda:0 needs a compute backend"),
            std::string::npos)
      << r.status();
}

}  // namespace
}  // namespace ferry::examples
