// The two graph nodes distributed autograd adds at worker boundaries.
//
// A tensor that requires grad and leaves a worker inside a distributed
// autograd context is recorded on the sender as a SendNode input (its next
// edge is the tensor's gradient edge); on the receiver the arriving copy gets
// a RecvNode as its grad_fn. The pair shares the message id of the message
// that carried the tensors. In a backward pass the receiver's RecvNode sends
// the gradients it collects to the sender, which runs its graph from the
// matching SendNode (autograd/dist/dist_autograd.h).
//
// Both nodes are driven by the distributed pass runner, never by the local
// engine: a local Backward() that reaches a RecvNode fails, since the
// gradient it would need belongs to another worker.
//
// Thread safety: immutable after construction (Node's hook lists excepted,
// which Node locks).
#ifndef FERRY_AUTOGRAD_DIST_NODES_H_
#define FERRY_AUTOGRAD_DIST_NODES_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ferry/autograd/node.h"
#include "ferry/common/ids.h"
#include "ferry/tensor/dtype.h"
#include "ferry/tensor/storage.h"
#include "ferry/tensor/tensor.h"

namespace ferry::autograd::dist {

// Shape, dtype and device of one tensor that crossed a worker boundary.
struct TensorSpec {
  std::vector<int64_t> sizes;  // The shape.
  DType dtype = DType::kFloat32;  // The element type.
  // Its device on this worker (where its gradient must be).
  Device device = Device::CPU();
  // A CUDA tensor's compute backend (makes a zero gradient there); null on
  // the CPU or when it has none.
  std::shared_ptr<DeviceComputeInterface> compute;
};

// Sender side: one input per sent tensor that required grad; passes the
// gradients it receives to those tensors' gradient edges unchanged, except
// a CPU gradient of a tensor sent from a CUDA device (staged to the peer's
// CPU), which it copies back onto that device first.
class SendNode final : public Node {
 public:
  // `edges[i]` is the gradient edge of the i-th recorded tensor.
  SendNode(int peer, GlobalId message_id, std::vector<Edge> edges,
           std::vector<TensorSpec> specs);

  int peer() const { return peer_; }  // The receiving worker's id.
  GlobalId message_id() const { return message_id_; }  // The message sent.
  // The sent tensors' shapes and dtypes.
  const std::vector<TensorSpec>& specs() const { return specs_; }

  absl::StatusOr<std::vector<Tensor>> Apply(GraphTask& task,
                                            std::vector<Tensor> grads) override;

 private:
  const int peer_;
  const GlobalId message_id_;
  const std::vector<TensorSpec> specs_;
};

// Receiver side: grad_fn of the tensors that arrived requiring grad (output
// i for the i-th of them). Has no next edges: its gradients leave the worker.
class RecvNode final : public Node {
 public:
  // Tensors received from `peer` in message `message_id`, as `specs`;
  // `from_request`: the message was a request (else a reply).
  RecvNode(int peer, std::string peer_name, GlobalId message_id,
           std::vector<TensorSpec> specs, bool from_request);

  int peer() const { return peer_; }  // The sending worker's id.
  // The sender's name.
  const std::string& peer_name() const { return peer_name_; }
  GlobalId message_id() const { return message_id_; }  // The message.
  // The received tensors' shapes and dtypes.
  const std::vector<TensorSpec>& specs() const { return specs_; }
  // Whether they came in a request (their gradients then return as a
  // reply's tensors would: kReturningEntry).
  bool from_request() const { return from_request_; }

  // Always FailedPrecondition: only the distributed runner may run it.
  absl::StatusOr<std::vector<Tensor>> Apply(GraphTask& task,
                                            std::vector<Tensor> grads) override;

 private:
  const int peer_;
  const std::string peer_name_;
  const GlobalId message_id_;
  const std::vector<TensorSpec> specs_;
  const bool from_request_;
};

}  // namespace ferry::autograd::dist

#endif  // FERRY_AUTOGRAD_DIST_NODES_H_
