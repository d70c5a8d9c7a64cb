#include "ferry/tests/rref/layered_worker.h"

#include "ferry/rpc/testing/grpc_cluster.h"

namespace ferry::testutil {

std::function<absl::Status(rpc::Agent&)> InstallLayers(LayeredWorker& w) {
  return [&w](rpc::Agent& agent) -> absl::Status {
    auto rrefs = rref::RRefContext::Install(agent);
    if (!rrefs.ok()) return rrefs.status();
    auto dist = autograd::dist::DistAutogradContainer::Install(agent);
    if (!dist.ok()) return dist.status();
    w.rrefs = *rrefs;
    w.dist = *dist;
    return absl::OkStatus();
  };
}

absl::Status StartLayeredWorkers(
    const std::vector<std::string>& names,
    std::shared_ptr<rpc::FunctionRegistry> registry,
    const std::function<rpc::GrpcAgentOptions(int rank)>& options,
    std::vector<LayeredWorker>& workers) {
  workers.clear();
  workers.resize(names.size());
  std::vector<absl::StatusOr<std::unique_ptr<rpc::GrpcAgent>>> agents =
      rpc::testing::StartGrpcAgents(
          {.names = names,
           .registry = std::move(registry),
           .options =
               [&](int rank) {
                 rpc::GrpcAgentOptions o;
                 if (options) o = options(rank);
                 o.before_serving = InstallLayers(workers[rank]);
                 return o;
               },
           .store = nullptr});
  absl::Status first;
  for (size_t i = 0; i < agents.size(); ++i) {
    if (agents[i].ok()) {
      workers[i].agent = *std::move(agents[i]);
    } else if (first.ok()) {
      first = agents[i].status();
    }
  }
  return first;
}

}  // namespace ferry::testutil
