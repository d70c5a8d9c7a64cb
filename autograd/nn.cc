#include "ferry/autograd/nn.h"

#include <cmath>
#include <map>

#include "absl/strings/str_cat.h"
#include "ferry/autograd/grad_mode.h"
#include "ferry/autograd/node.h"
#include "ferry/autograd/ops.h"
#include "ferry/tensor/value.h"
#include "ferry/tensor/wire.h"

namespace ferry::nn {

namespace ag = ::ferry::autograd;

Tensor Module::RegisterParameter(std::string name, Tensor t) {
  ag::SetRequiresGrad(t);
  params_.emplace_back(std::move(name), t);
  return t;
}

void Module::CollectNamed(
    const std::string& prefix,
    std::vector<std::pair<std::string, Tensor>>* out) const {
  for (const auto& [name, t] : params_) out->emplace_back(prefix + name, t);
  for (const auto& [name, m] : children_)
    m->CollectNamed(absl::StrCat(prefix, name, "."), out);
}

std::vector<std::pair<std::string, Tensor>> Module::named_parameters() const {
  std::vector<std::pair<std::string, Tensor>> out;
  CollectNamed("", &out);
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_parameters()) out.push_back(t);
  return out;
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [name, m] : children_) m->train(on);
}

absl::Status Module::to(Device device, cuda::DeviceOps* ops) {
  bool moved = false;
  for (auto& [name, p] : params_) {
    if (p.device() == device) continue;
    cuda::DeviceOps* d = p.device().is_cuda() ? cuda::DeviceOpsOf(p) : ops;
    if (d == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Module::to: no compute backend to move parameter '", name, "' (",
          cuda::DescribeOperand(p), ") to ", device.ToString(),
          " (pass a CudaContext's compute())"));
    }
    absl::StatusOr<Tensor> moved_p = d->To(ag::Detach(p), device);
    if (!moved_p.ok()) {
      return absl::Status(moved_p.status().code(),
                          absl::StrCat("Module::to: parameter '", name, "': ",
                                       moved_p.status().message()));
    }
    // A copy on the same device would share storage with `p`; To copies.
    p = *std::move(moved_p);
    ag::SetRequiresGrad(p);
    moved = true;
  }
  if (moved) ParametersMoved();
  for (auto& [name, m] : children_) {
    if (absl::Status s = m->to(device, ops); !s.ok()) return s;
  }
  return absl::OkStatus();
}

const Tensor& Module::parameter(const std::string& name) const {
  for (const auto& [n, t] : params_)
    if (n == name) return t;
  TensorFail(absl::StrCat("Module::parameter: no parameter '", name, "'"));
}

void Module::ZeroGrad() {
  for (const Tensor& p : parameters()) ag::SetGrad(p, Tensor());
}

absl::StatusOr<std::string> Module::SaveStateDict() const {
  Value::Dict dict;
  for (auto& [name, t] : named_parameters())
    dict.emplace(name, Value::FromTensor(ag::Detach(t)));
  absl::StatusOr<EncodedValue> enc = EncodeValue(Value::FromDict(dict));
  if (!enc.ok()) return enc.status();
  return enc->Flatten();
}

absl::Status Module::LoadStateDict(absl::string_view bytes) {
  absl::StatusOr<Value> v = DecodeValue(bytes);
  if (!v.ok()) return v.status();
  const Value::Dict* dict = v->if_dict();
  if (dict == nullptr)
    return absl::InvalidArgumentError("state dict: not a dict");
  auto params = named_parameters();
  if (dict->size() != params.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("state dict: ", dict->size(), " entries for ",
                     params.size(), " parameters"));
  }
  // Validate everything before writing anything.
  std::vector<const Tensor*> sources;
  for (auto& [name, p] : params) {
    auto it = dict->find(name);
    const Tensor* src = it == dict->end() ? nullptr : it->second.if_tensor();
    if (src == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("state dict: no tensor for parameter '", name, "'"));
    }
    if (src->sizes() != p.sizes() || src->dtype() != p.dtype()) {
      return absl::InvalidArgumentError(
          absl::StrCat("state dict: '", name, "' is ", ag::ShapeString(*src),
                       " ", DTypeName(src->dtype()), ", parameter is ",
                       ag::ShapeString(p), " ", DTypeName(p.dtype())));
    }
    sources.push_back(src);
  }
  ag::NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i)
    params[i].second.copy_(*sources[i]);
  return absl::OkStatus();
}

namespace {

Tensor Uniform(const std::vector<int64_t>& shape, double bound, uint64_t seed,
               DType dtype) {
  return rand(shape, seed, dtype).mul(2 * bound).sub(bound);
}

}  // namespace

Linear::Linear(int64_t in_features, int64_t out_features, uint64_t seed,
               bool bias, DType dtype) {
  const double bound =
      in_features > 0 ? 1.0 / std::sqrt(static_cast<double>(in_features)) : 0;
  weight_ = RegisterParameter(
      "weight", Uniform({out_features, in_features}, bound, seed, dtype));
  if (bias) {
    bias_ = RegisterParameter("bias",
                              Uniform({out_features}, bound, seed + 1, dtype));
  }
}

void Linear::ParametersMoved() {
  weight_ = parameter("weight");
  if (bias_.defined()) bias_ = parameter("bias");
}

void Embedding::ParametersMoved() { weight_ = parameter("weight"); }

Tensor Linear::Forward(const Tensor& input) {
  Tensor y = ag::matmul(input, ag::transpose(weight_, 0, 1));
  return bias_.defined() ? ag::add(y, bias_) : y;
}

Embedding::Embedding(int64_t num_embeddings, int64_t dim, uint64_t seed,
                     DType dtype) {
  weight_ =
      RegisterParameter("weight", randn({num_embeddings, dim}, seed, dtype));
}

Tensor Embedding::Forward(const Tensor& indices) {
  return ag::embedding(weight_, indices);
}

Tensor ReLU::Forward(const Tensor& input) { return ag::relu(input); }
Tensor Tanh::Forward(const Tensor& input) { return ag::tanh(input); }

Tensor Dropout::Forward(const Tensor& input) {
  if (!is_training()) return input;
  return ag::dropout(input, p_, true, seed_ + calls_++);
}

Sequential::Sequential(std::vector<std::shared_ptr<Module>> modules) {
  for (auto& m : modules) Append(std::move(m));
}

void Sequential::Append(std::shared_ptr<Module> module) {
  RegisterModule(absl::StrCat(children().size()), std::move(module));
}

Tensor Sequential::Forward(const Tensor& input) {
  Tensor x = input;
  for (const auto& [name, m] : children()) x = m->Forward(x);
  return x;
}

Tensor MSELoss::operator()(const Tensor& input, const Tensor& target) const {
  return ag::mse_loss(input, target);
}
Tensor CrossEntropyLoss::operator()(const Tensor& logits,
                                    const Tensor& target) const {
  return ag::cross_entropy(logits, target);
}
Tensor NLLLoss::operator()(const Tensor& log_probs,
                           const Tensor& target) const {
  return ag::nll_loss(log_probs, target);
}

}  // namespace ferry::nn
