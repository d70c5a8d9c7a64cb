// The per-element math of Ferry's CUDA kernels, as __host__ __device__
// functions: kernels.cu calls them on the GPU and kernel_math_test.cc checks
// them on the CPU, so the formulas are tested on machines without a GPU.
// Plain C++ (no CUDA headers): FERRY_HD is __host__ __device__ only under
// nvcc. Each function matches the CPU op it stands for (autograd/ops.cc,
// optim/optim.cc), in the element type T (float or double), except the
// optimizer steps, which compute in double as optim.cc does. The 16-bit
// storage types F16 and BF16 compute in float: Load widens an element,
// Store<T> rounds back (to nearest even, as ferry::Half/BFloat16 do).
//
// Thread safety: pure functions. Errors: none (callers check shapes).
// Design: docs/design/cuda_kernels.md.
#ifndef FERRY_TENSOR_CUDA_KERNEL_MATH_H_
#define FERRY_TENSOR_CUDA_KERNEL_MATH_H_

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define FERRY_HD __host__ __device__
#else
#define FERRY_HD
#endif

namespace ferry {
namespace cuda {
namespace math {

/// IEEE binary16 as kernels store it: its bits (ferry::Half's layout).
struct F16 {
  uint16_t bits;  ///< The binary16 encoding.
};
/// bfloat16 as kernels store it: a float32's upper half (ferry::BFloat16's
/// layout).
struct BF16 {
  uint16_t bits;  ///< The upper 16 bits of a float32.
};

/// The object representation of `v` as a `To` of the same size (memcpy,
/// which nvcc also compiles in device code).
template <typename To, typename From>
FERRY_HD inline To BitCast(From v) {
  static_assert(sizeof(To) == sizeof(From), "BitCast: sizes differ");
  To out;
  memcpy(&out, &v, sizeof(out));
  return out;
}
/// The bits of float `f`.
FERRY_HD inline uint32_t BitsOfFloat(float f) { return BitCast<uint32_t>(f); }
/// The float whose bits are `u`.
FERRY_HD inline float FloatOfBits(uint32_t u) { return BitCast<float>(u); }

/// binary16 `h` as a float (exact).
FERRY_HD inline float F16ToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t em = h & 0x7fffu;  // Exponent and mantissa.
  if (em >= 0x7c00u) {  // Inf or NaN: all-ones exponent, mantissa kept.
    return FloatOfBits(sign | 0x7f800000u | ((em & 0x3ffu) << 13));
  }
  if (em >= 0x0400u) {  // Normal: rebias the exponent by 127 - 15.
    return FloatOfBits(sign | ((em << 13) + (112u << 23)));
  }
  // Zero or subnormal: em * 2^-24, exact in float.
  const float v = static_cast<float>(em) * 5.9604644775390625e-8f;
  return sign ? -v : v;
}

/// float `f` rounded to the nearest binary16 (ties to even; overflow is
/// Inf, a NaN stays a quiet NaN).
FERRY_HD inline uint16_t FloatToF16(float f) {
  const uint32_t x = BitsOfFloat(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) {  // NaN.
    return static_cast<uint16_t>(sign | 0x7e00u | ((ax & 0x7fffffu) >> 13));
  }
  // 65520 and up (Inf included) round to Inf.
  if (ax >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);
  if (ax >= 0x38800000u) {  // A normal binary16: rebias, round off 13 bits.
    const uint32_t r = ax - (112u << 23);
    return static_cast<uint16_t>(sign |
                                 ((r + 0xfffu + ((r >> 13) & 1u)) >> 13));
  }
  // Subnormal or zero: round |f| * 2^24 to an integer, ties to even.
  const int32_t e = static_cast<int32_t>(ax >> 23);
  if (e < 101) return static_cast<uint16_t>(sign);  // Below 2^-26: zero.
  const uint32_t mant = (ax & 0x7fffffu) | 0x800000u;
  const int32_t shift = 126 - e;  // 14..25: bits dropped from mant.
  uint32_t q = mant >> shift;
  const uint32_t dropped = mant << (32 - shift);  // At the top of a word.
  if (dropped > 0x80000000u || (dropped == 0x80000000u && (q & 1u))) ++q;
  return static_cast<uint16_t>(sign | q);
}

/// bfloat16 `b` as a float (exact).
FERRY_HD inline float BF16ToFloat(uint16_t b) {
  return FloatOfBits(static_cast<uint32_t>(b) << 16);
}
/// float `f` rounded to the nearest bfloat16 (ties to even; a NaN stays a
/// quiet NaN).
FERRY_HD inline uint16_t FloatToBF16(float f) {
  const uint32_t x = BitsOfFloat(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>((x >> 16) | 0x40u);
  }
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

/// How a kernel element type T computes: in Acc (T itself for float and
/// double, float for F16 and BF16), read by Load and written by Store.
template <typename T>
struct Elem {
  using Acc = T;  ///< The type the math runs in.
  /// `v` widened to Acc.
  FERRY_HD static Acc Load(T v) { return v; }
  /// `v` rounded to T.
  FERRY_HD static T Store(Acc v) { return v; }
};
/// binary16 elements compute in float.
template <>
struct Elem<F16> {
  using Acc = float;  ///< The type the math runs in.
  /// `v` as a float.
  FERRY_HD static float Load(F16 v) { return F16ToFloat(v.bits); }
  /// `v` rounded to binary16.
  FERRY_HD static F16 Store(float v) { return F16{FloatToF16(v)}; }
};
/// bfloat16 elements compute in float.
template <>
struct Elem<BF16> {
  using Acc = float;  ///< The type the math runs in.
  /// `v` as a float.
  FERRY_HD static float Load(BF16 v) { return BF16ToFloat(v.bits); }
  /// `v` rounded to bfloat16.
  FERRY_HD static BF16 Store(float v) { return BF16{FloatToBF16(v)}; }
};
/// The type element type T computes in.
template <typename T>
using Acc = typename Elem<T>::Acc;
/// Element `v` widened to Acc<T>.
template <typename T>
FERRY_HD inline Acc<T> Load(T v) {
  return Elem<T>::Load(v);
}
/// `v` rounded to element type T.
template <typename T>
FERRY_HD inline T Store(Acc<T> v) {
  return Elem<T>::Store(v);
}

/// Binary elementwise ops (a op b).
/// kPow is a to the power b (pow(x, p) is Scalar(kPow, x, p)).
enum class BinaryOp : int32_t { kAdd, kSub, kMul, kDiv, kPow };
/// Unary elementwise ops; kCopy is the identity (strided -> contiguous);
/// kGelu is the exact (erf) GELU.
enum class UnaryOp : int32_t { kCopy, kNeg, kRelu, kTanh, kExp, kLog, kSqrt,
                               kSigmoid, kGelu };
/// Gradient ops: (grad of the output, saved value) -> grad of the input.
/// kRelu's and kGelu's saved value is the input; kTanh's and kSigmoid's the
/// output.
enum class BackwardOp : int32_t { kRelu, kTanh, kSigmoid, kGelu };

/// 1/sqrt(2), for GELU.
inline constexpr double kSqrtHalf = 0.70710678118654752440;
/// 1/sqrt(2 pi): the standard normal density at 0.
inline constexpr double kInvSqrt2Pi = 0.39894228040143267794;

/// GELU(x) = x * Phi(x), Phi the standard normal CDF (autograd's gelu).
template <typename T>
FERRY_HD inline T Gelu(T x) {
  return T(0.5) * x * (T(1) + std::erf(x * T(kSqrtHalf)));
}
/// d GELU / dx = Phi(x) + x * phi(x).
template <typename T>
FERRY_HD inline T GeluDerivative(T x) {
  const T cdf = T(0.5) * (T(1) + std::erf(x * T(kSqrtHalf)));
  const T pdf = std::exp(T(-0.5) * x * x) * T(kInvSqrt2Pi);
  return cdf + x * pdf;
}

/// a op b.
template <typename T>
FERRY_HD inline T Binary(BinaryOp op, T a, T b) {
  switch (op) {
    case BinaryOp::kAdd: return a + b;
    case BinaryOp::kSub: return a - b;
    case BinaryOp::kMul: return a * b;
    case BinaryOp::kDiv: return a / b;
    case BinaryOp::kPow: return std::pow(a, b);
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
    case UnaryOp::kGelu: return Gelu(x);
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
    case BackwardOp::kGelu: return g * GeluDerivative(saved);
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

/// Negative log-likelihood (mean over `rows`) backward for element
/// (r, c) of log-probabilities: -g / rows at the row's target, else 0.
template <typename T>
FERRY_HD inline T NllLossBackward(bool is_target, T g, int64_t rows) {
  return is_target ? -g / static_cast<T>(rows) : T(0);
}

/// Philox-4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1,
/// 2, 3", SC'11), a counter-based generator: block `counter` under `key`
/// gives four 32-bit words, the same on the host and on a GPU, so a kernel
/// and its host twin draw identical numbers from (seed, position).
FERRY_HD inline void Philox4x32(uint64_t counter, uint64_t key,
                                uint32_t out[4]) {
  uint32_t c0 = static_cast<uint32_t>(counter),
           c1 = static_cast<uint32_t>(counter >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(key),
           k1 = static_cast<uint32_t>(key >> 32);
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    const uint64_t p0 = uint64_t{0xD2511F53u} * c0;
    const uint64_t p1 = uint64_t{0xCD9E8D57u} * c2;
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32),
                   lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32),
                   lo1 = static_cast<uint32_t>(p1);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
  }
  out[0] = c0;
  out[1] = c1;
  out[2] = c2;
  out[3] = c3;
}

/// Uniform in [0, 1) (24 bits) at stream position `index` of generator
/// `seed`: word index % 4 of Philox block index / 4.
FERRY_HD inline double PhiloxUniform(uint64_t seed, uint64_t index) {
  uint32_t w[4];
  Philox4x32(index / 4, seed, w);
  return static_cast<double>(w[index % 4] >> 8) * (1.0 / 16777216.0);
}

/// Dropout's mask value at stream position `index`: 0 (dropped, when the
/// uniform draw is below p) or 1 / (1 - p); 0 everywhere when p >= 1.
template <typename T>
FERRY_HD inline T DropoutScale(uint64_t seed, uint64_t index, double p) {
  if (p >= 1) return T(0);
  return PhiloxUniform(seed, index) < p ? T(0) : static_cast<T>(1 / (1 - p));
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
