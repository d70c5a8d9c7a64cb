// Finite-difference check of an op's gradient, reusable by tests of any op.
//
// GradCheck converts the floating inputs to float64 copies that require
// grad, evaluates L = sum(f(inputs) * v) for a fixed pseudo-random v, and
// compares dL/dx from Backward with central differences (x +- eps) for every
// element of every floating input. Integer inputs (class indices) are passed
// through unchanged. Returns InvalidArgument naming `op`, the input index,
// the element's flat index and both values on the first mismatch
// (|a - n| > atol + rtol * |n|), or when a floating input gets no gradient.
//
// Thread safety: as the ops f calls.
#ifndef FERRY_AUTOGRAD_GRADCHECK_H_
#define FERRY_AUTOGRAD_GRADCHECK_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "ferry/tensor/tensor.h"

namespace ferry::autograd {

using GradCheckFn = std::function<Tensor(const std::vector<Tensor>&)>;

absl::Status GradCheck(const std::string& op, const GradCheckFn& f,
                       const std::vector<Tensor>& inputs, double eps = 1e-6,
                       double atol = 1e-5, double rtol = 1e-4);

}  // namespace ferry::autograd

#endif  // FERRY_AUTOGRAD_GRADCHECK_H_
