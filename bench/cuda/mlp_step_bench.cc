// One training step of an MLP (Linear-ReLU-...-Linear, cross-entropy, SGD)
// on a CUDA device through autograd's device dispatch: forward, backward
// and the optimizer step, timed per step after a device synchronization.
// bench/cuda/torch_mlp_step.py times PyTorch's same step; tools/gpu_check
// runs both (step mlp_bench), in float32 and bfloat16. Without a GPU it
// exits 2 naming CUDA's reason. --dtype=bf16 (or fp16) makes the
// parameters, the input and every activation and gradient 16-bit (pure
// 16-bit training: cuBLAS accumulates in float32, the other kernels compute
// in float32; no float32 master weights), like PyTorch's model.to(dtype).
//   mlp_step_bench [--dims=4096,4096,4096,10] [--batch=256] [--steps=30]
//                  [--dtype=fp32|bf16|fp16]
#include <chrono>
#include <cstdint>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "ferry/autograd/engine.h"
#include "ferry/autograd/nn.h"
#include "ferry/autograd/ops.h"
#include "ferry/optim/optim.h"
#include "ferry/tensor/cuda/ops.h"

ABSL_FLAG(std::string, dims, "4096,4096,4096,10",
          "input width, hidden widths, classes");
ABSL_FLAG(int64_t, batch, 256, "batch size");
ABSL_FLAG(int64_t, steps, 30, "timed steps (after 5 warm-up steps)");
ABSL_FLAG(std::string, dtype, "fp32",
          "parameter and activation dtype: fp32, bf16 or fp16 (or float32, "
          "bfloat16, float16)");

namespace {

namespace ag = ::ferry::autograd;
namespace nn = ::ferry::nn;
using ferry::Device;
using ferry::Tensor;

int Run() {
  std::vector<int64_t> dims;
  for (absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_dims), ',')) {
    int64_t d = 0;
    if (!absl::SimpleAtoi(part, &d) || d <= 0) {
      std::cerr << "mlp_step_bench: bad --dims entry '" << part << "'\n";
      return 2;
    }
    dims.push_back(d);
  }
  const int64_t batch = absl::GetFlag(FLAGS_batch);
  const int64_t steps = absl::GetFlag(FLAGS_steps);
  if (dims.size() < 2 || batch <= 0 || steps <= 0) {
    std::cerr << "mlp_step_bench: needs two or more --dims, positive "
                 "--batch and --steps\n";
    return 2;
  }
  const std::string dtype_flag = absl::GetFlag(FLAGS_dtype);
  ferry::DType dtype;
  if (dtype_flag == "fp32" || dtype_flag == "float32") {
    dtype = ferry::DType::kFloat32;
  } else if (dtype_flag == "bf16" || dtype_flag == "bfloat16") {
    dtype = ferry::DType::kBFloat16;
  } else if (dtype_flag == "fp16" || dtype_flag == "float16") {
    dtype = ferry::DType::kFloat16;
  } else {
    std::cerr << "mlp_step_bench: --dtype '" << dtype_flag
              << "' is not fp32, bf16 or fp16\n";
    return 2;
  }
  auto made = ferry::cuda::CreateComputeContext({});
  if (!made.ok()) {
    std::cerr << "mlp_step_bench: " << made.status() << "\n";
    return 2;
  }
  std::unique_ptr<ferry::cuda::CudaContext> ctx = *std::move(made);
  const Device dev = Device::CUDA(0);
  nn::Sequential model;
  for (size_t i = 0; i + 1 < dims.size(); ++i) {
    model.Append(std::make_shared<nn::Linear>(dims[i], dims[i + 1], 10 + i,
                                              /*bias=*/true, dtype));
    if (i + 2 < dims.size()) model.Append(std::make_shared<nn::ReLU>());
  }
  if (absl::Status s = model.to(dev, ctx->compute()); !s.ok()) {
    std::cerr << "mlp_step_bench: " << s << "\n";
    return 1;
  }
  std::vector<int64_t> labels(batch);
  for (int64_t i = 0; i < batch; ++i) labels[i] = i % dims.back();
  absl::StatusOr<Tensor> x =
      ctx->To(ferry::randn({batch, dims[0]}, 1).to(dtype), dev);
  absl::StatusOr<Tensor> y =
      ctx->To(ferry::from_vector<int64_t>(labels, {batch}), dev);
  if (!x.ok() || !y.ok()) {
    std::cerr << "mlp_step_bench: " << (x.ok() ? y.status() : x.status())
              << "\n";
    return 1;
  }
  ferry::optim::SGD sgd(model.parameters(), {.lr = 0.01, .momentum = 0.9});
  auto step = [&]() -> absl::Status {
    sgd.ZeroGrad();
    Tensor loss = ag::cross_entropy(model.Forward(*x), *y);
    if (absl::Status s = ag::Backward({loss}); !s.ok()) return s;
    return sgd.Step();
  };
  // `n` steps, then a wait for the device to finish them.
  auto run = [&](int64_t n) -> absl::Status {
    for (int64_t i = 0; i < n; ++i) {
      if (absl::Status s = step(); !s.ok()) return s;
    }
    return ctx->Synchronize(dev);
  };
  if (absl::Status s = run(5); !s.ok()) {
    std::cerr << "mlp_step_bench: warm-up: " << s << "\n";
    return 1;
  }
  const auto t0 = std::chrono::steady_clock::now();
  if (absl::Status s = run(steps); !s.ok()) {
    std::cerr << "mlp_step_bench: " << s << "\n";
    return 1;
  }
  const double ms = std::chrono::duration<double, std::milli>(
                        std::chrono::steady_clock::now() - t0)
                        .count() /
                    static_cast<double>(steps);
  std::cout << "{\"impl\": \"ferry\", \"dims\": \"" << absl::GetFlag(FLAGS_dims)
            << "\", \"batch\": " << batch << ", \"dtype\": \""
            << ferry::DTypeName(dtype) << "\", "
            << "\"ms_per_step\": " << ms << "}\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return Run();
}
