#include "ferry/autograd/kernels.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ferry::autograd::kernels {
namespace {

std::string Shape(const std::vector<int64_t>& s) {
  return absl::StrCat("[", absl::StrJoin(s, ", "), "]");
}

int64_t Normalize(int64_t d, int64_t ndim, const char* op) {
  if (d < 0) d += ndim;
  if (d < 0 || d >= ndim) {
    TensorFail(
        absl::StrCat(op, ": dimension out of range for ", ndim, "-d tensor"));
  }
  return d;
}

}  // namespace

std::vector<int64_t> BroadcastShape(const std::vector<int64_t>& a,
                                    const std::vector<int64_t>& b,
                                    const char* op) {
  if (a == b) return a;
  const size_t n = std::max(a.size(), b.size());
  std::vector<int64_t> out(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    if (da != db && da != 1 && db != 1) {
      TensorFail(absl::StrCat(op, ": shapes ", Shape(a), " and ", Shape(b),
                              " do not broadcast"));
    }
    out[i] = da == 1 ? db : da;
  }
  return out;
}

Tensor Materialize(const Tensor& t, const std::vector<int64_t>& shape) {
  t.CheckCpu("Materialize");
  const int64_t lead = static_cast<int64_t>(shape.size()) - t.dim();
  if (lead < 0) TensorFail("Materialize: target has fewer dims");
  if (t.numel() == 1 && (t.dtype() == DType::kFloat32 ||
                         t.dtype() == DType::kFloat64)) {
    // One value (a reduction's gradient): a plain fill.
    Tensor out = empty(shape, t.dtype());
    FloatDispatch(t.dtype(), "Materialize", [&]<typename T>() {
      std::fill_n(out.data<T>(), out.numel(), t.to_vector<T>()[0]);
    });
    return out;
  }
  std::vector<int64_t> strides(shape.size(), 0);
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) == shape[lead + d]) {
      strides[lead + d] = t.strides()[d];
    } else if (t.size(d) != 1) {
      TensorFail(absl::StrCat("Materialize: cannot broadcast ",
                              Shape(t.sizes()), " to ", Shape(shape)));
    }
  }
  Tensor view = *Tensor::FromStorage(t.storage(), t.dtype(), shape, strides,
                                     t.storage_offset());
  Tensor out = empty(shape, t.dtype());
  out.copy_(view);
  return out;
}

Tensor SumDims(const Tensor& t, std::vector<int64_t> dims, bool keepdim) {
  t.CheckCpu("sum");
  for (int64_t& d : dims) d = Normalize(d, t.dim(), "sum");
  std::sort(dims.begin(), dims.end());
  dims.erase(std::unique(dims.begin(), dims.end()), dims.end());
  Tensor r = t;
  for (int64_t d : dims) r = r.sum(d, /*keepdim=*/true);
  if (keepdim) return r;
  std::vector<int64_t> shape;
  for (int64_t d = 0; d < t.dim(); ++d)
    if (!std::binary_search(dims.begin(), dims.end(), d))
      shape.push_back(t.size(d));
  return r.reshape(shape);
}

Tensor ReduceTo(const Tensor& g, const std::vector<int64_t>& shape) {
  if (g.sizes() == shape) return g;
  const int64_t lead = g.dim() - static_cast<int64_t>(shape.size());
  if (lead < 0) TensorFail("ReduceTo: target has more dims than gradient");
  int64_t inner = 1;
  for (int64_t s : shape) inner *= s;
  const bool suffix =
      std::equal(shape.begin(), shape.end(), g.sizes().begin() + lead);
  if (suffix && inner > 0) {  // Only leading dims were added: sum rows.
    Tensor gc = g.contiguous();
    Tensor out = zeros(shape, g.dtype());
    FloatDispatch(g.dtype(), "ReduceTo", [&]<typename T>() {
      const T* pg = gc.data<T>();
      T* po = out.data<T>();
      const int64_t n = gc.numel();
      for (int64_t o = 0; o < n; o += inner)
        for (int64_t j = 0; j < inner; ++j) po[j] += pg[o + j];
    });
    return out;
  }
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < g.dim(); ++d)
    if (d < lead || (shape[d - lead] == 1 && g.size(d) != 1)) dims.push_back(d);
  return SumDims(g, dims, /*keepdim=*/true).reshape(shape);
}

namespace {

// `t` as a row-major operand: itself when contiguous, or the contiguous
// tensor it is the transpose of (flipping `*trans`), else a copy.
Tensor GemmOperand(const Tensor& t, bool* trans) {
  if (t.is_contiguous()) return t;
  if (t.strides()[0] == 1 && t.strides()[1] == t.size(0)) {
    *trans = !*trans;
    return t.t();
  }
  return t.contiguous();
}

}  // namespace

Tensor Gemm(const Tensor& a_in, bool trans_a, const Tensor& b_in,
            bool trans_b) {
  a_in.CheckCpu("matmul");
  b_in.CheckCpu("matmul");
  if (a_in.dim() != 2 || b_in.dim() != 2 || a_in.dtype() != b_in.dtype()) {
    TensorFail(
        absl::StrCat("matmul: expected two 2-d tensors of one dtype, "
                     "got ",
                     Shape(a_in.sizes()), " and ", Shape(b_in.sizes())));
  }
  const int64_t m = trans_a ? a_in.size(1) : a_in.size(0);
  const int64_t k = trans_a ? a_in.size(0) : a_in.size(1);
  const int64_t kb = trans_b ? b_in.size(1) : b_in.size(0);
  const int64_t n = trans_b ? b_in.size(0) : b_in.size(1);
  if (k != kb) {
    TensorFail(absl::StrCat("matmul: inner dimensions differ: ",
                            Shape(a_in.sizes()), " x ", Shape(b_in.sizes())));
  }
  constexpr int64_t kIntMax = std::numeric_limits<int>::max();
  if (m > kIntMax || n > kIntMax || k > kIntMax)
    TensorFail("matmul: dimension exceeds INT_MAX");
  Tensor a = GemmOperand(a_in, &trans_a), b = GemmOperand(b_in, &trans_b);
  Tensor out = empty({m, n}, a.dtype());
  if (m == 0 || n == 0) return out;
  if (k == 0) return out.zero_();
  const auto ta = trans_a ? CblasTrans : CblasNoTrans;
  const auto tb = trans_b ? CblasTrans : CblasNoTrans;
  const int lda = static_cast<int>(a.size(1)),
            ldb = static_cast<int>(b.size(1));
  const int im = static_cast<int>(m), in = static_cast<int>(n),
            ik = static_cast<int>(k);
  if (a.dtype() == DType::kFloat32) {
    cblas_sgemm(CblasRowMajor, ta, tb, im, in, ik, 1.0f, a.data<float>(), lda,
                b.data<float>(), ldb, 0.0f, out.data<float>(), in);
  } else {
    a.CheckDType(DType::kFloat64, "matmul");
    cblas_dgemm(CblasRowMajor, ta, tb, im, in, ik, 1.0, a.data<double>(), lda,
                b.data<double>(), ldb, 0.0, out.data<double>(), in);
  }
  return out;
}

Tensor SoftmaxLast(const Tensor& t, bool log) {
  t.CheckCpu(log ? "log_softmax" : "softmax");
  Tensor tc = t.contiguous();
  Tensor out = empty(t.sizes(), t.dtype());
  const int64_t cols = t.dim() == 0 ? 1 : t.size(-1);
  if (cols == 0) return out;
  FloatDispatch(t.dtype(), "softmax", [&]<typename T>() {
    const T* p = tc.data<T>();
    T* o = out.data<T>();
    for (int64_t r = 0; r < tc.numel(); r += cols) {
      T mx = p[r];
      for (int64_t j = 1; j < cols; ++j) mx = std::max(mx, p[r + j]);
      T total = 0;
      for (int64_t j = 0; j < cols; ++j) total += std::exp(p[r + j] - mx);
      const T log_total = std::log(total);
      for (int64_t j = 0; j < cols; ++j) {
        const T v = p[r + j] - mx - log_total;
        o[r + j] = log ? v : std::exp(v);
      }
    }
  });
  return out;
}

}  // namespace ferry::autograd::kernels
