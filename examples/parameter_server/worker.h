// Joining a parameter-server job: one process, one worker, with the layers
// the examples use (distributed autograd, RRefs, the DistributedOptimizer's
// owner service) installed before the worker serves. A worker is either one
// of the job's static group (JoinJob ... LeaveJob, collective) or an elastic
// one that joins the running group later and leaves before it ends
// (JoinRunningJob ... LeaveRunningJob; rpc/agent.h, Membership).
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
#include "ferry/autograd/dist/dist_autograd.h"
#include "ferry/optim/distributed_optimizer.h"
#include "ferry/rpc/function_registry.h"
#include "ferry/rpc/grpc/agent.h"
#include "ferry/rref/rref.h"
#include "ferry/store/store.h"

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
  // remote classes, interceptors and membership listeners here). `agent` is
  // the worker's, whose Worker::agent is not set yet.
  std::function<absl::Status(rpc::Agent& agent, Worker&)> setup;
  // JoinJob: the static group's size; -1 takes WORLD_SIZE (a job with
  // elastic trainers launches more processes than its static group).
  int world_size = -1;
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

// Joins the running job (JoinRpc through env://, which waits up to two
// minutes for the static group to form) as the new worker `name`, with the
// same layers as JoinJob. Every present worker knows it when this returns.
absl::Status JoinRunningJob(const std::string& name,
                            std::shared_ptr<rpc::FunctionRegistry> registry,
                            JoinOptions options, Worker& worker);

// Leaves the running job (RRefContext::Leave, not collective): releases this
// worker's RRefs, waits until their owners served the deletions, then leaves
// the group; the others go on. Release the worker's distributed autograd
// contexts and destroy its DistributedOptimizers first.
absl::Status LeaveRunningJob(Worker& worker, absl::Duration timeout);

// A client of the job's store (env://: MASTER_ADDR / MASTER_PORT), for the
// job's own keys; under ferry_run, in the attempt's key space, as the
// agents' keys. Errors: those of the init method and the store.
absl::StatusOr<std::unique_ptr<Store>> OpenJobStore(absl::Duration timeout);

}  // namespace ferry::ps_example

#endif  // FERRY_EXAMPLES_PARAMETER_SERVER_WORKER_H_
