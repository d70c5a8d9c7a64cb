// Per-op overhead of tiny CUDA ops: a chain of launch-bound elementwise ops
// (add a scalar, multiply by a tensor, ReLU, repeated) on a small float32
// tensor of cuda:0, timed per op after a device synchronization, in two
// modes: no_grad (forward only) and autograd (the chain's forward, then its
// backward from the sum: per op, one forward and its backward). Beside it
// the launch floor: one cudaMemsetAsync per "op" on the same stream (the
// cheapest device operation the runtime queues). bench/cuda/
// torch_op_overhead.py times PyTorch's same chains; tools/gpu_check runs both
// (step op_bench). Without a GPU it exits 2 naming CUDA's reason.
//   op_overhead_bench [--elements=256] [--chain=300] [--reps=5]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "ferry/autograd/engine.h"
#include "ferry/autograd/grad_mode.h"
#include "ferry/autograd/node.h"
#include "ferry/autograd/ops.h"
#include "ferry/tensor/cuda/ops.h"

ABSL_FLAG(int64_t, elements, 256, "elements of the tensor each op touches");
ABSL_FLAG(int64_t, chain, 300, "ops per timed chain (a multiple of 3)");
ABSL_FLAG(int64_t, reps, 5, "timed chains; the best is reported");

namespace {

namespace ag = ::ferry::autograd;
using ferry::Device;
using ferry::Tensor;

// Microseconds per op of the best of `reps` runs of `run` (which queues
// `chain` ops and returns once the device finished them).
double BestPerOp(int64_t reps, int64_t chain,
                 const std::function<absl::Status()>& run, absl::Status* err) {
  double best = 1e300;
  for (int64_t r = 0; r < reps && err->ok(); ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    *err = run();
    const double us = std::chrono::duration<double, std::micro>(
                          std::chrono::steady_clock::now() - t0)
                          .count();
    best = std::min(best, us / static_cast<double>(chain));
  }
  return best;
}

void Print(const char* mode, int64_t elements, int64_t chain, double us) {
  std::printf(
      "{\"bench\": \"cuda_op_overhead\", \"impl\": \"%s\", \"mode\": \"%s\", "
      "\"elements\": %lld, \"chain\": %lld, \"us_per_op\": %.3f}\n",
      std::string(mode) == "launch_floor" ? "cuda" : "ferry", mode,
      static_cast<long long>(elements), static_cast<long long>(chain), us);
}

int Run() {
  const int64_t elements = absl::GetFlag(FLAGS_elements);
  const int64_t chain = absl::GetFlag(FLAGS_chain) / 3 * 3;
  const int64_t reps = absl::GetFlag(FLAGS_reps);
  if (elements <= 0 || chain <= 0 || reps <= 0) {
    std::fprintf(stderr,
                 "op_overhead_bench: --elements, --chain (>= 3) and --reps "
                 "must be positive\n");
    return 2;
  }
  auto made = ferry::cuda::CreateComputeContext({});
  if (!made.ok()) {
    std::fprintf(stderr, "op_overhead_bench: %s\n",
                 made.status().ToString().c_str());
    return 2;
  }
  std::unique_ptr<ferry::cuda::CudaContext> ctx = *std::move(made);
  const Device dev = Device::CUDA(0);
  absl::StatusOr<Tensor> x = ctx->To(ferry::randn({elements}, 1), dev);
  absl::StatusOr<Tensor> w = ctx->To(ferry::randn({elements}, 2), dev);
  if (!x.ok() || !w.ok()) {
    std::fprintf(stderr, "op_overhead_bench: %s\n",
                 (x.ok() ? w.status() : x.status()).ToString().c_str());
    return 1;
  }
  // The chain: (y + 0.5) * w, ReLU, chain / 3 times.
  auto forward = [&](Tensor y) {
    for (int64_t i = 0; i < chain / 3; ++i) {
      y = ag::relu(ag::mul(ag::add(y, 0.5), *w));
    }
    return y;
  };
  absl::Status err;
  auto no_grad = [&]() -> absl::Status {
    ag::NoGradGuard guard;
    Tensor y = forward(*x);
    return ctx->Synchronize(dev);
  };
  Tensor leaf = ag::Detach(*x);
  ag::SetRequiresGrad(leaf, true);
  auto with_grad = [&]() -> absl::Status {
    Tensor loss = ag::sum(forward(leaf));
    if (absl::Status s = ag::Backward({loss}); !s.ok()) return s;
    return ctx->Synchronize(dev);
  };
  void* buf = nullptr;
  if (cudaSetDevice(0) != cudaSuccess ||
      cudaMalloc(&buf, elements * sizeof(float)) != cudaSuccess) {
    std::fprintf(stderr, "op_overhead_bench: cudaMalloc failed\n");
    return 1;
  }
  auto floor = [&]() -> absl::Status {
    for (int64_t i = 0; i < chain; ++i) {
      cudaMemsetAsync(buf, 0, elements * sizeof(float), 0);
    }
    return cudaDeviceSynchronize() == cudaSuccess
               ? absl::OkStatus()
               : absl::InternalError("cudaDeviceSynchronize failed");
  };
  // Warm-up: kernels loaded, caches filled.
  BestPerOp(2, chain, no_grad, &err);
  BestPerOp(2, chain, with_grad, &err);
  BestPerOp(2, chain, floor, &err);
  const double ng = BestPerOp(reps, chain, no_grad, &err);
  const double g = BestPerOp(reps, chain, with_grad, &err);
  const double fl = BestPerOp(reps, chain, floor, &err);
  cudaFree(buf);
  if (!err.ok()) {
    std::fprintf(stderr, "op_overhead_bench: %s\n", err.ToString().c_str());
    return 1;
  }
  Print("no_grad", elements, chain, ng);
  Print("autograd", elements, chain, g);
  Print("launch_floor", elements, chain, fl);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return Run();
}
