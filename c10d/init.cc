#include "ferry/c10d/init.h"

#include <optional>
#include <string>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "ferry/c10d/default_registry.h"
#include "ferry/common/status.h"
#include "ferry/store/prefix_store.h"
#include "ferry/store/store_auth.h"
#include "ferry/store/tcp_store.h"

namespace ferry {
namespace c10d {
namespace {

bool IsTrue(const std::optional<std::string>& v) {
  return v.has_value() && (*v == "1" || *v == "True" || *v == "true");
}

}  // namespace

absl::StatusOr<AgentStore> AgentStoreFromEnv(const EnvLookup& env) {
  AgentStore agent;
  if (IsTrue(env("FERRY_USE_AGENT_STORE"))) {
    agent.use = true;
  } else if (IsTrue(env("TORCHELASTIC_USE_AGENT_STORE"))) {
    agent.use = true;
    // torchrun restarts workers in place; keys of an earlier attempt must
    // not satisfy this attempt's waits, so each attempt gets a namespace.
    std::optional<std::string> attempt = env("TORCHELASTIC_RESTART_COUNT");
    int count = 0;
    if (attempt.has_value() && !absl::SimpleAtoi(*attempt, &count)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "TORCHELASTIC_RESTART_COUNT is not an integer: '", *attempt, "'"));
    }
    agent.prefix = absl::StrCat("/worker/attempt_", count);
  }
  return agent;
}

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
    ASSIGN_OR_RETURN(AgentStore agent, AgentStoreFromEnv(env));
    // Under a launcher that serves the store (ferry_run, torchrun), rank 0
    // must connect to it rather than try to listen on the same port.
    const bool tcp_scheme = method.scheme != InitMethod::Scheme::kFile;
    StoreFactories factories;
    factories.tcp =
        [use_agent = agent.use](
            const std::string& host, int port, bool is_server, int world,
            absl::Duration timeout) -> absl::StatusOr<std::unique_ptr<Store>> {
      TcpStoreOptions o;
      o.host = host;
      o.port = port;
      o.is_server = is_server && !use_agent;
      o.world_size = world;
      o.timeout = timeout;
      ASSIGN_OR_RETURN(o.secret, tcpstore::StoreSecretFromEnv());
      ASSIGN_OR_RETURN(std::unique_ptr<TcpStore> s, TcpStore::Create(o));
      return std::unique_ptr<Store>(std::move(s));
    };
    ASSIGN_OR_RETURN(std::unique_ptr<Store> made,
                     CreateStore(method, rank, world_size,
                                 options.group.timeout, factories));
    if (tcp_scheme && agent.use) {
      // ferry_run's restart generation (store/init_method.h).
      ASSIGN_OR_RETURN(made, ScopeToLauncherGeneration(std::move(made), env));
    }
    store = std::move(made);
    // Backends listen on the local address that routes toward the store.
    if (tcp_scheme && options.group.rendezvous_host.empty()) {
      options.group.rendezvous_host = method.host;
    }
    if (tcp_scheme && !agent.prefix.empty()) {
      store = std::make_shared<PrefixStore>(agent.prefix, std::move(store));
    }
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
