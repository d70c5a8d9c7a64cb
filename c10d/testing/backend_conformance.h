// The c10d Backend conformance suite: one parameterized GoogleTest suite run
// against every backend (gloo, nccl, the custom-backend example).
//
// Ranks are threads of the test process meeting through one HashStore (or,
// for backends whose ranks must be processes, processes: see process_rank);
// each test brings up groups of 2, 3 and 4 ranks (capped by max_ranks) and
// checks every collective x ReduceOp x dtype the backend claims, exactly, plus
// the error contract: mismatched shapes / roots between ranks and invalid
// arguments fail on every rank with InvalidArgument; a rank that never
// arrives gives the others DeadlineExceeded within the timeout.
//
// Instantiate in a cc_test (inside namespace ferry::c10d):
//
//   INSTANTIATE_TEST_SUITE_P(Gloo, BackendConformanceTest,
//       ::testing::Values(BackendUnderTest{...}), BackendUnderTestName);
//
// and depend on //c10d/testing:backend_conformance (alwayslink).
#ifndef FERRY_C10D_TESTING_BACKEND_CONFORMANCE_H_
#define FERRY_C10D_TESTING_BACKEND_CONFORMANCE_H_

#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ferry/c10d/backend.h"
#include "gtest/gtest.h"
#include "ferry/store/store.h"
#include "ferry/tensor/tensor.h"

namespace ferry {
namespace c10d {

struct BackendUnderTest {
  std::string name;
  // Creates rank `rank` of `size`, meeting the others through `store` (a
  // namespace private to this group). Called on the rank's own thread.
  std::function<absl::StatusOr<std::unique_ptr<Backend>>(
      std::shared_ptr<Store> store, int rank, int size, absl::Duration timeout)>
      create;
  // Non-empty: the reason to skip (e.g. "no CUDA device").
  std::function<std::string()> skip_reason = [] { return std::string(); };
  // Largest group the environment supports (NCCL: one GPU per rank).
  std::function<int()> max_ranks = [] { return 4; };
  // Moves a CPU tensor to the backend's device for rank `rank` and back.
  std::function<Tensor(const Tensor&, int rank)> to_device =
      [](const Tensor& t, int) { return t; };
  std::function<Tensor(const Tensor&)> to_cpu = [](const Tensor& t) {
    return t;
  };
  // Dtypes the backend supports (data movement and reductions).
  std::vector<DType> dtypes =
      std::vector<DType>(std::begin(kAllDTypes), std::end(kAllDTypes));
  // Which operations the backend implements; others must be Unimplemented.
  std::vector<OpType> ops = {
      OpType::kAllreduce,     OpType::kBroadcast, OpType::kReduce,
      OpType::kAllgather,     OpType::kGather,    OpType::kScatter,
      OpType::kReduceScatter, OpType::kAlltoall,  OpType::kBarrier,
      OpType::kSend,          OpType::kRecv};
  // Reduce ops supported by Allreduce/Reduce/ReduceScatter (combined with
  // CheckReduceOp's dtype rules).
  std::vector<ReduceOp> reduce_ops =
      std::vector<ReduceOp>(std::begin(kAllReduceOps), std::end(kAllReduceOps));
  // Whether AVG is exactly sum / N (false: within a few units in the last
  // place, as where NCCL pre-multiplies each input by 1/N).
  bool exact_avg = true;
  // Whether mismatched calls between ranks are detected (InvalidArgument on
  // every rank) rather than undefined.
  bool detects_mismatch = true;
  // Whether creating a backend waits for every rank (so a rank that never
  // arrives fails creation with DeadlineExceeded) rather than connecting
  // lazily.
  bool rendezvous_at_create = true;

  // Ranks as processes (MPI under mpirun): every process runs the same
  // tests; this one is rank `process_rank` of each group and runs only that
  // rank's part (processes beyond a group's size sit it out). The groups
  // meet through `shared_store` (reachable from every process; each group
  // gets its own prefix), and all `process_count` processes meet there again
  // after each group, so none runs ahead. -1: ranks are threads of this
  // process, meeting through a fresh HashStore.
  int process_rank = -1;
  int process_count = 0;
  std::shared_ptr<Store> shared_store;
};

std::string BackendUnderTestName(
    const ::testing::TestParamInfo<BackendUnderTest>& info);

inline void PrintTo(const BackendUnderTest& b, std::ostream* os) {
  *os << b.name;
}

class BackendConformanceTest
    : public ::testing::TestWithParam<BackendUnderTest> {
 protected:
  void SetUp() override;
  bool Supports(OpType op) const;
};

}  // namespace c10d
}  // namespace ferry

#endif  // FERRY_C10D_TESTING_BACKEND_CONFORMANCE_H_
