#include "ferry/c10d/nccl/nccl_backend.h"

#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "ferry/c10d/nccl/cuda_util.h"
#include "ferry/c10d/nccl/nccl_under_test.h"
#include "ferry/c10d/testing/backend_conformance.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ferry/store/hash_store.h"
#include "ferry/tests/util/run_ranks.h"

namespace ferry {
namespace c10d {
namespace {

using ::testing::HasSubstr;

INSTANTIATE_TEST_SUITE_P(Nccl, BackendConformanceTest,
                         ::testing::Values(NcclUnderTest()),
                         BackendUnderTestName);

// Runs everywhere: creating the backend needs no GPU; without one the first
// operation fails cleanly.
TEST(NcclBackendTest, WithoutAGpuTheFirstOperationFailsCleanly) {
  if (CudaDeviceCount() > 0) GTEST_SKIP() << "a GPU is present";
  auto b = NcclBackend::Create(std::make_shared<HashStore>(), 0, 1,
                               absl::Seconds(5));
  ASSERT_TRUE(b.ok()) << b.status();
  absl::Status s = (*b)->Barrier()->Wait(absl::Seconds(10));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("no CUDA device"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("nccl Barrier"));
  // CPU tensors are refused before anything else.
  absl::Status cpu = (*b)->Allreduce(ones({2}))->Wait(absl::Seconds(10));
  EXPECT_EQ(cpu.code(), absl::StatusCode::kInvalidArgument) << cpu;
  EXPECT_THAT(std::string(cpu.message()), HasSubstr("CUDA tensors"));
  CudaAllocator alloc(0);
  EXPECT_FALSE(alloc.Allocate(16).ok());
}

TEST(NcclBackendTest, CreateRejectsBadArguments) {
  auto store = std::make_shared<HashStore>();
  EXPECT_FALSE(NcclBackend::Create(nullptr, 0, 1, absl::Seconds(1)).ok());
  EXPECT_FALSE(NcclBackend::Create(store, 1, 1, absl::Seconds(1)).ok());
  EXPECT_FALSE(NcclBackend::Create(store, 0, 1, absl::ZeroDuration()).ok());
  BackendConfig c;
  c.store = store;
  c.options = {{"x", "y"}};
  EXPECT_EQ(NcclBackend::Factory()(c).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(NcclBackendTest, BitwiseOpsAreRejected) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  auto b = NcclBackend::Create(std::make_shared<HashStore>(), 0, 1,
                               absl::Seconds(30));
  ASSERT_TRUE(b.ok());
  auto t = CopyToCuda(ones({4}, DType::kInt32), 0);
  ASSERT_TRUE(t.ok());
  absl::Status s =
      (*b)->Allreduce(*t, {.op = ReduceOp::kBxor})->Wait(absl::Seconds(30));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE((*b)->Allreduce(*t)->Wait(absl::Seconds(30)).ok());
  auto back = CopyToCpu(*t);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->to_vector<int32_t>(), std::vector<int32_t>(4, 1));
}

// One GPU suffices: rank 0 of a group of two whose rank 1 never comes. The
// non-blocking communicator setup gives up at the timeout (no hang), names
// the collective and the rank, and later calls fail at once.
TEST(NcclBackendTest, AMissingRankFailsTheFirstOperationAtTheTimeout) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  const absl::Duration timeout = absl::Seconds(2);
  auto b = NcclBackend::Create(std::make_shared<HashStore>(), 0, 2, timeout);
  ASSERT_TRUE(b.ok()) << b.status();
  auto t = CopyToCuda(ones({4}), 0);
  ASSERT_TRUE(t.ok()) << t.status();
  absl::Time start = absl::Now();
  absl::Status s = (*b)->Allreduce(*t)->Wait(absl::Seconds(60));
  absl::Duration took = absl::Now() - start;
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("Allreduce (rank 0 of 2)"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("did not join"));
  EXPECT_GE(took, timeout);
  EXPECT_LT(took, timeout + absl::Seconds(30));
  absl::Status later = (*b)->Barrier()->Wait(absl::Seconds(10));
  EXPECT_EQ(later.code(), absl::StatusCode::kFailedPrecondition) << later;
  EXPECT_THAT(std::string(later.message()), HasSubstr("earlier failure"));
}

// NCCL refuses two ranks of one host on one device ("Duplicate GPU"): both
// ranks get a clear InvalidArgument from the first collective, none hangs.
// (tests/c10d:nccl_test shares one device between ranks that NCCL takes for
// separate hosts.)
TEST(NcclBackendTest, TwoRanksOnOneDeviceAreRefusedCleanly) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  auto store = std::make_shared<HashStore>();
  const absl::Duration t = absl::Seconds(30);
  std::vector<absl::Status> results(2);
  testutil::RunRanks(
      2, [&](int r) { return NcclBackend::Create(store, r, 2, t); },
      [&](int r, auto& b) {
        ASSERT_TRUE(b.ok()) << b.status();
        auto x = CopyToCuda(ones({4}), 0);  // Both on cuda:0.
        ASSERT_TRUE(x.ok()) << x.status();
        results[r] = (*b)->Allreduce(*x)->Wait(absl::Seconds(90));
      });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(results[r].code(), absl::StatusCode::kInvalidArgument)
        << "rank " << r << ": " << results[r];
    EXPECT_THAT(std::string(results[r].message()),
                HasSubstr(absl::StrCat("Allreduce (rank ", r, " of 2)")));
    EXPECT_THAT(std::string(results[r].message()), HasSubstr("invalid usage"));
  }
}

// Runs everywhere: point-to-point arguments are refused before any device
// work (CPU tensor, this rank as peer, negative tag, mixed batch).
TEST(NcclBackendTest, PointToPointArgumentsAreChecked) {
  auto b = NcclBackend::Create(std::make_shared<HashStore>(), 0, 2,
                               absl::Seconds(5));
  ASSERT_TRUE(b.ok()) << b.status();
  absl::Status cpu = (*b)->Send(ones({2}), 1)->Wait(absl::Seconds(10));
  EXPECT_EQ(cpu.code(), absl::StatusCode::kInvalidArgument) << cpu;
  EXPECT_THAT(std::string(cpu.message()), HasSubstr("CUDA tensors"));
  absl::Status self = (*b)->Recv(ones({2}), 0)->Wait(absl::Seconds(10));
  EXPECT_EQ(self.code(), absl::StatusCode::kInvalidArgument) << self;
  std::vector<std::shared_ptr<Work>> batch =
      (*b)->BatchIsendIrecv({{P2POp::Kind::kSend, ones({2}), 1, 0},
                             {P2POp::Kind::kRecv, ones({2}), 1, -1}});
  ASSERT_EQ(batch.size(), 2u);
  for (const auto& w : batch) {
    absl::Status s = w->Wait(absl::Seconds(10));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  }
  EXPECT_TRUE((*b)->BatchIsendIrecv({}).empty());
}

// Two ranks on two GPUs: Send/Recv in matching order, then a batched
// exchange where both ranks send before they receive (one NCCL group).
TEST(NcclBackendTest, SendRecvAndBatchedExchange) {
  if (CudaDeviceCount() < 2) {
    GTEST_SKIP() << "needs two CUDA devices (" << CudaDeviceCount()
                 << " present)";
  }
  auto store = std::make_shared<HashStore>();
  const absl::Duration t = absl::Seconds(60);
  testutil::RunRanks(
      2, [&](int r) { return NcclBackend::Create(store, r, 2, t); },
      [&](int r, auto& b) {
        ASSERT_TRUE(b.ok()) << b.status();
        auto dev = [&](const Tensor& x) { return *CopyToCuda(x, r); };
        // The communicator is made by a collective every rank calls.
        ASSERT_TRUE((*b)->Barrier()->Wait(t).ok());
        Tensor got = dev(zeros({5}, DType::kInt64));
        if (r == 0) {
          ASSERT_TRUE(
              (*b)->Send(dev(full({5}, 42, DType::kInt64)), 1)->Wait(t).ok());
        } else {
          ASSERT_TRUE((*b)->Recv(got, 0)->Wait(t).ok());
          EXPECT_EQ(CopyToCpu(got)->to_vector<int64_t>(),
                    std::vector<int64_t>(5, 42));
        }
        Tensor in = dev(zeros({3}));
        std::vector<P2POp> ops = {
            {P2POp::Kind::kSend, dev(full({3}, r + 1.0)), 1 - r, 0},
            {P2POp::Kind::kRecv, in, 1 - r, 0}};
        for (const auto& w : (*b)->BatchIsendIrecv(ops)) {
          ASSERT_TRUE(w->Wait(t).ok());
        }
        EXPECT_EQ(CopyToCpu(in)->to_vector<float>(),
                  std::vector<float>(3, 2.0f - r));
      });
}

}  // namespace
}  // namespace c10d
}  // namespace ferry
