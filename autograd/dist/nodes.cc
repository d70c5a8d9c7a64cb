#include "ferry/autograd/dist/nodes.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "ferry/tensor/cuda/device_ops.h"

namespace ferry::autograd::dist {

namespace {

std::vector<std::vector<int64_t>> Shapes(const std::vector<TensorSpec>& specs) {
  std::vector<std::vector<int64_t>> out;
  out.reserve(specs.size());
  for (const TensorSpec& s : specs) out.push_back(s.sizes);
  return out;
}

}  // namespace

SendNode::SendNode(int peer, GlobalId message_id, std::vector<Edge> edges,
                   std::vector<TensorSpec> specs)
    : Node("SendRpcBackward", static_cast<int>(edges.size())),
      peer_(peer),
      message_id_(message_id),
      specs_(std::move(specs)) {
  set_input_shapes(Shapes(specs_));
  set_next_edges(std::move(edges));
}

absl::StatusOr<std::vector<Tensor>> SendNode::Apply(GraphTask&,
                                                    std::vector<Tensor> grads) {
  for (size_t i = 0; i < grads.size() && i < specs_.size(); ++i) {
    const TensorSpec& spec = specs_[i];
    if (!grads[i].defined() || grads[i].device() == spec.device) continue;
    // A CPU gradient of a tensor that left from a device (staged to the
    // peer's CPU): back onto that device, through the backend it had.
    auto* d = dynamic_cast<cuda::DeviceOps*>(spec.compute.get());
    if (d == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "gradient ", i, " of message ", message_id_.ToString(), " is on ",
          grads[i].device().ToString(), " but its tensor was sent from ",
          spec.device.ToString(), ", which has no compute backend here"));
    }
    absl::StatusOr<Tensor> moved = d->To(grads[i], spec.device);
    if (!moved.ok()) return moved.status();
    grads[i] = *std::move(moved);
  }
  return grads;
}

RecvNode::RecvNode(int peer, std::string peer_name, GlobalId message_id,
                   std::vector<TensorSpec> specs, bool from_request)
    : Node("RecvRpcBackward", static_cast<int>(specs.size())),
      peer_(peer),
      peer_name_(std::move(peer_name)),
      message_id_(message_id),
      specs_(std::move(specs)),
      from_request_(from_request) {
  set_input_shapes(Shapes(specs_));
}

absl::StatusOr<std::vector<Tensor>> RecvNode::Apply(GraphTask&,
                                                    std::vector<Tensor>) {
  return absl::FailedPreconditionError(absl::StrCat(
      "a local backward reached tensors received from worker '", peer_name_,
      "' (message ", message_id_.ToString(),
      "); use dist::DistAutogradContainer::Backward in their context"));
}

}  // namespace ferry::autograd::dist
