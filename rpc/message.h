// Message: what one worker sends another through an Agent (rpc/agent.h).
//
// Every exchange between workers (a function call, an RRef control message,
// a distributed-autograd backward or cleanup) is one request Message and one
// reply Message. rpc/ gives meaning only to kCall; other layers register
// handlers for their own types (built-in ones below, or their own numbers at
// kFirstLayerType and above). Transports carry every field; none of them is
// encoded until a transport needs bytes, so the payload's tensors stay
// reachable (Message::Tensors) for interceptors.
//
// Thread safety: a value type; not synchronized.
#ifndef FERRY_RPC_MESSAGE_H_
#define FERRY_RPC_MESSAGE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "ferry/common/ids.h"
#include "ferry/tensor/tensor.h"
#include "ferry/tensor/value.h"

namespace ferry::rpc {

// Numbers are part of the wire format (proto/rpc.proto MessageType).
enum class MessageType : uint32_t {
  kUnspecified = 0,
  // rpc_sync / rpc_async: run a registered function, reply with its result.
  kCall = 1,
  // remote(): run a function, keep the result on the callee (owner RRef).
  kRemoteCall = 2,
  // RRef protocol (rref/).
  kRRefFetch = 10,
  kRRefUserDelete = 11,
  kRRefForkRequest = 12,
  kRRefChildAccept = 13,
  // Distributed autograd.
  kBackward = 20,
  kCleanupAutogradContext = 21,
  kPing = 30,
  // Group membership notices (a worker joined or left; rpc/agent.h).
  kMembership = 31,
  // Types defined by layers above rpc/ (and tests): kFirstLayerType + n.
  kFirstLayerType = 1000,
};

// "CALL", "RREF_FETCH", ..., "TYPE_1003" for layer-defined numbers.
std::string MessageTypeName(MessageType type);

// RRef identity carried by RRef messages; its meaning belongs to rref/.
struct RRefFields {
  GlobalId rref_id;  // The RRef's id.
  GlobalId fork_id;  // The fork concerned.
  int owner_id = -1;  // The owner's worker id.
  // Worker a fork is being shared with / accepted from.
  int peer_id = -1;
  std::string type_name;  // The value's type name.
  friend bool operator==(const RRefFields&, const RRefFields&) = default;
};

// Distributed-autograd fields; their meaning belongs to autograd/.
struct AutogradFields {
  GlobalId context_id;  // The autograd context.
  // Pairs a send node with its recv node.
  GlobalId message_id;
  // BACKWARD: keep the graph after running it.
  bool retain_graph = false;
  friend bool operator==(const AutogradFields&,
                         const AutogradFields&) = default;
};

// One layer's typed header, opaque to rpc/: `bytes` are what the layer that
// claimed header id `layer` (rpc/layer.h) encoded; transports carry them as
// they are and the layer decodes them (trusting nothing).
struct LayerHeader {
  uint32_t layer = 0;  // Never 0.
  std::string bytes;
  friend bool operator==(const LayerHeader&, const LayerHeader&) = default;
};
// At most one header per layer, in ascending layer order.
using LayerHeaders = std::vector<LayerHeader>;

// Key/value entries of the thread-local context (rpc/context.h).
using ContextEntries = std::map<std::string, std::string>;

// What agents exchange: a request or a reply, with its envelope fields
// and its payload.
struct Message {
  MessageType type = MessageType::kUnspecified;  // Selects the handler.
  // Set by Agent::Send (worker id + counter); a reply carries its request's.
  GlobalId id;
  // Registered function name (kCall, kRemoteCall); free for other types.
  std::string function;
  // Set by Agent::Send; on the callee, the worker that sent the request.
  std::string caller_name;
  int caller_id = -1;  // Its id (see caller_name).
  // Absolute, in the local clock of whoever holds the message: the callee's
  // deadline is its receive time plus the caller's remaining time.
  absl::Time deadline = absl::InfiniteFuture();
  std::optional<RRefFields> rref;  // RRef messages only.
  std::optional<AutogradFields> autograd;  // Autograd messages only.
  // Layers' typed headers (SetHeader keeps them ordered).
  LayerHeaders headers;
  // The sender's thread-local context (Agent::Send fills it in).
  ContextEntries context;
  Value payload;  // Arguments, or the result.

  // Every tensor in the payload, depth first (shared handles, not copies).
  std::vector<Tensor> Tensors() const;
  // Layer `layer`'s header bytes, or null.
  const std::string* FindHeader(uint32_t layer) const;
  // Sets (or replaces) layer `layer`'s header.
  void SetHeader(uint32_t layer, std::string bytes);
  void ClearHeader(uint32_t layer);
  // Short form for logs and errors: "CALL 'add' from 'w0'".
  std::string DebugString() const;
};

// Calls `fn` on every tensor of `value`, depth first; `fn` may replace it.
void ForEachTensor(Value& value, const std::function<void(Tensor&)>& fn);

// "worker 'b' function 'add'" for calls, "worker 'b' message RREF_FETCH"
// for other types: how errors name a message's target.
std::string DescribeTarget(const std::string& worker, const Message& message);
// The same from a message's type and function name.
std::string DescribeTarget(const std::string& worker, MessageType type,
                           const std::string& function);

}  // namespace ferry::rpc

#endif  // FERRY_RPC_MESSAGE_H_
