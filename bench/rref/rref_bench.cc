// Ferry side of the RRef benchmark; bench/rref/run.sh runs it next to
// PyTorch 1.13's TensorPipe agent (torch_rref_bench.py, same figures).
//
//   rref_bench [--seconds=5] [--rounds=5] [--rrefs=10000]
//
// Run plainly it hosts a TcpStore on 127.0.0.1 (port 0) and starts a copy of
// itself as rank 1 ("callee", --role=callee); this process is rank 0
// ("caller") and measures, printing a table and one JSON line per figure:
//   rpc_sync_noop          rpc_sync round trip, no argument (us)
//   remote_to_here_tensor4 remote() of a function returning a 4-float tensor,
//                          then to_here(), then the RRef dropped (us)
//   proxy_rpc_sync_noop    rref.rpc_sync().call("noop") on a remote object (us)
//   remote_to_here_messages requests (by type) per remote()+to_here()+drop,
//                          over 1000 of them, until settled (repeatable)
//   create_drop            N remote() RRefs created and dropped at once, until
//                          the owner has deleted every one (us per RRef), with
//                          the RRef protocol messages counted per RRef
// The latency figures run interleaved in rounds; each reports its best round
// (lowest p50), as torch_rref_bench.py does.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "ferry/bench/util/procs.h"
#include "ferry/bench/util/requests.h"
#include "ferry/rpc/grpc/init.h"
#include "ferry/rref/rref.h"
#include "ferry/tensor/tensor.h"

ABSL_FLAG(std::string, role, "", "internal: callee");
ABSL_FLAG(int, port, 0, "internal: TcpStore port");
ABSL_FLAG(double, seconds, 5.0, "time per latency figure, over all rounds");
ABSL_FLAG(int, rrefs, 10000, "RRefs created and dropped");
ABSL_FLAG(int, delete_flush_delay_us, 2000,
          "RRefContext::Options::delete_flush_delay (0: each deletion is "
          "sent at once, as before piggybacking)");
ABSL_FLAG(int, rounds, 5,
          "interleaved rounds of the latency figures (best round reported)");

namespace ferry {
namespace {

using bench::Die;
using bench::OrDie;
using bench::Stats;

class Acc {
 public:
  explicit Acc(int64_t) {}
  void Noop() {}
};

absl::Status Install(rpc::Agent& agent,
                     std::shared_ptr<rref::RRefContext>* out) {
  rref::RRefContext::Options o;
  o.delete_flush_delay =
      absl::Microseconds(absl::GetFlag(FLAGS_delete_flush_delay_us));
  auto ctx = rref::RRefContext::Install(agent, o);
  if (!ctx.ok()) return ctx.status();
  (*ctx)->classes().RegisterClass<Acc>("Acc").Constructor<int64_t>().Method(
      "noop", &Acc::Noop);
  if (auto s = agent.Register("noop", [] {}); !s.ok()) return s;
  if (auto s = agent.Register("tensor4", [] { return full({4}, 1.5); });
      !s.ok()) {
    return s;
  }
  if (auto s = agent.Register("one", [] { return int64_t{1}; }); !s.ok()) {
    return s;
  }
  *out = *ctx;
  return absl::OkStatus();
}

rpc::GrpcAgentOptions Options(std::shared_ptr<rref::RRefContext>* ctx) {
  rpc::GrpcAgentOptions o;
  o.rpc_timeout = absl::Minutes(5);
  o.join_timeout = absl::Minutes(2);
  o.before_serving = [ctx](rpc::Agent& a) { return Install(a, ctx); };
  return o;
}

void Report(const std::string& name, const Stats& s) {
  std::printf("%-24s mean %8.1f us  p50 %8.1f us  p99 %8.1f us  (%zu iters)\n",
              name.c_str(), s.mean, s.p50, s.p99, s.iters);
  std::printf(
      "{\"bench\": \"rref\", \"impl\": \"ferry\", \"name\": \"%s\", "
      "\"mean_us\": %.2f, "
      "\"p50_us\": %.2f, \"p99_us\": %.2f, \"iters\": %zu}\n",
      name.c_str(), s.mean, s.p50, s.p99, s.iters);
}

int RunCallee(int port) {
  std::shared_ptr<rref::RRefContext> ctx;
  setenv("FERRY_USE_AGENT_STORE", "1", 1);
  auto agent =
      OrDie(rpc::InitRpc("callee", absl::StrCat("tcp://127.0.0.1:", port), 1, 2,
                         Options(&ctx)),
            "callee init");
  OrDie(ctx->Shutdown(absl::Minutes(5)), "callee shutdown");
  return 0;
}

void CountRemoteToHereMessages(rpc::Agent& agent, rref::RRefContext& ctx) {
  std::shared_ptr<bench::RequestCounter> counter =
      bench::RequestCounter::Install(agent);
  constexpr int kOps = 1000;
  for (int i = 0; i < kOps; ++i) {
    auto r = rref::remote<Tensor>(ctx, "callee", "tensor4");
    OrDie(r.to_here(absl::Seconds(60)).status(), "to_here");
  }
  OrDie(ctx.AwaitSettled(absl::Seconds(60)), "settle");
  bench::PrintRequests("rref", "remote_to_here_messages", "op", {},
                       counter->Snapshot(), kOps);
}

int RunCaller(int port) {
  std::shared_ptr<rref::RRefContext> ctx;
  setenv("FERRY_USE_AGENT_STORE", "1", 1);
  auto agent =
      OrDie(rpc::InitRpc("caller", absl::StrCat("tcp://127.0.0.1:", port), 0, 2,
                         Options(&ctx)),
            "caller init");
  const double secs = absl::GetFlag(FLAGS_seconds);
  auto acc = rref::remote<Acc>(*ctx, "callee", "Acc", 0);
  const std::vector<std::string> names = {
      "rpc_sync_noop", "remote_to_here_tensor4", "proxy_rpc_sync_noop"};
  const std::vector<Stats> stats = bench::InterleavedBest(
      {[&] { OrDie(agent->rpc_sync<void>("callee", "noop"), "noop"); },
       [&] {
         auto r = rref::remote<Tensor>(*ctx, "callee", "tensor4");
         OrDie(r.to_here(absl::Seconds(60)).status(), "to_here");
       },
       [&] {
         OrDie(acc.rpc_sync(absl::Seconds(60)).call<void>("noop"), "proxy");
       }},
      secs, absl::GetFlag(FLAGS_rounds));
  for (size_t i = 0; i < names.size(); ++i) Report(names[i], stats[i]);
  acc = rref::RRef<Acc>();
  OrDie(ctx->AwaitSettled(absl::Seconds(60)), "settle");
  CountRemoteToHereMessages(*agent, *ctx);

  const int n = absl::GetFlag(FLAGS_rrefs);
  const auto before = ctx->messages_sent();
  const absl::Time t0 = absl::Now();
  for (int i = 0; i < n; ++i) {
    rref::remote<int64_t>(*ctx, "callee", "one");  // Dropped at once.
  }
  OrDie(ctx->AwaitSettled(absl::Minutes(5)), "settle after create/drop");
  const double us = absl::ToDoubleMicroseconds(absl::Now() - t0) / n;
  int messages = 0;
  for (const auto& [type, count] : ctx->messages_sent()) {
    auto it = before.find(type);
    messages += count - (it == before.end() ? 0 : it->second);
  }
  std::printf(
      "%-24s %8.1f us per RRef, %.2f protocol messages per RRef "
      "(each a request + reply), %d RRefs\n",
      "create_drop", us, static_cast<double>(messages) / n, n);
  std::printf(
      "{\"bench\": \"rref\", \"impl\": \"ferry\", \"name\": \"create_drop\", "
      "\"us_per_rref\": %.2f, "
      "\"messages_per_rref\": %.2f, \"rrefs\": %d}\n",
      us, static_cast<double>(messages) / n, n);
  OrDie(ctx->Shutdown(absl::Minutes(5)), "caller shutdown (leak check)");
  return 0;
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string role = absl::GetFlag(FLAGS_role);
  if (role == "callee") return ferry::RunCallee(absl::GetFlag(FLAGS_port));
  return ferry::bench::LaunchRanks(
      {{"--role=callee",
        absl::StrCat("--seconds=", absl::GetFlag(FLAGS_seconds))}},
      ferry::RunCaller);
}
