// A worker process of the multi-process RRef test: joins the group named by
// the environment (env://) with an RRefContext, serves, then meets the others
// in the RRef graceful shutdown (exit 1 if it reports a leak or fails).
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "absl/strings/str_cat.h"
#include "ferry/rpc/grpc/init.h"
#include "ferry/tests/rref/counter.h"

int main() {
  const int rank = std::atoi(std::getenv("RANK"));
  std::shared_ptr<ferry::rref::RRefContext> ctx;
  ferry::rpc::GrpcAgentOptions options;
  options.join_timeout = absl::Seconds(60);
  options.before_serving = [&ctx](ferry::rpc::Agent& agent) {
    return ferry::testutil::InstallRRefTestLayer(agent, &ctx);
  };
  auto agent = ferry::rpc::InitRpc(absl::StrCat("worker", rank), "env://", -1,
                                   -1, options);
  if (!agent.ok()) {
    std::fprintf(stderr, "worker%d: %s\n", rank,
                 agent.status().ToString().c_str());
    return 1;
  }
  absl::Status down = ctx->Shutdown(absl::Seconds(120));
  if (!down.ok()) {
    std::fprintf(stderr, "worker%d shutdown: %s\n", rank,
                 down.ToString().c_str());
    return 1;
  }
  return 0;
}
