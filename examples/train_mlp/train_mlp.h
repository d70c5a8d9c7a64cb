// Trains an MLP classifier on seeded Gaussian clusters: the library behind
// the train_mlp example and its test.
//
// Data: `classes` cluster centres drawn N(0, separation^2) in `dim`
// dimensions; each point is its class centre plus N(0, 1) noise. Training
// and held-out sets come from different seeds. Model: Linear-ReLU-Linear-
// ReLU-Linear, cross-entropy loss, SGD with momentum. With `device` CUDA the
// data, model (Module::to) and SGD steps live on that device and compute
// through `device_ops` (a CudaContext's compute(), which outlives the run);
// only the loss and logits are copied back, for the log and accuracy.
#ifndef FERRY_EXAMPLES_TRAIN_MLP_TRAIN_MLP_H_
#define FERRY_EXAMPLES_TRAIN_MLP_TRAIN_MLP_H_

#include <cstdint>
#include <ostream>

#include "absl/status/statusor.h"
#include "ferry/tensor/cuda/device_ops.h"
#include "ferry/tensor/storage.h"

namespace ferry::examples {

struct MlpConfig {
  int64_t dim = 8;
  int64_t classes = 4;
  double separation = 1.5;
  int64_t train_samples = 4096;
  int64_t test_samples = 1024;
  int64_t hidden = 64;
  int64_t batch = 64;
  int64_t steps = 400;
  double lr = 0.05;
  double momentum = 0.9;
  uint64_t seed = 1;
  int64_t log_every = 50;  // 0: no progress lines.
  Device device;  // Where to train (CPU by default).
  cuda::DeviceOps* device_ops = nullptr;  // Needed for a CUDA device.
};

struct MlpResult {
  double final_loss = 0;     // Mean training loss of the last logged window.
  double test_accuracy = 0;  // On the held-out set, after training.
  double samples_per_second = 0;
};

// Trains per `config`, writing progress lines ("step 50 loss 0.4123
// accuracy 0.871 samples/s 52000") to `log` (may be null).
absl::StatusOr<MlpResult> TrainMlp(const MlpConfig& config, std::ostream* log);

}  // namespace ferry::examples

#endif  // FERRY_EXAMPLES_TRAIN_MLP_TRAIN_MLP_H_
