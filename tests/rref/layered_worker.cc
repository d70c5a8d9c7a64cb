#include "ferry/tests/rref/layered_worker.h"

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

}  // namespace ferry::testutil
