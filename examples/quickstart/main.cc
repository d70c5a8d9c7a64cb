// README's quick-start, built and run as a test: one worker registers a
// typed function and calls it with rpc_sync (through its own gRPC server).
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "ferry/ferry.h"

// A typed handle: callers and the implementation are checked against it.
const ferry::rpc::RemoteFunction<int64_t(int64_t, int64_t)> kAdd("add");

int main() {
  auto registry = std::make_shared<ferry::rpc::FunctionRegistry>();
  if (!registry->Register(kAdd, [](int64_t a, int64_t b) { return a + b; })
           .ok()) {
    return 1;
  }
  // Rank 0 of a group of 1, meeting through a file of its own (a file left
  // by a crashed run would count as a member, so it is removed first). A
  // real job keeps the default init method, env:// (set by ferry_run,
  // mpirun or srun).
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(dir ? dir : "/tmp") +
                           "/ferry_quickstart_" + std::to_string(getpid());
  std::remove(path.c_str());
  ferry::WorkerOptions options;
  options.name = "worker0";
  options.init_method = "file://" + path;
  options.rank = 0;
  options.world_size = 1;
  options.registry = registry;
  auto worker = ferry::InitWorker(options);
  if (!worker.ok()) {
    std::fprintf(stderr, "%s\n", worker.status().ToString().c_str());
    return 1;
  }
  ferry::Result<int64_t> sum = (*worker)->rpc_sync("worker0", kAdd, 2, 3);
  std::printf("add(2, 3) = %s\n",
              sum.ok() ? std::to_string(*sum).c_str() : "error");
  const bool shut_down = (*worker)->Shutdown().ok();
  return sum.ok() && *sum == 5 && shut_down ? 0 : 1;
}
