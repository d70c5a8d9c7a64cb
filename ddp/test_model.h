// The model, data and single-process references DDP's tests compare with
// (ddp_test on the CPU, ddp_device_test on a device): a float64 MLP whose
// initial weights depend on a seed (so construction must broadcast), seeded
// inputs and targets per step, and one process training on the batch of
// every rank concatenated. Test-only; plain functions, no state.
// Design: docs/design/ddp.md.
#ifndef FERRY_DDP_TEST_MODEL_H_
#define FERRY_DDP_TEST_MODEL_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "ferry/autograd/nn.h"
#include "ferry/tensor/tensor.h"

namespace ferry::testutil {

/// Rows per rank per step.
inline constexpr int64_t kBatch = 4;

/// A 5-8-6-3 float64 MLP with tanh, initialized from `seed`.
std::shared_ptr<nn::Sequential> MakeMlp(uint64_t seed);

/// Step `step`'s inputs [world*kBatch, 5] for `world` ranks.
Tensor Inputs(int step, int world);
/// Step `step`'s targets [world*kBatch, 3].
Tensor Targets(int step, int world);
/// Rank `rank`'s rows of `all` (Inputs or Targets).
Tensor Shard(const Tensor& all, int rank);

/// p -= lr * p.grad for every parameter of `m` (CPU), without autograd.
void SgdStep(nn::Module& m, double lr);
/// Clones of `m`'s parameters.
std::vector<Tensor> Snapshot(const nn::Module& m);

/// The parameters after `steps` SGD steps (rate `lr`) of MakeMlp(100) on
/// the concatenated batch of `world` ranks, mse loss.
std::vector<Tensor> TrainedReference(int world, int steps, double lr);
/// The .grad of MakeMlp(100)'s parameters accumulated over `steps` passes
/// on the concatenated batch (what no_sync then a synced pass yield).
std::vector<Tensor> AccumulatedReference(int world, int steps);

}  // namespace ferry::testutil

#endif  // FERRY_DDP_TEST_MODEL_H_
