// A multi-process test's group of workers over the gRPC agent: the test
// process serves a TCPStore on loopback (port 0) and joins as rank 0
// ("worker0"); ranks 1..world-1 are processes of one worker binary, told
// the group through RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT and
// FERRY_USE_AGENT_STORE=1 (the env:// rendezvous of rpc/grpc/init.h).
//
//   WorkerProcesses g;
//   ASSERT_OK(g.Start(3, "tests/rref/worker_main", options));
//   g.agent().rpc_sync<...>("worker1", ...);
//
// Destruction shuts the agent down without waiting for peers, then kills
// workers still running (Subprocess). Not thread-safe; one per test.
#ifndef FERRY_TESTS_UTIL_WORKER_PROCESSES_H_
#define FERRY_TESTS_UTIL_WORKER_PROCESSES_H_

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ferry/rpc/grpc/agent.h"
#include "ferry/store/tcp_store_server.h"
#include "ferry/tests/util/subprocess.h"

namespace ferry::testutil {

class WorkerProcesses {
 public:
  WorkerProcesses() = default;
  ~WorkerProcesses();
  WorkerProcesses(const WorkerProcesses&) = delete;
  WorkerProcesses& operator=(const WorkerProcesses&) = delete;

  // Starts the store, ranks 1..world-1 (`worker`: a runfile path, e.g.
  // "tests/rref/worker_main") and this process's agent with `options`
  // (its join_timeout set to 60 s: processes start slowly under load).
  absl::Status Start(int world, const std::string& worker,
                     rpc::GrpcAgentOptions options = {});

  rpc::GrpcAgent& agent() { return *agent_; }
  // The store's port, for more processes to join through.
  const std::string& port() const { return port_; }
  // Spawns `args` (args[0]: a runfile path) told the group's store through
  // MASTER_ADDR / MASTER_PORT (a joiner: JoinRpc with env://), its stdin
  // piped and stdout captured. Not kept here: the caller owns it.
  absl::StatusOr<std::unique_ptr<Subprocess>> SpawnJoiner(
      std::vector<std::string> args) const;
  size_t workers() const { return workers_.size(); }
  Subprocess& worker(size_t i) { return *workers_[i]; }
  // Worker i's (0-based: rank i + 1) exit code; an error if it was killed or
  // is still running after `timeout`.
  absl::StatusOr<int> Wait(size_t i, absl::Duration timeout) {
    return workers_[i]->Wait(absl::Now() + timeout);
  }

 private:
  std::unique_ptr<TcpStoreServer> server_;
  std::string port_;
  std::vector<std::unique_ptr<Subprocess>> workers_;
  std::unique_ptr<rpc::GrpcAgent> agent_;
};

}  // namespace ferry::testutil

#endif  // FERRY_TESTS_UTIL_WORKER_PROCESSES_H_
