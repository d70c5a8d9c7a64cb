// A multi-worker Ferry job: model-parallel matmul shards plus a ring of
// greetings, over real gRPC between processes.
//
//   ferry_run --nproc 3 -- rpc_tensors
//
// Every worker owns one column shard W_r (8 x 4, seeded by its rank) of a
// weight matrix and serves:
//   "matmul"  (Tensor x) -> x @ W_r
//   "greet"   (string from, Tensor t) -> "<me> got <from>'s tensor sum=..."
// Rank 0 sends one input batch to every shard at once (rpc_async), checks
// each result against a local computation, and prints it; every worker
// greets the next one around the ring. Then all shut down together.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "ferry/ferry.h"
#include "ferry/store.h"

namespace {

using ferry::Tensor;
using ferry::rpc::RemoteFunction;

const RemoteFunction<Tensor(Tensor)> kMatmul("matmul");
const RemoteFunction<std::string(std::string, Tensor)> kGreet("greet");

constexpr int kIn = 8, kShard = 4, kBatch = 2;

Tensor ShardWeights(int rank) {
  return ferry::randn({kIn, kShard}, 1000 + rank);
}

absl::Status Run() {
  // The rank as env:// reads it (ferry_run, mpirun, srun).
  ASSIGN_OR_RETURN(ferry::InitMethod launch, ferry::ParseInitMethod("env://"));
  const int rank = launch.rank.value_or(0);
  const std::string name = absl::StrCat("worker", rank);

  auto registry = std::make_shared<ferry::rpc::FunctionRegistry>();
  const Tensor w = ShardWeights(rank);
  RETURN_IF_ERROR(registry->Register(
      kMatmul, [w](Tensor x) { return x.matmul(w); },
      "x @ this worker's weight shard"));
  RETURN_IF_ERROR(registry->Register(
      kGreet,
      [name](std::string from, Tensor t) {
        return absl::StrFormat("%s got %s's tensor %s (sum=%.1f)", name, from,
                               t.ToString(), t.sum().item<double>());
      },
      "acknowledges a tensor from another worker"));

  ferry::WorkerOptions options;
  options.name = name;
  options.registry = registry;
  ASSIGN_OR_RETURN(std::unique_ptr<ferry::Worker> worker,
                   ferry::InitWorker(options));
  const int world = worker->world_size();
  std::printf("%s: up at %s, %d workers\n", name.c_str(),
              worker->address().c_str(), world);

  absl::Status job;
  if (rank == 0) {
    Tensor x = ferry::randn({kBatch, kIn}, 7);
    std::vector<ferry::Future<Tensor>> parts;
    for (int r = 0; r < world; ++r)
      parts.push_back(worker->rpc_async(r, kMatmul, x));
    for (int r = 0; r < world && job.ok(); ++r) {
      ferry::Result<Tensor> y = parts[r].Get();
      if (!y.ok()) {
        job = y.status();
        break;
      }
      const bool matches = y->allclose(x.matmul(ShardWeights(r)));
      std::printf("shard %d of x @ W from worker%d: %s  matches local: %s\n", r,
                  r, y->ToString().c_str(), matches ? "yes" : "NO");
      if (!matches)
        job = absl::InternalError(absl::StrCat("shard ", r, " mismatch"));
    }
  }
  if (job.ok()) {
    const int next = (rank + 1) % world;
    Tensor mine = ferry::full({3}, rank + 1.0);
    ferry::Result<std::string> reply =
        worker->rpc_sync(next, kGreet, name, mine);
    if (reply.ok()) {
      std::printf("%s -> worker%d: %s\n", name.c_str(), next, reply->c_str());
    } else {
      job = reply.status();
    }
  }
  // Shut down with everyone even after an error, so peers are not left waiting.
  absl::Status down = worker->Shutdown();
  RETURN_IF_ERROR(job);
  RETURN_IF_ERROR(down);
  std::printf("%s: done\n", name.c_str());
  return absl::OkStatus();
}

}  // namespace

int main() {
  // Line-buffered even into the launcher's pipe, so lines arrive as printed.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  absl::Status s = Run();
  if (!s.ok()) {
    std::fprintf(stderr, "error: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
