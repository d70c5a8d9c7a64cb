// Raw launchers of Ferry's CUDA kernels (kernels.cu, compiled by nvcc):
// pointers, element counts and a stream in, a CUDA error code out. Internal
// to tensor/cuda: ops.h is the checked, Status-returning API over them.
//
// Contract: every pointer is device memory of the current device (the
// caller sets it), holding the elements the arguments describe; T is float
// or double, and for the elementwise, reduction, softmax, cross-entropy,
// where and optimizer launchers also math::F16 or math::BF16, which compute
// in float (math::Acc<T>: scalars, scales and reduction scratch are in that
// type, so sums accumulate in float). Each call only queues work on `stream` (a cudaStream_t; 0 is the
// legacy default stream) and returns cudaGetLastError() as an int, 0 for
// success; ErrorString names a code. Calls that report bad indices write a
// nonzero int32 to `*bad` (device memory the caller zeroed) and leave the
// offending rows as NaN/zero; the caller reads the flag back.
// Thread safety: as the CUDA runtime (any thread). No CUDA headers here.
// Design: docs/design/cuda_kernels.md.
#ifndef FERRY_TENSOR_CUDA_KERNELS_H_
#define FERRY_TENSOR_CUDA_KERNELS_H_

#include <cstdint>

#include "ferry/tensor/cuda/kernel_math.h"

namespace ferry {
namespace cuda {
namespace kernels {

/// A cudaStream_t as an integer.
using Stream = uintptr_t;
/// Blocks SumAll uses (its scratch holds this many elements).
inline constexpr int kSumBlocks = 256;

/// CUDA's name and message for error `code`.
const char* ErrorString(int code);

/// out[i] = op(x[ix.Offset(i)]) for i < n (out contiguous).
template <typename T>
int Unary(math::UnaryOp op, const T* x, const math::StridedIndexer& ix, T* out,
          int64_t n, Stream stream);
/// out[i] = a[ia.Offset(i)] op b[ib.Offset(i)] (broadcasting by strides 0).
template <typename T>
int Binary(math::BinaryOp op, const T* a, const math::StridedIndexer& ia,
           const T* b, const math::StridedIndexer& ib, T* out, int64_t n,
           Stream stream);
/// out[i] = x[i] op scalar (x contiguous).
template <typename T>
int Scalar(math::BinaryOp op, const T* x, math::Acc<T> scalar, T* out,
           int64_t n, Stream stream);
/// out[i] = math::Backward(op, g[i], saved[i]) (all contiguous).
template <typename T>
int Backward(math::BackwardOp op, const T* g, const T* saved, T* out,
             int64_t n, Stream stream);
/// out[i] = value.
template <typename T>
int Fill(T* out, T value, int64_t n, Stream stream);
/// *out = scale * sum(x[0..n)); `scratch` holds kSumBlocks elements.
template <typename T>
int SumAll(const T* x, int64_t n, math::Acc<T> scale, math::Acc<T>* scratch,
           T* out, Stream stream);
/// x contiguous as [outer, n, inner]: out[o, i] = scale * sum_k x[o, k, i].
template <typename T>
int SumDim(const T* x, int64_t outer, int64_t n, int64_t inner,
           math::Acc<T> scale, T* out, Stream stream);
/// Rows of contiguous [rows, cols]: out = softmax (log_softmax if `log`).
template <typename T>
int Softmax(const T* x, int64_t rows, int64_t cols, bool log, T* out,
            Stream stream);
/// Input gradient of Softmax from output y and its gradient g.
template <typename T>
int SoftmaxBackward(const T* g, const T* y, int64_t rows, int64_t cols,
                    bool log, T* out, Stream stream);
/// Cross-entropy of logits [rows, cols] and int64 targets [rows]: lse[r] =
/// logsumexp of row r, *loss = mean_r(lse[r] - x[r, t_r]); `scratch` holds
/// rows + kSumBlocks Acc elements. Targets outside [0, cols) set *bad.
template <typename T>
int CrossEntropy(const T* x, const int64_t* target, int64_t rows, int64_t cols,
                 T* lse, math::Acc<T>* scratch, T* loss, int32_t* bad,
                 Stream stream);
/// Logits' gradient of CrossEntropy, given lse and the loss gradient *g.
template <typename T>
int CrossEntropyBackward(const T* x, const int64_t* target, const T* lse,
                         const T* g, int64_t rows, int64_t cols, T* out,
                         Stream stream);
/// out[i, :] = weight[idx[i], :] for weight [vocab, width]; an index outside
/// [0, vocab) sets *bad and its row is NaN.
template <typename T>
int Embedding(const T* weight, const int64_t* idx, int64_t n, int64_t vocab,
              int64_t width, T* out, int32_t* bad, Stream stream);
/// grad_weight[idx[i], :] += g[i, :] (atomicAdd; grad_weight pre-zeroed).
template <typename T>
int EmbeddingBackward(const T* g, const int64_t* idx, int64_t n, int64_t vocab,
                      int64_t width, T* grad_weight, Stream stream);
/// dst[id.Offset(i)] = src[is.Offset(i)] for i < n: a strided copy into a
/// view (cat, slice backward); `id` must not map two i to one element. T is
/// float or double, or uint8_t/uint16_t/uint32_t/uint64_t standing for any
/// element of that size (bool, int64, ...): the bits are copied.
template <typename T>
int StridedCopy(const T* src, const math::StridedIndexer& is, T* dst,
                const math::StridedIndexer& id, int64_t n, Stream stream);
/// The floating element types Cast converts between.
enum class CastType : int32_t { kFloat32, kFloat64, kFloat16, kBFloat16 };
/// out[i] = x[i] converted from `from` to `to` (both contiguous, n
/// elements); 16-bit results are rounded to nearest even from float32 (a
/// float64 goes through float32 first), as the CPU's Half/BFloat16 do.
int Cast(const void* x, CastType from, void* out, CastType to, int64_t n,
         Stream stream);
/// out[i] = cond[ic.Offset(i)] ? a[ia.Offset(i)] : b[ib.Offset(i)] (cond is
/// bool, stored as one byte).
template <typename T>
int Where(const bool* cond, const math::StridedIndexer& ic, const T* a,
          const math::StridedIndexer& ia, const T* b,
          const math::StridedIndexer& ib, T* out, int64_t n, Stream stream);
/// Mean negative log-likelihood of log-probabilities x [rows, cols] (read
/// through ix) at int64 targets [rows]: *loss = -mean_r x[r, t_r];
/// `scratch` holds rows + kSumBlocks elements. Targets outside [0, cols)
/// set *bad.
template <typename T>
int NllLoss(const T* x, const math::StridedIndexer& ix, const int64_t* target,
            int64_t rows, int64_t cols, T* scratch, T* loss, int32_t* bad,
            Stream stream);
/// x's gradient of NllLoss [rows, cols] from the loss gradient *g.
template <typename T>
int NllLossBackward(const int64_t* target, const T* g, int64_t rows,
                    int64_t cols, T* out, Stream stream);
/// out[i] = math::DropoutScale<T>(seed, offset + i, p) for i < n.
template <typename T>
int DropoutMask(uint64_t seed, uint64_t offset, double p, T* out, int64_t n,
                Stream stream);
/// One SGD step over n elements (buf unused without momentum).
template <typename T>
int SgdStep(const math::SgdParams& o, T* p, const T* g, T* buf, int64_t n,
            Stream stream);
/// One Adam/AdamW step over n elements.
template <typename T>
int AdamStep(const math::AdamParams& o, T* p, const T* g, T* m, T* v,
             int64_t n, Stream stream);
/// One Adagrad step over n elements (`sum`: the running squared gradients).
template <typename T>
int AdagradStep(const math::AdagradParams& o, T* p, const T* g, T* sum,
                int64_t n, Stream stream);

}  // namespace kernels
}  // namespace cuda
}  // namespace ferry

#endif  // FERRY_TENSOR_CUDA_KERNELS_H_
