#include "ferry/ddp/test_model.h"

#include "ferry/autograd/engine.h"
#include "ferry/autograd/grad_mode.h"
#include "ferry/autograd/node.h"
#include "ferry/autograd/ops.h"
#include "gtest/gtest.h"

namespace ferry::testutil {

std::shared_ptr<nn::Sequential> MakeMlp(uint64_t seed) {
  auto m = std::make_shared<nn::Sequential>();
  m->Append(std::make_shared<nn::Linear>(5, 8, seed, true, DType::kFloat64));
  m->Append(std::make_shared<nn::Tanh>());
  m->Append(
      std::make_shared<nn::Linear>(8, 6, seed + 10, true, DType::kFloat64));
  m->Append(std::make_shared<nn::Tanh>());
  m->Append(
      std::make_shared<nn::Linear>(6, 3, seed + 20, true, DType::kFloat64));
  return m;
}

Tensor Inputs(int step, int world) {
  return randn({world * kBatch, 5}, 1000 + step, DType::kFloat64);
}

Tensor Targets(int step, int world) {
  return randn({world * kBatch, 3}, 2000 + step, DType::kFloat64);
}

Tensor Shard(const Tensor& all, int rank) {
  return all.slice(0, rank * kBatch, (rank + 1) * kBatch);
}

void SgdStep(nn::Module& m, double lr) {
  autograd::NoGradGuard no_grad;
  for (const Tensor& p : m.parameters()) {
    Tensor g = autograd::GradOf(p);
    ASSERT_TRUE(g.defined());
    autograd::Detach(p).sub_(g.mul(lr));
  }
}

std::vector<Tensor> Snapshot(const nn::Module& m) {
  std::vector<Tensor> out;
  for (const Tensor& p : m.parameters()) out.push_back(p.clone());
  return out;
}

std::vector<Tensor> TrainedReference(int world, int steps, double lr) {
  auto m = MakeMlp(100);
  for (int step = 0; step < steps; ++step) {
    m->ZeroGrad();
    Tensor loss = autograd::mse_loss(m->Forward(Inputs(step, world)),
                                     Targets(step, world));
    EXPECT_TRUE(autograd::Backward({loss}).ok());
    SgdStep(*m, lr);
  }
  return Snapshot(*m);
}

std::vector<Tensor> AccumulatedReference(int world, int steps) {
  auto m = MakeMlp(100);
  for (int step = 0; step < steps; ++step) {
    Tensor loss = autograd::mse_loss(m->Forward(Inputs(step, world)),
                                     Targets(step, world));
    EXPECT_TRUE(autograd::Backward({loss}).ok());
  }
  std::vector<Tensor> out;
  for (const Tensor& p : m->parameters()) out.push_back(autograd::GradOf(p));
  return out;
}

}  // namespace ferry::testutil
