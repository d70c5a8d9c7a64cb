// Layers above rpc/ (rref/, autograd/dist, optim/, tests' toy layers) own
// their messages: each claims the message-type numbers it serves and one
// layer-header id, and encodes its own typed header into the opaque bytes a
// Message carries for it (Message::headers, rpc/message.h). rpc/ moves those
// bytes and never reads them (docs/design/layer_messages.md).
//
//   const rpc::LayerClaim kClaim{"rref", 1, {{10, 19}}, {{10, "RREF_FETCH"}}};
//   RETURN_IF_ERROR(rpc::ClaimLayer(kClaim));  // At install; idempotent.
//
// Claims are process-wide (message numbers are a wire format, not a property
// of one agent). Claiming the same claim again is a no-op; a claim whose
// name, header id or any number overlaps another layer's is AlreadyExists
// naming both layers; rpc/'s own types (0, CALL, PING, MEMBERSHIP) are
// claimed by "rpc". MessageTypeName uses the names claims give.
//
// Thread safety: thread-safe.
#ifndef FERRY_RPC_LAYER_H_
#define FERRY_RPC_LAYER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace ferry::rpc {

// A message-type number the claim names, and how logs and errors show it.
struct LayerTypeName {
  uint32_t type = 0;
  std::string name;  // "RREF_FETCH"
  // Whether errors name the message's function ("function 'f'") rather than
  // its type, as for CALL.
  bool names_function = false;
};

struct LayerClaim {
  std::string layer;  // "rref": unique.
  // The id its headers travel under (LayerHeader::layer); 0: no header.
  uint32_t header_id = 0;
  // Inclusive ranges of message-type numbers, none overlapping another
  // layer's.
  std::vector<std::pair<uint32_t, uint32_t>> ranges;
  std::vector<LayerTypeName> names;  // Each inside `ranges`.
};

// Registers `claim` (see the top comment). InvalidArgument for an empty
// name, an empty or inverted range, or a name outside the ranges.
absl::Status ClaimLayer(const LayerClaim& claim);

// The claimed name of `type`, if any.
std::optional<LayerTypeName> ClaimedTypeName(uint32_t type);
// The layer that claimed `type` ("rpc", "rref", ...), if any.
std::optional<std::string> LayerOfType(uint32_t type);
// The layer whose headers travel under `header_id`, if any.
std::optional<std::string> LayerOfHeader(uint32_t header_id);

}  // namespace ferry::rpc

#endif  // FERRY_RPC_LAYER_H_
