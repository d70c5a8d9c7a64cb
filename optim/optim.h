// Optimizers: each a pure step over (params, grads, state) plus a thin
// stateful wrapper that reads the parameters' .grad.
//
// The functional steps are what the distributed optimizer will run on
// parameter owners: they update `params` and `state` in place (bumping the
// parameters' version counters) and read nothing else. A parameter whose
// gradient is undefined is skipped and its state untouched, as in PyTorch.
// Update rules follow PyTorch 1.13's documented algorithms (quoted at each
// step function in optim.cc). SGD computes in the parameter's dtype (as
// PyTorch does); Adam and Adagrad compute each element in double and store
// it in the parameter's dtype (float32 or float64).
//
// Errors: InvalidArgument when params, grads and state have different
// lengths or a gradient's shape/dtype differs from its parameter's; nothing
// is updated then. Parameters must be contiguous (aborts otherwise).
// Thread safety: none; callers serialize steps on one parameter set.
#ifndef FERRY_OPTIM_OPTIM_H_
#define FERRY_OPTIM_OPTIM_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "ferry/tensor/tensor.h"

namespace ferry::optim {

struct SgdOptions {
  double lr = 0.01;
  double momentum = 0;
  double dampening = 0;
  bool nesterov = false;
  double weight_decay = 0;
};
struct SgdState {
  std::vector<Tensor> momentum_buffer;  // Per parameter; undefined at start.
};
absl::Status SgdStep(const std::vector<Tensor>& params,
                     const std::vector<Tensor>& grads, SgdState& state,
                     const SgdOptions& options);

struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0;  // L2 for Adam, decoupled for AdamW.
};
struct AdamState {
  std::vector<int64_t> step;
  std::vector<Tensor> exp_avg, exp_avg_sq;
};
absl::Status AdamStep(const std::vector<Tensor>& params,
                      const std::vector<Tensor>& grads, AdamState& state,
                      const AdamOptions& options);
absl::Status AdamWStep(const std::vector<Tensor>& params,
                       const std::vector<Tensor>& grads, AdamState& state,
                       const AdamOptions& options);

struct AdagradOptions {
  double lr = 0.01;
  double lr_decay = 0;
  double weight_decay = 0;
  double initial_accumulator_value = 0;
  double eps = 1e-10;
};
struct AdagradState {
  std::vector<int64_t> step;
  std::vector<Tensor> sum;
};
absl::Status AdagradStep(const std::vector<Tensor>& params,
                         const std::vector<Tensor>& grads, AdagradState& state,
                         const AdagradOptions& options);

// Stateful wrappers: Step() applies the functional step to the parameters'
// current .grad; ZeroGrad() clears them.
class Optimizer {
 public:
  explicit Optimizer(std::vector<Tensor> params) : params_(std::move(params)) {}
  virtual ~Optimizer() = default;
  absl::Status Step();
  void ZeroGrad();
  const std::vector<Tensor>& params() const { return params_; }

 protected:
  virtual absl::Status StepWith(const std::vector<Tensor>& grads) = 0;

 private:
  std::vector<Tensor> params_;
};

class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, SgdOptions options)
      : Optimizer(std::move(params)), options_(options) {}
  const SgdState& state() const { return state_; }

 private:
  absl::Status StepWith(const std::vector<Tensor>& grads) override {
    return SgdStep(params(), grads, state_, options_);
  }
  SgdOptions options_;
  SgdState state_;
};

class Adam : public Optimizer {
 public:
  Adam(std::vector<Tensor> params, AdamOptions options, bool decoupled = false)
      : Optimizer(std::move(params)),
        options_(options),
        decoupled_(decoupled) {}

 private:
  absl::Status StepWith(const std::vector<Tensor>& grads) override {
    return decoupled_ ? AdamWStep(params(), grads, state_, options_)
                      : AdamStep(params(), grads, state_, options_);
  }
  AdamOptions options_;
  bool decoupled_;
  AdamState state_;
};

class AdamW : public Adam {
 public:
  AdamW(std::vector<Tensor> params, AdamOptions options)
      : Adam(std::move(params), options, /*decoupled=*/true) {}
};

class Adagrad : public Optimizer {
 public:
  Adagrad(std::vector<Tensor> params, AdagradOptions options)
      : Optimizer(std::move(params)), options_(options) {}

 private:
  absl::Status StepWith(const std::vector<Tensor>& grads) override {
    return AdagradStep(params(), grads, state_, options_);
  }
  AdagradOptions options_;
  AdagradState state_;
};

}  // namespace ferry::optim

#endif  // FERRY_OPTIM_OPTIM_H_
