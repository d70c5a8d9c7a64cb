// The thread-local RPC context: key/value entries that travel with every
// message a thread sends and are installed on the callee's thread while the
// handler runs (so nested calls carry them on). Distributed autograd keeps its
// current context id here; tests and layers may keep their own keys.
//
//   ScopedContextEntry ctx("autograd/context", "42");
//   agent.rpc_sync("b", "f");   // f sees CurrentContext()["autograd/context"]
//
// The context belongs to the thread, not to an agent: several agents in one
// process see the same entries on the same thread, as a caller's identity
// would. Only the thread that sets an entry sees it.
#ifndef FERRY_RPC_CONTEXT_H_
#define FERRY_RPC_CONTEXT_H_

#include <optional>
#include <string>

#include "ferry/rpc/message.h"

namespace ferry::rpc {

// The calling thread's entries (empty by default).
const ContextEntries& CurrentContext();

// The value of `key`, or nullopt.
std::optional<std::string> CurrentContextValue(const std::string& key);

// Replaces the whole context for its scope, then restores the previous one.
class ScopedContext {
 public:
  // Installs `entries` on this thread.
  explicit ScopedContext(ContextEntries entries);
  ~ScopedContext();
  ScopedContext(const ScopedContext&) = delete;
  ScopedContext& operator=(const ScopedContext&) = delete;

 private:
  ContextEntries saved_;
};

// Sets one entry for its scope, then restores the previous context.
class ScopedContextEntry {
 public:
  // Sets `key` to `value` on this thread.
  ScopedContextEntry(const std::string& key, std::string value);
  ~ScopedContextEntry();
  ScopedContextEntry(const ScopedContextEntry&) = delete;
  ScopedContextEntry& operator=(const ScopedContextEntry&) = delete;

 private:
  ContextEntries saved_;
};

}  // namespace ferry::rpc

#endif  // FERRY_RPC_CONTEXT_H_
