#include "examples/parameter_server/worker.h"

#include <cstdlib>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status.h"
#include "rpc/grpc/init.h"

namespace ferry::ps_example {

namespace {

constexpr char kWorldSize[] = "ps_example.world_size";

// A GrpcAgent serves before it has learnt the group (it learns it right
// after joining), so a peer's handler may briefly be unable to send by id
// (backward gradients, context release). Asks every worker until it knows
// the whole group; bounded by `timeout`.
absl::Status AwaitGroupKnown(rpc::Agent& agent, absl::Duration timeout) {
  const int world = agent.world_size();
  const absl::Time deadline = absl::Now() + timeout;
  for (int r = 0; r < world; ++r) {
    for (;;) {
      ASSIGN_OR_RETURN(int64_t n, agent.rpc_sync<int64_t>(r, kWorldSize));
      if (n == world) break;
      if (absl::Now() > deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat("worker ", r, " knows ", n, " of ", world,
                         " workers after ", absl::FormatDuration(timeout)));
      }
    }
  }
  return absl::OkStatus();
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
  rpc::GrpcAgentOptions o;
  o.join_timeout = absl::Seconds(120);
  o.before_serving = [&worker, &options](rpc::Agent& agent) -> absl::Status {
    ASSIGN_OR_RETURN(worker.dist,
                     autograd::dist::DistAutogradContainer::Install(agent));
    ASSIGN_OR_RETURN(worker.rrefs, rref::RRefContext::Create(&agent));
    ASSIGN_OR_RETURN(worker.optimizers,
                     optim::DistOptimizerService::Install(
                         agent, worker.dist, std::move(options.optimizer)));
    rpc::Agent* self = &agent;
    RETURN_IF_ERROR(agent.Register(kWorldSize, [self] {
      return static_cast<int64_t>(self->world_size());
    }));
    return options.setup ? options.setup(worker) : absl::OkStatus();
  };
  ASSIGN_OR_RETURN(worker.agent, rpc::InitRpc(name, "env://", -1, -1, o,
                                              std::move(registry)));
  return AwaitGroupKnown(*worker.agent, absl::Seconds(60));
}

absl::Status LeaveJob(Worker& worker, absl::Duration timeout) {
  return worker.rrefs->Shutdown(timeout);
}

}  // namespace ferry::ps_example
