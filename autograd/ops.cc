#include "ferry/autograd/ops.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "ferry/autograd/grad_mode.h"
#include "ferry/autograd/kernels.h"
#include "ferry/common/status.h"
#include "ferry/tensor/cuda/device_ops.h"

namespace ferry::autograd {
namespace {

using kernels::FloatDispatch;
using kernels::Map;
using kernels::Materialize;
using kernels::ReduceTo;
using kernels::Zip;
using Grads = absl::StatusOr<std::vector<Tensor>>;
using Saved = std::vector<Tensor>;
using Needs = std::vector<bool>;

template <typename... Ts>
bool NeedsGrad(const Ts&... ts) {
  return GradMode::IsEnabled() && (RequiresGrad(ts) || ...);
}

// Attaches a FunctionNode named `name` to `out`, with edges to `inputs`.
Tensor Record(const char* name, const std::vector<Tensor>& inputs, Tensor out,
              std::vector<SavedTensor> saved, FunctionNode::Fn fn) {
  auto node =
      std::make_shared<FunctionNode>(name, std::move(saved), std::move(fn));
  std::vector<Edge> edges;
  edges.reserve(inputs.size());
  for (const Tensor& t : inputs) {
    edges.push_back(GradientEdge(t));
    node->AddInputShape(t.sizes());
    if (out.is_same(t)) out = Detach(out);
  }
  node->set_next_edges(std::move(edges));
  if (out.device().is_cuda()) {
    // Backward runs on the stream this op was queued on (engine.cc).
    if (cuda::DeviceOps* d = cuda::DeviceOpsOf(out)) {
      absl::StatusOr<uintptr_t> stream = d->CurrentStream(out.device());
      if (stream.ok()) {
        node->set_stream({out.storage().shared_compute(), out.device(),
                          *stream});
      }
    }
  }
  auto meta = std::make_shared<AutogradMeta>();
  meta->grad_fn = std::move(node);
  out.set_autograd_meta(std::move(meta));
  return out;
}

int64_t NormDim(int64_t d, int64_t ndim, const char* op) {
  if (d < 0) d += ndim;
  if (d < 0 || d >= ndim) {
    TensorFail(absl::StrCat(op, ": dimension ", d, " out of range for ", ndim,
                            "-d tensor"));
  }
  return d;
}


std::vector<int64_t> KeptShape(const Tensor& a, std::vector<int64_t> dims) {
  std::vector<int64_t> shape = a.sizes();
  for (int64_t d : dims) shape[NormDim(d, a.dim(), "sum")] = 1;
  return shape;
}

// --- Device dispatch ---------------------------------------------------------
// An op whose operands are on a CUDA device computes through the DeviceOps
// of their storage (tensor/cuda/device_ops.h); the CPU path is untouched.

namespace math = cuda::math;
using cuda::DeviceOps;

std::string Devices(std::initializer_list<const Tensor*> ts) {
  std::string out;
  for (const Tensor* t : ts) {
    absl::StrAppend(&out, out.empty() ? "" : ", ", cuda::DescribeOperand(*t));
  }
  return out;
}

// The backend of the operands when any is on a CUDA device, null when all
// are on the CPU; aborts naming `op` and the operands when they are on
// different devices or the device tensor has no backend.
DeviceOps* DeviceFor(const char* op, std::initializer_list<const Tensor*> ts) {
  bool any = false;
  for (const Tensor* t : ts) any = any || (t->defined() && t->device().is_cuda());
  if (!any) return nullptr;
  const Tensor& first = **ts.begin();
  for (const Tensor* t : ts) {
    if (!t->defined() || t->device() != first.device()) {
      TensorFail(absl::StrCat(op, ": operands on different devices (",
                              Devices(ts), ")"));
    }
  }
  DeviceOps* d = cuda::DeviceOpsOf(first);
  if (d == nullptr) {
    TensorFail(absl::StrCat(op, ": device tensor without a compute backend (",
                            Devices(ts), "); make it with a CudaContext that "
                            "has one (cuda::CreateComputeContext)"));
  }
  return d;
}

// The forward's result, or the documented precondition abort naming `op`.
Tensor Must(absl::StatusOr<Tensor> r, const char* op) {
  if (!r.ok()) TensorFail(absl::StrCat(op, ": ", r.status().ToString()));
  return *std::move(r);
}

// The documented precondition abort naming `op` when `s` is not OK.
void MustOk(const absl::Status& s, const char* op) {
  if (!s.ok()) TensorFail(absl::StrCat(op, ": ", s.ToString()));
}

// The backend of gradient `g` in a backward (Status on a missing one).
absl::StatusOr<DeviceOps*> GradOps(const Tensor& g, const char* op) {
  DeviceOps* d = cuda::DeviceOpsOf(g);
  if (d == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": gradient ", cuda::DescribeOperand(g),
        " is not a device tensor with a compute backend"));
  }
  return d;
}

// `t` (same rank as `shape` or fewer dims, size 1 where broadcast) read
// with stride 0 along broadcast dims, then copied contiguous.
absl::StatusOr<Tensor> ExpandTo(DeviceOps& d, const Tensor& t,
                                const std::vector<int64_t>& shape) {
  const int64_t lead = static_cast<int64_t>(shape.size()) - t.dim();
  std::vector<int64_t> strides(shape.size(), 0);
  for (int64_t i = 0; i < t.dim(); ++i) {
    strides[lead + i] = t.size(i) == 1 ? 0 : t.strides()[i];
  }
  ASSIGN_OR_RETURN(Tensor view, Tensor::FromStorage(t.storage(), t.dtype(),
                                                    shape, strides,
                                                    t.storage_offset()));
  return d.Unary(math::UnaryOp::kCopy, view);
}

// `g` summed down to `shape` (the inverse of broadcasting).
absl::StatusOr<Tensor> ReduceToDevice(DeviceOps& d, Tensor g,
                                      const std::vector<int64_t>& shape) {
  if (g.sizes() == shape) return g;
  while (g.dim() > static_cast<int64_t>(shape.size())) {
    ASSIGN_OR_RETURN(g, d.SumDim(g, 0, false));
  }
  for (int64_t i = 0; i < g.dim(); ++i) {
    if (shape[i] == 1 && g.size(i) != 1) {
      ASSIGN_OR_RETURN(g, d.SumDim(g, i, true));
    }
  }
  return g;
}

absl::StatusOr<Tensor> DeviceContiguous(DeviceOps& d, const Tensor& t) {
  if (t.is_contiguous()) return t;
  return d.Unary(math::UnaryOp::kCopy, t);
}

// Whether `t` is the transpose of a contiguous matrix (nn.Linear's W^T).
bool IsTransposedView(const Tensor& t) {
  return t.dim() == 2 && !t.is_contiguous() && t.strides()[0] == 1 &&
         t.strides()[1] == t.size(0);
}

// op(x) @ op(y), passing a transposed view to the backend as its
// contiguous matrix with the flag flipped (no copy).
absl::StatusOr<Tensor> DeviceMm(DeviceOps& d, const Tensor& x, bool tx,
                                const Tensor& y, bool ty) {
  const bool vx = IsTransposedView(x), vy = IsTransposedView(y);
  return d.Matmul(vx ? x.t() : x, vy ? y.t() : y, tx != vx, ty != vy);
}

Tensor DeviceBinary(DeviceOps* d, const char* op, const char* node,
                    math::BinaryOp kind, const Tensor& a, const Tensor& b) {
  Tensor out = Must(d->Binary(kind, a, b), op);
  if (!NeedsGrad(a, b)) return out;
  std::vector<SavedTensor> saved;
  if (kind == math::BinaryOp::kMul || kind == math::BinaryOp::kDiv) {
    saved = {SavedTensor(a, "self"), SavedTensor(b, "other")};
  }
  return Record(
      node, {a, b}, out, std::move(saved),
      [kind, node, sa = a.sizes(), sb = b.sizes()](
          const Tensor& g, const Saved& s, const Needs& n) -> Grads {
        ASSIGN_OR_RETURN(DeviceOps * dg, GradOps(g, node));
        Tensor ga, gb;
        using math::BinaryOp;
        switch (kind) {
          case BinaryOp::kAdd:
          case BinaryOp::kSub:
            if (n[0]) {
              ASSIGN_OR_RETURN(ga, ReduceToDevice(*dg, g, sa));
            }
            if (n[1]) {
              Tensor gn = g;
              if (kind == BinaryOp::kSub) {
                ASSIGN_OR_RETURN(gn, dg->Unary(math::UnaryOp::kNeg, g));
              }
              ASSIGN_OR_RETURN(gb, ReduceToDevice(*dg, gn, sb));
            }
            break;
          case BinaryOp::kMul:
          case BinaryOp::kDiv:
            if (n[0]) {  // g * b or g / b
              ASSIGN_OR_RETURN(Tensor t, dg->Binary(kind, g, s[1]));
              ASSIGN_OR_RETURN(ga, ReduceToDevice(*dg, t, sa));
            }
            if (n[1]) {  // g * a, or -g * a / b^2
              ASSIGN_OR_RETURN(Tensor t, dg->Binary(BinaryOp::kMul, g, s[0]));
              if (kind == BinaryOp::kDiv) {
                ASSIGN_OR_RETURN(t, dg->Binary(BinaryOp::kDiv, t, s[1]));
                ASSIGN_OR_RETURN(t, dg->Binary(BinaryOp::kDiv, t, s[1]));
                ASSIGN_OR_RETURN(t, dg->Unary(math::UnaryOp::kNeg, t));
              }
              ASSIGN_OR_RETURN(gb, ReduceToDevice(*dg, t, sb));
            }
            break;
          case BinaryOp::kPow:
            return absl::InternalError(
                absl::StrCat(node, ": pow is not a broadcasting binary op"));
        }
        return std::vector<Tensor>{ga, gb};
      });
}

// x op s with gradient g (add/sub) or g op s (mul/div).
Tensor DeviceScalar(DeviceOps* d, const char* op, const char* node,
                    math::BinaryOp kind, const Tensor& a, double s) {
  Tensor out = Must(d->Scalar(kind, a, s), op);
  if (!NeedsGrad(a)) return out;
  return Record(node, {a}, out, {},
                [kind, node, s](const Tensor& g, const Saved&,
                                const Needs&) -> Grads {
                  if (kind == math::BinaryOp::kAdd ||
                      kind == math::BinaryOp::kSub) {
                    return std::vector<Tensor>{g};
                  }
                  ASSIGN_OR_RETURN(DeviceOps * dg, GradOps(g, node));
                  ASSIGN_OR_RETURN(Tensor r, dg->Scalar(kind, g, s));
                  return std::vector<Tensor>{r};
                });
}

// How a device unary op's backward is computed from its saved tensor.
enum class DeviceGrad { kRelu, kTanh, kSigmoid, kGelu, kExp, kLog, kSqrt,
                         kNeg };

Tensor DeviceUnary(DeviceOps* d, const char* op, const char* node,
                   math::UnaryOp kind, DeviceGrad grad, const Tensor& a) {
  Tensor out = Must(d->Unary(kind, a), op);
  if (!NeedsGrad(a)) return out;
  // ReLU, GELU and log keep the input; the others their output.
  const bool save_input = grad == DeviceGrad::kRelu ||
                          grad == DeviceGrad::kGelu || grad == DeviceGrad::kLog;
  std::vector<SavedTensor> saved;
  if (grad != DeviceGrad::kNeg) {
    saved.push_back(save_input ? SavedTensor(a, "self")
                               : SavedTensor(out, "result"));
  }
  return Record(
      node, {a}, out, std::move(saved),
      [grad, node](const Tensor& g, const Saved& s, const Needs&) -> Grads {
        ASSIGN_OR_RETURN(DeviceOps * dg, GradOps(g, node));
        absl::StatusOr<Tensor> r;
        switch (grad) {
          case DeviceGrad::kRelu:
          case DeviceGrad::kTanh:
          case DeviceGrad::kSigmoid:
          case DeviceGrad::kGelu: {
            const math::BackwardOp op =
                grad == DeviceGrad::kRelu   ? math::BackwardOp::kRelu
                : grad == DeviceGrad::kTanh ? math::BackwardOp::kTanh
                : grad == DeviceGrad::kSigmoid ? math::BackwardOp::kSigmoid
                                               : math::BackwardOp::kGelu;
            r = dg->UnaryBackward(op, g, s[0]);
            break;
          }
          case DeviceGrad::kExp:
            r = dg->Binary(math::BinaryOp::kMul, g, s[0]);
            break;
          case DeviceGrad::kLog:
            r = dg->Binary(math::BinaryOp::kDiv, g, s[0]);
            break;
          case DeviceGrad::kSqrt: {  // g / (2 y)
            ASSIGN_OR_RETURN(Tensor twice,
                             dg->Scalar(math::BinaryOp::kMul, s[0], 2));
            r = dg->Binary(math::BinaryOp::kDiv, g, twice);
            break;
          }
          case DeviceGrad::kNeg:
            r = dg->Unary(math::UnaryOp::kNeg, g);
            break;
        }
        if (!r.ok()) return r.status();
        return std::vector<Tensor>{*std::move(r)};
      });
}

}  // namespace

// --- Elementwise
// --------------------------------------------------------------

Tensor add(const Tensor& a, const Tensor& b) {
  if (DeviceOps* d = DeviceFor("add", {&a, &b}))
    return DeviceBinary(d, "add", "AddBackward", math::BinaryOp::kAdd, a, b);
  Tensor out = Zip(a, b, "add", [](auto x, auto y) { return x + y; });
  if (!NeedsGrad(a, b)) return out;
  if (a.sizes() == b.sizes()) {  // No broadcast: nothing to capture.
    return Record("AddBackward", {a, b}, out, {},
                  [](const Tensor& g, const Saved&, const Needs&) -> Grads {
                    return std::vector<Tensor>{g, g};
                  });
  }
  return Record("AddBackward", {a, b}, out, {},
                [sa = a.sizes(), sb = b.sizes()](const Tensor& g, const Saved&,
                                                 const Needs&) -> Grads {
                  return std::vector<Tensor>{ReduceTo(g, sa), ReduceTo(g, sb)};
                });
}

Tensor sub(const Tensor& a, const Tensor& b) {
  if (DeviceOps* d = DeviceFor("sub", {&a, &b}))
    return DeviceBinary(d, "sub", "SubBackward", math::BinaryOp::kSub, a, b);
  Tensor out = Zip(a, b, "sub", [](auto x, auto y) { return x - y; });
  if (!NeedsGrad(a, b)) return out;
  return Record("SubBackward", {a, b}, out, {},
                [sa = a.sizes(), sb = b.sizes()](const Tensor& g, const Saved&,
                                                 const Needs& n) -> Grads {
                  return std::vector<Tensor>{
                      ReduceTo(g, sa), n[1] ? ReduceTo(g.neg(), sb) : Tensor()};
                });
}

Tensor mul(const Tensor& a, const Tensor& b) {
  if (DeviceOps* d = DeviceFor("mul", {&a, &b}))
    return DeviceBinary(d, "mul", "MulBackward", math::BinaryOp::kMul, a, b);
  Tensor out = Zip(a, b, "mul", [](auto x, auto y) { return x * y; });
  if (!NeedsGrad(a, b)) return out;
  auto m = [](auto x, auto y) { return x * y; };
  return Record("MulBackward", {a, b}, out,
                {SavedTensor(a, "self"), SavedTensor(b, "other")},
                [m, sa = a.sizes(), sb = b.sizes()](
                    const Tensor& g, const Saved& s, const Needs& n) -> Grads {
                  return std::vector<Tensor>{
                      n[0] ? ReduceTo(Zip(g, s[1], "mul", m), sa) : Tensor(),
                      n[1] ? ReduceTo(Zip(g, s[0], "mul", m), sb) : Tensor()};
                });
}

Tensor div(const Tensor& a, const Tensor& b) {
  if (DeviceOps* d = DeviceFor("div", {&a, &b}))
    return DeviceBinary(d, "div", "DivBackward", math::BinaryOp::kDiv, a, b);
  Tensor out = Zip(a, b, "div", [](auto x, auto y) { return x / y; });
  if (!NeedsGrad(a, b)) return out;
  return Record(
      "DivBackward", {a, b}, out,
      {SavedTensor(a, "self"), SavedTensor(b, "other")},
      [sa = a.sizes(), sb = b.sizes()](const Tensor& g, const Saved& s,
                                       const Needs& n) -> Grads {
        Tensor ga, gb;
        if (n[0])
          ga = ReduceTo(
              Zip(g, s[1], "div", [](auto x, auto y) { return x / y; }), sa);
        if (n[1]) {
          Tensor ga_times_a =
              Zip(g, s[0], "div", [](auto x, auto y) { return x * y; });
          gb = ReduceTo(Zip(ga_times_a, s[1], "div",
                            [](auto x, auto y) { return -x / (y * y); }),
                        sb);
        }
        return std::vector<Tensor>{ga, gb};
      });
}

Tensor add(const Tensor& a, double b) {
  if (DeviceOps* d = DeviceFor("add", {&a}))
    return DeviceScalar(d, "add", "AddScalarBackward", math::BinaryOp::kAdd, a,
                        b);
  Tensor out = a.add(b);
  if (!NeedsGrad(a)) return out;
  return Record("AddScalarBackward", {a}, out, {},
                [](const Tensor& g, const Saved&, const Needs&) -> Grads {
                  return std::vector<Tensor>{g};
                });
}

Tensor sub(const Tensor& a, double b) { return add(a, -b); }

Tensor mul(const Tensor& a, double b) {
  if (DeviceOps* d = DeviceFor("mul", {&a}))
    return DeviceScalar(d, "mul", "MulScalarBackward", math::BinaryOp::kMul, a,
                        b);
  Tensor out = a.mul(b);
  if (!NeedsGrad(a)) return out;
  return Record("MulScalarBackward", {a}, out, {},
                [b](const Tensor& g, const Saved&, const Needs&) -> Grads {
                  return std::vector<Tensor>{g.mul(b)};
                });
}

Tensor div(const Tensor& a, double b) {
  if (DeviceOps* d = DeviceFor("div", {&a}))
    return DeviceScalar(d, "div", "DivScalarBackward", math::BinaryOp::kDiv, a,
                        b);
  Tensor out = a.div(b);
  if (!NeedsGrad(a)) return out;
  return Record("DivScalarBackward", {a}, out, {},
                [b](const Tensor& g, const Saved&, const Needs&) -> Grads {
                  return std::vector<Tensor>{g.div(b)};
                });
}

Tensor neg(const Tensor& a) {
  if (DeviceOps* d = DeviceFor("neg", {&a}))
    return DeviceUnary(d, "neg", "NegBackward", math::UnaryOp::kNeg,
                       DeviceGrad::kNeg, a);
  Tensor out = a.neg();
  if (!NeedsGrad(a)) return out;
  return Record("NegBackward", {a}, out, {},
                [](const Tensor& g, const Saved&, const Needs&) -> Grads {
                  return std::vector<Tensor>{g.neg()};
                });
}

namespace {

// A unary op whose gradient is g * f'(saved) with `saved` the input
// (save_output false) or the output.
template <typename F, typename D>
Tensor Unary(const char* name, const char* backward_name, const Tensor& a,
             bool save_output, F f, D dfdx_times_g) {
  Tensor out = Map(a, name, f);
  if (!NeedsGrad(a)) return out;
  SavedTensor saved =
      save_output ? SavedTensor(out, "result") : SavedTensor(a, "self");
  return Record(backward_name, {a}, out, {std::move(saved)},
                [dfdx_times_g, name](const Tensor& g, const Saved& s,
                                     const Needs&) -> Grads {
                  return std::vector<Tensor>{Zip(g, s[0], name, dfdx_times_g)};
                });
}

}  // namespace

Tensor pow(const Tensor& a, double p) {
  if (DeviceOps* d = DeviceFor("pow", {&a})) {
    if (p == 2) return mul(a, a);  // Differentiable: 2 a g.
    Tensor out = Must(d->Scalar(math::BinaryOp::kPow, a, p), "pow");
    if (!NeedsGrad(a)) return out;
    return Record(
        "PowBackward", {a}, out, {SavedTensor(a, "self")},
        [p](const Tensor& g, const Saved& s, const Needs&) -> Grads {
          // g * p * a^(p - 1).
          ASSIGN_OR_RETURN(DeviceOps * dg, GradOps(g, "PowBackward"));
          ASSIGN_OR_RETURN(Tensor t,
                           dg->Scalar(math::BinaryOp::kPow, s[0], p - 1));
          ASSIGN_OR_RETURN(t, dg->Scalar(math::BinaryOp::kMul, t, p));
          ASSIGN_OR_RETURN(t, dg->Binary(math::BinaryOp::kMul, g, t));
          return std::vector<Tensor>{t};
        });
  }
  if (p == 2) {
    // Squares (mse_loss) skip libm's pow, which dominated a small training
    // step, in branch-free (vectorizable) loops with the same results:
    // x * x is pow(x, 2) correctly rounded, pow(x, 1) is x, and g * 2 * x
    // rounds once in T as the double product did (exact in double).
    return Unary(
        "pow", "PowBackward", a, false, [](auto x) { return x * x; },
        [](auto g, auto x) { return g * static_cast<decltype(x)>(2) * x; });
  }
  return Unary(
      "pow", "PowBackward", a, false,
      [p](auto x) { return static_cast<decltype(x)>(std::pow(x, p)); },
      [p](auto g, auto x) {
        return static_cast<decltype(x)>(g * p * std::pow(x, p - 1));
      });
}

Tensor sqrt(const Tensor& a) {
  if (DeviceOps* d = DeviceFor("sqrt", {&a}))
    return DeviceUnary(d, "sqrt", "SqrtBackward", math::UnaryOp::kSqrt, DeviceGrad::kSqrt, a);
  return Unary(
      "sqrt", "SqrtBackward", a, true, [](auto x) { return std::sqrt(x); },
      [](auto g, auto y) { return g / (2 * y); });
}

Tensor exp(const Tensor& a) {
  if (DeviceOps* d = DeviceFor("exp", {&a}))
    return DeviceUnary(d, "exp", "ExpBackward", math::UnaryOp::kExp, DeviceGrad::kExp, a);
  return Unary(
      "exp", "ExpBackward", a, true, [](auto x) { return std::exp(x); },
      [](auto g, auto y) { return g * y; });
}

Tensor log(const Tensor& a) {
  if (DeviceOps* d = DeviceFor("log", {&a}))
    return DeviceUnary(d, "log", "LogBackward", math::UnaryOp::kLog, DeviceGrad::kLog, a);
  return Unary(
      "log", "LogBackward", a, false, [](auto x) { return std::log(x); },
      [](auto g, auto x) { return g / x; });
}

Tensor tanh(const Tensor& a) {
  if (DeviceOps* d = DeviceFor("tanh", {&a}))
    return DeviceUnary(d, "tanh", "TanhBackward", math::UnaryOp::kTanh, DeviceGrad::kTanh, a);
  return Unary(
      "tanh", "TanhBackward", a, true, [](auto x) { return std::tanh(x); },
      [](auto g, auto y) { return g * (1 - y * y); });
}

Tensor sigmoid(const Tensor& a) {
  if (DeviceOps* d = DeviceFor("sigmoid", {&a}))
    return DeviceUnary(d, "sigmoid", "SigmoidBackward", math::UnaryOp::kSigmoid, DeviceGrad::kSigmoid, a);
  return Unary(
      "sigmoid", "SigmoidBackward", a, true,
      [](auto x) { return 1 / (1 + std::exp(-x)); },
      [](auto g, auto y) { return g * y * (1 - y); });
}

Tensor relu(const Tensor& a) {
  if (DeviceOps* d = DeviceFor("relu", {&a}))
    return DeviceUnary(d, "relu", "ReluBackward", math::UnaryOp::kRelu, DeviceGrad::kRelu, a);
  return Unary(
      "relu", "ReluBackward", a, true,
      [](auto x) { return x > 0 ? x : decltype(x)(0); },
      [](auto g, auto y) { return y > 0 ? g : decltype(g)(0); });
}

Tensor gelu(const Tensor& a) {
  if (DeviceOps* d = DeviceFor("gelu", {&a}))
    return DeviceUnary(d, "gelu", "GeluBackward", math::UnaryOp::kGelu,
                       DeviceGrad::kGelu, a);
  return Unary(
      "gelu", "GeluBackward", a, false,
      [](auto x) {
        using T = decltype(x);
        return static_cast<T>(0.5 * x * (1 + std::erf(x * M_SQRT1_2)));
      },
      [](auto g, auto x) {
        using T = decltype(x);
        const double cdf = 0.5 * (1 + std::erf(x * M_SQRT1_2));
        const double pdf =
            std::exp(-0.5 * x * x) * (0.5 * M_2_SQRTPI * M_SQRT1_2);
        return static_cast<T>(g * (cdf + x * pdf));
      });
}

namespace {

Tensor WhereKernel(const Tensor& cond, const Tensor& a, const Tensor& b) {
  for (const Tensor* t : {&cond, &a, &b}) t->CheckCpu("where");
  cond.CheckDType(DType::kBool, "where");
  if (cond.sizes() != a.sizes() || a.sizes() != b.sizes() ||
      a.dtype() != b.dtype()) {
    TensorFail(absl::StrCat("where: expected cond, a, b of one shape, got ",
                            ShapeString(cond), ", ", ShapeString(a), ", ",
                            ShapeString(b)));
  }
  Tensor cc = cond.contiguous(), ac = a.contiguous(), bc = b.contiguous();
  Tensor out = empty(a.sizes(), a.dtype());
  FloatDispatch(a.dtype(), "where", [&]<typename T>() {
    const bool* pc = cc.data<bool>();
    const T *pa = ac.data<T>(), *pb = bc.data<T>();
    T* po = out.data<T>();
    const int64_t n = out.numel();
    for (int64_t i = 0; i < n; ++i) po[i] = pc[i] ? pa[i] : pb[i];
  });
  return out;
}

}  // namespace

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  if (DeviceOps* d = DeviceFor("where", {&cond, &a, &b})) {
    if (cond.dtype() != DType::kBool || cond.sizes() != a.sizes() ||
        a.sizes() != b.sizes()) {
      TensorFail(absl::StrCat("where: expected a bool cond and cond, a, b of "
                              "one shape (",
                              Devices({&cond, &a, &b}), ")"));
    }
    Tensor out = Must(d->Where(cond, a, b), "where");
    if (!NeedsGrad(a, b)) return out;
    return Record(
        "WhereBackward", {a, b}, out, {SavedTensor(cond, "condition")},
        [](const Tensor& g, const Saved& s, const Needs& n) -> Grads {
          ASSIGN_OR_RETURN(DeviceOps * dg, GradOps(g, "WhereBackward"));
          ASSIGN_OR_RETURN(Tensor zero, dg->Empty({}, g.dtype(), g.device()));
          RETURN_IF_ERROR(dg->Fill(zero, 0));
          Tensor ga, gb;
          if (n[0]) {
            ASSIGN_OR_RETURN(ga, dg->Where(s[0], g, zero));
          }
          if (n[1]) {
            ASSIGN_OR_RETURN(gb, dg->Where(s[0], zero, g));
          }
          return std::vector<Tensor>{ga, gb};
        });
  }
  Tensor out = WhereKernel(cond, a, b);
  if (!NeedsGrad(a, b)) return out;
  return Record("WhereBackward", {a, b}, out, {SavedTensor(cond, "condition")},
                [](const Tensor& g, const Saved& s, const Needs&) -> Grads {
                  Tensor z = zeros_like(g);
                  return std::vector<Tensor>{WhereKernel(s[0], g, z),
                                             WhereKernel(s[0], z, g)};
                });
}

// --- Linear algebra and reductions -----------------------------------------

namespace {

using kernels::Gemm;

// Batched product of [B, m, k] x [B, k, n] (contiguous), or its
// gradients: op(a_i) x op(b_i) per batch.
Tensor BatchGemm(const Tensor& a, bool ta, const Tensor& b, bool tb) {
  const int64_t batch = a.size(0);
  Tensor out;
  for (int64_t i = 0; i < batch; ++i) {
    Tensor r = Gemm(a.select(0, i), ta, b.select(0, i), tb);
    if (!out.defined()) out = empty({batch, r.size(0), r.size(1)}, r.dtype());
    out.select(0, i).copy_(r);
  }
  if (!out.defined()) {
    const int64_t m = ta ? a.size(2) : a.size(1);
    const int64_t n = tb ? b.size(1) : b.size(2);
    out = zeros({0, m, n}, a.dtype());
  }
  return out;
}

// Whether `t` is the transpose of a contiguous matrix (nn.Linear's W^T).
bool IsTransposed(const Tensor& t) {
  return t.dim() == 2 && !t.is_contiguous() && t.strides()[0] == 1 &&
         t.strides()[1] == t.size(0);
}

// d(a b)/da = g b^T, laid out like `a` so that a transposed parameter view
// gets a contiguous gradient (no strided copy when it is accumulated).
Tensor MatmulGradA(const Tensor& g, const Tensor& b, const Tensor& a) {
  if (IsTransposed(a)) return Gemm(b, false, g, true).t();
  return Gemm(g, false, b, true);
}

// d(a b)/db = a^T g, laid out like `b`.
Tensor MatmulGradB(const Tensor& g, const Tensor& a, const Tensor& b) {
  if (IsTransposed(b)) return Gemm(g, true, a, false).t();
  return Gemm(a, true, g, false);
}

std::vector<int64_t> WithLast2(std::vector<int64_t> batch, int64_t m,
                               int64_t n) {
  batch.push_back(m);
  batch.push_back(n);
  return batch;
}

// `t` contiguous on its device and viewed as `sizes`.
absl::StatusOr<Tensor> DeviceView(DeviceOps& d, const Tensor& t,
                                  const std::vector<int64_t>& sizes) {
  ASSIGN_OR_RETURN(Tensor c, DeviceContiguous(d, t));
  return c.view(sizes);
}

// `t` [..., r, c] as [B, *, *] for a batched product; *transposed says
// whether that is t's transpose: a view with its last two dims swapped from
// a contiguous tensor (attention's k^T) is passed as that tensor with the
// flag set, without a copy; anything else is made contiguous.
absl::StatusOr<Tensor> AsBatch(DeviceOps& d, const Tensor& t,
                               bool* transposed) {
  const Tensor swapped = t.transpose(t.dim() - 2, t.dim() - 1);
  *transposed = !t.is_contiguous() && swapped.is_contiguous();
  if (*transposed) return swapped.view({-1, t.size(-1), t.size(-2)});
  return DeviceView(d, t, {-1, t.size(-2), t.size(-1)});
}

// Contiguous `x` holding the transpose of a tensor of `sizes` [..., r, c]
// (so [B, c, r]), viewed back as `sizes` (last two dims swapped).
Tensor SwapLast2View(const Tensor& x, std::vector<int64_t> sizes) {
  const int64_t d = static_cast<int64_t>(sizes.size());
  std::swap(sizes[d - 2], sizes[d - 1]);
  return x.view(sizes).transpose(d - 2, d - 1);
}

// matmul of N-D operands on a device, as on the CPU: N-D x 2-D folds a's
// batch dims into rows (one product); N-D x N-D with equal batch dims is
// one batched product (strided-batched GEMM on CUDA).
Tensor DeviceMatmulNd(DeviceOps* d, const Tensor& a, const Tensor& b) {
  if (a.dim() < 2 || b.dim() < 2) {
    TensorFail(absl::StrCat("matmul: expected at least 2-d tensors (",
                            Devices({&a, &b}), ")"));
  }
  const int64_t k = a.size(-1), m = a.size(-2), n = b.size(-1);
  if (b.size(-2) != k) {
    TensorFail(absl::StrCat("matmul: inner sizes ", k, " and ", b.size(-2),
                            " differ (", Devices({&a, &b}), ")"));
  }
  std::vector<int64_t> batch(a.sizes().begin(), a.sizes().end() - 2);
  if (b.dim() == 2) {
    Tensor a2 = Must(DeviceView(*d, a, {-1, k}), "matmul");
    Tensor out = Must(DeviceMm(*d, a2, false, b, false), "matmul")
                     .view(WithLast2(batch, m, n));
    if (!NeedsGrad(a, b)) return out;
    return Record(
        "MatmulBackward", {a, b}, out,
        {SavedTensor(a, "self"), SavedTensor(b, "other")},
        [k, n, sa = a.sizes()](const Tensor& g, const Saved& s,
                               const Needs& nd) -> Grads {
          ASSIGN_OR_RETURN(DeviceOps * dg, GradOps(g, "MatmulBackward"));
          ASSIGN_OR_RETURN(Tensor g2, DeviceView(*dg, g, {-1, n}));
          Tensor ga, gb;
          if (nd[0]) {
            ASSIGN_OR_RETURN(ga, DeviceMm(*dg, g2, false, s[1], true));
            ga = ga.view(sa);
          }
          if (nd[1]) {
            ASSIGN_OR_RETURN(Tensor a2, DeviceView(*dg, s[0], {-1, k}));
            if (IsTransposedView(s[1])) {  // Laid out like b (W^T).
              ASSIGN_OR_RETURN(gb, DeviceMm(*dg, g2, true, a2, false));
              gb = gb.t();
            } else {
              ASSIGN_OR_RETURN(gb, DeviceMm(*dg, a2, true, g2, false));
            }
          }
          return std::vector<Tensor>{ga, gb};
        });
  }
  if (a.dim() != b.dim() ||
      !std::equal(batch.begin(), batch.end(), b.sizes().begin())) {
    TensorFail(absl::StrCat("matmul: batch dims must match (",
                            Devices({&a, &b}), ")"));
  }
  bool ta = false, tb = false;
  Tensor a3 = Must(AsBatch(*d, a, &ta), "matmul");
  Tensor b3 = Must(AsBatch(*d, b, &tb), "matmul");
  Tensor out = Must(d->BatchedMatmul(a3, b3, ta, tb), "matmul")
                   .view(WithLast2(batch, m, n));
  if (!NeedsGrad(a, b)) return out;
  return Record(
      "BmmBackward", {a, b}, out,
      {SavedTensor(a, "self"), SavedTensor(b, "other")},
      [m, n, sa = a.sizes(), sb = b.sizes()](
          const Tensor& g, const Saved& s, const Needs& nd) -> Grads {
        ASSIGN_OR_RETURN(DeviceOps * dg, GradOps(g, "BmmBackward"));
        ASSIGN_OR_RETURN(Tensor g3, DeviceView(*dg, g, {-1, m, n}));
        bool ta = false, tb = false;
        ASSIGN_OR_RETURN(Tensor a3, AsBatch(*dg, s[0], &ta));
        ASSIGN_OR_RETURN(Tensor b3, AsBatch(*dg, s[1], &tb));
        // Each gradient laid out like its operand: a transposed view gets
        // the transpose of a contiguous product.
        Tensor ga, gb;
        if (nd[0] && ta) {  // (g op(b)^T)^T = op(b) g^T
          ASSIGN_OR_RETURN(ga, dg->BatchedMatmul(b3, g3, tb, true));
          ga = SwapLast2View(ga, sa);
        } else if (nd[0]) {
          ASSIGN_OR_RETURN(ga, dg->BatchedMatmul(g3, b3, false, !tb));
          ga = ga.view(sa);
        }
        if (nd[1] && tb) {  // (op(a)^T g)^T = g^T op(a)
          ASSIGN_OR_RETURN(gb, dg->BatchedMatmul(g3, a3, true, ta));
          gb = SwapLast2View(gb, sb);
        } else if (nd[1]) {
          ASSIGN_OR_RETURN(gb, dg->BatchedMatmul(a3, g3, !ta, false));
          gb = gb.view(sb);
        }
        return std::vector<Tensor>{ga, gb};
      });
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  if (DeviceOps* d = DeviceFor("matmul", {&a, &b})) {
    if (a.dim() != 2 || b.dim() != 2) return DeviceMatmulNd(d, a, b);
    Tensor out = Must(DeviceMm(*d, a, false, b, false), "matmul");
    if (!NeedsGrad(a, b)) return out;
    return Record(
        "MatmulBackward", {a, b}, out,
        {SavedTensor(a, "self"), SavedTensor(b, "other")},
        [](const Tensor& g, const Saved& s, const Needs& n) -> Grads {
          ASSIGN_OR_RETURN(DeviceOps * dg, GradOps(g, "MatmulBackward"));
          Tensor ga, gb;
          // Each gradient laid out like its operand (a transposed view
          // gets the transpose of a contiguous product), as on the CPU.
          if (n[0]) {
            if (IsTransposedView(s[0])) {
              ASSIGN_OR_RETURN(ga, DeviceMm(*dg, s[1], false, g, true));
              ga = ga.t();
            } else {
              ASSIGN_OR_RETURN(ga, DeviceMm(*dg, g, false, s[1], true));
            }
          }
          if (n[1]) {
            if (IsTransposedView(s[1])) {
              ASSIGN_OR_RETURN(gb, DeviceMm(*dg, g, true, s[0], false));
              gb = gb.t();
            } else {
              ASSIGN_OR_RETURN(gb, DeviceMm(*dg, s[0], true, g, false));
            }
          }
          return std::vector<Tensor>{ga, gb};
        });
  }
  if (a.dim() < 2 || b.dim() < 2) {
    TensorFail(absl::StrCat("matmul: expected at least 2-d tensors, got ",
                            ShapeString(a), " and ", ShapeString(b)));
  }
  if (a.dim() == 2 && b.dim() == 2) {
    Tensor out = Gemm(a, false, b, false);
    if (!NeedsGrad(a, b)) return out;
    return Record("MatmulBackward", {a, b}, out,
                  {SavedTensor(a, "self"), SavedTensor(b, "other")},
                  [](const Tensor& g, const Saved& s, const Needs& n) -> Grads {
                    return std::vector<Tensor>{
                        n[0] ? MatmulGradA(g, s[1], s[0]) : Tensor(),
                        n[1] ? MatmulGradB(g, s[0], s[1]) : Tensor()};
                  });
  }
  const int64_t k = a.size(-1), m = a.size(-2), n = b.size(-1);
  std::vector<int64_t> batch(a.sizes().begin(), a.sizes().end() - 2);
  if (b.dim() == 2) {  // Fold a's batch dims into its rows.
    Tensor a2 = a.reshape({-1, k});
    Tensor out = Gemm(a2, false, b, false).view(WithLast2(batch, m, n));
    if (!NeedsGrad(a, b)) return out;
    return Record(
        "MatmulBackward", {a, b}, out,
        {SavedTensor(a, "self"), SavedTensor(b, "other")},
        [k, n, sa = a.sizes()](const Tensor& g, const Saved& s,
                               const Needs& nd) -> Grads {
          Tensor g2 = g.reshape({-1, n});
          return std::vector<Tensor>{
              nd[0] ? Gemm(g2, false, s[1], true).view(sa) : Tensor(),
              nd[1] ? Gemm(s[0].reshape({-1, k}), true, g2, false) : Tensor()};
        });
  }
  if (a.dim() != b.dim() ||
      !std::equal(batch.begin(), batch.end(), b.sizes().begin())) {
    TensorFail(absl::StrCat("matmul: batch dims must match, got ",
                            ShapeString(a), " and ", ShapeString(b)));
  }
  auto as3 = [](const Tensor& t) {
    return t.reshape({-1, t.size(-2), t.size(-1)}).contiguous();
  };
  Tensor out =
      BatchGemm(as3(a), false, as3(b), false).view(WithLast2(batch, m, n));
  if (!NeedsGrad(a, b)) return out;
  return Record(
      "BmmBackward", {a, b}, out,
      {SavedTensor(a, "self"), SavedTensor(b, "other")},
      [as3, sa = a.sizes(), sb = b.sizes()](const Tensor& g, const Saved& s,
                                            const Needs& nd) -> Grads {
        Tensor g3 = as3(g);
        return std::vector<Tensor>{
            nd[0] ? BatchGemm(g3, false, as3(s[1]), true).view(sa) : Tensor(),
            nd[1] ? BatchGemm(as3(s[0]), true, g3, false).view(sb) : Tensor()};
      });
}

Tensor sum(const Tensor& a) {
  if (DeviceOps* d = DeviceFor("sum", {&a})) {
    Tensor out = Must(d->Sum(a), "sum");
    if (!NeedsGrad(a)) return out;
    return Record("SumBackward", {a}, out, {},
                  [sa = a.sizes()](const Tensor& g, const Saved&,
                                   const Needs&) -> Grads {
                    ASSIGN_OR_RETURN(DeviceOps * dg, GradOps(g, "SumBackward"));
                    ASSIGN_OR_RETURN(Tensor r, ExpandTo(*dg, g, sa));
                    return std::vector<Tensor>{r};
                  });
  }
  Tensor out = a.sum();
  if (!NeedsGrad(a)) return out;
  return Record(
      "SumBackward", {a}, out, {},
      [sa = a.sizes()](const Tensor& g, const Saved&, const Needs&) -> Grads {
        return std::vector<Tensor>{Materialize(g, sa)};
      });
}


Tensor sum(const Tensor& a, const std::vector<int64_t>& dims, bool keepdim) {
  if (DeviceOps* d = DeviceFor("sum", {&a})) {
    const std::vector<int64_t> kept = KeptShape(a, dims);
    Tensor out = a;
    for (int64_t i = 0; i < a.dim(); ++i) {
      if (kept[i] == 1 && a.size(i) != 1) {
        out = Must(d->SumDim(out, i, true), "sum");
      }
    }
    if (out.is_same(a)) out = Must(d->Unary(math::UnaryOp::kCopy, a), "sum");
    if (!keepdim) {
      std::vector<int64_t> shape;
      std::vector<bool> reduced(a.dim(), false);
      for (int64_t dim : dims) reduced[NormDim(dim, a.dim(), "sum")] = true;
      for (int64_t i = 0; i < a.dim(); ++i)
        if (!reduced[i]) shape.push_back(a.size(i));
      out = out.view(shape);
    }
    if (!NeedsGrad(a)) return out;
    return Record("SumBackward", {a}, out, {},
                  [sa = a.sizes(), kept](const Tensor& g, const Saved&,
                                         const Needs&) -> Grads {
                    ASSIGN_OR_RETURN(DeviceOps * dg, GradOps(g, "SumBackward"));
                    ASSIGN_OR_RETURN(Tensor gc, DeviceContiguous(*dg, g));
                    ASSIGN_OR_RETURN(Tensor r,
                                     ExpandTo(*dg, gc.view(kept), sa));
                    return std::vector<Tensor>{r};
                  });
  }
  Tensor out = kernels::SumDims(a, dims, keepdim);
  if (!NeedsGrad(a)) return out;
  return Record("SumBackward", {a}, out, {},
                [sa = a.sizes(), kept = KeptShape(a, dims)](
                    const Tensor& g, const Saved&, const Needs&) -> Grads {
                  return std::vector<Tensor>{Materialize(g.reshape(kept), sa)};
                });
}

Tensor mean(const Tensor& a) {
  return div(sum(a), static_cast<double>(a.numel()));
}

Tensor mean(const Tensor& a, const std::vector<int64_t>& dims, bool keepdim) {
  int64_t count = 1;
  for (int64_t d : KeptShape(a, dims)) count *= d;
  return div(sum(a, dims, keepdim),
             static_cast<double>(a.numel()) / static_cast<double>(count));
}

// --- Shapes and views ------------------------------------------------------

namespace {

// A view-like op whose gradient is the output gradient reshaped back.
Tensor ReshapeLike(const char* name, const Tensor& a, Tensor out) {
  if (!NeedsGrad(a)) return out;
  return Record(
      name, {a}, out, {},
      [sa = a.sizes()](const Tensor& g, const Saved&, const Needs&) -> Grads {
        if (g.device().is_cuda() && !g.is_contiguous()) {
          ASSIGN_OR_RETURN(DeviceOps * dg, GradOps(g, "ReshapeBackward"));
          ASSIGN_OR_RETURN(Tensor gc, DeviceContiguous(*dg, g));
          return std::vector<Tensor>{gc.view(sa)};
        }
        return std::vector<Tensor>{g.reshape(sa)};
      });
}

}  // namespace

Tensor reshape(const Tensor& a, const std::vector<int64_t>& sizes) {
  if (DeviceOps* d = DeviceFor("reshape", {&a}); d && !a.is_contiguous()) {
    return ReshapeLike("ReshapeBackward", a,
                       Must(DeviceContiguous(*d, a), "reshape").view(sizes));
  }
  return ReshapeLike("ReshapeBackward", a, a.reshape(sizes));
}
Tensor view(const Tensor& a, const std::vector<int64_t>& sizes) {
  return ReshapeLike("ViewBackward", a, a.view(sizes));
}
Tensor unsqueeze(const Tensor& a, int64_t dim) {
  return ReshapeLike("UnsqueezeBackward", a, a.unsqueeze(dim));
}
Tensor squeeze(const Tensor& a, int64_t dim) {
  return ReshapeLike("SqueezeBackward", a, a.squeeze(dim));
}

Tensor transpose(const Tensor& a, int64_t d0, int64_t d1) {
  Tensor out = a.transpose(d0, d1);
  if (!NeedsGrad(a)) return out;
  return Record("TransposeBackward", {a}, out, {},
                [d0, d1](const Tensor& g, const Saved&, const Needs&) -> Grads {
                  return std::vector<Tensor>{g.transpose(d0, d1)};
                });
}

Tensor permute(const Tensor& a, const std::vector<int64_t>& dims) {
  Tensor out = a.permute(dims);
  if (!NeedsGrad(a)) return out;
  std::vector<int64_t> inverse(dims.size());
  for (size_t i = 0; i < dims.size(); ++i)
    inverse[NormDim(dims[i], a.dim(), "permute")] = static_cast<int64_t>(i);
  return Record(
      "PermuteBackward", {a}, out, {},
      [inverse](const Tensor& g, const Saved&, const Needs&) -> Grads {
        return std::vector<Tensor>{g.permute(inverse)};
      });
}

namespace {

// A gradient of shape `sa` on g's device: zeros, with `part(z)` (the view
// the forward took) set to g.
template <typename Part>
Grads DeviceScatterGrad(const Tensor& g, const std::vector<int64_t>& sa,
                        const char* node, Part part) {
  ASSIGN_OR_RETURN(DeviceOps * dg, GradOps(g, node));
  ASSIGN_OR_RETURN(Tensor z, dg->Empty(sa, g.dtype(), g.device()));
  RETURN_IF_ERROR(dg->Fill(z, 0));
  RETURN_IF_ERROR(dg->CopyInto(part(z), g));
  return std::vector<Tensor>{z};
}

}  // namespace

Tensor slice(const Tensor& a, int64_t dim, int64_t start, int64_t end,
             int64_t step) {
  Tensor out = a.slice(dim, start, end, step);
  if (!NeedsGrad(a)) return out;
  return Record("SliceBackward", {a}, out, {},
                [sa = a.sizes(), dim, start, end, step](
                    const Tensor& g, const Saved&, const Needs&) -> Grads {
                  if (g.device().is_cuda()) {
                    return DeviceScatterGrad(g, sa, "SliceBackward",
                                             [=](const Tensor& z) {
                                               return z.slice(dim, start, end,
                                                              step);
                                             });
                  }
                  Tensor z = zeros(sa, g.dtype());
                  z.slice(dim, start, end, step).copy_(g);
                  return std::vector<Tensor>{z};
                });
}

Tensor select(const Tensor& a, int64_t dim, int64_t index) {
  Tensor out = a.select(dim, index);
  if (!NeedsGrad(a)) return out;
  return Record("SelectBackward", {a}, out, {},
                [sa = a.sizes(), dim, index](const Tensor& g, const Saved&,
                                             const Needs&) -> Grads {
                  if (g.device().is_cuda()) {
                    return DeviceScatterGrad(
                        g, sa, "SelectBackward", [=](const Tensor& z) {
                          return z.select(dim, index);
                        });
                  }
                  Tensor z = zeros(sa, g.dtype());
                  z.select(dim, index).copy_(g);
                  return std::vector<Tensor>{z};
                });
}

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  if (tensors.empty()) TensorFail("cat: no tensors");
  const Tensor& first = tensors[0];
  dim = NormDim(dim, first.dim(), "cat");
  std::vector<int64_t> shape = first.sizes();
  std::vector<int64_t> lengths;
  shape[dim] = 0;
  bool needs = false;
  for (const Tensor& t : tensors) {
    std::vector<int64_t> s = t.sizes();
    if (t.dim() != first.dim() || t.dtype() != first.dtype()) {
      TensorFail("cat: tensors differ in rank or dtype");
    }
    s[dim] = shape[dim];
    if (s != shape) {
      TensorFail(absl::StrCat("cat: shapes ", ShapeString(first), " and ",
                              ShapeString(t), " differ outside dim ", dim));
    }
    shape[dim] += t.size(dim);
    lengths.push_back(t.size(dim));
    needs = needs || NeedsGrad(t);
  }
  DeviceOps* d = nullptr;
  for (const Tensor& t : tensors) {
    if (DeviceOps* dt = DeviceFor("cat", {&first, &t})) d = dt;
  }
  Tensor out;
  if (d != nullptr) {
    out = Must(d->Empty(shape, first.dtype(), first.device()), "cat");
  } else {
    out = empty(shape, first.dtype());
  }
  int64_t offset = 0;
  for (const Tensor& t : tensors) {
    Tensor part = out.slice(dim, offset, offset + t.size(dim));
    if (d != nullptr) {
      MustOk(d->CopyInto(part, t), "cat");
    } else {
      part.copy_(t);
    }
    offset += t.size(dim);
  }
  if (!needs) return out;
  return Record(
      "CatBackward", tensors, out, {},
      [dim, lengths](const Tensor& g, const Saved&, const Needs&) -> Grads {
        std::vector<Tensor> grads;
        int64_t off = 0;
        for (int64_t len : lengths) {
          Tensor part = g.slice(dim, off, off + len);
          if (g.device().is_cuda()) {
            ASSIGN_OR_RETURN(DeviceOps * dg, GradOps(g, "CatBackward"));
            ASSIGN_OR_RETURN(part, DeviceContiguous(*dg, part));
            grads.push_back(part);
          } else {
            grads.push_back(part.contiguous());
          }
          off += len;
        }
        return grads;
      });
}

Tensor stack(const std::vector<Tensor>& tensors, int64_t dim) {
  if (tensors.empty()) TensorFail("stack: no tensors");
  const int64_t rank = tensors[0].dim() + 1;
  if (dim < 0) dim += rank;
  std::vector<Tensor> parts;
  for (const Tensor& t : tensors) parts.push_back(unsqueeze(t, dim));
  return cat(parts, dim);
}

// --- Neural-network functions ----------------------------------------------

namespace {

// Softmax / log-softmax over `dim` through the last-dim kernel.
Tensor SoftmaxAlong(const Tensor& a, int64_t dim, bool log) {
  if (dim == a.dim() - 1) return kernels::SoftmaxLast(a, log);
  return kernels::SoftmaxLast(a.transpose(dim, -1), log)
      .transpose(dim, -1)
      .contiguous();
}

}  // namespace

namespace {

// Softmax / log-softmax over the last dimension on a device.
Tensor DeviceSoftmax(DeviceOps* d, const Tensor& a, int64_t dim, bool log) {
  const char* op = log ? "log_softmax" : "softmax";
  // Another dim is moved last (a transposed view the kernels read strided),
  // computed there and moved back into a contiguous result.
  const int64_t last = a.dim() - 1;
  Tensor out = Must(d->Softmax(a.transpose(dim, last), log), op);
  if (dim != last) out = Must(DeviceContiguous(*d, out.transpose(dim, last)), op);
  if (!NeedsGrad(a)) return out;
  const char* node = log ? "LogSoftmaxBackward" : "SoftmaxBackward";
  return Record(node, {a}, out, {SavedTensor(out, "result")},
                [log, node, dim, last](const Tensor& g, const Saved& s,
                                       const Needs&) -> Grads {
                  ASSIGN_OR_RETURN(DeviceOps * dg, GradOps(g, node));
                  ASSIGN_OR_RETURN(Tensor r,
                                   dg->SoftmaxBackward(g.transpose(dim, last),
                                                       s[0].transpose(dim, last),
                                                       log));
                  if (dim != last) {
                    ASSIGN_OR_RETURN(
                        r, DeviceContiguous(*dg, r.transpose(dim, last)));
                  }
                  return std::vector<Tensor>{r};
                });
}

}  // namespace

Tensor softmax(const Tensor& a, int64_t dim) {
  dim = NormDim(dim, a.dim(), "softmax");
  if (DeviceOps* d = DeviceFor("softmax", {&a}))
    return DeviceSoftmax(d, a, dim, false);
  Tensor out = SoftmaxAlong(a, dim, false);
  if (!NeedsGrad(a)) return out;
  return Record(
      "SoftmaxBackward", {a}, out, {SavedTensor(out, "result")},
      [dim](const Tensor& g, const Saved& s, const Needs&) -> Grads {
        const Tensor& y = s[0];
        Tensor gy = Zip(g, y, "softmax", [](auto u, auto v) { return u * v; });
        Tensor dot = kernels::SumDims(gy, {dim}, true);
        Tensor centered =
            Zip(g, dot, "softmax", [](auto u, auto v) { return u - v; });
        return std::vector<Tensor>{
            Zip(centered, y, "softmax", [](auto u, auto v) { return u * v; })};
      });
}

Tensor log_softmax(const Tensor& a, int64_t dim) {
  dim = NormDim(dim, a.dim(), "log_softmax");
  if (DeviceOps* d = DeviceFor("log_softmax", {&a}))
    return DeviceSoftmax(d, a, dim, true);
  Tensor out = SoftmaxAlong(a, dim, true);
  if (!NeedsGrad(a)) return out;
  return Record(
      "LogSoftmaxBackward", {a}, out, {SavedTensor(out, "result")},
      [dim](const Tensor& g, const Saved& s, const Needs&) -> Grads {
        Tensor total = kernels::SumDims(g, {dim}, true);
        Tensor p_total = Zip(s[0], total, "log_softmax",
                             [](auto y, auto t) { return std::exp(y) * t; });
        return std::vector<Tensor>{Zip(g, p_total, "log_softmax",
                                       [](auto u, auto v) { return u - v; })};
      });
}

Tensor mse_loss(const Tensor& input, const Tensor& target) {
  if (input.sizes() != target.sizes()) {
    TensorFail(absl::StrCat("mse_loss: input ", ShapeString(input),
                            " and target ", ShapeString(target), " differ"));
  }
  return mean(pow(sub(input, target), 2.0));
}

namespace {

void CheckClassIndices(const Tensor& target, int64_t rows, int64_t classes,
                       const char* op) {
  target.CheckDType(DType::kInt64, op);
  if (target.dim() != 1 || target.size(0) != rows) {
    TensorFail(absl::StrCat(op, ": target ", ShapeString(target),
                            " does not match ", rows, " rows"));
  }
  for (int64_t t : target.to_vector<int64_t>()) {
    if (t < 0 || t >= classes) {
      TensorFail(
          absl::StrCat(op, ": class index ", t, " outside [0, ", classes, ")"));
    }
  }
}

}  // namespace

Tensor nll_loss(const Tensor& log_probs, const Tensor& target) {
  if (DeviceOps* d = DeviceFor("nll_loss", {&log_probs, &target})) {
    if (log_probs.dim() != 2) {
      TensorFail(absl::StrCat("nll_loss: expected [N, C] input (",
                              Devices({&log_probs, &target}), ")"));
    }
    Tensor out = Must(d->NllLoss(log_probs, target), "nll_loss");
    if (!NeedsGrad(log_probs)) return out;
    return Record(
        "NllLossBackward", {log_probs}, out, {SavedTensor(target, "target")},
        [classes = log_probs.size(1)](const Tensor& g, const Saved& s,
                                      const Needs&) -> Grads {
          ASSIGN_OR_RETURN(DeviceOps * dg, GradOps(g, "NllLossBackward"));
          ASSIGN_OR_RETURN(Tensor r, dg->NllLossBackward(s[0], g, classes));
          return std::vector<Tensor>{r};
        });
  }
  log_probs.CheckCpu("nll_loss");
  target.CheckCpu("nll_loss");
  if (log_probs.dim() != 2) {
    TensorFail(absl::StrCat("nll_loss: expected [N, C] input, got ",
                            ShapeString(log_probs)));
  }
  const int64_t rows = log_probs.size(0), classes = log_probs.size(1);
  CheckClassIndices(target, rows, classes, "nll_loss");
  Tensor lp = log_probs.contiguous(), tc = target.contiguous();
  const int64_t* pt = tc.data<int64_t>();
  Tensor out = FloatDispatch(log_probs.dtype(), "nll_loss", [&]<typename T>() {
    const T* p = lp.data<T>();
    double total = 0;
    for (int64_t i = 0; i < rows; ++i) total -= p[i * classes + pt[i]];
    return full({}, total / static_cast<double>(rows), log_probs.dtype());
  });
  if (!NeedsGrad(log_probs)) return out;
  return Record(
      "NllLossBackward", {log_probs}, out, {SavedTensor(target, "target")},
      [rows, classes, dtype = log_probs.dtype()](
          const Tensor& g, const Saved& s, const Needs&) -> Grads {
        Tensor grad = zeros({rows, classes}, dtype);
        const double v = -g.item<double>() / static_cast<double>(rows);
        Tensor tc = s[0].contiguous();
        const int64_t* pt = tc.data<int64_t>();
        FloatDispatch(dtype, "nll_loss", [&]<typename T>() {
          T* p = grad.data<T>();
          for (int64_t i = 0; i < rows; ++i)
            p[i * classes + pt[i]] = static_cast<T>(v);
        });
        return std::vector<Tensor>{grad};
      });
}

Tensor cross_entropy(const Tensor& logits, const Tensor& target) {
  if (DeviceOps* d = DeviceFor("cross_entropy", {&logits, &target})) {
    // Fused on the device: the loss and each row's log-sum-exp.
    absl::StatusOr<std::pair<Tensor, Tensor>> r =
        d->CrossEntropy(logits, target);
    if (!r.ok()) {
      TensorFail(absl::StrCat("cross_entropy: ", r.status().ToString()));
    }
    Tensor out = r->first;
    if (!NeedsGrad(logits)) return out;
    return Record(
        "CrossEntropyBackward", {logits}, out,
        {SavedTensor(logits, "self"), SavedTensor(target, "target"),
         SavedTensor(r->second, "lse")},
        [](const Tensor& g, const Saved& s, const Needs&) -> Grads {
          ASSIGN_OR_RETURN(DeviceOps * dg, GradOps(g, "CrossEntropyBackward"));
          ASSIGN_OR_RETURN(Tensor gx,
                           dg->CrossEntropyBackward(s[0], s[1], s[2], g));
          return std::vector<Tensor>{gx};
        });
  }
  return nll_loss(log_softmax(logits, 1), target);
}

Tensor embedding(const Tensor& weight, const Tensor& indices) {
  if (DeviceOps* d = DeviceFor("embedding", {&weight, &indices})) {
    Tensor out = Must(d->Embedding(weight, indices), "embedding");
    if (!NeedsGrad(weight)) return out;
    return Record("EmbeddingBackward", {weight}, out,
                  {SavedTensor(indices, "indices")},
                  [rows = weight.size(0)](const Tensor& g, const Saved& s,
                                          const Needs&) -> Grads {
                    ASSIGN_OR_RETURN(DeviceOps * dg,
                                     GradOps(g, "EmbeddingBackward"));
                    ASSIGN_OR_RETURN(Tensor gw,
                                     dg->EmbeddingBackward(g, s[0], rows));
                    return std::vector<Tensor>{gw};
                  });
  }
  weight.CheckCpu("embedding");
  indices.CheckCpu("embedding");
  if (weight.dim() != 2) {
    TensorFail(absl::StrCat("embedding: expected [V, D] weight, got ",
                            ShapeString(weight)));
  }
  indices.CheckDType(DType::kInt64, "embedding");
  const int64_t rows = weight.size(0), width = weight.size(1);
  Tensor ic = indices.contiguous(), wc = weight.contiguous();
  const int64_t* pi = ic.data<int64_t>();
  for (int64_t i = 0; i < ic.numel(); ++i) {
    if (pi[i] < 0 || pi[i] >= rows) {
      TensorFail(
          absl::StrCat("embedding: index ", pi[i], " outside [0, ", rows, ")"));
    }
  }
  std::vector<int64_t> shape = indices.sizes();
  shape.push_back(width);
  Tensor out = empty(shape, weight.dtype());
  FloatDispatch(weight.dtype(), "embedding", [&]<typename T>() {
    const T* w = wc.data<T>();
    T* o = out.data<T>();
    for (int64_t i = 0; i < ic.numel(); ++i)
      std::copy(w + pi[i] * width, w + (pi[i] + 1) * width, o + i * width);
  });
  if (!NeedsGrad(weight)) return out;
  return Record(
      "EmbeddingBackward", {weight}, out, {SavedTensor(indices, "indices")},
      [rows, width](const Tensor& g, const Saved& s, const Needs&) -> Grads {
        Tensor grad = zeros({rows, width}, g.dtype());
        Tensor gc = g.contiguous(), ic = s[0].contiguous();
        const int64_t* idx = ic.data<int64_t>();
        FloatDispatch(g.dtype(), "embedding", [&]<typename T>() {
          const T* pg = gc.data<T>();
          T* p = grad.data<T>();
          for (int64_t i = 0; i < ic.numel(); ++i)
            for (int64_t j = 0; j < width; ++j)
              p[idx[i] * width + j] += pg[i * width + j];
        });
        return std::vector<Tensor>{grad};
      });
}

Tensor to(const Tensor& a, Device device, cuda::DeviceOps* ops) {
  a.CheckDefined("to");
  if (a.device() == device) return a;
  cuda::DeviceOps* d = a.device().is_cuda() ? cuda::DeviceOpsOf(a) : ops;
  if (d == nullptr) {
    TensorFail(absl::StrCat("to: no compute backend to move ",
                            Devices({&a}), " to ", device.ToString(),
                            " (pass the context's compute())"));
  }
  Tensor out = Must(d->To(a, device), "to");
  if (!NeedsGrad(a)) return out;
  // The backward copies the gradient back; the backend stays alive with it.
  std::shared_ptr<DeviceComputeInterface> keep =
      a.device().is_cuda() ? a.storage().shared_compute()
                           : out.storage().shared_compute();
  return Record(
      "ToBackward", {a}, out, {},
      [keep, d, from = a.device()](const Tensor& g, const Saved&,
                                   const Needs&) -> Grads {
        ASSIGN_OR_RETURN(Tensor back, d->To(g, from));
        return std::vector<Tensor>{back};
      });
}

Tensor dropout(const Tensor& a, double p, bool training, uint64_t seed) {
  if (p < 0 || p > 1)
    TensorFail(absl::StrCat("dropout: p ", p, " not in [0, 1]"));
  if (!training || p == 0) return a;
  if (DeviceOps* d = DeviceFor("dropout", {&a})) {
    // A Philox mask (math::DropoutScale at positions 0..numel-1 of `seed`):
    // the same on every backend, not the CPU generator's numbers.
    Tensor mask = Must(
        d->DropoutMask(a.sizes(), a.dtype(), a.device(), p, seed, 0),
        "dropout");
    return mul(a, mask);
  }
  const double scale = p >= 1 ? 0.0 : 1.0 / (1.0 - p);
  Tensor mask =
      Map(rand(a.sizes(), seed, a.dtype()), "dropout", [p, scale](auto u) {
        return static_cast<decltype(u)>(u >= p ? scale : 0.0);
      });
  return mul(a, mask);
}

}  // namespace ferry::autograd
