// Streams in backward (docs/design/cuda_kernels.md, "Streams in backward"):
// each backward op runs on the stream its forward op ran on, gradients
// crossing streams are ordered by device-side waits, and the caller's
// stream waits for the pass. Runs over FakeDeviceApi, whose streams only
// run when completed: the host backend runs an op's stream, and the streams
// it waits for, before the op, so a missing wait shows as an op reading
// bytes a copy on another stream has not written yet, or as a stream that
// completes on its own where it should wait.
#include <memory>
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
  Use(0);
  std::vector<StreamHandle> seen;
  ag::RegisterHook(y, [&](const Tensor&) {
    seen.push_back(ctx_->stream(0));
    return Tensor();
  });
  // The gradient for y is written by a copy queued on the default stream
  // and not run yet: y's backward on the side stream must wait for it.
  absl::StatusOr<Tensor> g = ctx_->To(zeros({3}), dev_);
  absl::StatusOr<Tensor> ones3 = ctx_->To(ones({3}), dev_);
  ASSERT_TRUE(g.ok() && ones3.ok());
  ASSERT_TRUE(api_->CompleteStream(0, 0));
  ASSERT_TRUE(ctx_->compute()->CopyAsync(*g, *ones3, 0).ok());

  ASSERT_TRUE(ag::Backward({y}, {*g}).ok());

  EXPECT_EQ(seen, std::vector<StreamHandle>{side});
  EXPECT_EQ(ctx_->stream(0), 0u) << "the engine left its stream set";
  // The default stream waits for the side stream's pass.
  EXPECT_FALSE(api_->CompleteStream(0, 0));
  EXPECT_TRUE(api_->CompleteStream(0, side));
  EXPECT_TRUE(api_->CompleteStream(0, 0));
  EXPECT_TRUE(HostGrad(x).allclose(from_vector<float>({2, 4, 6}, {3})))
      << HostGrad(x).ToString(6);
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

  // The caller's stream waits for both branches' streams.
  EXPECT_FALSE(api_->CompleteStream(0, 0));
  EXPECT_TRUE(api_->CompleteStream(0, a));
  EXPECT_FALSE(api_->CompleteStream(0, 0));
  EXPECT_TRUE(api_->CompleteStream(0, b));
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

}  // namespace
}  // namespace cuda
}  // namespace ferry
