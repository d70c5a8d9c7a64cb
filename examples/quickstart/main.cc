// README's quick-start, built and run as a test: one worker registers a
// function and calls it with rpc_sync (through its own gRPC server).
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "ferry/rpc/grpc/init.h"

int main() {
  auto registry = std::make_shared<ferry::rpc::FunctionRegistry>();
  if (!registry->Register("add", [](int64_t a, int64_t b) { return a + b; })
           .ok()) {
    return 1;
  }
  // Rank 0 of a group of 1, meeting through a file of its own (a file left
  // by a crashed run would count as a member, so it is removed first); a
  // real job passes "env://" (ferry_run sets RANK, WORLD_SIZE, MASTER_ADDR,
  // MASTER_PORT).
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path =
      absl::StrCat(dir ? dir : "/tmp", "/ferry_quickstart_", getpid());
  std::remove(path.c_str());
  const std::string init = "file://" + path;
  auto agent = ferry::rpc::InitRpc("worker0", init, /*rank=*/0,
                                   /*world_size=*/1, {}, registry);
  if (!agent.ok()) {
    std::fprintf(stderr, "%s\n", agent.status().ToString().c_str());
    return 1;
  }
  ferry::Result<int64_t> sum =
      (*agent)->rpc_sync<int64_t>("worker0", "add", int64_t{2}, int64_t{3});
  std::printf("add(2, 3) = %s\n",
              sum.ok() ? absl::StrCat(*sum).c_str() : "error");
  const bool shut_down = (*agent)->Shutdown().ok();
  return sum.ok() && *sum == 5 && shut_down ? 0 : 1;
}
