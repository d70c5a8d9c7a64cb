// An elastic trainer of the membership test (elastic_test.cc): joins the
// running group whose store MASTER_ADDR / MASTER_PORT name (JoinRpc) as
// argv[1], then follows the test's commands on stdin, one per line:
//   work N  adds N to worker0's Counter through a fork of it, and has worker1
//           compute N + N through remote(); prints "did <counter> <sum>"
//   leave   leaves the group (RRefContext::Leave, still holding the fork);
//           prints "left" and exits 0, or the error and exits 1
// It prints "joined <id> <world size>" once it is in the group.
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "ferry/rpc/grpc/init.h"
#include "ferry/tests/rref/counter.h"

namespace ferry::rref {
namespace {

constexpr absl::Duration kWait = absl::Seconds(60);

void Say(const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

// One "work N": the counter's new total and worker1's N + N.
absl::StatusOr<std::string> Work(RRefContext& ctx, rpc::Agent& agent,
                                 RRef<testutil::Counter>& counter, int64_t n) {
  if (!counter.valid()) {
    ASSIGN_OR_RETURN(counter, agent.rpc_sync<RRef<testutil::Counter>>(
                                  "worker0", "get_counter"));
  }
  ASSIGN_OR_RETURN(int64_t total,
                   counter.rpc_sync(kWait).call<int64_t>("add", n));
  RRef<int64_t> sum = remote<int64_t>(ctx, "worker1", "add", n, n);
  ASSIGN_OR_RETURN(int64_t s, sum.to_here(kWait));
  return absl::StrCat("did ", total, " ", s);
}

int Run(const std::string& name) {
  std::shared_ptr<RRefContext> ctx;
  rpc::GrpcAgentOptions options;
  options.join_timeout = kWait;
  options.before_serving = [&ctx](rpc::Agent& agent) {
    return testutil::InstallRRefTestLayer(agent, &ctx);
  };
  auto agent = rpc::JoinRpc(name, "env://", options);
  if (!agent.ok()) {
    Say(absl::StrCat("error ", agent.status().ToString()));
    return 1;
  }
  Say(absl::StrCat("joined ", (*agent)->self().id, " ",
                   (*agent)->world_size()));
  RRef<testutil::Counter> counter;
  std::string line;
  for (int i = 0; i < 100 && std::getline(std::cin, line); ++i) {
    std::vector<std::string> cmd = absl::StrSplit(line, ' ');
    int64_t n = 0;
    if (cmd.size() == 2 && cmd[0] == "work" && absl::SimpleAtoi(cmd[1], &n)) {
      absl::StatusOr<std::string> did = Work(*ctx, **agent, counter, n);
      Say(did.ok() ? *did : absl::StrCat("error ", did.status().ToString()));
    } else if (line == "leave") {
      absl::Status left = ctx->Leave(kWait);
      Say(left.ok() ? "left" : absl::StrCat("error ", left.ToString()));
      return left.ok() ? 0 : 1;
    } else {
      Say(absl::StrCat("error unknown command '", line, "'"));
    }
  }
  return 2;  // No "leave" came.
}

}  // namespace
}  // namespace ferry::rref

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s NAME\n", argv[0]);
    return 2;
  }
  return ferry::rref::Run(argv[1]);
}
