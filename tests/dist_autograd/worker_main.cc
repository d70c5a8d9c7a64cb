// Worker process of the multi-process distributed-autograd test (ranks 1
// and 2; see model.h): joins through env://, installs distributed autograd
// before serving, serves its layer plus "grad" and "num_contexts" for the
// test's checks, then meets the others in a graceful shutdown.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "ferry/autograd/dist/dist_autograd.h"
#include "ferry/optim/distributed_optimizer.h"
#include "ferry/rpc/grpc/init.h"
#include "ferry/rref/rref.h"
#include "ferry/tests/dist_autograd/model.h"

namespace ferry::dist_autograd_test {
namespace {

// Written by before_serving, before any handler can run.
struct Worker {
  rpc::Agent* agent = nullptr;
  std::shared_ptr<autograd::dist::DistAutogradContainer> dist;
  std::shared_ptr<rref::RRefContext> rrefs;
  std::shared_ptr<optim::DistOptimizerService> optimizers;
  Tensor weight;
};

absl::Status RegisterFunctions(int rank, std::shared_ptr<Worker> w,
                               rpc::FunctionRegistry& registry) {
  if (rank == 1) {
    RETURN_IF_ERROR(
        registry.Register("layer1", [w](Tensor h) -> absl::StatusOr<Tensor> {
          Tensor s = autograd::sigmoid(autograd::matmul(h, w->weight));
          absl::StatusOr<Tensor> r =
              w->agent->rpc_sync<Tensor>("worker2", "layer2", s);
          if (!r.ok()) return r.status();
          return autograd::tanh(*r);
        }));
  } else {
    RETURN_IF_ERROR(registry.Register(
        "layer2", [w](Tensor s) { return autograd::matmul(s, w->weight); }));
  }
  RETURN_IF_ERROR(
      registry.Register("grad", [w](int64_t context) -> absl::StatusOr<Tensor> {
        auto grads = w->dist->GetGradients(
            GlobalId::FromValue(static_cast<uint64_t>(context)));
        if (!grads.ok()) return grads.status();
        Tensor g = grads->Get(w->weight);
        if (!g.defined()) return absl::NotFoundError("no gradient");
        return g;
      }));
  // The weight as an RRef (for the DistributedOptimizer) and its value.
  RETURN_IF_ERROR(registry.Register("param_rref", [w] {
    return rref::MakeLocalRRef<Tensor>(*w->rrefs, w->weight);
  }));
  RETURN_IF_ERROR(registry.Register(
      "weight", [w] { return autograd::Detach(w->weight).clone(); }));
  return registry.Register("num_contexts", [w] {
    return static_cast<int64_t>(w->dist->NumContexts());
  });
}

int Main() {
  const int rank = std::atoi(std::getenv("RANK"));
  auto w = std::make_shared<Worker>();
  w->weight = Leaf(rank);
  auto registry = std::make_shared<rpc::FunctionRegistry>();
  absl::Status registered = RegisterFunctions(rank, w, *registry);
  if (!registered.ok()) {
    std::fprintf(stderr, "worker%d: %s\n", rank, registered.ToString().c_str());
    return 2;
  }
  rpc::GrpcAgentOptions options;
  options.join_timeout = absl::Seconds(60);
  options.before_serving = [w](rpc::Agent& agent) -> absl::Status {
    w->agent = &agent;
    ASSIGN_OR_RETURN(w->dist,
                     autograd::dist::DistAutogradContainer::Install(agent));
    ASSIGN_OR_RETURN(w->rrefs, rref::RRefContext::Install(agent));
    ASSIGN_OR_RETURN(w->optimizers,
                     optim::DistOptimizerService::Install(
                         agent, {.param_mutex = nullptr, .dist = w->dist}));
    return absl::OkStatus();
  };
  auto agent = rpc::InitRpc(absl::StrCat("worker", rank), "env://", -1, -1,
                            options, registry);
  if (!agent.ok()) {
    std::fprintf(stderr, "worker%d: %s\n", rank,
                 agent.status().ToString().c_str());
    return 1;
  }
  absl::Status down = w->rrefs->Shutdown(absl::Seconds(120));
  if (!down.ok()) {
    std::fprintf(stderr, "worker%d shutdown: %s\n", rank,
                 down.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace ferry::dist_autograd_test

int main() { return ferry::dist_autograd_test::Main(); }
