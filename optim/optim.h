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
// Devices: SGD, Adam, AdamW and Adagrad step CUDA parameters through their
// storage's compute backend (tensor/cuda/device_ops.h; state made on the
// device); every parameter with a gradient must then be contiguous and on
// its gradient's device (InvalidArgument naming both otherwise).
// Errors: InvalidArgument when params, grads and state have different
// lengths or a gradient's shape/dtype differs from its parameter's; nothing
// is updated then. Parameters must be contiguous (aborts otherwise).
// Thread safety: none; callers serialize steps on one parameter set.
// State export (StateDict): deep copies, for checkpoints
// (docs/design/checkpoints.md).
#ifndef FERRY_OPTIM_OPTIM_H_
#define FERRY_OPTIM_OPTIM_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "ferry/tensor/tensor.h"

namespace ferry::optim {

// torch.optim.SGD's hyperparameters.
struct SgdOptions {
  double lr = 0.01;          // learning rate
  double momentum = 0;       // momentum factor; 0: none
  double dampening = 0;      // dampening of the momentum
  bool nesterov = false;     // Nesterov momentum
  double weight_decay = 0;   // L2 penalty
};
// SGD's state across steps.
struct SgdState {
  std::vector<Tensor> momentum_buffer;  // Per parameter; undefined at start.
};
// One SGD step over `params` with `grads` (see the top of this file).
absl::Status SgdStep(const std::vector<Tensor>& params,
                     const std::vector<Tensor>& grads, SgdState& state,
                     const SgdOptions& options);

// torch.optim.Adam's (and AdamW's) hyperparameters.
struct AdamOptions {
  double lr = 1e-3;         // learning rate
  double beta1 = 0.9;       // decay of the first moment estimate
  double beta2 = 0.999;     // decay of the second moment estimate
  double eps = 1e-8;        // added to the denominator
  double weight_decay = 0;  // L2 for Adam, decoupled for AdamW.
};
// Adam's state across steps, per parameter (empty at start).
struct AdamState {
  std::vector<int64_t> step;  // steps taken
  // First and second moment estimates.
  std::vector<Tensor> exp_avg, exp_avg_sq;
};
// One Adam step (weight decay as an L2 term added to the gradient).
absl::Status AdamStep(const std::vector<Tensor>& params,
                      const std::vector<Tensor>& grads, AdamState& state,
                      const AdamOptions& options);
// One AdamW step (weight decay decoupled from the gradient).
absl::Status AdamWStep(const std::vector<Tensor>& params,
                       const std::vector<Tensor>& grads, AdamState& state,
                       const AdamOptions& options);

// torch.optim.Adagrad's hyperparameters.
struct AdagradOptions {
  double lr = 0.01;                      // learning rate
  double lr_decay = 0;                   // lr / (1 + (step - 1) * lr_decay)
  double weight_decay = 0;               // L2 penalty
  double initial_accumulator_value = 0;  // where each sum starts
  double eps = 1e-10;                    // added to the denominator
};
// Adagrad's state across steps, per parameter (empty at start).
struct AdagradState {
  std::vector<int64_t> step;  // steps taken
  std::vector<Tensor> sum;    // sums of squared gradients
};
// One Adagrad step.
absl::Status AdagradStep(const std::vector<Tensor>& params,
                         const std::vector<Tensor>& grads, AdagradState& state,
                         const AdagradOptions& options);

// An optimizer's state as named entries (torch's state_dict()["state"]):
// tensors keyed "<param index>/<buffer>" ("3/exp_avg") and counters keyed
// "<param index>/step". Parameters without state have no entries.
struct StateDict {
  std::map<std::string, Tensor> tensors;  // Deep copies, contiguous.
  std::map<std::string, int64_t> ints;    // Per-parameter step counters.
};
// SGD's momentum buffers as "<i>/momentum_buffer": copies, or with `copy`
// false the live tensors (to copy elsewhere before the next step).
StateDict ExportState(const SgdState& state, bool copy = true);
// Adam's / AdamW's "<i>/step", "<i>/exp_avg", "<i>/exp_avg_sq" (as above).
StateDict ExportState(const AdamState& state, bool copy = true);
// Adagrad's "<i>/step" and "<i>/sum" (as above).
StateDict ExportState(const AdagradState& state, bool copy = true);
// Replaces `state` with `dict`'s entries (copied) for `num_params`
// parameters. InvalidArgument naming the key for an unknown key, an index
// out of range or a non-contiguous tensor; `state` is untouched then.
absl::Status ImportState(const StateDict& dict, size_t num_params,
                         SgdState& state);
// ImportState for Adam / AdamW.
absl::Status ImportState(const StateDict& dict, size_t num_params,
                         AdamState& state);
// ImportState for Adagrad.
absl::Status ImportState(const StateDict& dict, size_t num_params,
                         AdagradState& state);

// Stateful wrappers: Step() applies the functional step to the parameters'
// current .grad; ZeroGrad() clears them.
class Optimizer {
 public:
  // Steps `params`, in this order.
  explicit Optimizer(std::vector<Tensor> params) : params_(std::move(params)) {}
  virtual ~Optimizer() = default;
  // Steps the parameters with their current .grad (undefined: skipped).
  absl::Status Step();
  // Clears every parameter's .grad (leaves it undefined).
  void ZeroGrad();
  // The parameters, in the order given.
  const std::vector<Tensor>& params() const { return params_; }
  // The optimizer's kind ("sgd", "adam", "adamw", "adagrad"; the default,
  // for optimizers defined elsewhere: "").
  virtual std::string kind() const { return ""; }
  // A deep copy of the state (ExportState); the default: empty.
  virtual StateDict ExportStateDict() const { return {}; }
  // Replaces the state (ImportState); on error the state is untouched. The
  // default: Unimplemented unless `dict` is empty.
  virtual absl::Status ImportStateDict(const StateDict& dict);
  // ExportState without copying: the live tensors, valid until the next
  // step (a snapshot copies them under the step lock); the default: empty.
  virtual StateDict StateView() const { return {}; }

 protected:
  // The step over params() with `grads` (one per parameter, in order).
  virtual absl::Status StepWith(const std::vector<Tensor>& grads) = 0;

 private:
  std::vector<Tensor> params_;
};

// torch.optim.SGD: SgdStep over the parameters' .grad.
class SGD : public Optimizer {
 public:
  // Steps `params` with `options`.
  SGD(std::vector<Tensor> params, SgdOptions options)
      : Optimizer(std::move(params)), options_(options) {}
  // The momentum buffers.
  const SgdState& state() const { return state_; }
  std::string kind() const override { return "sgd"; }  // "sgd".
  // ExportState(state()).
  StateDict ExportStateDict() const override { return ExportState(state_); }
  // ExportState(state(), false).
  StateDict StateView() const override { return ExportState(state_, false); }
  // ImportState into the momentum buffers.
  absl::Status ImportStateDict(const StateDict& dict) override {
    return ImportState(dict, params().size(), state_);
  }

 private:
  absl::Status StepWith(const std::vector<Tensor>& grads) override {
    return SgdStep(params(), grads, state_, options_);
  }
  SgdOptions options_;
  SgdState state_;
};

// torch.optim.Adam: AdamStep (AdamWStep when `decoupled`) over the
// parameters' .grad.
class Adam : public Optimizer {
 public:
  // Steps `params` with `options`; `decoupled`: AdamW's weight decay.
  Adam(std::vector<Tensor> params, AdamOptions options, bool decoupled = false)
      : Optimizer(std::move(params)),
        options_(options),
        decoupled_(decoupled) {}
  // The moments and step counters.
  const AdamState& state() const { return state_; }
  // "adam" or "adamw".
  std::string kind() const override { return decoupled_ ? "adamw" : "adam"; }
  // ExportState(state()).
  StateDict ExportStateDict() const override { return ExportState(state_); }
  // ExportState(state(), false).
  StateDict StateView() const override { return ExportState(state_, false); }
  // ImportState into the moments and step counters.
  absl::Status ImportStateDict(const StateDict& dict) override {
    return ImportState(dict, params().size(), state_);
  }

 private:
  absl::Status StepWith(const std::vector<Tensor>& grads) override {
    return decoupled_ ? AdamWStep(params(), grads, state_, options_)
                      : AdamStep(params(), grads, state_, options_);
  }
  AdamOptions options_;
  bool decoupled_;
  AdamState state_;
};

// torch.optim.AdamW: Adam with decoupled weight decay.
class AdamW : public Adam {
 public:
  // Steps `params` with `options`.
  AdamW(std::vector<Tensor> params, AdamOptions options)
      : Adam(std::move(params), options, /*decoupled=*/true) {}
};

// torch.optim.Adagrad: AdagradStep over the parameters' .grad.
class Adagrad : public Optimizer {
 public:
  // Steps `params` with `options`.
  Adagrad(std::vector<Tensor> params, AdagradOptions options)
      : Optimizer(std::move(params)), options_(options) {}
  // The sums and step counters.
  const AdagradState& state() const { return state_; }
  std::string kind() const override { return "adagrad"; }  // "adagrad".
  // ExportState(state()).
  StateDict ExportStateDict() const override { return ExportState(state_); }
  // ExportState(state(), false).
  StateDict StateView() const override { return ExportState(state_, false); }
  // ImportState into the sums and step counters.
  absl::Status ImportStateDict(const StateDict& dict) override {
    return ImportState(dict, params().size(), state_);
  }

 private:
  absl::Status StepWith(const std::vector<Tensor>& grads) override {
    return AdagradStep(params(), grads, state_, options_);
  }
  AdagradOptions options_;
  AdagradState state_;
};

}  // namespace ferry::optim

#endif  // FERRY_OPTIM_OPTIM_H_
