// A worker process for the multi-process RPC tests: joins the group named by
// the environment (env://), serves a few functions, then meets the others in
// a graceful shutdown.
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "ferry/common/sync.h"
#include "ferry/rpc/grpc/init.h"
#include "ferry/tensor/tensor.h"
#include "ferry/tests/rpc/toy_layer.h"

int main() {
  const int rank = std::atoi(std::getenv("RANK"));
  auto registry = std::make_shared<ferry::rpc::FunctionRegistry>();
  auto release = std::make_shared<ferry::Notification>();
  // How many "block" calls have started: the test's proof that its call
  // reached this process before it kills it.
  auto blocked = std::make_shared<std::atomic<int64_t>>(0);
  bool ok =
      registry
          ->Register("add",
                     [](ferry::Tensor a, ferry::Tensor b) { return a.add(b); })
          .ok() &&
      registry->Register("pid", [] { return static_cast<int64_t>(getpid()); })
          .ok() &&
      // Blocks until released (or 120 s): the test kills us meanwhile.
      registry
          ->Register(
              "block",
              [release, blocked] {
                blocked->fetch_add(1);
                release->WaitForNotificationWithTimeout(absl::Seconds(120));
              })
          .ok() &&
      registry->Register("blocked", [blocked] { return blocked->load(); }).ok();
  if (!ok) return 2;
  ferry::rpc::GrpcAgentOptions options;
  options.join_timeout = absl::Seconds(60);
  options.before_serving = ferry::rpc::toy::Install;
  // A slow receiver of streamed payloads (2 ms per piece), for the test that
  // kills this process mid-stream.
  if (std::getenv("FERRY_TEST_SLOW_STREAM") != nullptr) {
    options.stream.after_piece_received = [](uint64_t, uint64_t) {
      absl::SleepFor(absl::Milliseconds(2));
    };
  }
  auto agent = ferry::rpc::InitRpc(absl::StrCat("worker", rank), "env://", -1,
                                   -1, options, registry);
  if (!agent.ok()) {
    std::fprintf(stderr, "worker%d: %s\n", rank,
                 agent.status().ToString().c_str());
    return 1;
  }
  absl::Status down = (*agent)->Shutdown(/*graceful=*/true, absl::Seconds(120));
  release->Notify();
  if (!down.ok()) {
    std::fprintf(stderr, "worker%d shutdown: %s\n", rank,
                 down.ToString().c_str());
    return 1;
  }
  return 0;
}
