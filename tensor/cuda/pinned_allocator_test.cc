// CachingHostAllocator and the asynchronous copies (copy.h) on
// FakeDeviceApi, whose streams run only when the test completes them (the
// conformance suite covers what every API shares).
#include "ferry/tensor/cuda/pinned_allocator.h"

#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "ferry/tensor/cuda/caching_allocator.h"
#include "ferry/tensor/cuda/copy.h"
#include "ferry/tensor/cuda/event.h"
#include "ferry/tensor/cuda/fake_device_api.h"
#include "ferry/tensor/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ferry {
namespace cuda {
namespace {

using ::testing::HasSubstr;
constexpr uint64_t kMiB = uint64_t{1} << 20;

class PinnedTest : public ::testing::Test {
 protected:
  void SetUp() override { MakeAllocators(0); }
  void MakeAllocators(uint64_t pinned_limit) {
    auto d = CachingDeviceAllocator::Create(api_, {});
    ASSERT_TRUE(d.ok()) << d.status();
    alloc_ = std::move(*d);
    auto p = CachingHostAllocator::Create(api_, {.limit_bytes = pinned_limit});
    ASSERT_TRUE(p.ok()) << p.status();
    pinned_ = std::move(*p);
  }
  std::vector<float> Floats(const Tensor& t) {
    std::vector<float> v(t.numel());
    std::memcpy(v.data(), t.data_ptr(), t.nbytes());
    return v;
  }

  std::shared_ptr<FakeDeviceApi> api_ =
      std::make_shared<FakeDeviceApi>(2, 64 * kMiB);
  std::unique_ptr<CachingDeviceAllocator> alloc_;
  std::unique_ptr<CachingHostAllocator> pinned_;
};

TEST_F(PinnedTest, BlocksArePinnedCpuStorageAndReused) {
  void* first = nullptr;
  {
    absl::StatusOr<Storage> a = pinned_->Allocate(1000);
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_TRUE(a->device().is_cpu());
    EXPECT_EQ(a->nbytes(), 1000u);
    EXPECT_TRUE(api_->IsPinned(a->data()));
    EXPECT_TRUE(pinned_->IsPinned(*a));
    first = a->data();
  }
  EXPECT_EQ(api_->live_host_blocks(), 1u);  // Cached, not freed.
  absl::StatusOr<Storage> b = pinned_->Allocate(900);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->data(), first);
  AllocatorStats st = pinned_->Stats();
  EXPECT_EQ(st.device_mallocs, 1u);
  EXPECT_EQ(st.cache_hits, 1u);
  EXPECT_EQ(st.allocated_bytes, 1024u);
  // Pageable memory is not pinned, to the API or to the allocator.
  Tensor pageable = zeros({16}, DType::kFloat32);
  EXPECT_FALSE(api_->IsPinned(pageable.data_ptr()));
  EXPECT_FALSE(pinned_->IsPinned(pageable.storage()));
}

TEST_F(PinnedTest, BlockUsedByAQueuedCopyWaitsForItsStream) {
  absl::StatusOr<Storage> dev = alloc_->Allocate(0, 4096, 7);
  ASSERT_TRUE(dev.ok());
  void* first = nullptr;
  {
    absl::StatusOr<Storage> a = pinned_->Allocate(4096);
    ASSERT_TRUE(a.ok()) << a.status();
    std::memset(a->data(), 0x5a, 4096);
    ASSERT_TRUE(pinned_->RecordStream(*a, 0, 7).ok());
    ASSERT_TRUE(api_->MemcpyAsync(0, dev->data(), a->data(), 4096, 7).ok());
    first = a->data();
  }
  AllocatorStats st = pinned_->Stats();
  EXPECT_EQ(st.pending_bytes, 4096u);
  EXPECT_EQ(st.cached_bytes, 0u);
  {
    absl::StatusOr<Storage> other = pinned_->Allocate(4096);
    ASSERT_TRUE(other.ok());
    EXPECT_NE(other->data(), first) << "reused while its copy was queued";
  }
  // EmptyCache frees the cached block, not the pending one.
  ASSERT_TRUE(pinned_->EmptyCache().ok());
  EXPECT_EQ(api_->live_host_blocks(), 1u);
  EXPECT_EQ(pinned_->Stats().pending_bytes, 4096u);
  api_->CompleteStream(0, 7);
  st = pinned_->Stats();
  EXPECT_EQ(st.pending_bytes, 0u);
  EXPECT_EQ(st.cached_bytes, 4096u);
  absl::StatusOr<Storage> again = pinned_->Allocate(4096);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->data(), first);
  EXPECT_EQ(static_cast<unsigned char*>(dev->data())[4095], 0x5a);
  EXPECT_EQ(api_->live_events(), 0u);
}

TEST_F(PinnedTest, LimitIsResourceExhaustedNamingTheRequestAndTheCache) {
  MakeAllocators(4 * kMiB);
  absl::StatusOr<Storage> a = pinned_->Allocate(3 * kMiB);
  ASSERT_TRUE(a.ok()) << a.status();
  absl::StatusOr<Storage> b = pinned_->Allocate(2 * kMiB);
  EXPECT_TRUE(absl::IsResourceExhausted(b.status())) << b.status();
  EXPECT_THAT(b.status().message(),
              HasSubstr("fake pinned host memory exhausted"));
  EXPECT_THAT(b.status().message(), HasSubstr("requested 2097152 bytes"));
  EXPECT_THAT(b.status().message(), HasSubstr("3145728 bytes in use, 0 cached"));
  EXPECT_THAT(b.status().message(), HasSubstr("limit 4194304"));
  *a = Storage();  // Cached now: the next request returns it to fit.
  absl::StatusOr<Storage> c = pinned_->Allocate(2 * kMiB);
  ASSERT_TRUE(c.ok()) << c.status();
  AllocatorStats st = pinned_->Stats();
  EXPECT_EQ(st.out_of_memory, 1u);
  EXPECT_EQ(st.device_frees, 1u);
  EXPECT_LE(st.reserved_bytes, 4 * kMiB);
  absl::StatusOr<Storage> huge = pinned_->Allocate(size_t{1} << 50);
  EXPECT_TRUE(absl::IsResourceExhausted(huge.status())) << huge.status();
}

TEST_F(PinnedTest, HostOutOfMemoryReturnsTheCacheAndRetries) {
  api_->SetHostCapacity(3 * kMiB);
  ASSERT_TRUE(pinned_->Allocate(2 * kMiB).ok());  // Dropped: cached.
  absl::StatusOr<Storage> b = pinned_->Allocate(kMiB + kMiB / 2);
  ASSERT_TRUE(b.ok()) << b.status();
  AllocatorStats st = pinned_->Stats();
  EXPECT_EQ(st.device_mallocs, 3u);  // 2 MiB, the refused 1.5, the retry.
  EXPECT_EQ(st.device_frees, 1u);
  absl::StatusOr<Storage> c = pinned_->Allocate(2 * kMiB);
  EXPECT_TRUE(absl::IsResourceExhausted(c.status())) << c.status();
  EXPECT_THAT(c.status().message(), HasSubstr("out of pinned memory"));
  EXPECT_THAT(c.status().message(), HasSubstr("1572864 bytes in use"));
}

TEST_F(PinnedTest, RecordStreamRefusesForeignStorageAndUnknownDevices) {
  Tensor pageable = zeros({4}, DType::kFloat32);
  absl::Status s = pinned_->RecordStream(pageable.storage(), 0, 1);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("not from this pinned allocator"));
  absl::StatusOr<Storage> a = pinned_->Allocate(64);
  ASSERT_TRUE(a.ok());
  s = pinned_->RecordStream(*a, 5, 1);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("fake:5"));
}

TEST_F(PinnedTest, FailedEventRecordWaitsForTheStreamInstead) {
  absl::StatusOr<Storage> dev = alloc_->Allocate(0, 512, 7);
  ASSERT_TRUE(dev.ok());
  void* first = nullptr;
  {
    absl::StatusOr<Storage> a = pinned_->Allocate(512);
    ASSERT_TRUE(a.ok());
    std::memset(a->data(), 0x33, 512);
    ASSERT_TRUE(pinned_->RecordStream(*a, 0, 7).ok());
    ASSERT_TRUE(api_->MemcpyAsync(0, dev->data(), a->data(), 512, 7).ok());
    first = a->data();
    api_->FailRecordEvent(1);
  }
  // The release drained stream 7 rather than leave the block unordered.
  EXPECT_EQ(static_cast<unsigned char*>(dev->data())[0], 0x33);
  AllocatorStats st = pinned_->Stats();
  EXPECT_EQ(st.pending_bytes, 0u);
  EXPECT_EQ(st.cached_bytes, 512u);
  absl::StatusOr<Storage> again = pinned_->Allocate(512);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->data(), first);
}

TEST_F(PinnedTest, DestroyedWithAPendingBlockItWaitsThenFrees) {
  absl::StatusOr<Storage> dev = alloc_->Allocate(0, 512, 7);
  ASSERT_TRUE(dev.ok());
  {
    absl::StatusOr<Storage> a = pinned_->Allocate(512);
    ASSERT_TRUE(a.ok());
    std::memset(a->data(), 0x44, 512);
    ASSERT_TRUE(pinned_->RecordStream(*a, 0, 7).ok());
    ASSERT_TRUE(api_->MemcpyAsync(0, dev->data(), a->data(), 512, 7).ok());
  }
  EXPECT_EQ(pinned_->Stats().pending_bytes, 512u);
  pinned_.reset();
  // FakeDeviceApi refuses HostFree of a block a queued copy uses, so every
  // block freed means the copy ran first.
  EXPECT_EQ(api_->live_host_blocks(), 0u);
  EXPECT_EQ(api_->host_frees(), api_->host_allocs());
  EXPECT_EQ(static_cast<unsigned char*>(dev->data())[511], 0x44);
  EXPECT_EQ(api_->live_events(), 0u);
}

TEST_F(PinnedTest, ThreadsShareTheCache) {
  constexpr int kThreads = 4, kRounds = 200;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([this, t] {
      for (int i = 0; i < kRounds; ++i) {
        absl::StatusOr<Storage> s = pinned_->Allocate(512 * (1 + (i + t) % 4));
        ASSERT_TRUE(s.ok()) << s.status();
        static_cast<char*>(s->data())[0] = static_cast<char>(i);
        ASSERT_TRUE(pinned_->RecordStream(*s, t % 2, 100 + t).ok());
        if (i % 10 == 0) api_->CompleteStream(t % 2, 100 + t);
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) api_->CompleteStream(t % 2, 100 + t);
  AllocatorStats st = pinned_->Stats();
  EXPECT_EQ(st.allocations, uint64_t{kThreads * kRounds});
  EXPECT_EQ(st.allocated_bytes, 0u);
  EXPECT_EQ(st.pending_bytes, 0u);
  EXPECT_GT(st.cache_hits, 0u);
  EXPECT_EQ(api_->live_host_blocks(), st.device_mallocs - st.device_frees);
  EXPECT_EQ(api_->live_events(), 0u);
}

TEST_F(PinnedTest, CopyToDeviceAsyncRunsOnlyWithItsStream) {
  // A cached device block of the right class, marked: the copy lands there.
  void* marked = nullptr;
  {
    absl::StatusOr<Storage> d = alloc_->Allocate(0, 48, 3);
    ASSERT_TRUE(d.ok());
    std::memset(d->data(), 0xab, 48);
    marked = d->data();
  }
  Tensor src = arange(0.0, 12.0, 1.0, DType::kFloat32).reshape({3, 4});
  const std::vector<float> want = Floats(src);
  absl::StatusOr<AsyncCopy> c = CopyToDeviceAsync(src, 0, 3, *alloc_, *pinned_);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->tensor.device(), Device::CUDA(0));
  EXPECT_EQ(c->tensor.sizes(), (std::vector<int64_t>{3, 4}));
  ASSERT_EQ(c->tensor.data_ptr(), marked);
  EXPECT_EQ(api_->pinned_copies(), 1u);
  // Queued, not run: the device bytes are the old ones.
  EXPECT_EQ(static_cast<unsigned char*>(marked)[0], 0xab);
  absl::StatusOr<bool> done = c->done.Query();
  ASSERT_TRUE(done.ok());
  EXPECT_FALSE(*done);
  // The staging block was dropped by the call, and waits for stream 3.
  EXPECT_EQ(pinned_->Stats().pending_bytes, 512u);
  // The source was staged: changing it now does not change the copy.
  src.fill_(-1.0);
  api_->CompleteStream(0, 3);
  done = c->done.Query();
  ASSERT_TRUE(done.ok());
  EXPECT_TRUE(*done);
  absl::StatusOr<Tensor> back = CopyToHost(c->tensor, 3, *api_);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(Floats(*back), want);
  // The staging block went back to the cache once its copy ran.
  AllocatorStats st = pinned_->Stats();
  EXPECT_EQ(st.allocated_bytes, 0u);
  EXPECT_EQ(st.pending_bytes, 0u);
  EXPECT_EQ(st.cached_bytes, 512u);
}

TEST_F(PinnedTest, StagingBlockIsNotReusedWhileItsCopyIsQueued) {
  // Events dropped at once: only the allocator orders the staging blocks.
  Tensor one = full({64}, 1.0, DType::kFloat32);
  Tensor two = full({64}, 2.0, DType::kFloat32);
  absl::StatusOr<AsyncCopy> a = CopyToDeviceAsync(one, 0, 3, *alloc_, *pinned_);
  ASSERT_TRUE(a.ok()) << a.status();
  a->done = StreamEvent();
  absl::StatusOr<AsyncCopy> b = CopyToDeviceAsync(two, 0, 3, *alloc_, *pinned_);
  ASSERT_TRUE(b.ok()) << b.status();
  b->done = StreamEvent();
  AllocatorStats st = pinned_->Stats();
  EXPECT_EQ(st.device_mallocs, 2u) << "the first block was reused while queued";
  EXPECT_EQ(st.pending_bytes, 2 * 512u);
  api_->CompleteStream(0, 3);
  absl::StatusOr<Tensor> ha = CopyToHost(a->tensor, 3, *api_);
  absl::StatusOr<Tensor> hb = CopyToHost(b->tensor, 3, *api_);
  ASSERT_TRUE(ha.ok() && hb.ok());
  EXPECT_TRUE(ha->equal(one)) << ha->ToString();
  EXPECT_TRUE(hb->equal(two)) << hb->ToString();
  // Done now: a third copy reuses a staging block.
  absl::StatusOr<AsyncCopy> c = CopyToDeviceAsync(one, 0, 3, *alloc_, *pinned_);
  ASSERT_TRUE(c.ok()) << c.status();
  st = pinned_->Stats();
  EXPECT_EQ(st.device_mallocs, 2u);
  EXPECT_EQ(st.cache_hits, 1u);
}

TEST_F(PinnedTest, PinnedSourceIsCopiedFromAndHeldUntilTheCopyRan) {
  absl::StatusOr<Tensor> src =
      Tensor::TryEmpty({128}, DType::kFloat32, pinned_->allocator());
  ASSERT_TRUE(src.ok()) << src.status();
  src->fill_(7.0);
  const Tensor want = src->clone();
  absl::StatusOr<AsyncCopy> c =
      CopyToDeviceAsync(*src, 0, 3, *alloc_, *pinned_);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(pinned_->Stats().allocations, 1u) << "a pinned source was staged";
  EXPECT_EQ(api_->pinned_copies(), 1u);
  *src = Tensor();
  c->done = StreamEvent();
  EXPECT_EQ(pinned_->Stats().pending_bytes, 512u);
  api_->CompleteStream(0, 3);
  EXPECT_EQ(pinned_->Stats().pending_bytes, 0u);
  absl::StatusOr<Tensor> back = CopyToHost(c->tensor, 3, *api_);
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(back->equal(want));
}

TEST_F(PinnedTest, CopyToHostAsyncFillsPinnedMemoryWhenTheStreamRuns) {
  Tensor src = arange(0.0, 128.0, 1.0, DType::kFloat32);
  absl::StatusOr<Tensor> dev = CopyToDevice(src, 0, 1, *alloc_, *api_);
  ASSERT_TRUE(dev.ok()) << dev.status();
  {
    absl::StatusOr<Storage> p = pinned_->Allocate(512);  // The result's block.
    ASSERT_TRUE(p.ok());
    std::memset(p->data(), 0xcd, 512);
  }
  absl::StatusOr<AsyncCopy> c = CopyToHostAsync(*dev, 3, *alloc_, *pinned_);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->tensor.device().is_cpu());
  EXPECT_TRUE(api_->IsPinned(c->tensor.data_ptr()));
  EXPECT_EQ(static_cast<unsigned char*>(c->tensor.data_ptr())[0], 0xcd);
  // The device source, made for stream 1 and read on stream 3, is held for
  // stream 3 even when everyone drops it.
  *dev = Tensor();
  EXPECT_EQ(alloc_->Stats(0).pending_bytes, 512u);
  ASSERT_TRUE(c->done.Wait().ok());  // The fake completes stream 3.
  EXPECT_TRUE(c->tensor.equal(src));
  EXPECT_EQ(alloc_->Stats(0).pending_bytes, 0u);
}

TEST_F(PinnedTest, AsyncCopiesRefuseBadInputNamingIt) {
  Tensor cpu = zeros({2, 3}, DType::kFloat32);
  absl::StatusOr<AsyncCopy> bad_dev =
      CopyToDeviceAsync(cpu, 7, 0, *alloc_, *pinned_);
  EXPECT_TRUE(absl::IsInvalidArgument(bad_dev.status())) << bad_dev.status();
  EXPECT_THAT(bad_dev.status().message(), HasSubstr("fake:7"));
  absl::StatusOr<Tensor> dev = CopyToDevice(cpu, 0, 0, *alloc_, *api_);
  ASSERT_TRUE(dev.ok());
  absl::StatusOr<AsyncCopy> twice =
      CopyToDeviceAsync(*dev, 0, 0, *alloc_, *pinned_);
  EXPECT_TRUE(absl::IsInvalidArgument(twice.status()));
  EXPECT_THAT(twice.status().message(), HasSubstr("on cuda:0, not on cpu"));
  absl::StatusOr<AsyncCopy> host = CopyToHostAsync(cpu, 0, *alloc_, *pinned_);
  EXPECT_TRUE(absl::IsInvalidArgument(host.status()));
  EXPECT_THAT(host.status().message(), HasSubstr("not a device tensor"));
  absl::StatusOr<AsyncCopy> strided =
      CopyToHostAsync(dev->transpose(0, 1), 0, *alloc_, *pinned_);
  EXPECT_TRUE(absl::IsInvalidArgument(strided.status()));
  EXPECT_THAT(strided.status().message(), HasSubstr("not contiguous"));
  auto other = CachingDeviceAllocator::Create(api_, {});
  ASSERT_TRUE(other.ok());
  absl::StatusOr<AsyncCopy> foreign =
      CopyToHostAsync(*dev, 0, **other, *pinned_);
  EXPECT_TRUE(absl::IsInvalidArgument(foreign.status()));
  EXPECT_THAT(foreign.status().message(),
              HasSubstr("not from the given device allocator"));
  EXPECT_EQ(api_->pinned_copies(), 0u);  // Nothing was queued.
}

TEST_F(PinnedTest, AStreamWaitHoldsLaterWorkUntilTheEventsStreamRan) {
  absl::StatusOr<Storage> a = pinned_->Allocate(512);
  absl::StatusOr<Storage> b = pinned_->Allocate(512);
  absl::StatusOr<Storage> dev = alloc_->Allocate(0, 512, 1);
  ASSERT_TRUE(a.ok() && b.ok() && dev.ok());
  std::memset(a->data(), 0x11, 512);
  std::memset(b->data(), 0, 512);
  ASSERT_TRUE(api_->MemcpyAsync(0, dev->data(), a->data(), 512, 1).ok());
  absl::StatusOr<StreamEvent> written = StreamEvent::Record(api_, 0, 1);
  ASSERT_TRUE(written.ok());
  ASSERT_TRUE(written->MakeStreamWait(0, 2).ok());
  ASSERT_TRUE(api_->MemcpyAsync(0, b->data(), dev->data(), 512, 2).ok());
  absl::StatusOr<EventHandle> read = api_->RecordEvent(0, 2);
  ASSERT_TRUE(read.ok());
  // Stream 2 stops at the wait: its copy has not run, its event is not done.
  EXPECT_FALSE(api_->CompleteStream(0, 2));
  EXPECT_EQ(static_cast<unsigned char*>(b->data())[0], 0);
  EXPECT_EQ(api_->SynchronizeStream(0, 2).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(api_->WaitEvent(0, *read).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(api_->CompleteStream(0, 1));
  EXPECT_TRUE(api_->CompleteStream(0, 2));
  EXPECT_EQ(static_cast<unsigned char*>(b->data())[511], 0x11);
  absl::StatusOr<bool> done = api_->EventDone(0, *read);
  ASSERT_TRUE(done.ok());
  EXPECT_TRUE(*done);
  ASSERT_TRUE(api_->DestroyEvent(0, *read).ok());
}

TEST_F(PinnedTest, StreamEventsAreSmallMoveOnlyHandles) {
  StreamEvent none;
  absl::StatusOr<bool> d = none.Query();
  ASSERT_TRUE(d.ok());
  EXPECT_TRUE(*d);
  EXPECT_TRUE(none.Wait().ok());
  absl::StatusOr<StreamEvent> e = StreamEvent::Record(api_, 1, 9);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->device(), 1);
  EXPECT_EQ(api_->live_events(), 1u);
  StreamEvent moved = std::move(*e);
  EXPECT_EQ(e->handle(), 0u);
  d = moved.Query();
  ASSERT_TRUE(d.ok());
  EXPECT_FALSE(*d);
  api_->CompleteStream(1, 9);
  d = moved.Query();
  ASSERT_TRUE(d.ok());
  EXPECT_TRUE(*d);
  moved = StreamEvent();
  EXPECT_EQ(api_->live_events(), 0u);
  EXPECT_TRUE(absl::IsInvalidArgument(StreamEvent::Record(api_, 4, 0).status()));
}

}  // namespace
}  // namespace cuda
}  // namespace ferry
