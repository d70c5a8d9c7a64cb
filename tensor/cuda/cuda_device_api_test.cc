// The DeviceMemoryApi conformance suite on CudaDeviceApi, and the caching
// and pinned allocators over a busy stream: skipped, naming CUDA's reason,
// where no GPU is visible.
#include <cuda_runtime_api.h>

#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ferry/tensor/cuda/caching_allocator.h"
#include "ferry/tensor/cuda/copy.h"
#include "ferry/tensor/cuda/cuda_device_api.h"
#include "ferry/tensor/cuda/device_api_conformance.h"
#include "ferry/tensor/cuda/pinned_allocator.h"
#include "ferry/tensor/tensor.h"
#include "gmock/gmock.h"

namespace ferry {
namespace cuda {
namespace {

absl::Status Check(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(err)));
}

class CudaFixture : public DeviceApiFixture {
 public:
  explicit CudaFixture(std::shared_ptr<CudaDeviceApi> api)
      : api_(std::move(api)) {}
  ~CudaFixture() override {
    for (cudaStream_t s : streams_) cudaStreamDestroy(s);
  }
  std::shared_ptr<DeviceMemoryApi> api() override { return api_; }
  absl::StatusOr<StreamHandle> NewStream(int device) override {
    absl::Status set = Check(cudaSetDevice(device), "cudaSetDevice");
    if (!set.ok()) return set;
    cudaStream_t s = nullptr;
    absl::Status made = Check(
        cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
    if (!made.ok()) return made;
    streams_.push_back(s);
    return reinterpret_cast<StreamHandle>(s);
  }
  absl::Status Drain(int /*device*/, StreamHandle stream) override {
    return Check(cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(stream)),
                 "cudaStreamSynchronize");
  }

 private:
  std::shared_ptr<CudaDeviceApi> api_;
  std::vector<cudaStream_t> streams_;
};

INSTANTIATE_TEST_SUITE_P(
    Cuda, DeviceApiConformanceTest,
    ::testing::Values(DeviceApiConformanceParam{
        "cuda", []() -> absl::StatusOr<std::unique_ptr<DeviceApiFixture>> {
          absl::StatusOr<std::shared_ptr<CudaDeviceApi>> api =
              CudaDeviceApi::Create();
          if (!api.ok()) return api.status();
          return std::make_unique<CudaFixture>(*api);
        }}),
    [](const auto& info) { return info.param.name; });

// A block written on one stream and recorded on a second, busy one is not
// handed out again until the second stream's work is done.
TEST(CudaCachingAllocator, BusyRecordedStreamHoldsTheBlock) {
  absl::StatusOr<std::shared_ptr<CudaDeviceApi>> api = CudaDeviceApi::Create();
  if (!api.ok()) GTEST_SKIP() << api.status();
  CudaFixture f(*api);
  absl::StatusOr<StreamHandle> s1 = f.NewStream(0);
  absl::StatusOr<StreamHandle> s2 = f.NewStream(0);
  ASSERT_TRUE(s1.ok() && s2.ok());
  auto alloc = CachingDeviceAllocator::Create(*api, {});
  ASSERT_TRUE(alloc.ok()) << alloc.status();
  // Keeps s2 busy: it waits for an event that the host records only later.
  cudaEvent_t gate = nullptr;
  cudaStream_t gate_stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&gate_stream, cudaStreamNonBlocking),
            cudaSuccess);
  ASSERT_EQ(cudaEventCreateWithFlags(&gate, cudaEventDisableTiming),
            cudaSuccess);
  // A large memset on gate_stream, then the gate recorded after it: s2 waits
  // on the gate, so its work ends only after the memset.
  void* scratch = nullptr;
  const size_t scratch_bytes = size_t{1} << 30;
  ASSERT_EQ(cudaMalloc(&scratch, scratch_bytes), cudaSuccess);
  void* first = nullptr;
  {
    absl::StatusOr<Storage> a = (*alloc)->Allocate(0, 1 << 20, *s1);
    ASSERT_TRUE(a.ok()) << a.status();
    first = a->data();
    for (int i = 0; i < 8; ++i) {
      ASSERT_EQ(cudaMemsetAsync(scratch, i, scratch_bytes, gate_stream),
                cudaSuccess);
    }
    ASSERT_EQ(cudaEventRecord(gate, gate_stream), cudaSuccess);
    ASSERT_EQ(cudaStreamWaitEvent(reinterpret_cast<cudaStream_t>(*s2), gate, 0),
              cudaSuccess);
    ASSERT_EQ(cudaMemsetAsync(a->data(), 1, 1 << 20,
                              reinterpret_cast<cudaStream_t>(*s2)),
              cudaSuccess);
    ASSERT_TRUE((*alloc)->RecordStream(*a, *s2).ok());
  }
  // 8 GiB of memset take milliseconds: the block is pending now unless the
  // device was that fast; only the ordering after the drain is asserted.
  AllocatorStats before = (*alloc)->Stats(0);
  if (before.pending_bytes > 0) {
    absl::StatusOr<Storage> b = (*alloc)->Allocate(0, 1 << 20, *s1);
    ASSERT_TRUE(b.ok());
    EXPECT_NE(b->data(), first) << "reused while s2 still used it";
  }
  ASSERT_EQ(cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(*s2)),
            cudaSuccess);
  AllocatorStats after = (*alloc)->Stats(0);
  EXPECT_EQ(after.pending_bytes, 0u);
  absl::StatusOr<Storage> c = (*alloc)->Allocate(0, 1 << 20, *s1);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->data(), first);
  cudaFree(scratch);
  cudaEventDestroy(gate);
  cudaStreamDestroy(gate_stream);
}

// An asynchronous copy queued behind seconds' worth of memsets returns at
// once; its staging block is not handed out again until the copy ran.
TEST(CudaAsyncCopy, StagingBlockIsHeldWhileTheCopyIsQueued) {
  absl::StatusOr<std::shared_ptr<CudaDeviceApi>> api = CudaDeviceApi::Create();
  if (!api.ok()) GTEST_SKIP() << api.status();
  CudaFixture f(*api);
  absl::StatusOr<StreamHandle> s = f.NewStream(0);
  ASSERT_TRUE(s.ok()) << s.status();
  auto alloc = CachingDeviceAllocator::Create(*api, {});
  auto pinned = CachingHostAllocator::Create(*api, {});
  ASSERT_TRUE(alloc.ok() && pinned.ok());
  void* scratch = nullptr;
  const size_t scratch_bytes = size_t{1} << 30;
  ASSERT_EQ(cudaMalloc(&scratch, scratch_bytes), cudaSuccess);
  for (int i = 0; i < 8; ++i) {
    ASSERT_EQ(cudaMemsetAsync(scratch, i, scratch_bytes,
                              reinterpret_cast<cudaStream_t>(*s)),
              cudaSuccess);
  }
  const Tensor src = arange(0.0, 1 << 18, 1.0, DType::kFloat32);
  absl::StatusOr<AsyncCopy> c =
      CopyToDeviceAsync(src, 0, *s, **alloc, **pinned);
  ASSERT_TRUE(c.ok()) << c.status();
  absl::StatusOr<bool> done = c->done.Query();
  ASSERT_TRUE(done.ok()) << done.status();
  // 8 GiB of memset take milliseconds: only the ordering is asserted when
  // the device was already through them.
  if (!*done) {
    AllocatorStats st = (*pinned)->Stats();
    EXPECT_EQ(st.pending_bytes, uint64_t{1} << 20);
    absl::StatusOr<Storage> other = (*pinned)->Allocate(1 << 20);
    ASSERT_TRUE(other.ok());
    EXPECT_EQ((*pinned)->Stats().device_mallocs, 2u)
        << "the staging block was reused while its copy was queued";
  }
  ASSERT_TRUE(c->done.Wait().ok());
  absl::StatusOr<AsyncCopy> back =
      CopyToHostAsync(c->tensor, *s, **alloc, **pinned);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_TRUE(back->done.Wait().ok());
  EXPECT_TRUE(back->tensor.equal(src));
  ASSERT_TRUE(f.Drain(0, *s).ok());
  EXPECT_EQ((*pinned)->Stats().pending_bytes, 0u);
  cudaFree(scratch);
}

}  // namespace
}  // namespace cuda
}  // namespace ferry
