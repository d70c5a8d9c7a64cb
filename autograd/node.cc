#include "ferry/autograd/node.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ferry/autograd/engine.h"
#include "ferry/common/status.h"
#include "ferry/tensor/cuda/device_ops.h"

namespace ferry::autograd {

std::string ShapeString(const Tensor& t) {
  if (!t.defined()) return "undefined";
  return absl::StrCat("[", absl::StrJoin(t.sizes(), ", "), "]");
}

Node::Node(std::string name, int num_inputs)
    : name_(std::move(name)), num_inputs_(num_inputs) {}

std::string Node::shapes() const {
  std::vector<std::string> parts;
  for (size_t i = 0; i < input_shapes_.size();) {
    const size_t rank = static_cast<size_t>(input_shapes_[i++]);
    parts.push_back(
        absl::StrCat("[",
                     absl::StrJoin(input_shapes_.begin() + i,
                                   input_shapes_.begin() + i + rank, ", "),
                     "]"));
    i += rank;
  }
  return absl::StrJoin(parts, ", ");
}

void Node::set_input_shapes(const std::vector<std::vector<int64_t>>& shapes) {
  input_shapes_.clear();
  for (const auto& s : shapes) AddInputShape(s);
}

void Node::AddInputShape(const std::vector<int64_t>& shape) {
  input_shapes_.push_back(static_cast<int64_t>(shape.size()));
  input_shapes_.insert(input_shapes_.end(), shape.begin(), shape.end());
}

void Node::AddPreHook(int input_nr, GradHook hook) {
  MutexLock l(&mu_);
  pre_hooks_.emplace_back(input_nr, std::move(hook));
}

Tensor Node::RunPreHooks(int input_nr, Tensor grad) {
  std::vector<GradHook> hooks;
  {
    MutexLock l(&mu_);
    for (const auto& [nr, h] : pre_hooks_)
      if (nr == input_nr) hooks.push_back(h);
  }
  for (const GradHook& h : hooks) {
    Tensor r = h(grad);
    if (r.defined()) grad = std::move(r);
  }
  return grad;
}

SavedTensor::SavedTensor(const Tensor& t, std::string name)
    : data_(Detach(t)), version_(t.version()), name_(std::move(name)) {}

absl::StatusOr<Tensor> SavedTensor::Unpack(const std::string& op) const {
  if (data_.version() != version_) {
    return absl::FailedPreconditionError(
        absl::StrCat("tensor '", name_, "' ", ShapeString(data_), " saved by ",
                     op, " was modified by an in-place operation (version ",
                     version_, " when saved, now ", data_.version(), ")"));
  }
  return data_;
}

FunctionNode::FunctionNode(std::string name, std::vector<SavedTensor> saved,
                           Fn fn)
    : Node(std::move(name), 1), saved_(std::move(saved)), fn_(std::move(fn)) {}

absl::StatusOr<std::vector<Tensor>> FunctionNode::Apply(
    GraphTask&, std::vector<Tensor> grads) {
  if (released_) {
    return absl::FailedPreconditionError(
        "backward through a graph that was already freed (its saved "
        "tensors were released after the previous backward; pass "
        "retain_graph=true to backward twice)");
  }
  if (!grads[0].defined()) return std::vector<Tensor>(next_edges().size());
  std::vector<Tensor> saved;
  saved.reserve(saved_.size());
  for (const SavedTensor& s : saved_) {
    if (!s.defined()) {
      saved.emplace_back();
      continue;
    }
    absl::StatusOr<Tensor> t = s.Unpack(name());
    if (!t.ok()) return t.status();
    saved.push_back(*std::move(t));
  }
  std::vector<bool> needs(next_edges().size());
  for (size_t i = 0; i < needs.size(); ++i) needs[i] = next_edges()[i].valid();
  return fn_(grads[0], saved, needs);
}

void FunctionNode::Release() {
  released_ = true;
  fn_ = nullptr;
  saved_.clear();
}

AccumulateGrad::AccumulateGrad(Tensor variable)
    : Node("AccumulateGrad", 1), variable_(std::move(variable)) {}

absl::StatusOr<std::vector<Tensor>> AccumulateGrad::Apply(
    GraphTask& task, std::vector<Tensor> grads) {
  if (grads[0].defined()) {
    absl::Status s = task.sink().Deliver(variable_, grads[0]);
    if (!s.ok()) return s;
  }
  return std::vector<Tensor>();
}

Tensor AccumulateGrad::RunPreHooks(int, Tensor grad) {
  auto* meta = static_cast<AutogradMeta*>(variable_.autograd_meta());
  std::vector<GradHook> hooks;
  {
    MutexLock l(&meta->mu);
    hooks = meta->hooks;
  }
  for (const GradHook& h : hooks) {
    Tensor r = h(grad);
    if (r.defined()) grad = std::move(r);
  }
  return grad;
}

namespace {

AutogradMeta* Meta(const Tensor& t) {
  return static_cast<AutogradMeta*>(t.autograd_meta());
}

// A device leaf's .grad (`slot`, under the meta's lock): the first
// gradient is adopted when nothing else can see it, else copied through the
// backend; later ones are added in place on the device.
absl::Status AccumulateOnDevice(const Tensor& leaf, Tensor& slot,
                                const Tensor& grad) {
  cuda::DeviceOps* d = cuda::DeviceOpsOf(grad);
  if (leaf.device() != grad.device() || d == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "backward: cannot accumulate gradient ", cuda::DescribeOperand(grad),
        " into leaf ", cuda::DescribeOperand(leaf),
        d == nullptr && grad.device().is_cuda()
            ? " (no compute backend for the device gradient)"
            : " (different devices)"));
  }
  if (slot.defined()) return d->AddInPlace(slot, grad);
  const bool sole = grad.use_count() == 1 && grad.storage().use_count() == 1 &&
                    grad.is_contiguous() && grad.autograd_meta() == nullptr;
  if (sole) {
    slot = grad;
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(slot, d->Unary(cuda::math::UnaryOp::kCopy, grad));
  return absl::OkStatus();
}

AutogradMeta* MetaOrCreate(const Tensor& t) {
  if (t.autograd_meta() == nullptr)
    t.set_autograd_meta(std::make_shared<AutogradMeta>());
  return Meta(t);
}

}  // namespace

bool RequiresGrad(const Tensor& t) {
  AutogradMeta* m = t.defined() ? Meta(t) : nullptr;
  return m != nullptr && (m->requires_grad || m->grad_fn != nullptr);
}

const Tensor& SetRequiresGrad(const Tensor& t, bool requires_grad) {
  t.CheckDefined("SetRequiresGrad");
  if (!IsLeaf(t))
    TensorFail("SetRequiresGrad: only leaf tensors (no grad_fn) may be set");
  if (requires_grad && !IsFloatingPoint(t.dtype())) {
    TensorFail(
        absl::StrCat("SetRequiresGrad: only floating tensors can "
                     "require grad, got ",
                     DTypeName(t.dtype())));
  }
  MetaOrCreate(t)->requires_grad = requires_grad;
  return t;
}

bool IsLeaf(const Tensor& t) {
  AutogradMeta* m = Meta(t);
  return m == nullptr || m->grad_fn == nullptr;
}

std::shared_ptr<Node> GradFn(const Tensor& t) {
  AutogradMeta* m = t.defined() ? Meta(t) : nullptr;
  return m ? m->grad_fn : nullptr;
}

Tensor GradOf(const Tensor& t) {
  AutogradMeta* m = t.defined() ? Meta(t) : nullptr;
  if (m == nullptr) return Tensor();
  MutexLock l(&m->mu);
  return m->grad;
}

void SetGrad(const Tensor& t, Tensor grad) {
  AutogradMeta* m = MetaOrCreate(t);
  MutexLock l(&m->mu);
  m->grad = std::move(grad);
}

Tensor Detach(const Tensor& t) {
  if (!t.defined()) return t;
  return *Tensor::FromStorage(t.storage(), t.dtype(), t.sizes(), t.strides(),
                              t.storage_offset());
}

Edge GradientEdge(const Tensor& t) {
  AutogradMeta* m = t.defined() ? Meta(t) : nullptr;
  if (m == nullptr) return Edge{};
  if (m->grad_fn != nullptr) return Edge{m->grad_fn, m->output_nr};
  if (!m->requires_grad) return Edge{};
  MutexLock l(&m->mu);
  std::shared_ptr<AccumulateGrad> acc = m->accumulator.lock();
  if (acc == nullptr) {
    acc = std::make_shared<AccumulateGrad>(t);
    m->accumulator = acc;
  }
  return Edge{acc, 0};
}

void RegisterHook(const Tensor& t, GradHook hook) {
  if (!RequiresGrad(t))
    TensorFail("RegisterHook: tensor does not require grad");
  AutogradMeta* m = Meta(t);
  if (m->grad_fn != nullptr) {
    m->grad_fn->AddPreHook(m->output_nr, std::move(hook));
    return;
  }
  MutexLock l(&m->mu);
  m->hooks.push_back(std::move(hook));
}

void RegisterPostAccumulateHook(const Tensor& leaf, PostAccumulateHook hook) {
  if (!RequiresGrad(leaf) || !IsLeaf(leaf)) {
    TensorFail(
        "RegisterPostAccumulateHook: expected a leaf that requires grad");
  }
  AutogradMeta* m = Meta(leaf);
  MutexLock l(&m->mu);
  m->post_hooks.push_back(std::move(hook));
}

void AccumulateIntoGrad(const Tensor& leaf, const Tensor& grad) {
  absl::Status s = TryAccumulateIntoGrad(leaf, grad);
  if (!s.ok()) TensorFail(std::string(s.message()));
}

absl::Status TryAccumulateIntoGrad(const Tensor& leaf, const Tensor& grad) {
  AutogradMeta* m = MetaOrCreate(leaf);
  std::vector<PostAccumulateHook> hooks;
  {
    MutexLock l(&m->mu);
    if (leaf.device().is_cuda() || grad.device().is_cuda()) {
      RETURN_IF_ERROR(AccumulateOnDevice(leaf, m->grad, grad));
    } else if (!m->grad.defined()) {
      // Adopt the buffer when no other handle or view can see it (the
      // engine passes its only reference); copy otherwise, since one
      // gradient tensor may flow to several inputs.
      const bool sole = grad.use_count() == 1 &&
                        grad.storage().use_count() == 1 &&
                        grad.is_contiguous() && grad.autograd_meta() == nullptr;
      m->grad = sole ? grad : grad.clone();
    } else {
      m->grad.add_(grad);
    }
    hooks = m->post_hooks;
  }
  for (const PostAccumulateHook& h : hooks) h(leaf);
  return absl::OkStatus();
}

}  // namespace ferry::autograd
