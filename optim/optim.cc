#include "ferry/optim/optim.h"

#include <cmath>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "ferry/autograd/grad_mode.h"
#include "ferry/autograd/kernels.h"
#include "ferry/autograd/node.h"
#include "ferry/common/status.h"
#include "ferry/tensor/cuda/device_ops.h"

namespace ferry::optim {
namespace {

using autograd::kernels::FloatDispatch;

absl::Status Check(const std::vector<Tensor>& params,
                   const std::vector<Tensor>& grads, const char* op) {
  if (params.size() != grads.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": ", params.size(), " params but ", grads.size(), " grads"));
  }
  for (size_t i = 0; i < params.size(); ++i) {
    if (!grads[i].defined()) continue;
    if (!params[i].device().is_cpu() || !grads[i].device().is_cpu()) {
      return absl::InvalidArgumentError(absl::StrCat(
          op, ": param ", i, " is on ", params[i].device().ToString(),
          " and its grad on ", grads[i].device().ToString(),
          "; CPU steps need CPU parameters and gradients"));
    }
    if (grads[i].sizes() != params[i].sizes() ||
        grads[i].dtype() != params[i].dtype()) {
      return absl::InvalidArgumentError(absl::StrCat(
          op, ": grad ", i, " is ", autograd::ShapeString(grads[i]), " ",
          DTypeName(grads[i].dtype()), ", param is ",
          autograd::ShapeString(params[i]), " ", DTypeName(params[i].dtype())));
    }
    if (!params[i].is_contiguous())
      TensorFail(absl::StrCat(op, ": param ", i, " is not contiguous"));
  }
  return absl::OkStatus();
}

// Whether any parameter or gradient is on a CUDA device (the step then runs
// through the parameters' device backends).
bool AnyOnDevice(const std::vector<Tensor>& params,
                 const std::vector<Tensor>& grads) {
  for (const Tensor& p : params)
    if (p.defined() && p.device().is_cuda()) return true;
  for (const Tensor& g : grads)
    if (g.defined() && g.device().is_cuda()) return true;
  return false;
}

// Checks a device step's operands: lengths, and each parameter with a
// gradient contiguous, on the gradient's CUDA device, with a backend, of the
// gradient's shape and dtype. Returns the backends (null where no grad).
absl::StatusOr<std::vector<cuda::DeviceOps*>> CheckDevice(
    const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
    const char* op) {
  if (params.size() != grads.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": ", params.size(), " params but ", grads.size(), " grads"));
  }
  std::vector<cuda::DeviceOps*> ops(params.size(), nullptr);
  for (size_t i = 0; i < params.size(); ++i) {
    if (!grads[i].defined()) continue;
    const Tensor &p = params[i], &g = grads[i];
    cuda::DeviceOps* d = cuda::DeviceOpsOf(p);
    if (!p.device().is_cuda() || p.device() != g.device() || d == nullptr ||
        g.sizes() != p.sizes() || g.dtype() != p.dtype() ||
        !p.is_contiguous()) {
      return absl::InvalidArgumentError(absl::StrCat(
          op, ": param ", i, " (", cuda::DescribeOperand(p), ") and its grad (",
          cuda::DescribeOperand(g),
          ") must be on one CUDA device with a compute backend, of one shape "
          "and dtype, the param contiguous"));
    }
    ops[i] = d;
  }
  return ops;
}

// A zeroed state tensor like `p` on its device.
absl::StatusOr<Tensor> DeviceZeros(cuda::DeviceOps& d, const Tensor& p) {
  ASSIGN_OR_RETURN(Tensor t, d.Empty(p.sizes(), p.dtype(), p.device()));
  RETURN_IF_ERROR(d.Fill(t, 0));
  return t;
}

absl::Status DeviceSgdStep(const std::vector<Tensor>& params,
                           const std::vector<Tensor>& grads, SgdState& state,
                           const SgdOptions& o) {
  ASSIGN_OR_RETURN(std::vector<cuda::DeviceOps*> ops,
                   CheckDevice(params, grads, "SgdStep"));
  state.momentum_buffer.resize(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    if (ops[i] == nullptr) continue;
    Tensor& buf = state.momentum_buffer[i];
    const bool first = !buf.defined();
    if (o.momentum != 0 && first) {
      ASSIGN_OR_RETURN(buf, DeviceZeros(*ops[i], params[i]));
    }
    const cuda::math::SgdParams sp{.lr = o.lr,
                                   .momentum = o.momentum,
                                   .dampening = o.dampening,
                                   .weight_decay = o.weight_decay,
                                   .nesterov = o.nesterov,
                                   .first = first};
    RETURN_IF_ERROR(ops[i]->SgdStep(params[i], grads[i], buf, sp));
  }
  return absl::OkStatus();
}

absl::Status DeviceAdamStep(const std::vector<Tensor>& params,
                            const std::vector<Tensor>& grads,
                            AdamState& state, const AdamOptions& o,
                            bool decoupled) {
  ASSIGN_OR_RETURN(std::vector<cuda::DeviceOps*> ops,
                   CheckDevice(params, grads,
                               decoupled ? "AdamWStep" : "AdamStep"));
  const size_t n = params.size();
  state.step.resize(n, 0);
  state.exp_avg.resize(n);
  state.exp_avg_sq.resize(n);
  for (size_t i = 0; i < n; ++i) {
    if (ops[i] == nullptr) continue;
    if (!state.exp_avg[i].defined()) {
      ASSIGN_OR_RETURN(state.exp_avg[i], DeviceZeros(*ops[i], params[i]));
      ASSIGN_OR_RETURN(state.exp_avg_sq[i], DeviceZeros(*ops[i], params[i]));
    }
    const cuda::math::AdamParams ap = cuda::math::AdamForStep(
        {.lr = o.lr,
         .beta1 = o.beta1,
         .beta2 = o.beta2,
         .eps = o.eps,
         .weight_decay = o.weight_decay,
         .decoupled = decoupled},
        state.step[i] + 1);
    RETURN_IF_ERROR(ops[i]->AdamStep(params[i], grads[i], state.exp_avg[i],
                                     state.exp_avg_sq[i], ap));
    ++state.step[i];
  }
  return absl::OkStatus();
}

absl::Status DeviceAdagradStep(const std::vector<Tensor>& params,
                               const std::vector<Tensor>& grads,
                               AdagradState& state, const AdagradOptions& o) {
  ASSIGN_OR_RETURN(std::vector<cuda::DeviceOps*> ops,
                   CheckDevice(params, grads, "AdagradStep"));
  const size_t n = params.size();
  state.step.resize(n, 0);
  state.sum.resize(n);
  for (size_t i = 0; i < n; ++i) {
    if (ops[i] == nullptr) continue;
    if (!state.sum[i].defined()) {
      ASSIGN_OR_RETURN(state.sum[i], ops[i]->Empty(params[i].sizes(),
                                                   params[i].dtype(),
                                                   params[i].device()));
      RETURN_IF_ERROR(ops[i]->Fill(state.sum[i], o.initial_accumulator_value));
    }
    const int64_t t = state.step[i] + 1;
    const cuda::math::AdagradParams ap{
        .clr = o.lr / (1 + static_cast<double>(t - 1) * o.lr_decay),
        .weight_decay = o.weight_decay,
        .eps = o.eps};
    RETURN_IF_ERROR(ops[i]->AdagradStep(params[i], grads[i], state.sum[i], ap));
    state.step[i] = t;
  }
  return absl::OkStatus();
}

// Per-parameter state slot, created as `init` (zeros by default) on first use.
Tensor& Slot(std::vector<Tensor>& slots, size_t n, size_t i, const Tensor& p,
             double init = 0) {
  if (slots.size() < n) slots.resize(n);
  if (!slots[i].defined()) slots[i] = full_like(p, init);
  return slots[i];
}

}  // namespace

// PyTorch 1.13 torch.optim.SGD:
//   g <- g + weight_decay * p
//   if momentum != 0:  b <- g on the first step, else
//                      b <- momentum * b + (1 - dampening) * g
//                      g <- g + momentum * b if nesterov else b
//   p <- p - lr * g
absl::Status SgdStep(const std::vector<Tensor>& params,
                     const std::vector<Tensor>& grads, SgdState& state,
                     const SgdOptions& o) {
  if (AnyOnDevice(params, grads)) return DeviceSgdStep(params, grads, state, o);
  if (absl::Status s = Check(params, grads, "SgdStep"); !s.ok()) return s;
  state.momentum_buffer.resize(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    if (!grads[i].defined()) continue;
    Tensor p = params[i], gc = grads[i].contiguous();
    const bool first = !state.momentum_buffer[i].defined();
    Tensor buf;
    if (o.momentum != 0) buf = Slot(state.momentum_buffer, params.size(), i, p);
    p.storage().BumpVersion();
    FloatDispatch(p.dtype(), "SgdStep", [&]<typename T>() {
      T* pp = p.data<T>();
      const T* pg = gc.data<T>();
      const T lr = static_cast<T>(o.lr), wd = static_cast<T>(o.weight_decay);
      const int64_t n = p.numel();
      if (!buf.defined()) {  // Plain SGD: one vectorizable pass.
        for (int64_t j = 0; j < n; ++j) pp[j] -= lr * (pg[j] + wd * pp[j]);
        return;
      }
      T* pb = buf.data<T>();
      const T mom = static_cast<T>(o.momentum);
      const T damp = static_cast<T>(1 - o.dampening);
      for (int64_t j = 0; j < n; ++j) {
        T g = pg[j] + wd * pp[j];
        const T b = first ? g : mom * pb[j] + damp * g;
        pb[j] = b;
        g = o.nesterov ? g + mom * b : b;
        pp[j] -= lr * g;
      }
    });
  }
  return absl::OkStatus();
}

namespace {

// PyTorch 1.13 torch.optim.Adam / AdamW (amsgrad=False):
//   t <- t + 1
//   AdamW: p <- p * (1 - lr * weight_decay)
//   Adam:  g <- g + weight_decay * p
//   m <- beta1 * m + (1 - beta1) * g
//   v <- beta2 * v + (1 - beta2) * g^2
//   p <- p - (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
absl::Status AdamImpl(const std::vector<Tensor>& params,
                      const std::vector<Tensor>& grads, AdamState& state,
                      const AdamOptions& o, bool decoupled) {
  if (AnyOnDevice(params, grads)) {
    return DeviceAdamStep(params, grads, state, o, decoupled);
  }
  if (absl::Status s =
          Check(params, grads, decoupled ? "AdamWStep" : "AdamStep");
      !s.ok()) {
    return s;
  }
  const size_t n = params.size();
  state.step.resize(n, 0);
  for (size_t i = 0; i < n; ++i) {
    if (!grads[i].defined()) continue;
    Tensor p = params[i], gc = grads[i].contiguous();
    Tensor m = Slot(state.exp_avg, n, i, p),
           v = Slot(state.exp_avg_sq, n, i, p);
    const int64_t t = ++state.step[i];
    const double bc1 = 1 - std::pow(o.beta1, static_cast<double>(t));
    const double bc2_sqrt =
        std::sqrt(1 - std::pow(o.beta2, static_cast<double>(t)));
    const double step_size = o.lr / bc1;
    p.storage().BumpVersion();
    FloatDispatch(p.dtype(), "AdamStep", [&]<typename T>() {
      T *pp = p.data<T>(), *pm = m.data<T>(), *pv = v.data<T>();
      const T* pg = gc.data<T>();
      for (int64_t j = 0, n = p.numel(); j < n; ++j) {
        double param = pp[j], g = pg[j];
        if (decoupled) {
          param *= 1 - o.lr * o.weight_decay;
        } else {
          g += o.weight_decay * param;
        }
        const double mj = o.beta1 * pm[j] + (1 - o.beta1) * g;
        const double vj = o.beta2 * pv[j] + (1 - o.beta2) * g * g;
        pm[j] = static_cast<T>(mj);
        pv[j] = static_cast<T>(vj);
        const double denom = std::sqrt(vj) / bc2_sqrt + o.eps;
        pp[j] = static_cast<T>(param - step_size * mj / denom);
      }
    });
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status AdamStep(const std::vector<Tensor>& params,
                      const std::vector<Tensor>& grads, AdamState& state,
                      const AdamOptions& options) {
  return AdamImpl(params, grads, state, options, /*decoupled=*/false);
}

absl::Status AdamWStep(const std::vector<Tensor>& params,
                       const std::vector<Tensor>& grads, AdamState& state,
                       const AdamOptions& options) {
  return AdamImpl(params, grads, state, options, /*decoupled=*/true);
}

// PyTorch 1.13 torch.optim.Adagrad:
//   t <- t + 1
//   g <- g + weight_decay * p
//   clr <- lr / (1 + (t - 1) * lr_decay)
//   s <- s + g^2          (s starts at initial_accumulator_value)
//   p <- p - clr * g / (sqrt(s) + eps)
absl::Status AdagradStep(const std::vector<Tensor>& params,
                         const std::vector<Tensor>& grads, AdagradState& state,
                         const AdagradOptions& o) {
  if (AnyOnDevice(params, grads)) {
    return DeviceAdagradStep(params, grads, state, o);
  }
  if (absl::Status s = Check(params, grads, "AdagradStep"); !s.ok()) return s;
  const size_t n = params.size();
  state.step.resize(n, 0);
  for (size_t i = 0; i < n; ++i) {
    if (!grads[i].defined()) continue;
    Tensor p = params[i], gc = grads[i].contiguous();
    Tensor sum = Slot(state.sum, n, i, p, o.initial_accumulator_value);
    const int64_t t = ++state.step[i];
    const double clr = o.lr / (1 + static_cast<double>(t - 1) * o.lr_decay);
    p.storage().BumpVersion();
    FloatDispatch(p.dtype(), "AdagradStep", [&]<typename T>() {
      T *pp = p.data<T>(), *ps = sum.data<T>();
      const T* pg = gc.data<T>();
      for (int64_t j = 0, n = p.numel(); j < n; ++j) {
        const double g = pg[j] + o.weight_decay * pp[j];
        const double s = ps[j] + g * g;
        ps[j] = static_cast<T>(s);
        pp[j] = static_cast<T>(pp[j] - clr * g / (std::sqrt(s) + o.eps));
      }
    });
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// State export / import.

namespace {

std::string Key(size_t i, const char* name) { return absl::StrCat(i, "/", name); }

void PutTensors(StateDict& d, const std::vector<Tensor>& v, const char* name,
                bool copy) {
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i].defined()) d.tensors[Key(i, name)] = copy ? v[i].clone() : v[i];
  }
}

// Splits "<i>/<name>"; InvalidArgument naming the key when malformed, out of
// range or not one of `names`.
absl::StatusOr<std::pair<size_t, std::string>> ParseKey(
    const std::string& key, size_t num_params,
    std::initializer_list<const char*> names, const char* what) {
  const size_t slash = key.find('/');
  size_t i = 0;
  if (slash == std::string::npos ||
      !absl::SimpleAtoi(key.substr(0, slash), &i)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " state: malformed key '", key, "'"));
  }
  if (i >= num_params) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " state: key '", key, "' names parameter ", i,
                     " of ", num_params));
  }
  std::string name = key.substr(slash + 1);
  for (const char* n : names) {
    if (name == n) return std::make_pair(i, name);
  }
  return absl::InvalidArgumentError(
      absl::StrCat(what, " state: unknown key '", key, "'"));
}

// The tensors of `dict` named `name`, one slot per parameter (copied).
absl::StatusOr<std::map<std::string, std::vector<Tensor>>> TakeTensors(
    const StateDict& dict, size_t n, std::initializer_list<const char*> names,
    const char* what) {
  std::map<std::string, std::vector<Tensor>> out;
  for (const char* name : names) out[name].resize(n);
  for (const auto& [key, t] : dict.tensors) {
    absl::StatusOr<std::pair<size_t, std::string>> k =
        ParseKey(key, n, names, what);
    if (!k.ok()) return k.status();
    if (!t.defined() || !t.is_contiguous()) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " state: tensor '", key, "' is undefined or not contiguous"));
    }
    out[k->second][k->first] = t.clone();
  }
  return out;
}

absl::StatusOr<std::vector<int64_t>> TakeSteps(const StateDict& dict, size_t n,
                                               const char* what) {
  std::vector<int64_t> steps(n, 0);
  for (const auto& [key, v] : dict.ints) {
    absl::StatusOr<std::pair<size_t, std::string>> k =
        ParseKey(key, n, {"step"}, what);
    if (!k.ok()) return k.status();
    steps[k->first] = v;
  }
  return steps;
}

}  // namespace

StateDict ExportState(const SgdState& state, bool copy) {
  StateDict d;
  PutTensors(d, state.momentum_buffer, "momentum_buffer", copy);
  return d;
}

StateDict ExportState(const AdamState& state, bool copy) {
  StateDict d;
  for (size_t i = 0; i < state.step.size(); ++i) {
    d.ints[Key(i, "step")] = state.step[i];
  }
  PutTensors(d, state.exp_avg, "exp_avg", copy);
  PutTensors(d, state.exp_avg_sq, "exp_avg_sq", copy);
  return d;
}

StateDict ExportState(const AdagradState& state, bool copy) {
  StateDict d;
  for (size_t i = 0; i < state.step.size(); ++i) {
    d.ints[Key(i, "step")] = state.step[i];
  }
  PutTensors(d, state.sum, "sum", copy);
  return d;
}

absl::Status ImportState(const StateDict& dict, size_t n, SgdState& state) {
  if (!dict.ints.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "SGD state: unexpected counter '", dict.ints.begin()->first, "'"));
  }
  auto t = TakeTensors(dict, n, {"momentum_buffer"}, "SGD");
  if (!t.ok()) return t.status();
  state.momentum_buffer = std::move((*t)["momentum_buffer"]);
  return absl::OkStatus();
}

absl::Status ImportState(const StateDict& dict, size_t n, AdamState& state) {
  auto t = TakeTensors(dict, n, {"exp_avg", "exp_avg_sq"}, "Adam");
  if (!t.ok()) return t.status();
  absl::StatusOr<std::vector<int64_t>> steps = TakeSteps(dict, n, "Adam");
  if (!steps.ok()) return steps.status();
  state.step = *std::move(steps);
  state.exp_avg = std::move((*t)["exp_avg"]);
  state.exp_avg_sq = std::move((*t)["exp_avg_sq"]);
  return absl::OkStatus();
}

absl::Status ImportState(const StateDict& dict, size_t n,
                         AdagradState& state) {
  auto t = TakeTensors(dict, n, {"sum"}, "Adagrad");
  if (!t.ok()) return t.status();
  absl::StatusOr<std::vector<int64_t>> steps = TakeSteps(dict, n, "Adagrad");
  if (!steps.ok()) return steps.status();
  state.step = *std::move(steps);
  state.sum = std::move((*t)["sum"]);
  return absl::OkStatus();
}

absl::Status Optimizer::ImportStateDict(const StateDict& dict) {
  if (dict.tensors.empty() && dict.ints.empty()) return absl::OkStatus();
  return absl::UnimplementedError(
      "this optimizer does not import state (Optimizer::ImportStateDict)");
}

absl::Status Optimizer::Step() {
  std::vector<Tensor> grads;
  grads.reserve(params_.size());
  for (const Tensor& p : params_) grads.push_back(autograd::GradOf(p));
  return StepWith(grads);
}

void Optimizer::ZeroGrad() {
  for (const Tensor& p : params_) autograd::SetGrad(p, Tensor());
}

}  // namespace ferry::optim
