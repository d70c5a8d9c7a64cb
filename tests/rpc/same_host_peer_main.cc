// The peer process of same_host_kill_test: rank 1 of a group of 2 (env://),
// on the host of rank 0 (the test), so their tensors take the same-host
// channel. ROLE=callee serves "echo" until its stdin closes; ROLE=caller
// echoes BYTES-byte tensors through rank 0, two calls in flight, printing
// "echoed N" after each, until killed (or 120 s).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <deque>
#include <string>

#include "ferry/rpc/grpc/init.h"
#include "ferry/tensor/tensor.h"

namespace {

int Callee(ferry::rpc::GrpcAgent& agent) {
  std::printf("ready\n");
  std::fflush(stdout);
  char buf[64];
  while (::read(0, buf, sizeof(buf)) > 0) {
  }
  return agent.Shutdown(/*graceful=*/false).ok() ? 0 : 1;
}

int Caller(ferry::rpc::GrpcAgent& agent, int64_t bytes) {
  ferry::Tensor t = ferry::full({bytes / 4}, 1.0);
  std::deque<ferry::Future<ferry::Value>> inflight;
  const absl::Time end = absl::Now() + absl::Seconds(120);
  for (int64_t done = 0; absl::Now() < end;) {
    while (inflight.size() < 2) {
      inflight.push_back(
          agent.CallAsync("worker0", "echo", {ferry::Value::FromTensor(t)}));
    }
    auto r = inflight.front().Get(absl::Seconds(60));
    inflight.pop_front();
    if (!r.ok()) {
      std::fprintf(stderr, "caller: %s\n", r.status().ToString().c_str());
      return 1;
    }
    std::printf("echoed %lld\n", static_cast<long long>(++done));
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main() {
  const char* role = std::getenv("ROLE");
  const char* bytes = std::getenv("BYTES");
  if (role == nullptr) return 2;
  auto registry = std::make_shared<ferry::rpc::FunctionRegistry>();
  if (!registry->Register("echo", [](ferry::Tensor t) { return t; }).ok()) {
    return 2;
  }
  ferry::rpc::GrpcAgentOptions options;
  options.join_timeout = absl::Seconds(60);
  auto agent =
      ferry::rpc::InitRpc("worker1", "env://", -1, -1, options, registry);
  if (!agent.ok()) {
    std::fprintf(stderr, "worker1: %s\n", agent.status().ToString().c_str());
    return 1;
  }
  if (std::string(role) == "callee") return Callee(**agent);
  return Caller(**agent, bytes ? std::atoll(bytes) : (int64_t{64} << 20));
}
