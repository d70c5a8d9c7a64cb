// Joining a parameter-server job: one process, one worker, with the layers
// the examples use (distributed autograd, RRefs, the DistributedOptimizer's
// owner service) installed before the worker serves.
//
// Thread safety: Worker's members are written by JoinJob before any handler
// runs and only read afterwards.
#ifndef FERRY_EXAMPLES_PARAMETER_SERVER_WORKER_H_
#define FERRY_EXAMPLES_PARAMETER_SERVER_WORKER_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "autograd/dist/dist_autograd.h"
#include "optim/distributed_optimizer.h"
#include "rpc/function_registry.h"
#include "rpc/grpc/agent.h"
#include "rref/rref.h"

namespace ferry::ps_example {

struct Worker {
  std::unique_ptr<rpc::GrpcAgent> agent;
  std::shared_ptr<autograd::dist::DistAutogradContainer> dist;
  std::shared_ptr<rref::RRefContext> rrefs;
  std::shared_ptr<optim::DistOptimizerService> optimizers;
};

struct JoinOptions {
  // Handed to the optimizer service (parameter servers share their lock).
  optim::DistOptimizerService::Options optimizer;
  // Runs before the worker serves, after the layers are installed (register
  // remote classes here).
  std::function<absl::Status(Worker&)> setup;
};

// RANK of this process (ferry_run sets it), or -1 when unset or malformed.
int EnvRank();

// Joins the job through env:// as `name`, serving `registry`'s functions.
// `worker` is filled before serving starts, so functions in `registry` may
// capture it.
absl::Status JoinJob(const std::string& name,
                     std::shared_ptr<rpc::FunctionRegistry> registry,
                     JoinOptions options, Worker& worker);

// The collective end of the job (every worker calls it): releases RRefs and
// shuts the agent down gracefully, waiting up to `timeout` per step.
absl::Status LeaveJob(Worker& worker, absl::Duration timeout);

}  // namespace ferry::ps_example

#endif  // FERRY_EXAMPLES_PARAMETER_SERVER_WORKER_H_
