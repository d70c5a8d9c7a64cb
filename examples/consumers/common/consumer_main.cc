// A Ferry worker built outside Ferry's tree (CMake, pkg-config or a Bazel
// workspace of its own), run as two processes under ferry_run:
//
//   ferry_run --nproc 2 -- ./consumer
//
// Each worker ("worker0", "worker1") defines typed remote functions, joins
// the group through env:// and, towards the other worker:
//   1. calls add(2, 40 + rank) through its typed handle (expects 42 + rank);
//   2. creates a tensor there with remote() and fetches it (to_here);
//   3. runs one distributed-autograd backward through a remote multiply and
//      checks the gradient that came back (d sum(x * x) / dx = 2x).
// It prints "consumer <name>: ok" and exits 0, or the first error and 1.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "ferry/ferry.h"

namespace {

using ferry::Tensor;

absl::Status Check(bool ok, const std::string& what) {
  return ok ? absl::OkStatus() : absl::InternalError(what);
}

absl::Status Run() {
  int rank = -1;
  const char* env_rank = std::getenv("RANK");
  if (env_rank == nullptr || !absl::SimpleAtoi(env_rank, &rank) ||
      (rank != 0 && rank != 1)) {
    return absl::InvalidArgumentError(
        "RANK must be 0 or 1: run under ferry_run --nproc 2");
  }
  auto registry = std::make_shared<ferry::rpc::FunctionRegistry>();
  ASSIGN_OR_RETURN(auto add, registry->Define("add", [](int64_t a, int64_t b) {
    return a + b;
  }));
  ASSIGN_OR_RETURN(auto filled, registry->Define("filled", [](double v) {
    return ferry::full({2, 3}, v);
  }));
  ASSIGN_OR_RETURN(auto multiply,
                   registry->Define("multiply", [](Tensor a, Tensor b) {
                     return ferry::autograd::mul(a, b);
                   }));

  ferry::WorkerOptions options;
  options.name = absl::StrCat("worker", rank);
  options.registry = registry;
  ASSIGN_OR_RETURN(std::unique_ptr<ferry::Worker> worker,
                   ferry::InitWorker(std::move(options)));
  const std::string peer = absl::StrCat("worker", 1 - rank);

  // 1. A typed call.
  ASSIGN_OR_RETURN(int64_t sum, worker->rpc_sync(peer, add, 2, 40 + rank));
  RETURN_IF_ERROR(Check(sum == 42 + rank, absl::StrCat("add returned ", sum)));

  // 2. remote() + to_here().
  ferry::rref::RRef<Tensor> held = worker->remote(peer, filled, 1.5 + rank);
  ASSIGN_OR_RETURN(Tensor fetched, held.to_here());
  RETURN_IF_ERROR(Check(fetched.numel() == 6 &&
                            ferry::autograd::sum(fetched).item() == 6 * (1.5 + rank),
                        "to_here returned the wrong tensor"));

  // 3. Distributed autograd: loss = sum(x * x) computed on the peer.
  {
    ferry::autograd::dist::ContextScope ctx(worker->dist_autograd());
    Tensor x = ferry::full({3}, 2.0 + rank);
    ferry::autograd::SetRequiresGrad(x);
    ASSIGN_OR_RETURN(Tensor y, worker->rpc_sync(peer, multiply, x, x));
    Tensor loss = ferry::autograd::sum(y);
    RETURN_IF_ERROR(worker->dist_autograd().Backward(ctx.id(), {loss}));
    ASSIGN_OR_RETURN(ferry::autograd::dist::GradientMap grads,
                     worker->dist_autograd().GetGradients(ctx.id()));
    Tensor g = grads.Get(x);
    RETURN_IF_ERROR(Check(g.defined() && g.numel() == 3 &&
                              ferry::autograd::sum(g).item() == 3 * 2 * (2.0 + rank),
                          "backward gave the wrong gradient"));
  }
  // Collective: waits for the peer to finish its calls too.
  RETURN_IF_ERROR(worker->Shutdown());
  std::printf("consumer worker%d: ok (add=%lld, remote tensor fetched, backward done)\n",
              rank, static_cast<long long>(sum));
  return absl::OkStatus();
}

}  // namespace

int main() {
  absl::Status s = Run();
  if (!s.ok()) {
    std::fprintf(stderr, "consumer: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
