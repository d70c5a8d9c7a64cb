// Pipelined staging (worker/device_stage.h, docs/design/cuda_rpc.md): a
// large CUDA tensor's copy to pinned memory is queued in chunks and the
// gRPC agent sends each piece once the chunks it covers ran. Over
// FakeDeviceApi host memory (no GPU): the sender's fake holds its stream
// after the first chunk, so the test sees the first piece arrive while the
// later chunks have not been copied, then lets them through. Pipelined
// landing (worker/device_landing.h): the receiver's piece hook holds the
// stream half-way, and the test sees the device copies already queued.
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "ferry/common/logging.h"
#include "ferry/common/poll.h"
#include "ferry/rpc/function_registry.h"
#include "ferry/rpc/grpc/agent.h"
#include "ferry/tensor/cuda/caching_allocator.h"
#include "ferry/tensor/cuda/fake_device_api.h"
#include "ferry/tensor/tensor.h"
#include "ferry/worker/device_stage.h"
#include "ferry/worker/device_testing.h"
#include "ferry/worker/test_group.h"
#include "ferry/worker/worker.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kChunk = DeviceStage::kPipelineChunkBytes;

// A FakeDeviceApi whose default stream, once armed, stops after the first
// chunk-sized copy to pinned memory and its event (a stream wait on an
// event of a side stream): the first chunk runs when a host waits, the
// later ones only after Release. A host wait for an event behind the hold
// blocks (as on a GPU) until Release, at most 30 s; with `fail`, it then
// reports a copy failure instead.
class HoldingApi final : public cuda::FakeDeviceApi {
 public:
  HoldingApi() : cuda::FakeDeviceApi(1, 64 << 20) {}

  void Arm(bool fail) {
    absl::MutexLock lock(&mu_);
    armed_ = true;
    fail_ = fail;
  }
  void Release() {
    absl::MutexLock lock(&mu_);
    released_ = true;
  }
  // Host waits that found their event behind the hold.
  int blocked_waits() {
    absl::MutexLock lock(&mu_);
    return blocked_waits_;
  }
  // The log label (common/logging.h) of the thread of the last such wait.
  std::string blocked_on() {
    absl::MutexLock lock(&mu_);
    return blocked_on_;
  }

  absl::Status MemcpyAsync(int device, void* dst, const void* src,
                           size_t nbytes, cuda::StreamHandle stream) override {
    const bool chunk = nbytes == kChunk && IsPinned(dst);
    absl::Status s =
        cuda::FakeDeviceApi::MemcpyAsync(device, dst, src, nbytes, stream);
    absl::MutexLock lock(&mu_);
    if (s.ok() && chunk && armed_ && stream == 0) ++chunks_;
    return s;
  }

  absl::StatusOr<cuda::EventHandle> RecordEvent(
      int device, cuda::StreamHandle stream) override {
    absl::StatusOr<cuda::EventHandle> e =
        cuda::FakeDeviceApi::RecordEvent(device, stream);
    absl::MutexLock lock(&mu_);
    if (e.ok() && stream == 0 && chunks_ == 1 && !placed_) {
      placed_ = true;  // Right after the first chunk's event.
      absl::StatusOr<cuda::StreamHandle> side = CreateStream(device);
      if (!side.ok()) return side.status();
      side_ = *side;
      absl::StatusOr<cuda::EventHandle> held =
          cuda::FakeDeviceApi::RecordEvent(device, side_);
      if (!held.ok()) return held.status();
      absl::Status w = StreamWaitEvent(device, 0, *held);
      if (!w.ok()) return w;
    }
    return e;
  }

  absl::Status WaitEvent(int device, cuda::EventHandle event) override {
    absl::Status s = cuda::FakeDeviceApi::WaitEvent(device, event);
    bool fail = false;
    cuda::StreamHandle side = 0;
    {
      absl::MutexLock lock(&mu_);
      if (s.ok() || !placed_ || !absl::IsFailedPrecondition(s)) return s;
      ++blocked_waits_;
      blocked_on_ = ScopedLogLabel::Current();
      if (!mu_.AwaitWithTimeout(absl::Condition(&released_),
                                absl::Seconds(30))) {
        return absl::DeadlineExceededError("the test never released");
      }
      fail = fail_;
      side = side_;
    }
    CompleteStream(device, side);  // The hold lets the stream through.
    if (fail) {
      (void)cuda::FakeDeviceApi::WaitEvent(device, event);
      return absl::InternalError("fake:0: the copy failed (injected)");
    }
    return cuda::FakeDeviceApi::WaitEvent(device, event);
  }

 private:
  absl::Mutex mu_;
  bool armed_ ABSL_GUARDED_BY(mu_) = false;
  bool fail_ ABSL_GUARDED_BY(mu_) = false;
  bool placed_ ABSL_GUARDED_BY(mu_) = false;
  bool released_ ABSL_GUARDED_BY(mu_) = false;
  int chunks_ ABSL_GUARDED_BY(mu_) = 0;
  int blocked_waits_ ABSL_GUARDED_BY(mu_) = 0;
  std::string blocked_on_ ABSL_GUARDED_BY(mu_);
  cuda::StreamHandle side_ ABSL_GUARDED_BY(mu_) = 0;  // The hold's stream.
};

struct Pair {
  std::shared_ptr<HoldingApi> api0 = std::make_shared<HoldingApi>();
  std::shared_ptr<cuda::FakeDeviceApi> api1 =
      std::make_shared<cuda::FakeDeviceApi>(1, 64 << 20);
  WorkerGroup group;

  // `hook1`: w1's WorkerOptions::after_piece_received.
  explicit Pair(const std::string& tag,
                std::function<void(uint64_t, uint64_t)> hook1 = {}) {
    std::vector<WorkerOptions> o(2);
    o[0].devices = {"cuda:0"};
    o[0].device_maps = {{"w1", {{"cuda:0", "cuda:0"}}}};
    o[0].device_api = api0;
    o[1].devices = {"cuda:0"};
    o[1].device_api = api1;
    o[1].after_piece_received = std::move(hook1);
    auto registry = std::make_shared<rpc::FunctionRegistry>();
    EXPECT_TRUE(registry->Register("echo", [](Tensor t) { return t; }).ok());
    for (WorkerOptions& each : o) {
      // Streamed, not through the same-host channel (which reads the
      // payload whole, so the agent waits for all of it first).
      each.same_host = false;
      each.registry = registry;
      each.join_timeout = absl::Seconds(30);
    }
    group = StartWorkerGroup(tag, o);
  }
  ~Pair() { ShutdownWorkerGroup(group); }
  bool ok() const { return group[0].ok() && group[1].ok(); }
  Worker& w(int i) { return **group[i]; }
  const rpc::StreamStats& stream_stats(int i) {
    return dynamic_cast<rpc::GrpcAgent&>(w(i).agent()).stream_stats();
  }
};

// 4 MiB of distinct floats.
Tensor Large() { return arange(1 << 20, DType::kFloat32); }

TEST(PipelinedStaging, TheFirstPieceGoesOutBeforeTheLaterChunksCopy) {
  Pair p("pipeline_hold");
  ASSERT_TRUE(p.ok()) << p.group[0].status() << " " << p.group[1].status();
  const Tensor cpu = Large();
  const Tensor x =
      OnDevice(cpu, 0, *p.w(0).device_allocator(), *p.api0);
  p.api0->Arm(/*fail=*/false);
  Future<Tensor> call = p.w(0).rpc_async<Tensor>("w1", "echo", x);
  // The writer waits for the second chunk, behind the hold...
  ASSERT_TRUE(PollUntil([&] { return p.api0->blocked_waits() >= 1; },
                        absl::Seconds(30)));
  // ...after the first piece (the envelope fields and the first ~1 MiB,
  // all from the first chunk) reached w1; nothing more came.
  const rpc::StreamStats& in = p.stream_stats(1);
  ASSERT_TRUE(PollUntil(
      [&] { return in.bytes_received.load() >= kChunk - 4096; },
      absl::Seconds(30)))
      << in.bytes_received.load();
  EXPECT_LT(in.bytes_received.load(), 2 * kChunk);
  EXPECT_EQ(in.requests_received.load(), 1u);
  EXPECT_FALSE(call.IsReady());
  // The wait is on w0's gates thread, not on one of gRPC's.
  EXPECT_EQ(p.api0->blocked_on(), "w0:gates");
  EXPECT_GE(p.stream_stats(0).writes_deferred.load(), 1u);
  // Released, the rest copies and goes out: the echo is intact (a piece
  // sent before its chunk ran would carry the pinned block's old bytes).
  p.api0->Release();
  Result<Tensor> back = call.Get(absl::Seconds(30));
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->device(), Device::CUDA(0));
  EXPECT_TRUE(SameBytes(*back, cpu, *p.api0));
  EXPECT_GE(p.stream_stats(0).requests_sent.load(), 1u);
  EXPECT_EQ(p.w(0).staged_traffic("w1").tensors_out, 1u);
  EXPECT_EQ(p.w(0).staged_traffic("w1").bytes_out, uint64_t{4} << 20);
  // The reply came back pipelined too (w1's plain fake): intact above; its
  // pieces waited on w1's gates thread (the fake runs a copy only when a
  // host waits, so no chunk is done when its piece's turn comes).
  EXPECT_GE(p.stream_stats(1).replies_sent.load(), 1u);
  EXPECT_GE(p.stream_stats(1).writes_deferred.load(), 1u);
}

TEST(PipelinedStaging, AChunkThatFailsFailsTheCallNamingTensorAndDevice) {
  Pair p("pipeline_fail");
  ASSERT_TRUE(p.ok()) << p.group[0].status() << " " << p.group[1].status();
  const Tensor x =
      OnDevice(Large(), 0, *p.w(0).device_allocator(), *p.api0);
  p.api0->Arm(/*fail=*/true);
  Future<Tensor> call = p.w(0).rpc_async<Tensor>("w1", "echo", x);
  ASSERT_TRUE(PollUntil([&] { return p.api0->blocked_waits() >= 1; },
                        absl::Seconds(30)));
  p.api0->Release();
  Result<Tensor> back = call.Get(absl::Seconds(30));
  ASSERT_FALSE(back.ok());
  EXPECT_THAT(back.status().message(), HasSubstr("worker 'w0'"));
  EXPECT_THAT(back.status().message(), HasSubstr("tensor 0 (cuda:0"));
  EXPECT_THAT(back.status().message(), HasSubstr("to 'w1'"));
  EXPECT_THAT(back.status().message(), HasSubstr("chunk 1 of 4"));
  EXPECT_THAT(back.status().message(), HasSubstr("copy failed (injected)"));
  // w1 got the first piece only and dispatched nothing.
  EXPECT_EQ(p.w(1).staged_traffic("w0").tensors_in, 0u);
  // The message went with the call: its pinned block is back in w0's cache.
  EXPECT_TRUE(PollUntil([&] { return PinnedBytesInUse(p.w(0)) == 0; },
                        absl::Seconds(30)))
      << PinnedBytesInUse(p.w(0));
  // The worker still serves small calls afterwards.
  const Tensor small = arange(16, DType::kFloat32);
  Result<Tensor> again = p.w(0).rpc_sync<Tensor>(
      "w1", "echo", OnDevice(small, 0, *p.w(0).device_allocator(), *p.api0));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(SameBytes(*again, small, *p.api0));
}

TEST(PipelinedStaging, AChunkThatCannotBeQueuedFailsTheSendNamingIt) {
  Pair p("pipeline_record");
  ASSERT_TRUE(p.ok()) << p.group[0].status() << " " << p.group[1].status();
  const Tensor x =
      OnDevice(Large(), 0, *p.w(0).device_allocator(), *p.api0);
  p.api0->FailRecordEvent(1);  // The first chunk's event.
  Result<Tensor> back = p.w(0).rpc_sync<Tensor>("w1", "echo", x);
  ASSERT_FALSE(back.ok());
  EXPECT_THAT(back.status().message(),
              HasSubstr("worker 'w0': staging tensor 0 (cuda:0, 4194304 "
                        "bytes) of the request CALL 'echo' to 'w1'"));
  EXPECT_THAT(back.status().message(), HasSubstr("RecordEvent failed"));
  EXPECT_EQ(p.w(0).staged_traffic("w1").refused, 1u);
  EXPECT_EQ(p.stream_stats(1).requests_received.load(), 0u);
}


// Pipelined landing (worker/device_landing.h): the receiver's copies to
// its device are queued while the message is still arriving. A gate in w1's
// piece hook holds the stream half-way; the test looks while it is held.
struct MidStream {
  absl::Mutex mu;
  bool reached ABSL_GUARDED_BY(mu) = false;
  bool released ABSL_GUARDED_BY(mu) = false;
  uint64_t received ABSL_GUARDED_BY(mu) = 0;
  uint64_t total ABSL_GUARDED_BY(mu) = 0;
  // w1's copies with a pinned side when the hold began.
  uint64_t copies_then ABSL_GUARDED_BY(mu) = 0;
  std::shared_ptr<cuda::FakeDeviceApi> api;  // w1's, set before any call.

  // The piece hook: at the first piece past `at` bytes of a request
  // (once), records and holds until Release, at most 30 s.
  std::function<void(uint64_t, uint64_t)> Hook(uint64_t at) {
    return [this, at](uint64_t received, uint64_t total) {
      absl::MutexLock lock(&mu);
      if (reached || received < at || received == total) return;
      reached = true;
      this->received = received;
      this->total = total;
      copies_then = api->pinned_copies();
      mu.AwaitWithTimeout(absl::Condition(&released), absl::Seconds(30));
    };
  }
  bool WaitReached() {
    absl::MutexLock lock(&mu);
    return mu.AwaitWithTimeout(absl::Condition(&reached), absl::Seconds(30));
  }
  void Release() {
    absl::MutexLock lock(&mu);
    released = true;
  }
};

TEST(PipelinedLanding, ChunksGoToTheDeviceWhileTheMessageArrives) {
  MidStream mid;
  Pair p("landing_overlap", mid.Hook(2 * kChunk + 4096));
  ASSERT_TRUE(p.ok()) << p.group[0].status() << " " << p.group[1].status();
  mid.api = p.api1;
  const Tensor cpu = Large();
  const Tensor x = OnDevice(cpu, 0, *p.w(0).device_allocator(), *p.api0);
  const uint64_t copies_before = p.api1->pinned_copies();
  Future<Tensor> call = p.w(0).rpc_async<Tensor>("w1", "echo", x);
  ASSERT_TRUE(mid.WaitReached());
  {
    absl::MutexLock lock(&mid.mu);
    EXPECT_LT(mid.received, mid.total);
    // Held half-way, w1 has already queued the chunks whose bytes are in
    // (at least the first two): not one copy waits for the whole message.
    EXPECT_GE(mid.copies_then, copies_before + 2)
        << "received " << mid.received << " of " << mid.total;
  }
  mid.Release();
  Result<Tensor> back = call.Get(absl::Seconds(30));
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->device(), Device::CUDA(0));
  EXPECT_TRUE(SameBytes(*back, cpu, *p.api0));
  // The request landed pipelined on w1, and the reply on w0 (no hold).
  const StagedTraffic in1 = p.w(1).staged_traffic("w0");
  EXPECT_EQ(in1.tensors_in, 1u);
  EXPECT_EQ(in1.pipelined_in, 1u);
  EXPECT_GE(in1.early_chunks, 2u);
  EXPECT_LE(in1.early_chunks, 4u);  // 4 MiB in 1 MiB chunks.
  const StagedTraffic in0 = p.w(0).staged_traffic("w1");
  EXPECT_EQ(in0.tensors_in, 1u);
  EXPECT_EQ(in0.pipelined_in, 1u);
  // Small messages land the old way.
  const Tensor small = arange(16, DType::kFloat32);
  Result<Tensor> again = p.w(0).rpc_sync<Tensor>(
      "w1", "echo", OnDevice(small, 0, *p.w(0).device_allocator(), *p.api0));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(SameBytes(*again, small, *p.api0));
  EXPECT_EQ(p.w(1).staged_traffic("w0").tensors_in, 2u);
  EXPECT_EQ(p.w(1).staged_traffic("w0").pipelined_in, 1u);
}

TEST(PipelinedLanding, AStreamCutHalfWayGivesBackWhatItTook) {
  MidStream mid;
  Pair p("landing_cut", mid.Hook(2 * kChunk + 4096));
  ASSERT_TRUE(p.ok()) << p.group[0].status() << " " << p.group[1].status();
  mid.api = p.api1;
  cuda::CachingDeviceAllocator& device1 = *p.w(1).device_allocator();
  const uint64_t device_before = device1.Stats(0).allocated_bytes;
  // 32 MiB: more than the HTTP/2 window can have in flight while held.
  const Tensor x = OnDevice(arange(8 << 20, DType::kFloat32), 0,
                            *p.w(0).device_allocator(), *p.api0);
  Future<Tensor> call =
      p.w(0).agent().rpc_async_for<Tensor>(absl::Milliseconds(500), "w1",
                                           "echo", x);
  ASSERT_TRUE(mid.WaitReached());
  // Held half-way: w1 holds device memory for the early chunks.
  EXPECT_GT(device1.Stats(0).allocated_bytes, device_before);
  Result<Tensor> back = call.Get(absl::Seconds(30));
  ASSERT_FALSE(back.ok());
  EXPECT_EQ(back.status().code(), absl::StatusCode::kDeadlineExceeded)
      << back.status();
  mid.Release();
  // The cut stream's message is dropped: its device block and its pinned
  // buffer go back to w1's allocators.
  EXPECT_TRUE(PollUntil(
      [&] {
        return device1.Stats(0).allocated_bytes == device_before &&
               PinnedBytesInUse(p.w(1)) == 0;
      },
      absl::Seconds(30)))
      << device1.Stats(0).allocated_bytes << " " << PinnedBytesInUse(p.w(1));
  EXPECT_EQ(p.w(1).staged_traffic("w0").tensors_in, 0u);
}

}  // namespace
}  // namespace ferry
