// Differentiable ops on Ferry tensors (float32 and float64).
//
// Each op computes its result like the tensor/ op of the same name and, when
// grad mode is on and an input requires grad, records a FunctionNode
// ("MulBackward", ...) that saves what backward needs. Elementwise binary
// ops broadcast NumPy-style; their gradients are summed back to each
// input's shape. Results are always new tensor objects (views share
// elements but never an input's autograd state).
//
// Errors: shape/dtype misuse aborts naming the op (tensor.h's Errors
// paragraph); failures during backward (freed graph, a saved tensor
// modified in place) come back from Backward()/Grad() as absl::Status.
// Thread safety: as tensor/ ops.
#ifndef FERRY_AUTOGRAD_OPS_H_
#define FERRY_AUTOGRAD_OPS_H_

#include <cstdint>
#include <vector>

#include "ferry/autograd/node.h"
#include "ferry/tensor/tensor.h"

namespace ferry::autograd {

// --- Elementwise --------------------------------------------------------
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& a, double b);
Tensor sub(const Tensor& a, double b);
Tensor mul(const Tensor& a, double b);
Tensor div(const Tensor& a, double b);
Tensor neg(const Tensor& a);
Tensor pow(const Tensor& a, double exponent);
Tensor sqrt(const Tensor& a);
Tensor exp(const Tensor& a);
Tensor log(const Tensor& a);
Tensor tanh(const Tensor& a);
Tensor sigmoid(const Tensor& a);
Tensor relu(const Tensor& a);
// Exact GELU, x * Phi(x) (PyTorch's default approximate='none').
Tensor gelu(const Tensor& a);
// cond (bool, same shape as a and b) ? a : b.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);

// --- Linear algebra and reductions -----------------------------------------
// 2-D x 2-D; N-D x 2-D (batch dims of a flattened); N-D x N-D with equal
// batch dims.
Tensor matmul(const Tensor& a, const Tensor& b);
Tensor sum(const Tensor& a);
Tensor sum(const Tensor& a, const std::vector<int64_t>& dims,
           bool keepdim = false);
Tensor mean(const Tensor& a);
Tensor mean(const Tensor& a, const std::vector<int64_t>& dims,
            bool keepdim = false);

// --- Shapes and views ------------------------------------------------------
Tensor reshape(const Tensor& a, const std::vector<int64_t>& sizes);
Tensor view(const Tensor& a, const std::vector<int64_t>& sizes);
Tensor transpose(const Tensor& a, int64_t d0, int64_t d1);
Tensor permute(const Tensor& a, const std::vector<int64_t>& dims);
Tensor slice(const Tensor& a, int64_t dim, int64_t start, int64_t end,
             int64_t step = 1);
Tensor select(const Tensor& a, int64_t dim, int64_t index);
Tensor unsqueeze(const Tensor& a, int64_t dim);
Tensor squeeze(const Tensor& a, int64_t dim);
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim);
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim);

// --- Neural-network functions ----------------------------------------------
Tensor softmax(const Tensor& a, int64_t dim);
Tensor log_softmax(const Tensor& a, int64_t dim);
// Mean of (input - target)^2.
Tensor mse_loss(const Tensor& input, const Tensor& target);
// Mean over N of -log_probs[i, target[i]]; log_probs [N, C], target int64
// [N] with values in [0, C) (aborts otherwise).
Tensor nll_loss(const Tensor& log_probs, const Tensor& target);
// nll_loss(log_softmax(logits, 1), target).
Tensor cross_entropy(const Tensor& logits, const Tensor& target);
// Rows of weight [V, D] at int64 `indices` (any shape): [*indices, D]. The
// gradient is dense [V, D].
Tensor embedding(const Tensor& weight, const Tensor& indices);
// Zeroes each element with probability p (mask from `seed`) and scales the
// rest by 1/(1-p); identity when !training or p == 0.
Tensor dropout(const Tensor& a, double p, bool training, uint64_t seed);

}  // namespace ferry::autograd

#endif  // FERRY_AUTOGRAD_OPS_H_
