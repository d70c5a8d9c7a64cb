// Neural-network modules over autograd ops.
//
// A Module owns named parameters (leaf tensors that require grad) and named
// submodules, both kept in registration order, so parameters() and
// named_parameters() ("0.weight", "0.bias", "2.weight", ...) are stable
// across runs and processes; state dicts use those names. Initialization
// follows PyTorch's defaults from an explicit seed (no global generator), so
// a model is reproducible from its seeds.
//
// Errors: LoadStateDict reports bad bytes, missing or unexpected names and
// shape/dtype mismatches as InvalidArgument; Forward misuse (wrong input
// shape) aborts like the ops.
// Thread safety: a Module is not synchronized; a forward pass may run while
// no other thread mutates it (train/eval, loading, optimizer steps).
#ifndef FERRY_AUTOGRAD_NN_H_
#define FERRY_AUTOGRAD_NN_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ferry/tensor/cuda/device_ops.h"
#include "ferry/tensor/tensor.h"

namespace ferry::nn {

// A layer or model: named parameters and submodules (see the top of this
// file).
class Module {
 public:
  virtual ~Module() = default;
  // The module's output for `input`, recorded for autograd.
  virtual Tensor Forward(const Tensor& input) = 0;

  // Own parameters first (registration order), then each submodule's.
  std::vector<Tensor> parameters() const;
  // parameters() with dotted names ("0.weight").
  std::vector<std::pair<std::string, Tensor>> named_parameters() const;
  // The submodules, by name, in registration order.
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& children()
      const {
    return children_;
  }

  // Sets training mode here and in every submodule (dropout reads it).
  void train(bool on = true);
  void eval() { train(false); }  // train(false).
  // Training mode (the default).
  bool is_training() const { return training_; }
  // Clears every parameter's .grad.
  void ZeroGrad();
  // Moves every parameter (here and in submodules) to `device`: each becomes
  // a new leaf requiring grad, a copy on `device` (no gradient flows to the
  // old one), so optimizers must be made after the move. Moving to a CUDA
  // device needs `ops` (a CudaContext's compute()) for CPU parameters; from
  // a device the parameters' own backend is used. InvalidArgument naming
  // the parameter and devices when there is none; the copy's error (a device
  // the context lacks, out of memory) otherwise; parameters moved before an
  // error stay moved.
  absl::Status to(Device device, cuda::DeviceOps* ops = nullptr);

  // named_parameters() encoded as a dict Value with tensor/'s wire format.
  absl::StatusOr<std::string> SaveStateDict() const;
  // Copies the tensors of a SaveStateDict() stream into the parameters.
  absl::Status LoadStateDict(absl::string_view bytes);

 protected:
  // Registers `t` as parameter `name` (makes it a leaf requiring grad).
  Tensor RegisterParameter(std::string name, Tensor t);
  // Called after to() replaced this module's own parameters: subclasses that
  // keep parameter handles re-read them with parameter().
  virtual void ParametersMoved() {}
  // This module's own parameter `name` (aborts if there is none).
  const Tensor& parameter(const std::string& name) const;
  // Registers `m` as submodule `name`; returns it.
  template <typename M>
  std::shared_ptr<M> RegisterModule(std::string name, std::shared_ptr<M> m) {
    children_.emplace_back(std::move(name), m);
    return m;
  }

 private:
  void CollectNamed(const std::string& prefix,
                    std::vector<std::pair<std::string, Tensor>>* out) const;

  std::vector<std::pair<std::string, Tensor>> params_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
};

// y = x W^T + b, W [out, in]. Init as PyTorch: W and b uniform in
// [-1/sqrt(in), 1/sqrt(in)] (kaiming_uniform_ with a = sqrt(5)), drawn
// from `seed` (W) and `seed + 1` (b).
// A fully connected layer (see above).
class Linear : public Module {
 public:
  // Initialized from `seed`; `bias` false: no b.
  Linear(int64_t in_features, int64_t out_features, uint64_t seed,
         bool bias = true, DType dtype = DType::kFloat32);
  Tensor Forward(const Tensor& input) override;
  const Tensor& weight() const { return weight_; }  // W [out, in]
  const Tensor& bias() const { return bias_; }      // b [out], or undefined

 protected:
  void ParametersMoved() override;  // Re-reads weight_ and bias_.

 private:
  Tensor weight_, bias_;
};

// Lookup table [num, dim], init N(0, 1) from `seed`; input int64 indices.
// An embedding table (see above).
class Embedding : public Module {
 public:
  // num_embeddings rows of `dim`, initialized from `seed`.
  Embedding(int64_t num_embeddings, int64_t dim, uint64_t seed,
            DType dtype = DType::kFloat32);
  Tensor Forward(const Tensor& indices) override;
  const Tensor& weight() const { return weight_; }  // The table [num, dim].

 protected:
  void ParametersMoved() override;  // Re-reads weight_.

 private:
  Tensor weight_;
};

// relu (autograd/ops.h) as a module.
class ReLU : public Module {
 public:
  Tensor Forward(const Tensor& input) override;
};

// tanh (autograd/ops.h) as a module.
class Tanh : public Module {
 public:
  Tensor Forward(const Tensor& input) override;
};

// Dropout with probability p in training mode; call k uses mask seed
// seed + k, so a run is reproducible. Identity in eval mode.
class Dropout : public Module {
 public:
  // Drops with probability `p`.
  Dropout(double p, uint64_t seed) : p_(p), seed_(seed) {}
  Tensor Forward(const Tensor& input) override;

 private:
  double p_;
  uint64_t seed_;
  uint64_t calls_ = 0;
};

// Runs its modules in order; they are named "0", "1", ...
class Sequential : public Module {
 public:
  Sequential() = default;  // Empty; Append adds modules.
  // The modules, in order.
  explicit Sequential(std::vector<std::shared_ptr<Module>> modules);
  void Append(std::shared_ptr<Module> module);  // Adds `module` at the end.
  Tensor Forward(const Tensor& input) override;
  size_t size() const { return children().size(); }  // The number of modules.
};

// Losses (mean reduction), as in torch.nn.
// Mean squared error: mse_loss (autograd/ops.h).
struct MSELoss {
  // mse_loss(input, target).
  Tensor operator()(const Tensor& input, const Tensor& target) const;
};
// cross_entropy (autograd/ops.h): logits [N, C], int64 targets [N].
struct CrossEntropyLoss {
  // cross_entropy(logits, target).
  Tensor operator()(const Tensor& logits, const Tensor& target) const;
};
// nll_loss (autograd/ops.h): log-probabilities [N, C], int64 targets [N].
struct NLLLoss {
  // nll_loss(log_probs, target).
  Tensor operator()(const Tensor& log_probs, const Tensor& target) const;
};

}  // namespace ferry::nn

#endif  // FERRY_AUTOGRAD_NN_H_
