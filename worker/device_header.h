// The device layer's typed header (issue #32): which payload tensors of a
// message were CUDA tensors staged through host memory, the sender's device
// of each, and, in a request, the receiver's device it lands on. rpc/
// carries it as the opaque bytes of layer header kDeviceHeaderLayer
// (proto/device_rpc.proto); worker/device_stage.h writes and reads it.
//
// A placement may instead carry an IPC tensor (same-host peers): the
// sender's allocation handle, offset, size and shape, and
// an event index; a reply may acknowledge such a request (ipc_ack), and a
// request may say its replies may come by IPC (ipc_replies) and acknowledge
// replies that did (reply_acks).
// A message whose tensors are all on the CPU carries no header, so CPU
// traffic and peers that never stage are unchanged. Decode trusts nothing:
// unparsable bytes, a position not below the message's tensor count or not
// strictly increasing, a negative device index or one over kMaxDeviceIndex,
// a request placement without a target or a reply placement with one, a
// handle not of kIpcHandleBytes, a bad shape, an offset or size outside the allocation, an event index without
// an event, an IPC acknowledgement on a request, `returning`,
// `ipc_replies` or reply acknowledgements on a reply, more than
// kMaxReplyAcks acknowledgements are InvalidArgument naming the sender, the message
// and the field; it never crashes (//worker:device_header_fuzz). A
// returning request (gradients going back along a forward request) carries
// its placements as a reply does, without targets.
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
/// Bytes of an IPC memory or event handle (tensor/cuda/device_ipc.h).
inline constexpr size_t kIpcHandleSize = 64;
/// Most dimensions of an IPC tensor (tensor/tensor.h's kMaxTensorDims).
inline constexpr int kMaxIpcDims = 64;
/// Largest allocation an IPC tensor may name (1 TiB).
inline constexpr uint64_t kMaxIpcAllocation = uint64_t{1} << 40;

/// A CUDA tensor that stays in the sender's memory (the IPC path).
struct IpcTensor {
  std::string memory_handle;      ///< kIpcHandleSize bytes.
  uint64_t offset = 0;            ///< Its first byte in the allocation.
  uint64_t allocation_bytes = 0;  ///< The allocation's size.
  std::vector<int64_t> sizes;     ///< Its shape (contiguous).
  uint32_t event = 0;             ///< Index into DeviceHeader::events.
  friend bool operator==(const IpcTensor&, const IpcTensor&) = default;
};

/// One staged tensor of a message.
struct DevicePlacement {
  uint32_t position = 0;  ///< Depth-first index among the payload's tensors.
  int source = 0;         ///< The sender's CUDA device index.
  /// The receiver's CUDA device index (requests); nullopt in replies.
  std::optional<int> target;
  /// Set when the tensor travels by IPC (same-host peers).
  std::optional<IpcTensor> ipc = std::nullopt;
  friend bool operator==(const DevicePlacement&,
                         const DevicePlacement&) = default;
};

/// The header: the placements, by increasing position.
struct DeviceHeader {
  std::vector<DevicePlacement> placements;  ///< Strictly increasing position.
  /// A request whose tensors return to the worker they came from: no
  /// targets; the receiver applies the reverse of its own map.
  bool returning = false;
  /// Interprocess event handles the IPC placements index.
  std::vector<std::string> events = {};
  /// A reply's: the request whose IPC tensors were copied (a GlobalId).
  std::optional<uint64_t> ipc_ack = std::nullopt;
  /// A request's: the caller can open the callee's IPC handles, so the
  /// reply's tensors may come by IPC.
  bool ipc_replies = false;
  /// A request's: replies (by their request's id) whose IPC tensors the
  /// caller copied; at most kMaxReplyAcks.
  std::vector<uint64_t> reply_acks = {};
  /// A reply's with IPC placements: the id the caller acknowledges.
  std::optional<uint64_t> ipc_reply = std::nullopt;
};

/// Most reply acknowledgements one request may carry.
inline constexpr size_t kMaxReplyAcks = 4096;

/// The message type of DEVICE_IPC_ACK: an empty request whose header
/// carries reply acknowledgements no other request took in time.
inline constexpr uint32_t kDeviceIpcAckType = 50;

/// Claims the "device" layer, its header id and DEVICE_IPC_ACK
/// (rpc/layer.h); idempotent.
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
