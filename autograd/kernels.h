// Raw float32/float64 kernels behind the differentiable ops (no autograd):
// broadcasting elementwise maps, reductions to a broadcast source shape,
// BLAS gemm with transposes. Shared with optim/. Precondition failures,
// a non-CPU operand among them (CUDA tensors compute through
// tensor/cuda/ops.h), abort via TensorFail (see tensor.h's Errors paragraph).
//
// Thread safety: pure functions of their inputs.
#ifndef FERRY_AUTOGRAD_KERNELS_H_
#define FERRY_AUTOGRAD_KERNELS_H_

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "ferry/tensor/tensor.h"

namespace ferry::autograd::kernels {

// Calls f.template operator()<T>() with T = float or double; aborts naming
// `op` for any other dtype.
template <typename F>
decltype(auto) FloatDispatch(DType d, const char* op, F&& f) {
  if (d == DType::kFloat32) return f.template operator()<float>();
  if (d != DType::kFloat64) {
    TensorFail(std::string(op) + ": expected float32 or float64, got " +
               std::string(DTypeName(d)));
  }
  return f.template operator()<double>();
}

// NumPy broadcast of two shapes; aborts naming `op` when incompatible.
std::vector<int64_t> BroadcastShape(const std::vector<int64_t>& a,
                                    const std::vector<int64_t>& b,
                                    const char* op);
// A contiguous tensor of `shape` holding `t` broadcast to it.
Tensor Materialize(const Tensor& t, const std::vector<int64_t>& shape);
// Sums `g` over the dimensions that broadcasting added or stretched, giving
// a tensor of `shape`.
Tensor ReduceTo(const Tensor& g, const std::vector<int64_t>& shape);
// Sum over `dims` (any order, negative allowed).
Tensor SumDims(const Tensor& t, std::vector<int64_t> dims, bool keepdim);
// op(a) x op(b) for 2-D float tensors, op = transpose when the flag is set.
Tensor Gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b);
// Softmax (or log-softmax) over the last dimension.
Tensor SoftmaxLast(const Tensor& t, bool log);

// out[i] = f(a[i]) elementwise, same dtype and shape.
template <typename F>
Tensor Map(const Tensor& a, const char* op, F f) {
  a.CheckCpu(op);
  Tensor ac = a.contiguous();
  Tensor out = empty(a.sizes(), a.dtype());
  FloatDispatch(a.dtype(), op, [&]<typename T>() {
    const T* pa = ac.data<T>();
    T* po = out.data<T>();
    const int64_t n = out.numel();
    for (int64_t i = 0; i < n; ++i) po[i] = f(pa[i]);
  });
  return out;
}

// out = f(a, b) with NumPy broadcasting (same dtype).
template <typename F>
Tensor Zip(const Tensor& a, const Tensor& b, const char* op, F f) {
  a.CheckCpu(op);
  b.CheckCpu(op);
  if (a.dtype() != b.dtype()) {
    TensorFail(std::string(op) + ": dtype mismatch (" +
               std::string(DTypeName(a.dtype())) + " vs " +
               std::string(DTypeName(b.dtype())) + ")");
  }
  const std::vector<int64_t> shape = BroadcastShape(a.sizes(), b.sizes(), op);
  Tensor out = empty(shape, a.dtype());
  FloatDispatch(a.dtype(), op, [&]<typename T>() {
    T* po = out.data<T>();
    const int64_t n = out.numel();
    const bool a_full = a.sizes() == shape, b_full = b.sizes() == shape;
    if (a_full && b.numel() == 1) {
      Tensor ac = a.contiguous();
      const T* pa = ac.data<T>();
      const T s = b.to_vector<T>()[0];
      for (int64_t i = 0; i < n; ++i) po[i] = f(pa[i], s);
      return;
    }
    if (b_full && a.numel() == 1) {
      Tensor bc = b.contiguous();
      const T* pb = bc.data<T>();
      const T s = a.to_vector<T>()[0];
      for (int64_t i = 0; i < n; ++i) po[i] = f(s, pb[i]);
      return;
    }
    Tensor ac = a_full ? a.contiguous() : Materialize(a, shape);
    const T* pa = ac.data<T>();
    // Common bias case: b covers the trailing dims of the output.
    const int64_t inner = b.numel();
    const bool suffix =
        !b_full && inner > 0 && b.dim() <= out.dim() &&
        std::equal(b.sizes().begin(), b.sizes().end(), shape.end() - b.dim());
    if (suffix) {
      Tensor bc = b.contiguous();
      const T* pb = bc.data<T>();
      for (int64_t o = 0; o < n; o += inner)
        for (int64_t j = 0; j < inner; ++j) po[o + j] = f(pa[o + j], pb[j]);
      return;
    }
    Tensor bc = b_full ? b.contiguous() : Materialize(b, shape);
    const T* pb = bc.data<T>();
    for (int64_t i = 0; i < n; ++i) po[i] = f(pa[i], pb[i]);
  });
  return out;
}

// out = f(a, b, c) elementwise over three tensors of one shape and dtype.
template <typename F>
Tensor Zip3(const Tensor& a, const Tensor& b, const Tensor& c, const char* op,
            F f) {
  if (a.sizes() != b.sizes() || a.sizes() != c.sizes() ||
      a.dtype() != b.dtype() || a.dtype() != c.dtype()) {
    TensorFail(std::string(op) +
               ": expected three tensors of one shape "
               "and dtype");
  }
  Tensor ac = a.contiguous(), bc = b.contiguous(), cc = c.contiguous();
  Tensor out = empty(a.sizes(), a.dtype());
  FloatDispatch(a.dtype(), op, [&]<typename T>() {
    const T *pa = ac.data<T>(), *pb = bc.data<T>(), *pc = cc.data<T>();
    T* po = out.data<T>();
    const int64_t n = out.numel();
    for (int64_t i = 0; i < n; ++i) po[i] = f(pa[i], pb[i], pc[i]);
  });
  return out;
}

}  // namespace ferry::autograd::kernels

#endif  // FERRY_AUTOGRAD_KERNELS_H_
