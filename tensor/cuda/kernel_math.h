// The per-element math of Ferry's CUDA kernels, as __host__ __device__
// functions: kernels.cu calls them on the GPU and kernel_math_test.cc checks
// them on the CPU, so the formulas are tested on machines without a GPU.
// Plain C++ (no CUDA headers): FERRY_HD is __host__ __device__ only under
// nvcc. Each function matches the CPU op it stands for (autograd/ops.cc,
// optim/optim.cc), in the element type T (float or double), except the
// optimizer steps, which compute in double as optim.cc does.
//
// Thread safety: pure functions. Errors: none (callers check shapes).
// Design: docs/design/cuda_kernels.md.
#ifndef FERRY_TENSOR_CUDA_KERNEL_MATH_H_
#define FERRY_TENSOR_CUDA_KERNEL_MATH_H_

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define FERRY_HD __host__ __device__
#else
#define FERRY_HD
#endif

namespace ferry {
namespace cuda {
namespace math {

/// Binary elementwise ops (a op b).
enum class BinaryOp : int32_t { kAdd, kSub, kMul, kDiv };
/// Unary elementwise ops; kCopy is the identity (strided -> contiguous).
enum class UnaryOp : int32_t { kCopy, kNeg, kRelu, kTanh, kExp, kLog, kSqrt,
                               kSigmoid };
/// Gradient ops: (grad of the output, saved value) -> grad of the input.
/// kRelu's saved value is the input; kTanh's and kSigmoid's the output.
enum class BackwardOp : int32_t { kRelu, kTanh, kSigmoid };

/// a op b.
template <typename T>
FERRY_HD inline T Binary(BinaryOp op, T a, T b) {
  switch (op) {
    case BinaryOp::kAdd: return a + b;
    case BinaryOp::kSub: return a - b;
    case BinaryOp::kMul: return a * b;
    case BinaryOp::kDiv: return a / b;
  }
  return a;
}

/// op(x).
template <typename T>
FERRY_HD inline T Unary(UnaryOp op, T x) {
  switch (op) {
    case UnaryOp::kCopy: return x;
    case UnaryOp::kNeg: return -x;
    case UnaryOp::kRelu: return x > T(0) ? x : T(0);
    case UnaryOp::kTanh: return std::tanh(x);
    case UnaryOp::kExp: return std::exp(x);
    case UnaryOp::kLog: return std::log(x);
    case UnaryOp::kSqrt: return std::sqrt(x);
    case UnaryOp::kSigmoid: return T(1) / (T(1) + std::exp(-x));
  }
  return x;
}

/// The input's gradient from the output's gradient `g` and `saved`.
template <typename T>
FERRY_HD inline T Backward(BackwardOp op, T g, T saved) {
  switch (op) {
    case BackwardOp::kRelu: return saved > T(0) ? g : T(0);
    case BackwardOp::kTanh: return g * (T(1) - saved * saved);
    case BackwardOp::kSigmoid: return g * saved * (T(1) - saved);
  }
  return g;
}

/// Running (max, sum of exp(x - max)) of a softmax row; Add folds in one
/// element, Merge another partial (order-independent up to rounding).
template <typename T>
struct SoftmaxAcc {
  T max;  ///< Largest element seen (-inf when none).
  T sum;  ///< Sum of exp(x - max) over the elements seen.
  /// Folds in element x.
  FERRY_HD void Add(T x) {
    if (x > max) {
      sum = sum * std::exp(max - x) + T(1);
      max = x;
    } else {
      sum += std::exp(x - max);
    }
  }
  /// Folds in another partial.
  FERRY_HD void Merge(const SoftmaxAcc& o) {
    if (o.sum == T(0)) return;
    if (sum == T(0)) {
      *this = o;
    } else if (o.max > max) {
      sum = sum * std::exp(max - o.max) + o.sum;
      max = o.max;
    } else {
      sum += o.sum * std::exp(o.max - max);
    }
  }
  /// log(sum(exp(x))) of the row.
  FERRY_HD T LogSumExp() const { return max + std::log(sum); }
};

/// SoftmaxAcc with nothing folded in.
template <typename T>
FERRY_HD inline SoftmaxAcc<T> EmptySoftmaxAcc() {
  return SoftmaxAcc<T>{-INFINITY, T(0)};
}

/// Softmax backward for one element: y * (g - dot(g, y) over the row).
template <typename T>
FERRY_HD inline T SoftmaxBackward(T g, T y, T row_dot) {
  return y * (g - row_dot);
}
/// Log-softmax backward for one element: g - exp(y) * sum(g over the row).
template <typename T>
FERRY_HD inline T LogSoftmaxBackward(T g, T y, T row_sum) {
  return g - std::exp(y) * row_sum;
}
/// Cross-entropy (mean over `rows`) backward for logit x of a row whose
/// log-sum-exp is `lse`: (softmax(x) - [is target]) * g / rows.
template <typename T>
FERRY_HD inline T CrossEntropyBackward(T x, T lse, bool is_target, T g,
                                       int64_t rows) {
  return (std::exp(x - lse) - (is_target ? T(1) : T(0))) * g /
         static_cast<T>(rows);
}

/// SGD hyperparameters (optim.h's SgdOptions).
struct SgdParams {
  double lr = 0.01;          ///< Learning rate.
  double momentum = 0;       ///< Momentum factor; 0: none.
  double dampening = 0;      ///< Dampening of the momentum.
  double weight_decay = 0;   ///< L2 penalty.
  bool nesterov = false;     ///< Nesterov momentum.
  bool first = true;  ///< No momentum buffer yet: it starts as the gradient.
};

/// One SGD step of one element (optim.cc's SgdStep): p, and the momentum
/// buffer b when momentum != 0.
template <typename T>
FERRY_HD inline void SgdElement(const SgdParams& o, T& p, T g, T& b) {
  const T lr = static_cast<T>(o.lr), wd = static_cast<T>(o.weight_decay);
  g = g + wd * p;
  if (o.momentum != 0) {
    const T mom = static_cast<T>(o.momentum);
    const T damp = static_cast<T>(1 - o.dampening);
    const T nb = o.first ? g : mom * b + damp * g;
    b = nb;
    g = o.nesterov ? g + mom * nb : nb;
  }
  p -= lr * g;
}

/// Adam/AdamW hyperparameters for one step t (optim.h's AdamOptions).
struct AdamParams {
  double lr = 1e-3;          ///< Learning rate.
  double beta1 = 0.9;        ///< Decay of the first moment.
  double beta2 = 0.999;      ///< Decay of the second moment.
  double eps = 1e-8;         ///< Added to the denominator.
  double weight_decay = 0;   ///< L2 (Adam) or decoupled (AdamW) decay.
  bool decoupled = false;  ///< AdamW.
  double step_size = 0;    ///< lr / (1 - beta1^t).
  double bc2_sqrt = 1;     ///< sqrt(1 - beta2^t).
};

/// Fills step_size and bc2_sqrt of `o` for step t (>= 1).
inline AdamParams AdamForStep(AdamParams o, int64_t t) {
  o.step_size = o.lr / (1 - std::pow(o.beta1, static_cast<double>(t)));
  o.bc2_sqrt = std::sqrt(1 - std::pow(o.beta2, static_cast<double>(t)));
  return o;
}

/// One Adam step of one element (optim.cc's AdamImpl), in double.
template <typename T>
FERRY_HD inline void AdamElement(const AdamParams& o, T& p, T grad, T& m,
                                 T& v) {
  double param = p, g = grad;
  if (o.decoupled) {
    param *= 1 - o.lr * o.weight_decay;
  } else {
    g += o.weight_decay * param;
  }
  const double mj = o.beta1 * m + (1 - o.beta1) * g;
  const double vj = o.beta2 * v + (1 - o.beta2) * g * g;
  m = static_cast<T>(mj);
  v = static_cast<T>(vj);
  const double denom = std::sqrt(vj) / o.bc2_sqrt + o.eps;
  p = static_cast<T>(param - o.step_size * mj / denom);
}

/// Adagrad hyperparameters for one step (optim.h's AdagradOptions).
struct AdagradParams {
  double clr = 0.01;        ///< This step's lr / (1 + (t - 1) * lr_decay).
  double weight_decay = 0;  ///< L2 penalty.
  double eps = 1e-10;       ///< Added to the denominator.
};

/// One Adagrad step of one element (optim.cc's AdagradStep), in double: the
/// parameter p and its running sum s of squared gradients.
template <typename T>
FERRY_HD inline void AdagradElement(const AdagradParams& o, T& p, T grad,
                                    T& s) {
  const double g = grad + o.weight_decay * p;
  const double sum = s + g * g;
  s = static_cast<T>(sum);
  p = static_cast<T>(p - o.clr * g / (std::sqrt(sum) + o.eps));
}

/// Up to this many dimensions in a strided kernel's index arithmetic.
inline constexpr int kMaxKernelDims = 8;

/// A strided operand of an elementwise kernel: element strides per output
/// dimension (0 where it is broadcast).
struct StridedIndexer {
  int32_t dims = 0;                        ///< Output dimensions.
  int64_t sizes[kMaxKernelDims] = {};      ///< The output's shape.
  int64_t strides[kMaxKernelDims] = {};    ///< The operand's, per dim.
  /// Offset (in elements) of output element `linear` (row-major).
  FERRY_HD int64_t Offset(int64_t linear) const {
    int64_t off = 0;
    for (int d = dims - 1; d >= 0; --d) {
      const int64_t i = linear % sizes[d];
      linear /= sizes[d];
      off += i * strides[d];
    }
    return off;
  }
};

}  // namespace math
}  // namespace cuda
}  // namespace ferry

#endif  // FERRY_TENSOR_CUDA_KERNEL_MATH_H_
