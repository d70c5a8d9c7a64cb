#include "ferry/tensor/cuda/ops.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ferry/common/status.h"
#include "ferry/tensor/cuda/kernels.h"

namespace ferry {
namespace cuda {
namespace {

using kernels::Stream;

std::string Describe(const Tensor& t) {
  if (!t.defined()) return "undefined";
  return absl::StrCat(DTypeName(t.dtype()), " [",
                      absl::StrJoin(t.sizes(), ", "), "] on ",
                      t.device().ToString());
}

struct Operand {
  const char* name;
  const Tensor* t;
};

std::string DescribeAll(std::initializer_list<Operand> ops) {
  std::vector<std::string> parts;
  for (const Operand& o : ops) {
    parts.push_back(absl::StrCat(o.name, ": ", Describe(*o.t)));
  }
  return absl::StrJoin(parts, "; ");
}

// Check's `nfloat` for ops that take any dtype, the same for every operand.
constexpr size_t kSameDType = ~size_t{0};

// Every operand defined, on one CUDA device of `ctx` that runs kernels;
// `floats` (the first `nfloat` operands) float32/float64 (with `halves`,
// also float16/bfloat16) of one dtype, the rest int64 (or, with kSameDType,
// every operand of the first's dtype). Returns the device index.
absl::StatusOr<int> Check(CudaContext& ctx, const char* op,
                          std::initializer_list<Operand> ops, size_t nfloat,
                          bool halves = false) {
  auto fail = [&](const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda ", op, ": ", why, " (", DescribeAll(ops), ")"));
  };
  const Operand& first = *ops.begin();
  size_t i = 0;
  for (const Operand& o : ops) {
    if (!o.t->defined()) return fail(absl::StrCat(o.name, " is undefined"));
    if (!o.t->device().is_cuda()) {
      return fail(absl::StrCat(o.name, " is not on a CUDA device"));
    }
    if (o.t->device() != first.t->device()) {
      return fail(absl::StrCat(o.name, " and ", first.name,
                               " are on different devices"));
    }
    if (o.t->dim() > math::kMaxKernelDims) {
      return fail(absl::StrCat(o.name, " has more than ",
                               math::kMaxKernelDims, " dimensions"));
    }
    if (nfloat == kSameDType) {
      if (o.t->dtype() != first.t->dtype()) {
        return fail(absl::StrCat(o.name, " and ", first.name,
                                 " have different dtypes"));
      }
    } else if (i < nfloat) {
      const DType d = o.t->dtype();
      const bool half = d == DType::kFloat16 || d == DType::kBFloat16;
      if (d != DType::kFloat32 && d != DType::kFloat64 && !(halves && half)) {
        return fail(absl::StrCat(o.name, " is ", DTypeName(d), ", not ",
                                 halves ? "float32, float64, float16 or "
                                          "bfloat16"
                                        : "float32 or float64",
                                 " as ", op, " needs"));
      }
      if (o.t->dtype() != first.t->dtype()) {
        return fail(absl::StrCat(o.name, " and ", first.name,
                                 " have different dtypes"));
      }
    } else if (o.t->dtype() != DType::kInt64) {
      return fail(absl::StrCat(o.name, " is not int64"));
    }
    ++i;
  }
  const Device device = first.t->device();
  RETURN_IF_ERROR(ctx.CheckCudaDevice(op, device));
  if (!ctx.runs_kernels()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cuda ", op, ": the context's ", ctx.api().name(),
        " devices run no kernels (", DescribeAll(ops), ")"));
  }
  return device.index;
}

absl::Status SameShape(const char* op, std::initializer_list<Operand> ops) {
  const Operand& first = *ops.begin();
  for (const Operand& o : ops) {
    if (o.t->sizes() != first.t->sizes()) {
      return absl::InvalidArgumentError(
          absl::StrCat("cuda ", op, ": ", o.name, " and ", first.name,
                       " differ in shape (", DescribeAll(ops), ")"));
    }
  }
  return absl::OkStatus();
}

// Sets the current device for its scope (kernels launch on it).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    cudaGetDevice(&previous_);
    if (previous_ != device) cudaSetDevice(device);
  }
  ~DeviceGuard() { cudaSetDevice(previous_); }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

absl::Status Launched(const char* op, int device, int code,
                      std::initializer_list<Operand> ops) {
  if (code == 0) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(
      "cuda ", op, " on cuda:", device, ": kernel launch failed: ",
      kernels::ErrorString(code), " (", DescribeAll(ops), ")"));
}

// Calls f.template operator()<T>() for T float or double.
template <typename F>
auto Floating(DType dtype, F&& f) {
  if (dtype == DType::kFloat64) return f.template operator()<double>();
  return f.template operator()<float>();
}

// The same, also for the 16-bit kernel types math::F16 and math::BF16.
template <typename F>
auto Computing(DType dtype, F&& f) {
  if (dtype == DType::kFloat16) return f.template operator()<math::F16>();
  if (dtype == DType::kBFloat16) return f.template operator()<math::BF16>();
  return Floating(dtype, std::forward<F>(f));
}

// The dtype `dtype`'s kernels compute and accumulate in (math::Acc).
DType AccDType(DType dtype) {
  return dtype == DType::kFloat16 || dtype == DType::kBFloat16
             ? DType::kFloat32
             : dtype;
}

template <typename T>
T* Ptr(const Tensor& t) {
  return static_cast<T*>(t.data_ptr());
}

math::StridedIndexer Indexer(const Tensor& t,
                             const std::vector<int64_t>& out_sizes) {
  math::StridedIndexer ix;
  ix.dims = static_cast<int32_t>(out_sizes.size());
  const int64_t shift = static_cast<int64_t>(out_sizes.size()) - t.dim();
  for (int64_t d = 0; d < ix.dims; ++d) {
    ix.sizes[d] = out_sizes[d];
    const int64_t td = d - shift;
    ix.strides[d] = (td < 0 || t.size(td) == 1) ? 0 : t.strides()[td];
  }
  return ix;
}

absl::StatusOr<std::vector<int64_t>> BroadcastShape(const char* op,
                                                    const Tensor& a,
                                                    const Tensor& b) {
  std::optional<std::vector<int64_t>> out =
      BroadcastSizes(a.sizes(), b.sizes());
  if (!out) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda ", op, ": shapes do not broadcast (",
        DescribeAll({{"a", &a}, {"b", &b}}), ")"));
  }
  return *std::move(out);
}

int64_t WrapDim(int64_t dim, int64_t ndim) { return dim < 0 ? dim + ndim : dim; }

// Reads back a kernel's bad-index flag (waits for the stream).
absl::StatusOr<bool> ReadFlag(const Tensor& flag) {
  int32_t v = 0;
  const cudaError_t e =
      cudaMemcpy(&v, flag.data_ptr(), sizeof(v), cudaMemcpyDeviceToHost);
  if (e != cudaSuccess) {
    return absl::InternalError(
        absl::StrCat("reading a kernel's flag: ", cudaGetErrorString(e)));
  }
  return v != 0;
}

absl::StatusOr<Tensor> ZeroedFlag(CudaContext& ctx, int device) {
  ASSIGN_OR_RETURN(Tensor flag,
                   ctx.Empty({1}, DType::kInt32, Device::CUDA(device)));
  const cudaError_t e = cudaMemsetAsync(
      flag.data_ptr(), 0, sizeof(int32_t),
      reinterpret_cast<cudaStream_t>(ctx.stream(device)));
  if (e != cudaSuccess) {
    return absl::InternalError(
        absl::StrCat("cudaMemsetAsync on cuda:", device, ": ",
                     cudaGetErrorString(e)));
  }
  return flag;
}

absl::StatusOr<Tensor> Reduce(CudaContext& ctx, const char* op,
                              const Tensor& x, bool mean) {
  ASSIGN_OR_RETURN(int dev, Check(ctx, op, {{"x", &x}}, 1, true));
  DeviceGuard guard(dev);
  ASSIGN_OR_RETURN(Tensor xc, Contiguous(ctx, x));
  ASSIGN_OR_RETURN(Tensor out, ctx.Empty({}, x.dtype(), x.device()));
  ASSIGN_OR_RETURN(Tensor scratch, ctx.Empty({kernels::kSumBlocks},
                                             AccDType(x.dtype()), x.device()));
  const int64_t n = x.numel();
  const int code = Computing(x.dtype(), [&]<typename T>() {
    using A = math::Acc<T>;
    const A scale = mean ? A(1) / static_cast<A>(n) : A(1);
    return kernels::SumAll<T>(Ptr<T>(xc), n, scale, Ptr<A>(scratch),
                              Ptr<T>(out), ctx.stream(dev));
  });
  RETURN_IF_ERROR(Launched(op, dev, code, {{"x", &x}}));
  return out;
}

absl::StatusOr<Tensor> ReduceDim(CudaContext& ctx, const char* op,
                                 const Tensor& x, int64_t dim, bool keepdim,
                                 bool mean) {
  ASSIGN_OR_RETURN(int dev, Check(ctx, op, {{"x", &x}}, 1, true));
  const int64_t d = WrapDim(dim, x.dim());
  if (d < 0 || d >= x.dim()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda ", op, ": dim ", dim, " out of range (x: ",
                     Describe(x), ")"));
  }
  DeviceGuard guard(dev);
  ASSIGN_OR_RETURN(Tensor xc, Contiguous(ctx, x));
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < d; ++i) outer *= x.size(i);
  for (int64_t i = d + 1; i < x.dim(); ++i) inner *= x.size(i);
  const int64_t n = x.size(d);
  std::vector<int64_t> sizes = x.sizes();
  if (keepdim) {
    sizes[d] = 1;
  } else {
    sizes.erase(sizes.begin() + d);
  }
  ASSIGN_OR_RETURN(Tensor out, ctx.Empty(sizes, x.dtype(), x.device()));
  const int code = Computing(x.dtype(), [&]<typename T>() {
    using A = math::Acc<T>;
    const A scale = mean ? A(1) / static_cast<A>(n) : A(1);
    return kernels::SumDim<T>(Ptr<T>(xc), outer, n, inner, scale, Ptr<T>(out),
                              ctx.stream(dev));
  });
  RETURN_IF_ERROR(Launched(op, dev, code, {{"x", &x}}));
  return out;
}

}  // namespace

absl::StatusOr<Tensor> Contiguous(CudaContext& ctx, const Tensor& x) {
  RETURN_IF_ERROR(Check(ctx, "contiguous", {{"x", &x}}, 1, true).status());
  if (x.is_contiguous()) return x;
  return Unary(ctx, math::UnaryOp::kCopy, x);
}

absl::StatusOr<Tensor> Unary(CudaContext& ctx, math::UnaryOp op,
                             const Tensor& x) {
  ASSIGN_OR_RETURN(int dev, Check(ctx, "unary", {{"x", &x}}, 1, true));
  DeviceGuard guard(dev);
  ASSIGN_OR_RETURN(Tensor out, ctx.Empty(x.sizes(), x.dtype(), x.device()));
  const math::StridedIndexer ix = Indexer(x, x.sizes());
  const int code = Computing(x.dtype(), [&]<typename T>() {
    return kernels::Unary<T>(op, Ptr<T>(x), ix, Ptr<T>(out), x.numel(),
                             ctx.stream(dev));
  });
  RETURN_IF_ERROR(Launched("unary", dev, code, {{"x", &x}}));
  return out;
}

absl::StatusOr<Tensor> Binary(CudaContext& ctx, math::BinaryOp op,
                              const Tensor& a, const Tensor& b) {
  ASSIGN_OR_RETURN(int dev, Check(ctx, "binary", {{"a", &a}, {"b", &b}}, 2, true));
  ASSIGN_OR_RETURN(std::vector<int64_t> sizes, BroadcastShape("binary", a, b));
  DeviceGuard guard(dev);
  ASSIGN_OR_RETURN(Tensor out, ctx.Empty(sizes, a.dtype(), a.device()));
  const math::StridedIndexer ia = Indexer(a, sizes), ib = Indexer(b, sizes);
  const int code = Computing(a.dtype(), [&]<typename T>() {
    return kernels::Binary<T>(op, Ptr<T>(a), ia, Ptr<T>(b), ib, Ptr<T>(out),
                              out.numel(), ctx.stream(dev));
  });
  RETURN_IF_ERROR(Launched("binary", dev, code, {{"a", &a}, {"b", &b}}));
  return out;
}

absl::Status AddInPlace(CudaContext& ctx, const Tensor& acc, const Tensor& x) {
  ASSIGN_OR_RETURN(int dev,
                   Check(ctx, "add_", {{"acc", &acc}, {"x", &x}}, 2, true));
  RETURN_IF_ERROR(SameShape("add_", {{"acc", &acc}, {"x", &x}}));
  if (!acc.is_contiguous()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda add_: acc is not contiguous (acc: ", Describe(acc),
                     ")"));
  }
  DeviceGuard guard(dev);
  const math::StridedIndexer ia = Indexer(acc, acc.sizes()),
                             ix = Indexer(x, acc.sizes());
  acc.storage().BumpVersion();
  const int code = Computing(acc.dtype(), [&]<typename T>() {
    return kernels::Binary<T>(math::BinaryOp::kAdd, Ptr<T>(acc), ia, Ptr<T>(x),
                              ix, Ptr<T>(acc), acc.numel(), ctx.stream(dev));
  });
  return Launched("add_", dev, code, {{"acc", &acc}, {"x", &x}});
}

absl::StatusOr<Tensor> Scalar(CudaContext& ctx, math::BinaryOp op,
                              const Tensor& x, double s) {
  ASSIGN_OR_RETURN(int dev, Check(ctx, "scalar", {{"x", &x}}, 1, true));
  DeviceGuard guard(dev);
  ASSIGN_OR_RETURN(Tensor xc, Contiguous(ctx, x));
  ASSIGN_OR_RETURN(Tensor out, ctx.Empty(x.sizes(), x.dtype(), x.device()));
  const int code = Computing(x.dtype(), [&]<typename T>() {
    return kernels::Scalar<T>(op, Ptr<T>(xc), static_cast<math::Acc<T>>(s),
                              Ptr<T>(out), x.numel(), ctx.stream(dev));
  });
  RETURN_IF_ERROR(Launched("scalar", dev, code, {{"x", &x}}));
  return out;
}

absl::StatusOr<Tensor> UnaryBackward(CudaContext& ctx, math::BackwardOp op,
                                     const Tensor& g, const Tensor& saved) {
  ASSIGN_OR_RETURN(int dev, Check(ctx, "unary_backward",
                                  {{"grad", &g}, {"saved", &saved}}, 2, true));
  RETURN_IF_ERROR(
      SameShape("unary_backward", {{"grad", &g}, {"saved", &saved}}));
  DeviceGuard guard(dev);
  ASSIGN_OR_RETURN(Tensor gc, Contiguous(ctx, g));
  ASSIGN_OR_RETURN(Tensor sc, Contiguous(ctx, saved));
  ASSIGN_OR_RETURN(Tensor out, ctx.Empty(g.sizes(), g.dtype(), g.device()));
  const int code = Computing(g.dtype(), [&]<typename T>() {
    return kernels::Backward<T>(op, Ptr<T>(gc), Ptr<T>(sc), Ptr<T>(out),
                                g.numel(), ctx.stream(dev));
  });
  RETURN_IF_ERROR(Launched("unary_backward", dev, code, {{"grad", &g}}));
  return out;
}

absl::Status Fill(CudaContext& ctx, const Tensor& x, double value) {
  ASSIGN_OR_RETURN(int dev, Check(ctx, "fill_", {{"x", &x}}, 1, true));
  if (!x.is_contiguous()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda fill_: x is not contiguous (x: ", Describe(x), ")"));
  }
  DeviceGuard guard(dev);
  x.storage().BumpVersion();
  const int code = Computing(x.dtype(), [&]<typename T>() {
    const T v = math::Store<T>(static_cast<math::Acc<T>>(value));
    return kernels::Fill<T>(Ptr<T>(x), v, x.numel(), ctx.stream(dev));
  });
  return Launched("fill_", dev, code, {{"x", &x}});
}

absl::StatusOr<Tensor> Sum(CudaContext& ctx, const Tensor& x) {
  return Reduce(ctx, "sum", x, /*mean=*/false);
}
absl::StatusOr<Tensor> Mean(CudaContext& ctx, const Tensor& x) {
  return Reduce(ctx, "mean", x, /*mean=*/true);
}
absl::StatusOr<Tensor> SumDim(CudaContext& ctx, const Tensor& x, int64_t dim,
                              bool keepdim) {
  return ReduceDim(ctx, "sum", x, dim, keepdim, /*mean=*/false);
}
absl::StatusOr<Tensor> MeanDim(CudaContext& ctx, const Tensor& x, int64_t dim,
                               bool keepdim) {
  return ReduceDim(ctx, "mean", x, dim, keepdim, /*mean=*/true);
}

absl::StatusOr<Tensor> Softmax(CudaContext& ctx, const Tensor& x, bool log) {
  const char* op = log ? "log_softmax" : "softmax";
  ASSIGN_OR_RETURN(int dev, Check(ctx, op, {{"x", &x}}, 1, true));
  if (x.dim() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda ", op, ": x is 0-d (x: ", Describe(x), ")"));
  }
  DeviceGuard guard(dev);
  ASSIGN_OR_RETURN(Tensor xc, Contiguous(ctx, x));
  ASSIGN_OR_RETURN(Tensor out, ctx.Empty(x.sizes(), x.dtype(), x.device()));
  const int64_t cols = x.size(-1), rows = cols == 0 ? 0 : x.numel() / cols;
  const int code = Computing(x.dtype(), [&]<typename T>() {
    return kernels::Softmax<T>(Ptr<T>(xc), rows, cols, log, Ptr<T>(out),
                               ctx.stream(dev));
  });
  RETURN_IF_ERROR(Launched(op, dev, code, {{"x", &x}}));
  return out;
}

absl::StatusOr<Tensor> SoftmaxBackward(CudaContext& ctx, const Tensor& g,
                                       const Tensor& y, bool log) {
  const char* op = log ? "log_softmax_backward" : "softmax_backward";
  ASSIGN_OR_RETURN(int dev, Check(ctx, op, {{"grad", &g}, {"y", &y}}, 2, true));
  RETURN_IF_ERROR(SameShape(op, {{"grad", &g}, {"y", &y}}));
  if (y.dim() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda ", op, ": y is 0-d (y: ", Describe(y), ")"));
  }
  DeviceGuard guard(dev);
  ASSIGN_OR_RETURN(Tensor gc, Contiguous(ctx, g));
  ASSIGN_OR_RETURN(Tensor yc, Contiguous(ctx, y));
  ASSIGN_OR_RETURN(Tensor out, ctx.Empty(y.sizes(), y.dtype(), y.device()));
  const int64_t cols = y.size(-1), rows = cols == 0 ? 0 : y.numel() / cols;
  const int code = Computing(y.dtype(), [&]<typename T>() {
    return kernels::SoftmaxBackward<T>(Ptr<T>(gc), Ptr<T>(yc), rows, cols, log,
                                       Ptr<T>(out), ctx.stream(dev));
  });
  RETURN_IF_ERROR(Launched(op, dev, code, {{"grad", &g}, {"y", &y}}));
  return out;
}

absl::StatusOr<CrossEntropyResult> CrossEntropy(CudaContext& ctx,
                                                const Tensor& logits,
                                                const Tensor& target) {
  const auto ops = {Operand{"logits", &logits}, Operand{"target", &target}};
  ASSIGN_OR_RETURN(int dev, Check(ctx, "cross_entropy", ops, 1, true));
  if (logits.dim() != 2 || target.dim() != 1 ||
      target.size(0) != logits.size(0) || logits.size(1) == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda cross_entropy: needs logits [N, C>0] and target [N] (",
        DescribeAll(ops), ")"));
  }
  DeviceGuard guard(dev);
  const int64_t rows = logits.size(0), cols = logits.size(1);
  ASSIGN_OR_RETURN(Tensor xc, Contiguous(ctx, logits));
  ASSIGN_OR_RETURN(Tensor tc, target.is_contiguous()
                                  ? absl::StatusOr<Tensor>(target)
                                  : absl::InvalidArgumentError(absl::StrCat(
                                        "cuda cross_entropy: target is not "
                                        "contiguous (",
                                        DescribeAll(ops), ")")));
  CrossEntropyResult r;
  ASSIGN_OR_RETURN(r.loss, ctx.Empty({}, logits.dtype(), logits.device()));
  ASSIGN_OR_RETURN(r.lse, ctx.Empty({rows}, logits.dtype(), logits.device()));
  ASSIGN_OR_RETURN(Tensor scratch,
                   ctx.Empty({rows + kernels::kSumBlocks},
                             AccDType(logits.dtype()), logits.device()));
  ASSIGN_OR_RETURN(Tensor flag, ZeroedFlag(ctx, dev));
  const int code = Computing(logits.dtype(), [&]<typename T>() {
    return kernels::CrossEntropy<T>(
        Ptr<T>(xc), Ptr<int64_t>(tc), rows, cols, Ptr<T>(r.lse),
        Ptr<math::Acc<T>>(scratch), Ptr<T>(r.loss), Ptr<int32_t>(flag),
        ctx.stream(dev));
  });
  RETURN_IF_ERROR(Launched("cross_entropy", dev, code, ops));
  ASSIGN_OR_RETURN(bool bad, ReadFlag(flag));
  if (bad) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda cross_entropy: a target is outside [0, ", cols, ") (",
        DescribeAll(ops), ")"));
  }
  return r;
}

absl::StatusOr<Tensor> CrossEntropyBackward(CudaContext& ctx,
                                            const Tensor& logits,
                                            const Tensor& target,
                                            const Tensor& lse,
                                            const Tensor& grad_loss) {
  const auto ops = {Operand{"logits", &logits}, Operand{"lse", &lse},
                    Operand{"grad_loss", &grad_loss},
                    Operand{"target", &target}};
  ASSIGN_OR_RETURN(int dev, Check(ctx, "cross_entropy_backward", ops, 3, true));
  if (logits.dim() != 2 || target.dim() != 1 ||
      target.size(0) != logits.size(0) || lse.dim() != 1 ||
      lse.size(0) != logits.size(0) || grad_loss.numel() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda cross_entropy_backward: needs logits [N, C], target [N], "
        "lse [N], a one-element grad_loss (",
        DescribeAll(ops), ")"));
  }
  DeviceGuard guard(dev);
  ASSIGN_OR_RETURN(Tensor xc, Contiguous(ctx, logits));
  ASSIGN_OR_RETURN(Tensor lc, Contiguous(ctx, lse));
  ASSIGN_OR_RETURN(Tensor gc, Contiguous(ctx, grad_loss));
  const Tensor& tc = target;
  if (!tc.is_contiguous()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda cross_entropy_backward: target is not contiguous (",
        DescribeAll(ops), ")"));
  }
  ASSIGN_OR_RETURN(Tensor out,
                   ctx.Empty(logits.sizes(), logits.dtype(), logits.device()));
  const int code = Computing(logits.dtype(), [&]<typename T>() {
    return kernels::CrossEntropyBackward<T>(
        Ptr<T>(xc), Ptr<int64_t>(tc), Ptr<T>(lc), Ptr<T>(gc), logits.size(0),
        logits.size(1), Ptr<T>(out), ctx.stream(dev));
  });
  RETURN_IF_ERROR(Launched("cross_entropy_backward", dev, code, ops));
  return out;
}

absl::StatusOr<Tensor> Embedding(CudaContext& ctx, const Tensor& weight,
                                 const Tensor& indices) {
  const auto ops = {Operand{"weight", &weight}, Operand{"indices", &indices}};
  ASSIGN_OR_RETURN(int dev, Check(ctx, "embedding", ops, 1));
  if (weight.dim() != 2 || !indices.is_contiguous() ||
      indices.dim() + 1 > math::kMaxKernelDims) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda embedding: needs a 2-D weight and contiguous indices (",
        DescribeAll(ops), ")"));
  }
  DeviceGuard guard(dev);
  ASSIGN_OR_RETURN(Tensor wc, Contiguous(ctx, weight));
  std::vector<int64_t> sizes = indices.sizes();
  sizes.push_back(weight.size(1));
  ASSIGN_OR_RETURN(Tensor out, ctx.Empty(sizes, weight.dtype(),
                                         weight.device()));
  ASSIGN_OR_RETURN(Tensor flag, ZeroedFlag(ctx, dev));
  const int code = Floating(weight.dtype(), [&]<typename T>() {
    return kernels::Embedding<T>(Ptr<T>(wc), Ptr<int64_t>(indices),
                                 indices.numel(), weight.size(0),
                                 weight.size(1), Ptr<T>(out),
                                 Ptr<int32_t>(flag), ctx.stream(dev));
  });
  RETURN_IF_ERROR(Launched("embedding", dev, code, ops));
  ASSIGN_OR_RETURN(bool bad, ReadFlag(flag));
  if (bad) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda embedding: an index is outside [0, ", weight.size(0), ") (",
        DescribeAll(ops), ")"));
  }
  return out;
}

absl::StatusOr<Tensor> EmbeddingBackward(CudaContext& ctx, const Tensor& g,
                                         const Tensor& indices,
                                         int64_t vocab) {
  const auto ops = {Operand{"grad", &g}, Operand{"indices", &indices}};
  ASSIGN_OR_RETURN(int dev, Check(ctx, "embedding_backward", ops, 1));
  if (g.dim() != indices.dim() + 1 || !indices.is_contiguous() || vocab < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda embedding_backward: needs grad [*indices, D], contiguous "
        "indices and vocab >= 0 (vocab ",
        vocab, "; ", DescribeAll(ops), ")"));
  }
  for (int64_t d = 0; d < indices.dim(); ++d) {
    if (g.size(d) != indices.size(d)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cuda embedding_backward: grad's leading shape is not indices' (",
          DescribeAll(ops), ")"));
    }
  }
  DeviceGuard guard(dev);
  ASSIGN_OR_RETURN(Tensor gc, Contiguous(ctx, g));
  const int64_t width = g.size(-1);
  ASSIGN_OR_RETURN(Tensor out, ctx.Empty({vocab, width}, g.dtype(), g.device()));
  RETURN_IF_ERROR(Fill(ctx, out, 0));
  const int code = Floating(g.dtype(), [&]<typename T>() {
    return kernels::EmbeddingBackward<T>(Ptr<T>(gc), Ptr<int64_t>(indices),
                                         indices.numel(), vocab, width,
                                         Ptr<T>(out), ctx.stream(dev));
  });
  RETURN_IF_ERROR(Launched("embedding_backward", dev, code, ops));
  return out;
}

namespace {

// op(a) @ op(b) over the last two dims of 2-D operands, or of 3-D ones with
// one leading batch size when `batched`, in one (strided-batched) cuBLAS
// call; `op` names it in errors.
absl::StatusOr<Tensor> Gemms(CudaContext& ctx, const char* op,
                             const Tensor& a, const Tensor& b,
                             bool transpose_a, bool transpose_b,
                             bool batched) {
  const auto ops = {Operand{"a", &a}, Operand{"b", &b}};
  ASSIGN_OR_RETURN(int dev, Check(ctx, op, ops, 2, true));
  const int64_t rank = batched ? 3 : 2, lead = rank - 2;
  if (a.dim() != rank || b.dim() != rank ||
      (batched && a.size(0) != b.size(0))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda ", op, ": needs ",
        batched ? "3-D operands of one batch size" : "2-D operands", " (",
        DescribeAll(ops), ")"));
  }
  const int64_t batch = batched ? a.size(0) : 1;
  const int64_t m = a.size(lead + (transpose_a ? 1 : 0));
  const int64_t k = a.size(lead + (transpose_a ? 0 : 1));
  const int64_t kb = b.size(lead + (transpose_b ? 1 : 0));
  const int64_t n = b.size(lead + (transpose_b ? 0 : 1));
  if (k != kb) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda ", op, ": inner sizes ", k, " and ", kb, " differ (transpose_a ",
        transpose_a, ", transpose_b ", transpose_b, "; ", DescribeAll(ops),
        ")"));
  }
  constexpr int64_t kIntMax = 2147483647;
  if (m > kIntMax || n > kIntMax || k > kIntMax || batch > kIntMax) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda ", op, ": a size exceeds cuBLAS's int range (", DescribeAll(ops),
        ")"));
  }
  DeviceGuard guard(dev);
  std::vector<int64_t> sizes = {m, n};
  if (batched) sizes.insert(sizes.begin(), batch);
  ASSIGN_OR_RETURN(Tensor out, ctx.Empty(sizes, a.dtype(), a.device()));
  if (batch == 0 || m == 0 || n == 0) return out;
  if (k == 0) {
    RETURN_IF_ERROR(Fill(ctx, out, 0));
    return out;
  }
  ASSIGN_OR_RETURN(Tensor ac, Contiguous(ctx, a));
  ASSIGN_OR_RETURN(Tensor bc, Contiguous(ctx, b));
  const absl::Status st = ctx.Gemm(
      dev, a.dtype(), transpose_a, transpose_b, static_cast<int>(m),
      static_cast<int>(n), static_cast<int>(k), ac.data_ptr(),
      static_cast<int>(a.size(-1)), bc.data_ptr(),
      static_cast<int>(b.size(-1)), out.data_ptr(), static_cast<int>(batch),
      a.size(-2) * a.size(-1), b.size(-2) * b.size(-1));
  if (!st.ok()) {
    return absl::Status(st.code(), absl::StrCat("cuda ", op, ": ",
                                                st.message(), " (",
                                                DescribeAll(ops), ")"));
  }
  return out;
}

}  // namespace

absl::StatusOr<Tensor> Matmul(CudaContext& ctx, const Tensor& a,
                              const Tensor& b, bool transpose_a,
                              bool transpose_b) {
  return Gemms(ctx, "matmul", a, b, transpose_a, transpose_b,
               /*batched=*/false);
}

absl::StatusOr<Tensor> BatchedMatmul(CudaContext& ctx, const Tensor& a,
                                     const Tensor& b, bool transpose_a,
                                     bool transpose_b) {
  return Gemms(ctx, "batched_matmul", a, b, transpose_a, transpose_b,
               /*batched=*/true);
}

absl::StatusOr<Tensor> Linear(CudaContext& ctx, const Tensor& x,
                              const Tensor& weight, const Tensor& bias) {
  ASSIGN_OR_RETURN(Tensor y, Matmul(ctx, x, weight, false, true));
  if (!bias.defined()) return y;
  if (bias.dim() != 1 || bias.size(0) != y.size(1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda linear: bias is not [", y.size(1), "] (",
        DescribeAll({{"x", &x}, {"weight", &weight}, {"bias", &bias}}), ")"));
  }
  return Binary(ctx, math::BinaryOp::kAdd, y, bias);
}

absl::Status CopyInto(CudaContext& ctx, const Tensor& dst,
                      const Tensor& src) {
  const auto ops = {Operand{"dst", &dst}, Operand{"src", &src}};
  // Any dtype, one for both (cat of int64 indices or bool masks).
  ASSIGN_OR_RETURN(int dev, Check(ctx, "copy_into", ops, kSameDType));
  std::optional<std::vector<int64_t>> bcast =
      BroadcastSizes(dst.sizes(), src.sizes());
  if (!bcast || *bcast != dst.sizes()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda copy_into: src does not broadcast to dst's shape (",
        DescribeAll(ops), ")"));
  }
  DeviceGuard guard(dev);
  const math::StridedIndexer id = Indexer(dst, dst.sizes()),
                             is = Indexer(src, dst.sizes());
  dst.storage().BumpVersion();
  auto copy = [&]<typename T>() {
    return kernels::StridedCopy<T>(Ptr<T>(src), is, Ptr<T>(dst), id,
                                   dst.numel(), ctx.stream(dev));
  };
  int code = 0;
  switch (dst.itemsize()) {
    case 1: code = copy.template operator()<uint8_t>(); break;
    case 2: code = copy.template operator()<uint16_t>(); break;
    case 4: code = copy.template operator()<uint32_t>(); break;
    case 8: code = copy.template operator()<uint64_t>(); break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "cuda copy_into: no copy kernel for ", dst.itemsize(),
          "-byte elements (", DescribeAll(ops), ")"));
  }
  return Launched("copy_into", dev, code, ops);
}

namespace {
std::optional<kernels::CastType> CastTypeOf(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return kernels::CastType::kFloat32;
    case DType::kFloat64: return kernels::CastType::kFloat64;
    case DType::kFloat16: return kernels::CastType::kFloat16;
    case DType::kBFloat16: return kernels::CastType::kBFloat16;
    default: return std::nullopt;
  }
}
}  // namespace

absl::StatusOr<Tensor> Cast(CudaContext& ctx, const Tensor& x, DType dtype) {
  const auto ops = {Operand{"x", &x}};
  ASSIGN_OR_RETURN(int dev, Check(ctx, "cast", ops, kSameDType));
  const std::optional<kernels::CastType> from = CastTypeOf(x.dtype()),
                                         to = CastTypeOf(dtype);
  if (!from || !to) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda cast to ", DTypeName(dtype),
        ": converts only between float32, float64, float16 and bfloat16 (",
        DescribeAll(ops), ")"));
  }
  DeviceGuard guard(dev);
  ASSIGN_OR_RETURN(Tensor xc, Contiguous(ctx, x));
  ASSIGN_OR_RETURN(Tensor out, ctx.Empty(x.sizes(), dtype, x.device()));
  const int code = kernels::Cast(xc.data_ptr(), *from, out.data_ptr(), *to,
                                 x.numel(), ctx.stream(dev));
  RETURN_IF_ERROR(Launched("cast", dev, code, ops));
  return out;
}

absl::StatusOr<Tensor> Where(CudaContext& ctx, const Tensor& cond,
                             const Tensor& a, const Tensor& b) {
  const auto ops = {Operand{"cond", &cond}, Operand{"a", &a},
                    Operand{"b", &b}};
  ASSIGN_OR_RETURN(int dev, Check(ctx, "where", {{"a", &a}, {"b", &b}}, 2, true));
  if (!cond.defined() || cond.device() != a.device() ||
      cond.dtype() != DType::kBool || cond.dim() > math::kMaxKernelDims) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda where: cond must be bool on a's device (", DescribeAll(ops),
        ")"));
  }
  std::optional<std::vector<int64_t>> sizes =
      BroadcastSizes(a.sizes(), b.sizes());
  if (sizes) sizes = BroadcastSizes(cond.sizes(), *sizes);
  if (!sizes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda where: shapes do not broadcast (", DescribeAll(ops), ")"));
  }
  DeviceGuard guard(dev);
  ASSIGN_OR_RETURN(Tensor out, ctx.Empty(*sizes, a.dtype(), a.device()));
  const math::StridedIndexer ic = Indexer(cond, *sizes),
                             ia = Indexer(a, *sizes), ib = Indexer(b, *sizes);
  const int code = Computing(a.dtype(), [&]<typename T>() {
    return kernels::Where<T>(Ptr<bool>(cond), ic, Ptr<T>(a), ia, Ptr<T>(b), ib,
                             Ptr<T>(out), out.numel(), ctx.stream(dev));
  });
  RETURN_IF_ERROR(Launched("where", dev, code, ops));
  return out;
}

absl::StatusOr<Tensor> NllLoss(CudaContext& ctx, const Tensor& log_probs,
                               const Tensor& target) {
  const auto ops = {Operand{"log_probs", &log_probs},
                    Operand{"target", &target}};
  ASSIGN_OR_RETURN(int dev, Check(ctx, "nll_loss", ops, 1));
  if (log_probs.dim() != 2 || target.dim() != 1 ||
      target.size(0) != log_probs.size(0) || log_probs.size(1) == 0 ||
      !target.is_contiguous()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda nll_loss: needs log_probs [N, C>0] and contiguous target [N] (",
        DescribeAll(ops), ")"));
  }
  DeviceGuard guard(dev);
  const int64_t rows = log_probs.size(0), cols = log_probs.size(1);
  ASSIGN_OR_RETURN(Tensor loss,
                   ctx.Empty({}, log_probs.dtype(), log_probs.device()));
  ASSIGN_OR_RETURN(Tensor scratch, ctx.Empty({rows + kernels::kSumBlocks},
                                             log_probs.dtype(),
                                             log_probs.device()));
  ASSIGN_OR_RETURN(Tensor flag, ZeroedFlag(ctx, dev));
  const math::StridedIndexer ix = Indexer(log_probs, log_probs.sizes());
  const int code = Floating(log_probs.dtype(), [&]<typename T>() {
    return kernels::NllLoss<T>(Ptr<T>(log_probs), ix, Ptr<int64_t>(target),
                               rows, cols, Ptr<T>(scratch), Ptr<T>(loss),
                               Ptr<int32_t>(flag), ctx.stream(dev));
  });
  RETURN_IF_ERROR(Launched("nll_loss", dev, code, ops));
  ASSIGN_OR_RETURN(bool bad, ReadFlag(flag));
  if (bad) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda nll_loss: a target is outside [0, ", cols, ") (",
        DescribeAll(ops), ")"));
  }
  if (rows == 0) RETURN_IF_ERROR(Fill(ctx, loss, 0));
  return loss;
}

absl::StatusOr<Tensor> NllLossBackward(CudaContext& ctx, const Tensor& target,
                                       const Tensor& grad_loss,
                                       int64_t classes) {
  const auto ops = {Operand{"grad_loss", &grad_loss},
                    Operand{"target", &target}};
  ASSIGN_OR_RETURN(int dev, Check(ctx, "nll_loss_backward", ops, 1));
  if (target.dim() != 1 || !target.is_contiguous() ||
      grad_loss.numel() != 1 || classes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda nll_loss_backward: needs contiguous target [N], a one-element "
        "grad_loss and classes > 0 (classes ",
        classes, "; ", DescribeAll(ops), ")"));
  }
  DeviceGuard guard(dev);
  const int64_t rows = target.size(0);
  ASSIGN_OR_RETURN(Tensor gc, Contiguous(ctx, grad_loss));
  ASSIGN_OR_RETURN(Tensor out, ctx.Empty({rows, classes}, grad_loss.dtype(),
                                         grad_loss.device()));
  const int code = Floating(grad_loss.dtype(), [&]<typename T>() {
    return kernels::NllLossBackward<T>(Ptr<int64_t>(target), Ptr<T>(gc), rows,
                                       classes, Ptr<T>(out), ctx.stream(dev));
  });
  RETURN_IF_ERROR(Launched("nll_loss_backward", dev, code, ops));
  return out;
}

absl::StatusOr<Tensor> DropoutMask(CudaContext& ctx,
                                   const std::vector<int64_t>& sizes,
                                   DType dtype, Device device, double p,
                                   uint64_t seed, uint64_t offset) {
  if (!(p >= 0 && p <= 1) || !device.is_cuda() ||
      (dtype != DType::kFloat32 && dtype != DType::kFloat64)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda dropout_mask: needs p in [0, 1], a float dtype and a CUDA "
        "device (p ", p, ", ", DTypeName(dtype), " [",
        absl::StrJoin(sizes, ", "), "] on ", device.ToString(), ")"));
  }
  RETURN_IF_ERROR(ctx.CheckCudaDevice("dropout_mask", device));
  if (!ctx.runs_kernels()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cuda dropout_mask: the context's ", ctx.api().name(),
        " devices run no kernels (", device.ToString(), ")"));
  }
  DeviceGuard guard(device.index);
  ASSIGN_OR_RETURN(Tensor out, ctx.Empty(sizes, dtype, device));
  const int code = Floating(dtype, [&]<typename T>() {
    return kernels::DropoutMask<T>(seed, offset, p, Ptr<T>(out), out.numel(),
                                   ctx.stream(device.index));
  });
  RETURN_IF_ERROR(Launched("dropout_mask", device.index, code,
                           {{"mask", &out}}));
  return out;
}

absl::Status SgdStep(CudaContext& ctx, const Tensor& param, const Tensor& grad,
                     const Tensor& buf, const math::SgdParams& o) {
  const bool momentum = o.momentum != 0;
  const Tensor& b = momentum ? buf : param;
  const auto ops = {Operand{"param", &param}, Operand{"grad", &grad},
                    Operand{"buf", &b}};
  ASSIGN_OR_RETURN(int dev, Check(ctx, "sgd_step", ops, 3, true));
  RETURN_IF_ERROR(SameShape("sgd_step", ops));
  if (!param.is_contiguous() || !b.is_contiguous()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda sgd_step: param and buf must be contiguous (", DescribeAll(ops),
        ")"));
  }
  DeviceGuard guard(dev);
  ASSIGN_OR_RETURN(Tensor gc, Contiguous(ctx, grad));
  param.storage().BumpVersion();
  const int code = Computing(param.dtype(), [&]<typename T>() {
    return kernels::SgdStep<T>(o, Ptr<T>(param), Ptr<T>(gc),
                               momentum ? Ptr<T>(b) : nullptr, param.numel(),
                               ctx.stream(dev));
  });
  return Launched("sgd_step", dev, code, ops);
}

absl::Status AdamStep(CudaContext& ctx, const Tensor& param,
                      const Tensor& grad, const Tensor& exp_avg,
                      const Tensor& exp_avg_sq, const math::AdamParams& o) {
  const auto ops = {Operand{"param", &param}, Operand{"grad", &grad},
                    Operand{"exp_avg", &exp_avg},
                    Operand{"exp_avg_sq", &exp_avg_sq}};
  ASSIGN_OR_RETURN(int dev, Check(ctx, "adam_step", ops, 4, true));
  RETURN_IF_ERROR(SameShape("adam_step", ops));
  if (!param.is_contiguous() || !exp_avg.is_contiguous() ||
      !exp_avg_sq.is_contiguous()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda adam_step: param and state must be contiguous (",
        DescribeAll(ops), ")"));
  }
  DeviceGuard guard(dev);
  ASSIGN_OR_RETURN(Tensor gc, Contiguous(ctx, grad));
  param.storage().BumpVersion();
  const int code = Computing(param.dtype(), [&]<typename T>() {
    return kernels::AdamStep<T>(o, Ptr<T>(param), Ptr<T>(gc), Ptr<T>(exp_avg),
                                Ptr<T>(exp_avg_sq), param.numel(),
                                ctx.stream(dev));
  });
  return Launched("adam_step", dev, code, ops);
}

absl::Status AdagradStep(CudaContext& ctx, const Tensor& param,
                         const Tensor& grad, const Tensor& sum,
                         const math::AdagradParams& o) {
  const auto ops = {Operand{"param", &param}, Operand{"grad", &grad},
                    Operand{"sum", &sum}};
  ASSIGN_OR_RETURN(int dev, Check(ctx, "adagrad_step", ops, 3, true));
  RETURN_IF_ERROR(SameShape("adagrad_step", ops));
  if (!param.is_contiguous() || !sum.is_contiguous()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda adagrad_step: param and sum must be contiguous (",
        DescribeAll(ops), ")"));
  }
  DeviceGuard guard(dev);
  ASSIGN_OR_RETURN(Tensor gc, Contiguous(ctx, grad));
  param.storage().BumpVersion();
  const int code = Computing(param.dtype(), [&]<typename T>() {
    return kernels::AdagradStep<T>(o, Ptr<T>(param), Ptr<T>(gc), Ptr<T>(sum),
                                   param.numel(), ctx.stream(dev));
  });
  return Launched("adagrad_step", dev, code, ops);
}

namespace {

// DeviceOps over the functions above (one-line forwards under the lock).
class CudaOps final : public ContextBoundOps {
 public:
  using ContextBoundOps::ContextBoundOps;
  std::string name() const override { return "cuda"; }

#define FERRY_CUDA_OPS_CALL(op, call)          \
  absl::ReaderMutexLock lock(&mu_);             \
  ASSIGN_OR_RETURN(CudaContext * c, Context(op)); \
  return call

  absl::StatusOr<Tensor> To(const Tensor& t, Device device) override {
    FERRY_CUDA_OPS_CALL("to", c->To(t, device));
  }
  absl::StatusOr<Tensor> Empty(const std::vector<int64_t>& sizes, DType dtype,
                               Device device) override {
    FERRY_CUDA_OPS_CALL("empty", c->Empty(sizes, dtype, device));
  }
  absl::StatusOr<Tensor> Unary(math::UnaryOp op, const Tensor& x) override {
    FERRY_CUDA_OPS_CALL("unary", cuda::Unary(*c, op, x));
  }
  absl::StatusOr<Tensor> Binary(math::BinaryOp op, const Tensor& a,
                                const Tensor& b) override {
    FERRY_CUDA_OPS_CALL("binary", cuda::Binary(*c, op, a, b));
  }
  absl::StatusOr<Tensor> Scalar(math::BinaryOp op, const Tensor& x,
                                double s) override {
    FERRY_CUDA_OPS_CALL("scalar", cuda::Scalar(*c, op, x, s));
  }
  absl::StatusOr<Tensor> UnaryBackward(math::BackwardOp op, const Tensor& g,
                                       const Tensor& saved) override {
    FERRY_CUDA_OPS_CALL("unary_backward",
                        cuda::UnaryBackward(*c, op, g, saved));
  }
  absl::Status Fill(const Tensor& x, double value) override {
    FERRY_CUDA_OPS_CALL("fill_", cuda::Fill(*c, x, value));
  }
  absl::Status AddInPlace(const Tensor& acc, const Tensor& x) override {
    FERRY_CUDA_OPS_CALL("add_", cuda::AddInPlace(*c, acc, x));
  }
  absl::StatusOr<Tensor> Sum(const Tensor& x) override {
    FERRY_CUDA_OPS_CALL("sum", cuda::Sum(*c, x));
  }
  absl::StatusOr<Tensor> SumDim(const Tensor& x, int64_t dim,
                                bool keepdim) override {
    FERRY_CUDA_OPS_CALL("sum", cuda::SumDim(*c, x, dim, keepdim));
  }
  absl::StatusOr<Tensor> Softmax(const Tensor& x, bool log) override {
    FERRY_CUDA_OPS_CALL("softmax", cuda::Softmax(*c, x, log));
  }
  absl::StatusOr<Tensor> SoftmaxBackward(const Tensor& g, const Tensor& y,
                                         bool log) override {
    FERRY_CUDA_OPS_CALL("softmax_backward",
                        cuda::SoftmaxBackward(*c, g, y, log));
  }
  absl::StatusOr<std::pair<Tensor, Tensor>> CrossEntropy(
      const Tensor& logits, const Tensor& target) override {
    absl::ReaderMutexLock lock(&mu_);
    ASSIGN_OR_RETURN(CudaContext * c, Context("cross_entropy"));
    ASSIGN_OR_RETURN(CrossEntropyResult r,
                     cuda::CrossEntropy(*c, logits, target));
    return std::make_pair(r.loss, r.lse);
  }
  absl::StatusOr<Tensor> CrossEntropyBackward(
      const Tensor& logits, const Tensor& target, const Tensor& lse,
      const Tensor& grad_loss) override {
    FERRY_CUDA_OPS_CALL("cross_entropy_backward",
                        cuda::CrossEntropyBackward(*c, logits, target, lse,
                                                   grad_loss));
  }
  absl::StatusOr<Tensor> Embedding(const Tensor& weight,
                                   const Tensor& indices) override {
    FERRY_CUDA_OPS_CALL("embedding", cuda::Embedding(*c, weight, indices));
  }
  absl::StatusOr<Tensor> EmbeddingBackward(const Tensor& g,
                                           const Tensor& indices,
                                           int64_t vocab) override {
    FERRY_CUDA_OPS_CALL("embedding_backward",
                        cuda::EmbeddingBackward(*c, g, indices, vocab));
  }
  absl::StatusOr<Tensor> Matmul(const Tensor& a, const Tensor& b,
                                bool transpose_a, bool transpose_b) override {
    FERRY_CUDA_OPS_CALL("matmul",
                        cuda::Matmul(*c, a, b, transpose_a, transpose_b));
  }
  absl::StatusOr<Tensor> BatchedMatmul(const Tensor& a, const Tensor& b,
                                       bool transpose_a,
                                       bool transpose_b) override {
    FERRY_CUDA_OPS_CALL("batched_matmul", cuda::BatchedMatmul(*c, a, b,
                                                              transpose_a,
                                                              transpose_b));
  }
  absl::Status CopyInto(const Tensor& dst, const Tensor& src) override {
    FERRY_CUDA_OPS_CALL("copy_into", cuda::CopyInto(*c, dst, src));
  }
  absl::StatusOr<Tensor> Cast(const Tensor& x, DType dtype) override {
    FERRY_CUDA_OPS_CALL("cast", cuda::Cast(*c, x, dtype));
  }
  absl::StatusOr<Tensor> Where(const Tensor& cond, const Tensor& a,
                               const Tensor& b) override {
    FERRY_CUDA_OPS_CALL("where", cuda::Where(*c, cond, a, b));
  }
  absl::StatusOr<Tensor> NllLoss(const Tensor& log_probs,
                                 const Tensor& target) override {
    FERRY_CUDA_OPS_CALL("nll_loss", cuda::NllLoss(*c, log_probs, target));
  }
  absl::StatusOr<Tensor> NllLossBackward(const Tensor& target,
                                         const Tensor& grad_loss,
                                         int64_t classes) override {
    FERRY_CUDA_OPS_CALL("nll_loss_backward",
                        cuda::NllLossBackward(*c, target, grad_loss, classes));
  }
  absl::StatusOr<Tensor> DropoutMask(const std::vector<int64_t>& sizes,
                                     DType dtype, Device device, double p,
                                     uint64_t seed, uint64_t offset) override {
    FERRY_CUDA_OPS_CALL("dropout_mask", cuda::DropoutMask(*c, sizes, dtype,
                                                          device, p, seed,
                                                          offset));
  }
  absl::Status SgdStep(const Tensor& param, const Tensor& grad,
                       const Tensor& buf, const math::SgdParams& o) override {
    FERRY_CUDA_OPS_CALL("sgd_step", cuda::SgdStep(*c, param, grad, buf, o));
  }
  absl::Status AdamStep(const Tensor& param, const Tensor& grad,
                        const Tensor& exp_avg, const Tensor& exp_avg_sq,
                        const math::AdamParams& o) override {
    FERRY_CUDA_OPS_CALL("adam_step", cuda::AdamStep(*c, param, grad, exp_avg,
                                                    exp_avg_sq, o));
  }
  absl::Status AdagradStep(const Tensor& param, const Tensor& grad,
                           const Tensor& sum,
                           const math::AdagradParams& o) override {
    FERRY_CUDA_OPS_CALL("adagrad_step",
                        cuda::AdagradStep(*c, param, grad, sum, o));
  }
#undef FERRY_CUDA_OPS_CALL
};

}  // namespace

absl::StatusOr<std::unique_ptr<CudaContext>> CreateComputeContext(
    CudaContext::Options options) {
  ASSIGN_OR_RETURN(std::unique_ptr<CudaContext> ctx,
                   CudaContext::Create(options));
  ctx->set_compute(std::make_shared<CudaOps>(ctx.get()));
  return ctx;
}

}  // namespace cuda
}  // namespace ferry
