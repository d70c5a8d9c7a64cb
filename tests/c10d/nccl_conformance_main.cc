// One process of the c10d conformance suite on the "nccl" backend, started by
// nccl_test.cc: rank $FERRY_TEST_RANK of $FERRY_TEST_WORLD processes, meeting
// through the TCPStore the test hosts at 127.0.0.1:$FERRY_TEST_STORE_PORT.
//
// Rank r uses CUDA device r % (devices). Where ranks outnumber devices, each
// process takes its own NCCL_HOSTID, so NCCL treats the processes as separate
// hosts and joins them through its socket transport (on loopback) instead of
// refusing two ranks of one host on one device. Then every byte still moves
// through NCCL's kernels and proxies, only not over NVLink or PCIe peer paths.
//
// Beside the suite, NcclProcessTest: Send/Recv and a batched exchange, and
// the watchdog aborting an all-reduce that one rank never joins.
//
// Writes the names of the tests that passed, one per line, to
// $FERRY_TEST_SUMMARY, and exits non-zero when any test failed.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "ferry/c10d/nccl/cuda_util.h"
#include "ferry/c10d/nccl/nccl_backend.h"
#include "ferry/c10d/nccl/nccl_under_test.h"
#include "ferry/c10d/testing/backend_conformance.h"
#include "ferry/common/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ferry/store/prefix_store.h"
#include "ferry/store/tcp_store.h"

namespace ferry {
namespace c10d {
namespace {

BackendUnderTest g_nccl;

BackendUnderTest NcclProcessesUnderTest(int rank, int world,
                                        std::shared_ptr<Store> s) {
  BackendUnderTest b = NcclUnderTest();
  // Processes beyond the device count share devices (see the top).
  b.max_ranks = [world] { return world; };
  b.process_rank = rank;
  b.process_count = world;
  b.shared_store = std::move(s);
  return b;
}

INSTANTIATE_TEST_SUITE_P(Nccl, BackendConformanceTest,
                         ::testing::Values(g_nccl), BackendUnderTestName);

// Beyond the suite, on every process: point to point and the watchdog.
constexpr absl::Duration kWait = absl::Seconds(60);

// Sends and receives in issue order around the ring (even ranks send first,
// odd ranks receive first, so every Send meets a posted Recv; needs an even
// number of processes), then one batched exchange where every rank sends
// before it receives (one NCCL group).
TEST(NcclProcessTest, SendRecvRingAndBatchedExchange) {
  const int r = g_nccl.process_rank, n = g_nccl.process_count;
  ASSERT_EQ(n % 2, 0) << "the ring needs an even number of processes";
  auto b = NcclBackend::Create(
      std::make_shared<PrefixStore>("p2p", g_nccl.shared_store), r, n, kWait);
  ASSERT_TRUE(b.ok()) << b.status();
  auto dev = [&](const Tensor& t) { return g_nccl.to_device(t, r); };
  ASSERT_TRUE((*b)->Barrier()->Wait(kWait).ok());  // Makes the communicator.
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  Tensor got = dev(zeros({5}, DType::kInt64));
  auto send = [&] {
    return (*b)
        ->Send(dev(full({5}, 10 * r + 1, DType::kInt64)), next)
        ->Wait(kWait);
  };
  auto recv = [&] { return (*b)->Recv(got, prev)->Wait(kWait); };
  if (r % 2 == 0) {
    ASSERT_TRUE(send().ok());
    ASSERT_TRUE(recv().ok());
  } else {
    ASSERT_TRUE(recv().ok());
    ASSERT_TRUE(send().ok());
  }
  EXPECT_EQ(g_nccl.to_cpu(got).to_vector<int64_t>(),
            std::vector<int64_t>(5, 10 * prev + 1));
  Tensor in = dev(zeros({3}));
  std::vector<P2POp> ops = {
      {P2POp::Kind::kSend, dev(full({3}, r + 0.5)), next, 0},
      {P2POp::Kind::kRecv, in, prev, 0}};
  for (const auto& w : (*b)->BatchIsendIrecv(ops)) {
    ASSERT_TRUE(w->Wait(kWait).ok());
  }
  EXPECT_EQ(g_nccl.to_cpu(in).to_vector<float>(),
            std::vector<float>(3, prev + 0.5f));
}

// Once the communicator is up, the last rank never calls the all-reduce the
// others start: their kernels wait for it until the watchdog aborts the
// communicator at the call's timeout, and later calls fail at once.
TEST(NcclProcessTest, WatchdogAbortsACollectiveThatARankNeverJoins) {
  const int r = g_nccl.process_rank, n = g_nccl.process_count;
  auto store = std::make_shared<PrefixStore>("watchdog", g_nccl.shared_store);
  auto b = NcclBackend::Create(store, r, n, kWait);
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_TRUE((*b)->Barrier()->Wait(kWait).ok());
  if (r == n - 1) {
    // Stays (communicator alive) until the others have seen the timeout.
    ASSERT_TRUE(store->Wait({"others_done"}, kWait).ok());
    return;
  }
  constexpr absl::Duration kShort = absl::Seconds(2);
  Tensor t = g_nccl.to_device(ones({1024}), r);
  absl::Time start = absl::Now();
  absl::Status s = (*b)->Allreduce(t, {.timeout = kShort})->Wait(kWait);
  absl::Duration took = absl::Now() - start;
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_THAT(std::string(s.message()),
              ::testing::HasSubstr(absl::StrCat("Allreduce (rank ", r)));
  EXPECT_THAT(std::string(s.message()),
              ::testing::HasSubstr("communicator was aborted"));
  EXPECT_GE(took, kShort);
  EXPECT_LT(took, kShort + absl::Seconds(30));
  absl::Status later = (*b)->Barrier()->Wait(kWait);
  EXPECT_EQ(later.code(), absl::StatusCode::kFailedPrecondition) << later;
  absl::StatusOr<int64_t> done = store->Add("done", 1);
  ASSERT_TRUE(done.ok()) << done.status();
  if (*done == n - 1) {
    ASSERT_TRUE(store->Set("others_done", "1").ok());
  }
}

int EnvInt(const char* name) {
  const char* v = std::getenv(name);
  int out = -1;
  if (v == nullptr || !absl::SimpleAtoi(v, &out)) {
    std::fprintf(stderr, "%s is not set to a number\n", name);
    std::exit(2);
  }
  return out;
}

void WriteSummary() {
  const char* path = std::getenv("FERRY_TEST_SUMMARY");
  if (path == nullptr) return;
  std::FILE* f = std::fopen(path, "w");
  if (f == nullptr) return;
  const auto* unit = ::testing::UnitTest::GetInstance();
  for (int i = 0; i < unit->total_test_suite_count(); ++i) {
    const auto* suite = unit->GetTestSuite(i);
    for (int j = 0; j < suite->total_test_count(); ++j) {
      const auto* info = suite->GetTestInfo(j);
      if (info->should_run() && info->result()->Passed() &&
          !info->result()->Skipped()) {
        std::fprintf(f, "%s.%s\n", suite->name(), info->name());
      }
    }
  }
  std::fclose(f);
}

int Main(int argc, char** argv) {
  const int rank = EnvInt("FERRY_TEST_RANK");
  const int world = EnvInt("FERRY_TEST_WORLD");
  const int devices = CudaDeviceCount();
  if (devices == 0) {
    std::fprintf(stderr, "rank %d: no CUDA device\n", rank);
    return 3;
  }
  // Before the first NCCL call: NCCL reads these once. Loopback only.
  setenv("NCCL_SOCKET_IFNAME", "lo", 0);
  if (world > devices) {
    setenv("NCCL_HOSTID", absl::StrCat("ferry-nccl-test-rank", rank).c_str(),
           1);
    setenv("NCCL_IB_DISABLE", "1", 0);
  }
  TcpStoreOptions o;
  o.host = "127.0.0.1";
  o.port = EnvInt("FERRY_TEST_STORE_PORT");
  o.timeout = absl::Seconds(60);
  auto store = TcpStore::Create(o);
  if (!store.ok()) {
    std::fprintf(stderr, "store: %s\n", store.status().ToString().c_str());
    return 1;
  }
  g_nccl = NcclProcessesUnderTest(rank, world,
                                  std::shared_ptr<Store>(std::move(*store)));
  // The generator above reads g_nccl when InitGoogleTest registers tests.
  ::testing::InitGoogleTest(&argc, argv);
  int code = RUN_ALL_TESTS();
  WriteSummary();
  return code;
}

}  // namespace
}  // namespace c10d
}  // namespace ferry

int main(int argc, char** argv) { return ferry::c10d::Main(argc, argv); }
