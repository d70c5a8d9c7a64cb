// Trains an MLP on seeded Gaussian clusters and checks it reaches
// --target_accuracy on held-out points (exit status 1 otherwise).
//   bazel run --config=opt //examples/train_mlp -- --steps=400
//   ... -- --device=cuda   (on a GPU; without one it exits 2 naming CUDA's
//   reason)
#include <iostream>
#include <memory>
#include <string>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "ferry/examples/train_mlp/train_mlp.h"
#ifdef FERRY_TRAIN_MLP_CUDA
#include "ferry/tensor/cuda/ops.h"
#endif

ABSL_FLAG(int64_t, steps, 400, "training steps");
ABSL_FLAG(int64_t, batch, 64, "batch size");
ABSL_FLAG(int64_t, hidden, 64, "hidden width");
ABSL_FLAG(uint64_t, seed, 1, "seed for data and initialization");
ABSL_FLAG(std::string, device, "cpu", "cpu, or cuda[:N] (a CUDA GPU)");
ABSL_FLAG(double, target_accuracy, 0.95, "held-out accuracy to reach");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  ferry::examples::MlpConfig c;
  c.steps = absl::GetFlag(FLAGS_steps);
  c.batch = absl::GetFlag(FLAGS_batch);
  c.hidden = absl::GetFlag(FLAGS_hidden);
  c.seed = absl::GetFlag(FLAGS_seed);
  const std::string device = absl::GetFlag(FLAGS_device);
  if (device != "cpu") {
    int index = 0;
    if (device != "cuda" &&
        (device.rfind("cuda:", 0) != 0 ||
         !absl::SimpleAtoi(device.substr(5), &index))) {
      std::cerr << "train_mlp: --device=" << device
                << " is not cpu, cuda or cuda:N\n";
      return 2;
    }
    c.device = ferry::Device::CUDA(index);
  }
#ifdef FERRY_TRAIN_MLP_CUDA
  std::unique_ptr<ferry::cuda::CudaContext> ctx;
  if (c.device.is_cuda()) {
    auto made = ferry::cuda::CreateComputeContext({});
    if (!made.ok()) {
      std::cerr << "train_mlp: --device=" << device << ": " << made.status()
                << "\n";
      return 2;
    }
    ctx = *std::move(made);
    c.device_ops = ctx->compute();
  }
#else
  if (c.device.is_cuda()) {
    std::cerr << "train_mlp: --device=" << device
              << ": this binary was built without CUDA\n";
    return 2;
  }
#endif
  auto r = ferry::examples::TrainMlp(c, &std::cout);
  if (!r.ok()) {
    std::cerr << "train_mlp: " << r.status() << "\n";
    return 2;
  }
  const double target = absl::GetFlag(FLAGS_target_accuracy);
  std::cout << "held-out accuracy " << r->test_accuracy << " (target " << target
            << ")\n";
  return r->test_accuracy >= target ? 0 : 1;
}
