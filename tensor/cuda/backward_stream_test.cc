// Streams in backward (docs/design/cuda_kernels.md, "Streams in backward"):
// each backward op runs on the stream its forward op ran on, gradients
// crossing streams are ordered by device-side waits, and the caller's
// stream waits for the pass. Runs over FakeDeviceApi, whose streams only
// finish when the test completes them, so a missing wait shows: a stream
// that should wait for another completes on its own.
#include <memory>
#include <thread>
#include <vector>

#include "ferry/autograd/engine.h"
#include "ferry/autograd/node.h"
#include "ferry/autograd/ops.h"
#include "ferry/tensor/cuda/context.h"
#include "ferry/tensor/cuda/fake_device_api.h"
#include "ferry/tensor/cuda/host_ops.h"
#include "gtest/gtest.h"

namespace ferry {
namespace cuda {
namespace {

namespace ag = ::ferry::autograd;

class BackwardStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    api_ = std::make_shared<FakeDeviceApi>(1, uint64_t{1} << 24);
    auto c = CreateHostComputeContext(api_, {});
    ASSERT_TRUE(c.ok()) << c.status();
    ctx_ = *std::move(c);
  }
  // A cuda:0 leaf that requires grad, with every copy so far finished.
  Tensor Leaf(const Tensor& cpu) {
    absl::StatusOr<Tensor> d = ctx_->To(cpu, dev_);
    EXPECT_TRUE(d.ok()) << d.status();
    if (!d.ok()) return Tensor();
    ag::SetRequiresGrad(*d);
    return *d;
  }
  StreamHandle NewStream() {
    absl::StatusOr<StreamHandle> s = ctx_->NewStream(dev_);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *s : 0;
  }
  void Use(StreamHandle s) { ASSERT_TRUE(ctx_->SetStream(dev_, s).ok()); }
  Tensor HostGrad(const Tensor& leaf) {
    Tensor g = ag::GradOf(leaf);
    EXPECT_TRUE(g.defined());
    if (!g.defined()) return Tensor();
    absl::StatusOr<Tensor> h = ctx_->To(g, Device::CPU());
    EXPECT_TRUE(h.ok()) << h.status();
    return h.ok() ? *h : Tensor();
  }

  const Device dev_ = Device::CUDA(0);
  std::shared_ptr<FakeDeviceApi> api_;
  std::unique_ptr<CudaContext> ctx_;
};

TEST_F(BackwardStreamTest, BackwardRunsOnTheForwardStreamAndTheCallerWaits) {
  Tensor x = Leaf(from_vector<float>({1, 2, 3}, {3}));
  const StreamHandle side = NewStream();
  Use(side);
  Tensor y = ag::mul(x, x);
  Tensor loss = ag::sum(y);
  Use(0);
  std::vector<StreamHandle> seen;
  ag::RegisterHook(y, [&](const Tensor&) {
    seen.push_back(ctx_->stream(0));
    return Tensor();
  });
  ASSERT_TRUE(api_->CompleteStream(0, 0));
  ASSERT_TRUE(api_->CompleteStream(0, side));

  ASSERT_TRUE(ag::Backward({loss}).ok());

  // y's gradient was made by loss's backward, on the side stream.
  EXPECT_EQ(seen, std::vector<StreamHandle>{side});
  EXPECT_EQ(ctx_->stream(0), 0u) << "the engine left its stream pushed";
  // The side stream waits for the root gradient made on the default
  // stream; the default stream waits for the side stream's pass.
  EXPECT_FALSE(api_->CompleteStream(0, side));
  EXPECT_FALSE(api_->CompleteStream(0, 0));
  EXPECT_TRUE(api_->CompleteStream(0, side));
  EXPECT_TRUE(api_->CompleteStream(0, 0));
  EXPECT_TRUE(HostGrad(x).allclose(from_vector<float>({2, 4, 6}, {3})));
}

TEST_F(BackwardStreamTest, GradientsFromTwoStreamsMeetAfterAWait) {
  Tensor x = Leaf(from_vector<float>({1, 2}, {2}));
  const StreamHandle a = NewStream();
  const StreamHandle b = NewStream();
  Use(a);
  Tensor xa = ag::mul(x, 2.0);
  Use(b);
  Tensor xb = ag::mul(x, 3.0);
  Use(0);
  Tensor loss = ag::sum(ag::add(xa, xb));
  ASSERT_TRUE(api_->CompleteStream(0, 0));

  ASSERT_TRUE(ag::Backward({loss}).ok());

  // x's accumulation runs on the stream of the first gradient to arrive
  // and waits for the other; the caller's stream waits for both.
  EXPECT_FALSE(api_->CompleteStream(0, 0));
  const bool a_first = !api_->CompleteStream(0, a);
  const StreamHandle first = a_first ? a : b;
  const StreamHandle second = a_first ? b : a;
  EXPECT_FALSE(api_->CompleteStream(0, first));
  EXPECT_TRUE(api_->CompleteStream(0, second));
  EXPECT_TRUE(api_->CompleteStream(0, first));
  EXPECT_TRUE(api_->CompleteStream(0, 0));
  EXPECT_TRUE(HostGrad(x).allclose(from_vector<float>({5, 5}, {2})));
}

TEST_F(BackwardStreamTest, OneStreamQueuesNoWait) {
  Tensor x = Leaf(from_vector<float>({1, 2}, {2}));
  Tensor loss = ag::sum(ag::mul(x, x));
  const uint64_t events = api_->live_events();
  ASSERT_TRUE(ag::Backward({loss}).ok());
  EXPECT_EQ(api_->live_events(), events);
  EXPECT_TRUE(api_->CompleteStream(0, 0));
  EXPECT_TRUE(HostGrad(x).allclose(from_vector<float>({2, 4}, {2})));
}

TEST_F(BackwardStreamTest, ThreadStreamsArePerThreadAndPerContext) {
  auto other = CreateHostComputeContext(
      std::make_shared<FakeDeviceApi>(1, uint64_t{1} << 20), {});
  ASSERT_TRUE(other.ok());
  const StreamHandle s = NewStream();
  ASSERT_TRUE(ctx_->PushThreadStream(dev_, s).ok());
  EXPECT_EQ(ctx_->stream(0), s);
  EXPECT_EQ((*other)->stream(0), 0u);
  StreamHandle on_other_thread = 1;
  std::thread([&] { on_other_thread = ctx_->stream(0); }).join();
  EXPECT_EQ(on_other_thread, 0u);
  ASSERT_TRUE(ctx_->PushThreadStream(dev_, 0).ok());
  EXPECT_EQ(ctx_->stream(0), 0u);
  ctx_->PopThreadStream(dev_);
  EXPECT_EQ(ctx_->stream(0), s);
  ctx_->PopThreadStream(dev_);
  EXPECT_EQ(ctx_->stream(0), 0u);
  EXPECT_FALSE(ctx_->PushThreadStream(Device::CUDA(3), s).ok());
}

}  // namespace
}  // namespace cuda
}  // namespace ferry
