// The CUDA IPC path (worker/device_ipc.h) between two workers in one
// process whose devices are FakeDeviceApi host memory: fakes on one FakeHost
// open each other's handles as processes of one machine would; a fake on
// another FakeHost cannot, as a different host or container cannot.
#include "ferry/worker/device_ipc.h"

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "ferry/common/poll.h"
#include "ferry/rpc/function_registry.h"
#include "ferry/tensor/cuda/caching_allocator.h"
#include "ferry/tensor/cuda/fake_device_api.h"
#include "ferry/tensor/tensor.h"
#include "ferry/worker/device_header.h"
#include "ferry/worker/device_testing.h"
#include "ferry/worker/test_group.h"
#include "ferry/worker/worker.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

using ::testing::HasSubstr;

// Edits the device header of w0's next requests (after staging).
using Tamper = std::function<void(DeviceHeader&)>;

struct Pair {
  // w1's "gate" returns once this is notified (or after 30 s).
  std::shared_ptr<absl::Notification> gate =
      std::make_shared<absl::Notification>();
  std::shared_ptr<cuda::FakeDeviceApi> api0;
  std::shared_ptr<cuda::FakeDeviceApi> api1;
  std::shared_ptr<Tamper> tamper = std::make_shared<Tamper>();
  // What w1's "keep" stored; "kept" returns it, "bump" adds 1 to its
  // elements (float32) in place on w1's device.
  std::shared_ptr<Tensor> kept = std::make_shared<Tensor>();
  WorkerGroup w;
  Worker& w0() { return **w[0]; }
  Worker& w1() { return **w[1]; }
};

// w0 (cuda:0, cuda:1) maps cuda:0 -> w1's cuda:1 and cuda:1 -> w1's cuda:0,
// with the ipc path forced; w1 serves echo, where and sum. `same_host`: both
// fakes on one FakeHost, else on two.
std::unique_ptr<Pair> StartPair(
    const std::string& tag, bool same_host,
    const std::function<void(std::vector<WorkerOptions>&)>& edit = {}) {
  auto p = std::make_unique<Pair>();
  auto host = std::make_shared<cuda::FakeHost>("h1");
  p->api0 = std::make_shared<cuda::FakeDeviceApi>(2, 64 << 20, host);
  p->api1 = std::make_shared<cuda::FakeDeviceApi>(
      2, 64 << 20,
      same_host ? host : std::make_shared<cuda::FakeHost>("h2"));
  auto registry = std::make_shared<rpc::FunctionRegistry>();
  EXPECT_TRUE(registry->Register("echo", [](Tensor t) { return t; }).ok());
  EXPECT_TRUE(registry
                  ->Register("where",
                             [](Tensor a, Tensor b) {
                               return absl::StrCat(a.device().ToString(), ",",
                                                   b.device().ToString());
                             })
                  .ok());
  EXPECT_TRUE(registry->Register("ping", [](int64_t x) { return x + 1; }).ok());
  EXPECT_TRUE(registry
                  ->Register("keep",
                             [kept = p->kept](Tensor t) {
                               *kept = t;
                               return t.numel();
                             })
                  .ok());
  EXPECT_TRUE(
      registry->Register("kept", [kept = p->kept]() { return *kept; }).ok());
  EXPECT_TRUE(registry
                  ->Register("bump",
                             [kept = p->kept, api = p->api1]() -> int64_t {
                               // Host round trip through the fake: read,
                               // add 1, write back (synchronous copies).
                               Tensor host = empty(kept->sizes(),
                                                   DType::kFloat32);
                               const int d = kept->device().index;
                               (void)api->MemcpyAsync(d, host.data_ptr(),
                                                      kept->data_ptr(),
                                                      host.nbytes(), 0);
                               (void)api->SynchronizeStream(d, 0);
                               float* f = static_cast<float*>(host.data_ptr());
                               for (int64_t i = 0; i < host.numel(); ++i) {
                                 f[i] += 1;
                               }
                               (void)api->MemcpyAsync(d, kept->data_ptr(),
                                                      host.data_ptr(),
                                                      host.nbytes(), 0);
                               (void)api->SynchronizeStream(d, 0);
                               return host.numel();
                             })
                  .ok());
  EXPECT_TRUE(registry
                  ->Register("gate",
                             [gate = p->gate](Tensor t) {
                               gate->WaitForNotificationWithTimeout(
                                   absl::Seconds(30));
                               return t.numel();
                             })
                  .ok());
  std::vector<WorkerOptions> o(2);
  o[0].devices = {"cuda:0", "cuda:1"};
  o[0].device_maps = {{"w1", {{"cuda:0", "cuda:1"}, {"cuda:1", "cuda:0"}}}};
  o[0].device_api = p->api0;
  o[0].cuda_transport = "ipc";
  o[0].before_serving = [tamper = p->tamper](Worker& w) {
    w.agent().AddInterceptor([tamper](rpc::InterceptPoint point,
                                      const rpc::WorkerInfo&,
                                      rpc::Message& m) -> absl::Status {
      const std::string* bytes = m.FindHeader(kDeviceHeaderLayer);
      if (point != rpc::InterceptPoint::kSendRequest || !*tamper ||
          bytes == nullptr) {
        return absl::OkStatus();
      }
      absl::StatusOr<DeviceHeader> h =
          DecodeDeviceHeader(*bytes, m.Tensors().size(), true, "tamper");
      if (!h.ok()) return h.status();
      (*tamper)(*h);
      m.SetHeader(kDeviceHeaderLayer, EncodeDeviceHeader(*h));
      return absl::OkStatus();
    });
    return absl::OkStatus();
  };
  o[1].devices = {"cuda:0", "cuda:1"};
  o[1].device_api = p->api1;
  o[1].registry = registry;
  for (WorkerOptions& each : o) each.join_timeout = absl::Seconds(30);
  if (edit) edit(o);
  p->w = StartWorkerGroup(tag, o);
  return p;
}

// `cpu` on `device` of w's devices, from w's allocator.
Tensor OnDevice(const Tensor& cpu, int device, Worker& w,
                cuda::DeviceMemoryApi& api) {
  return ::ferry::OnDevice(cpu, device, *w.device_allocator(), api);
}

TEST(DeviceIpc, EchoTravelsByIpcOnTheMappedDeviceAndOpensEachBlockOnce) {
  std::unique_ptr<Pair> p = StartPair("ipc_echo", /*same_host=*/true);
  for (auto& each : p->w) ASSERT_TRUE(each.ok()) << each.status();
  Worker& w0 = p->w0();
  Worker& w1 = p->w1();
  uint64_t sent = 0;
  uint64_t sent_bytes = 0;
  // One element, odd, 1 MiB, 3 MiB, from both devices; a float64 too.
  for (int64_t n : {int64_t{1}, int64_t{1001}, int64_t{262144},
                    int64_t{786432}}) {
    for (int device : {0, 1}) {
      for (DType dtype : {DType::kFloat32, DType::kFloat64}) {
        const Tensor cpu = arange(n, dtype);
        const Tensor x = OnDevice(cpu, device, w0, *p->api0);
        Result<std::string> where =
            w0.agent().rpc_sync<std::string>("w1", "where", x, x);
        ASSERT_TRUE(where.ok()) << where.status();
        const std::string on1 = device == 0 ? "cuda:1" : "cuda:0";
        EXPECT_EQ(*where, absl::StrCat(on1, ",", on1));
        Result<Tensor> back = w0.rpc_sync<Tensor>("w1", "echo", x);
        ASSERT_TRUE(back.ok()) << back.status();
        EXPECT_EQ(back->device(), Device::CUDA(device));
        EXPECT_TRUE(SameBytes(*back, cpu, *p->api0))
            << n << " from cuda:" << device;
        sent += 3;
        sent_bytes += 3 * cpu.nbytes();
      }
    }
  }
  // The requests went by IPC, none staged; the echoes' replies too.
  const IpcTraffic out = w0.ipc_traffic("w1");
  EXPECT_EQ(out.tensors_out, sent);
  EXPECT_EQ(out.bytes_out, sent_bytes);
  EXPECT_EQ(out.held_calls, 0u);  // Each reply released its request.
  EXPECT_EQ(w1.ipc_traffic("w0").tensors_in, sent);
  EXPECT_EQ(w1.ipc_traffic("w0").bytes_in, sent_bytes);
  EXPECT_EQ(w0.staged_traffic("w1").tensors_out, 0u);
  EXPECT_EQ(w1.staged_traffic("w0").tensors_in, 0u);
  EXPECT_EQ(w0.staged_traffic("w1").tensors_in, 0u);
  EXPECT_EQ(w1.staged_traffic("w0").tensors_out, 0u);
  EXPECT_EQ(out.reply_tensors_in, sent / 3);
  // An echoed tensor is still held by its request while the reply is
  // staged, so each went as a snapshot (one device copy on the callee).
  EXPECT_EQ(w1.ipc_traffic("w0").reply_snapshots, sent / 3);
  EXPECT_EQ(out.tensors_in, sent / 3);
  EXPECT_EQ(w1.ipc_traffic("w0").reply_tensors_out, sent / 3);
  // 10 calls with one tensor (a size class not used above, so a block not
  // opened before) open its handle once and reuse it 9 times.
  const Tensor cpu = arange(1 << 20, DType::kFloat32);  // 4 MiB.
  const Tensor x = OnDevice(cpu, 0, w0, *p->api0);
  const IpcTraffic before = w1.ipc_traffic("w0");
  const uint64_t api_opens = p->api1->ipc_opens();
  for (int i = 0; i < 10; ++i) {
    Result<std::string> where =
        w0.agent().rpc_sync<std::string>("w1", "where", x, arange(2));
    ASSERT_TRUE(where.ok()) << where.status();
    EXPECT_EQ(*where, "cuda:1,cpu");
  }
  const IpcTraffic after = w1.ipc_traffic("w0");
  EXPECT_EQ(after.handles_opened - before.handles_opened, 1u);
  EXPECT_EQ(after.handle_reuses - before.handle_reuses, 9u);
  EXPECT_EQ(p->api1->ipc_opens() - api_opens, 1u);
  // Operators see what carries the pair, and the counters.
  absl::StatusOr<std::vector<rpc::Inspection>> seen =
      w0.agent().inspectors().Inspect("devices");
  ASSERT_TRUE(seen.ok()) << seen.status();
  bool peer_row = false;
  bool ipc_row = false;
  for (const rpc::InspectionRow& r : (*seen)[0].rows) {
    if (r.kind == "peer") {
      peer_row = true;
      EXPECT_EQ(r.Get("path"), "ipc");
      EXPECT_EQ(r.Get("carried"), "ipc");
      EXPECT_EQ(r.Get("replies"), "ipc");
    }
    if (r.kind == "ipc") {
      ipc_row = true;
      EXPECT_EQ(r.Get("tensors_out"), absl::StrCat(sent + 10));
    }
  }
  EXPECT_TRUE(peer_row);
  EXPECT_TRUE(ipc_row);
  ShutdownWorkerGroup(p->w);
  // The receiver closed every mapping with its stage.
  p->w.clear();
  EXPECT_EQ(p->api1->open_mappings(), 0u);
}

// Bytes w's allocator hands out now on w1's cuda:1 (where w0's cuda:0
// tensors land).
uint64_t Allocated(Worker& w) {
  return w.device_allocator()->Stats(1).allocated_bytes;
}

// The callee holds an IPC reply's tensors until the caller acknowledges it:
// on its next request to the callee, or in a DEVICE_IPC_ACK message when no
// request follows.
TEST(DeviceIpc, RepliesGoByIpcAndAreReleasedOnceAcknowledged) {
  std::unique_ptr<Pair> p = StartPair("ipc_replies", /*same_host=*/true);
  for (auto& each : p->w) ASSERT_TRUE(each.ok()) << each.status();
  Worker& w0 = p->w0();
  Worker& w1 = p->w1();
  const Tensor cpu = arange(1024, DType::kFloat32);  // 4 KiB.
  const Tensor x = OnDevice(cpu, 0, w0, *p->api0);
  const uint64_t w1_before = Allocated(w1);
  constexpr int kCalls = 20;
  for (int i = 0; i < kCalls; ++i) {
    Result<Tensor> back = w0.rpc_sync<Tensor>("w1", "echo", x);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->device(), Device::CUDA(0));  // w1's cuda:1, mapped back.
    EXPECT_TRUE(SameBytes(*back, cpu, *p->api0));
  }
  // The last acknowledgement has no request to ride on: it goes alone.
  ASSERT_TRUE(PollUntil([&] { return w1.ipc_traffic("w0").held_replies == 0; },
                        absl::Seconds(20)))
      << w1.ipc_traffic("w0").held_replies << " held; acks sent "
      << w0.ipc_traffic("w1").acks_piggybacked << " + "
      << w0.ipc_traffic("w1").acks_in_messages << " in "
      << w0.ipc_traffic("w1").ack_messages << " messages";
  const IpcTraffic caller = w0.ipc_traffic("w1");
  const IpcTraffic callee = w1.ipc_traffic("w0");
  EXPECT_EQ(callee.reply_tensors_out, uint64_t{kCalls});
  EXPECT_EQ(caller.reply_tensors_in, uint64_t{kCalls});
  EXPECT_EQ(w1.staged_traffic("w0").tensors_out, 0u);
  EXPECT_EQ(caller.acks_piggybacked + caller.acks_in_messages,
            uint64_t{kCalls});
  EXPECT_GE(caller.ack_messages, 1u);
  // Each call but the last was followed by another within microseconds,
  // against the flusher's 2 ms.
  EXPECT_GE(caller.acks_piggybacked, 1u);
  // The held echoes went back to w1's allocator.
  EXPECT_EQ(Allocated(w1), w1_before);
  ShutdownWorkerGroup(p->w);
}

// Acknowledgements that never arrive (stripped from w0's requests and
// replaced by ids w1 never used) leave the replies held; the caller going
// down releases them.
TEST(DeviceIpc, UnacknowledgedRepliesStayHeldUntilTheCallerIsDown) {
  std::unique_ptr<Pair> p = StartPair("ipc_noack", /*same_host=*/true);
  for (auto& each : p->w) ASSERT_TRUE(each.ok()) << each.status();
  Worker& w0 = p->w0();
  Worker& w1 = p->w1();
  *p->tamper = [](DeviceHeader& h) {
    if (!h.reply_acks.empty()) h.reply_acks = {uint64_t{1} << 62, 7};
  };
  const Tensor cpu = arange(1024, DType::kFloat32);
  const Tensor x = OnDevice(cpu, 0, w0, *p->api0);
  const uint64_t w1_before = Allocated(w1);
  for (int i = 0; i < 3; ++i) {
    Result<Tensor> back = w0.rpc_sync<Tensor>("w1", "echo", x);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_TRUE(SameBytes(*back, cpu, *p->api0));
  }
  // Every acknowledgement was taken (and spoiled) on its way out.
  ASSERT_TRUE(PollUntil(
      [&] {
        const IpcTraffic t = w0.ipc_traffic("w1");
        return t.acks_piggybacked + t.acks_in_messages == 3;
      },
      absl::Seconds(20)));
  // One more call: its reply is the only one acknowledged by nobody yet,
  // and its request carried nothing.
  ASSERT_TRUE(w0.rpc_sync<int64_t>("w1", "ping", int64_t{1}).ok());
  EXPECT_EQ(w1.ipc_traffic("w0").held_replies, 3u);
  EXPECT_EQ(Allocated(w1), w1_before + 3 * cpu.nbytes());
  ASSERT_TRUE(w1.agent()
                  .ReportPeerDown(w0.agent().self().id,
                                  rpc::PeerDownReason::kDetectorReport,
                                  absl::UnavailableError("test detector"))
                  .ok());
  EXPECT_EQ(w1.ipc_traffic("w0").held_replies, 0u);
  EXPECT_EQ(Allocated(w1), w1_before);
  ShutdownWorkerGroup(p->w);
}

// A reply tensor the callee keeps (here an RRef-like stored value) may be
// written after the reply left: it is exported as a snapshot, so a write
// before the caller's copy cannot reach the caller.
TEST(DeviceIpc, AReplyTensorKeptByTheCalleeIsExportedAsASnapshot) {
  std::unique_ptr<Pair> p = StartPair("ipc_snapshot", /*same_host=*/true);
  for (auto& each : p->w) ASSERT_TRUE(each.ok()) << each.status();
  Worker& w0 = p->w0();
  Worker& w1 = p->w1();
  const Tensor cpu = arange(1024, DType::kFloat32);
  const Tensor x = OnDevice(cpu, 0, w0, *p->api0);
  ASSERT_TRUE(w0.rpc_sync<int64_t>("w1", "keep", x).ok());
  Result<Tensor> first = w0.rpc_sync<Tensor>("w1", "kept");
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(w0.agent().rpc_sync<int64_t>("w1", "bump").ok());
  Result<Tensor> second = w0.rpc_sync<Tensor>("w1", "kept");
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_TRUE(SameBytes(*first, cpu, *p->api0));
  Tensor plus_one = arange(1024, DType::kFloat32);
  float* f = static_cast<float*>(plus_one.data_ptr());
  for (int i = 0; i < 1024; ++i) f[i] += 1;
  EXPECT_TRUE(SameBytes(*second, plus_one, *p->api0));
  const IpcTraffic callee = w1.ipc_traffic("w0");
  EXPECT_EQ(callee.reply_tensors_out, 2u);
  EXPECT_EQ(callee.reply_snapshots, 2u);
  ShutdownWorkerGroup(p->w);
}

// Over WorkerOptions::ipc_reply_hold_bytes held for a caller, a reply is
// staged (and still arrives).
TEST(DeviceIpc, RepliesOverTheHoldLimitAreStaged) {
  std::unique_ptr<Pair> p = StartPair(
      "ipc_limit", /*same_host=*/true, [](std::vector<WorkerOptions>& o) {
        o[1].ipc_reply_hold_bytes = 8192;
      });
  for (auto& each : p->w) ASSERT_TRUE(each.ok()) << each.status();
  Worker& w0 = p->w0();
  Worker& w1 = p->w1();
  *p->tamper = [](DeviceHeader& h) { h.reply_acks.clear(); };
  const Tensor cpu = arange(1024, DType::kFloat32);  // 4 KiB a reply.
  const Tensor x = OnDevice(cpu, 0, w0, *p->api0);
  for (int i = 0; i < 3; ++i) {
    Result<Tensor> back = w0.rpc_sync<Tensor>("w1", "echo", x);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->device(), Device::CUDA(0));
    EXPECT_TRUE(SameBytes(*back, cpu, *p->api0)) << "call " << i;
  }
  // 0 and 4 KiB held: by IPC; 8 KiB held: staged.
  const IpcTraffic callee = w1.ipc_traffic("w0");
  EXPECT_EQ(callee.reply_tensors_out, 2u);
  EXPECT_EQ(callee.replies_over_limit, 1u);
  EXPECT_EQ(callee.held_replies, 2u);
  EXPECT_EQ(w1.staged_traffic("w0").tensors_out, 1u);
  EXPECT_EQ(w0.staged_traffic("w1").tensors_in, 1u);
  ShutdownWorkerGroup(p->w);
}

TEST(DeviceIpc, ConcurrentCallsFromOneBlockOpenItOnceAndAllLand) {
  std::unique_ptr<Pair> p = StartPair("ipc_many", /*same_host=*/true);
  for (auto& each : p->w) ASSERT_TRUE(each.ok()) << each.status();
  Worker& w0 = p->w0();
  Worker& w1 = p->w1();
  const Tensor cpu = arange(5000, DType::kFloat32);
  const Tensor x = OnDevice(cpu, 1, w0, *p->api0);
  // 16 requests in flight at once, all exporting the same block.
  std::vector<Future<Tensor>> calls;
  for (int i = 0; i < 16; ++i) {
    calls.push_back(w0.agent().rpc_async<Tensor>("w1", "echo", x));
  }
  for (Future<Tensor>& call : calls) {
    Result<Tensor> back = call.Get(absl::Seconds(30));
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->device(), Device::CUDA(1));
    EXPECT_TRUE(SameBytes(*back, cpu, *p->api0));
  }
  const IpcTraffic in = w1.ipc_traffic("w0");
  EXPECT_EQ(in.tensors_in, 16u);
  EXPECT_EQ(in.handles_opened, 1u);  // Opened under the lock, once.
  EXPECT_EQ(in.handle_reuses, 15u);
  EXPECT_EQ(w0.ipc_traffic("w1").held_calls, 0u);
  ShutdownWorkerGroup(p->w);
}

// A peer down for any reason (here an outside detector's report, which the
// transport does not act on) acknowledges nothing more: the sender releases
// what it holds for its requests at once, not at their deadline, and the
// receiver closes the mappings of the peer's memory.
TEST(DeviceIpc, APeerReportedDownReleasesHeldTensorsAndItsMappings) {
  std::unique_ptr<Pair> p = StartPair("ipc_down", /*same_host=*/true);
  for (auto& each : p->w) ASSERT_TRUE(each.ok()) << each.status();
  Worker& w0 = p->w0();
  Worker& w1 = p->w1();
  const Tensor x = OnDevice(arange(3000, DType::kFloat32), 0, w0, *p->api0);
  Result<Tensor> back = w0.rpc_sync<Tensor>("w1", "echo", x);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(p->api1->open_mappings(), 1u);  // Cached for the next call.
  // A call whose handler waits: its request stays held on w0.
  Future<int64_t> waiting =
      w0.agent().rpc_async_for<int64_t>(absl::Seconds(60), "w1", "gate", x);
  ASSERT_TRUE(PollUntil(
      [&] {
        return w1.ipc_traffic("w0").tensors_in == 2 &&
               w0.ipc_traffic("w1").held_calls == 1;
      },
      absl::Seconds(20)));
  ASSERT_TRUE(w0.agent()
                  .ReportPeerDown(w1.agent().self().id,
                                  rpc::PeerDownReason::kDetectorReport,
                                  absl::UnavailableError("test detector"))
                  .ok());
  EXPECT_TRUE(PollUntil([&] { return w0.ipc_traffic("w1").held_calls == 0; },
                        absl::Seconds(10)));  // Its deadline is 60 s away.
  ASSERT_TRUE(w1.agent()
                  .ReportPeerDown(w0.agent().self().id,
                                  rpc::PeerDownReason::kDetectorReport,
                                  absl::UnavailableError("test detector"))
                  .ok());
  EXPECT_EQ(p->api1->open_mappings(), 0u);
  p->gate->Notify();
  // The call itself goes on (the agent does not act on a detector's
  // report); its late acknowledgement finds nothing held.
  Result<int64_t> done = waiting.Get(absl::Seconds(30));
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(*done, 3000);
  EXPECT_EQ(w0.ipc_traffic("w1").held_calls, 0u);
  ShutdownWorkerGroup(p->w);
}

// Events come from a pool: 10 calls one after another (each acknowledged
// before the next) create one event, export it once, and the receiver
// opens it once.
TEST(DeviceIpc, SequentialCallsReuseOneEventAndOpenItOnce) {
  std::unique_ptr<Pair> p = StartPair("ipc_pool", /*same_host=*/true);
  for (auto& each : p->w) ASSERT_TRUE(each.ok()) << each.status();
  Worker& w0 = p->w0();
  Worker& w1 = p->w1();
  const Tensor cpu = arange(1000, DType::kFloat32);
  const Tensor x = OnDevice(cpu, 0, w0, *p->api0);
  const uint64_t created = p->api0->ipc_events_created();
  const uint64_t opens = p->api1->ipc_event_opens();
  for (int i = 0; i < 10; ++i) {
    Result<Tensor> back = w0.rpc_sync<Tensor>("w1", "echo", x);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_TRUE(SameBytes(*back, cpu, *p->api0));
  }
  EXPECT_EQ(p->api0->ipc_events_created() - created, 1u);
  EXPECT_EQ(p->api1->ipc_event_opens() - opens, 1u);
  const IpcTraffic out = w0.ipc_traffic("w1");
  EXPECT_EQ(out.events_created, 1u);
  EXPECT_EQ(out.events_reused, 9u);
  const IpcTraffic in = w1.ipc_traffic("w0");
  EXPECT_EQ(in.events_opened, 1u);
  EXPECT_EQ(in.event_open_reuses, 9u);
  bool ipc_row = false;
  absl::StatusOr<std::vector<rpc::Inspection>> seen =
      w1.agent().inspectors().Inspect("devices");
  ASSERT_TRUE(seen.ok()) << seen.status();
  for (const rpc::InspectionRow& r : (*seen)[0].rows) {
    if (r.kind != "ipc") continue;
    ipc_row = true;
    EXPECT_EQ(r.Get("events_opened"), "1");
    EXPECT_EQ(r.Get("event_open_reuses"), "9");
  }
  EXPECT_TRUE(ipc_row);
  ShutdownWorkerGroup(p->w);
}

// Requests in flight at once (held: their handlers wait) each get their own
// event, a pooled one only once; once acknowledged, the events serve later
// calls.
TEST(DeviceIpc, CallsInFlightUseDistinctEvents) {
  std::unique_ptr<Pair> p = StartPair("ipc_pool_many", /*same_host=*/true);
  for (auto& each : p->w) ASSERT_TRUE(each.ok()) << each.status();
  Worker& w0 = p->w0();
  Worker& w1 = p->w1();
  const Tensor x = OnDevice(arange(700, DType::kFloat32), 1, w0, *p->api0);
  Result<Tensor> first = w0.rpc_sync<Tensor>("w1", "echo", x);  // Pools one.
  ASSERT_TRUE(first.ok()) << first.status();
  std::vector<Future<int64_t>> calls;
  for (int i = 0; i < 3; ++i) {
    calls.push_back(w0.agent().rpc_async_for<int64_t>(absl::Seconds(60),
                                                      "w1", "gate", x));
  }
  ASSERT_TRUE(PollUntil(
      [&] {
        return w1.ipc_traffic("w0").tensors_in == 4 &&  // With the echo.
               w0.ipc_traffic("w1").held_calls == 3;
      },
      absl::Seconds(20)));
  EXPECT_EQ(w0.ipc_traffic("w1").events_created, 3u);
  EXPECT_EQ(w0.ipc_traffic("w1").events_reused, 1u);
  EXPECT_EQ(w1.ipc_traffic("w0").events_opened, 3u);  // Three handles.
  EXPECT_EQ(w1.ipc_traffic("w0").event_open_reuses, 1u);
  p->gate->Notify();
  for (Future<int64_t>& call : calls) {
    Result<int64_t> done = call.Get(absl::Seconds(30));
    ASSERT_TRUE(done.ok()) << done.status();
  }
  ASSERT_TRUE(PollUntil([&] { return w0.ipc_traffic("w1").held_calls == 0; },
                        absl::Seconds(10)));
  Result<Tensor> back = w0.rpc_sync<Tensor>("w1", "echo", x);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(w0.ipc_traffic("w1").events_created, 3u);
  EXPECT_EQ(w0.ipc_traffic("w1").events_reused, 2u);
  EXPECT_EQ(w1.ipc_traffic("w0").events_opened, 3u);
  EXPECT_EQ(w1.ipc_traffic("w0").event_open_reuses, 2u);
  ShutdownWorkerGroup(p->w);
}

// A hold released by its deadline or by the peer's failure destroys its
// event (the peer may still wait on it): the next call creates a new one.
TEST(DeviceIpc, AHoldReleasedByDeadlineOrPeerFailureDoesNotPoolItsEvent) {
  std::unique_ptr<Pair> p = StartPair("ipc_pool_drop", /*same_host=*/true);
  for (auto& each : p->w) ASSERT_TRUE(each.ok()) << each.status();
  Worker& w0 = p->w0();
  Worker& w1 = p->w1();
  const Tensor x = OnDevice(arange(900, DType::kFloat32), 0, w0, *p->api0);
  // Deadline: the handler waits past it, so no acknowledgement comes.
  Future<int64_t> late = w0.agent().rpc_async_for<int64_t>(
      absl::Milliseconds(500), "w1", "gate", x);
  EXPECT_FALSE(late.Get(absl::Seconds(30)).ok());
  ASSERT_TRUE(PollUntil([&] { return w0.ipc_traffic("w1").held_calls == 0; },
                        absl::Seconds(10)));
  p->gate->Notify();  // The late handler returns; its ack finds nothing.
  Result<Tensor> back = w0.rpc_sync<Tensor>("w1", "echo", x);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(w0.ipc_traffic("w1").events_created, 2u);
  EXPECT_EQ(w0.ipc_traffic("w1").events_reused, 0u);
  // Peer failure: a held request's event is destroyed, not pooled.
  auto gate2 = std::make_shared<absl::Notification>();
  ASSERT_TRUE(w1.registry()
                  .Register("gate2",
                             [gate2](Tensor t) {
                               gate2->WaitForNotificationWithTimeout(
                                   absl::Seconds(30));
                               return t.numel();
                             })
                  .ok());
  Future<int64_t> waiting =
      w0.agent().rpc_async_for<int64_t>(absl::Seconds(60), "w1", "gate2", x);
  ASSERT_TRUE(PollUntil([&] { return w0.ipc_traffic("w1").held_calls == 1; },
                        absl::Seconds(20)));
  EXPECT_EQ(w0.ipc_traffic("w1").events_reused, 1u);  // The pooled one.
  const uint64_t live_held = p->api0->live_events();
  ASSERT_TRUE(w0.agent()
                  .ReportPeerDown(w1.agent().self().id,
                                  rpc::PeerDownReason::kDetectorReport,
                                  absl::UnavailableError("test detector"))
                  .ok());
  ASSERT_TRUE(PollUntil([&] { return w0.ipc_traffic("w1").held_calls == 0; },
                        absl::Seconds(10)));
  EXPECT_EQ(p->api0->live_events(), live_held - 1);  // Destroyed.
  gate2->Notify();
  ASSERT_TRUE(waiting.Get(absl::Seconds(30)).ok());
  back = w0.rpc_sync<Tensor>("w1", "echo", x);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(w0.ipc_traffic("w1").events_created, 3u);
  EXPECT_EQ(w0.ipc_traffic("w1").events_reused, 1u);
  ShutdownWorkerGroup(p->w);
}

TEST(DeviceIpc, TheReceiverWaitsForTheSendersProducerWork) {
  std::unique_ptr<Pair> p = StartPair("ipc_order", /*same_host=*/true);
  for (auto& each : p->w) ASSERT_TRUE(each.ok()) << each.status();
  Worker& w0 = p->w0();
  const Tensor x = OnDevice(arange(4096, DType::kFloat32), 0, w0, *p->api0);
  // A write queued on w0's stream and not waited for: the fake runs it only
  // when the stream completes, so a receiver that did not wait on the
  // sender's event would copy the old bytes.
  const Tensor fresh = full({4096}, 7.0, DType::kFloat32);
  ASSERT_TRUE(p->api0
                  ->MemcpyAsync(0, x.data_ptr(), fresh.data_ptr(),
                                fresh.nbytes(), 0)
                  .ok());
  Result<Tensor> back = w0.rpc_sync<Tensor>("w1", "echo", x);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(SameBytes(*back, fresh, *p->api0));
  EXPECT_EQ(w0.ipc_traffic("w1").tensors_out, 1u);
  ShutdownWorkerGroup(p->w);
}

TEST(DeviceIpc, AHandleFromAnotherHostFailsTheCallAndLeaksNothing) {
  std::unique_ptr<Pair> p = StartPair("ipc_hosts", /*same_host=*/false);
  for (auto& each : p->w) ASSERT_TRUE(each.ok()) << each.status();
  Worker& w0 = p->w0();
  Worker& w1 = p->w1();
  const Tensor x = OnDevice(arange(1000, DType::kFloat32), 0, w0, *p->api0);
  Result<Tensor> failed =
      w0.agent().rpc_sync_for<Tensor>(absl::Seconds(2), "w1", "echo", x);
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(failed.status().message(),
              HasSubstr("worker 'w1': the request CALL 'echo' from 'w0'"));
  EXPECT_THAT(failed.status().message(),
              HasSubstr("opening the IPC memory handle of 'w0' on cuda:1"));
  EXPECT_THAT(failed.status().message(), HasSubstr("another host"));
  // The receiver holds nothing: no device bytes, no mapping.
  EXPECT_EQ(w1.device_allocator()->Stats(1).allocated_bytes, 0u);
  EXPECT_EQ(p->api1->open_mappings(), 0u);
  EXPECT_GE(w1.staged_traffic("w0").refused, 1u);
  // No reply releases the sender's tensor (rpc/ runs no interceptor on a
  // failed call): its hold ends at the call's deadline.
  EXPECT_TRUE(PollUntil([&] { return w0.ipc_traffic("w1").held_calls == 0; },
                        absl::Seconds(20)));
  // Both keep serving.
  Result<int64_t> ping = w0.agent().rpc_sync<int64_t>("w1", "ping", 41);
  ASSERT_TRUE(ping.ok()) << ping.status();
  EXPECT_EQ(*ping, 42);
  ShutdownWorkerGroup(p->w);
}

TEST(DeviceIpc, MalformedHandleFieldsAreInvalidArgumentAndTheWorkerServes) {
  std::unique_ptr<Pair> p = StartPair("ipc_bad", /*same_host=*/true);
  for (auto& each : p->w) ASSERT_TRUE(each.ok()) << each.status();
  Worker& w0 = p->w0();
  Worker& w1 = p->w1();
  const Tensor cpu = arange(1000, DType::kFloat32);
  const Tensor x = OnDevice(cpu, 0, w0, *p->api0);
  struct Case {
    std::string name;
    Tamper tamper;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {"garbage handle",
       [](DeviceHeader& h) {
         h.placements[1].ipc->memory_handle = std::string(64, 'x');
       },
       "not a fake IPC memory handle"},
      {"short handle",
       [](DeviceHeader& h) { h.placements[1].ipc->memory_handle = "x"; },
       "memory handle of 1 bytes"},
      {"offset out of the block",
       [](DeviceHeader& h) {
         IpcTensor& t = *h.placements[1].ipc;
         t.offset = t.allocation_bytes + 8;
       },
       "outside its allocation"},
      {"size beyond the opened block",
       [](DeviceHeader& h) {
         IpcTensor& t = *h.placements[1].ipc;
         t.allocation_bytes *= 64;
         t.sizes = {static_cast<int64_t>(t.allocation_bytes / 8)};
       },
       "overrun the peer's allocation"},
      {"shape past the claimed block",
       [](DeviceHeader& h) {
         IpcTensor& t = *h.placements[1].ipc;
         t.sizes = {static_cast<int64_t>(t.allocation_bytes / 2)};
       },
       "does not fit the"},
      {"event out of range",
       [](DeviceHeader& h) { h.placements[1].ipc->event = 7; },
       "names event 7"},
      {"bad event bytes",
       [](DeviceHeader& h) { h.events[0] = std::string(64, 'e'); },
       "not a fake IPC event handle"},
  };
  for (const Case& c : cases) {
    *p->tamper = c.tamper;
    // Two tensors: the first lands before the second fails, and goes back.
    Result<std::string> bad =
        w0.agent().rpc_sync_for<std::string>(absl::Seconds(2), "w1", "where",
                                             x, x);
    *p->tamper = nullptr;
    ASSERT_FALSE(bad.ok()) << c.name;
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument)
        << c.name << ": " << bad.status();
    EXPECT_THAT(bad.status().message(),
                HasSubstr("worker 'w1': the request CALL 'where' from 'w0'"))
        << c.name;
    EXPECT_THAT(bad.status().message(), HasSubstr(c.expect)) << c.name;
    EXPECT_EQ(w1.device_allocator()->Stats(1).allocated_bytes, 0u) << c.name;
  }
  // Still serving, by IPC.
  const uint64_t before = w0.ipc_traffic("w1").tensors_out;
  Result<Tensor> back = w0.rpc_sync<Tensor>("w1", "echo", x);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(SameBytes(*back, cpu, *p->api0));
  EXPECT_EQ(w0.ipc_traffic("w1").tensors_out, before + 1);
  ShutdownWorkerGroup(p->w);
}

TEST(DeviceIpc, AFakeWithoutAHostStagesAndSaysWhy) {
  // The plan says ipc (forced), but the device API cannot share memory:
  // the pair is staged and the inspector names the reason.
  auto api0 = std::make_shared<cuda::FakeDeviceApi>(1, 8 << 20);
  auto api1 = std::make_shared<cuda::FakeDeviceApi>(1, 8 << 20);
  auto registry = std::make_shared<rpc::FunctionRegistry>();
  ASSERT_TRUE(registry->Register("echo", [](Tensor t) { return t; }).ok());
  std::vector<WorkerOptions> o(2);
  o[0].devices = {"cuda:0"};
  o[0].device_maps = {{"w1", {{"cuda:0", "cuda:0"}}}};
  o[0].device_api = api0;
  o[0].cuda_transport = "ipc";
  o[1].devices = {"cuda:0"};
  o[1].device_api = api1;
  o[1].registry = registry;
  for (WorkerOptions& each : o) each.join_timeout = absl::Seconds(30);
  WorkerGroup w = StartWorkerGroup("ipc_nohost", o);
  for (auto& each : w) ASSERT_TRUE(each.ok()) << each.status();
  Worker& w0 = **w[0];
  const Tensor cpu = arange(100, DType::kFloat32);
  const Tensor x = OnDevice(cpu, 0, w0, *api0);
  Result<Tensor> back = w0.rpc_sync<Tensor>("w1", "echo", x);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(SameBytes(*back, cpu, *api0));
  EXPECT_EQ(w0.staged_traffic("w1").tensors_out, 1u);
  EXPECT_EQ(w0.ipc_traffic("w1").tensors_out, 0u);
  absl::StatusOr<std::vector<rpc::Inspection>> seen =
      w0.agent().inspectors().Inspect("devices");
  ASSERT_TRUE(seen.ok()) << seen.status();
  bool row = false;
  for (const rpc::InspectionRow& r : (*seen)[0].rows) {
    if (r.kind != "peer") continue;
    row = true;
    EXPECT_EQ(r.Get("path"), "ipc");
    EXPECT_EQ(r.Get("carried"), "staged");
    EXPECT_THAT(r.Get("ipc_unavailable"), HasSubstr("no FakeHost"));
  }
  EXPECT_TRUE(row);
  ShutdownWorkerGroup(w);
}

}  // namespace
}  // namespace ferry
