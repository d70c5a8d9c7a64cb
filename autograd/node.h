// The autograd graph: nodes, edges, per-tensor autograd state.
//
// Design. Autograd state lives ON the tensor (Tensor's opaque
// AutogradMetaInterface slot holds an AutogradMeta), so a Tensor carried in
// an RPC Value still knows whether it requires grad and where its gradient
// goes. A tensor produced by a differentiable op points at its `grad_fn`
// node; a node's `next_edges` point at the nodes of the op's inputs (the
// grad_fn of a non-leaf input, the AccumulateGrad node of a leaf that
// requires grad, or an invalid edge for an input that needs no gradient).
// Ownership runs from outputs toward leaves only: tensor -> grad_fn ->
// next nodes -> AccumulateGrad -> leaf tensor. A leaf's meta refers to its
// AccumulateGrad weakly, and saved tensors are stored without autograd
// state, so the graph has no cycles and dies with its last output.
//
// Extension: Node is an open base class. Layers above (distributed autograd
// send/recv nodes) subclass it; the engine only calls Apply/Release and the
// hook entry points below.
//
// Thread safety: a Node's hooks and a meta's grad/hooks are guarded by
// mutexes, so hooks may be registered and .grad read while another thread
// runs backward. Running two backward passes through the *same* function
// node at once is not supported (separate graphs may run concurrently);
// AccumulateGrad nodes are stateless, so graphs that share leaves (one
// model, several threads) may. Creating or
// setting a tensor's autograd state (SetRequiresGrad, results of ops) must
// happen before that tensor object is shared between threads.
#ifndef FERRY_AUTOGRAD_NODE_H_
#define FERRY_AUTOGRAD_NODE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "ferry/common/sync.h"
#include "ferry/tensor/tensor.h"

namespace ferry::autograd {

class Node;
class GraphTask;

// Where a gradient flows: input `input_nr` of `node`. Invalid (null node)
// for inputs that need no gradient.
struct Edge {
  std::shared_ptr<Node> node;  // Null: no gradient needed.
  int input_nr = 0;  // Which of node's inputs.
  bool valid() const { return node != nullptr; }  // node is set.
};

// The device stream a node's forward op ran on; the engine runs the node's
// backward there (docs/design/cuda_kernels.md, "Streams in backward").
struct NodeStream {
  // The backend of the op's result (a tensor/cuda DeviceOps); null when
  // none was recorded (a CPU op, or a node that is not a built-in op).
  std::shared_ptr<DeviceComputeInterface> compute;
  Device device;        // The result's device.
  uintptr_t stream = 0;  // The forward thread's current stream there.
};

// Called with a gradient; returns a replacement gradient, or an undefined
// tensor to keep it unchanged.
using GradHook = std::function<Tensor(const Tensor& grad)>;
// Called after a leaf's gradient was accumulated into its .grad.
using PostAccumulateHook = std::function<void(const Tensor& leaf)>;

// A backward function of the graph (see the top of this file); subclass it
// for new kinds of nodes.
class Node : public std::enable_shared_from_this<Node> {
 public:
  // `name` names the op in errors ("MulBackward"); `num_inputs` is how many
  // gradients the node receives (outputs of the forward op).
  Node(std::string name, int num_inputs);
  virtual ~Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  const std::string& name() const { return name_; }  // As constructed.
  int num_inputs() const { return num_inputs_; }  // As constructed.
  // Toward the inputs.
  const std::vector<Edge>& next_edges() const { return next_edges_; }
  // Sets next_edges() (while the graph is built).
  void set_next_edges(std::vector<Edge> edges) {
    next_edges_ = std::move(edges);
  }
  // Where the forward op ran (see NodeStream), or null (CPU ops); set
  // while the graph is built.
  const NodeStream* stream() const { return stream_.get(); }
  // See stream().
  void set_stream(NodeStream s) {
    stream_ = std::make_unique<const NodeStream>(std::move(s));
  }
  // Shapes of the forward inputs, for error messages: "[2, 3], [3]".
  std::string shapes() const;
  // Records the forward inputs' shapes (see shapes()).
  void set_input_shapes(const std::vector<std::vector<int64_t>>& shapes);
  // Appends one input's shape (ops record them without extra allocations).
  void AddInputShape(const std::vector<int64_t>& shape);

  // Gradients w.r.t. the forward inputs, one per next edge (undefined = no
  // gradient), given the gradients of the forward outputs (`grads` has
  // num_inputs() entries; undefined ones are zero). Errors end the pass.
  virtual absl::StatusOr<std::vector<Tensor>> Apply(
      GraphTask& task, std::vector<Tensor> grads) = 0;
  // Frees saved state after a pass without retain_graph; a later Apply must
  // fail with FailedPrecondition.
  virtual void Release() {}

  // Hooks on the gradient arriving at input `input_nr` (a non-leaf tensor's
  // hooks live on its grad_fn at its output number).
  void AddPreHook(int input_nr, GradHook hook);
  // Runs the hooks for `input_nr` in registration order.
  virtual Tensor RunPreHooks(int input_nr, Tensor grad);

 private:
  const std::string name_;
  const int num_inputs_;
  std::vector<Edge> next_edges_;
  std::unique_ptr<const NodeStream> stream_;  // Null for host ops.
  // Flattened: rank, then sizes, per input.
  std::vector<int64_t> input_shapes_;
  Mutex mu_;
  std::vector<std::pair<int, GradHook>> pre_hooks_ ABSL_GUARDED_BY(mu_);
};

// A tensor saved for backward: the elements (without autograd state, so no
// reference cycle) and the storage version at save time.
class SavedTensor {
 public:
  SavedTensor() = default;
  // Saves `t` now; `name` appears in errors.
  SavedTensor(const Tensor& t, std::string name);
  // The saved tensor, or FailedPrecondition naming `name` and `op` when it
  // was modified in place since it was saved.
  absl::StatusOr<Tensor> Unpack(const std::string& op) const;
  bool defined() const { return data_.defined(); }  // A tensor was saved.

 private:
  Tensor data_;
  uint64_t version_ = 0;
  std::string name_;
};

// A node whose backward is a function of the output gradient and saved
// tensors: what every built-in op uses. `needs[i]` tells the function
// whether input i wants a gradient (it may return undefined otherwise).
// Release() drops the function (and the saved tensors); Apply afterwards
// reports the freed graph.
class FunctionNode : public Node {
 public:
  // The backward: (output gradient, saved tensors, needs) -> input gradients.
  using Fn = std::function<absl::StatusOr<std::vector<Tensor>>(
      const Tensor& grad, const std::vector<Tensor>& saved,
      const std::vector<bool>& needs)>;
  // A node named `name` running `fn` over `saved`.
  FunctionNode(std::string name, std::vector<SavedTensor> saved, Fn fn);

  absl::StatusOr<std::vector<Tensor>> Apply(GraphTask& task,
                                            std::vector<Tensor> grads) override;
  void Release() override;

 private:
  std::vector<SavedTensor> saved_;
  Fn fn_;
  bool released_ = false;
};

// The node at a leaf that requires grad: hands the incoming gradient to the
// running GraphTask's sink (by default accumulated into the leaf's .grad).
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(Tensor variable);  // The node of leaf `variable`.
  const Tensor& variable() const { return variable_; }  // The leaf.
  absl::StatusOr<std::vector<Tensor>> Apply(GraphTask& task,
                                            std::vector<Tensor> grads) override;
  // The leaf tensor's own hooks (RegisterHook on a leaf).
  Tensor RunPreHooks(int input_nr, Tensor grad) override;

 private:
  Tensor variable_;
};

// Autograd state of one tensor object.
class AutogradMeta final : public AutogradMetaInterface {
 public:
  bool requires_grad = false;     // Set on leaves by SetRequiresGrad.
  std::shared_ptr<Node> grad_fn;  // Null for leaves.
  int output_nr = 0;  // Which output of grad_fn.

  Mutex mu;  // Guards the members below.
  Tensor grad ABSL_GUARDED_BY(mu);  // The accumulated gradient (.grad).
  // A leaf's node, held weakly.
  std::weak_ptr<AccumulateGrad> accumulator ABSL_GUARDED_BY(mu);
  std::vector<GradHook> hooks ABSL_GUARDED_BY(mu);  // Leaves only.
  // Leaves only.
  std::vector<PostAccumulateHook> post_hooks ABSL_GUARDED_BY(mu);
};

// --- Per-tensor autograd API ----------------------------------------------
// Whether gradients flow to `t` (a leaf that requires grad, or an op result
// recorded with a grad_fn).
bool RequiresGrad(const Tensor& t);
// requires_grad_: only on leaves (aborts on a non-leaf, or a non-floating
// dtype when `requires_grad` is true). Returns `t`.
const Tensor& SetRequiresGrad(const Tensor& t, bool requires_grad = true);
bool IsLeaf(const Tensor& t);  // No grad_fn (not made by a recorded op).
// The node that made `t`; null for leaves.
std::shared_ptr<Node> GradFn(const Tensor& t);
// The accumulated gradient (undefined until a backward reaches `t`).
Tensor GradOf(const Tensor& t);
// Replaces (or with an undefined tensor, clears) the accumulated gradient.
void SetGrad(const Tensor& t, Tensor grad);
// A new tensor object sharing `t`'s elements, without autograd state.
Tensor Detach(const Tensor& t);
// The edge a gradient for `t` flows along (invalid when it needs none).
Edge GradientEdge(const Tensor& t);
// Hooks on `t`'s gradient, run once per backward pass that reaches `t`,
// before accumulation or further propagation. Aborts unless RequiresGrad.
void RegisterHook(const Tensor& t, GradHook hook);
// Runs after the default sink accumulated into a leaf's .grad (DDP starts
// its bucket all-reduces here while backward continues). Leaves only.
void RegisterPostAccumulateHook(const Tensor& leaf, PostAccumulateHook hook);
// Adds `grad` into the leaf's .grad (a copy the first time) and runs its
// post-accumulate hooks. Thread-safe. Used by the default sink.
// Aborts (naming the devices) where TryAccumulateIntoGrad fails.
void AccumulateIntoGrad(const Tensor& leaf, const Tensor& grad);
// AccumulateIntoGrad with errors as Status: on a CUDA leaf the gradient
// must be on the same device with a compute backend (tensor/cuda/
// device_ops.h), and sums there; InvalidArgument naming both otherwise.
absl::Status TryAccumulateIntoGrad(const Tensor& leaf, const Tensor& grad);

// "[2, 3]".
std::string ShapeString(const Tensor& t);

}  // namespace ferry::autograd

#endif  // FERRY_AUTOGRAD_NODE_H_
