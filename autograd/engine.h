// The reverse-mode engine.
//
// A GraphTask is one backward pass: it starts from arbitrary (node, input)
// edges with given gradients, counts each reachable node's dependencies,
// runs a node once all of its input gradients have arrived (summing those
// that meet), and hands every leaf gradient to a GradientSink. The default
// sink accumulates into the leaves' .grad; distributed autograd passes its
// own to accumulate per context. Backward() and Grad() are the local
// front ends.
//
// Threads: a pass runs on the calling thread. Passes over different graphs
// may run concurrently from different threads (state is per GraphTask; leaf
// .grad updates are locked). Errors from a node end the pass with the
// node's name and input shapes prefixed; gradients already delivered to
// sinks stay delivered.
#ifndef FERRY_AUTOGRAD_ENGINE_H_
#define FERRY_AUTOGRAD_ENGINE_H_

#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ferry/autograd/node.h"
#include "ferry/tensor/tensor.h"

namespace ferry::autograd {

// Receives the gradient arriving at a leaf's AccumulateGrad node (after the
// leaf's hooks ran). Called on the pass's thread.
class GradientSink {
 public:
  virtual ~GradientSink() = default;
  // Takes `grad` for `leaf`; an error ends the pass.
  virtual absl::Status Deliver(const Tensor& leaf, const Tensor& grad) = 0;
};

// Accumulates into .grad and runs post-accumulate hooks.
class AccumulateSink final : public GradientSink {
 public:
  // AccumulateIntoGrad (node.h).
  absl::Status Deliver(const Tensor& leaf, const Tensor& grad) override;
};

// One backward pass: where leaf gradients go and what it captures.
class GraphTask {
 public:
  // `sink` must outlive Execute. With `retain_graph` false every executed
  // node is released, so a second pass over it fails.
  GraphTask(GradientSink* sink, bool retain_graph)
      : sink_(sink), retain_graph_(retain_graph) {}

  GradientSink& sink() { return *sink_; }  // As constructed.
  bool retain_graph() const { return retain_graph_; }  // As constructed.

  // Records the gradient arriving at `edge` (after hooks) into captured()
  // slot `slot` instead of requiring it to reach a leaf; used by Grad().
  void Capture(const Edge& edge, int slot);
  const std::vector<Tensor>& captured() const { return captured_; }  // By slot.

  // Runs the pass from `roots`: each edge receives its gradient (summed
  // when an edge appears twice). Call once per GraphTask.
  absl::Status Execute(const std::vector<std::pair<Edge, Tensor>>& roots);

 private:
  GradientSink* sink_;
  bool retain_graph_;
  std::vector<std::pair<Edge, int>> captures_;
  std::vector<Tensor> captured_;
};

// Gradients of `roots` (grad_outputs[i] for roots[i]; an undefined or
// missing entry means ones, allowed only for one-element roots) accumulated
// into every reachable leaf's .grad. InvalidArgument when a root does not
// require grad or a gradient's shape differs.
absl::Status Backward(const std::vector<Tensor>& roots,
                      const std::vector<Tensor>& grad_outputs = {},
                      bool retain_graph = false);
// Gradients of `outputs` w.r.t. `inputs`, leaving .grad untouched. An input
// the outputs do not depend on gets an undefined tensor.
absl::StatusOr<std::vector<Tensor>> Grad(
    const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
    const std::vector<Tensor>& grad_outputs = {}, bool retain_graph = false);

}  // namespace ferry::autograd

#endif  // FERRY_AUTOGRAD_ENGINE_H_
