// Ops on CUDA tensors: checked, Status-returning calls that launch the
// kernels of kernels.cu (and cuBLAS for matrix products) on the operands'
// device, through a CudaContext (context.h). autograd's ops call these when
// their inputs are on CUDA; the math per element is kernel_math.h's.
//
// Operands: float32 or float64 tensors (one dtype per call; indices and
// targets int64, where's condition bool, CopyInto any dtype) on one CUDA
// device of the context; float16/bfloat16 too, computing in float32, for
// all but Embedding, NllLoss and DropoutMask. Inputs may be strided views; results are new
// contiguous tensors on that device; the in-place optimizer steps need
// contiguous parameters and state.
// Errors (InvalidArgument, naming the op, each operand's dtype, shape and
// device): an undefined operand, a CPU operand, operands on different
// devices, a device index the context does not have, a dtype other than the
// above or mismatched dtypes, shapes that do not broadcast or multiply,
// more than 8 dimensions; an index or target out of range (found on the
// device: the call then waits for its kernel); FailedPrecondition from a
// context that runs no kernels; Internal naming the op and CUDA's error for
// a failed launch. Ops return after queueing (except where they read a
// flag back), like CUDA's own calls; To(CPU) waits.
// Thread safety: as the context (any thread); operands follow tensor.h.
// Design: docs/design/cuda_kernels.md.
#ifndef FERRY_TENSOR_CUDA_OPS_H_
#define FERRY_TENSOR_CUDA_OPS_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ferry/tensor/cuda/context.h"
#include "ferry/tensor/cuda/kernel_math.h"
#include "ferry/tensor/tensor.h"

namespace ferry {
namespace cuda {

/// op(x) elementwise.
absl::StatusOr<Tensor> Unary(CudaContext& ctx, math::UnaryOp op,
                             const Tensor& x);
/// a op b elementwise, broadcasting as NumPy does.
absl::StatusOr<Tensor> Binary(CudaContext& ctx, math::BinaryOp op,
                              const Tensor& a, const Tensor& b);
/// x op s elementwise.
absl::StatusOr<Tensor> Scalar(CudaContext& ctx, math::BinaryOp op,
                              const Tensor& x, double s);
/// Input gradient of a ReLU/Tanh/Sigmoid from the output gradient `g` and
/// `saved` (math::BackwardOp says which), same shapes.
absl::StatusOr<Tensor> UnaryBackward(CudaContext& ctx, math::BackwardOp op,
                                     const Tensor& g, const Tensor& saved);
/// x when contiguous, else a contiguous copy on its device.
absl::StatusOr<Tensor> Contiguous(CudaContext& ctx, const Tensor& x);
/// Sets every element of contiguous `x` to `value`.
absl::Status Fill(CudaContext& ctx, const Tensor& x, double value);
/// acc += x (same shape, acc contiguous): gradient accumulation on device.
absl::Status AddInPlace(CudaContext& ctx, const Tensor& acc, const Tensor& x);

/// Sum of all elements, 0-d.
absl::StatusOr<Tensor> Sum(CudaContext& ctx, const Tensor& x);
/// Mean of all elements, 0-d (NaN for no elements).
absl::StatusOr<Tensor> Mean(CudaContext& ctx, const Tensor& x);
/// Sum over dimension `dim` (negative counts from the end).
absl::StatusOr<Tensor> SumDim(CudaContext& ctx, const Tensor& x, int64_t dim,
                              bool keepdim);
/// Mean over dimension `dim`.
absl::StatusOr<Tensor> MeanDim(CudaContext& ctx, const Tensor& x, int64_t dim,
                               bool keepdim);

/// Softmax (log-softmax if `log`) over the last dimension.
absl::StatusOr<Tensor> Softmax(CudaContext& ctx, const Tensor& x, bool log);
/// Input gradient of Softmax from its output `y` and the gradient `g`.
absl::StatusOr<Tensor> SoftmaxBackward(CudaContext& ctx, const Tensor& g,
                                       const Tensor& y, bool log);

/// Mean cross-entropy of logits [N, C] against int64 targets [N].
struct CrossEntropyResult {
  Tensor loss;  ///< 0-d.
  Tensor lse;   ///< [N]: each row's log-sum-exp, for the backward.
};
/// See CrossEntropyResult; a target outside [0, C) is InvalidArgument.
absl::StatusOr<CrossEntropyResult> CrossEntropy(CudaContext& ctx,
                                                const Tensor& logits,
                                                const Tensor& target);
/// Logits' gradient, given the forward's lse and the 0-d loss gradient.
absl::StatusOr<Tensor> CrossEntropyBackward(CudaContext& ctx,
                                            const Tensor& logits,
                                            const Tensor& target,
                                            const Tensor& lse,
                                            const Tensor& grad_loss);

/// Rows of weight [V, D] at int64 `indices` (any shape): [*indices, D].
absl::StatusOr<Tensor> Embedding(CudaContext& ctx, const Tensor& weight,
                                 const Tensor& indices);
/// The weight's gradient [vocab, D] from the output gradient [*indices, D]
/// (repeated indices accumulate, with atomicAdd).
absl::StatusOr<Tensor> EmbeddingBackward(CudaContext& ctx, const Tensor& g,
                                         const Tensor& indices, int64_t vocab);

/// op(a) @ op(b) of 2-D tensors through cuBLAS, op transposing when asked.
absl::StatusOr<Tensor> Matmul(CudaContext& ctx, const Tensor& a,
                              const Tensor& b, bool transpose_a = false,
                              bool transpose_b = false);
/// op(a_i) @ op(b_i) for each i of 3-D operands [B, *, *]: one
/// strided-batched cuBLAS call, [B, m, n].
absl::StatusOr<Tensor> BatchedMatmul(CudaContext& ctx, const Tensor& a,
                                     const Tensor& b, bool transpose_a = false,
                                     bool transpose_b = false);
/// x [N, in] @ weight [out, in]^T + bias [out] (bias may be undefined).
absl::StatusOr<Tensor> Linear(CudaContext& ctx, const Tensor& x,
                              const Tensor& weight, const Tensor& bias);

/// Copies `src` (broadcast to dst's shape) into the strided view `dst`
/// (distinct elements, e.g. a slice of a larger tensor); any dtype, the
/// same for both.
absl::Status CopyInto(CudaContext& ctx, const Tensor& dst, const Tensor& src);
/// A contiguous copy of `x` as `dtype` (each float32, float64, float16 or
/// bfloat16): DDP's compression hooks.
absl::StatusOr<Tensor> Cast(CudaContext& ctx, const Tensor& x, DType dtype);
/// cond ? a : b elementwise, broadcasting (cond bool).
absl::StatusOr<Tensor> Where(CudaContext& ctx, const Tensor& cond,
                             const Tensor& a, const Tensor& b);
/// Mean over rows of -log_probs[r, target[r]] (log_probs [N, C], target
/// int64 [N]); a target outside [0, C) is InvalidArgument.
absl::StatusOr<Tensor> NllLoss(CudaContext& ctx, const Tensor& log_probs,
                               const Tensor& target);
/// NllLoss's input gradient [N, classes] from the 0-d loss gradient.
absl::StatusOr<Tensor> NllLossBackward(CudaContext& ctx, const Tensor& target,
                                       const Tensor& grad_loss,
                                       int64_t classes);
/// Dropout mask of `sizes` on `device`: element i is
/// math::DropoutScale(seed, offset + i, p) (Philox; p in [0, 1]).
absl::StatusOr<Tensor> DropoutMask(CudaContext& ctx,
                                   const std::vector<int64_t>& sizes,
                                   DType dtype, Device device, double p,
                                   uint64_t seed, uint64_t offset);

/// One SGD step of `param` in place (optim.h's SGD rule); `buf` (the
/// momentum buffer, same shape) is needed only when o.momentum != 0.
absl::Status SgdStep(CudaContext& ctx, const Tensor& param, const Tensor& grad,
                     const Tensor& buf, const math::SgdParams& o);
/// One Adam/AdamW step in place; `o` from math::AdamForStep.
absl::Status AdamStep(CudaContext& ctx, const Tensor& param,
                      const Tensor& grad, const Tensor& exp_avg,
                      const Tensor& exp_avg_sq, const math::AdamParams& o);

/// One Adagrad step in place (`sum`: the running squared gradients).
absl::Status AdagradStep(CudaContext& ctx, const Tensor& param,
                         const Tensor& grad, const Tensor& sum,
                         const math::AdagradParams& o);

/// A context over the CUDA runtime (CudaContext::Create) whose device
/// tensors carry a backend running the ops above, so autograd's ops and
/// engine compute on them (device_ops.h).
absl::StatusOr<std::unique_ptr<CudaContext>> CreateComputeContext(
    CudaContext::Options options);

}  // namespace cuda
}  // namespace ferry

#endif  // FERRY_TENSOR_CUDA_OPS_H_
