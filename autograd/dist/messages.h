// Distributed autograd's messages: the message types it claims from rpc/
// and its typed header, which rpc/ carries as opaque bytes
// (docs/design/layer_messages.md; the algorithm: docs/design/dist_autograd.md).
//
// The header holds the context a request travels in (the sender's current
// context, moved out of the thread-local kContextKey entry when a request
// leaves and back into the request's context when it arrives), the
// send/recv fields with the indices of the tensors that required grad, the
// background releases a request carries, and a BACKWARD's fused steps.
// Setting an empty header removes it; decoding refuses malformed bytes,
// unordered tensor indices and a release list without ids with
// InvalidArgument naming the message.
//
// Thread safety: stateless (the claim registry is rpc/'s, thread-safe).
#ifndef FERRY_AUTOGRAD_DIST_MESSAGES_H_
#define FERRY_AUTOGRAD_DIST_MESSAGES_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ferry/common/ids.h"
#include "ferry/rpc/message.h"

namespace ferry::autograd::dist {

// Wire numbers (unchanged from when rpc/ listed them).
// BACKWARD: run a context's backward pass from a recv node on the callee.
inline constexpr rpc::MessageType kBackward = static_cast<rpc::MessageType>(20);
// CLEANUP_AUTOGRAD_CONTEXT: release a context on the callee.
inline constexpr rpc::MessageType kCleanupAutogradContext =
    static_cast<rpc::MessageType>(21);

// The layer-header id autograd fields travel under.
inline constexpr uint32_t kAutogradHeader = 2;

// Context entry (any value) a BACKWARD carries on its sender when its
// gradients go back along a forward REQUEST (the recv node came from one):
// its CUDA tensors then travel as a reply's, with only their device, and
// the receiver (the forward's caller) lands them with the reverse of its
// own map (worker/device_stage.h consumes the entry before the message
// leaves; docs/design/cuda_rpc.md). Along a forward reply the BACKWARD is
// the caller's own request and follows its map as usual.
inline constexpr char kReturningEntry[] = "device/returning";

// Send/recv pairing and BACKWARD / CLEANUP fields.
struct AutogradFields {
  GlobalId context_id;  // The autograd context.
  GlobalId message_id;  // Pairs a send node with its recv node.
  bool retain_graph = false;  // BACKWARD: keep the graph after running it.
  // Which payload tensors (depth-first indices, strictly increasing)
  // required grad on the sender; set on a recorded send.
  std::vector<int> grad_tensors;
  friend bool operator==(const AutogradFields&,
                         const AutogradFields&) = default;
};

// Contexts released in the background (ReleaseInBackground), riding on a
// request: honoured only by `receiver`, and only from `sender`.
struct AutogradReleases {
  int sender = 0;    // Worker id of the worker that released them.
  int receiver = 0;  // Worker id of the worker they are addressed to.
  std::vector<GlobalId> context_ids;  // Never empty on the wire.
  // Field-wise equality.
  friend bool operator==(const AutogradReleases&,
                         const AutogradReleases&) = default;
};

// One owner-side optimizer step fused into a BACKWARD's pass.
struct FusedStep {
  int worker = 0;        // The owner that steps.
  int64_t step_id = 0;   // Its owner-side optimizer id.
  // Field-wise equality.
  friend bool operator==(const FusedStep&, const FusedStep&) = default;
};

// What autograd puts in a message's layer header (kAutogradHeader).
struct AutogradHeader {
  std::optional<GlobalId> context;  // The context the request travels in.
  std::optional<AutogradFields> fields;  // Send/recv pairing, BACKWARD.
  // Background releases carried by a request.
  std::optional<AutogradReleases> releases;
  // BACKWARD: the pass's fused optimizer steps (forwarded unchanged).
  std::vector<FusedStep> fused_steps;
  friend bool operator==(const AutogradHeader&,
                         const AutogradHeader&) = default;
};

// Claims distributed autograd's message types ("BACKWARD", ...).
absl::Status ClaimMessages();

// Sets `m`'s autograd header (removes it when `h` is empty).
void SetAutogradHeader(rpc::Message& m, const AutogradHeader& h);
// `m`'s autograd header (empty when it has none); InvalidArgument when the
// bytes do not decode or break the rules above.
absl::StatusOr<AutogradHeader> AutogradHeaderOf(const rpc::Message& m);

// Sets only the fields, keeping the rest of the header.
void SetAutogradFields(rpc::Message& m, const AutogradFields& fields);

}  // namespace ferry::autograd::dist

#endif  // FERRY_AUTOGRAD_DIST_MESSAGES_H_
