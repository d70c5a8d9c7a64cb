// The RRef layer's messages: the message types it claims from rpc/ and its
// typed header (ids, owner, peer, type name and piggybacked deletions),
// which rpc/ carries as opaque bytes (docs/design/layer_messages.md; the
// protocol itself: docs/design/rref_protocol.md).
//
// ClaimMessages registers the types (idempotent; RRefContext::Install calls
// it). SetFields writes the header into a message; FieldsOf reads it back,
// refusing malformed bytes with InvalidArgument naming the message.
//
// Thread safety: stateless (the claim registry is rpc/'s, thread-safe).
#ifndef FERRY_RREF_MESSAGES_H_
#define FERRY_RREF_MESSAGES_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ferry/common/ids.h"
#include "ferry/rpc/message.h"

namespace ferry::rref {

// Wire numbers (unchanged from when rpc/ listed them).
// remote(): run a function, keep the result on the callee (owner RRef).
inline constexpr rpc::MessageType kRemoteCall = static_cast<rpc::MessageType>(2);
// to_here(): fetch an owner's value.
inline constexpr rpc::MessageType kRRefFetch = static_cast<rpc::MessageType>(10);
// A user -> the owner: its fork is gone (batched, see rref_protocol.md).
inline constexpr rpc::MessageType kRRefUserDelete =
    static_cast<rpc::MessageType>(11);
// A user that received the RRef from another user -> the owner: register
// its fork.
inline constexpr rpc::MessageType kRRefForkRequest =
    static_cast<rpc::MessageType>(12);
// The fork's receiver -> its parent: the owner knows the fork, so the parent
// may drop the reference it kept for it.
inline constexpr rpc::MessageType kRRefChildAccept =
    static_cast<rpc::MessageType>(13);
// Proxy calls on remote objects (rref.h).
inline constexpr rpc::MessageType kRRefMethod =
    static_cast<rpc::MessageType>(1017);

// The layer-header id RRef fields travel under.
inline constexpr uint32_t kRRefHeader = 1;

// A user deletion: (rref id, fork id).
using ForkRef = std::pair<GlobalId, GlobalId>;

// The RRef header's fields.
struct RRefFields {
  GlobalId rref_id;  // The RRef's id.
  GlobalId fork_id;  // The fork concerned.
  int owner_id = -1;  // The owner's worker id.
  // Worker a fork is being shared with / accepted from.
  int peer_id = -1;
  std::string type_name;  // The value's type name.
  // Deletions riding on a request to their owner (applied on receipt).
  std::vector<ForkRef> deletes;
  friend bool operator==(const RRefFields&, const RRefFields&) = default;
};

// Claims the RRef layer's message types (names: "REMOTE_CALL", ...).
absl::Status ClaimMessages();

// Sets `m`'s RRef header to `fields`.
void SetFields(rpc::Message& m, const RRefFields& fields);
// `m`'s RRef header; nullopt when it has none. InvalidArgument when the
// bytes do not decode (or carry an odd number of deletion ids).
absl::StatusOr<std::optional<RRefFields>> FieldsOf(const rpc::Message& m);

}  // namespace ferry::rref

#endif  // FERRY_RREF_MESSAGES_H_
