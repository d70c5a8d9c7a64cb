#include "c10d/init.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "c10d/default_registry.h"
#include "common/status.h"
#include "store/tcp_store.h"

namespace ferry {
namespace c10d {

absl::StatusOr<std::shared_ptr<ProcessGroup>> InitProcessGroup(
    InitProcessGroupOptions options, const EnvLookup& env) {
  if ((options.store != nullptr) == !options.init_method.empty()) {
    return absl::InvalidArgumentError(
        "InitProcessGroup: give exactly one of store and init_method");
  }
  std::shared_ptr<const BackendRegistry> registry = options.registry;
  if (registry == nullptr) registry = MakeDefaultBackendRegistry();
  std::shared_ptr<Store> store = options.store;
  int rank = options.rank;
  int world_size = options.world_size;
  if (store == nullptr) {
    ASSIGN_OR_RETURN(InitMethod method,
                     ParseInitMethod(options.init_method, env));
    if (rank < 0 && method.rank.has_value()) rank = *method.rank;
    if (world_size < 0 && method.world_size.has_value()) {
      world_size = *method.world_size;
    }
    StoreFactories factories;
    factories.tcp =
        [](const std::string& host, int port, bool is_server, int world,
           absl::Duration timeout) -> absl::StatusOr<std::unique_ptr<Store>> {
      TcpStoreOptions o;
      o.host = host;
      o.port = port;
      o.is_server = is_server;
      o.world_size = world;
      o.timeout = timeout;
      ASSIGN_OR_RETURN(std::unique_ptr<TcpStore> s, TcpStore::Create(o));
      return std::unique_ptr<Store>(std::move(s));
    };
    ASSIGN_OR_RETURN(std::unique_ptr<Store> made,
                     CreateStore(method, rank, world_size,
                                 options.group.timeout, factories));
    store = std::move(made);
  }
  if (rank < 0 || world_size < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "InitProcessGroup: rank (", rank, ") and world_size (", world_size,
        ") must be given in the options, the init_method URL or RANK / "
        "WORLD_SIZE"));
  }
  return ProcessGroup::Create(std::move(store), rank, world_size,
                              std::move(registry), std::move(options.group));
}

}  // namespace c10d
}  // namespace ferry
