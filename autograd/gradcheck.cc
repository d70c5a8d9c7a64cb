#include "ferry/autograd/gradcheck.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "ferry/autograd/engine.h"
#include "ferry/autograd/grad_mode.h"
#include "ferry/autograd/node.h"
#include "ferry/autograd/ops.h"

namespace ferry::autograd {
namespace {

// sum(f(xs) * v), without recording a graph.
double Objective(const GradCheckFn& f, const std::vector<Tensor>& xs,
                 const Tensor& v) {
  NoGradGuard no_grad;
  return f(xs).mul(v).sum().item<double>();
}

}  // namespace

absl::Status GradCheck(const std::string& op, const GradCheckFn& f,
                       const std::vector<Tensor>& inputs, double eps,
                       double atol, double rtol) {
  std::vector<Tensor> xs;
  std::vector<size_t> floating;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (IsFloatingPoint(inputs[i].dtype())) {
      xs.push_back(inputs[i].to(DType::kFloat64).clone());
      SetRequiresGrad(xs.back());
      floating.push_back(i);
    } else {
      xs.push_back(inputs[i]);
    }
  }
  Tensor out = f(xs);
  if (out.dtype() != DType::kFloat64) {
    return absl::InvalidArgumentError(
        absl::StrCat("gradcheck(", op, "): output is not float64"));
  }
  const Tensor v = randn(out.sizes(), /*seed=*/12345, DType::kFloat64);
  std::vector<Tensor> wrt;
  for (size_t i : floating) wrt.push_back(xs[i]);
  absl::StatusOr<std::vector<Tensor>> analytic = Grad({sum(mul(out, v))}, wrt);
  if (!analytic.ok()) return analytic.status();
  for (size_t k = 0; k < floating.size(); ++k) {
    const size_t i = floating[k];
    Tensor x = xs[i];
    Tensor ga = (*analytic)[k];
    if (!ga.defined()) ga = zeros_like(x);
    if (ga.sizes() != x.sizes()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "gradcheck(", op, "): gradient of input ", i, " has shape ",
          ShapeString(ga), ", input ", ShapeString(x)));
    }
    const std::vector<double> a = ga.to_vector<double>();
    double* px = x.data<double>();
    for (int64_t e = 0; e < x.numel(); ++e) {
      const double orig = px[e];
      px[e] = orig + eps;
      const double up = Objective(f, xs, v);
      px[e] = orig - eps;
      const double down = Objective(f, xs, v);
      px[e] = orig;
      const double numeric = (up - down) / (2 * eps);
      if (!(std::abs(a[e] - numeric) <= atol + rtol * std::abs(numeric))) {
        return absl::InvalidArgumentError(
            absl::StrCat("gradcheck(", op, "): input ", i, " element ", e,
                         ": analytical ", a[e], " vs numerical ", numeric));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace ferry::autograd
