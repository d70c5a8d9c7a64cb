// A gRPC worker with the RRef layer and distributed autograd installed, as
// the tests of this folder start them in one process.
#ifndef FERRY_TESTS_RREF_LAYERED_WORKER_H_
#define FERRY_TESTS_RREF_LAYERED_WORKER_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "ferry/autograd/dist/dist_autograd.h"
#include "ferry/rpc/grpc/agent.h"
#include "ferry/rref/rref.h"

namespace ferry::testutil {

struct LayeredWorker {
  std::unique_ptr<rpc::GrpcAgent> agent;
  std::shared_ptr<rref::RRefContext> rrefs;
  std::shared_ptr<autograd::dist::DistAutogradContainer> dist;
};

// A GrpcAgentOptions::before_serving that installs both layers into `w`
// (which outlives the agent's start).
std::function<absl::Status(rpc::Agent&)> InstallLayers(LayeredWorker& w);

// Starts the group `names` (worker i has rank i) in this process through
// rpc::testing::StartGrpcAgents, sharing `registry` and one HashStore, with
// both layers installed into workers[i] (resized to names.size());
// `options` (may be null) gives each worker's other options. The first
// worker's error, if any (the others are still filled in).
absl::Status StartLayeredWorkers(
    const std::vector<std::string>& names,
    std::shared_ptr<rpc::FunctionRegistry> registry,
    const std::function<rpc::GrpcAgentOptions(int rank)>& options,
    std::vector<LayeredWorker>& workers);

}  // namespace ferry::testutil

#endif  // FERRY_TESTS_RREF_LAYERED_WORKER_H_
