// A sender of a large CUDA tensor SIGKILLed mid-transfer (issue #32): the
// test process is w0, whose cuda:0 is a FakeDeviceApi; w1 and w2 are
// device_peer_main processes with their own fakes, on the staged path (a
// fake cannot share memory across processes) and off the same-host
// channel, so a 64 MiB tensor crosses as streamed gRPC pieces. w0's
// after_piece_received hook holds the transfer once a quarter of it arrived
// (flow control then stalls the sender): that is "mid-transfer", observed,
// not guessed. The test kills w1 there, reaps it, releases the hook and
// checks that w0 fails what was incoming, with an error naming w1, within a
// bound; that nothing it allocated stays allocated (the device blocks and
// the pinned buffer the cut message's early landing took are back in w0's
// caches, and with the device cache emptied the allocator and the fake are
// back to the numbers before the call); and that it still serves and calls
// w2, device tensors included, both ways.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "ferry/common/poll.h"
#include "ferry/rpc/function_registry.h"
#include "ferry/tensor/cuda/caching_allocator.h"
#include "ferry/tensor/cuda/copy.h"
#include "ferry/tensor/cuda/fake_device_api.h"
#include "ferry/tensor/tensor.h"
#include "ferry/tests/util/subprocess.h"
#include "ferry/worker/device_testing.h"
#include "ferry/worker/worker.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kFloats = int64_t{16} << 20;  // 64 MiB of float32.
constexpr int64_t kBytes = kFloats * 4;
// Every bound below; a killed peer's calls fail long before it.
constexpr absl::Duration kLimit = absl::Seconds(60);

// Holds, once armed, the first received stream of at least kBytes after a
// quarter of it arrived, until released (or kLimit).
struct Gate {
  std::atomic<bool> armed{false};
  std::atomic<uint64_t> held_at{0};
  absl::Notification mid;
  absl::Notification release;
};

// What w0 holds of its devices (compared before and after a kill).
struct Held {
  cuda::AllocatorStats allocator;
  uint64_t device_bytes = 0;  // The fake's, cached blocks included.
  int64_t pinned_bytes = -1;  // Pinned bytes in use (the inspector's row).
};

class DeviceSenderKill : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    const std::string init =
        absl::StrCat("file://", tmp ? tmp : "/tmp", "/device_kill_", getpid(),
                     "_", ::testing::UnitTest::GetInstance()
                              ->current_test_info()
                              ->name());
    for (int rank : {1, 2}) {
      testutil::SpawnOptions so;
      so.env = {{"NAME", absl::StrCat("w", rank)},
                {"RANK", absl::StrCat(rank)},
                {"INIT", init}};
      so.pipe_stdin = true;
      so.capture_stdout = true;
      absl::StatusOr<std::unique_ptr<testutil::Subprocess>> child =
          testutil::Subprocess::Spawn(
              {testutil::RunfilePath("tests/rpc/device_peer_main")}, so);
      ASSERT_TRUE(child.ok()) << child.status();
      (rank == 1 ? w1_ : w2_) = *std::move(child);
    }
    api_ = std::make_shared<cuda::FakeDeviceApi>(1, uint64_t{1} << 30);
    auto registry = std::make_shared<rpc::FunctionRegistry>();
    ASSERT_TRUE(registry
                    ->Register("sink",
                               [this](Tensor t) -> absl::StatusOr<int64_t> {
                                 sink_calls_.fetch_add(1);
                                 return Check(t);
                               })
                    .ok());
    WorkerOptions o;
    o.name = "w0";
    o.rank = 0;
    o.world_size = 3;
    o.init_method = init;
    o.join_timeout = kLimit;
    o.rpc_timeout = kLimit;
    o.same_host = false;
    o.devices = {"cuda:0"};
    o.device_api = api_;
    o.cuda_transport = "staged";
    o.device_maps = {{"w1", {{"cuda:0", "cuda:0"}}},
                     {"w2", {{"cuda:0", "cuda:0"}}}};
    o.registry = registry;
    o.after_piece_received = [gate = gate_](uint64_t received,
                                            uint64_t total) {
      if (total < kBytes || received < total / 4 || received >= total) return;
      if (!gate->armed.exchange(false)) return;
      gate->held_at = received;
      gate->mid.Notify();
      gate->release.WaitForNotificationWithTimeout(kLimit);
    };
    absl::StatusOr<std::unique_ptr<Worker>> w0 = InitWorker(o);
    ASSERT_TRUE(w0.ok()) << w0.status();
    w0_ = *std::move(w0);
    for (testutil::Subprocess* c : {w1_.get(), w2_.get()}) {
      ASSERT_EQ(c->ReadLine(absl::Now() + kLimit), "ready");
    }
  }

  void TearDown() override {
    if (!gate_->release.HasBeenNotified()) gate_->release.Notify();
    w0_.reset();  // Abrupt: a member is dead, Shutdown could not complete.
    if (w2_ != nullptr) {
      w2_->CloseStdin();
      absl::StatusOr<int> code = w2_->Wait(absl::Now() + kLimit);
      EXPECT_TRUE(code.ok() && *code == 0) << code.status();
    }
  }

  // Whether device tensor `t` on w0's cuda:0 holds 0 .. n-1: its count, or
  // an error naming what differs.
  absl::StatusOr<int64_t> Check(const Tensor& t) {
    if (t.device() != Device::CUDA(0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("sink: the tensor is on ", t.device().ToString()));
    }
    absl::StatusOr<Tensor> host = cuda::CopyToHost(t, 0, *api_);
    if (!host.ok()) return host.status();
    if (!host->equal(arange(t.numel(), DType::kFloat32))) {
      return absl::DataLossError("sink: the bytes differ from 0 .. n-1");
    }
    return t.numel();
  }

  Held Now() {
    return {w0_->device_allocator()->Stats(0), api_->in_use_bytes(0),
            PinnedBytesInUse(*w0_)};
  }

  // What the cut message took is given back (its receiver drops it on a
  // gRPC thread, so this waits for it, within kLimit): nothing in use, and
  // once the copies its early landing queued ran and the device cache is
  // emptied, nothing reserved beyond `before`.
  void ExpectGivenBack(const Held& before) {
    EXPECT_TRUE(PollUntil(
        [&] {
          const Held now = Now();
          return now.allocator.allocated_bytes ==
                     before.allocator.allocated_bytes &&
                 now.pinned_bytes == before.pinned_bytes;
        },
        kLimit))
        << Now().allocator.allocated_bytes << " " << Now().pinned_bytes;
    ASSERT_TRUE(api_->SynchronizeStream(0, 0).ok());
    ASSERT_TRUE(w0_->device_allocator()->EmptyCache().ok());
    const Held after = Now();
    EXPECT_EQ(after.allocator.reserved_bytes, before.allocator.reserved_bytes);
    EXPECT_EQ(after.device_bytes, before.device_bytes);
  }

  // Kills w1 while the gate holds its transfer, then releases the gate.
  void KillW1WhileHeld() {
    ASSERT_TRUE(gate_->mid.WaitForNotificationWithTimeout(kLimit))
        << "no transfer of " << kBytes << " bytes reached w0";
    EXPECT_GE(gate_->held_at.load(), uint64_t{kBytes} / 4);
    EXPECT_LT(gate_->held_at.load(), uint64_t{kBytes});
    killed_ = absl::Now();
    ASSERT_TRUE(w1_->Signal(SIGKILL).ok());
    absl::StatusOr<int> code = w1_->Wait(absl::Now() + kLimit);
    EXPECT_EQ(code.status().code(), absl::StatusCode::kAborted)
        << code.status();  // Killed by the signal, so reaped: it is gone.
    gate_->release.Notify();
  }

  // A failure after the kill: names w1, came within kLimit (printed).
  void ExpectNamesW1Soon(const absl::Status& s) {
    const absl::Duration after = absl::Now() - killed_;
    std::printf("%.2f s after the kill: %s\n", absl::ToDoubleSeconds(after),
                s.ToString().c_str());
    EXPECT_THAT(s.message(), HasSubstr("'w1'")) << s;
    EXPECT_LT(after, kLimit) << s;
  }

  // w0 still calls w2 (a CUDA tensor comes back onto its cuda:0) and
  // serves it (w2 sends one to w0's sink), 64 MiB each way.
  void ServesW2(const Held& before) {
    const Tensor pad = full({int64_t{1} << 19}, 0.0);
    {
      Result<Tensor> t = w0_->rpc_sync<Tensor>("w2", "make", pad, kFloats);
      ASSERT_TRUE(t.ok()) << t.status();
      absl::StatusOr<int64_t> n = Check(*t);
      ASSERT_TRUE(n.ok()) << n.status();
      EXPECT_EQ(*n, kFloats);
    }
    const int before_calls = sink_calls_.load();
    ASSERT_TRUE(w2_->WriteStdin(absl::StrCat("send ", kFloats, "\n")).ok());
    EXPECT_EQ(w2_->ReadLine(absl::Now() + kLimit),
              absl::StrCat("sent ", kFloats));
    EXPECT_EQ(sink_calls_.load(), before_calls + 1);
    // What landed went back (cached: the allocator keeps the blocks).
    EXPECT_EQ(w0_->device_allocator()->Stats(0).allocated_bytes,
              before.allocator.allocated_bytes);
    EXPECT_EQ(w0_->staged_traffic("w2").tensors_in, 2u);
  }

  std::shared_ptr<Gate> gate_ = std::make_shared<Gate>();
  std::shared_ptr<cuda::FakeDeviceApi> api_;
  std::atomic<int> sink_calls_{0};
  std::unique_ptr<testutil::Subprocess> w1_;
  std::unique_ptr<testutil::Subprocess> w2_;
  std::unique_ptr<Worker> w0_;
  absl::Time killed_;
};

// w1 is killed while its reply (a 64 MiB CUDA tensor) streams to w0.
TEST_F(DeviceSenderKill, ReplySenderKilledMidTransfer) {
  const Held before = Now();
  gate_->armed = true;
  // The 2 MiB pad makes the request streamed, hence the reply.
  Future<Tensor> reply = w0_->rpc_async<Tensor>(
      "w1", "make", full({int64_t{1} << 19}, 0.0), kFloats);
  KillW1WhileHeld();
  Result<Tensor> r = reply.Get(kLimit);
  ASSERT_FALSE(r.ok()) << "a reply came from a killed sender";
  ExpectNamesW1Soon(r.status());
  ExpectGivenBack(before);
  EXPECT_EQ(w0_->staged_traffic("w1").tensors_in, 0u);
  ServesW2(before);
}

// w1 is killed while its request (a 64 MiB CUDA tensor for w0's sink)
// streams to w0: the handler never runs, nothing stays allocated, and w0's
// calls to w1 fail naming it.
TEST_F(DeviceSenderKill, RequestSenderKilledMidTransfer) {
  const Held before = Now();
  gate_->armed = true;
  ASSERT_TRUE(w1_->WriteStdin(absl::StrCat("send ", kFloats, "\n")).ok());
  KillW1WhileHeld();
  Result<Tensor> r = w0_->rpc_sync<Tensor>("w1", "make",
                                           full({int64_t{1} << 19}, 0.0), 4);
  ASSERT_FALSE(r.ok()) << "a killed peer answered";
  ExpectNamesW1Soon(r.status());
  EXPECT_EQ(sink_calls_.load(), 0);
  ExpectGivenBack(before);
  EXPECT_EQ(w0_->staged_traffic("w1").tensors_in, 0u);
  ServesW2(before);
}

}  // namespace
}  // namespace ferry
