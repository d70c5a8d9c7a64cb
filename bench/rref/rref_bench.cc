// Ferry side of the RRef benchmark; bench/rref/run.sh runs it next to
// PyTorch 1.13's TensorPipe agent (torch_rref_bench.py, same figures).
//
//   rref_bench [--seconds=N] [--rrefs=10000]
//
// Run plainly it hosts a TcpStore on 127.0.0.1 (port 0) and starts a copy of
// itself as rank 1 ("callee", --role=callee); this process is rank 0
// ("caller") and measures, printing a table and one JSON line per figure:
//   rpc_sync_noop          rpc_sync round trip, no argument (us)
//   remote_to_here_tensor4 remote() of a function returning a 4-float tensor,
//                          then to_here(), then the RRef dropped (us)
//   proxy_rpc_sync_noop    rref.rpc_sync().call("noop") on a remote object (us)
//   create_drop            N remote() RRefs created and dropped at once, until
//                          the owner has deleted every one (us per RRef), with
//                          the RRef protocol messages counted per RRef
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "rpc/grpc/init.h"
#include "rref/rref.h"
#include "store/tcp_store_server.h"
#include "tensor/tensor.h"

extern char** environ;

ABSL_FLAG(std::string, role, "", "internal: callee");
ABSL_FLAG(int, port, 0, "internal: TcpStore port");
ABSL_FLAG(double, seconds, 2.0, "time per latency figure");
ABSL_FLAG(int, rrefs, 10000, "RRefs created and dropped");

namespace ferry {
namespace {

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "rref_bench: %s\n", what.c_str());
  std::exit(1);
}
template <typename T>
T OrDie(absl::StatusOr<T> v, const std::string& what) {
  if (!v.ok()) Die(what + ": " + v.status().ToString());
  return *std::move(v);
}
void OrDie(const absl::Status& s, const std::string& what) {
  if (!s.ok()) Die(what + ": " + s.ToString());
}

class Acc {
 public:
  explicit Acc(int64_t) {}
  void Noop() {}
};

absl::Status Install(rpc::Agent& agent,
                     std::shared_ptr<rref::RRefContext>* out) {
  auto ctx = rref::RRefContext::Create(&agent);
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

struct Stats {
  double mean = 0, p50 = 0, p99 = 0;
  size_t iters = 0;
};

template <typename F>
Stats TimeLoop(F op, double seconds) {
  for (int i = 0; i < 50; ++i) op();
  std::vector<double> us;
  const absl::Time end = absl::Now() + absl::Seconds(seconds);
  while (absl::Now() < end && us.size() < 200000) {
    const absl::Time t0 = absl::Now();
    op();
    us.push_back(absl::ToDoubleMicroseconds(absl::Now() - t0));
  }
  std::sort(us.begin(), us.end());
  Stats s;
  s.iters = us.size();
  for (double x : us) s.mean += x;
  s.mean /= static_cast<double>(us.size());
  s.p50 = us[us.size() / 2];
  s.p99 = us[std::min(us.size() - 1, us.size() * 99 / 100)];
  return s;
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

int RunCaller(int port) {
  std::shared_ptr<rref::RRefContext> ctx;
  setenv("FERRY_USE_AGENT_STORE", "1", 1);
  auto agent =
      OrDie(rpc::InitRpc("caller", absl::StrCat("tcp://127.0.0.1:", port), 0, 2,
                         Options(&ctx)),
            "caller init");
  const double secs = absl::GetFlag(FLAGS_seconds);
  Report(
      "rpc_sync_noop",
      TimeLoop([&] { OrDie(agent->rpc_sync<void>("callee", "noop"), "noop"); },
               secs));
  Report("remote_to_here_tensor4",
         TimeLoop(
             [&] {
               auto r = rref::remote<Tensor>(*ctx, "callee", "tensor4");
               OrDie(r.to_here(absl::Seconds(60)).status(), "to_here");
             },
             secs));
  auto acc = rref::remote<Acc>(*ctx, "callee", "Acc", 0);
  Report("proxy_rpc_sync_noop",
         TimeLoop(
             [&] {
               OrDie(acc.rpc_sync(absl::Seconds(60)).call<void>("noop"),
                     "proxy");
             },
             secs));
  acc = rref::RRef<Acc>();
  OrDie(ctx->AwaitSettled(absl::Seconds(60)), "settle");

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

int Launch(const char* self) {
  TcpStoreServer::Options so;
  so.host = "127.0.0.1";
  auto server = OrDie(TcpStoreServer::Start(so), "store");
  const std::string port = absl::StrCat("--port=", server->port());
  std::vector<std::string> args = {
      self, "--role=callee", port,
      absl::StrCat("--seconds=", absl::GetFlag(FLAGS_seconds))};
  std::vector<char*> argp;
  for (auto& a : args) argp.push_back(a.data());
  argp.push_back(nullptr);
  pid_t pid;
  if (posix_spawn(&pid, self, nullptr, nullptr, argp.data(), environ) != 0) {
    Die("cannot start the callee");
  }
  int rc = RunCaller(server->port());
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) rc = 1;
  return rc;
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string role = absl::GetFlag(FLAGS_role);
  if (role == "callee") return ferry::RunCallee(absl::GetFlag(FLAGS_port));
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return 1;
  self[n] = '\0';
  return ferry::Launch(self);
}
