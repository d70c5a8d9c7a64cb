// The "nccl" c10d backend with ranks as processes: the Backend conformance
// suite, Send/Recv and the watchdog (nccl_conformance_main.cc) at 2 and 4
// processes, on however many
// GPUs the machine has; processes beyond the GPU count share devices (see
// nccl_conformance_main.cc). Skips without a GPU.
#include <cstdio>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ferry/c10d/nccl/cuda_util.h"
#include "gtest/gtest.h"
#include "ferry/store/tcp_store.h"
#include "ferry/store/testing/loopback_store.h"
#include "ferry/tests/util/subprocess.h"

namespace ferry {
namespace {

std::set<std::string> ReadLines(const std::string& path) {
  std::set<std::string> lines;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) lines.insert(line);
  return lines;
}

TEST(NcclProcessesTest, ConformanceSuiteOnTwoAndFourProcesses) {
  const int gpus = c10d::CudaDeviceCount();
  if (gpus == 0) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount is 0)";
  const std::string suite =
      testutil::RunfilePath("tests/c10d/nccl_conformance_main");
  for (int np : {2, 4}) {
    SCOPED_TRACE(absl::StrCat(np, " processes on ", gpus, " GPU(s)"));
    auto server = testutil::StartLoopbackStore();
    ASSERT_TRUE(server.ok()) << server.status();
    std::vector<std::unique_ptr<testutil::Subprocess>> ranks;
    std::vector<std::string> summaries;
    for (int r = 0; r < np; ++r) {
      summaries.push_back(absl::StrCat(::testing::TempDir(), "/nccl_np", np,
                                       "_rank", r, ".txt"));
      std::remove(summaries.back().c_str());
      testutil::SpawnOptions o;
      // Every test runs, whatever filter this one ran with; the ranks leave
      // this test's XML report alone.
      o.env = {{"FERRY_TEST_STORE_PORT", absl::StrCat((*server)->port())},
               {"FERRY_TEST_RANK", absl::StrCat(r)},
               {"FERRY_TEST_WORLD", absl::StrCat(np)},
               {"FERRY_TEST_SUMMARY", summaries.back()},
               {"XML_OUTPUT_FILE", ""},
               {"TEST_PREMATURE_EXIT_FILE", ""}};
      auto child = testutil::Subprocess::Spawn({suite, "--gtest_filter=*"}, o);
      ASSERT_TRUE(child.ok()) << child.status();
      ranks.push_back(*std::move(child));
    }
    // Each count gets 6 minutes; both fit the "large" size's 15 minutes.
    const absl::Time deadline = absl::Now() + absl::Minutes(6);
    for (int r = 0; r < np; ++r) {
      absl::StatusOr<int> code = ranks[r]->Wait(deadline);
      EXPECT_EQ(code.value_or(-1), 0) << "rank " << r << ": " << code.status();
    }
    for (int r = 0; r < np; ++r) {
      std::set<std::string> passed = ReadLines(summaries[r]);
      for (const char* name :
           {"AllreduceEveryDtypeAndOp", "LargeAllreduceSpansManySegments",
            "BroadcastFromEveryRoot", "ReduceToRootLeavesOthersUnchanged",
            "AllgatherGatherScatter", "ReduceScatterAndAlltoall",
            "BarrierWaitsForEveryRank",
            "RankThatNeverCallsGivesDeadlineExceeded"}) {
        EXPECT_TRUE(passed.count(
            absl::StrCat("Nccl/BackendConformanceTest.", name, "/Nccl")))
            << "rank " << r << " did not pass " << name;
      }
      for (const char* name :
           {"SendRecvRingAndBatchedExchange",
            "WatchdogAbortsACollectiveThatARankNeverJoins"}) {
        EXPECT_TRUE(passed.count(absl::StrCat("NcclProcessTest.", name)))
            << "rank " << r << " did not pass " << name;
      }
      std::printf("np %d rank %d: %zu conformance tests passed\n", np, r,
                  passed.size());
    }
  }
}

}  // namespace
}  // namespace ferry
