#include "ferry/c10d/gloo/gloo_backend.h"

#include <memory>
#include <thread>

#include "ferry/c10d/gloo/store_adapter.h"
#include "ferry/c10d/testing/backend_conformance.h"
#include "gloo/common/error.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ferry/store/hash_store.h"
#include "ferry/store/prefix_store.h"

namespace ferry {
namespace c10d {
namespace {

using ::testing::HasSubstr;

BackendUnderTest GlooUnderTest(bool check_args) {
  BackendUnderTest b;
  b.name = check_args ? "Gloo" : "GlooUnchecked";
  b.create =
      [check_args](
          std::shared_ptr<Store> store, int rank, int size,
          absl::Duration timeout) -> absl::StatusOr<std::unique_ptr<Backend>> {
    GlooBackendOptions options;
    options.check_args = check_args;
    auto backend =
        GlooBackend::Create(std::move(store), rank, size, timeout, options);
    if (!backend.ok()) return backend.status();
    return std::unique_ptr<Backend>(std::move(*backend));
  };
  b.detects_mismatch = check_args;
  for (OpType op : {OpType::kAllgatherIntoTensor, OpType::kReduceScatterTensor,
                    OpType::kAlltoallSingle, OpType::kRecvAnysource,
                    OpType::kMonitoredBarrier}) {
    b.ops.push_back(op);
  }
  return b;
}

INSTANTIATE_TEST_SUITE_P(Gloo, BackendConformanceTest,
                         ::testing::Values(GlooUnderTest(true),
                                           GlooUnderTest(false)),
                         BackendUnderTestName);

TEST(GlooStoreAdapterTest, MapsStoreErrorsToExceptionsAndRemembersThem) {
  auto store = std::make_shared<HashStore>();
  GlooStoreAdapter adapter(store, absl::Milliseconds(50));
  adapter.set("k", {'a', 'b'});
  EXPECT_EQ(adapter.get("k"), (std::vector<char>{'a', 'b'}));
  EXPECT_TRUE(adapter.first_error().ok());
  EXPECT_THROW(adapter.get("missing"), ::gloo::IoException);
  EXPECT_EQ(adapter.first_error().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(adapter.first_error().message()),
              HasSubstr("missing"));
  EXPECT_THROW(adapter.wait({"missing2"}, std::chrono::milliseconds(20)),
               ::gloo::IoException);
}

TEST(GlooBackendTest, CreateRejectsBadArguments) {
  auto store = std::make_shared<HashStore>();
  EXPECT_EQ(
      GlooBackend::Create(nullptr, 0, 1, absl::Seconds(1)).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GlooBackend::Create(store, 2, 2, absl::Seconds(1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      GlooBackend::Create(store, 0, 1, absl::ZeroDuration()).status().code(),
      absl::StatusCode::kInvalidArgument);
}

TEST(GlooBackendTest, OptionsFromMap) {
  auto o = GlooBackendOptions::FromMap({{"hostname", "127.0.0.1"},
                                        {"check_args", "false"},
                                        {"p2p_threads", "2"}});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_FALSE(o->check_args);
  EXPECT_EQ(o->p2p_threads, 2);
  auto bad = GlooBackendOptions::FromMap({{"colour", "blue"}});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("colour"));
  EXPECT_FALSE(GlooBackendOptions::FromMap({{"check_args", "maybe"}}).ok());
  EXPECT_FALSE(GlooBackendOptions::FromMap({{"p2p_threads", "0"}}).ok());
}

TEST(GlooBackendTest, CudaTensorsAreRejected) {
  auto store = std::make_shared<HashStore>();
  auto b = GlooBackend::Create(store, 0, 1, absl::Seconds(5));
  ASSERT_TRUE(b.ok()) << b.status();
  // A tensor that claims to live on a GPU (never dereferenced).
  static char fake[16];
  Storage s = Storage::Wrap(fake, sizeof(fake), Device::CUDA(0), nullptr);
  auto t = Tensor::FromStorage(s, DType::kFloat32, {4}, {1});
  ASSERT_TRUE(t.ok());
  absl::Status st = (*b)->Allreduce(*t)->Wait(absl::Seconds(5));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()), HasSubstr("cuda"));
}

TEST(GlooBackendTest, TimeoutBreaksTheGroupWithAClearError) {
  auto store = std::make_shared<HashStore>();
  std::unique_ptr<GlooBackend> b0, b1;
  std::thread t1([&] {
    auto b = GlooBackend::Create(std::make_shared<PrefixStore>("g", store), 1,
                                 2, absl::Seconds(10));
    ASSERT_TRUE(b.ok()) << b.status();
    b1 = std::move(*b);
  });
  auto b = GlooBackend::Create(std::make_shared<PrefixStore>("g", store), 0, 2,
                               absl::Seconds(10));
  t1.join();
  ASSERT_TRUE(b.ok()) << b.status();
  b0 = std::move(*b);
  ASSERT_NE(b1, nullptr);
  Tensor t = ones({4});
  absl::Status s =
      b0->Allreduce(t, {.timeout = absl::Milliseconds(200)})->Wait();
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("gloo Allreduce (rank 0 of 2) #0"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("200ms"));
  absl::Status after = b0->Barrier()->Wait(absl::Seconds(10));
  EXPECT_EQ(after.code(), absl::StatusCode::kFailedPrecondition) << after;
  EXPECT_THAT(std::string(after.message()), HasSubstr("earlier failure"));
}

TEST(GlooBackendTest, RecvOfWrongSizeFailsClearly) {
  auto store = std::make_shared<HashStore>();
  std::unique_ptr<GlooBackend> b1;
  std::thread t1([&] {
    auto b = GlooBackend::Create(store, 1, 2, absl::Seconds(10));
    ASSERT_TRUE(b.ok()) << b.status();
    b1 = std::move(*b);
  });
  auto b0 = GlooBackend::Create(store, 0, 2, absl::Seconds(10));
  t1.join();
  ASSERT_TRUE(b0.ok()) << b0.status();
  ASSERT_NE(b1, nullptr);
  auto send =
      (*b0)->Send(ones({8}), 1, {.tag = 3, .timeout = absl::Milliseconds(300)});
  Tensor small = zeros({4});
  absl::Status r = b1->Recv(small, 0, {.tag = 3})->Wait(absl::Seconds(10));
  EXPECT_EQ(r.code(), absl::StatusCode::kInvalidArgument) << r;
  EXPECT_THAT(std::string(r.message()), HasSubstr("float32 x 8"));
  EXPECT_THAT(std::string(r.message()), HasSubstr("float32 x 4"));
  // The receiver drained the payload, so the Send completes.
  EXPECT_TRUE(send->Wait(absl::Seconds(10)).ok());
  // Collectives are unaffected.
  std::thread t2([&] {
    absl::Status s = b1->Barrier()->Wait(absl::Seconds(10));
    EXPECT_TRUE(s.ok()) << s;
  });
  absl::Status s0 = (*b0)->Barrier()->Wait(absl::Seconds(10));
  EXPECT_TRUE(s0.ok()) << s0;
  t2.join();
  // Self-sends and negative tags are refused locally.
  EXPECT_EQ((*b0)->Send(ones({1}), 0)->Wait().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*b0)->Recv(ones({1}), 1, {.tag = -1})->Wait().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(GlooBackendTest, DestroyCancelsQueuedWork) {
  auto store = std::make_shared<HashStore>();
  std::shared_ptr<Work> queued;
  {
    auto store2 = std::make_shared<HashStore>();
    std::unique_ptr<GlooBackend> b1;
    std::thread t1([&] {
      auto b = GlooBackend::Create(store2, 1, 2, absl::Seconds(10));
      ASSERT_TRUE(b.ok());
      b1 = std::move(*b);
    });
    auto b0 = GlooBackend::Create(store2, 0, 2, absl::Seconds(10));
    t1.join();
    ASSERT_TRUE(b0.ok());
    // The first blocks (rank 1 never calls) for 300 ms; the second queues.
    auto first = (*b0)->Barrier({.timeout = absl::Milliseconds(300)});
    queued = (*b0)->Barrier();
    b0->reset();
    EXPECT_TRUE(first->IsCompleted());
  }
  ASSERT_TRUE(queued->IsCompleted());
  EXPECT_EQ(queued->status().code(), absl::StatusCode::kCancelled);
}

}  // namespace
}  // namespace c10d
}  // namespace ferry

namespace ferry {
namespace c10d {
namespace {

TEST(GlooBackendTest, SmallAgainstLargeMismatchIsCaughtSafely) {
  // One rank's payload rides in the header exchange, the other's does not:
  // the receive buffers are sized for the largest block, so nothing
  // overruns, and both ranks see the mismatch.
  auto store = std::make_shared<HashStore>();
  std::unique_ptr<GlooBackend> b1;
  std::thread t1([&] {
    auto b = GlooBackend::Create(store, 1, 2, absl::Seconds(10));
    ASSERT_TRUE(b.ok()) << b.status();
    b1 = std::move(*b);
    absl::Status s = b1->Allreduce(ones({1200000}))->Wait(absl::Seconds(10));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    Tensor ok = ones({3});
    EXPECT_TRUE(b1->Allreduce(ok)->Wait(absl::Seconds(10)).ok());
  });
  auto b0 = GlooBackend::Create(store, 0, 2, absl::Seconds(10));
  ASSERT_TRUE(b0.ok()) << b0.status();
  absl::Status s = (*b0)->Allreduce(ones({4}))->Wait(absl::Seconds(10));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("float32 x 1200000"));
  Tensor ok = ones({3});
  EXPECT_TRUE((*b0)->Allreduce(ok)->Wait(absl::Seconds(10)).ok());
  EXPECT_EQ(ok.to_vector<float>(), std::vector<float>(3, 2));
  t1.join();
}

TEST(GlooBackendOptionsTest, DistributedDebugLevel) {
  auto off = GlooBackendOptions::FromMap({}, "OFF");
  ASSERT_TRUE(off.ok());
  EXPECT_FALSE(off->check_args);
  auto info = GlooBackendOptions::FromMap({}, "INFO");
  ASSERT_TRUE(info.ok());
  EXPECT_TRUE(info->check_args);
  EXPECT_FALSE(info->log_calls);
  auto detail = GlooBackendOptions::FromMap({}, "DETAIL");
  ASSERT_TRUE(detail.ok());
  EXPECT_TRUE(detail->check_args && detail->log_calls);
  // An explicit option wins over the environment.
  auto forced = GlooBackendOptions::FromMap({{"check_args", "true"}}, "OFF");
  ASSERT_TRUE(forced.ok());
  EXPECT_TRUE(forced->check_args);
  auto bad = GlooBackendOptions::FromMap({}, "LOUD");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()),
              HasSubstr("FERRY_DISTRIBUTED_DEBUG"));
}

}  // namespace
}  // namespace c10d
}  // namespace ferry
