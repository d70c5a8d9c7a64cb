// Test-only: a group of workers started in one process, for tests of what
// InitWorker installs (device plans, CUDA tensors over RPC).
//
// StartWorkerGroup names the workers "w0".."w<n-1>", gives them ranks and one
// fresh file:// init method under TEST_TMPDIR, starts them at once (each on
// its own thread, as InitWorker blocks until the group forms) and returns
// each InitWorker's result. ShutdownWorkerGroup ends the workers that started,
// collectively, and fails the test if one's Shutdown does.
//
// Thread safety: call from the test's thread. Design: docs/design/worker.md.
#ifndef FERRY_WORKER_TEST_GROUP_H_
#define FERRY_WORKER_TEST_GROUP_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ferry/worker/worker.h"

namespace ferry {

/// The workers of one group, by rank; each InitWorker's result.
using WorkerGroup = std::vector<absl::StatusOr<std::unique_ptr<Worker>>>;

/// Starts one worker per entry of `options` (its name, rank, world size and
/// init method are set here; `tag` names the init file).
WorkerGroup StartWorkerGroup(const std::string& tag,
                       std::vector<WorkerOptions> options);

/// Shuts down every worker of `group` that started, all at once.
void ShutdownWorkerGroup(WorkerGroup& group);

}  // namespace ferry

#endif  // FERRY_WORKER_TEST_GROUP_H_
