// A parameter-server shard process for tests/fault/server_restart_test: serves
// "apply" (step N adds 1 to every element of its tensor, N must be the next
// step), "applied", "checkpointed" and "check" as worker "ps0", checkpointing the shard with
// a Checkpointer every 5 steps into $TEST_TMPDIR/ps_ckpt. At start it
// restores the latest valid checkpoint (printing "restored <step> from
// <file>" or "fresh"). With argv[1] "join" it joins a running group (a
// restarted server), prints "serving <id>", and leaves on "quit" on stdin;
// otherwise it is static rank $RANK of the group and waits in the graceful
// shutdown.
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ferry/common/sync.h"
#include "ferry/optim/checkpoint.h"
#include "ferry/rpc/grpc/init.h"

namespace ferry {
namespace {

void Say(const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

struct Shard {
  Mutex mu;
  Tensor w ABSL_GUARDED_BY(mu) = zeros({4096});
  int64_t applied ABSL_GUARDED_BY(mu) = 0;
};

int Run(bool join) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = absl::StrCat(tmp ? tmp : "/tmp", "/ps_ckpt");
  Shard shard;
  {
    MutexLock lock(&shard.mu);
    absl::StatusOr<optim::LoadedCheckpoint> loaded =
        optim::LoadLatest(dir, "ps0");
    if (loaded.ok()) {
      for (const std::string& r : loaded->refused) Say("refused " + r);
      shard.w = loaded->checkpoint.tensors.at(0).second;
      shard.applied = loaded->checkpoint.step;
      Say(absl::StrCat("restored ", shard.applied, " from ", loaded->path));
    } else if (absl::IsNotFound(loaded.status())) {
      Say("fresh");
    } else {
      Say(absl::StrCat("error ", loaded.status().ToString()));
      return 1;
    }
  }
  absl::StatusOr<std::unique_ptr<optim::Checkpointer>> ck =
      optim::Checkpointer::Create({.dir = dir, .name = "ps0", .every_steps = 5});
  if (!ck.ok()) {
    Say(absl::StrCat("error ", ck.status().ToString()));
    return 1;
  }
  {
    MutexLock lock(&shard.mu);
    (*ck)->Due(shard.applied);  // The step clock starts at the restored step.
  }
  rpc::GrpcAgentOptions options;
  options.join_timeout = absl::Seconds(60);
  options.before_serving = [&](rpc::Agent& agent) -> absl::Status {
    absl::Status s = agent.Register(
        "apply", [&](int64_t step) -> absl::StatusOr<int64_t> {
          MutexLock lock(&shard.mu);
          if (step != shard.applied + 1) {
            return absl::FailedPreconditionError(
                absl::StrCat("ps0: step ", step, " but ", shard.applied,
                             " applied"));
          }
          shard.w.add_(1.0);
          ++shard.applied;
          // `copy` runs here, under the lock: the handles stay valid.
          const int64_t now = shard.applied;
          const std::vector<Tensor> params = {shard.w};
          (*ck)->MaybeCheckpoint(now, [&](optim::ShardCheckpoint& c) {
            optim::SnapshotShardInto(c, now, params, nullptr, {"w"});
          });
          return shard.applied;
        });
    if (!s.ok()) return s;
    // The step of the newest checkpoint written (-1: none yet).
    s = agent.Register("checkpointed",
                       [&] { return (*ck)->stats().last_written_step; });
    if (!s.ok()) return s;
    s = agent.Register("applied", [&] {
      MutexLock lock(&shard.mu);
      return shard.applied;
    });
    if (!s.ok()) return s;
    // Whether every element equals the applied-step counter: each update
    // applied exactly once since the start or the restored checkpoint.
    return agent.Register("check", [&] {
      MutexLock lock(&shard.mu);
      return shard.w.equal(full({4096}, static_cast<double>(shard.applied)));
    });
  };
  absl::StatusOr<std::unique_ptr<rpc::GrpcAgent>> agent =
      join ? rpc::JoinRpc("ps0", "env://", options)
           : rpc::InitRpc("ps0", "env://", -1, -1, options);
  if (!agent.ok()) {
    Say(absl::StrCat("error ", agent.status().ToString()));
    return 1;
  }
  Say(absl::StrCat("serving ", (*agent)->self().id));
  if (join) {
    std::string line;
    for (int i = 0; i < 100 && std::getline(std::cin, line) && line != "quit";
         ++i) {
    }
  }
  absl::Status flushed = (*ck)->Flush(absl::Seconds(60));
  absl::Status down = (*agent)->Shutdown(/*graceful=*/true, absl::Seconds(120));
  Say(down.ok() && flushed.ok()
          ? "done"
          : absl::StrCat("error ", down.ToString(), " ", flushed.ToString()));
  return down.ok() && flushed.ok() ? 0 : 1;
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  return ferry::Run(argc > 1 && std::string(argv[1]) == "join");
}
