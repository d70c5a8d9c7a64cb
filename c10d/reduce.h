// Elementwise reduction kernels for CPU backends, for every (dtype, ReduceOp)
// pair that makes sense (see CheckReduceOp in backend.h).
//
// Integer SUM and PRODUCT wrap around on overflow (two's complement), like
// PyTorch's CPU kernels. Float16/BFloat16 are combined in float and rounded
// back after each step, so a ring algorithm may round differently from a
// single-pass sum.
//
// Thread safety: stateless.
#ifndef FERRY_C10D_REDUCE_H_
#define FERRY_C10D_REDUCE_H_

#include <cstddef>

#include "absl/status/statusor.h"
#include "ferry/c10d/types.h"
#include "ferry/tensor/dtype.h"
#include "ferry/tensor/tensor.h"

namespace ferry {
namespace c10d {

// out[i] = a[i] op b[i] for i < n; `out` may alias `a` or `b`. AVG maps to
// the SUM kernel (divide afterwards with FinishAverage).
using ReduceFn = void (*)(void* out, const void* a, const void* b, size_t n);

// InvalidArgument for pairs CheckReduceOp rejects.
absl::StatusOr<ReduceFn> GetReduceFn(DType dtype, ReduceOp op);

// acc = acc op other (same dtype and numel, contiguous CPU tensors).
absl::Status ReduceInto(Tensor& acc, const Tensor& other, ReduceOp op);

// For AVG: divides the summed `t` by `size` in place (floating dtypes).
void FinishAverage(Tensor& t, int size);

}  // namespace c10d
}  // namespace ferry

#endif  // FERRY_C10D_REDUCE_H_
