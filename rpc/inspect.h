// Inspection seam: layers above rpc/ (rref/, autograd/dist/) register named
// inspectors on their Agent, each returning rows describing its live state
// (owned RRefs, autograd contexts...). Transports expose them without the
// layers depending on a transport: the gRPC agent's Admin service answers
// Inspect with them (proto/admin.proto), so grpcurl shows a live job's state.
//
// A row is a kind ("owned_rref", "user_rref", ...) and ordered named fields,
// all text, so that any layer's state fits one schema.
//
// Thread safety: every method is safe from any thread. Inspectors run on the
// caller's thread, outside the registry's lock; they must not block for long
// (take the layer's own lock, copy, return).
#ifndef FERRY_RPC_INSPECT_H_
#define FERRY_RPC_INSPECT_H_

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ferry/common/sync.h"

namespace ferry::rpc {

// One row of an inspector's table.
struct InspectionRow {
  std::string kind;  // What the row describes.
  std::vector<std::pair<std::string, std::string>> fields;  // (key, value).
  // The value of field `key`, or "" when absent.
  std::string Get(const std::string& key) const;
};

// What one inspector returned.
struct Inspection {
  std::string name;  // The inspector's name.
  std::vector<InspectionRow> rows;  // Its rows.
};

// Returns a layer's rows as they are now.
using Inspector = std::function<std::vector<InspectionRow>()>;

// The inspectors of one agent, by name.
class InspectorRegistry {
 public:
  // AlreadyExists if `name` is taken; InvalidArgument for an empty name or a
  // null inspector.
  absl::Status Register(const std::string& name, Inspector inspector);
  // No-op when absent.
  void Unregister(const std::string& name);
  std::vector<std::string> Names() const;  // Registered names, sorted.
  // Runs the inspector `name`, or every inspector (by name) when `name` is
  // empty. NotFound naming the registered inspectors for an unknown name.
  absl::StatusOr<std::vector<Inspection>> Inspect(
      const std::string& name = "") const;

 private:
  mutable Mutex mu_;
  std::map<std::string, Inspector> inspectors_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ferry::rpc

#endif  // FERRY_RPC_INSPECT_H_
