#include "ferry/examples/parameter_server/worker.h"

#include <cstdlib>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "ferry/common/status.h"
#include "ferry/rpc/grpc/init.h"
#include "ferry/store/init_method.h"
#include "ferry/store/tcp_store.h"

namespace ferry::ps_example {
namespace {

// The agent's options: the layers are installed into `worker` before it
// serves. `worker` and `options` must outlive the agent's start.
rpc::GrpcAgentOptions AgentOptions(JoinOptions& options, Worker& worker) {
  rpc::GrpcAgentOptions o;
  o.join_timeout = absl::Seconds(120);
  o.before_serving = [&worker, &options](rpc::Agent& agent) -> absl::Status {
    ASSIGN_OR_RETURN(worker.dist,
                     autograd::dist::DistAutogradContainer::Install(agent));
    ASSIGN_OR_RETURN(worker.rrefs, rref::RRefContext::Create(&agent));
    ASSIGN_OR_RETURN(worker.optimizers,
                     optim::DistOptimizerService::Install(
                         agent, worker.dist, std::move(options.optimizer)));
    return options.setup ? options.setup(agent, worker) : absl::OkStatus();
  };
  return o;
}

}  // namespace

int EnvRank() {
  const char* v = std::getenv("RANK");
  int rank = -1;
  if (v == nullptr || !absl::SimpleAtoi(v, &rank)) return -1;
  return rank;
}

absl::Status JoinJob(const std::string& name,
                     std::shared_ptr<rpc::FunctionRegistry> registry,
                     JoinOptions options, Worker& worker) {
  // The query overrides WORLD_SIZE (which counts the elastic workers too).
  const std::string init_method =
      options.world_size < 0 ? "env://"
                             : absl::StrCat("env://?rank=", EnvRank(),
                                            "&world_size=", options.world_size);
  // No wait for the peers to learn the group: a request that reaches a
  // worker before it knows its group waits for it in the agent.
  ASSIGN_OR_RETURN(worker.agent, rpc::InitRpc(name, init_method, -1, -1,
                                              AgentOptions(options, worker),
                                              std::move(registry)));
  return absl::OkStatus();
}

absl::Status JoinRunningJob(const std::string& name,
                            std::shared_ptr<rpc::FunctionRegistry> registry,
                            JoinOptions options, Worker& worker) {
  ASSIGN_OR_RETURN(worker.agent,
                   rpc::JoinRpc(name, "env://", AgentOptions(options, worker),
                                std::move(registry)));
  return absl::OkStatus();
}

absl::Status LeaveRunningJob(Worker& worker, absl::Duration timeout) {
  return worker.rrefs->Leave(timeout);
}

absl::StatusOr<std::unique_ptr<Store>> OpenJobStore(absl::Duration timeout) {
  ASSIGN_OR_RETURN(InitMethod method, ParseInitMethod("env://"));
  // A client whatever this process's rank: a static worker (or ferry_run)
  // serves the store.
  method.rank = 1;
  method.world_size = 2;
  StoreFactories factories;
  factories.tcp = [base = MakeTcpStoreFactory()](const std::string& host,
                                                 int port, bool, int,
                                                 absl::Duration timeout) {
    return base(host, port, /*is_server=*/false, /*world_size=*/-1, timeout);
  };
  ASSIGN_OR_RETURN(std::unique_ptr<Store> store,
                   CreateStore(method, -1, -1, timeout, factories));
  if (GetEnv("FERRY_USE_AGENT_STORE").value_or("") != "1") return store;
  return ScopeToLauncherGeneration(std::move(store));
}

absl::Status LeaveJob(Worker& worker, absl::Duration timeout) {
  return worker.rrefs->Shutdown(timeout);
}

}  // namespace ferry::ps_example
