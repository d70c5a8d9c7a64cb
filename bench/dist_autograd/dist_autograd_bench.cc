// Ferry side of the distributed-autograd benchmark; bench/dist_autograd/run.sh
// runs it next to PyTorch 1.13 (torch_dist_autograd_bench.py, same figures).
//
//   dist_autograd_bench [--steps=200] [--ps_steps=300] [--batch=64]
//
// Two jobs, each in its own processes meeting through a TcpStore:
//  step  (2 ranks): a trainer whose Linear 64->64 lives on "ps". Per step:
//        a distributed autograd context, forward through an RPC, MSE loss
//        here, distributed backward with the DistributedOptimizer's (SGD)
//        step fused into it (BackwardOptions::fused_optimizer), the context
//        released in the background (its release rides on the next step's
//        forward). Also: requests sent per step by type, and each phase's
//        median; and the same with the step as its own round trip
//        (dist_step_separate_step, PyTorch's protocol). Beside it: the same
//        model's local step and the rpc_sync no-op round trip.
//        Reported: p50 per step and the overhead (distributed - local).
//        Last, the server's handler cost: 1024 no-op calls, 1024 echoes of
//        the forward's input (its payloads without autograd) and 1024 fused
//        steps (the admin stats' window per function), then the server's
//        p50 per function from its agent's stats (GrpcAgent::stats(), what
//        the admin service's GetStats shows: from the request's arrival in
//        the gRPC handler to its reply encoded), beside the round trips and
//        the forward function's own body (timed inside it).
//  ps    (4 ranks): 2 trainers, 2 parameter servers (ps0: Linear 64->64,
//        ps1: Linear 64->10); each trainer steps asynchronously through both
//        (relu between, MSE loss); reported: samples/s of both trainers.
// Prints a table and one JSON line per figure.
#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "ferry/autograd/dist/dist_autograd.h"
#include "ferry/autograd/engine.h"
#include "ferry/autograd/nn.h"
#include "ferry/autograd/ops.h"
#include "ferry/bench/util/procs.h"
#include "ferry/bench/util/requests.h"
#include "ferry/optim/distributed_optimizer.h"
#include "ferry/optim/optim.h"
#include "ferry/rpc/grpc/agent.h"
#include "ferry/rpc/grpc/init.h"
#include "ferry/rref/rref.h"
#include "ferry/tensor/tensor.h"

ABSL_FLAG(std::string, job, "", "internal: step or ps");
ABSL_FLAG(int, rank, 0, "internal: this process's rank");
ABSL_FLAG(int, port, 0, "internal: TcpStore port");
ABSL_FLAG(int, steps, 200, "timed steps of the step-overhead job");
ABSL_FLAG(int, ps_steps, 300, "steps per trainer of the parameter-server job");
ABSL_FLAG(int, batch, 64, "batch size");

namespace ferry {
namespace {

using bench::Die;
using bench::OrDie;
using bench::Stats;
using rref::RRef;
constexpr int kDim = 64;
constexpr double kLr = 0.01;
constexpr absl::Duration kLong = absl::Minutes(5);

// One process's state; written before serving, read by handlers.
struct Worker {
  rpc::Agent* agent = nullptr;
  std::shared_ptr<autograd::dist::DistAutogradContainer> dist;
  std::shared_ptr<rref::RRefContext> rrefs;
  std::shared_ptr<optim::DistOptimizerService> optimizers;
  std::shared_ptr<nn::Linear> model;  // Servers only.
  Mutex mu;
  std::vector<double> reports ABSL_GUARDED_BY(mu);  // trainer0: rates.
  std::shared_ptr<bench::RequestCounter> requests;
  // Per-phase times of the step job's distributed steps (us).
  std::map<std::string, std::vector<double>> phases ABSL_GUARDED_BY(mu);
  // Servers: the forward function's body per call (us).
  std::vector<double> forward_body ABSL_GUARDED_BY(mu);
};

std::vector<std::string> Names(const std::string& job) {
  if (job == "step") return {"trainer", "ps"};
  return {"trainer0", "trainer1", "ps0", "ps1"};
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

absl::Status Serve(const std::shared_ptr<Worker>& w, rpc::Agent& agent) {
  w->agent = &agent;
  w->requests = bench::RequestCounter::Install(agent);
  ASSIGN_OR_RETURN(w->dist,
                   autograd::dist::DistAutogradContainer::Install(agent));
  ASSIGN_OR_RETURN(w->rrefs, rref::RRefContext::Install(agent));
  ASSIGN_OR_RETURN(w->optimizers,
                   optim::DistOptimizerService::Install(
                       agent, {.param_mutex = nullptr, .dist = w->dist}));
  RETURN_IF_ERROR(agent.Register("noop", [] {}));
  // The forward's payloads (a batch x 64 tensor each way) without autograd.
  RETURN_IF_ERROR(agent.Register("echo", [](Tensor x) { return x; }));
  RETURN_IF_ERROR(
      agent.Register("forward", [w](Tensor x) -> absl::StatusOr<Tensor> {
        if (w->model == nullptr)
          return absl::FailedPreconditionError("no model");
        // Through copies of the parameters (x1.0, differentiable): with
        // two trainers stepping asynchronously, another trainer's optimizer
        // step would otherwise bump the version of a weight this pass saved,
        // and backward refuses it. Gradients still reach the parameters
        // (hogwild); torch_dist_autograd_bench.py does the same.
        const absl::Time t0 = absl::Now();
        const Tensor weight = autograd::mul(w->model->weight(), 1.0);
        Tensor y = autograd::add(
            autograd::matmul(x, autograd::transpose(weight, 0, 1)),
            autograd::mul(w->model->bias(), 1.0));
        const double us = absl::ToDoubleMicroseconds(absl::Now() - t0);
        MutexLock lock(&w->mu);
        w->forward_body.push_back(us);
        return y;
      }));
  // The server's handler p50 (us) of "noop", "forward", BACKWARD and "echo"
  // from its agent's stats, and the forward body's p50 over its last 1024
  // calls; 0 for a figure without calls.
  auto* grpc_agent = dynamic_cast<rpc::GrpcAgent*>(&agent);
  RETURN_IF_ERROR(
      agent.Register("handler_stats", [w, grpc_agent]() -> std::vector<double> {
        std::vector<double> out;
        const auto snapshot = grpc_agent == nullptr
                                  ? admin::v1::GetStatsResponse()
                                  : grpc_agent->stats().Snapshot();
        for (const char* key : {"noop", "forward", "BACKWARD", "echo"}) {
          double p50 = 0;
          for (const auto& f : snapshot.functions()) {
            if (f.function() == key) p50 = f.latency_in_p50_us();
          }
          out.push_back(p50);
        }
        MutexLock lock(&w->mu);
        const size_t n = std::min<size_t>(w->forward_body.size(), 1024);
        out.push_back(Median(std::vector<double>(w->forward_body.end() - n,
                                                 w->forward_body.end())));
        return out;
      }));
  RETURN_IF_ERROR(agent.Register("param_rrefs", [w] {
    std::vector<RRef<Tensor>> out;
    if (w->model == nullptr) return out;
    for (const Tensor& p : w->model->parameters()) {
      out.push_back(rref::MakeLocalRRef<Tensor>(*w->rrefs, p));
    }
    return out;
  }));
  return agent.Register("report", [w](double samples_per_s) {
    MutexLock lock(&w->mu);
    w->reports.push_back(samples_per_s);
  });
}

// A distributed SGD step through `servers` in order (relu between).
// With `phases`, records each phase's time in w.phases.
// With `fused`, the optimizer step runs inside the backward pass.
std::function<void()> DistStep(Worker& w, optim::DistributedOptimizer& opt,
                               std::vector<std::string> servers,
                               const Tensor& x, const Tensor& target,
                               bool fused, bool phases = false) {
  return [&w, &opt, servers, x, target, fused, phases] {
    absl::Time t = absl::Now();
    std::vector<std::pair<const char*, double>> times;
    auto lap = [&](const char* name) {
      if (!phases) return;
      const absl::Time now = absl::Now();
      times.emplace_back(name, absl::ToDoubleMicroseconds(now - t));
      t = now;
    };
    {
      // Like PyTorch's `with dist_autograd.context()`, whose exit does not
      // wait for the release (here it rides on the next request).
      autograd::dist::ContextScope ctx(
          *w.dist, autograd::dist::ContextScope::OnExit::kReleaseInBackground);
      Tensor h = x;
      for (size_t i = 0; i < servers.size(); ++i) {
        if (i > 0) h = autograd::relu(h);
        h = OrDie(w.agent->rpc_sync<Tensor>(servers[i], "forward", h),
                  "forward");
      }
      Tensor loss = autograd::mse_loss(h, target);
      lap("forward");
      autograd::dist::BackwardOptions options;
      if (fused) options.fused_optimizer = &opt;
      OrDie(w.dist->Backward(ctx.id(), {loss}, options),
            "distributed backward");
      lap("backward");
      if (!fused) OrDie(opt.Step(ctx.id()), "optimizer step");
      lap("optimizer_step");
    }
    lap("release");
    if (!phases) return;
    MutexLock lock(&w.mu);
    for (const auto& [name, us] : times) w.phases[name].push_back(us);
  };
}

std::unique_ptr<optim::DistributedOptimizer> MakeOptimizer(
    Worker& w, const std::vector<std::string>& servers) {
  std::vector<RRef<Tensor>> params;
  for (const std::string& s : servers) {
    auto p =
        OrDie(w.agent->rpc_sync<std::vector<RRef<Tensor>>>(s, "param_rrefs"),
              "param_rrefs from " + s);
    params.insert(params.end(), p.begin(), p.end());
  }
  optim::SgdOptions sgd;
  sgd.lr = kLr;
  return OrDie(
      optim::DistributedOptimizer::Create(*w.agent, sgd, params, kLong),
      "DistributedOptimizer");
}

void Report(const std::string& name, const Stats& s) {
  std::printf("%-22s p50 %9.1f us  mean %9.1f us  p99 %9.1f us  (%zu steps)\n",
              name.c_str(), s.p50, s.mean, s.p99, s.iters);
  std::printf(
      "{\"bench\": \"dist_autograd\", \"impl\": \"ferry\", \"name\": \"%s\", "
      "\"p50_us\": %.2f, \"mean_us\": %.2f, \"p99_us\": %.2f, \"iters\": "
      "%zu}\n",
      name.c_str(), s.p50, s.mean, s.p99, s.iters);
}

void Figure(const char* name, double p50, const char* what) {
  std::printf("  %-32s p50 %9.1f us  %s\n", name, p50, what);
  std::printf(
      "{\"bench\": \"dist_autograd\", \"impl\": \"ferry\", \"name\": "
      "\"%s\", \"p50_us\": %.2f}\n",
      name, p50);
}

// The server's handler cost next to a no-op round trip: kCalls no-op calls,
// echoes and fused steps, so that the agent's stats window (the last 1024
// calls per function) holds only these, then the server's p50s.
void ServerHandlerCost(Worker& w, optim::DistributedOptimizer& opt,
                       const Tensor& x, const Tensor& target) {
  constexpr size_t kCalls = 1024;
  const Stats noop = bench::TimeIters(
      [&] { OrDie(w.agent->rpc_sync<void>("ps", "noop"), "noop"); }, kCalls);
  const Stats echo = bench::TimeIters(
      [&] { OrDie(w.agent->rpc_sync<Tensor>("ps", "echo", x), "echo"); },
      kCalls);
  bench::TimeIters(DistStep(w, opt, {"ps"}, x, target, /*fused=*/true), kCalls);
  const std::vector<double> s =
      OrDie(w.agent->rpc_sync<std::vector<double>>("ps", "handler_stats"),
            "handler_stats");
  if (s.size() != 5) Die("handler_stats: 5 figures expected");
  std::printf("server handlers, p50 over the last %zu calls each:\n", kCalls);
  Figure("noop_rtt", noop.p50, "(trainer: rpc_sync no-op round trip)");
  Figure("echo_rtt", echo.p50,
         "(trainer: rpc_sync of the forward's input, returned)");
  Figure("server_noop_handler", s[0], "(server: arrival to reply encoded)");
  Figure("server_echo_handler", s[3],
         "(server: the forward's payloads, no autograd)");
  Figure("server_forward_handler", s[1], "(server: CALL forward)");
  Figure("server_forward_body", s[4],
         "(server: the forward function's body, matmul + add)");
  Figure("server_backward_handler", s[2], "(server: BACKWARD, SGD step fused)");
  Figure("server_forward_over_echo", s[1] - s[3] - s[4],
         "(forward - echo handler - forward body: dist autograd, release)");
  Figure("server_forward_over_noop", s[1] - s[0], "(forward - noop handler)");
  Figure("server_backward_over_noop", s[2] - s[0], "(backward - noop handler)");
}

void StepJob(Worker& w) {
  const int batch = absl::GetFlag(FLAGS_batch);
  const size_t steps = absl::GetFlag(FLAGS_steps);
  const Tensor x = randn({batch, kDim}, 7);
  const Tensor target = randn({batch, kDim}, 8);
  Report("rpc_sync_noop",
         bench::TimeIters(
             [&] { OrDie(w.agent->rpc_sync<void>("ps", "noop"), "noop"); },
             steps));
  nn::Linear local(kDim, kDim, /*seed=*/1);
  optim::SgdOptions o;
  o.lr = kLr;
  optim::SGD sgd(local.parameters(), o);
  const Stats l = bench::TimeIters(
      [&] {
        sgd.ZeroGrad();
        Tensor loss = autograd::mse_loss(local.Forward(x), target);
        OrDie(autograd::Backward({loss}), "local backward");
        OrDie(sgd.Step(), "local step");
      },
      steps);
  Report("local_step", l);
  std::unique_ptr<optim::DistributedOptimizer> opt = MakeOptimizer(w, {"ps"});
  Stats dist;
  for (const bool fused : {false, true}) {
    const std::string name = fused ? "dist_step" : "dist_step_separate_step";
    const auto before = w.requests->Snapshot();
    const Stats d =
        bench::TimeIters(DistStep(w, *opt, {"ps"}, x, target, fused), steps);
    Report(name, d);
    bench::PrintRequests("dist_autograd", name + "_messages", "step", before,
                         w.requests->Snapshot(), steps + 10);  // + warm-up.
    if (fused) dist = d;
  }
  bench::TimeIters(
      DistStep(w, *opt, {"ps"}, x, target, /*fused=*/true, /*phases=*/true),
      steps, 0);
  {
    MutexLock lock(&w.mu);
    for (const char* phase :
         {"forward", "backward", "optimizer_step", "release"}) {
      const double p50 = Median(w.phases[phase]);
      std::printf("  phase %-16s p50 %9.1f us\n", phase, p50);
      std::printf(
          "{\"bench\": \"dist_autograd\", \"impl\": \"ferry\", "
          "\"name\": \"phase_%s\", \"p50_us\": %.2f}\n",
          phase, p50);
    }
  }
  const Stats& d = dist;
  std::printf("%-22s p50 %9.1f us\n", "dist_step_overhead", d.p50 - l.p50);
  std::printf(
      "{\"bench\": \"dist_autograd\", \"impl\": \"ferry\", \"name\": "
      "\"dist_step_overhead\", \"p50_us\": %.2f}\n",
      d.p50 - l.p50);
  ServerHandlerCost(w, *opt, x, target);
  opt.reset();
}

void PsJob(Worker& w, int rank) {
  const int batch = absl::GetFlag(FLAGS_batch);
  const int steps = absl::GetFlag(FLAGS_ps_steps);
  const Tensor x = randn({batch, kDim}, 100 + rank);
  const Tensor target = randn({batch, 10}, 200 + rank);
  std::unique_ptr<optim::DistributedOptimizer> opt =
      MakeOptimizer(w, {"ps0", "ps1"});
  std::function<void()> step =
      DistStep(w, *opt, {"ps0", "ps1"}, x, target, /*fused=*/true);
  for (int i = 0; i < 10; ++i) step();
  const absl::Time t0 = absl::Now();
  for (int i = 0; i < steps; ++i) step();
  const double rate = steps * batch / absl::ToDoubleSeconds(absl::Now() - t0);
  opt.reset();
  if (rank != 0) {
    OrDie(w.agent->rpc_sync<void>("trainer0", "report", rate), "report");
    return;
  }
  std::vector<double> rates = {rate};
  {
    MutexLock lock(&w.mu);
    auto both = [&w]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(w.mu) {
      return !w.reports.empty();
    };
    if (!w.mu.AwaitWithTimeout(absl::Condition(&both), kLong)) {
      Die("trainer1 did not report its rate");
    }
    rates.push_back(w.reports[0]);
  }
  std::printf(
      "%-22s %9.0f samples/s (trainer0 %.0f + trainer1 %.0f; batch %d, "
      "%d steps each)\n",
      "ps_throughput", rates[0] + rates[1], rates[0], rates[1], batch, steps);
  std::printf(
      "{\"bench\": \"dist_autograd\", \"impl\": \"ferry\", \"name\": "
      "\"ps_throughput\", \"samples_per_s\": %.1f, \"trainers\": 2, "
      "\"servers\": 2, \"batch\": %d, \"steps\": %d}\n",
      rates[0] + rates[1], batch, steps);
}

int RunRank(const std::string& job, int rank, int port) {
  const std::vector<std::string> names = Names(job);
  auto w = std::make_shared<Worker>();
  const std::string& name = names[rank];
  if (name == "ps" || name == "ps0") {
    w->model = std::make_shared<nn::Linear>(kDim, kDim, /*seed=*/1);
  } else if (name == "ps1") {
    w->model = std::make_shared<nn::Linear>(kDim, 10, /*seed=*/2);
  }
  setenv("FERRY_USE_AGENT_STORE", "1", 1);
  rpc::GrpcAgentOptions o;
  o.rpc_timeout = kLong;
  o.join_timeout = absl::Minutes(2);
  o.before_serving = [w](rpc::Agent& a) { return Serve(w, a); };
  auto agent = OrDie(rpc::InitRpc(name, absl::StrCat("tcp://127.0.0.1:", port),
                                  rank, static_cast<int>(names.size()), o),
                     name + " init");
  if (name == "trainer") StepJob(*w);
  if (name == "trainer0" || name == "trainer1") PsJob(*w, rank);
  OrDie(w->rrefs->Shutdown(kLong), name + " shutdown");
  return 0;
}

int LaunchJob(const std::string& job) {
  std::vector<std::vector<std::string>> children;
  for (size_t r = 1; r < Names(job).size(); ++r) {
    children.push_back(
        {absl::StrCat("--job=", job), absl::StrCat("--rank=", r),
         absl::StrCat("--batch=", absl::GetFlag(FLAGS_batch)),
         absl::StrCat("--steps=", absl::GetFlag(FLAGS_steps)),
         absl::StrCat("--ps_steps=", absl::GetFlag(FLAGS_ps_steps))});
  }
  return bench::LaunchRanks(children,
                            [&](int port) { return RunRank(job, 0, port); });
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string job = absl::GetFlag(FLAGS_job);
  if (!job.empty()) {
    return ferry::RunRank(job, absl::GetFlag(FLAGS_rank),
                          absl::GetFlag(FLAGS_port));
  }
  int rc = ferry::LaunchJob("step");
  if (rc == 0) rc = ferry::LaunchJob("ps");
  return rc;
}
