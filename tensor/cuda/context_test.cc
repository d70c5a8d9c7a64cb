// CudaContext over FakeDeviceApi (host memory standing in for two devices):
// device tensors, copies between CPU and devices, and the device checks the
// CUDA ops make before launching anything. Runs without a GPU.
#include "ferry/tensor/cuda/context.h"

#include <memory>
#include <optional>
#include <thread>

#include "absl/status/status.h"
#include "ferry/tensor/cuda/fake_device_api.h"
#include "ferry/tensor/cuda/host_ops.h"
#include "ferry/tensor/cuda/ops.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ferry {
namespace cuda {
namespace {

using ::testing::HasSubstr;

class ContextTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<CudaContext>> c = CudaContext::CreateForApi(
        api_, {}, /*runs_kernels=*/false);
    ASSERT_TRUE(c.ok()) << c.status();
    ctx_ = *std::move(c);
  }
  std::shared_ptr<FakeDeviceApi> api_ =
      std::make_shared<FakeDeviceApi>(2, 1 << 20);
  std::unique_ptr<CudaContext> ctx_;
};

TEST_F(ContextTest, CopiesBetweenCpuAndDevices) {
  Tensor x = randn({3, 4}, 1);
  absl::StatusOr<Tensor> d0 = ctx_->To(x, Device::CUDA(0));
  ASSERT_TRUE(d0.ok()) << d0.status();
  EXPECT_EQ(d0->device(), Device::CUDA(0));
  EXPECT_EQ(d0->sizes(), x.sizes());
  EXPECT_FALSE(d0->storage().is_same(x.storage()));
  // Already there: the same tensor.
  absl::StatusOr<Tensor> same = ctx_->To(*d0, Device::CUDA(0));
  ASSERT_TRUE(same.ok());
  EXPECT_TRUE(same->is_same(*d0));
  absl::StatusOr<Tensor> d1 = ctx_->To(*d0, Device::CUDA(1));
  ASSERT_TRUE(d1.ok()) << d1.status();
  EXPECT_EQ(d1->device(), Device::CUDA(1));
  absl::StatusOr<Tensor> back = ctx_->To(*d1, Device::CPU());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->equal(x));
  // A strided CPU view is compacted on the way.
  absl::StatusOr<Tensor> t = ctx_->To(x.t(), Device::CUDA(1));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE(ctx_->To(*t, Device::CPU())->equal(x.t().contiguous()));
  EXPECT_TRUE(ctx_->Synchronize(Device::CUDA(1)).ok());
}

TEST_F(ContextTest, DeviceIndexThatDoesNotExistIsInvalidArgument) {
  absl::StatusOr<Tensor> t = ctx_->To(ones({2}), Device::CUDA(5));
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(t.status().message(), HasSubstr("cuda:5"));
  EXPECT_THAT(t.status().message(), HasSubstr("2 fake devices"));
  t = ctx_->Empty({2, 2}, DType::kFloat32, Device::CUDA(-1));
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<Tensor> e = ctx_->Empty({2, 2}, DType::kFloat64,
                                         Device::CUDA(1));
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->device(), Device::CUDA(1));
  EXPECT_EQ(e->dtype(), DType::kFloat64);
  EXPECT_EQ(ctx_->Synchronize(Device::CUDA(2)).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(ContextTest, OpsCheckDevicesAndDtypesBeforeLaunching) {
  Tensor cpu = randn({2, 3}, 2);
  Tensor d0 = *ctx_->To(cpu, Device::CUDA(0));
  Tensor d1 = *ctx_->To(cpu, Device::CUDA(1));
  // A CPU and a CUDA tensor in one op.
  absl::StatusOr<Tensor> r = Binary(*ctx_, math::BinaryOp::kAdd, d0, cpu);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("cuda binary"));
  EXPECT_THAT(r.status().message(), HasSubstr("b is not on a CUDA device"));
  EXPECT_THAT(r.status().message(), HasSubstr("b: float32 [2, 3] on cpu"));
  EXPECT_THAT(r.status().message(), HasSubstr("a: float32 [2, 3] on cuda:0"));
  // Different devices.
  r = Matmul(*ctx_, d0, d1, false, true);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("different devices"));
  EXPECT_THAT(r.status().message(), HasSubstr("cuda:1"));
  // Mixed and unsupported dtypes, and index dtype.
  Tensor dd = *ctx_->To(cpu.to(DType::kFloat64), Device::CUDA(0));
  r = Binary(*ctx_, math::BinaryOp::kMul, d0, dd);
  EXPECT_THAT(r.status().message(), HasSubstr("different dtypes"));
  Tensor di = *ctx_->To(arange(6), Device::CUDA(0));
  r = Unary(*ctx_, math::UnaryOp::kTanh, di);
  EXPECT_THAT(r.status().message(),
              HasSubstr("x is int64, not float32, float64, float16 or "
                        "bfloat16 as unary needs"));
  // 16-bit floats compute in the elementwise ops, not in embedding.
  Tensor dh = *ctx_->To(cpu.to(DType::kBFloat16), Device::CUDA(0));
  r = Embedding(*ctx_, dh, di);
  EXPECT_THAT(r.status().message(),
              HasSubstr("weight is bfloat16, not float32 or float64 as "
                        "embedding needs"));
  r = Binary(*ctx_, math::BinaryOp::kMul, dh, dh);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition)
      << r.status();  // Past the dtype checks: the fake runs no kernels.
  r = Embedding(*ctx_, d0, d0);
  EXPECT_THAT(r.status().message(), HasSubstr("indices is not int64"));
  // A tensor on a device index the context does not have.
  Tensor ghost =
      *Tensor::FromStorage(Storage::Wrap(cpu.data_ptr(), cpu.nbytes(),
                                         Device::CUDA(7), nullptr),
                           DType::kFloat32, {2, 3}, {3, 1});
  r = Unary(*ctx_, math::UnaryOp::kRelu, ghost);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("cuda:7 is not one of the 2"));
  // An undefined operand.
  r = Sum(*ctx_, Tensor());
  EXPECT_THAT(r.status().message(), HasSubstr("x is undefined"));
  // Valid operands: a context whose devices run no kernels says so.
  r = Binary(*ctx_, math::BinaryOp::kAdd, d0, d0);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(), HasSubstr("run no kernels"));
  EXPECT_EQ(ctx_->Gemm(0, DType::kFloat32, false, false, 1, 1, 1,
                       d0.data_ptr(), 1, d0.data_ptr(), 1, d0.data_ptr())
                .code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(ContextTest, EachDeviceHasACurrentStream) {
  EXPECT_EQ(ctx_->stream(0), 0u);
  absl::StatusOr<StreamHandle> s = ctx_->NewStream(Device::CUDA(1));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_NE(*s, 0u);
  EXPECT_EQ(api_->live_streams(), 1u);
  ASSERT_TRUE(ctx_->SetStream(Device::CUDA(1), *s).ok());
  EXPECT_EQ(ctx_->stream(1), *s);
  EXPECT_EQ(ctx_->stream(0), 0u);  // Per device.
  // Work on device 1 goes to its current stream: a non-blocking copy runs
  // when that stream does, and not with the default stream.
  Tensor x = arange(0.0, 64.0, 1.0, DType::kFloat32);
  absl::StatusOr<Tensor> d = ctx_->To(x, Device::CUDA(1), /*non_blocking=*/true);
  ASSERT_TRUE(d.ok()) << d.status();
  absl::StatusOr<StreamEvent> ev = ctx_->RecordEvent(Device::CUDA(1));
  ASSERT_TRUE(ev.ok()) << ev.status();
  api_->CompleteStream(1, 0);
  absl::StatusOr<bool> done = ev->Query();
  ASSERT_TRUE(done.ok());
  EXPECT_FALSE(*done);
  api_->CompleteStream(1, *s);
  done = ev->Query();
  ASSERT_TRUE(done.ok());
  EXPECT_TRUE(*done);
  absl::StatusOr<Tensor> back = ctx_->To(*d, Device::CPU());
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(back->equal(x));
  EXPECT_EQ(ctx_->SetStream(Device::CUDA(2), *s).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ctx_->NewStream(Device::CPU()).status().code(),
            absl::StatusCode::kInvalidArgument);
  ctx_.reset();  // Destroys the streams it made.
  EXPECT_EQ(api_->live_streams(), 0u);
}

// A thread's own current stream overrides the device's for that thread
// only; StreamWaitStream orders one stream after another on the device.
TEST_F(ContextTest, ThreadStreamsAndStreamWaits) {
  absl::StatusOr<StreamHandle> s = ctx_->NewStream(Device::CUDA(0));
  ASSERT_TRUE(s.ok()) << s.status();
  absl::StatusOr<std::optional<StreamHandle>> previous =
      ctx_->SetThreadStream(Device::CUDA(0), *s);
  ASSERT_TRUE(previous.ok()) << previous.status();
  EXPECT_FALSE(previous->has_value());
  EXPECT_EQ(ctx_->stream(0), *s);
  EXPECT_EQ(ctx_->stream(1), 0u);  // Per device.
  StreamHandle elsewhere = *s;
  std::thread([&] { elsewhere = ctx_->stream(0); }).join();
  EXPECT_EQ(elsewhere, 0u);  // Per thread.
  previous = ctx_->SetThreadStream(Device::CUDA(0), std::nullopt);
  ASSERT_TRUE(previous.ok()) << previous.status();
  EXPECT_EQ(*previous, std::optional<StreamHandle>(*s));
  EXPECT_EQ(ctx_->stream(0), 0u);
  EXPECT_EQ(ctx_->SetThreadStream(Device::CUDA(2), *s).status().code(),
            absl::StatusCode::kInvalidArgument);
  // s waits, on the device, for what stream 0 queued so far.
  const int produced = 7;
  int middle = -1, last = -1;
  ASSERT_TRUE(api_->MemcpyAsync(0, &middle, &produced, sizeof(int), 0).ok());
  ASSERT_TRUE(ctx_->StreamWaitStream(Device::CUDA(0), *s, 0).ok());
  ASSERT_TRUE(api_->MemcpyAsync(0, &last, &middle, sizeof(int), *s).ok());
  EXPECT_FALSE(api_->CompleteStream(0, *s));
  EXPECT_EQ(last, -1);
  EXPECT_TRUE(api_->CompleteStream(0, 0));
  EXPECT_TRUE(api_->CompleteStream(0, *s));
  EXPECT_EQ(last, produced);
}

// The host backend runs a kernel after the work queued on its current
// stream, as its place in stream order asks; ThreadStreamGuard moves this
// thread's kernels to another stream and back.
TEST(HostOpsStreams, KernelsRunAfterTheirStreamsQueuedWork) {
  auto api = std::make_shared<FakeDeviceApi>(1, 1 << 20);
  absl::StatusOr<std::unique_ptr<CudaContext>> ctx =
      CreateHostComputeContext(api, {});
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  DeviceOps* ops = (*ctx)->compute();
  const Device dev = Device::CUDA(0);
  absl::StatusOr<Tensor> x = (*ctx)->To(from_vector<double>({1, 2}), dev);
  absl::StatusOr<Tensor> y = ops->Empty({2}, DType::kFloat64, dev);
  ASSERT_TRUE(x.ok() && y.ok());
  ASSERT_TRUE(ops->Fill(*y, -1).ok());
  absl::StatusOr<uintptr_t> s = ops->NewStream(dev);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_TRUE(ops->CopyAsync(*y, *x, *s).ok());  // Queued on s.
  absl::StatusOr<Tensor> on_default = ops->Sum(*y);  // Not after s's copy.
  absl::StatusOr<Tensor> on_s;
  {
    ThreadStreamGuard guard(ops, dev, *s);
    ASSERT_TRUE(guard.status().ok()) << guard.status();
    EXPECT_EQ(ops->CurrentStream(dev).value_or(0), *s);
    on_s = ops->Sum(*y);  // After it.
  }
  EXPECT_EQ(ops->CurrentStream(dev).value_or(1), 0u);
  ASSERT_TRUE(on_default.ok() && on_s.ok());
  absl::StatusOr<Tensor> a = (*ctx)->To(*on_default, Device::CPU());
  absl::StatusOr<Tensor> b = (*ctx)->To(*on_s, Device::CPU());
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->to_vector<double>(), std::vector<double>({-2}));
  EXPECT_EQ(b->to_vector<double>(), std::vector<double>({3}));
  // CopyAsync refuses what a byte copy cannot do, naming the operands.
  absl::StatusOr<Tensor> f = ops->Empty({2}, DType::kFloat32, dev);
  ASSERT_TRUE(f.ok());
  absl::Status bad = ops->CopyAsync(*f, *x, *s);
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.message()), HasSubstr("float32 [2] on cuda:0"));
}

TEST_F(ContextTest, NonBlockingCopiesGoThroughPinnedMemory) {
  Tensor x = randn({16, 8}, 3);
  absl::StatusOr<Tensor> d0 = ctx_->To(x, Device::CUDA(0), true);
  ASSERT_TRUE(d0.ok()) << d0.status();
  EXPECT_EQ(d0->device(), Device::CUDA(0));
  EXPECT_EQ(api_->pinned_copies(), 1u);
  EXPECT_GT(ctx_->pinned().Stats().pending_bytes, 0u);  // Staged, queued.
  // To the CPU without waiting: a pinned tensor, filled once the stream ran.
  absl::StatusOr<Tensor> h = ctx_->To(*d0, Device::CPU(), true);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_TRUE(api_->IsPinned(h->data_ptr()));
  EXPECT_EQ(api_->pinned_copies(), 2u);
  ASSERT_TRUE(ctx_->Synchronize(Device::CUDA(0)).ok());
  EXPECT_TRUE(h->equal(x));
  // Device to device: the second half waits on the device for the first,
  // so cuda:1's stream cannot finish before cuda:0's (the fake says so
  // where CUDA would wait).
  absl::StatusOr<Tensor> d1 = ctx_->To(*d0, Device::CUDA(1), true);
  ASSERT_TRUE(d1.ok()) << d1.status();
  EXPECT_EQ(ctx_->Synchronize(Device::CUDA(1)).code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(ctx_->Synchronize(Device::CUDA(0)).ok());
  ASSERT_TRUE(ctx_->Synchronize(Device::CUDA(1)).ok());
  absl::StatusOr<Tensor> back = ctx_->To(*d1, Device::CPU());
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(back->equal(x));
  // The staging block's release recorded events after the streams ran; the
  // fake marks them done when the streams are completed again.
  ASSERT_TRUE(ctx_->Synchronize(Device::CUDA(0)).ok());
  ASSERT_TRUE(ctx_->Synchronize(Device::CUDA(1)).ok());
  EXPECT_EQ(ctx_->pinned().Stats().pending_bytes, 0u);
}

}  // namespace
}  // namespace cuda
}  // namespace ferry
