#include "ferry/autograd/ops.h"

#include <cmath>
#include <string>

#include "absl/strings/match.h"
#include "ferry/autograd/engine.h"
#include "ferry/autograd/gradcheck.h"
#include "ferry/autograd/node.h"
#include "gtest/gtest.h"

namespace ferry::autograd {
namespace {

using V = std::vector<Tensor>;

Tensor R(std::vector<int64_t> shape, uint64_t seed) {
  return randn(shape, seed, DType::kFloat64);
}
// Positive values away from 0 (for log, sqrt, div, pow).
Tensor Pos(std::vector<int64_t> shape, uint64_t seed) {
  return rand(shape, seed, DType::kFloat64).add(0.5);
}

#define EXPECT_GRADCHECK(name, fn, ...)                  \
  do {                                                   \
    absl::Status s = GradCheck(name, fn, {__VA_ARGS__}); \
    EXPECT_TRUE(s.ok()) << s;                            \
  } while (0)

TEST(OpsGradTest, BroadcastingBinary) {
  for (auto [sa, sb] :
       std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>>{
           {{2, 3}, {2, 3}},
           {{2, 3}, {3}},
           {{4, 1, 3}, {2, 1}},
           {{1}, {2, 2}},
           {{}, {3}}}) {
    EXPECT_GRADCHECK(
        "add", [](const V& x) { return add(x[0], x[1]); }, R(sa, 1), R(sb, 2));
    EXPECT_GRADCHECK(
        "sub", [](const V& x) { return sub(x[0], x[1]); }, R(sa, 3), R(sb, 4));
    EXPECT_GRADCHECK(
        "mul", [](const V& x) { return mul(x[0], x[1]); }, R(sa, 5), R(sb, 6));
    EXPECT_GRADCHECK(
        "div", [](const V& x) { return div(x[0], x[1]); }, R(sa, 7),
        Pos(sb, 8));
  }
}

TEST(OpsGradTest, ScalarAndUnary) {
  auto g = [](const char* n, GradCheckFn f, Tensor x) {
    absl::Status s = GradCheck(n, f, {x});
    EXPECT_TRUE(s.ok()) << s;
  };
  g(
      "add_scalar", [](const V& x) { return add(x[0], 2.5); }, R({3}, 1));
  g(
      "sub_scalar", [](const V& x) { return sub(x[0], 2.5); }, R({3}, 2));
  g(
      "mul_scalar", [](const V& x) { return mul(x[0], -1.5); }, R({3}, 3));
  g(
      "div_scalar", [](const V& x) { return div(x[0], 4.0); }, R({3}, 4));
  g(
      "neg", [](const V& x) { return neg(x[0]); }, R({2, 2}, 5));
  g(
      "pow", [](const V& x) { return pow(x[0], 2.5); }, Pos({2, 3}, 6));
  g(
      "sqrt", [](const V& x) { return sqrt(x[0]); }, Pos({2, 3}, 7));
  g(
      "exp", [](const V& x) { return exp(x[0]); }, R({2, 3}, 8));
  g(
      "log", [](const V& x) { return log(x[0]); }, Pos({2, 3}, 9));
  g(
      "tanh", [](const V& x) { return tanh(x[0]); }, R({2, 3}, 10));
  g(
      "sigmoid", [](const V& x) { return sigmoid(x[0]); }, R({2, 3}, 11));
  g(
      "relu", [](const V& x) { return relu(x[0]); }, R({3, 4}, 12));
  g(
      "gelu", [](const V& x) { return gelu(x[0]); }, R({3, 4}, 13));
}

TEST(OpsGradTest, Where) {
  Tensor cond = from_vector<bool>({true, false, false, true}, {2, 2});
  EXPECT_GRADCHECK(
      "where", [cond](const V& x) { return where(cond, x[0], x[1]); },
      R({2, 2}, 1), R({2, 2}, 2));
}

TEST(OpsGradTest, Matmul) {
  EXPECT_GRADCHECK(
      "matmul 2d", [](const V& x) { return matmul(x[0], x[1]); }, R({3, 4}, 1),
      R({4, 2}, 2));
  EXPECT_GRADCHECK(
      "matmul transposed operand",
      [](const V& x) { return matmul(transpose(x[0], 0, 1), x[1]); },
      R({4, 3}, 3), R({4, 2}, 4));
  EXPECT_GRADCHECK(
      "matmul nd x 2d", [](const V& x) { return matmul(x[0], x[1]); },
      R({2, 3, 4}, 5), R({4, 2}, 6));
  EXPECT_GRADCHECK(
      "matmul batched", [](const V& x) { return matmul(x[0], x[1]); },
      R({2, 3, 4}, 7), R({2, 4, 5}, 8));
}

TEST(OpsGradTest, Reductions) {
  EXPECT_GRADCHECK(
      "sum", [](const V& x) { return sum(x[0]); }, R({2, 3}, 1));
  EXPECT_GRADCHECK(
      "sum dims",
      [](const V& x) {
        return sum(x[0], {0, 2});
      },
      R({2, 3, 4}, 2));
  EXPECT_GRADCHECK(
      "sum keepdim", [](const V& x) { return sum(x[0], {-1}, true); },
      R({2, 3}, 3));
  EXPECT_GRADCHECK(
      "mean", [](const V& x) { return mean(x[0]); }, R({2, 3}, 4));
  EXPECT_GRADCHECK(
      "mean dims", [](const V& x) { return mean(x[0], {1}, true); },
      R({2, 3, 2}, 5));
}

TEST(OpsGradTest, ShapesAndViews) {
  EXPECT_GRADCHECK(
      "reshape",
      [](const V& x) {
        return reshape(x[0], {3, 2});
      },
      R({2, 3}, 1));
  EXPECT_GRADCHECK(
      "view", [](const V& x) { return view(x[0], {-1}); }, R({2, 3}, 2));
  EXPECT_GRADCHECK(
      "transpose", [](const V& x) { return transpose(x[0], 0, 2); },
      R({2, 3, 4}, 3));
  EXPECT_GRADCHECK(
      "permute",
      [](const V& x) {
        return permute(x[0], {2, 0, 1});
      },
      R({2, 3, 4}, 4));
  EXPECT_GRADCHECK(
      "slice", [](const V& x) { return slice(x[0], 1, 1, 4, 2); },
      R({2, 5}, 5));
  EXPECT_GRADCHECK(
      "select", [](const V& x) { return select(x[0], 0, 1); }, R({3, 2}, 6));
  EXPECT_GRADCHECK(
      "unsqueeze", [](const V& x) { return unsqueeze(x[0], 1); }, R({3, 2}, 7));
  EXPECT_GRADCHECK(
      "squeeze", [](const V& x) { return squeeze(x[0], 0); }, R({1, 3}, 8));
  EXPECT_GRADCHECK(
      "cat",
      [](const V& x) {
        return cat({x[0], x[1]}, 1);
      },
      R({2, 1}, 9), R({2, 3}, 10));
  EXPECT_GRADCHECK(
      "stack",
      [](const V& x) {
        return stack({x[0], x[1]}, -1);
      },
      R({2, 3}, 11), R({2, 3}, 12));
}

TEST(OpsGradTest, NeuralNetworkFunctions) {
  Tensor target = from_vector<int64_t>({2, 0, 1});
  EXPECT_GRADCHECK(
      "softmax", [](const V& x) { return softmax(x[0], 1); }, R({3, 4}, 1));
  EXPECT_GRADCHECK(
      "softmax dim0", [](const V& x) { return softmax(x[0], 0); },
      R({3, 4}, 2));
  EXPECT_GRADCHECK(
      "log_softmax", [](const V& x) { return log_softmax(x[0], -1); },
      R({3, 4}, 3));
  EXPECT_GRADCHECK(
      "mse_loss", [](const V& x) { return mse_loss(x[0], x[1]); }, R({3, 2}, 4),
      R({3, 2}, 5));
  EXPECT_GRADCHECK(
      "cross_entropy", [](const V& x) { return cross_entropy(x[0], x[1]); },
      R({3, 4}, 6), target);
  EXPECT_GRADCHECK(
      "nll_loss",
      [](const V& x) { return nll_loss(log_softmax(x[0], 1), x[1]); },
      R({3, 4}, 7), target);
  Tensor idx = from_vector<int64_t>({1, 3, 1, 0}, {2, 2});
  EXPECT_GRADCHECK(
      "embedding", [](const V& x) { return embedding(x[0], x[1]); },
      R({4, 3}, 8), idx);
  EXPECT_GRADCHECK(
      "dropout", [](const V& x) { return dropout(x[0], 0.3, true, 99); },
      R({4, 5}, 9));
}

TEST(OpsGradTest, GradCheckNamesOpInputAndElementOnMismatch) {
  // A wrong gradient: a hook doubles what flows into x * 3.
  auto wrong = [](const V& x) {
    Tensor h = mul(x[1], 3.0);
    if (RequiresGrad(h))
      RegisterHook(h, [](const Tensor& g) { return g.mul(2.0); });
    return add(x[0], h);
  };
  absl::Status s = GradCheck("broken", wrong, {R({2}, 1), R({2}, 2)});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(
      absl::StrContains(s.message(), "gradcheck(broken): input 1 element 0"))
      << s;
}

TEST(OpsForwardTest, Values) {
  Tensor x = from_vector<float>({1, 2, 3, 1, 1, 1}, {2, 3});
  std::vector<float> p = softmax(x, 1).to_vector<float>();
  const float e = std::exp(1.f) + std::exp(2.f) + std::exp(3.f);
  EXPECT_NEAR(p[0], std::exp(1.f) / e, 1e-6);
  EXPECT_NEAR(p[4], 1.f / 3, 1e-6);
  // Cross entropy by hand: -(log p[0][2] + log p[1][0]) / 2.
  Tensor target = from_vector<int64_t>({2, 0});
  const double ce = cross_entropy(x, target).item<double>();
  EXPECT_NEAR(ce, -(std::log(std::exp(3.0) / e) + std::log(1.0 / 3)) / 2, 1e-5);
  EXPECT_EQ(relu(from_vector<float>({-1, 2})).to_vector<float>(),
            (std::vector<float>{0, 2}));
  EXPECT_NEAR(gelu(from_vector<double>({1.0})).item<double>(),
              0.8413447460685429, 1e-12);
  Tensor b = add(x, from_vector<float>({10, 20, 30}));
  EXPECT_EQ(b.to_vector<float>(), (std::vector<float>{11, 22, 33, 11, 21, 31}));
  Tensor m = matmul(x, transpose(x, 0, 1));
  EXPECT_EQ(m.to_vector<float>(), (std::vector<float>{14, 6, 6, 3}));
  Tensor d = dropout(ones({1000}), 0.25, true, 7);
  int zeros_seen = 0;
  for (float v : d.to_vector<float>()) {
    if (v == 0)
      ++zeros_seen;
    else
      EXPECT_FLOAT_EQ(v, 1.f / 0.75f);
  }
  EXPECT_GT(zeros_seen, 180);
  EXPECT_LT(zeros_seen, 320);
  EXPECT_TRUE(dropout(x, 0.5, false, 1).equal(x));
}

TEST(OpsFloat32Test, BackwardMatchesFloat64) {
  Tensor a64 = R({3, 4}, 1), b64 = R({4, 2}, 2);
  Tensor a32 = a64.to(DType::kFloat32), b32 = b64.to(DType::kFloat32);
  SetRequiresGrad(a64);
  SetRequiresGrad(a32);
  ASSERT_TRUE(Backward({sum(tanh(matmul(a64, b64)))}).ok());
  ASSERT_TRUE(Backward({sum(tanh(matmul(a32, b32)))}).ok());
  EXPECT_EQ(GradOf(a32).dtype(), DType::kFloat32);
  EXPECT_TRUE(GradOf(a32).allclose(GradOf(a64), 1e-4, 1e-5));
}

TEST(OpsViewTest, ResultsNeverShareInputAutogradState) {
  Tensor a = R({2, 3}, 1);
  SetRequiresGrad(a);
  Tensor v = reshape(a, {2, 3});  // Same shape: still a distinct object.
  EXPECT_FALSE(v.is_same(a));
  EXPECT_TRUE(IsLeaf(a));
  EXPECT_FALSE(IsLeaf(v));
}

// A tensor labelled as on cuda:0 over host bytes, made without a compute
// backend (so a missing check would read them rather than crash): ops that
// dispatch to devices refuse it naming the op, the operands and the missing
// backend; a CPU and a CUDA operand in one op abort naming both devices;
// CPU-only ops refuse it naming the device.
TEST(OpsDeviceTest, CudaOperandsAbortNamingTheOpAndDevice) {
  Tensor host = ones({2, 2});
  Tensor dev = *Tensor::FromStorage(
      Storage::Wrap(host.data_ptr(), host.nbytes(), Device::CUDA(0), nullptr),
      DType::kFloat32, {2, 2}, {2, 1});
  Tensor idx = from_vector<int64_t>({0, 1});
  const std::string no_backend =
      ": device tensor without a compute backend \\(float32 \\[2, 2\\] on "
      "cuda:0";
  EXPECT_DEATH(relu(dev), "relu" + no_backend);
  EXPECT_DEATH(tanh(dev), "tanh" + no_backend);
  EXPECT_DEATH(mul(dev, 2.0), "mul" + no_backend);
  EXPECT_DEATH(sum(dev, {0}), "sum" + no_backend);
  EXPECT_DEATH(softmax(dev, 1), "softmax" + no_backend);
  EXPECT_DEATH(log_softmax(dev, 1), "log_softmax" + no_backend);
  EXPECT_DEATH(add(host, dev),
               "add: operands on different devices \\(float32 \\[2, 2\\] on "
               "cpu, float32 \\[2, 2\\] on cuda:0\\)");
  EXPECT_DEATH(matmul(host, dev), "matmul: operands on different devices");
  EXPECT_DEATH(cross_entropy(dev, idx), "cross_entropy: operands on different "
                                        "devices");
  EXPECT_DEATH(embedding(dev, idx), "embedding: operands on different "
                                    "devices");
  // The same ops on the CPU tensor still compute.
  EXPECT_EQ(relu(host).sum().item(), 4.0);
}

}  // namespace
}  // namespace ferry::autograd
