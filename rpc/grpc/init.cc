#include "ferry/rpc/grpc/init.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "ferry/common/host_address.h"
#include "ferry/common/logging.h"
#include "ferry/common/status.h"
#include "ferry/store/init_method.h"
#include "ferry/store/store_auth.h"
#include "ferry/store/tcp_store.h"

namespace ferry::rpc {
namespace {

// Fills in listen_address / advertise_address left empty (see init.h).
absl::Status ChooseAddresses(const std::string& name, const InitMethod& method,
                             GrpcAgentOptions* options) {
  std::optional<std::string> advertise = GetEnv("FERRY_ADVERTISE_ADDR");
  if (options->advertise_address.empty() && advertise.has_value()) {
    options->advertise_address = *advertise;
  }
  if (!options->listen_address.empty()) return absl::OkStatus();
  std::string source = "FERRY_LISTEN_ADDR";
  std::string listen = GetEnv("FERRY_LISTEN_ADDR").value_or("");
  if (listen.empty()) {
    const std::string peer =
        method.scheme == InitMethod::Scheme::kFile ? "" : method.host;
    absl::StatusOr<HostChoice> choice = ChooseWorkerHost(peer, GetEnv);
    if (!choice.ok()) {
      return Annotate(choice.status(), absl::StrCat("worker '", name, "'"));
    }
    listen = choice->host;
    source = choice->source;
  }
  // A bare host (or bracketed IPv6 literal) gets port 0.
  const bool has_port =
      absl::StartsWith(listen, "[")
          ? absl::StrContains(listen, "]:")
          : std::count(listen.begin(), listen.end(), ':') == 1;
  options->listen_address = has_port ? listen : JoinHostPort(listen, 0);
  FERRY_LOG(INFO) << "worker '" << name << "' listens on "
                  << options->listen_address << " (" << source << ")"
                  << (options->advertise_address.empty()
                          ? ""
                          : absl::StrCat(", publishes ",
                                         options->advertise_address));
  return absl::OkStatus();
}

// The group's store for this worker; a joiner (`join`) is always a client
// of a running group's store, which it never serves.
absl::StatusOr<std::shared_ptr<Store>> AgentStore(const InitMethod& method,
                                                  int rank, int world_size,
                                                  absl::Duration timeout,
                                                  bool join) {
  StoreFactories factories;
  factories.tcp = MakeTcpStoreFactory();
  std::optional<std::string> agent_store = GetEnv("FERRY_USE_AGENT_STORE");
  const bool launcher_store = agent_store.has_value() && *agent_store == "1";
  if (launcher_store || join) {
    // The launcher (or the running group) serves the store: connect.
    // A joiner is not counted among the static group's store handles.
    factories.tcp = [base = factories.tcp, join](const std::string& host,
                                                 int port, bool, int ws,
                                                 absl::Duration timeout) {
      return base(host, port, /*is_server=*/false, join ? -1 : ws, timeout);
    };
  }
  InitMethod m = method;
  if (join) {
    // Any client rank of the store; the agent's id comes from the group.
    m.rank = 1;
    m.world_size = 2;
    rank = world_size = -1;
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Store> store,
                   CreateStore(m, rank, world_size, timeout, factories));
  if (launcher_store) {
    ASSIGN_OR_RETURN(store, ScopeToLauncherGeneration(std::move(store)));
  }
  return std::shared_ptr<Store>(std::move(store));
}

// TLS and the store secret from the environment, unless the options set
// them.
absl::Status SecurityFromEnv(GrpcAgentOptions* options) {
  if (!options->tls.enabled()) {
    ASSIGN_OR_RETURN(options->tls, grpc_agent::TlsOptionsFromEnv(GetEnv));
  }
  if (options->secret.empty()) {
    ASSIGN_OR_RETURN(options->secret, tcpstore::StoreSecretFromEnv());
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<GrpcAgent>> InitRpc(
    const std::string& name, const std::string& init_method, int rank,
    int world_size, GrpcAgentOptions options,
    std::shared_ptr<FunctionRegistry> registry) {
  ASSIGN_OR_RETURN(InitMethod method, ParseInitMethod(init_method));
  RETURN_IF_ERROR(SecurityFromEnv(&options));
  ASSIGN_OR_RETURN(std::shared_ptr<Store> store,
                   AgentStore(method, rank, world_size, options.join_timeout,
                              /*join=*/false));
  RETURN_IF_ERROR(ChooseAddresses(name, method, &options));
  if (rank < 0) rank = method.rank.value_or(-1);
  if (world_size < 0) world_size = method.world_size.value_or(-1);
  return GrpcAgent::Start(name, rank, world_size, std::move(store),
                          std::move(options), std::move(registry));
}

absl::StatusOr<std::unique_ptr<GrpcAgent>> JoinRpc(
    const std::string& name, const std::string& init_method,
    GrpcAgentOptions options, std::shared_ptr<FunctionRegistry> registry) {
  ASSIGN_OR_RETURN(InitMethod method, ParseInitMethod(init_method));
  RETURN_IF_ERROR(SecurityFromEnv(&options));
  ASSIGN_OR_RETURN(std::shared_ptr<Store> store,
                   AgentStore(method, -1, -1, options.join_timeout,
                              /*join=*/true));
  RETURN_IF_ERROR(ChooseAddresses(name, method, &options));
  return GrpcAgent::Join(name, std::move(store), std::move(options),
                         std::move(registry));
}

}  // namespace ferry::rpc
