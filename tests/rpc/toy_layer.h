// A toy layer above rpc/, as rref/ and autograd/ will be: it adds its own
// message type with a handler, and a client call that sends it. The handler
// doubles the tensor it receives and echoes its layer header (opaque bytes
// under kToyHeader, docs/design/layer_messages.md) and the caller's context
// entry "toy/tag".
#ifndef FERRY_TESTS_RPC_TOY_LAYER_H_
#define FERRY_TESTS_RPC_TOY_LAYER_H_

#include <string>

#include "absl/status/status.h"
#include "ferry/rpc/agent.h"

namespace ferry::rpc::toy {

inline constexpr MessageType kToyDouble = static_cast<MessageType>(
    static_cast<uint32_t>(MessageType::kFirstLayerType) + 42);
inline constexpr uint32_t kToyHeader = 42;

// Registers the handler on `agent`.
absl::Status Install(Agent& agent);

struct Doubled {
  Tensor tensor;
  std::string header;
  std::string tag;
};

// Sends `t` to `to` under kToyDouble with `header`; the reply's contents.
Future<Doubled> Double(Agent& agent, const WorkerRef& to, Tensor t,
                       std::string header);

}  // namespace ferry::rpc::toy

#endif  // FERRY_TESTS_RPC_TOY_LAYER_H_
