#include "ferry/autograd/engine.h"

#include <algorithm>
#include <deque>
#include <optional>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "ferry/autograd/grad_mode.h"
#include "ferry/common/status.h"
#include "ferry/tensor/cuda/device_ops.h"

namespace ferry::autograd {

absl::Status AccumulateSink::Deliver(const Tensor& leaf, const Tensor& grad) {
  return TryAccumulateIntoGrad(leaf, grad);
}

void GraphTask::Capture(const Edge& edge, int slot) {
  captures_.emplace_back(edge, slot);
  if (slot >= static_cast<int>(captured_.size())) captured_.resize(slot + 1);
}

namespace {

// Sums `grad` into `slot`. The first arrival is kept as is (it may be
// shared); a sum the engine made itself, seen by no one else, is updated
// in place to save an allocation per arriving gradient.
absl::Status AddInto(Tensor& slot, const Tensor& grad) {
  if (!grad.defined()) return absl::OkStatus();
  if (slot.defined() &&
      (slot.device().is_cuda() || grad.device().is_cuda())) {
    // Device gradients sum through the backend of the slot's storage.
    cuda::DeviceOps* d = cuda::DeviceOpsOf(slot);
    if (d == nullptr || slot.device() != grad.device()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "backward: cannot sum gradients ", cuda::DescribeOperand(slot),
          " and ", cuda::DescribeOperand(grad),
          d == nullptr ? " (no compute backend for the device tensor)"
                       : " (different devices)"));
    }
    if (slot.use_count() == 1 && slot.storage().use_count() == 1 &&
        slot.is_contiguous() && !grad.storage().is_same(slot.storage())) {
      return d->AddInPlace(slot, grad);
    }
    absl::StatusOr<Tensor> sum = d->Binary(cuda::math::BinaryOp::kAdd, slot,
                                           grad);
    if (!sum.ok()) return sum.status();
    slot = *std::move(sum);
    return absl::OkStatus();
  }
  if (!slot.defined()) {
    slot = grad;
  } else if (slot.use_count() == 1 && slot.storage().use_count() == 1 &&
             slot.is_contiguous() && !grad.storage().is_same(slot.storage())) {
    slot.add_(grad);
  } else {
    slot = slot.add(grad);
  }
  return absl::OkStatus();
}

absl::Status WithNode(const absl::Status& s, const Node& node) {
  return absl::Status(s.code(),
                      absl::StrCat("backward of ", node.name(), " (inputs ",
                                   node.shapes(), "): ", s.message()));
}

// A stream of a device through its backend; `ops` null: no stream (host
// work, or a device op whose stream was not recorded).
struct StreamRef {
  cuda::DeviceOps* ops = nullptr;
  Device device;
  uintptr_t stream = 0;
  friend bool operator==(const StreamRef& a, const StreamRef& b) {
    return a.ops == b.ops && a.device == b.device && a.stream == b.stream;
  }
};

StreamRef RefOf(const NodeStream* s) {
  if (s == nullptr) return {};
  auto* ops = dynamic_cast<cuda::DeviceOps*>(s->compute.get());
  if (ops == nullptr) return {};
  return {ops, s->device, s->stream};
}

// The calling thread's current stream of `grad`'s device (a root gradient
// was made there); none for a host gradient.
absl::StatusOr<StreamRef> CallerRef(const Tensor& grad) {
  cuda::DeviceOps* d = cuda::DeviceOpsOf(grad);
  if (d == nullptr) return StreamRef{};
  absl::StatusOr<uintptr_t> stream = d->CurrentStream(grad.device());
  if (!stream.ok()) return stream.status();
  return StreamRef{d, grad.device(), *stream};
}

// Makes `ref` the calling thread's stream of its device while it lives
// (nothing for a host ref).
class StreamScope {
 public:
  explicit StreamScope(const StreamRef& ref) {
    if (ref.ops != nullptr) guard_.emplace(ref.ops, ref.device, ref.stream);
  }
  // Why the stream could not be set.
  absl::Status status() const {
    return guard_.has_value() ? guard_->status() : absl::OkStatus();
  }

 private:
  std::optional<cuda::ThreadStreamGuard> guard_;
};

// Device-side: `waiter`'s later work waits for `producer`'s work so far.
// Only streams of one backend and device are ordered here: a gradient
// reaches another device or backend through a To(), which waits for its
// copy on the host.
absl::Status Order(const StreamRef& waiter, const StreamRef& producer) {
  if (waiter.ops == nullptr || producer.ops != waiter.ops ||
      producer.device != waiter.device || producer.stream == waiter.stream) {
    return absl::OkStatus();
  }
  return waiter.ops->StreamWaitStream(waiter.device, waiter.stream,
                                      producer.stream);
}

// Per-node bookkeeping of one pass.
struct NodeState {
  int dependencies = 0;         // Edges from nodes that have not run yet.
  std::vector<Tensor> inputs;   // Gradients arrived so far (summed).
  std::shared_ptr<Node> owner;  // Keeps the node alive while pending.
  // Where the node runs: its forward's stream, else that of the first
  // device gradient to arrive.
  StreamRef stream;
};
using NodeMap = std::unordered_map<Node*, NodeState>;

// Counts, for each node reachable from `roots`, the edges into it.
NodeMap CountDependencies(const std::vector<std::pair<Edge, Tensor>>& roots) {
  NodeMap nodes;
  std::vector<Node*> stack;
  for (const auto& [edge, g] : roots) {
    if (nodes.try_emplace(edge.node.get()).second)
      stack.push_back(edge.node.get());
  }
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const Edge& e : n->next_edges()) {
      if (!e.valid()) continue;
      auto [it, fresh] = nodes.try_emplace(e.node.get());
      ++it->second.dependencies;
      if (fresh) stack.push_back(e.node.get());
    }
  }
  return nodes;
}

// Adds `grad`, made on `producer`, into `edge`'s input slot, recording the
// owner. The node's stream first waits for the producer's (so the sum and
// the node read a finished gradient), and the sum is queued on it.
absl::StatusOr<NodeState*> Deposit(NodeMap& nodes, const Edge& edge,
                                   const Tensor& grad,
                                   const StreamRef& producer) {
  NodeState& st = nodes[edge.node.get()];
  if (st.inputs.empty()) st.inputs.resize(edge.node->num_inputs());
  if (st.owner == nullptr) {
    st.owner = edge.node;
    st.stream = RefOf(edge.node->stream());
  }
  absl::Status s;
  if (st.stream.ops == nullptr && producer.ops == nullptr) {
    s = AddInto(st.inputs[edge.input_nr], grad);  // Host work: no stream.
  } else {
    if (st.stream.ops == nullptr) st.stream = producer;
    s = Order(st.stream, producer);
    if (s.ok()) {
      StreamScope scope(st.stream);
      s = scope.status().ok() ? AddInto(st.inputs[edge.input_nr], grad)
                              : scope.status();
    }
  }
  if (!s.ok()) return WithNode(s, *edge.node);
  return &st;
}

}  // namespace

absl::Status GraphTask::Execute(
    const std::vector<std::pair<Edge, Tensor>>& roots) {
  // Backward math records no graph (no double backward).
  NoGradGuard no_grad;
  NodeMap nodes = CountDependencies(roots);
  std::deque<Node*> ready;
  // Device streams the pass queued work on; the caller's streams wait for
  // them at the end, so .grad is ready for work the caller queues next.
  std::vector<StreamRef> used;
  for (const auto& [edge, grad] : roots) {
    const bool first = nodes[edge.node.get()].owner == nullptr;
    absl::StatusOr<StreamRef> caller = CallerRef(grad);
    if (!caller.ok()) return caller.status();
    absl::StatusOr<NodeState*> st = Deposit(nodes, edge, grad, *caller);
    if (!st.ok()) return st.status();
    if (first && (*st)->dependencies == 0) ready.push_back(edge.node.get());
  }
  while (!ready.empty()) {
    Node* node = ready.front();
    ready.pop_front();
    NodeState& st = nodes[node];
    std::shared_ptr<Node> keep = std::move(st.owner);
    std::vector<Tensor> inputs = std::move(st.inputs);
    const StreamRef stream = st.stream;
    inputs.resize(node->num_inputs());
    // Hooks and the node's math, on the node's stream when it has one.
    auto run = [&]() -> absl::StatusOr<std::vector<Tensor>> {
      for (int i = 0; i < static_cast<int>(inputs.size()); ++i) {
        if (inputs[i].defined()) inputs[i] = node->RunPreHooks(i, inputs[i]);
        for (const auto& [edge, slot] : captures_) {
          if (edge.node.get() == node && edge.input_nr == i) {
            RETURN_IF_ERROR(AddInto(captured_[slot], inputs[i]));
          }
        }
      }
      return node->Apply(*this, std::move(inputs));
    };
    absl::StatusOr<std::vector<Tensor>> outs =
        [&]() -> absl::StatusOr<std::vector<Tensor>> {
      if (stream.ops == nullptr) return run();
      StreamScope scope(stream);
      if (!scope.status().ok()) return scope.status();
      if (std::find(used.begin(), used.end(), stream) == used.end()) {
        used.push_back(stream);
      }
      return run();
    }();
    if (!outs.ok()) return WithNode(outs.status(), *node);
    if (!retain_graph_) node->Release();
    const std::vector<Edge>& edges = node->next_edges();
    if (outs->size() != edges.size()) {
      return WithNode(absl::InternalError(absl::StrCat(
                          "returned ", outs->size(), " gradients for ",
                          edges.size(), " inputs")),
                      *node);
    }
    for (size_t j = 0; j < edges.size(); ++j) {
      if (!edges[j].valid()) continue;
      absl::StatusOr<NodeState*> next =
          Deposit(nodes, edges[j], (*outs)[j], stream);
      if (!next.ok()) return next.status();
      if (--(*next)->dependencies == 0) ready.push_back(edges[j].node.get());
    }
  }
  for (const StreamRef& s : used) {
    absl::StatusOr<uintptr_t> caller = s.ops->CurrentStream(s.device);
    if (!caller.ok()) return caller.status();
    RETURN_IF_ERROR(Order({s.ops, s.device, *caller}, s));
  }
  return absl::OkStatus();
}

namespace {

absl::StatusOr<std::vector<std::pair<Edge, Tensor>>> RootEdges(
    const std::vector<Tensor>& roots, const std::vector<Tensor>& grads) {
  if (grads.size() > roots.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "backward: ", grads.size(), " gradients for ", roots.size(), " roots"));
  }
  std::vector<std::pair<Edge, Tensor>> out;
  for (size_t i = 0; i < roots.size(); ++i) {
    const Tensor& r = roots[i];
    Edge e = GradientEdge(r);
    if (!e.valid()) {
      return absl::InvalidArgumentError(
          absl::StrCat("backward: root ", i, " ", ShapeString(r),
                       " does not require grad and has no grad_fn"));
    }
    Tensor g = i < grads.size() ? grads[i] : Tensor();
    if (!g.defined()) {
      if (r.numel() != 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            "backward: a gradient is needed for root ", i, " of shape ",
            ShapeString(r), " (implicit ones only for one element)"));
      }
      if (r.device().is_cuda()) {
        // The implicit 1 on the root's device, through its backend.
        cuda::DeviceOps* d = cuda::DeviceOpsOf(r);
        if (d == nullptr) {
          return absl::InvalidArgumentError(absl::StrCat(
              "backward: root ", i, " ", cuda::DescribeOperand(r),
              " has no compute backend"));
        }
        absl::StatusOr<Tensor> one = d->Empty(r.sizes(), r.dtype(), r.device());
        if (!one.ok()) return one.status();
        if (absl::Status s = d->Fill(*one, 1); !s.ok()) return s;
        g = *std::move(one);
      } else {
        g = ones_like(r);
      }
    } else if (g.sizes() != r.sizes() || g.dtype() != r.dtype() ||
               g.device() != r.device()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "backward: gradient ", ShapeString(g), " ", DTypeName(g.dtype()),
          " on ", g.device().ToString(), " for root ", i, " ", ShapeString(r),
          " ", DTypeName(r.dtype()), " on ", r.device().ToString()));
    }
    out.emplace_back(std::move(e), std::move(g));
  }
  return out;
}

// Drops leaf gradients (Grad() must not touch .grad).
class DiscardSink final : public GradientSink {
 public:
  absl::Status Deliver(const Tensor&, const Tensor&) override {
    return absl::OkStatus();
  }
};

}  // namespace

absl::Status Backward(const std::vector<Tensor>& roots,
                      const std::vector<Tensor>& grad_outputs,
                      bool retain_graph) {
  absl::StatusOr<std::vector<std::pair<Edge, Tensor>>> edges =
      RootEdges(roots, grad_outputs);
  if (!edges.ok()) return edges.status();
  AccumulateSink sink;
  GraphTask task(&sink, retain_graph);
  return task.Execute(*edges);
}

absl::StatusOr<std::vector<Tensor>> Grad(
    const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
    const std::vector<Tensor>& grad_outputs, bool retain_graph) {
  absl::StatusOr<std::vector<std::pair<Edge, Tensor>>> edges =
      RootEdges(outputs, grad_outputs);
  if (!edges.ok()) return edges.status();
  DiscardSink sink;
  GraphTask task(&sink, retain_graph);
  for (size_t i = 0; i < inputs.size(); ++i) {
    Edge e = GradientEdge(inputs[i]);
    if (!e.valid()) {
      return absl::InvalidArgumentError(absl::StrCat("grad: input ", i, " ",
                                                     ShapeString(inputs[i]),
                                                     " does not require grad"));
    }
    task.Capture(e, static_cast<int>(i));
  }
  absl::Status s = task.Execute(*edges);
  if (!s.ok()) return s;
  std::vector<Tensor> out = task.captured();
  out.resize(inputs.size());
  return out;
}

}  // namespace ferry::autograd
