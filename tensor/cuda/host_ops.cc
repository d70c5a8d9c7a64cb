#include "ferry/tensor/cuda/host_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ferry/common/status.h"

namespace ferry {
namespace cuda {
namespace {

using Operands = std::initializer_list<const Tensor*>;

std::string Describe(Operands ts) {
  std::vector<std::string> parts;
  for (const Tensor* t : ts) parts.push_back(DescribeOperand(*t));
  return absl::StrJoin(parts, "; ");
}

absl::Status Bad(const char* op, const std::string& why, Operands ts) {
  return absl::InvalidArgumentError(
      absl::StrCat("host-fake ", op, ": ", why, " (", Describe(ts), ")"));
}

// Operand i (of `ts`) is strided over `out` when broadcast (stride 0 on
// size-1 and missing leading dims).
math::StridedIndexer Strided(const Tensor& t, const std::vector<int64_t>& out) {
  math::StridedIndexer ix;
  ix.dims = static_cast<int32_t>(out.size());
  for (int64_t d = 0; d < ix.dims; ++d) {
    const int64_t src = d - (ix.dims - t.dim());
    ix.sizes[d] = out[d];
    ix.strides[d] =
        src >= 0 && t.size(src) != 1 ? t.strides()[src] : int64_t{0};
  }
  return ix;
}

template <typename T>
T* At(const Tensor& t) {
  return static_cast<T*>(t.data_ptr());
}

template <typename F>
auto ForFloat(DType dtype, F&& f) {
  if (dtype == DType::kFloat64) return f.template operator()<double>();
  return f.template operator()<float>();
}

// ForFloat, also for the kernels' 16-bit types (computing in float through
// math::Load/Store, as kernels.cu does).
template <typename F>
auto ForCompute(DType dtype, F&& f) {
  if (dtype == DType::kFloat16) return f.template operator()<math::F16>();
  if (dtype == DType::kBFloat16) return f.template operator()<math::BF16>();
  return ForFloat(dtype, std::forward<F>(f));
}

// Device bytes of float16/bfloat16 tensors are read as the kernels' types.
static_assert(sizeof(math::F16) == sizeof(Half) &&
              sizeof(math::BF16) == sizeof(BFloat16));

// The element at `p[i]` widened to math::Acc<T>.
template <typename T>
math::Acc<T> Ld(const T* p, int64_t i) {
  return math::Load(p[i]);
}

class HostOps final : public ContextBoundOps {
 public:
  HostOps(CudaContext* ctx, std::shared_ptr<FakeDeviceApi> api)
      : ContextBoundOps(ctx), api_(std::move(api)) {}
  std::string name() const override { return "host-fake"; }

  absl::StatusOr<Tensor> To(const Tensor& t, Device device) override {
    absl::ReaderMutexLock lock(&mu_);
    ASSIGN_OR_RETURN(CudaContext * c, Context("to"));
    return c->To(t, device);
  }
  absl::StatusOr<Tensor> Empty(const std::vector<int64_t>& sizes, DType dtype,
                               Device device) override {
    absl::ReaderMutexLock lock(&mu_);
    ASSIGN_OR_RETURN(CudaContext * c, Context("empty"));
    return c->Empty(sizes, dtype, device);
  }

  absl::StatusOr<Tensor> Unary(math::UnaryOp op, const Tensor& x) override {
    absl::ReaderMutexLock lock(&mu_);
    ASSIGN_OR_RETURN(CudaContext * c, Check("unary", {&x}, 1, true));
    return Map(*c, x, [op](auto v) { return math::Unary(op, v); });
  }

  absl::StatusOr<Tensor> Binary(math::BinaryOp op, const Tensor& a,
                                const Tensor& b) override {
    absl::ReaderMutexLock lock(&mu_);
    ASSIGN_OR_RETURN(CudaContext * c, Check("binary", {&a, &b}, 2, true));
    const std::optional<std::vector<int64_t>> bcast =
        BroadcastSizes(a.sizes(), b.sizes());
    if (!bcast) return Bad("binary", "shapes do not broadcast", {&a, &b});
    const std::vector<int64_t>& sizes = *bcast;
    ASSIGN_OR_RETURN(Tensor out, c->Empty(sizes, a.dtype(), a.device()));
    const math::StridedIndexer ia = Strided(a, sizes), ib = Strided(b, sizes);
    ForCompute(a.dtype(), [&]<typename T>() {
      const T *pa = At<T>(a), *pb = At<T>(b);
      T* po = At<T>(out);
      for (int64_t i = 0; i < out.numel(); ++i)
        po[i] = math::Store<T>(
            math::Binary(op, Ld(pa, ia.Offset(i)), Ld(pb, ib.Offset(i))));
    });
    return out;
  }

  absl::StatusOr<Tensor> Scalar(math::BinaryOp op, const Tensor& x,
                                double s) override {
    absl::ReaderMutexLock lock(&mu_);
    ASSIGN_OR_RETURN(CudaContext * c, Check("scalar", {&x}, 1, true));
    return Map(*c, x, [op, s](auto v) {
      return math::Binary(op, v, static_cast<decltype(v)>(s));
    });
  }

  absl::StatusOr<Tensor> UnaryBackward(math::BackwardOp op, const Tensor& g,
                                       const Tensor& saved) override {
    absl::ReaderMutexLock lock(&mu_);
    ASSIGN_OR_RETURN(CudaContext * c,
                     Check("unary_backward", {&g, &saved}, 2, true));
    if (g.sizes() != saved.sizes()) {
      return Bad("unary_backward", "shapes differ", {&g, &saved});
    }
    ASSIGN_OR_RETURN(Tensor out, c->Empty(g.sizes(), g.dtype(), g.device()));
    const math::StridedIndexer ig = Strided(g, g.sizes()),
                               is = Strided(saved, g.sizes());
    ForCompute(g.dtype(), [&]<typename T>() {
      const T *pg = At<T>(g), *ps = At<T>(saved);
      T* po = At<T>(out);
      for (int64_t i = 0; i < out.numel(); ++i)
        po[i] = math::Store<T>(
            math::Backward(op, Ld(pg, ig.Offset(i)), Ld(ps, is.Offset(i))));
    });
    return out;
  }

  absl::Status Fill(const Tensor& x, double value) override {
    absl::ReaderMutexLock lock(&mu_);
    RETURN_IF_ERROR(Check("fill_", {&x}, 1, true).status());
    if (!x.is_contiguous()) return Bad("fill_", "x is not contiguous", {&x});
    x.storage().BumpVersion();
    ForCompute(x.dtype(), [&]<typename T>() {
      std::fill_n(At<T>(x), x.numel(),
                  math::Store<T>(static_cast<math::Acc<T>>(value)));
    });
    return absl::OkStatus();
  }

  absl::Status AddInPlace(const Tensor& acc, const Tensor& x) override {
    absl::ReaderMutexLock lock(&mu_);
    RETURN_IF_ERROR(Check("add_", {&acc, &x}, 2, true).status());
    if (acc.sizes() != x.sizes() || !acc.is_contiguous()) {
      return Bad("add_", "needs a contiguous acc of x's shape", {&acc, &x});
    }
    acc.storage().BumpVersion();
    const math::StridedIndexer ix = Strided(x, acc.sizes());
    ForCompute(acc.dtype(), [&]<typename T>() {
      T* pa = At<T>(acc);
      const T* px = At<T>(x);
      for (int64_t i = 0; i < acc.numel(); ++i)
        pa[i] = math::Store<T>(Ld(pa, i) + Ld(px, ix.Offset(i)));
    });
    return absl::OkStatus();
  }

  absl::StatusOr<Tensor> Sum(const Tensor& x) override {
    absl::ReaderMutexLock lock(&mu_);
    ASSIGN_OR_RETURN(CudaContext * c, Check("sum", {&x}, 1, true));
    ASSIGN_OR_RETURN(Tensor out, c->Empty({}, x.dtype(), x.device()));
    const math::StridedIndexer ix = Strided(x, x.sizes());
    ForCompute(x.dtype(), [&]<typename T>() {
      const T* px = At<T>(x);
      double total = 0;
      for (int64_t i = 0; i < x.numel(); ++i) total += Ld(px, ix.Offset(i));
      *At<T>(out) = math::Store<T>(static_cast<math::Acc<T>>(total));
    });
    return out;
  }

  absl::StatusOr<Tensor> SumDim(const Tensor& x, int64_t dim,
                                bool keepdim) override {
    absl::ReaderMutexLock lock(&mu_);
    ASSIGN_OR_RETURN(CudaContext * c, Check("sum", {&x}, 1, true));
    const int64_t d = dim < 0 ? dim + x.dim() : dim;
    if (d < 0 || d >= x.dim()) {
      return Bad("sum", absl::StrCat("dim ", dim, " out of range"), {&x});
    }
    std::vector<int64_t> sizes = x.sizes();
    if (keepdim) {
      sizes[d] = 1;
    } else {
      sizes.erase(sizes.begin() + d);
    }
    ASSIGN_OR_RETURN(Tensor out, c->Empty(sizes, x.dtype(), x.device()));
    int64_t outer = 1, inner = 1;
    for (int64_t i = 0; i < d; ++i) outer *= x.size(i);
    for (int64_t i = d + 1; i < x.dim(); ++i) inner *= x.size(i);
    const int64_t n = x.size(d);
    const math::StridedIndexer ix = Strided(x, x.sizes());
    ForCompute(x.dtype(), [&]<typename T>() {
      const T* px = At<T>(x);
      T* po = At<T>(out);
      for (int64_t o = 0; o < outer; ++o) {
        for (int64_t in = 0; in < inner; ++in) {
          double total = 0;
          for (int64_t j = 0; j < n; ++j)
            total += Ld(px, ix.Offset((o * n + j) * inner + in));
          po[o * inner + in] =
              math::Store<T>(static_cast<math::Acc<T>>(total));
        }
      }
    });
    return out;
  }

  absl::StatusOr<Tensor> Softmax(const Tensor& x, bool log) override {
    absl::ReaderMutexLock lock(&mu_);
    ASSIGN_OR_RETURN(CudaContext * c, Check("softmax", {&x}, 1, true));
    if (x.dim() == 0) return Bad("softmax", "x is 0-d", {&x});
    ASSIGN_OR_RETURN(Tensor out, c->Empty(x.sizes(), x.dtype(), x.device()));
    const int64_t cols = x.size(-1), rows = cols == 0 ? 0 : x.numel() / cols;
    const math::StridedIndexer ix = Strided(x, x.sizes());
    ForCompute(x.dtype(), [&]<typename T>() {
      using A = math::Acc<T>;
      const T* px = At<T>(x);
      T* po = At<T>(out);
      for (int64_t r = 0; r < rows; ++r) {
        math::SoftmaxAcc<A> acc = math::EmptySoftmaxAcc<A>();
        for (int64_t j = 0; j < cols; ++j)
          acc.Add(Ld(px, ix.Offset(r * cols + j)));
        const A lse = acc.LogSumExp();
        for (int64_t j = 0; j < cols; ++j) {
          const A shifted = Ld(px, ix.Offset(r * cols + j)) - lse;
          po[r * cols + j] = math::Store<T>(log ? shifted : std::exp(shifted));
        }
      }
    });
    return out;
  }

  absl::StatusOr<Tensor> SoftmaxBackward(const Tensor& g, const Tensor& y,
                                         bool log) override {
    absl::ReaderMutexLock lock(&mu_);
    ASSIGN_OR_RETURN(CudaContext * c, Check("softmax_backward", {&g, &y}, 2, true));
    if (g.sizes() != y.sizes() || y.dim() == 0) {
      return Bad("softmax_backward", "needs g and y of one shape, not 0-d",
                 {&g, &y});
    }
    ASSIGN_OR_RETURN(Tensor out, c->Empty(y.sizes(), y.dtype(), y.device()));
    const int64_t cols = y.size(-1), rows = cols == 0 ? 0 : y.numel() / cols;
    const math::StridedIndexer ig = Strided(g, y.sizes()),
                               iy = Strided(y, y.sizes());
    ForCompute(y.dtype(), [&]<typename T>() {
      using A = math::Acc<T>;
      const T *pg = At<T>(g), *py = At<T>(y);
      T* po = At<T>(out);
      for (int64_t r = 0; r < rows; ++r) {
        A row = 0;  // sum(g) for log-softmax, dot(g, y) for softmax.
        for (int64_t j = 0; j < cols; ++j) {
          const int64_t i = r * cols + j;
          const A gv = Ld(pg, ig.Offset(i));
          row += log ? gv : gv * Ld(py, iy.Offset(i));
        }
        for (int64_t j = 0; j < cols; ++j) {
          const int64_t i = r * cols + j;
          const A gv = Ld(pg, ig.Offset(i)), yv = Ld(py, iy.Offset(i));
          po[i] = math::Store<T>(log ? math::LogSoftmaxBackward(gv, yv, row)
                                     : math::SoftmaxBackward(gv, yv, row));
        }
      }
    });
    return out;
  }

  absl::StatusOr<std::pair<Tensor, Tensor>> CrossEntropy(
      const Tensor& logits, const Tensor& target) override {
    absl::ReaderMutexLock lock(&mu_);
    ASSIGN_OR_RETURN(CudaContext * c,
                     Check("cross_entropy", {&logits, &target}, 1, true));
    RETURN_IF_ERROR(CheckRowsTargets("cross_entropy", logits, target));
    const int64_t rows = logits.size(0), cols = logits.size(1);
    ASSIGN_OR_RETURN(Tensor loss, c->Empty({}, logits.dtype(), logits.device()));
    ASSIGN_OR_RETURN(Tensor lse,
                     c->Empty({rows}, logits.dtype(), logits.device()));
    const math::StridedIndexer ix = Strided(logits, logits.sizes());
    const math::StridedIndexer it = Strided(target, target.sizes());
    const int64_t* pt = At<int64_t>(target);
    ForCompute(logits.dtype(), [&]<typename T>() {
      using A = math::Acc<T>;
      const T* px = At<T>(logits);
      T* pl = At<T>(lse);
      double total = 0;
      for (int64_t r = 0; r < rows; ++r) {
        math::SoftmaxAcc<A> acc = math::EmptySoftmaxAcc<A>();
        for (int64_t j = 0; j < cols; ++j)
          acc.Add(Ld(px, ix.Offset(r * cols + j)));
        const A l = acc.LogSumExp();
        pl[r] = math::Store<T>(l);
        total += l - Ld(px, ix.Offset(r * cols + pt[it.Offset(r)]));
      }
      *At<T>(loss) =
          math::Store<T>(static_cast<A>(rows == 0 ? 0.0 : total / rows));
    });
    return std::make_pair(loss, lse);
  }

  absl::StatusOr<Tensor> CrossEntropyBackward(
      const Tensor& logits, const Tensor& target, const Tensor& lse,
      const Tensor& grad_loss) override {
    absl::ReaderMutexLock lock(&mu_);
    ASSIGN_OR_RETURN(CudaContext * c,
                     Check("cross_entropy_backward",
                           {&logits, &lse, &grad_loss, &target}, 3, true));
    RETURN_IF_ERROR(
        CheckRowsTargets("cross_entropy_backward", logits, target));
    if (lse.dim() != 1 || lse.size(0) != logits.size(0) ||
        grad_loss.numel() != 1) {
      return Bad("cross_entropy_backward",
                 "needs lse [N] and a one-element grad_loss",
                 {&logits, &lse, &grad_loss});
    }
    const int64_t rows = logits.size(0), cols = logits.size(1);
    ASSIGN_OR_RETURN(Tensor out, c->Empty(logits.sizes(), logits.dtype(),
                                          logits.device()));
    const math::StridedIndexer ix = Strided(logits, logits.sizes());
    const math::StridedIndexer it = Strided(target, target.sizes());
    const math::StridedIndexer il = Strided(lse, lse.sizes());
    const int64_t* pt = At<int64_t>(target);
    ForCompute(logits.dtype(), [&]<typename T>() {
      const T *px = At<T>(logits), *pl = At<T>(lse);
      const math::Acc<T> g = Ld(At<T>(grad_loss), 0);
      T* po = At<T>(out);
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t j = 0; j < cols; ++j) {
          po[r * cols + j] = math::Store<T>(math::CrossEntropyBackward(
              Ld(px, ix.Offset(r * cols + j)), Ld(pl, il.Offset(r)),
              pt[it.Offset(r)] == j, g, rows));
        }
      }
    });
    return out;
  }

  absl::StatusOr<Tensor> Embedding(const Tensor& weight,
                                   const Tensor& indices) override {
    absl::ReaderMutexLock lock(&mu_);
    ASSIGN_OR_RETURN(CudaContext * c,
                     Check("embedding", {&weight, &indices}, 1));
    if (weight.dim() != 2 || indices.dim() + 1 > math::kMaxKernelDims) {
      return Bad("embedding", "needs a 2-D weight", {&weight, &indices});
    }
    const int64_t vocab = weight.size(0), width = weight.size(1);
    std::vector<int64_t> sizes = indices.sizes();
    sizes.push_back(width);
    ASSIGN_OR_RETURN(Tensor out, c->Empty(sizes, weight.dtype(),
                                          weight.device()));
    const math::StridedIndexer ii = Strided(indices, indices.sizes());
    const int64_t* pi = At<int64_t>(indices);
    for (int64_t r = 0; r < indices.numel(); ++r) {
      const int64_t v = pi[ii.Offset(r)];
      if (v < 0 || v >= vocab) {
        return Bad("embedding",
                   absl::StrCat("index ", v, " is outside [0, ", vocab, ")"),
                   {&weight, &indices});
      }
    }
    ForFloat(weight.dtype(), [&]<typename T>() {
      const T* pw = At<T>(weight);
      T* po = At<T>(out);
      const int64_t s0 = weight.strides()[0], s1 = weight.strides()[1];
      for (int64_t r = 0; r < indices.numel(); ++r) {
        const int64_t v = pi[ii.Offset(r)];
        for (int64_t j = 0; j < width; ++j)
          po[r * width + j] = pw[v * s0 + j * s1];
      }
    });
    return out;
  }

  absl::StatusOr<Tensor> EmbeddingBackward(const Tensor& g,
                                           const Tensor& indices,
                                           int64_t vocab) override {
    absl::ReaderMutexLock lock(&mu_);
    ASSIGN_OR_RETURN(CudaContext * c,
                     Check("embedding_backward", {&g, &indices}, 1));
    if (g.dim() != indices.dim() + 1 || vocab < 0 ||
        !std::equal(indices.sizes().begin(), indices.sizes().end(),
                    g.sizes().begin())) {
      return Bad("embedding_backward",
                 absl::StrCat("needs grad [*indices, D] and vocab >= 0 (vocab ",
                              vocab, ")"),
                 {&g, &indices});
    }
    const int64_t width = g.size(-1);
    ASSIGN_OR_RETURN(Tensor out, c->Empty({vocab, width}, g.dtype(),
                                          g.device()));
    const math::StridedIndexer ii = Strided(indices, indices.sizes());
    const math::StridedIndexer ig = Strided(g, g.sizes());
    const int64_t* pi = At<int64_t>(indices);
    ForFloat(g.dtype(), [&]<typename T>() {
      const T* pg = At<T>(g);
      T* po = At<T>(out);
      std::fill_n(po, out.numel(), T(0));
      for (int64_t r = 0; r < indices.numel(); ++r) {
        const int64_t v = pi[ii.Offset(r)];
        if (v < 0 || v >= vocab) continue;  // The forward refused it.
        for (int64_t j = 0; j < width; ++j)
          po[v * width + j] += pg[ig.Offset(r * width + j)];
      }
    });
    return out;
  }

  absl::StatusOr<Tensor> Matmul(const Tensor& a, const Tensor& b,
                                bool transpose_a, bool transpose_b) override {
    absl::ReaderMutexLock lock(&mu_);
    ASSIGN_OR_RETURN(CudaContext * c, Check("matmul", {&a, &b}, 2, true));
    if (a.dim() != 2 || b.dim() != 2) {
      return Bad("matmul", "needs 2-D operands", {&a, &b});
    }
    const int64_t m = transpose_a ? a.size(1) : a.size(0);
    const int64_t k = transpose_a ? a.size(0) : a.size(1);
    const int64_t kb = transpose_b ? b.size(1) : b.size(0);
    const int64_t n = transpose_b ? b.size(0) : b.size(1);
    if (k != kb) {
      return Bad("matmul", absl::StrCat("inner sizes ", k, " and ", kb,
                                        " differ"),
                 {&a, &b});
    }
    ASSIGN_OR_RETURN(Tensor out, c->Empty({m, n}, a.dtype(), a.device()));
    MatmulInto(a, b, transpose_a, transpose_b, out);
    return out;
  }

  absl::StatusOr<Tensor> BatchedMatmul(const Tensor& a, const Tensor& b,
                                       bool transpose_a,
                                       bool transpose_b) override {
    absl::ReaderMutexLock lock(&mu_);
    ASSIGN_OR_RETURN(CudaContext * c, Check("batched_matmul", {&a, &b}, 2, true));
    if (a.dim() != 3 || b.dim() != 3 || a.size(0) != b.size(0)) {
      return Bad("batched_matmul", "needs 3-D operands of one batch size",
                 {&a, &b});
    }
    const int64_t m = a.size(transpose_a ? 2 : 1);
    const int64_t k = a.size(transpose_a ? 1 : 2);
    const int64_t kb = b.size(transpose_b ? 2 : 1);
    const int64_t n = b.size(transpose_b ? 1 : 2);
    if (k != kb) {
      return Bad("batched_matmul",
                 absl::StrCat("inner sizes ", k, " and ", kb, " differ"),
                 {&a, &b});
    }
    ASSIGN_OR_RETURN(Tensor out,
                     c->Empty({a.size(0), m, n}, a.dtype(), a.device()));
    for (int64_t i = 0; i < a.size(0); ++i) {
      MatmulInto(a.select(0, i), b.select(0, i), transpose_a, transpose_b,
                 out.select(0, i));
    }
    return out;
  }

  absl::Status CopyInto(const Tensor& dst, const Tensor& src) override {
    absl::ReaderMutexLock lock(&mu_);
    RETURN_IF_ERROR(Check("copy_into", {&dst, &src}, kSameDType).status());
    const std::optional<std::vector<int64_t>> bcast =
        BroadcastSizes(dst.sizes(), src.sizes());
    if (!bcast || *bcast != dst.sizes()) {
      return Bad("copy_into", "src does not broadcast to dst's shape",
                 {&dst, &src});
    }
    dst.storage().BumpVersion();
    const math::StridedIndexer id = Strided(dst, dst.sizes()),
                               is = Strided(src, dst.sizes());
    // Any dtype: each element's bytes.
    const size_t size = dst.itemsize();
    const char* ps = At<char>(src);
    char* pd = At<char>(dst);
    for (int64_t i = 0; i < dst.numel(); ++i) {
      std::memcpy(pd + id.Offset(i) * size, ps + is.Offset(i) * size, size);
    }
    return absl::OkStatus();
  }

  absl::StatusOr<Tensor> Cast(const Tensor& x, DType dtype) override {
    absl::ReaderMutexLock lock(&mu_);
    ASSIGN_OR_RETURN(CudaContext * c, Check("cast", {&x}, kSameDType));
    auto floating16 = [](DType d) {
      return d == DType::kFloat32 || d == DType::kFloat64 ||
             d == DType::kFloat16 || d == DType::kBFloat16;
    };
    if (!floating16(x.dtype()) || !floating16(dtype)) {
      return Bad("cast",
                 "converts only between float32, float64, float16 and "
                 "bfloat16",
                 {&x});
    }
    // The device bytes are host memory: the CPU's conversion over an alias.
    const Storage& s = x.storage();
    auto keep = std::make_shared<Storage>(s);
    ASSIGN_OR_RETURN(
        Tensor alias,
        Tensor::FromStorage(
            Storage::Wrap(s.data(), s.nbytes(), Device::CPU(),
                          std::shared_ptr<const void>(keep, keep.get())),
            x.dtype(), x.sizes(), x.strides(), x.storage_offset()));
    const Tensor converted = alias.to(dtype).contiguous();
    ASSIGN_OR_RETURN(Tensor out, c->Empty(x.sizes(), dtype, x.device()));
    if (out.nbytes() > 0) {
      std::memcpy(out.data_ptr(), converted.data_ptr(), out.nbytes());
    }
    return out;
  }

  absl::StatusOr<Tensor> Where(const Tensor& cond, const Tensor& a,
                               const Tensor& b) override {
    absl::ReaderMutexLock lock(&mu_);
    ASSIGN_OR_RETURN(CudaContext * c, Check("where", {&a, &b}, 2, true));
    if (!cond.defined() || cond.device() != a.device() ||
        cond.dtype() != DType::kBool || cond.dim() > math::kMaxKernelDims) {
      return Bad("where", "cond must be bool on a's device", {&cond, &a, &b});
    }
    std::optional<std::vector<int64_t>> bcast =
        BroadcastSizes(a.sizes(), b.sizes());
    if (bcast) bcast = BroadcastSizes(cond.sizes(), *bcast);
    if (!bcast) return Bad("where", "shapes do not broadcast", {&cond, &a, &b});
    const std::vector<int64_t>& sizes = *bcast;
    ASSIGN_OR_RETURN(Tensor out, c->Empty(sizes, a.dtype(), a.device()));
    const math::StridedIndexer ic = Strided(cond, sizes),
                               ia = Strided(a, sizes), ib = Strided(b, sizes);
    const bool* pc = At<bool>(cond);
    ForCompute(a.dtype(), [&]<typename T>() {
      const T *pa = At<T>(a), *pb = At<T>(b);
      T* po = At<T>(out);
      for (int64_t i = 0; i < out.numel(); ++i)
        po[i] = pc[ic.Offset(i)] ? pa[ia.Offset(i)] : pb[ib.Offset(i)];
    });
    return out;
  }

  absl::StatusOr<Tensor> NllLoss(const Tensor& log_probs,
                                 const Tensor& target) override {
    absl::ReaderMutexLock lock(&mu_);
    ASSIGN_OR_RETURN(CudaContext * c,
                     Check("nll_loss", {&log_probs, &target}, 1));
    RETURN_IF_ERROR(CheckRowsTargets("nll_loss", log_probs, target));
    const int64_t rows = log_probs.size(0), cols = log_probs.size(1);
    ASSIGN_OR_RETURN(Tensor loss,
                     c->Empty({}, log_probs.dtype(), log_probs.device()));
    const math::StridedIndexer ix = Strided(log_probs, log_probs.sizes());
    const math::StridedIndexer it = Strided(target, target.sizes());
    const int64_t* pt = At<int64_t>(target);
    ForFloat(log_probs.dtype(), [&]<typename T>() {
      const T* px = At<T>(log_probs);
      double total = 0;
      for (int64_t r = 0; r < rows; ++r)
        total -= px[ix.Offset(r * cols + pt[it.Offset(r)])];
      *At<T>(loss) = static_cast<T>(rows == 0 ? 0.0 : total / rows);
    });
    return loss;
  }

  absl::StatusOr<Tensor> NllLossBackward(const Tensor& target,
                                         const Tensor& grad_loss,
                                         int64_t classes) override {
    absl::ReaderMutexLock lock(&mu_);
    ASSIGN_OR_RETURN(CudaContext * c,
                     Check("nll_loss_backward", {&grad_loss, &target}, 1));
    if (target.dim() != 1 || grad_loss.numel() != 1 || classes <= 0) {
      return Bad("nll_loss_backward",
                 absl::StrCat("needs target [N], a one-element grad_loss and "
                              "classes > 0 (classes ", classes, ")"),
                 {&target, &grad_loss});
    }
    const int64_t rows = target.size(0);
    ASSIGN_OR_RETURN(Tensor out, c->Empty({rows, classes}, grad_loss.dtype(),
                                          grad_loss.device()));
    const math::StridedIndexer it = Strided(target, target.sizes());
    const int64_t* pt = At<int64_t>(target);
    ForFloat(grad_loss.dtype(), [&]<typename T>() {
      const T g = *At<T>(grad_loss);
      T* po = At<T>(out);
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t j = 0; j < classes; ++j) {
          po[r * classes + j] =
              math::NllLossBackward(pt[it.Offset(r)] == j, g, rows);
        }
      }
    });
    return out;
  }

  absl::StatusOr<Tensor> DropoutMask(const std::vector<int64_t>& sizes,
                                     DType dtype, Device device, double p,
                                     uint64_t seed, uint64_t offset) override {
    absl::ReaderMutexLock lock(&mu_);
    ASSIGN_OR_RETURN(CudaContext * c, Context("dropout_mask"));
    if (!(p >= 0 && p <= 1) || !device.is_cuda() ||
        (dtype != DType::kFloat32 && dtype != DType::kFloat64)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "host-fake dropout_mask: needs p in [0, 1], a float dtype and a "
          "CUDA device (p ", p, ", ", DTypeName(dtype), " [",
          absl::StrJoin(sizes, ", "), "] on ", device.ToString(), ")"));
    }
    ASSIGN_OR_RETURN(Tensor out, c->Empty(sizes, dtype, device));
    ForFloat(dtype, [&]<typename T>() {
      T* po = At<T>(out);
      for (int64_t i = 0; i < out.numel(); ++i)
        po[i] = math::DropoutScale<T>(seed, offset + static_cast<uint64_t>(i),
                                      p);
    });
    return out;
  }

  absl::Status SgdStep(const Tensor& param, const Tensor& grad,
                       const Tensor& buf, const math::SgdParams& o) override {
    absl::ReaderMutexLock lock(&mu_);
    const bool momentum = o.momentum != 0;
    const Tensor& b = momentum ? buf : param;
    RETURN_IF_ERROR(
        Check("sgd_step", {&param, &grad, &b}, 3, true).status());
    if (param.sizes() != grad.sizes() || b.sizes() != param.sizes() ||
        !param.is_contiguous() || !b.is_contiguous()) {
      return Bad("sgd_step", "needs contiguous param and buf of grad's shape",
                 {&param, &grad, &b});
    }
    param.storage().BumpVersion();
    const math::StridedIndexer ig = Strided(grad, param.sizes());
    ForCompute(param.dtype(), [&]<typename T>() {
      using A = math::Acc<T>;
      T* pp = At<T>(param);
      T* pb = momentum ? At<T>(b) : nullptr;
      const T* pg = At<T>(grad);
      for (int64_t i = 0; i < param.numel(); ++i) {
        A pv = Ld(pp, i), bv = momentum ? Ld(pb, i) : A(0);
        math::SgdElement(o, pv, Ld(pg, ig.Offset(i)), bv);
        pp[i] = math::Store<T>(pv);
        if (momentum) pb[i] = math::Store<T>(bv);
      }
    });
    return absl::OkStatus();
  }

  absl::Status AdamStep(const Tensor& param, const Tensor& grad,
                        const Tensor& exp_avg, const Tensor& exp_avg_sq,
                        const math::AdamParams& o) override {
    absl::ReaderMutexLock lock(&mu_);
    RETURN_IF_ERROR(
        Check("adam_step", {&param, &grad, &exp_avg, &exp_avg_sq}, 4, true)
            .status());
    for (const Tensor* t : {&grad, &exp_avg, &exp_avg_sq}) {
      if (t->sizes() != param.sizes()) {
        return Bad("adam_step", "shapes differ",
                   {&param, &grad, &exp_avg, &exp_avg_sq});
      }
    }
    if (!param.is_contiguous() || !exp_avg.is_contiguous() ||
        !exp_avg_sq.is_contiguous()) {
      return Bad("adam_step", "param and state must be contiguous",
                 {&param, &exp_avg, &exp_avg_sq});
    }
    param.storage().BumpVersion();
    const math::StridedIndexer ig = Strided(grad, param.sizes());
    ForCompute(param.dtype(), [&]<typename T>() {
      using A = math::Acc<T>;
      T *pp = At<T>(param), *pm = At<T>(exp_avg), *pv = At<T>(exp_avg_sq);
      const T* pg = At<T>(grad);
      for (int64_t i = 0; i < param.numel(); ++i) {
        A p = Ld(pp, i), m = Ld(pm, i), v = Ld(pv, i);
        math::AdamElement(o, p, Ld(pg, ig.Offset(i)), m, v);
        pp[i] = math::Store<T>(p);
        pm[i] = math::Store<T>(m);
        pv[i] = math::Store<T>(v);
      }
    });
    return absl::OkStatus();
  }

  absl::Status AdagradStep(const Tensor& param, const Tensor& grad,
                           const Tensor& sum,
                           const math::AdagradParams& o) override {
    absl::ReaderMutexLock lock(&mu_);
    RETURN_IF_ERROR(
        Check("adagrad_step", {&param, &grad, &sum}, 3, true).status());
    if (grad.sizes() != param.sizes() || sum.sizes() != param.sizes() ||
        !param.is_contiguous() || !sum.is_contiguous()) {
      return Bad("adagrad_step",
                 "needs contiguous param and sum of grad's shape",
                 {&param, &grad, &sum});
    }
    param.storage().BumpVersion();
    const math::StridedIndexer ig = Strided(grad, param.sizes());
    ForCompute(param.dtype(), [&]<typename T>() {
      using A = math::Acc<T>;
      T *pp = At<T>(param), *ps = At<T>(sum);
      const T* pg = At<T>(grad);
      for (int64_t i = 0; i < param.numel(); ++i) {
        A p = Ld(pp, i), sv = Ld(ps, i);
        math::AdagradElement(o, p, Ld(pg, ig.Offset(i)), sv);
        pp[i] = math::Store<T>(p);
        ps[i] = math::Store<T>(sv);
      }
    });
    return absl::OkStatus();
  }

 private:
  // out [m, n] (contiguous) = op(a) @ op(b) of 2-D strided operands.
  static void MatmulInto(const Tensor& a, const Tensor& b, bool transpose_a,
                         bool transpose_b, const Tensor& out) {
    const int64_t m = out.size(0), n = out.size(1);
    const int64_t k = transpose_a ? a.size(0) : a.size(1);
    // Element (i, p) of op(a) and (p, j) of op(b), from the strides.
    const int64_t ai = a.strides()[transpose_a ? 1 : 0],
                  ap = a.strides()[transpose_a ? 0 : 1];
    const int64_t bp = b.strides()[transpose_b ? 1 : 0],
                  bj = b.strides()[transpose_b ? 0 : 1];
    // 16-bit operands accumulate in float, as cuBLAS's CUBLAS_COMPUTE_32F.
    ForCompute(a.dtype(), [&]<typename T>() {
      const T *pa = At<T>(a), *pb = At<T>(b);
      T* po = At<T>(out);
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          math::Acc<T> total = 0;
          for (int64_t p = 0; p < k; ++p)
            total += Ld(pa, i * ai + p * ap) * Ld(pb, p * bp + j * bj);
          po[i * n + j] = math::Store<T>(total);
        }
      }
    });
  }

  // A new tensor of x's shape with element i = f(x's element i).
  template <typename F>
  static absl::StatusOr<Tensor> Map(CudaContext& c, const Tensor& x, F f) {
    ASSIGN_OR_RETURN(Tensor out, c.Empty(x.sizes(), x.dtype(), x.device()));
    const math::StridedIndexer ix = Strided(x, x.sizes());
    ForCompute(x.dtype(), [&]<typename T>() {
      const T* px = At<T>(x);
      T* po = At<T>(out);
      for (int64_t i = 0; i < out.numel(); ++i)
        po[i] = math::Store<T>(f(Ld(px, ix.Offset(i))));
    });
    return out;
  }

  // Check's `nfloat` for ops that take any dtype, one for every operand.
  static constexpr size_t kSameDType = ~size_t{0};

  // Operands defined, on one device of the context, the first `nfloat`
  // float32/float64 of one dtype and the rest int64 (with kSameDType: any
  // dtype, the first's), at most math::kMaxKernelDims dimensions; returns
  // the context.
  absl::StatusOr<CudaContext*> Check(const char* op, Operands ts,
                                     size_t nfloat, bool halves = false) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    ASSIGN_OR_RETURN(CudaContext * c, Context(op));
    const Tensor& first = **ts.begin();
    size_t i = 0;
    for (const Tensor* t : ts) {
      if (!t->defined()) return Bad(op, "an operand is undefined", ts);
      if (!t->device().is_cuda() || t->device() != first.device()) {
        return Bad(op, "operands are not all on one device", ts);
      }
      if (t->dim() > math::kMaxKernelDims) {
        return Bad(op, "an operand has too many dimensions", ts);
      }
      const bool floating =
          t->dtype() == DType::kFloat32 || t->dtype() == DType::kFloat64 ||
          (halves && (t->dtype() == DType::kFloat16 ||
                      t->dtype() == DType::kBFloat16));
      const bool bad_dtype =
          nfloat == kSameDType ? t->dtype() != first.dtype()
          : i < nfloat         ? !floating || t->dtype() != first.dtype()
                               : t->dtype() != DType::kInt64;
      if (bad_dtype) {
        return Bad(op,
                   absl::StrCat("operand dtypes are not as the op needs (",
                                halves ? "float32, float64, float16 or "
                                         "bfloat16"
                                       : "float32 or float64",
                                ", one for all; indices int64)"),
                   ts);
      }
      ++i;
    }
    RETURN_IF_ERROR(c->CheckCudaDevice(op, first.device()));
    // A host "kernel" runs now, so first what a kernel queued on the
    // current stream would run after: the stream's queued work, and what
    // it waits for on other streams.
    const int device = first.device().index;
    const StreamHandle stream = c->stream(device);
    if (!api_->CompleteStreamAndWaits(device, stream)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "host-fake ", op, ": stream ", stream, " of ",
          first.device().ToString(),
          " waits for work that cannot complete (streams waiting on each "
          "other)"));
    }
    return c;
  }

  const std::shared_ptr<FakeDeviceApi> api_;

  static absl::Status CheckRowsTargets(const char* op, const Tensor& logits,
                                       const Tensor& target) {
    if (logits.dim() != 2 || target.dim() != 1 ||
        target.size(0) != logits.size(0) || logits.size(1) == 0) {
      return Bad(op, "needs logits [N, C>0] and target [N]",
                 {&logits, &target});
    }
    const math::StridedIndexer it = Strided(target, target.sizes());
    const int64_t* pt = At<int64_t>(target);
    for (int64_t r = 0; r < target.numel(); ++r) {
      const int64_t v = pt[it.Offset(r)];
      if (v < 0 || v >= logits.size(1)) {
        return Bad(op,
                   absl::StrCat("target ", v, " is outside [0, ",
                                logits.size(1), ")"),
                   {&logits, &target});
      }
    }
    return absl::OkStatus();
  }
};

}  // namespace

absl::StatusOr<std::unique_ptr<CudaContext>> CreateHostComputeContext(
    std::shared_ptr<FakeDeviceApi> api, CudaContext::Options options) {
  ASSIGN_OR_RETURN(std::unique_ptr<CudaContext> ctx,
                   CudaContext::CreateForApi(api, options,
                                             /*runs_kernels=*/false));
  ctx->set_compute(std::make_shared<HostOps>(ctx.get(), std::move(api)));
  return ctx;
}

}  // namespace cuda
}  // namespace ferry
