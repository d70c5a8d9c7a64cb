// Pipelined staging (worker/device_stage.h, docs/design/cuda_rpc.md): a
// large CUDA tensor's copy to pinned memory is queued in chunks and the
// gRPC agent sends each piece once the chunks it covers ran. Over
// FakeDeviceApi host memory (no GPU): the sender's fake holds its stream
// after the first chunk, so the test sees the first piece arrive while the
// later chunks have not been copied, then lets them through.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
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
  cuda::StreamHandle side_ ABSL_GUARDED_BY(mu_) = 0;  // The hold's stream.
};

struct Pair {
  std::shared_ptr<HoldingApi> api0 = std::make_shared<HoldingApi>();
  std::shared_ptr<cuda::FakeDeviceApi> api1 =
      std::make_shared<cuda::FakeDeviceApi>(1, 64 << 20);
  WorkerGroup group;

  explicit Pair(const std::string& tag) {
    std::vector<WorkerOptions> o(2);
    o[0].devices = {"cuda:0"};
    o[0].device_maps = {{"w1", {{"cuda:0", "cuda:0"}}}};
    o[0].device_api = api0;
    o[1].devices = {"cuda:0"};
    o[1].device_api = api1;
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

// The pinned bytes `w` holds for messages now (the inspector's "pinned"
// row); -1 when it shows none.
int64_t PinnedAllocated(Worker& w) {
  absl::StatusOr<std::vector<rpc::Inspection>> seen =
      w.agent().inspectors().Inspect("devices");
  if (!seen.ok() || seen->empty()) return -1;
  for (const rpc::InspectionRow& row : (*seen)[0].rows) {
    int64_t bytes = 0;
    if (row.kind == "pinned" &&
        absl::SimpleAtoi(row.Get("allocated_bytes"), &bytes)) {
      return bytes;
    }
  }
  return -1;
}

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
  // The reply came back pipelined too (w1's plain fake): intact above.
  EXPECT_GE(p.stream_stats(1).replies_sent.load(), 1u);
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
  EXPECT_TRUE(PollUntil([&] { return PinnedAllocated(p.w(0)) == 0; },
                        absl::Seconds(30)))
      << PinnedAllocated(p.w(0));
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

}  // namespace
}  // namespace ferry
