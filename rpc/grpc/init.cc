#include "rpc/grpc/init.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "store/init_method.h"
#include "store/tcp_store.h"

namespace ferry::rpc {

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
  if (rank < 0) rank = method.rank.value_or(-1);
  if (world_size < 0) world_size = method.world_size.value_or(-1);
  return GrpcAgent::Start(name, rank, world_size,
                          std::shared_ptr<Store>(std::move(store)),
                          std::move(options), std::move(registry));
}

}  // namespace ferry::rpc
