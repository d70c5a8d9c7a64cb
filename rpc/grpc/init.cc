#include "rpc/grpc/init.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/host_address.h"
#include "common/logging.h"
#include "common/status.h"
#include "store/init_method.h"
#include "store/tcp_store.h"

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

}  // namespace

absl::StatusOr<std::unique_ptr<GrpcAgent>> InitRpc(
    const std::string& name, const std::string& init_method, int rank,
    int world_size, GrpcAgentOptions options,
    std::shared_ptr<FunctionRegistry> registry) {
  ASSIGN_OR_RETURN(InitMethod method, ParseInitMethod(init_method));
  if (!options.tls.enabled()) {
    ASSIGN_OR_RETURN(options.tls, grpc_agent::TlsOptionsFromEnv(GetEnv));
  }
  StoreFactories factories;
  factories.tcp = MakeTcpStoreFactory();
  std::optional<std::string> agent_store = GetEnv("FERRY_USE_AGENT_STORE");
  if (agent_store.has_value() && *agent_store == "1") {
    // The launcher serves the store: every rank connects as a client.
    factories.tcp = [base = factories.tcp](const std::string& host, int port,
                                           bool, int ws,
                                           absl::Duration timeout) {
      return base(host, port, /*is_server=*/false, ws, timeout);
    };
  }
  ASSIGN_OR_RETURN(
      std::unique_ptr<Store> store,
      CreateStore(method, rank, world_size, options.join_timeout, factories));
  if (agent_store.has_value() && *agent_store == "1") {
    ASSIGN_OR_RETURN(store, ScopeToLauncherGeneration(std::move(store)));
  }
  RETURN_IF_ERROR(ChooseAddresses(name, method, &options));
  if (rank < 0) rank = method.rank.value_or(-1);
  if (world_size < 0) world_size = method.world_size.value_or(-1);
  return GrpcAgent::Start(name, rank, world_size,
                          std::shared_ptr<Store>(std::move(store)),
                          std::move(options), std::move(registry));
}

}  // namespace ferry::rpc
