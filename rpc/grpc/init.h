// InitRpc: torch.distributed.rpc.init_rpc for Ferry.
//
//   ASSIGN_OR_RETURN(auto agent, InitRpc("trainer0", "env://"));
//
// `init_method` is tcp://host:port, file:///path or env:// (MASTER_ADDR,
// MASTER_PORT, RANK, WORLD_SIZE). rank / world_size < 0 take their values
// from the init method (env:// reads RANK / WORLD_SIZE). For tcp:// and
// env://, rank 0 hosts the TCPStore server unless FERRY_USE_AGENT_STORE=1
// (set by ferry_run, whose launcher process hosts the store), in which case
// every rank is a client. Under ferry_run's restarts (FERRY_RUN_GENERATION)
// the agent's keys live in the attempt's namespace and a worker of an older
// attempt is refused (store/init_method.h, ScopeToLauncherGeneration).
//
// Address: when options.listen_address is empty, the worker binds
// FERRY_LISTEN_ADDR (host or host:port) if set, else the host chosen by
// ChooseWorkerHost (common/host_address.h: FERRY_ADVERTISE_ADDR, else
// FERRY_SOCKET_IFNAME's address, else the local address that routes to the
// store host; 127.0.0.1 on one machine), port 0. It publishes
// options.advertise_address, else FERRY_ADVERTISE_ADDR, else the chosen host.
// To bind every interface but publish one address (NAT, containers):
// FERRY_LISTEN_ADDR=0.0.0.0 FERRY_ADVERTISE_ADDR=<reachable address>.
//
// TLS: when `options.tls` is empty, it comes from FERRY_TLS_CA,
// FERRY_TLS_CERT, FERRY_TLS_KEY, FERRY_TLS_REQUIRE_CLIENT_CERT and
// FERRY_TLS_SERVER_NAME (rpc/grpc/tls.h).
//
// Errors: those of ParseInitMethod / CreateStore / GrpcAgent::Start.
#ifndef FERRY_RPC_GRPC_INIT_H_
#define FERRY_RPC_GRPC_INIT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "ferry/rpc/grpc/agent.h"

namespace ferry::rpc {

absl::StatusOr<std::unique_ptr<GrpcAgent>> InitRpc(
    const std::string& name, const std::string& init_method, int rank = -1,
    int world_size = -1, GrpcAgentOptions options = {},
    std::shared_ptr<FunctionRegistry> registry = nullptr);

// JoinRpc: joins a running group as a new worker (PyTorch's init_rpc with
// world_size=None; rpc/agent.h, Membership): `init_method` names the group's
// store (tcp://, env:// with MASTER_ADDR/MASTER_PORT, file://), which a
// joiner only connects to (RANK / WORLD_SIZE are not read). Its id is the
// group's next (GrpcAgent::Join); Leave() (or Shutdown) departs. Addresses
// and TLS as InitRpc. Errors: those of ParseInitMethod / GrpcAgent::Join.
absl::StatusOr<std::unique_ptr<GrpcAgent>> JoinRpc(
    const std::string& name, const std::string& init_method,
    GrpcAgentOptions options = {},
    std::shared_ptr<FunctionRegistry> registry = nullptr);

}  // namespace ferry::rpc

#endif  // FERRY_RPC_GRPC_INIT_H_
