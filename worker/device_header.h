// The device layer's typed header (issue #32): which payload tensors of a
// message were CUDA tensors staged through host memory, the sender's device
// of each, and, in a request, the receiver's device it lands on. rpc/
// carries it as the opaque bytes of layer header kDeviceHeaderLayer
// (proto/device_rpc.proto); worker/device_stage.h writes and reads it.
//
// A message whose tensors are all on the CPU carries no header, so CPU
// traffic and peers that never stage are unchanged. Decode trusts nothing:
// unparsable bytes, a position not below the message's tensor count or not
// strictly increasing, a negative device index or one over kMaxDeviceIndex,
// a request placement without a target or a reply placement with one are
// InvalidArgument naming the sender, the message and the field; it never
// crashes (//worker:device_header_fuzz). A returning request (gradients
// going back along a forward request) carries its placements as a reply
// does, without targets; `returning` on a reply is refused.
//
// Thread safety: reentrant functions. Design: docs/design/cuda_rpc.md.
#ifndef FERRY_WORKER_DEVICE_HEADER_H_
#define FERRY_WORKER_DEVICE_HEADER_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ferry {

/// The layer header id the device layer's header travels under.
inline constexpr uint32_t kDeviceHeaderLayer = 3;
/// Largest CUDA device index a header may name.
inline constexpr int kMaxDeviceIndex = 1023;

/// One staged tensor of a message.
struct DevicePlacement {
  uint32_t position = 0;  ///< Depth-first index among the payload's tensors.
  int source = 0;         ///< The sender's CUDA device index.
  /// The receiver's CUDA device index (requests); nullopt in replies.
  std::optional<int> target;
  friend bool operator==(const DevicePlacement&,
                         const DevicePlacement&) = default;
};

/// The header: the placements, by increasing position.
struct DeviceHeader {
  std::vector<DevicePlacement> placements;  ///< Strictly increasing position.
  /// A request whose tensors return to the worker they came from: no
  /// targets; the receiver applies the reverse of its own map.
  bool returning = false;
};

/// Claims the "device" layer and its header id (rpc/layer.h); idempotent.
absl::Status ClaimDeviceLayer();

/// The header's bytes (proto/device_rpc.proto).
std::string EncodeDeviceHeader(const DeviceHeader& header);

/// Parses and checks `bytes` of a message with `tensor_count` payload
/// tensors (see the top); `request` says which kind of message it rode on;
/// `what` ("worker 'b': the request CALL 'f' from 'a'") starts the errors.
absl::StatusOr<DeviceHeader> DecodeDeviceHeader(absl::string_view bytes,
                                                size_t tensor_count,
                                                bool request,
                                                absl::string_view what);

}  // namespace ferry

#endif  // FERRY_WORKER_DEVICE_HEADER_H_
