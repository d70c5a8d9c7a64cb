// Host checks of the per-element math the CUDA kernels run (kernel_math.h):
// the only check of that math on a machine without a GPU.
#include "ferry/tensor/cuda/kernel_math.h"

#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "ferry/tensor/dtype.h"
#include "gtest/gtest.h"

namespace ferry {
namespace cuda {
namespace math {
namespace {

TEST(KernelMathTest, BinaryAndUnary) {
  EXPECT_EQ(Binary(BinaryOp::kAdd, 2.0, 3.0), 5.0);
  EXPECT_EQ(Binary(BinaryOp::kSub, 2.0, 3.0), -1.0);
  EXPECT_EQ(Binary(BinaryOp::kMul, 2.0f, 3.0f), 6.0f);
  EXPECT_EQ(Binary(BinaryOp::kDiv, 3.0, 2.0), 1.5);
  EXPECT_EQ(Unary(UnaryOp::kCopy, -2.5), -2.5);
  EXPECT_EQ(Unary(UnaryOp::kNeg, 2.5), -2.5);
  EXPECT_EQ(Unary(UnaryOp::kRelu, -2.5), 0.0);
  EXPECT_EQ(Unary(UnaryOp::kRelu, 2.5), 2.5);
  EXPECT_DOUBLE_EQ(Unary(UnaryOp::kTanh, 0.5), std::tanh(0.5));
  EXPECT_DOUBLE_EQ(Unary(UnaryOp::kExp, 0.5), std::exp(0.5));
  EXPECT_DOUBLE_EQ(Unary(UnaryOp::kLog, 0.5), std::log(0.5));
  EXPECT_DOUBLE_EQ(Unary(UnaryOp::kSqrt, 2.0), std::sqrt(2.0));
  EXPECT_DOUBLE_EQ(Unary(UnaryOp::kSigmoid, 0.0), 0.5);
  EXPECT_DOUBLE_EQ(Binary(BinaryOp::kPow, 2.0, 3.0), 8.0);
  EXPECT_DOUBLE_EQ(Binary(BinaryOp::kPow, 4.0, 0.5), 2.0);
  // GELU: x * Phi(x) (autograd's gelu): 0 at 0, x for large x, Phi(1) at 1.
  EXPECT_EQ(Unary(UnaryOp::kGelu, 0.0), 0.0);
  EXPECT_DOUBLE_EQ(Unary(UnaryOp::kGelu, 1.0), 0.8413447460685429);
  EXPECT_NEAR(Unary(UnaryOp::kGelu, 10.0), 10.0, 1e-12);
  EXPECT_NEAR(Unary(UnaryOp::kGelu, -10.0), 0.0, 1e-12);
}

// Philox-4x32-10's published known answer for counter 0 and key 0
// (Random123's kat_vectors), and the dropout draw built on it.
TEST(KernelMathTest, PhiloxKnownAnswerAndDropoutScale) {
  uint32_t w[4];
  Philox4x32(0, 0, w);
  EXPECT_EQ(w[0], 0x6627e8d5u);
  EXPECT_EQ(w[1], 0xe169c58du);
  EXPECT_EQ(w[2], 0xbc57ac4cu);
  EXPECT_EQ(w[3], 0x9b00dbd8u);
  // Position i is word i % 4 of block i / 4, 24 bits in [0, 1).
  EXPECT_EQ(PhiloxUniform(0, 1), (0xe169c58du >> 8) / 16777216.0);
  // Dropout: 0 or 1 / (1 - p), the kept share near 1 - p, seeds differ.
  const int n = 4000;
  int kept = 0, same = 0;
  for (int i = 0; i < n; ++i) {
    const double v = DropoutScale<double>(42, i, 0.25);
    ASSERT_TRUE(v == 0 || v == 1 / 0.75) << i << ": " << v;
    kept += v != 0;
    same += (v != 0) == (DropoutScale<double>(43, i, 0.25) != 0);
  }
  EXPECT_NEAR(kept / static_cast<double>(n), 0.75, 0.03);
  EXPECT_LT(same, n - 100);  // Independent masks agree ~62.5% of the time.
  EXPECT_EQ(DropoutScale<float>(1, 0, 1.0), 0.0f);
  EXPECT_EQ(DropoutScale<float>(1, 0, 0.0), 1.0f);
}

// Each backward formula against a central difference of its forward op.
TEST(KernelMathTest, BackwardMatchesFiniteDifference) {
  const double h = 1e-6, g = 0.7;
  for (double x : {-1.3, -0.2, 0.4, 2.1}) {
    for (auto [fwd, bwd, saved_is_output] :
         {std::tuple{UnaryOp::kRelu, BackwardOp::kRelu, false},
          std::tuple{UnaryOp::kTanh, BackwardOp::kTanh, true},
          std::tuple{UnaryOp::kSigmoid, BackwardOp::kSigmoid, true},
          std::tuple{UnaryOp::kGelu, BackwardOp::kGelu, false}}) {
      const double fd = (Unary(fwd, x + h) - Unary(fwd, x - h)) / (2 * h);
      const double saved = saved_is_output ? Unary(fwd, x) : x;
      EXPECT_NEAR(Backward(bwd, g, saved), g * fd, 1e-6)
          << "op " << static_cast<int>(fwd) << " at " << x;
    }
  }
}

double LogSumExp(const std::vector<double>& row) {
  SoftmaxAcc<double> acc = EmptySoftmaxAcc<double>();
  for (double x : row) acc.Add(x);
  return acc.LogSumExp();
}

TEST(KernelMathTest, SoftmaxAccAddAndMergeAgree) {
  const std::vector<double> row = {1.0, -3.0, 700.0, 2.5, 699.0, -1e300};
  // Reference, shifted by the max by hand.
  double ref = 0;
  for (double x : row) ref += std::exp(x - 700.0);
  ref = 700.0 + std::log(ref);
  EXPECT_NEAR(LogSumExp(row), ref, 1e-12);
  // Split into partials (as the kernel's threads do), merged in any order.
  for (size_t cut = 0; cut <= row.size(); ++cut) {
    SoftmaxAcc<double> a = EmptySoftmaxAcc<double>(),
                       b = EmptySoftmaxAcc<double>();
    for (size_t i = 0; i < row.size(); ++i) (i < cut ? a : b).Add(row[i]);
    SoftmaxAcc<double> ab = a, ba = b;
    ab.Merge(b);
    ba.Merge(a);
    EXPECT_NEAR(ab.LogSumExp(), ref, 1e-12) << cut;
    EXPECT_NEAR(ba.LogSumExp(), ref, 1e-12) << cut;
  }
  EXPECT_TRUE(std::isinf(EmptySoftmaxAcc<float>().LogSumExp()));
}

// Softmax, log-softmax and cross-entropy backward against central
// differences of f(x) = sum(w * op(x)) over one row.
TEST(KernelMathTest, SoftmaxFamilyBackwardMatchesFiniteDifference) {
  const std::vector<double> x0 = {0.3, -1.2, 2.0, 0.5}, w = {0.4, -0.9, 1.3,
                                                              0.2};
  const size_t n = x0.size();
  auto op = [&](const std::vector<double>& x, bool log) {
    const double lse = LogSumExp(x);
    double f = 0;
    for (size_t j = 0; j < n; ++j) {
      f += w[j] * (log ? x[j] - lse : std::exp(x[j] - lse));
    }
    return f;
  };
  for (bool log : {false, true}) {
    const double lse = LogSumExp(x0);
    std::vector<double> y(n);
    double dot = 0, sum = 0;
    for (size_t j = 0; j < n; ++j) {
      y[j] = log ? x0[j] - lse : std::exp(x0[j] - lse);
      dot += w[j] * y[j];
      sum += w[j];
    }
    for (size_t j = 0; j < n; ++j) {
      std::vector<double> xp = x0, xm = x0;
      xp[j] += 1e-6;
      xm[j] -= 1e-6;
      const double fd = (op(xp, log) - op(xm, log)) / 2e-6;
      const double an = log ? LogSoftmaxBackward(w[j], y[j], sum)
                            : SoftmaxBackward(w[j], y[j], dot);
      EXPECT_NEAR(an, fd, 1e-6) << (log ? "log_softmax " : "softmax ") << j;
    }
  }
  // Cross-entropy of two rows, mean, targets {2, 0}, loss gradient 1.5.
  const std::vector<std::vector<double>> rows = {x0, {1.0, 0.0, -1.0, 0.5}};
  const int64_t target[] = {2, 0};
  auto loss = [&](const std::vector<std::vector<double>>& r) {
    double l = 0;
    for (size_t i = 0; i < r.size(); ++i) l += LogSumExp(r[i]) - r[i][target[i]];
    return l / r.size();
  };
  for (size_t i = 0; i < rows.size(); ++i) {
    for (size_t j = 0; j < n; ++j) {
      auto rp = rows, rm = rows;
      rp[i][j] += 1e-6;
      rm[i][j] -= 1e-6;
      const double fd = 1.5 * (loss(rp) - loss(rm)) / 2e-6;
      const double an = CrossEntropyBackward(
          rows[i][j], LogSumExp(rows[i]), target[i] == int64_t(j), 1.5,
          static_cast<int64_t>(rows.size()));
      EXPECT_NEAR(an, fd, 1e-6) << i << "," << j;
    }
  }
}

TEST(KernelMathTest, SgdElementFollowsTheCpuRule) {
  SgdParams o;
  o.lr = 0.1;
  o.weight_decay = 0.01;
  float p = 2, b = 0;
  SgdElement(o, p, 0.5f, b);  // No momentum: p -= lr * (g + wd * p).
  EXPECT_FLOAT_EQ(p, 2 - 0.1f * (0.5f + 0.01f * 2));
  o.momentum = 0.9;
  o.dampening = 0.5;
  double q = 1, buf = 0;
  SgdElement(o, q, 0.2, buf);  // First step: buffer = g.
  const double g1 = 0.2 + 0.01 * 1;
  EXPECT_DOUBLE_EQ(buf, g1);
  EXPECT_DOUBLE_EQ(q, 1 - 0.1 * g1);
  o.first = false;
  o.nesterov = true;
  const double q1 = q;
  SgdElement(o, q, 0.3, buf);
  const double g2 = 0.3 + 0.01 * q1, b2 = 0.9 * g1 + 0.5 * g2;
  EXPECT_DOUBLE_EQ(buf, b2);
  EXPECT_DOUBLE_EQ(q, q1 - 0.1 * (g2 + 0.9 * b2));
}

TEST(KernelMathTest, AdagradElementFollowsTheCpuRule) {
  const double lr = 0.1, lr_decay = 0.5, wd = 0.05, eps = 1e-10;
  double p = 1.5, s = 0.2;
  double rp = p, rs = s;
  for (int64_t t = 1; t <= 3; ++t) {
    const double g = 0.3 * t - 0.5;
    AdagradParams o;
    o.clr = lr / (1 + static_cast<double>(t - 1) * lr_decay);
    o.weight_decay = wd;
    o.eps = eps;
    AdagradElement(o, p, g, s);
    // The rule as optim.cc's AdagradStep writes it.
    const double gg = g + wd * rp;
    rs += gg * gg;
    rp -= lr / (1 + (t - 1) * lr_decay) * gg / (std::sqrt(rs) + eps);
    EXPECT_DOUBLE_EQ(p, rp) << "step " << t;
    EXPECT_DOUBLE_EQ(s, rs) << "step " << t;
  }
}

TEST(KernelMathTest, AdamElementFollowsTheCpuRule) {
  for (bool decoupled : {false, true}) {
    AdamParams o;
    o.lr = 0.01;
    o.weight_decay = 0.1;
    o.decoupled = decoupled;
    double p = 1.5, m = 0, v = 0;
    double rp = p, rm = 0, rv = 0;
    for (int64_t t = 1; t <= 3; ++t) {
      const double g = 0.3 * t;
      AdamElement(AdamForStep(o, t), p, g, m, v);
      // The rule as optim.cc writes it.
      double gg = g;
      if (decoupled) {
        rp *= 1 - o.lr * o.weight_decay;
      } else {
        gg += o.weight_decay * rp;
      }
      rm = o.beta1 * rm + (1 - o.beta1) * gg;
      rv = o.beta2 * rv + (1 - o.beta2) * gg * gg;
      const double bc1 = 1 - std::pow(o.beta1, t),
                   bc2 = std::sqrt(1 - std::pow(o.beta2, t));
      rp -= (o.lr / bc1) * rm / (std::sqrt(rv) / bc2 + o.eps);
      EXPECT_DOUBLE_EQ(p, rp) << "step " << t << " decoupled " << decoupled;
      EXPECT_DOUBLE_EQ(m, rm);
      EXPECT_DOUBLE_EQ(v, rv);
    }
  }
}

TEST(KernelMathTest, StridedIndexerBroadcastsAndTransposes) {
  StridedIndexer ix;
  ix.dims = 3;
  ix.sizes[0] = 2;
  ix.sizes[1] = 3;
  ix.sizes[2] = 4;
  // A [2, 1, 4] operand broadcast over dim 1: strides {4, 0, 1}.
  ix.strides[0] = 4;
  ix.strides[1] = 0;
  ix.strides[2] = 1;
  EXPECT_EQ(ix.Offset(0), 0);
  EXPECT_EQ(ix.Offset(5), 1);    // (0, 1, 1)
  EXPECT_EQ(ix.Offset(23), 7);   // (1, 2, 3)
  EXPECT_EQ(ix.Offset(13), 5);   // (1, 0, 1)
  // A transposed [4, 3, 2] contiguous operand: strides {1, 2, 6}.
  ix.strides[0] = 1;
  ix.strides[1] = 2;
  ix.strides[2] = 6;
  EXPECT_EQ(ix.Offset(23), 1 + 4 + 18);
  EXPECT_EQ(ix.Offset(6), 0 + 2 * 1 + 6 * 2);  // (0, 1, 2)
}


// The kernels' 16-bit conversions agree bit for bit with the CPU's Half and
// BFloat16 (tensor/dtype.cc), which Tensor::to and DeviceOps::Cast use: every
// 16-bit pattern widened, and floats across the whole range narrowed,
// including every tie between neighbouring 16-bit values.
uint32_t Bits(float f) { return BitsOfFloat(f); }

TEST(KernelMathTest, Float16ConversionsMatchTheCpuHalf) {
  int checked = 0;
  for (uint32_t h = 0; h <= 0xffffu; ++h) {
    const float mine = F16ToFloat(static_cast<uint16_t>(h));
    const float cpu = static_cast<float>(Half::FromBits(static_cast<uint16_t>(h)));
    if (std::isnan(cpu)) {
      ASSERT_TRUE(std::isnan(mine)) << std::hex << h;
    } else {
      ASSERT_EQ(Bits(mine), Bits(cpu)) << std::hex << h;
    }
    // Each finite value narrows back to itself; the tie above it (half way
    // to the next value) and the floats just around that tie round as the
    // CPU rounds them.
    if (!std::isfinite(cpu)) continue;
    const float next = F16ToFloat(static_cast<uint16_t>(h + 1));
    const std::vector<float> probes = {
        cpu, (cpu + next) / 2, std::nextafter((cpu + next) / 2, 0.0f),
        std::nextafter((cpu + next) / 2, 2 * next)};
    for (float f : probes) {
      if (!std::isfinite(f)) continue;
      ASSERT_EQ(FloatToF16(f), Half(f).bits) << std::hex << Bits(f);
      ++checked;
    }
  }
  // Floats from the whole range in a stride that reaches every exponent.
  for (uint64_t x = 0; x <= 0xffffffffu; x += 0x1003) {
    const float f = FloatOfBits(static_cast<uint32_t>(x));
    ASSERT_EQ(FloatToF16(f), Half(f).bits) << std::hex << x;
    ++checked;
  }
  EXPECT_GT(checked, 1000000);
  // The edges: the largest half, the first float that overflows, Inf, NaN.
  EXPECT_EQ(FloatToF16(65504.0f), 0x7bffu);
  EXPECT_EQ(FloatToF16(65519.99f), 0x7bffu);
  EXPECT_EQ(FloatToF16(65520.0f), 0x7c00u);
  EXPECT_EQ(FloatToF16(-INFINITY), 0xfc00u);
  EXPECT_EQ(FloatToF16(5.9604644775390625e-8f), 0x0001u);  // 2^-24.
  EXPECT_EQ(FloatToF16(2.98023223876953125e-8f), 0x0000u);  // Tie to even.
  EXPECT_TRUE(std::isnan(F16ToFloat(FloatToF16(NAN))));
}

TEST(KernelMathTest, BFloat16ConversionsMatchTheCpuBFloat16) {
  for (uint32_t b = 0; b <= 0xffffu; ++b) {
    const float mine = BF16ToFloat(static_cast<uint16_t>(b));
    const float cpu =
        static_cast<float>(BFloat16::FromBits(static_cast<uint16_t>(b)));
    ASSERT_EQ(Bits(mine), Bits(cpu)) << std::hex << b;
    // The tie above each value and its neighbours.
    const uint32_t tie = (b << 16) | 0x8000u;
    for (uint32_t x : {b << 16, tie, tie - 1, tie + 1}) {
      const float f = FloatOfBits(x);
      ASSERT_EQ(FloatToBF16(f), BFloat16(f).bits) << std::hex << x;
    }
  }
  EXPECT_EQ(FloatToBF16(1.0f + 1.0f / 256), 0x3f80u);  // Tie: to even.
  EXPECT_EQ(FloatToBF16(1.0f + 3.0f / 256), 0x3f82u);  // Tie: up, to even.
  EXPECT_TRUE(std::isnan(BF16ToFloat(FloatToBF16(NAN))));
}

// Load/Store: the identity for float and double; a round trip through the
// 16-bit types rounds once, to within the format's unit roundoff.
TEST(KernelMathTest, LoadAndStoreRoundOnce) {
  EXPECT_EQ(Load(0.1f), 0.1f);
  EXPECT_EQ(Store<double>(0.1), 0.1);
  static_assert(std::is_same_v<Acc<F16>, float>);
  static_assert(std::is_same_v<Acc<BF16>, float>);
  static_assert(std::is_same_v<Acc<double>, double>);
  for (float v : {0.1f, -3.7f, 1000.25f, 1e-3f}) {
    EXPECT_NEAR(Load(Store<F16>(v)), v, std::fabs(v) * 0x1p-11f) << v;
    EXPECT_NEAR(Load(Store<BF16>(v)), v, std::fabs(v) * 0x1p-8f) << v;
  }
  // The math runs in float: a bfloat16 sum of 1 + 2^-8 (not representable)
  // and its round trip.
  const BF16 a = Store<BF16>(1.0f), b = Store<BF16>(0x1p-7f);
  EXPECT_EQ(Load(Store<BF16>(Binary(BinaryOp::kAdd, Load(a), Load(b)))),
            1.0f + 0x1p-7f);
}

}  // namespace
}  // namespace math
}  // namespace cuda
}  // namespace ferry
