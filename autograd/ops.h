// Differentiable ops on Ferry tensors (float32 and float64).
//
// Each op computes its result like the tensor/ op of the same name and, when
// grad mode is on and an input requires grad, records a FunctionNode
// ("MulBackward", ...) that saves what backward needs. Elementwise binary
// ops broadcast NumPy-style; their gradients are summed back to each
// input's shape. Results are always new tensor objects (views share
// elements but never an input's autograd state).
//
// Devices: operands on one CUDA device compute through the DeviceOps of
// their storage (tensor/cuda/device_ops.h; docs/design/cuda_kernels.md):
// every op below, including views, cat/stack and to(). Device dropout draws
// its mask from a Philox counter generator (not the CPU's numbers).
// Operands on different devices (CPU and CUDA, or two CUDA devices) abort
// naming the op and every operand.
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
#include "ferry/tensor/cuda/device_ops.h"
#include "ferry/tensor/tensor.h"

namespace ferry::autograd {

// --- Elementwise --------------------------------------------------------
// a + b.
Tensor add(const Tensor& a, const Tensor& b);
// a - b.
Tensor sub(const Tensor& a, const Tensor& b);
// a * b.
Tensor mul(const Tensor& a, const Tensor& b);
// a / b.
Tensor div(const Tensor& a, const Tensor& b);
// a + b for a scalar b.
Tensor add(const Tensor& a, double b);
// a - b for a scalar b.
Tensor sub(const Tensor& a, double b);
// a * b for a scalar b.
Tensor mul(const Tensor& a, double b);
// a / b for a scalar b.
Tensor div(const Tensor& a, double b);
// -a.
Tensor neg(const Tensor& a);
// a to the power `exponent`.
Tensor pow(const Tensor& a, double exponent);
// Square root.
Tensor sqrt(const Tensor& a);
// e to the power a.
Tensor exp(const Tensor& a);
// Natural logarithm.
Tensor log(const Tensor& a);
// Hyperbolic tangent.
Tensor tanh(const Tensor& a);
// 1 / (1 + exp(-a)).
Tensor sigmoid(const Tensor& a);
// max(a, 0).
Tensor relu(const Tensor& a);
// Exact GELU, x * Phi(x) (PyTorch's default approximate='none').
Tensor gelu(const Tensor& a);
// cond (bool, same shape as a and b) ? a : b.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);

// --- Linear algebra and reductions -----------------------------------------
// 2-D x 2-D; N-D x 2-D (batch dims of a flattened); N-D x N-D with equal
// batch dims.
Tensor matmul(const Tensor& a, const Tensor& b);
// The sum of every element (a 0-d tensor).
Tensor sum(const Tensor& a);
// The sum over `dims` (kept as size 1 with keepdim).
Tensor sum(const Tensor& a, const std::vector<int64_t>& dims,
           bool keepdim = false);
// The mean of every element (a 0-d tensor).
Tensor mean(const Tensor& a);
// The mean over `dims` (kept as size 1 with keepdim).
Tensor mean(const Tensor& a, const std::vector<int64_t>& dims,
            bool keepdim = false);

// --- Shapes and views ------------------------------------------------------
// `a` with shape `sizes`: a view when `a` is contiguous, else a copy.
Tensor reshape(const Tensor& a, const std::vector<int64_t>& sizes);
// A view of `a` (contiguous) with shape `sizes`; one size may be -1.
Tensor view(const Tensor& a, const std::vector<int64_t>& sizes);
// A view with dimensions d0 and d1 swapped.
Tensor transpose(const Tensor& a, int64_t d0, int64_t d1);
// A view with the dimensions in the order `dims`.
Tensor permute(const Tensor& a, const std::vector<int64_t>& dims);
// A view of indices start, start + step, ... < end along `dim`.
Tensor slice(const Tensor& a, int64_t dim, int64_t start, int64_t end,
             int64_t step = 1);
// A view of index `index` along `dim`, which is removed.
Tensor select(const Tensor& a, int64_t dim, int64_t index);
// A view with a dimension of size 1 inserted at `dim`.
Tensor unsqueeze(const Tensor& a, int64_t dim);
// A view without dimension `dim`, which must have size 1.
Tensor squeeze(const Tensor& a, int64_t dim);
// The tensors joined along the existing dimension `dim`.
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim);
// The tensors (same shape) joined along a new dimension `dim`.
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim);

// --- Neural-network functions ----------------------------------------------
// exp(a) normalized to sum 1 along `dim`.
Tensor softmax(const Tensor& a, int64_t dim);
// log(softmax(a, dim)).
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

// --- Devices -----------------------------------------------------------------
// `a` copied to `device` (itself when already there); differentiable (the
// gradient is copied back). From a CUDA tensor the copy goes through its
// storage's backend; from the CPU `ops` (a CudaContext's compute()) must be
// given. Aborts naming the devices when there is no backend or the copy
// fails (a device the context lacks, out of memory).
Tensor to(const Tensor& a, Device device, cuda::DeviceOps* ops = nullptr);

}  // namespace ferry::autograd

#endif  // FERRY_AUTOGRAD_OPS_H_
