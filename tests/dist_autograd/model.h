// The model of the multi-process distributed-autograd test, split by rank:
//   worker0 (the test): h = tanh(x W0); y = worker1.layer1(h);
//                       loss = sum(y * y) + sum(h)
//   worker1:            layer1(h) = tanh(worker2.layer2(sigmoid(h W1)))
//   worker2:            layer2(s) = s W2
// Every process derives the same seeded values; LocalLoss is the whole
// model in one process, the reference for the distributed gradients.
#ifndef FERRY_TESTS_DIST_AUTOGRAD_MODEL_H_
#define FERRY_TESTS_DIST_AUTOGRAD_MODEL_H_

#include "ferry/autograd/node.h"
#include "ferry/autograd/ops.h"
#include "ferry/tensor/tensor.h"

namespace ferry::dist_autograd_test {

// A fresh leaf requiring grad: the input (rank -1) or rank r's weight.
inline Tensor Leaf(int rank) {
  static const std::vector<int64_t> kShapes[] = {
      {5, 3}, {3, 4}, {4, 4}, {4, 2}};
  Tensor t = randn(kShapes[rank + 1], 100 + rank, DType::kFloat64);
  autograd::SetRequiresGrad(t);
  return t;
}

inline Tensor Layer0(const Tensor& x, const Tensor& w0) {
  return autograd::tanh(autograd::matmul(x, w0));
}
inline Tensor Loss(const Tensor& h, const Tensor& y) {
  return autograd::add(autograd::sum(autograd::mul(y, y)), autograd::sum(h));
}
inline Tensor LocalLoss(const Tensor& x, const Tensor& w0, const Tensor& w1,
                        const Tensor& w2) {
  Tensor h = Layer0(x, w0);
  Tensor s = autograd::sigmoid(autograd::matmul(h, w1));
  return Loss(h, autograd::tanh(autograd::matmul(s, w2)));
}

}  // namespace ferry::dist_autograd_test

#endif  // FERRY_TESTS_DIST_AUTOGRAD_MODEL_H_
