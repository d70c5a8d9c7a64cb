// Ferry side of bench/autograd (run it through run.sh, which compares with
// PyTorch 1.13 in the same run). Prints one JSON line per figure:
//   mlp_step:  forward + cross-entropy + backward + SGD step of an MLP
//              (float32, ReLU between layers), per step;
//   chain_add: 100 chained adds on a 4-element tensor that requires grad,
//              then sum + backward; per add;
//   linear_step: bench/dist_autograd's local row: Linear 64->64, batch 64,
//              MSE loss, backward, SGD step.
// --profile_steps=N runs N steps of --figures' first figure without timing
// (for valgrind --tool=callgrind: instructions per step are the difference
// of two runs with different N, divided by the difference).
// Each figure is the best of --repeats timed loops after warm-up. BLAS
// threads are set by the environment (OPENBLAS_NUM_THREADS), which run.sh
// sets equal to torch.set_num_threads.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "ferry/autograd/engine.h"
#include "ferry/autograd/nn.h"
#include "ferry/autograd/node.h"
#include "ferry/autograd/ops.h"
#include "ferry/optim/optim.h"

ABSL_FLAG(std::string, impl, "ferry", "label for the JSON lines");
ABSL_FLAG(std::string, mlps, "784-256-10,1024-1024-1024-10",
          "MLP layer widths, comma-separated");
ABSL_FLAG(int64_t, batch, 64, "MLP batch size");
ABSL_FLAG(int, repeats, 3, "timed loops per figure (best is reported)");
ABSL_FLAG(int, threads, 1, "threads (reported; set via the environment)");
ABSL_FLAG(std::string, figures, "mlp_step,chain_add,linear_step",
          "figures to run, comma-separated");
ABSL_FLAG(bool, zero_grad_in_place, false,
          "mlp_step: zero the gradients in place and accumulate into them "
          "(bench/ddp's single row; PyTorch's zero_grad(set_to_none=False)) "
          "instead of dropping them");
ABSL_FLAG(int, profile_steps, 0, "untimed steps of the first figure (callgrind)");

namespace ferry {
namespace {

namespace ag = ::ferry::autograd;
using Clock = std::chrono::steady_clock;

// Best seconds per iteration of `fn` over `repeats` loops of `iters`; with
// --profile_steps, runs it that many times untimed and returns 0.
template <typename F>
double BestSeconds(int repeats, int iters, F fn) {
  if (const int n = absl::GetFlag(FLAGS_profile_steps); n > 0) {
    for (int i = 0; i < n; ++i) fn();
    return 0;
  }
  for (int i = 0; i < std::max(2, iters / 5); ++i) fn();  // Warm-up.
  double best = 1e300;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i) fn();
    best = std::min(
        best, std::chrono::duration<double>(Clock::now() - t0).count() / iters);
  }
  return best;
}

void Check(const absl::Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "autograd_bench: %s\n", s.ToString().c_str());
    std::exit(1);
  }
}

void MlpStep(const std::string& spec) {
  std::vector<int64_t> widths;
  for (absl::string_view w : absl::StrSplit(spec, '-')) {
    int64_t v;
    if (!absl::SimpleAtoi(w, &v)) {
      std::fprintf(stderr, "bad --mlps entry %s\n", spec.c_str());
      std::exit(2);
    }
    widths.push_back(v);
  }
  nn::Sequential model;
  int64_t params = 0;
  for (size_t i = 0; i + 1 < widths.size(); ++i) {
    if (i > 0) model.Append(std::make_shared<nn::ReLU>());
    model.Append(
        std::make_shared<nn::Linear>(widths[i], widths[i + 1], 10 + i));
    params += widths[i] * widths[i + 1] + widths[i + 1];
  }
  const int64_t batch = absl::GetFlag(FLAGS_batch);
  Tensor x = randn({batch, widths.front()}, 1);
  std::vector<int64_t> labels(batch);
  for (int64_t i = 0; i < batch; ++i) labels[i] = i % widths.back();
  Tensor y = from_vector<int64_t>(labels, {batch});
  optim::SGD sgd(model.parameters(), {.lr = 0.01});
  const bool in_place = absl::GetFlag(FLAGS_zero_grad_in_place);
  auto step = [&] {
    if (in_place) {
      for (const Tensor& p : model.parameters()) {
        Tensor g = ag::GradOf(p);
        if (g.defined()) g.zero_();
      }
    } else {
      sgd.ZeroGrad();
    }
    Tensor loss = ag::cross_entropy(model.Forward(x), y);
    Check(ag::Backward({loss}));
    Check(sgd.Step());
  };
  const int iters = params > 1000000 ? 10 : 50;
  const double sec = BestSeconds(absl::GetFlag(FLAGS_repeats), iters, step);
  std::printf(
      "{\"bench\": \"autograd\", \"impl\": \"%s\", \"figure\": \"mlp_step\", "
      "\"mlp\": \"%s\", \"batch\": %lld, \"params\": %lld, \"threads\": %d, "
      "\"zero_grad\": \"%s\", \"time_us\": %.1f}\n",
      absl::GetFlag(FLAGS_impl).c_str(), spec.c_str(),
      static_cast<long long>(batch), static_cast<long long>(params),
      absl::GetFlag(FLAGS_threads), in_place ? "in_place" : "none", sec * 1e6);
}

void ChainAdd() {
  constexpr int kOps = 100;
  Tensor x = ones({4});
  ag::SetRequiresGrad(x);
  auto run = [&] {
    Tensor y = x;
    for (int i = 0; i < kOps; ++i) y = ag::add(y, x);
    ag::SetGrad(x, Tensor());
    Check(ag::Backward({ag::sum(y)}));
  };
  const double sec = BestSeconds(absl::GetFlag(FLAGS_repeats), 200, run);
  std::printf(
      "{\"bench\": \"autograd\", \"impl\": \"%s\", \"figure\": \"chain_add\", "
      "\"ops\": %d, \"numel\": 4, \"threads\": %d, \"time_us\": %.1f, "
      "\"per_op_us\": %.3f}\n",
      absl::GetFlag(FLAGS_impl).c_str(), kOps, absl::GetFlag(FLAGS_threads),
      sec * 1e6, sec * 1e6 / kOps);
}

void LinearStep() {
  constexpr int64_t kDim = 64, kBatch = 64;
  nn::Linear model(kDim, kDim, /*seed=*/1);
  Tensor x = randn({kBatch, kDim}, 7);
  Tensor target = randn({kBatch, kDim}, 8);
  optim::SGD sgd(model.parameters(), {.lr = 0.01});
  auto step = [&] {
    sgd.ZeroGrad();
    Tensor loss = ag::mse_loss(model.Forward(x), target);
    Check(ag::Backward({loss}));
    Check(sgd.Step());
  };
  const double sec = BestSeconds(absl::GetFlag(FLAGS_repeats), 2000, step);
  std::printf(
      "{\"bench\": \"autograd\", \"impl\": \"%s\", \"figure\": "
      "\"linear_step\", \"dim\": %lld, \"batch\": %lld, \"threads\": %d, "
      "\"time_us\": %.2f}\n",
      absl::GetFlag(FLAGS_impl).c_str(), static_cast<long long>(kDim),
      static_cast<long long>(kBatch), absl::GetFlag(FLAGS_threads), sec * 1e6);
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  std::vector<std::string> figures =
      absl::StrSplit(absl::GetFlag(FLAGS_figures), ',', absl::SkipEmpty());
  if (absl::GetFlag(FLAGS_profile_steps) > 0) figures.resize(1);
  for (const std::string& figure : figures) {
    if (figure == "mlp_step") {
      for (absl::string_view spec : absl::StrSplit(
               absl::GetFlag(FLAGS_mlps), ',', absl::SkipEmpty())) {
        ferry::MlpStep(std::string(spec));
        if (absl::GetFlag(FLAGS_profile_steps) > 0) break;
      }
    } else if (figure == "chain_add") {
      ferry::ChainAdd();
    } else if (figure == "linear_step") {
      ferry::LinearStep();
    } else {
      std::fprintf(stderr, "unknown figure %s\n", figure.c_str());
      return 2;
    }
  }
  std::fflush(stdout);
  return 0;
}
