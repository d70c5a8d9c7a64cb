// InitProcessGroup: torch.distributed.init_process_group for C++.
//
//   InitProcessGroupOptions o;
//   o.init_method = "env://";          // or tcp://host:port, file:///path
//   o.group.backend = "cpu:gloo,cuda:nccl";
//   ASSIGN_OR_RETURN(std::shared_ptr<ProcessGroup> pg, InitProcessGroup(o));
//
// Either `store` (an explicit store every rank shares) or `init_method`
// (parsed by store/init_method.h: tcp:// and env:// make a TCPStore that rank
// 0 serves; file:// a FileStore). rank / world_size come from the options,
// else from the URL's query or RANK / WORLD_SIZE.
//
// Under a launcher that already serves the store, every rank connects as a
// client instead: ferry_run sets FERRY_USE_AGENT_STORE=1, torchrun sets
// TORCHELASTIC_USE_AGENT_STORE=True (then keys live under
// "/worker/attempt_<TORCHELASTIC_RESTART_COUNT>", as torch does).
//
// Thread safety: stateless; the returned group is documented in
// process_group.h. No process-wide default group is kept: pass the returned
// group around.
#ifndef FERRY_C10D_INIT_H_
#define FERRY_C10D_INIT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "ferry/c10d/process_group.h"
#include "ferry/c10d/registry.h"
#include "ferry/store/init_method.h"
#include "ferry/store/store.h"

namespace ferry {
namespace c10d {

// InitProcessGroup's arguments (see the top of this file).
struct InitProcessGroupOptions {
  std::string init_method;  // tcp://, file:// or env://.
  std::shared_ptr<Store> store;  // Instead of init_method.
  int rank = -1;  // < 0: from init_method.
  int world_size = -1;  // < 0: from init_method.
  ProcessGroupOptions group;  // Backend spec, timeout...
  // Null: MakeDefaultBackendRegistry().
  std::shared_ptr<const BackendRegistry> registry;
};

// What the environment says about a launcher-served store.
struct AgentStore {
  bool use = false;    // Connect as a client even on rank 0.
  std::string prefix;  // Non-empty: wrap the store in a PrefixStore.
};
// Reads FERRY_USE_AGENT_STORE / TORCHELASTIC_USE_AGENT_STORE ("1", "True" or
// "true" enable) and TORCHELASTIC_RESTART_COUNT (InvalidArgument when not an
// integer).
absl::StatusOr<AgentStore> AgentStoreFromEnv(const EnvLookup& env = GetEnv);

// InvalidArgument when neither or both of store / init_method are given, or
// rank / world_size are missing; the store's or backend's error otherwise
// (DeadlineExceeded when a rank does not arrive within group.timeout).
absl::StatusOr<std::shared_ptr<ProcessGroup>> InitProcessGroup(
    InitProcessGroupOptions options, const EnvLookup& env = GetEnv);

}  // namespace c10d
}  // namespace ferry

#endif  // FERRY_C10D_INIT_H_
