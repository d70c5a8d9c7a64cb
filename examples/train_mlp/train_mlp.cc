#include "ferry/examples/train_mlp/train_mlp.h"

#include <chrono>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "ferry/autograd/engine.h"
#include "ferry/autograd/grad_mode.h"
#include "ferry/autograd/nn.h"
#include "ferry/autograd/ops.h"
#include "ferry/optim/optim.h"

namespace ferry::examples {
namespace {

namespace ag = ::ferry::autograd;

struct Dataset {
  Tensor x;       // [n, dim] float32
  Tensor labels;  // [n] int64
};

Dataset MakeClusters(const MlpConfig& c, int64_t n, uint64_t seed) {
  Tensor centres = randn({c.classes, c.dim}, c.seed).mul(c.separation);
  Tensor x = randn({n, c.dim}, seed);
  std::vector<int64_t> labels(n);
  for (int64_t i = 0; i < n; ++i) {
    labels[i] = i % c.classes;
    x.select(0, i).add_(centres.select(0, labels[i]));
  }
  return {x, from_vector<int64_t>(labels, {n})};
}

double Accuracy(const Tensor& logits, const Tensor& labels) {
  const std::vector<float> l = logits.to_vector<float>();
  const std::vector<int64_t> y = labels.to_vector<int64_t>();
  const int64_t rows = logits.size(0), cols = logits.size(1);
  int64_t right = 0;
  for (int64_t r = 0; r < rows; ++r) {
    int64_t best = 0;
    for (int64_t j = 1; j < cols; ++j)
      if (l[r * cols + j] > l[r * cols + best]) best = j;
    right += best == y[r];
  }
  return rows == 0 ? 0 : static_cast<double>(right) / rows;
}

}  // namespace

absl::StatusOr<MlpResult> TrainMlp(const MlpConfig& c, std::ostream* log) {
  Dataset train = MakeClusters(c, c.train_samples, c.seed + 100);
  Dataset test = MakeClusters(c, c.test_samples, c.seed + 200);
  cuda::DeviceOps* ops = c.device_ops;
  if (c.device.is_cuda() && ops == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "train_mlp: device ", c.device.ToString(),
        " needs a compute backend (MlpConfig::device_ops)"));
  }
  // On the CPU, a tensor is its own host copy.
  auto host = [&](const Tensor& t) -> absl::StatusOr<Tensor> {
    if (t.device().is_cpu()) return t;
    return ops->To(t, Device::CPU());
  };
  nn::Sequential model(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(c.dim, c.hidden, c.seed + 1),
      std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(c.hidden, c.hidden, c.seed + 3),
      std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(c.hidden, c.classes, c.seed + 5)});
  const Tensor labels_cpu = train.labels;
  if (c.device.is_cuda()) {
    if (absl::Status s = model.to(c.device, ops); !s.ok()) return s;
    for (Tensor* t : {&train.x, &train.labels, &test.x}) {
      absl::StatusOr<Tensor> d = ops->To(*t, c.device);
      if (!d.ok()) return d.status();
      *t = *std::move(d);
    }
  }
  // After the move: the optimizer steps the device parameters.
  optim::SGD sgd(model.parameters(), {.lr = c.lr, .momentum = c.momentum});
  nn::CrossEntropyLoss loss_fn;
  MlpResult result;
  double window_loss = 0, window_acc = 0;
  int64_t window = 0;
  auto window_start = std::chrono::steady_clock::now();
  const int64_t batches = c.train_samples / c.batch;
  for (int64_t step = 1; step <= c.steps; ++step) {
    const int64_t b = (step - 1) % batches;
    Tensor x = train.x.slice(0, b * c.batch, (b + 1) * c.batch);
    Tensor y = train.labels.slice(0, b * c.batch, (b + 1) * c.batch);
    sgd.ZeroGrad();
    Tensor logits = model.Forward(x);
    Tensor loss = loss_fn(logits, y);
    if (absl::Status s = ag::Backward({loss}); !s.ok()) return s;
    if (absl::Status s = sgd.Step(); !s.ok()) return s;
    absl::StatusOr<Tensor> loss_host = host(loss);
    if (!loss_host.ok()) return loss_host.status();
    absl::StatusOr<Tensor> logits_host = host(logits);
    if (!logits_host.ok()) return logits_host.status();
    window_loss += loss_host->item<double>();
    window_acc += Accuracy(
        *logits_host, labels_cpu.slice(0, b * c.batch, (b + 1) * c.batch));
    ++window;
    if ((c.log_every > 0 && step % c.log_every == 0) || step == c.steps) {
      const double secs = std::chrono::duration<double>(
                              std::chrono::steady_clock::now() - window_start)
                              .count();
      result.final_loss = window_loss / window;
      result.samples_per_second = window * c.batch / std::max(secs, 1e-9);
      if (log != nullptr && c.log_every > 0) {
        *log << absl::StrFormat(
            "step %d loss %.4f accuracy %.3f samples/s %.0f\n", step,
            result.final_loss, window_acc / window, result.samples_per_second);
      }
      window_loss = window_acc = 0;
      window = 0;
      window_start = std::chrono::steady_clock::now();
    }
  }
  ag::NoGradGuard no_grad;
  model.eval();
  absl::StatusOr<Tensor> test_logits = host(model.Forward(test.x));
  if (!test_logits.ok()) return test_logits.status();
  result.test_accuracy = Accuracy(*test_logits, test.labels);
  return result;
}

}  // namespace ferry::examples
