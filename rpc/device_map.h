// DeviceMaps: where a worker's tensors land on each peer (CUDA tensors over
// RPC, issue #32), in the manner of PyTorch's `set_device_map`.
//
// For each peer, a map from this worker's devices to the peer's
// (`{"trainer1": {cuda:0 -> cuda:1}}`). A CPU tensor always lands on the
// peer's CPU. A CUDA tensor whose device has no entry for the peer is an
// error naming this worker, the peer, the tensor's position in the message
// and the device, unless staging to CPU is allowed (then it lands on the
// peer's CPU). Replies use the reverse of the caller's map: a tensor the
// peer returns from its device D lands where D was mapped from.
//
// Validate, at worker start, checks every map against the devices this
// worker uses: each source is one of them, no target is CPU paired with a
// CUDA source or the other way round, and no two sources map to one target
// (1:1, so the reverse map exists). CheckPeerDevices checks the targets
// against the devices a peer announced (an index the peer does not have).
//
// Who consults them: worker/device_stage.h, on every message: Target when a
// request leaves, ReplyTarget when a reply arrives (the caller's map governs
// both directions); see docs/design/cuda_rpc.md.
//
// Thread safety: a const DeviceMaps is safe to share; mutation (Set) is not
// synchronized: build it before the worker starts.
#ifndef FERRY_RPC_DEVICE_MAP_H_
#define FERRY_RPC_DEVICE_MAP_H_

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ferry/tensor/storage.h"

namespace ferry::rpc {

// "cpu" or "cuda:N" (N >= 0; "cuda" alone is cuda:0). InvalidArgument
// naming the text otherwise.
absl::StatusOr<Device> ParseDevice(absl::string_view text);

// One worker's device maps, per peer name.
class DeviceMaps {
 public:
  // Maps this worker's `from` to `to` on `peer`. InvalidArgument naming the
  // peer and both devices when `from` already has another target there, or
  // for a CPU/CUDA mix (a CPU tensor always goes to CPU).
  absl::Status Set(const std::string& peer, Device from, Device to);
  // Set from text: ("trainer1", "cuda:0", "cuda:1").
  absl::Status Set(const std::string& peer, absl::string_view from,
                   absl::string_view to);

  // Allow a CUDA tensor without a mapping to travel to the peer's CPU.
  void set_stage_unmapped_to_cpu(bool stage) { stage_to_cpu_ = stage; }
  bool stage_unmapped_to_cpu() const { return stage_to_cpu_; }  ///< Set?

  // Checks the maps of worker `me` against `devices`, the CUDA devices it
  // uses: every source is one of them and each peer's map is 1:1.
  // InvalidArgument naming the worker, the peer and the device.
  absl::Status Validate(const std::string& me,
                        const std::vector<Device>& devices) const;

  // Checks `peer`'s targets against the CUDA devices it announced.
  // FailedPrecondition naming both workers and the device it lacks.
  absl::Status CheckPeerDevices(const std::string& me, const std::string& peer,
                                const std::vector<Device>& peer_devices) const;

  // Where a tensor of worker `me` on `device`, at `position` in a message to
  // `peer`, lands there. InvalidArgument (see the top) when unmapped.
  absl::StatusOr<Device> Target(const std::string& me, const std::string& peer,
                                Device device, int position) const;

  // Where a tensor `peer` sends back from its `device` (a reply) lands
  // here: the reverse of this worker's map to `peer`. Unmapped devices
  // follow Target's rule, with the peer named as the sender.
  absl::StatusOr<Device> ReplyTarget(const std::string& me,
                                     const std::string& peer, Device device,
                                     int position) const;

  // The peers this worker has a map to, sorted.
  std::vector<std::string> peers() const;

  // This worker's map to `peer` (empty when none), source -> target, as
  // "cuda:0" -> "cuda:1" text, sorted: for logs and the Admin service.
  std::vector<std::pair<std::string, std::string>> Describe(
      const std::string& peer) const;

 private:
  // Compares devices by (type, index) for the maps' order.
  struct Less {
    bool operator()(const Device& a, const Device& b) const;
  };
  using Map = std::map<Device, Device, Less>;

  std::map<std::string, Map> maps_;  // Per peer.
  bool stage_to_cpu_ = false;
};

}  // namespace ferry::rpc

#endif  // FERRY_RPC_DEVICE_MAP_H_
