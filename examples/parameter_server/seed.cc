// The seed example of distributed autograd, line for line in C++ (PyTorch's
// "Distributed Autograd" overview: node A trains a Net that lives on node B).
//
//   ferry_run --nproc 2 -- seed [--iterations=30]
//
// Rank 1 is node "B": it only serves (the Net's methods, its parameters as
// RRefs, the optimizer's owner side). Rank 0 is node "A":
//
//   net = remote("B", Net)                       RRef<Net>
//   param_rrefs = parameter_rrefs(net)           RRefs to B's tensors
//   opt = DistributedOptimizer(SGD, param_rrefs, lr)
//   for each iteration:
//     with dist_autograd.context() as ctx:
//       y = net.rpc_sync().forward(x)            runs on B
//       loss = mse(y, target)                    on A
//       dist_autograd.backward(ctx, [loss])      reaches B's parameters
//       opt.step(ctx)                            updates them on B
//
// A prints the loss of every iteration and exits 1 unless the last loss is
// below half the first.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "ferry/ferry.h"
#include "ferry/store.h"

ABSL_FLAG(int, iterations, 30, "training iterations on node A");
ABSL_FLAG(double, lr, 0.05, "SGD learning rate");

namespace ferry::ps_example {
namespace {

using autograd::dist::ContextScope;
using rref::RRef;

constexpr int64_t kIn = 4, kHidden = 16, kBatch = 32;

// The model that lives on B: Linear(4, 16) -> tanh -> Linear(16, 1).
class Net {
 public:
  explicit Net(int64_t seed)
      : fc1_(kIn, kHidden, seed), fc2_(kHidden, 1, seed + 2) {}
  Tensor Forward(Tensor x) {
    return fc2_.Forward(autograd::tanh(fc1_.Forward(x)));
  }
  std::vector<Tensor> parameters() const {
    std::vector<Tensor> p = fc1_.parameters();
    for (const Tensor& t : fc2_.parameters()) p.push_back(t);
    return p;
  }

 private:
  nn::Linear fc1_, fc2_;
};

absl::Status RegisterNet(Worker& w) {
  w.rrefs()
      .classes()
      .RegisterClass<Net>("Net")
      .Constructor<int64_t>()
      .Method("forward", &Net::Forward)
      .Serialized();
  return absl::OkStatus();
}

// On B: RRefs to the parameters of the Net behind `net`.
// parameter_rrefs(net) -> RRefs to net's parameters, a typed remote function.
const rpc::RemoteFunction<std::vector<RRef<Tensor>>(RRef<Net>)> kParameterRRefs(
    "parameter_rrefs");

absl::StatusOr<std::vector<RRef<Tensor>>> ParameterRRefs(Worker& w,
                                                         RRef<Net> net) {
  ASSIGN_OR_RETURN(std::shared_ptr<Net> model, net.local_value());
  std::vector<RRef<Tensor>> out;
  for (const Tensor& p : model->parameters()) {
    out.push_back(rref::MakeLocalRRef<Tensor>(w.rrefs(), p));
  }
  return out;
}

absl::Status Train(Worker& w) {
  // net = rpc.remote("B", Net)
  RRef<Net> net = w.remote<Net>("B", "Net", int64_t{1});
  // param_rrefs = net's parameters, as RRefs
  ASSIGN_OR_RETURN(std::vector<RRef<Tensor>> param_rrefs,
                   w.rpc_sync("B", kParameterRRefs, net));
  // opt = DistributedOptimizer(optim.SGD, param_rrefs, lr=...)
  ASSIGN_OR_RETURN(
      std::unique_ptr<optim::DistributedOptimizer> opt,
      optim::DistributedOptimizer::Create(
          w.agent(), optim::SgdOptions{.lr = absl::GetFlag(FLAGS_lr)},
          param_rrefs));
  // A fixed regression task: target = x @ w_true.
  const Tensor x = randn({kBatch, kIn}, 3);
  const Tensor target = x.matmul(randn({kIn, 1}, 4));
  double first = 0, last = 0;
  const int iterations = absl::GetFlag(FLAGS_iterations);
  for (int it = 1; it <= iterations; ++it) {
    // with dist_autograd.context() as context_id
    ContextScope ctx(w.dist_autograd());
    ASSIGN_OR_RETURN(Tensor y, net.rpc_sync().call<Tensor>("forward", x));
    Tensor loss = autograd::mse_loss(y, target);
    RETURN_IF_ERROR(w.dist_autograd().Backward(ctx.id(), {loss}));
    RETURN_IF_ERROR(opt->Step(ctx.id()));
    last = loss.item();
    if (it == 1) first = last;
    std::printf("iteration %d loss %.6f\n", it, last);
  }
  if (!(last < 0.5 * first)) {
    return absl::InternalError(
        absl::StrCat("the loss did not fall: first ", first, ", last ", last));
  }
  std::printf("loss fell from %.6f to %.6f\n", first, last);
  return absl::OkStatus();
}

absl::Status Run() {
  // Rank and world size as env:// reads them (ferry_run, mpirun, srun).
  ASSIGN_OR_RETURN(InitMethod launch, ParseInitMethod("env://"));
  const int rank = launch.rank.value_or(-1);
  if (launch.world_size.value_or(-1) != 2) {
    return absl::InvalidArgumentError(
        "run with 2 processes (ferry_run --nproc 2): rank 0 is node A, 1 is B");
  }
  Worker* self = nullptr;  // Set before the worker serves.
  auto registry = std::make_shared<rpc::FunctionRegistry>();
  RETURN_IF_ERROR(registry->Register(
      kParameterRRefs,
      [&self](RRef<Net> net) { return ParameterRRefs(*self, net); },
      "RRefs to the parameters of a Net this worker owns"));
  WorkerOptions options;
  options.name = rank == 0 ? "A" : "B";
  options.registry = registry;
  options.before_serving = [&self](Worker& w) {
    self = &w;
    return RegisterNet(w);
  };
  ASSIGN_OR_RETURN(std::unique_ptr<Worker> w, InitWorker(std::move(options)));
  absl::Status trained = rank == 0 ? Train(*w) : absl::OkStatus();
  // Node B waits here, serving, until A is done too.
  absl::Status left = w->Shutdown(absl::Seconds(300));
  RETURN_IF_ERROR(trained);
  return left;
}

}  // namespace
}  // namespace ferry::ps_example

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  absl::ParseCommandLine(argc, argv);
  absl::Status s = ferry::ps_example::Run();
  if (!s.ok()) {
    std::fprintf(stderr, "seed: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
