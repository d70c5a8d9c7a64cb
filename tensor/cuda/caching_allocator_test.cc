// CachingDeviceAllocator on FakeDeviceApi, where the test decides when a
// stream's work ends (the conformance suite covers what every API shares).
#include "ferry/tensor/cuda/caching_allocator.h"

#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "ferry/tensor/cuda/fake_device_api.h"
#include "ferry/tensor/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ferry {
namespace cuda {
namespace {

using ::testing::HasSubstr;
constexpr uint64_t kMiB = uint64_t{1} << 20;

std::unique_ptr<CachingDeviceAllocator> Make(std::shared_ptr<FakeDeviceApi> api,
                                             uint64_t limit = 0) {
  auto a = CachingDeviceAllocator::Create(api, {.limit_bytes = limit});
  EXPECT_TRUE(a.ok()) << a.status();
  return std::move(*a);
}

TEST(RoundSize, ClassesAndTheirWaste) {
  EXPECT_EQ(CachingDeviceAllocator::RoundSize(0), 512u);
  EXPECT_EQ(CachingDeviceAllocator::RoundSize(1), 512u);
  EXPECT_EQ(CachingDeviceAllocator::RoundSize(512), 512u);
  EXPECT_EQ(CachingDeviceAllocator::RoundSize(513), 1024u);
  EXPECT_EQ(CachingDeviceAllocator::RoundSize(kMiB), kMiB);
  EXPECT_EQ(CachingDeviceAllocator::RoundSize(kMiB + 1), kMiB + kMiB / 4);
  EXPECT_EQ(CachingDeviceAllocator::RoundSize(3 * kMiB), 3 * kMiB);
  EXPECT_EQ(CachingDeviceAllocator::RoundSize(4 * kMiB + 1), 5 * kMiB);
  std::mt19937_64 rng(7);
  for (int i = 0; i < 100000; ++i) {
    const size_t n = 1 + rng() % (uint64_t{1} << (1 + rng() % 36));
    const size_t r = CachingDeviceAllocator::RoundSize(n);
    ASSERT_GE(r, n);
    ASSERT_LE(r - n, std::max<size_t>(511, n / 4)) << n;
    ASSERT_EQ(CachingDeviceAllocator::RoundSize(r), r) << n;
  }
}

TEST(CachingAllocator, RecordedBlockWaitsForTheOtherStream) {
  auto api = std::make_shared<FakeDeviceApi>(1, 64 * kMiB);
  auto alloc = Make(api);
  void* first = nullptr;
  {
    absl::StatusOr<Storage> a = alloc->Allocate(0, kMiB, /*stream=*/1);
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(alloc->RecordStream(*a, 2).ok());
    ASSERT_TRUE(alloc->RecordStream(*a, 2).ok());  // Once is enough.
    first = a->data();
  }
  EXPECT_EQ(api->live_events(), 1u);
  EXPECT_EQ(alloc->Stats(0).pending_bytes, kMiB);
  {
    absl::StatusOr<Storage> b = alloc->Allocate(0, kMiB, 1);
    ASSERT_TRUE(b.ok());
    EXPECT_NE(b->data(), first) << "reused before stream 2 finished";
  }
  api->CompleteStream(0, 2);
  AllocatorStats st = alloc->Stats(0);
  EXPECT_EQ(st.pending_bytes, 0u);
  EXPECT_EQ(st.cached_bytes, 2 * kMiB);
  EXPECT_EQ(api->live_events(), 0u);
  absl::StatusOr<Storage> c = alloc->Allocate(0, kMiB, 1);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->data(), first);
}

TEST(CachingAllocator, WorkQueuedAfterTheReleaseDoesNotHoldIt) {
  auto api = std::make_shared<FakeDeviceApi>(1, 64 * kMiB);
  auto alloc = Make(api);
  {
    absl::StatusOr<Storage> a = alloc->Allocate(0, 4096, 1);
    ASSERT_TRUE(a.ok());
    ASSERT_TRUE(alloc->RecordStream(*a, 2).ok());
  }
  api->CompleteStream(0, 2);
  ASSERT_TRUE(api->RecordEvent(0, 2).ok());  // Later work on stream 2.
  EXPECT_EQ(alloc->Stats(0).pending_bytes, 0u);
}

TEST(CachingAllocator, DeviceOutOfMemoryRetriesAfterFreeingTheCache) {
  auto api = std::make_shared<FakeDeviceApi>(1, 4 * kMiB);
  auto alloc = Make(api);
  ASSERT_TRUE(alloc->Allocate(0, 3 * kMiB, 1).ok());  // Cached on stream 1.
  absl::StatusOr<Storage> b = alloc->Allocate(0, 3 * kMiB, 2);
  ASSERT_TRUE(b.ok()) << b.status();
  AllocatorStats st = alloc->Stats(0);
  EXPECT_EQ(st.device_mallocs, 3u);  // The failed try counts.
  EXPECT_EQ(st.device_frees, 1u);
  EXPECT_EQ(st.out_of_memory, 0u);
}

TEST(CachingAllocator, DeviceOutOfMemoryNamesDeviceRequestAndUse) {
  auto api = std::make_shared<FakeDeviceApi>(1, kMiB);
  auto alloc = Make(api);
  absl::StatusOr<Storage> kept = alloc->Allocate(0, 1000, 0);
  ASSERT_TRUE(kept.ok());
  absl::StatusOr<Storage> big = alloc->Allocate(0, 2 * kMiB, 0);
  ASSERT_TRUE(absl::IsResourceExhausted(big.status())) << big.status();
  EXPECT_THAT(big.status().message(), HasSubstr("fake:0: out of memory"));
  EXPECT_THAT(big.status().message(), HasSubstr("requested 2097152 bytes"));
  EXPECT_THAT(big.status().message(), HasSubstr("1024 bytes in use"));
  EXPECT_THAT(big.status().message(), HasSubstr("limit none"));
  absl::StatusOr<Storage> absurd = alloc->Allocate(0, ~size_t{0}, 0);
  EXPECT_TRUE(absl::IsResourceExhausted(absurd.status())) << absurd.status();
  EXPECT_EQ(alloc->Stats(0).out_of_memory, 2u);
}

TEST(CachingAllocator, FailedEventRecordGivesTheBlockBackToTheDevice) {
  auto api = std::make_shared<FakeDeviceApi>(1, 64 * kMiB);
  auto alloc = Make(api);
  api->FailRecordEvent(1);
  {
    absl::StatusOr<Storage> a = alloc->Allocate(0, 8192, 1);
    ASSERT_TRUE(a.ok());
    ASSERT_TRUE(alloc->RecordStream(*a, 2).ok());
  }
  AllocatorStats st = alloc->Stats(0);
  EXPECT_EQ(st.reserved_bytes, 0u);
  EXPECT_EQ(st.device_frees, 1u);
  EXPECT_EQ(api->in_use_bytes(0), 0u);
}

TEST(CachingAllocator, UnknownDeviceAndForeignStorageAreRefused) {
  auto api = std::make_shared<FakeDeviceApi>(2, 64 * kMiB);
  auto alloc = Make(api);
  absl::StatusOr<Storage> bad = alloc->Allocate(2, 64, 0);
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status()));
  EXPECT_THAT(bad.status().message(), HasSubstr("fake:2: no such device"));
  absl::StatusOr<Storage> cpu = GetCpuAllocator()->Allocate(64);
  ASSERT_TRUE(cpu.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(alloc->RecordStream(*cpu, 1)));
  EXPECT_TRUE(absl::IsInvalidArgument(alloc->RecordStream(Storage(), 1)));
  EXPECT_TRUE(absl::IsInvalidArgument(alloc->ForStream(5, 0).status()));
}

TEST(CachingAllocator, StoragesOutliveTheAllocator) {
  auto api = std::make_shared<FakeDeviceApi>(1, 64 * kMiB);
  absl::StatusOr<Storage> a;
  {
    auto alloc = Make(api);
    a = alloc->Allocate(0, 4096, 0);
    ASSERT_TRUE(a.ok());
    ASSERT_TRUE(alloc->Allocate(0, 8192, 0).ok());  // Cached.
  }
  EXPECT_EQ(api->in_use_bytes(0), 4096u + 8192u);
  *a = Storage();
  EXPECT_EQ(api->in_use_bytes(0), 0u);
  EXPECT_EQ(api->mallocs(), api->frees());
}

TEST(CachingAllocator, TensorsFromItsAllocatorLiveOnTheDevice) {
  auto api = std::make_shared<FakeDeviceApi>(2, 64 * kMiB);
  auto alloc = Make(api);
  absl::StatusOr<Allocator*> on1 = alloc->ForStream(1, 3);
  ASSERT_TRUE(on1.ok());
  EXPECT_EQ(*alloc->ForStream(1, 3), *on1);
  absl::StatusOr<Tensor> t = Tensor::TryEmpty({4, 8}, DType::kFloat32, *on1);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->device(), Device::CUDA(1));
  EXPECT_EQ(alloc->Stats(1).allocated_bytes, 512u);
  EXPECT_EQ(alloc->Stats(0).allocations, 0u);
}

TEST(FakeDeviceApi, AQueuedCopyRunsOnlyWhenItsStreamDoes) {
  FakeDeviceApi api(1, kMiB);
  absl::StatusOr<void*> dev = api.Malloc(0, 64);
  ASSERT_TRUE(dev.ok());
  std::vector<char> host(64, 'a'), out(64, 'z');
  ASSERT_TRUE(api.MemcpyAsync(0, *dev, host.data(), 64, /*stream=*/1).ok());
  ASSERT_TRUE(api.MemcpyAsync(0, out.data(), *dev, 64, 1).ok());
  EXPECT_EQ(out[0], 'z');  // Not run yet: a reader must wait for stream 1.
  api.CompleteStream(0, 2);  // Another stream's progress changes nothing.
  EXPECT_EQ(out[63], 'z');
  ASSERT_TRUE(api.SynchronizeStream(0, 1).ok());
  EXPECT_EQ(out, host);
  EXPECT_TRUE(absl::IsInvalidArgument(api.MemcpyAsync(0, nullptr, host.data(), 1, 1)));
  EXPECT_TRUE(api.Free(0, *dev).ok());
}

TEST(CachingAllocator, ThreadsAllocateAndReleaseConsistently) {
  auto api = std::make_shared<FakeDeviceApi>(1, 512 * kMiB);
  auto alloc = Make(api);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      std::vector<Storage> held;
      for (int i = 0; i < 2000; ++i) {
        absl::StatusOr<Storage> s =
            alloc->Allocate(0, 1 + rng() % (2 << 20), /*stream=*/t % 2);
        ASSERT_TRUE(s.ok()) << s.status();
        if (rng() % 3 == 0) {
          ASSERT_TRUE(alloc->RecordStream(*s, 9).ok());
        }
        held.push_back(*std::move(s));
        if (held.size() > 8) held.erase(held.begin() + rng() % held.size());
        // Stream 9's work ends now and then, as a real stream's would.
        if (i % 50 == 49) api->CompleteStream(0, 9);
      }
    });
  }
  for (std::thread& th : threads) th.join();
  api->CompleteStream(0, 9);
  AllocatorStats st = alloc->Stats(0);
  EXPECT_EQ(st.allocated_bytes, 0u);
  EXPECT_EQ(st.pending_bytes, 0u);
  EXPECT_EQ(st.allocations, 8000u);
  EXPECT_GT(st.cache_hits, 0u);
  EXPECT_EQ(st.reserved_bytes, st.cached_bytes);
  ASSERT_TRUE(alloc->EmptyCache().ok());
  EXPECT_EQ(api->in_use_bytes(0), 0u);
  EXPECT_EQ(api->live_events(), 0u);
}

}  // namespace
}  // namespace cuda
}  // namespace ferry
