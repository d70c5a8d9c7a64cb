// Message: what one worker sends another through an Agent (rpc/agent.h).
//
// Every exchange between workers (a function call, an RRef control message,
// a distributed-autograd backward or cleanup) is one request Message and one
// reply Message. rpc/ gives meaning only to its own types below; layers
// claim their own numbers (rpc/layer.h), register handlers for them and
// carry their fields in typed layer headers (Message::headers) that rpc/
// never reads (docs/design/layer_messages.md). Transports carry every field;
// none of them is encoded until a transport needs bytes, so the payload's
// tensors stay reachable (Message::Tensors) for interceptors.
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

// Numbers are part of the wire format (proto/rpc.proto MessageType). Layers'
// numbers (2, 10-29, ...: rpc/layer.h claims) are not listed here.
enum class MessageType : uint32_t {
  kUnspecified = 0,
  // rpc_sync / rpc_async: run a registered function, reply with its result.
  kCall = 1,
  kPing = 30,
  // Group membership notices (a worker joined or left; rpc/agent.h).
  kMembership = 31,
  // Types defined by layers above rpc/ (and tests): kFirstLayerType + n.
  kFirstLayerType = 1000,
};

// "CALL", "PING", a layer's claimed name ("RREF_FETCH"), else "TYPE_1003".
std::string MessageTypeName(MessageType type);

// One layer's typed header, opaque to rpc/: `bytes` are what the layer that
// claimed header id `layer` (rpc/layer.h) encoded; transports carry them as
// they are and the layer decodes them (trusting nothing).
struct LayerHeader {
  uint32_t layer = 0;  // Never 0.
  std::string bytes;  // The layer's encoding.
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
  // Registered function name (kCall, a layer's calls); free for other types.
  std::string function;
  // Set by Agent::Send; on the callee, the worker that sent the request.
  std::string caller_name;
  int caller_id = -1;  // Its id (see caller_name).
  // Absolute, in the local clock of whoever holds the message: the callee's
  // deadline is its receive time plus the caller's remaining time.
  absl::Time deadline = absl::InfiniteFuture();
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
  // Removes layer `layer`'s header, if any.
  void ClearHeader(uint32_t layer);
  // Short form for logs and errors: "CALL 'add' from 'w0'".
  std::string DebugString() const;
};

// Calls `fn` on every tensor of `value`, depth first; `fn` may replace it.
void ForEachTensor(Value& value, const std::function<void(Tensor&)>& fn);

// "worker 'b' function 'add'" for calls (and layer types claimed as naming a
// function), "worker 'b' message RREF_FETCH" for other types: how errors
// name a message's target.
std::string DescribeTarget(const std::string& worker, const Message& message);
// The same from a message's type and function name.
std::string DescribeTarget(const std::string& worker, MessageType type,
                           const std::string& function);

}  // namespace ferry::rpc

#endif  // FERRY_RPC_MESSAGE_H_
