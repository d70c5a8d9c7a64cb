// Distributed autograd's messages: the message types it claims from rpc/
// and its typed header, which rpc/ carries as opaque bytes
// (docs/design/layer_messages.md; the algorithm: docs/design/dist_autograd.md).
//
// The header holds the context a request travels in (the sender's current
// context, moved out of the thread-local kContextKey entry when a request
// leaves and back into the request's context when it arrives) and the
// send/recv fields. Setting an empty header removes it; decoding refuses
// malformed bytes with InvalidArgument naming the message.
//
// Thread safety: stateless (the claim registry is rpc/'s, thread-safe).
#ifndef FERRY_AUTOGRAD_DIST_MESSAGES_H_
#define FERRY_AUTOGRAD_DIST_MESSAGES_H_

#include <cstdint>
#include <optional>

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

// Send/recv pairing and BACKWARD / CLEANUP fields.
struct AutogradFields {
  GlobalId context_id;  // The autograd context.
  GlobalId message_id;  // Pairs a send node with its recv node.
  bool retain_graph = false;  // BACKWARD: keep the graph after running it.
  friend bool operator==(const AutogradFields&,
                         const AutogradFields&) = default;
};

// What autograd puts in a message's layer header (kAutogradHeader).
struct AutogradHeader {
  std::optional<GlobalId> context;  // The context the request travels in.
  std::optional<AutogradFields> fields;  // Send/recv pairing, BACKWARD.
  friend bool operator==(const AutogradHeader&,
                         const AutogradHeader&) = default;
};

// Claims distributed autograd's message types ("BACKWARD", ...).
absl::Status ClaimMessages();

// Sets `m`'s autograd header (removes it when `h` is empty).
void SetAutogradHeader(rpc::Message& m, const AutogradHeader& h);
// `m`'s autograd header (empty when it has none); InvalidArgument when the
// bytes do not decode.
absl::StatusOr<AutogradHeader> AutogradHeaderOf(const rpc::Message& m);

// Sets only the fields, keeping the header's context.
void SetAutogradFields(rpc::Message& m, const AutogradFields& fields);

}  // namespace ferry::autograd::dist

#endif  // FERRY_AUTOGRAD_DIST_MESSAGES_H_
