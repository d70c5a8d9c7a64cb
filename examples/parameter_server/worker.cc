#include "examples/parameter_server/worker.h"

#include <cstdlib>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status.h"
#include "rpc/grpc/init.h"

namespace ferry::ps_example {

int EnvRank() {
  const char* v = std::getenv("RANK");
  int rank = -1;
  if (v == nullptr || !absl::SimpleAtoi(v, &rank)) return -1;
  return rank;
}

absl::Status JoinJob(const std::string& name,
                     std::shared_ptr<rpc::FunctionRegistry> registry,
                     JoinOptions options, Worker& worker) {
  rpc::GrpcAgentOptions o;
  o.join_timeout = absl::Seconds(120);
  o.before_serving = [&worker, &options](rpc::Agent& agent) -> absl::Status {
    ASSIGN_OR_RETURN(worker.dist,
                     autograd::dist::DistAutogradContainer::Install(agent));
    ASSIGN_OR_RETURN(worker.rrefs, rref::RRefContext::Create(&agent));
    ASSIGN_OR_RETURN(worker.optimizers,
                     optim::DistOptimizerService::Install(
                         agent, worker.dist, std::move(options.optimizer)));
    return options.setup ? options.setup(worker) : absl::OkStatus();
  };
  // No wait for the peers to learn the group: a request that reaches a
  // worker before it knows its group waits for it in the agent.
  ASSIGN_OR_RETURN(worker.agent, rpc::InitRpc(name, "env://", -1, -1, o,
                                              std::move(registry)));
  return absl::OkStatus();
}

absl::Status LeaveJob(Worker& worker, absl::Duration timeout) {
  return worker.rrefs->Shutdown(timeout);
}

}  // namespace ferry::ps_example
