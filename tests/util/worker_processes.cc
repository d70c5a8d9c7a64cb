#include "ferry/tests/util/worker_processes.h"

#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "ferry/common/status.h"
#include "ferry/rpc/grpc/init.h"

namespace ferry::testutil {

absl::Status WorkerProcesses::Start(int world, const std::string& worker,
                                 rpc::GrpcAgentOptions options) {
  TcpStoreServer::Options so;
  so.host = "127.0.0.1";  // Port 0: the server picks one.
  ASSIGN_OR_RETURN(server_, TcpStoreServer::Start(so));
  port_ = absl::StrCat(server_->port());
  for (int r = 1; r < world; ++r) {
    SpawnOptions spawn;
    spawn.env = {{"RANK", absl::StrCat(r)},
                 {"WORLD_SIZE", absl::StrCat(world)},
                 {"MASTER_ADDR", "127.0.0.1"},
                 {"MASTER_PORT", port_},
                 {"FERRY_USE_AGENT_STORE", "1"}};
    ASSIGN_OR_RETURN(auto child,
                     Subprocess::Spawn({RunfilePath(worker)}, spawn));
    workers_.push_back(std::move(child));
  }
  options.join_timeout = absl::Seconds(60);
  setenv("FERRY_USE_AGENT_STORE", "1", 1);
  ASSIGN_OR_RETURN(
      agent_, rpc::InitRpc("worker0", absl::StrCat("tcp://127.0.0.1:", port_),
                           0, world, std::move(options)));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Subprocess>> WorkerProcesses::SpawnJoiner(
    std::vector<std::string> args) const {
  if (args.empty()) {
    return absl::InvalidArgumentError("SpawnJoiner: no program");
  }
  SpawnOptions spawn;
  spawn.env = {{"MASTER_ADDR", "127.0.0.1"},
               {"MASTER_PORT", port_},
               {"FERRY_USE_AGENT_STORE", "1"}};
  spawn.PipeStdin().CaptureStdout();
  args[0] = RunfilePath(args[0]);
  return Subprocess::Spawn(args, spawn);
}

WorkerProcesses::~WorkerProcesses() {
  if (agent_) agent_->Shutdown(/*graceful=*/false).IgnoreError();
  // Workers still running are killed by their Subprocess destructors.
}

}  // namespace ferry::testutil
