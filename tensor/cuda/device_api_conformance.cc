#include "ferry/tensor/cuda/device_api_conformance.h"

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "ferry/tensor/cuda/caching_allocator.h"
#include "ferry/tensor/cuda/copy.h"
#include "ferry/tensor/cuda/event.h"
#include "ferry/tensor/cuda/pinned_allocator.h"
#include "ferry/tensor/tensor.h"
#include "gmock/gmock.h"

namespace ferry {
namespace cuda {

using ::testing::HasSubstr;

void DeviceApiConformanceTest::SetUp() {
  absl::StatusOr<std::unique_ptr<DeviceApiFixture>> made = GetParam().make();
  if (absl::IsFailedPrecondition(made.status())) {
    GTEST_SKIP() << made.status();
  }
  ASSERT_TRUE(made.ok()) << made.status();
  fixture_ = std::move(*made);
}

namespace {

std::unique_ptr<CachingDeviceAllocator> NewAllocator(
    DeviceApiFixture& f, uint64_t limit = 0) {
  absl::StatusOr<std::unique_ptr<CachingDeviceAllocator>> a =
      CachingDeviceAllocator::Create(f.api(), {.limit_bytes = limit});
  EXPECT_TRUE(a.ok()) << a.status();
  return a.ok() ? std::move(*a) : nullptr;
}

TEST_P(DeviceApiConformanceTest, CountsDevices) {
  EXPECT_GE(fixture_->api()->DeviceCount(), 1);
}

TEST_P(DeviceApiConformanceTest, MallocIsAlignedAndFreeable) {
  DeviceMemoryApi& api = *fixture_->api();
  for (size_t n : {size_t{1}, size_t{512}, size_t{1} << 20,
                   (size_t{3} << 20) + 7}) {
    absl::StatusOr<void*> p = api.Malloc(0, n);
    ASSERT_TRUE(p.ok()) << n << ": " << p.status();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(*p) % 256, 0u) << n;
    EXPECT_TRUE(api.Free(0, *p).ok()) << n;
  }
}

TEST_P(DeviceApiConformanceTest, UnknownDeviceIsInvalidArgumentNamingIt) {
  DeviceMemoryApi& api = *fixture_->api();
  const int count = api.DeviceCount();
  for (int bad : {count, -1}) {
    absl::StatusOr<void*> p = api.Malloc(bad, 64);
    EXPECT_TRUE(absl::IsInvalidArgument(p.status())) << p.status();
    EXPECT_THAT(p.status().message(),
                HasSubstr(absl::StrCat(api.name(), ":", bad)));
    EXPECT_TRUE(absl::IsInvalidArgument(api.RecordEvent(bad, 0).status()));
  }
}

TEST_P(DeviceApiConformanceTest, ImpossibleMallocIsOutOfMemoryAndHarmless) {
  DeviceMemoryApi& api = *fixture_->api();
  absl::StatusOr<void*> huge = api.Malloc(0, size_t{1} << 50);
  EXPECT_TRUE(absl::IsResourceExhausted(huge.status())) << huge.status();
  EXPECT_THAT(huge.status().message(), HasSubstr(api.name() + ":0"));
  absl::StatusOr<void*> small = api.Malloc(0, 4096);
  ASSERT_TRUE(small.ok()) << "after a failed Malloc: " << small.status();
  EXPECT_TRUE(api.Free(0, *small).ok());
}

TEST_P(DeviceApiConformanceTest, EventIsDoneOnceItsStreamDrained) {
  DeviceMemoryApi& api = *fixture_->api();
  absl::StatusOr<StreamHandle> s = fixture_->NewStream(0);
  ASSERT_TRUE(s.ok()) << s.status();
  absl::StatusOr<EventHandle> ev = api.RecordEvent(0, *s);
  ASSERT_TRUE(ev.ok()) << ev.status();
  ASSERT_TRUE(fixture_->Drain(0, *s).ok());
  absl::StatusOr<bool> done = api.EventDone(0, *ev);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_TRUE(*done);
  EXPECT_TRUE(api.DestroyEvent(0, *ev).ok());
}

TEST_P(DeviceApiConformanceTest, AllocatorReusesABlockOnItsStream) {
  auto alloc = NewAllocator(*fixture_);
  ASSERT_NE(alloc, nullptr);
  absl::StatusOr<StreamHandle> s = fixture_->NewStream(0);
  ASSERT_TRUE(s.ok()) << s.status();
  void* first = nullptr;
  {
    absl::StatusOr<Storage> a = alloc->Allocate(0, 1000, *s);
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_TRUE(a->device().is_cuda());
    EXPECT_EQ(a->nbytes(), 1000u);
    first = a->data();
  }
  absl::StatusOr<Storage> b = alloc->Allocate(0, 900, *s);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->data(), first);
  AllocatorStats st = alloc->Stats(0);
  EXPECT_EQ(st.device_mallocs, 1u);
  EXPECT_EQ(st.cache_hits, 1u);
  EXPECT_EQ(st.allocated_bytes, 1024u);
}

TEST_P(DeviceApiConformanceTest, AllocatorKeepsStreamsApart) {
  auto alloc = NewAllocator(*fixture_);
  ASSERT_NE(alloc, nullptr);
  absl::StatusOr<StreamHandle> s1 = fixture_->NewStream(0);
  absl::StatusOr<StreamHandle> s2 = fixture_->NewStream(0);
  ASSERT_TRUE(s1.ok() && s2.ok());
  void* first = nullptr;
  {
    absl::StatusOr<Storage> a = alloc->Allocate(0, 4096, *s1);
    ASSERT_TRUE(a.ok()) << a.status();
    first = a->data();
  }
  absl::StatusOr<Storage> b = alloc->Allocate(0, 4096, *s2);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_NE(b->data(), first);
  EXPECT_EQ(alloc->Stats(0).device_mallocs, 2u);
}

TEST_P(DeviceApiConformanceTest, RecordedStreamReleasesTheBlockOnceDrained) {
  auto alloc = NewAllocator(*fixture_);
  ASSERT_NE(alloc, nullptr);
  absl::StatusOr<StreamHandle> s1 = fixture_->NewStream(0);
  absl::StatusOr<StreamHandle> s2 = fixture_->NewStream(0);
  ASSERT_TRUE(s1.ok() && s2.ok());
  void* first = nullptr;
  {
    absl::StatusOr<Storage> a = alloc->Allocate(0, 1 << 16, *s1);
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(alloc->RecordStream(*a, *s2).ok());
    first = a->data();
  }
  ASSERT_TRUE(fixture_->Drain(0, *s2).ok());
  AllocatorStats st = alloc->Stats(0);
  EXPECT_EQ(st.pending_bytes, 0u);
  EXPECT_EQ(st.cached_bytes, uint64_t{1} << 16);
  absl::StatusOr<Storage> b = alloc->Allocate(0, 1 << 16, *s1);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->data(), first);
}

TEST_P(DeviceApiConformanceTest, LimitRefusesNamingTheRequestAndTheCache) {
  const uint64_t mib = uint64_t{1} << 20;
  auto alloc = NewAllocator(*fixture_, 4 * mib);
  ASSERT_NE(alloc, nullptr);
  absl::StatusOr<Storage> a = alloc->Allocate(0, 3 * mib, 0);
  ASSERT_TRUE(a.ok()) << a.status();
  absl::StatusOr<Storage> b = alloc->Allocate(0, 2 * mib, 0);
  EXPECT_TRUE(absl::IsResourceExhausted(b.status())) << b.status();
  EXPECT_THAT(b.status().message(), HasSubstr(":0: out of memory"));
  EXPECT_THAT(b.status().message(), HasSubstr("requested 2097152 bytes"));
  EXPECT_THAT(b.status().message(), HasSubstr("3145728 bytes in use"));
  EXPECT_THAT(b.status().message(), HasSubstr("limit 4194304"));
  *a = Storage();  // Cached now: the next request evicts it to fit.
  absl::StatusOr<Storage> c = alloc->Allocate(0, 2 * mib, 0);
  ASSERT_TRUE(c.ok()) << c.status();
  AllocatorStats st = alloc->Stats(0);
  EXPECT_EQ(st.out_of_memory, 1u);
  EXPECT_EQ(st.device_frees, 1u);
  EXPECT_LE(st.reserved_bytes, 4 * mib);
}

TEST_P(DeviceApiConformanceTest, EmptyCacheReturnsCachedBlocks) {
  auto alloc = NewAllocator(*fixture_);
  ASSERT_NE(alloc, nullptr);
  absl::StatusOr<Storage> kept = alloc->Allocate(0, 2048, 0);
  ASSERT_TRUE(kept.ok());
  ASSERT_TRUE(alloc->Allocate(0, 1 << 20, 0).ok());  // Dropped: cached.
  EXPECT_EQ(alloc->Stats(0).cached_bytes, uint64_t{1} << 20);
  ASSERT_TRUE(alloc->EmptyCache().ok());
  AllocatorStats st = alloc->Stats(0);
  EXPECT_EQ(st.cached_bytes, 0u);
  EXPECT_EQ(st.device_frees, 1u);
  EXPECT_EQ(st.allocated_bytes, 2048u);
  EXPECT_EQ(st.reserved_bytes, 2048u);
}

TEST_P(DeviceApiConformanceTest, TensorsRoundTripThroughTheDevice) {
  auto alloc = NewAllocator(*fixture_);
  ASSERT_NE(alloc, nullptr);
  absl::StatusOr<StreamHandle> s = fixture_->NewStream(0);
  ASSERT_TRUE(s.ok()) << s.status();
  DeviceMemoryApi& api = *fixture_->api();
  // A strided source: the device copy is contiguous.
  const Tensor src = arange(0.0, 15.0, 1.0, DType::kFloat32)
                         .reshape({3, 5})
                         .transpose(0, 1);
  absl::StatusOr<Tensor> dev = CopyToDevice(src, 0, *s, *alloc, api);
  ASSERT_TRUE(dev.ok()) << dev.status();
  EXPECT_EQ(dev->device(), Device::CUDA(0));
  EXPECT_EQ(dev->sizes(), (std::vector<int64_t>{5, 3}));
  EXPECT_TRUE(dev->is_contiguous());
  absl::StatusOr<Tensor> back = CopyToHost(*dev, *s, api);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->device().is_cpu());
  EXPECT_TRUE(back->equal(src.contiguous())) << back->ToString();
  // Wrong-side sources are refused, naming the op and the device.
  absl::StatusOr<Tensor> twice = CopyToDevice(*dev, 0, *s, *alloc, api);
  EXPECT_TRUE(absl::IsInvalidArgument(twice.status()));
  EXPECT_THAT(twice.status().message(), HasSubstr("on cuda:0, not on cpu"));
  absl::StatusOr<Tensor> host = CopyToHost(src, *s, api);
  EXPECT_TRUE(absl::IsInvalidArgument(host.status()));
  EXPECT_THAT(host.status().message(), HasSubstr("not a device tensor"));
  absl::StatusOr<Tensor> strided = CopyToHost(dev->transpose(0, 1), *s, api);
  EXPECT_TRUE(absl::IsInvalidArgument(strided.status()));
  EXPECT_THAT(strided.status().message(), HasSubstr("not contiguous"));
}

std::unique_ptr<CachingHostAllocator> NewPinned(DeviceApiFixture& f,
                                                uint64_t limit = 0) {
  absl::StatusOr<std::unique_ptr<CachingHostAllocator>> a =
      CachingHostAllocator::Create(f.api(), {.limit_bytes = limit});
  EXPECT_TRUE(a.ok()) << a.status();
  return a.ok() ? std::move(*a) : nullptr;
}

TEST_P(DeviceApiConformanceTest, PinnedHostMemoryIsAlignedWritableAndFreeable) {
  DeviceMemoryApi& api = *fixture_->api();
  for (size_t n : {size_t{1}, size_t{4096}, (size_t{2} << 20) + 3}) {
    absl::StatusOr<void*> p = api.HostAlloc(n);
    ASSERT_TRUE(p.ok()) << n << ": " << p.status();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(*p) % 256, 0u) << n;
    static_cast<char*>(*p)[0] = 1;
    static_cast<char*>(*p)[n - 1] = 2;
    EXPECT_TRUE(api.HostFree(*p).ok()) << n;
  }
  EXPECT_TRUE(absl::IsInvalidArgument(api.HostAlloc(0).status()));
}

TEST_P(DeviceApiConformanceTest, CreatedStreamsAndWaitedEvents) {
  DeviceMemoryApi& api = *fixture_->api();
  absl::StatusOr<StreamHandle> s = api.CreateStream(0);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_NE(*s, 0u);
  absl::StatusOr<void*> dev = api.Malloc(0, 4096);
  absl::StatusOr<void*> host = api.HostAlloc(4096);
  ASSERT_TRUE(dev.ok() && host.ok());
  std::memset(*host, 0x61, 4096);
  ASSERT_TRUE(api.MemcpyAsync(0, *dev, *host, 4096, *s).ok());
  ASSERT_TRUE(api.SynchronizeStream(0, *s).ok());
  std::memset(*host, 0, 4096);  // Overwritten by the copy back below.
  ASSERT_TRUE(api.MemcpyAsync(0, *host, *dev, 4096, *s).ok());
  absl::StatusOr<EventHandle> ev = api.RecordEvent(0, *s);
  ASSERT_TRUE(ev.ok()) << ev.status();
  ASSERT_TRUE(api.WaitEvent(0, *ev).ok());
  absl::StatusOr<bool> done = api.EventDone(0, *ev);
  ASSERT_TRUE(done.ok());
  EXPECT_TRUE(*done);
  EXPECT_EQ(static_cast<unsigned char*>(*host)[4095], 0x61);
  EXPECT_TRUE(api.DestroyEvent(0, *ev).ok());
  EXPECT_TRUE(api.HostFree(*host).ok());
  EXPECT_TRUE(api.Free(0, *dev).ok());
  EXPECT_TRUE(api.DestroyStream(0, *s).ok());
  const int bad = api.DeviceCount();
  absl::StatusOr<StreamHandle> none = api.CreateStream(bad);
  EXPECT_TRUE(absl::IsInvalidArgument(none.status())) << none.status();
  EXPECT_THAT(none.status().message(),
              HasSubstr(absl::StrCat(api.name(), ":", bad)));
}

TEST_P(DeviceApiConformanceTest, StreamWaitEventOrdersTwoStreams) {
  DeviceMemoryApi& api = *fixture_->api();
  absl::StatusOr<StreamHandle> s1 = fixture_->NewStream(0);
  absl::StatusOr<StreamHandle> s2 = fixture_->NewStream(0);
  ASSERT_TRUE(s1.ok() && s2.ok());
  absl::StatusOr<void*> dev = api.Malloc(0, 1 << 20);
  absl::StatusOr<void*> in = api.HostAlloc(1 << 20);
  absl::StatusOr<void*> out = api.HostAlloc(1 << 20);
  ASSERT_TRUE(dev.ok() && in.ok() && out.ok());
  std::memset(*in, 0x2b, 1 << 20);
  std::memset(*out, 0, 1 << 20);
  ASSERT_TRUE(api.MemcpyAsync(0, *dev, *in, 1 << 20, *s1).ok());
  absl::StatusOr<EventHandle> ev = api.RecordEvent(0, *s1);
  ASSERT_TRUE(ev.ok()) << ev.status();
  ASSERT_TRUE(api.StreamWaitEvent(0, *s2, *ev).ok());
  ASSERT_TRUE(api.MemcpyAsync(0, *out, *dev, 1 << 20, *s2).ok());
  ASSERT_TRUE(fixture_->Drain(0, *s1).ok());
  ASSERT_TRUE(fixture_->Drain(0, *s2).ok());
  EXPECT_EQ(static_cast<unsigned char*>(*out)[(1 << 20) - 1], 0x2b);
  EXPECT_TRUE(api.DestroyEvent(0, *ev).ok());
  EXPECT_TRUE(api.HostFree(*in).ok());
  EXPECT_TRUE(api.HostFree(*out).ok());
  EXPECT_TRUE(api.Free(0, *dev).ok());
}

TEST_P(DeviceApiConformanceTest, PinnedBlockIsReusedOnceItsStreamDrained) {
  auto pinned = NewPinned(*fixture_);
  ASSERT_NE(pinned, nullptr);
  absl::StatusOr<StreamHandle> s = fixture_->NewStream(0);
  ASSERT_TRUE(s.ok()) << s.status();
  DeviceMemoryApi& api = *fixture_->api();
  absl::StatusOr<void*> dev = api.Malloc(0, 1 << 16);
  ASSERT_TRUE(dev.ok());
  void* first = nullptr;
  {
    absl::StatusOr<Storage> a = pinned->Allocate(1 << 16);
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_TRUE(a->device().is_cpu());
    ASSERT_TRUE(pinned->RecordStream(*a, 0, *s).ok());
    ASSERT_TRUE(api.MemcpyAsync(0, *dev, a->data(), 1 << 16, *s).ok());
    first = a->data();
  }
  ASSERT_TRUE(fixture_->Drain(0, *s).ok());
  AllocatorStats st = pinned->Stats();
  EXPECT_EQ(st.pending_bytes, 0u);
  EXPECT_EQ(st.cached_bytes, uint64_t{1} << 16);
  absl::StatusOr<Storage> b = pinned->Allocate(1 << 16);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->data(), first);
  EXPECT_EQ(pinned->Stats().device_mallocs, 1u);
  EXPECT_TRUE(api.Free(0, *dev).ok());
}

TEST_P(DeviceApiConformanceTest, PinnedLimitRefusesNamingTheRequestAndCache) {
  const uint64_t mib = uint64_t{1} << 20;
  auto pinned = NewPinned(*fixture_, 4 * mib);
  ASSERT_NE(pinned, nullptr);
  absl::StatusOr<Storage> a = pinned->Allocate(3 * mib);
  ASSERT_TRUE(a.ok()) << a.status();
  absl::StatusOr<Storage> b = pinned->Allocate(2 * mib);
  EXPECT_TRUE(absl::IsResourceExhausted(b.status())) << b.status();
  EXPECT_THAT(b.status().message(), HasSubstr("requested 2097152 bytes"));
  EXPECT_THAT(b.status().message(), HasSubstr("3145728 bytes in use"));
  EXPECT_THAT(b.status().message(), HasSubstr("limit 4194304"));
  *a = Storage();
  ASSERT_TRUE(pinned->Allocate(2 * mib).ok());
  ASSERT_TRUE(pinned->EmptyCache().ok());
  AllocatorStats st = pinned->Stats();
  EXPECT_EQ(st.device_frees, 2u);
  EXPECT_EQ(st.reserved_bytes, 0u);
}

TEST_P(DeviceApiConformanceTest, AsyncCopiesRoundTripThroughPinnedMemory) {
  auto alloc = NewAllocator(*fixture_);
  auto pinned = NewPinned(*fixture_);
  ASSERT_TRUE(alloc != nullptr && pinned != nullptr);
  absl::StatusOr<StreamHandle> s = fixture_->NewStream(0);
  ASSERT_TRUE(s.ok()) << s.status();
  const Tensor src = arange(0.0, 3000.0, 1.0, DType::kFloat64)
                         .reshape({60, 50})
                         .transpose(0, 1);
  absl::StatusOr<AsyncCopy> there =
      CopyToDeviceAsync(src, 0, *s, *alloc, *pinned);
  ASSERT_TRUE(there.ok()) << there.status();
  EXPECT_EQ(there->tensor.device(), Device::CUDA(0));
  // Queued behind the first copy on the same stream: no wait between.
  absl::StatusOr<AsyncCopy> back =
      CopyToHostAsync(there->tensor, *s, *alloc, *pinned);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->tensor.device().is_cpu());
  EXPECT_TRUE(pinned->IsPinned(back->tensor.storage()));
  ASSERT_TRUE(back->done.Wait().ok());
  absl::StatusOr<bool> first_done = there->done.Query();
  ASSERT_TRUE(first_done.ok());
  EXPECT_TRUE(*first_done);  // Recorded before the later, waited event.
  EXPECT_TRUE(back->tensor.equal(src.contiguous()));
  // Everything dropped and the stream drained: nothing stays pending.
  there->tensor = Tensor();
  back->tensor = Tensor();
  ASSERT_TRUE(fixture_->Drain(0, *s).ok());
  EXPECT_EQ(pinned->Stats().pending_bytes, 0u);
  EXPECT_EQ(pinned->Stats().allocated_bytes, 0u);
  EXPECT_EQ(alloc->Stats(0).pending_bytes, 0u);
}

}  // namespace
}  // namespace cuda
}  // namespace ferry
