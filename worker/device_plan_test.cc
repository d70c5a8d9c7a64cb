// DevicePlan: option parsing, records, path choice, and InitWorker settling
// the plan of two workers over a FakeDeviceApi (no GPU needed); then CUDA
// tensors through rpc_sync over the staged path (worker/device_stage.h)
// between workers whose devices are FakeDeviceApi host memory.
#include "ferry/worker/device_plan.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "ferry/rpc/function_registry.h"
#include "ferry/tensor/cuda/caching_allocator.h"
#include "ferry/tensor/cuda/copy.h"
#include "ferry/tensor/cuda/fake_device_api.h"
#include "ferry/tensor/cuda/host_ops.h"
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

using Maps = std::map<std::string, std::map<std::string, std::string>>;

DeviceOptions Parsed(const std::vector<std::string>& devices, const Maps& maps,
                     const std::string& transport = "auto") {
  absl::StatusOr<DeviceOptions> o =
      ParseDeviceOptions("a", devices, maps, false, transport, 2);
  EXPECT_TRUE(o.ok()) << o.status();
  return o.ok() ? *std::move(o) : DeviceOptions{};
}

TEST(DevicePlan, RecordsRoundTripAndMalformedOnesNameThePeer) {
  DeviceRecord r{{Device::CUDA(0), Device::CUDA(3)}, "boot-1/shm/net"};
  absl::StatusOr<DeviceRecord> back =
      DecodeDeviceRecord("b", EncodeDeviceRecord(r));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->host, r.host);
  EXPECT_EQ(back->devices, r.devices);
  absl::StatusOr<DeviceRecord> none =
      DecodeDeviceRecord("b", EncodeDeviceRecord(DeviceRecord{{}, "h"}));
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->devices.empty());
  for (const char* bad : {"", "ferry-devices v1\nh", "v0\nh\ncuda:0",
                          "ferry-devices v1\nh\ncpu",
                          "ferry-devices v1\nh\ncuda:x",
                          "ferry-devices v1\nh\ncuda:0\nextra"}) {
    absl::StatusOr<DeviceRecord> d = DecodeDeviceRecord("b", bad);
    ASSERT_FALSE(d.ok()) << bad;
    EXPECT_EQ(d.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(d.status().message(), HasSubstr("worker 'b'"));
  }
}

TEST(DevicePlan, BadOptionsNameTheWorkerTheOptionAndTheDevice) {
  struct Case {
    std::vector<std::string> devices;
    Maps maps;
    std::string transport;
    int count;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {{"cuda:2"}, {}, "auto", 2, "cuda:2 does not exist"},
      {{"cuda:0"}, {}, "auto", -1, "device_api is null"},
      {{"cpu"}, {}, "auto", 2, "lists cpu"},
      {{"gpu0"}, {}, "auto", 2, "'gpu0'"},
      {{"cuda:0", "cuda:0"}, {}, "auto", 2, "listed twice"},
      {{"cuda:0"}, {{"b", {{"cuda:1", "cuda:0"}}}}, "auto", 2,
       "not among the worker's devices"},
      {{"cuda:0", "cuda:1"},
       {{"b", {{"cuda:0", "cuda:0"}, {"cuda:1", "cuda:0"}}}},
       "auto",
       2,
       "not 1:1"},
      {{"cuda:0"}, {{"b", {{"cuda:0", "cpu"}}}}, "auto", 2, "mixes CPU"},
      {{"cuda:0"}, {{"a", {{"cuda:0", "cuda:0"}}}}, "auto", 2, "itself"},
      {{}, {}, "nvlink", 2, "cuda_transport"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<DeviceOptions> o = ParseDeviceOptions(
        "a", c.devices, c.maps, false, c.transport, c.count);
    ASSERT_FALSE(o.ok()) << c.expect;
    EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(o.status().message(), HasSubstr("worker 'a'"));
    EXPECT_THAT(o.status().message(), HasSubstr(c.expect));
  }
}

TEST(DevicePlan, PathFollowsTheHostUnlessForced) {
  const Maps maps = {{"b", {{"cuda:0", "cuda:1"}}}};
  const DeviceRecord mine{{Device::CUDA(0)}, "host1"};
  const DeviceRecord here{{Device::CUDA(0), Device::CUDA(1)}, "host1"};
  const DeviceRecord there{{Device::CUDA(0), Device::CUDA(1)}, "host2"};
  const DeviceRecord unknown{{Device::CUDA(0), Device::CUDA(1)}, ""};
  auto path = [&](const DeviceRecord& peer, const std::string& transport,
                  const DeviceRecord& me) -> absl::StatusOr<std::string> {
    absl::StatusOr<DevicePlan> plan =
        DevicePlan::Make("a", Parsed({"cuda:0"}, maps, transport), me,
                         {{"b", peer}});
    if (!plan.ok()) return plan.status();
    EXPECT_EQ(plan->peers().size(), 1u);
    return std::string(CudaPathName(plan->Find("b")->path));
  };
  EXPECT_EQ(path(here, "auto", mine).value(), "ipc");
  EXPECT_EQ(path(there, "auto", mine).value(), "staged");
  // An unknown host is never "the same" (not even as this worker's).
  EXPECT_EQ(path(unknown, "auto", DeviceRecord{{Device::CUDA(0)}, ""}).value(),
            "staged");
  EXPECT_EQ(path(here, "staged", mine).value(), "staged");
  EXPECT_EQ(path(here, "ipc", mine).value(), "ipc");
  absl::StatusOr<std::string> forced = path(there, "ipc", mine);
  ASSERT_FALSE(forced.ok());
  EXPECT_EQ(forced.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(forced.status().message(), HasSubstr("'b' runs on another host"));
}

TEST(DevicePlan, ATargetThePeerLacksOrAMissingRecordIsRefused) {
  const DeviceOptions o = Parsed({"cuda:0"}, {{"b", {{"cuda:0", "cuda:3"}}}});
  const DeviceRecord mine{{Device::CUDA(0)}, "h"};
  absl::StatusOr<DevicePlan> lacks = DevicePlan::Make(
      "a", o, mine, {{"b", DeviceRecord{{Device::CUDA(0)}, "h"}}});
  ASSERT_FALSE(lacks.ok());
  EXPECT_THAT(lacks.status().message(), HasSubstr("cuda:3"));
  EXPECT_THAT(lacks.status().message(), HasSubstr("'b' does not have"));
  absl::StatusOr<DevicePlan> no_cuda =
      DevicePlan::Make("a", o, mine, {{"b", DeviceRecord{{}, "h"}}});
  ASSERT_FALSE(no_cuda.ok());
  EXPECT_THAT(no_cuda.status().message(), HasSubstr("0 CUDA devices"));
  absl::StatusOr<DevicePlan> missing = DevicePlan::Make("a", o, mine, {});
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(), HasSubstr("no device record of 'b'"));
}

TEST(DevicePlan, TwoWorkersSettleTheirPlanAndShowItToOperators) {
  auto gpus = std::make_shared<cuda::FakeDeviceApi>(2, 1 << 20);
  std::vector<WorkerOptions> o(2);
  o[0].devices = {"cuda:0", "cuda:1"};
  o[0].device_maps = {{"w1", {{"cuda:0", "cuda:1"}, {"cuda:1", "cuda:0"}}}};
  o[0].device_api = gpus;
  o[1].devices = {"cuda:0", "cuda:1"};
  o[1].device_maps = {{"w0", {{"cuda:1", "cuda:1"}}}};
  o[1].cuda_transport = "staged";
  o[1].device_api = gpus;
  for (WorkerOptions& each : o) each.join_timeout = absl::Seconds(30);
  auto w = StartWorkerGroup("pair", o);
  ASSERT_TRUE(w[0].ok()) << w[0].status();
  ASSERT_TRUE(w[1].ok()) << w[1].status();
  const PeerDevicePlan* to_w1 = (*w[0])->device_plan().Find("w1");
  ASSERT_NE(to_w1, nullptr);
  EXPECT_EQ(to_w1->path, CudaPath::kIpc);  // One host, auto.
  ASSERT_EQ(to_w1->map.size(), 2u);
  EXPECT_EQ(to_w1->map[0].first, "cuda:0");
  EXPECT_EQ(to_w1->map[0].second, "cuda:1");
  const PeerDevicePlan* to_w0 = (*w[1])->device_plan().Find("w0");
  ASSERT_NE(to_w0, nullptr);
  EXPECT_EQ(to_w0->path, CudaPath::kStaged);  // Forced.
  absl::StatusOr<std::vector<rpc::Inspection>> seen =
      (*w[0])->agent().inspectors().Inspect("devices");
  ASSERT_TRUE(seen.ok()) << seen.status();
  ASSERT_EQ(seen->size(), 1u);
  const std::vector<rpc::InspectionRow>& rows = (*seen)[0].rows;
  ASSERT_EQ(rows.size(), 3u);  // Devices, the peer, the pinned allocator.
  EXPECT_EQ(rows[0].Get("devices"), "cuda:0,cuda:1");
  EXPECT_EQ(rows[1].Get("peer"), "w1");
  EXPECT_EQ(rows[1].Get("path"), "ipc");
  EXPECT_EQ(rows[1].Get("map"), "cuda:0->cuda:1,cuda:1->cuda:0");
  EXPECT_EQ(rows[2].kind, "pinned");
  EXPECT_EQ(rows[2].Get("allocated_bytes"), "0");
  ShutdownWorkerGroup(w);
}

TEST(DevicePlan, AMapToADeviceThePeerLacksFailsInitWorkerNamingBoth) {
  auto gpus = std::make_shared<cuda::FakeDeviceApi>(2, 1 << 20);
  auto one_gpu = std::make_shared<cuda::FakeDeviceApi>(1, 1 << 20);
  std::vector<WorkerOptions> o(2);
  o[0].devices = {"cuda:0"};
  o[0].device_maps = {{"w1", {{"cuda:0", "cuda:1"}}}};
  o[0].device_api = gpus;
  o[0].join_timeout = absl::Seconds(20);
  o[1].devices = {"cuda:0"};
  o[1].device_api = one_gpu;
  // w0 fails before serving, so w1's group never forms: it fails too, on
  // its own (bounded) timeout.
  o[1].join_timeout = absl::Seconds(2);
  auto w = StartWorkerGroup("lacks", o);
  ASSERT_FALSE(w[0].ok());
  EXPECT_EQ(w[0].status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(w[0].status().message(), HasSubstr("worker 'w0'"));
  EXPECT_THAT(w[0].status().message(),
              HasSubstr("cuda:1, which 'w1' does not have"));
  EXPECT_FALSE(w[1].ok());
}

// --- CUDA tensors through rpc_sync, staged through host memory. ---

// Functions every callee serves: `make_on` makes a tensor on its own
// device (from `alloc` over `api`; may be null for a worker without).
std::shared_ptr<rpc::FunctionRegistry> Functions(
    std::shared_ptr<cuda::FakeDeviceApi> api,
    std::shared_ptr<cuda::CachingDeviceAllocator> alloc) {
  auto r = std::make_shared<rpc::FunctionRegistry>();
  EXPECT_TRUE(r->Register("echo", [](Tensor t) { return t; }).ok());
  EXPECT_TRUE(r->Register("where", [](Tensor a, Tensor b) {
                 return absl::StrCat(a.device().ToString(), ",",
                                     b.device().ToString());
               }).ok());
  EXPECT_TRUE(r->Register("make_on",
                          [api, alloc](int64_t device,
                                       int64_t n) -> absl::StatusOr<Tensor> {
                            return cuda::CopyToDevice(
                                arange(n, DType::kFloat32),
                                static_cast<int>(device), 0, *alloc, *api);
                          })
                  .ok());
  return r;
}

// What w0's test interceptor does to its next requests after staging.
enum class Tamper { kNone, kGarbage, kTargetFive, kTargetZero };

TEST(DeviceStage, CudaTensorsLandOnTheMappedDeviceAndRepliesOnTheReverse) {
  auto api0 = std::make_shared<cuda::FakeDeviceApi>(3, 64 << 20);
  auto api1 = std::make_shared<cuda::FakeDeviceApi>(3, 8 << 20);
  auto alloc1 = cuda::CachingDeviceAllocator::Create(api1, {}).value();
  std::shared_ptr<cuda::CachingDeviceAllocator> made1 = std::move(alloc1);
  auto tamper = std::make_shared<std::atomic<Tamper>>(Tamper::kNone);
  std::vector<WorkerOptions> o(3);
  o[0].devices = {"cuda:0", "cuda:1", "cuda:2"};  // cuda:2 is unmapped.
  o[0].device_maps = {{"w1", {{"cuda:0", "cuda:1"}, {"cuda:1", "cuda:0"}}}};
  o[0].device_api = api0;
  o[0].cuda_transport = "staged";
  o[0].before_serving = [tamper](Worker& w) {
    w.agent().AddInterceptor([tamper](rpc::InterceptPoint point,
                                      const rpc::WorkerInfo&,
                                      rpc::Message& m) {
      const Tamper t = tamper->load();
      if (point != rpc::InterceptPoint::kSendRequest || t == Tamper::kNone) {
        return absl::OkStatus();
      }
      if (t == Tamper::kGarbage) {
        m.SetHeader(kDeviceHeaderLayer, "\x0a\x02\x08");  // Truncated.
      } else {
        m.SetHeader(kDeviceHeaderLayer,
                    EncodeDeviceHeader(
                        {{{0, 0, t == Tamper::kTargetFive ? 5 : 0}}}));
      }
      return absl::OkStatus();
    });
    return absl::OkStatus();
  };
  o[0].registry = Functions(nullptr, nullptr);
  o[1].devices = {"cuda:0", "cuda:1", "cuda:2"};
  o[1].device_api = api1;
  o[1].registry = Functions(api1, made1);
  o[2].registry = Functions(nullptr, nullptr);  // No devices.
  for (WorkerOptions& each : o) each.join_timeout = absl::Seconds(30);
  auto w = StartWorkerGroup("stage", o);
  for (auto& each : w) ASSERT_TRUE(each.ok()) << each.status();
  Worker& w0 = **w[0];
  Worker& w1 = **w[1];
  cuda::CachingDeviceAllocator& alloc0 = *w0.device_allocator();
  ASSERT_EQ((*w[2])->device_allocator(), nullptr);

  // Echo: cuda:0 lands on w1's cuda:1 and comes back to cuda:0; cuda:1 on
  // w1's cuda:0 and back. Sizes: empty, one element, odd, 3 MiB.
  uint64_t sent_bytes = 0;
  int sent = 0;
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{1001}, int64_t{786432}}) {
    for (int device : {0, 1}) {
      const Tensor cpu = arange(n, DType::kFloat32);
      const Tensor x = OnDevice(cpu, device, alloc0, *api0);
      Result<std::string> where = w0.agent().rpc_sync<std::string>("w1", "where", x, x);
      ASSERT_TRUE(where.ok()) << where.status();
      const std::string on1 = device == 0 ? "cuda:1" : "cuda:0";
      EXPECT_EQ(*where, absl::StrCat(on1, ",", on1)) << n;
      Result<Tensor> back = w0.rpc_sync<Tensor>("w1", "echo", x);
      ASSERT_TRUE(back.ok()) << back.status();
      EXPECT_EQ(back->device(), Device::CUDA(device)) << n;
      EXPECT_TRUE(SameBytes(*back, cpu, *api0)) << n << " from cuda:" << device;
      sent += 3;
      sent_bytes += 3 * cpu.nbytes();
    }
  }
  // A tensor w1 makes on its cuda:1 comes back on w0's cuda:0 (the reverse
  // of w0's map), with w1's bytes.
  Result<Tensor> made = w0.rpc_sync<Tensor>("w1", "make_on", 1, 300);
  ASSERT_TRUE(made.ok()) << made.status();
  EXPECT_EQ(made->device(), Device::CUDA(0));
  EXPECT_TRUE(SameBytes(*made, arange(300, DType::kFloat32), *api0));

  // Operators see the traffic per peer; w1 counts what landed.
  StagedTraffic t01 = w0.staged_traffic("w1");
  EXPECT_EQ(t01.tensors_out, static_cast<uint64_t>(sent));
  EXPECT_EQ(t01.bytes_out, sent_bytes);
  EXPECT_EQ(t01.tensors_in, static_cast<uint64_t>(sent / 3 + 1));
  EXPECT_EQ(w1.staged_traffic("w0").tensors_in, static_cast<uint64_t>(sent));
  EXPECT_EQ(w1.staged_traffic("w0").bytes_in, sent_bytes);
  absl::StatusOr<std::vector<rpc::Inspection>> seen =
      w0.agent().inspectors().Inspect("devices");
  ASSERT_TRUE(seen.ok()) << seen.status();
  bool row = false;
  for (const rpc::InspectionRow& r : (*seen)[0].rows) {
    if (r.kind != "staged") continue;
    row = true;
    EXPECT_EQ(r.Get("peer"), "w1");
    EXPECT_EQ(r.Get("bytes_out"), absl::StrCat(sent_bytes));
  }
  EXPECT_TRUE(row);

  // An unmapped device fails the call, naming the worker, the peer, the
  // tensor's position and the device; nothing reaches w1.
  const Tensor on2 = OnDevice(arange(4, DType::kFloat32), 2, alloc0, *api0);
  Result<std::string> unmapped =
      w0.agent().rpc_sync<std::string>("w1", "where", arange(2), on2);
  ASSERT_FALSE(unmapped.ok());
  EXPECT_EQ(unmapped.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(unmapped.status().message(),
              HasSubstr("worker 'w0': tensor 1 of the message to 'w1' is on "
                        "cuda:2"));
  // A reply from a device no device of w0 maps to fails on w0.
  Result<Tensor> stray = w0.rpc_sync<Tensor>("w1", "make_on", 2, 4);
  ASSERT_FALSE(stray.ok());
  EXPECT_EQ(stray.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(stray.status().message(),
              HasSubstr("worker 'w0': tensor 0 of the reply from 'w1' is on "
                        "its cuda:2"));

  // w1 cannot hold 12 MiB on an 8 MiB device: ResourceExhausted naming the
  // worker, the device and the size; what it landed first is released,
  // and it goes on serving.
  const Tensor small = OnDevice(arange(262144, DType::kFloat32), 0, alloc0,
                                *api0);
  const Tensor big = OnDevice(arange(3 << 20, DType::kFloat32), 0, alloc0,
                              *api0);
  Result<std::string> full = w0.agent().rpc_sync<std::string>("w1", "where", small, big);
  ASSERT_FALSE(full.ok());
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(full.status().message(), HasSubstr("worker 'w1'"));
  EXPECT_THAT(full.status().message(), HasSubstr("from 'w0'"));
  EXPECT_THAT(full.status().message(), HasSubstr("tensor 1 (12582912 bytes"));
  EXPECT_THAT(full.status().message(), HasSubstr("on cuda:1"));
  EXPECT_EQ(w1.device_allocator()->Stats(1).allocated_bytes, 0u);
  EXPECT_GE(w1.staged_traffic("w0").refused, 1u);
  Result<std::string> after = w0.agent().rpc_sync<std::string>("w1", "where", small,
                                                       small);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(*after, "cuda:1,cuda:1");

  // Malformed device headers are refused by the receiver, never used.
  const Tensor one = OnDevice(arange(8, DType::kFloat32), 0, alloc0, *api0);
  tamper->store(Tamper::kGarbage);
  Result<Tensor> garbage = w0.rpc_sync<Tensor>("w1", "echo", one);
  tamper->store(Tamper::kTargetFive);
  Result<Tensor> five = w0.rpc_sync<Tensor>("w1", "echo", one);
  // A peer without devices receiving a CUDA target.
  tamper->store(Tamper::kTargetZero);
  Result<Tensor> none = w0.rpc_sync<Tensor>("w2", "echo", arange(3));
  tamper->store(Tamper::kNone);
  ASSERT_FALSE(garbage.ok());
  EXPECT_EQ(garbage.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(garbage.status().message(),
              HasSubstr("worker 'w1': the request CALL 'echo' from 'w0': "
                        "malformed device header"));
  ASSERT_FALSE(five.ok());
  EXPECT_EQ(five.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(five.status().message(),
              HasSubstr("is sent to cuda:5, which this worker does not use"));
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(none.status().message(),
              HasSubstr("worker 'w2': the request CALL 'echo' from 'w0'"));
  EXPECT_THAT(none.status().message(), HasSubstr("has no CUDA devices"));
  // A worker without devices refuses to send a CUDA tensor, naming it.
  Result<Tensor> from2 = (*w[2])->rpc_sync<Tensor>("w0", "echo", one);
  ASSERT_FALSE(from2.ok());
  EXPECT_EQ(from2.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(from2.status().message(),
              HasSubstr("worker 'w2': tensor 0 of the request CALL 'echo' to "
                        "'w0' is on cuda:0, which this worker does not use"));
  // Still serving after all that.
  Result<Tensor> fine = w0.rpc_sync<Tensor>("w1", "echo", one);
  ASSERT_TRUE(fine.ok()) << fine.status();
  EXPECT_TRUE(SameBytes(*fine, arange(8, DType::kFloat32), *api0));
  ShutdownWorkerGroup(w);
}

// Two workers of two fake devices each: w0 maps cuda:0 to w1's `target`
// (and may stage unmapped tensors to CPU); w1 serves Functions over api1.
struct Pair {
  std::shared_ptr<cuda::FakeDeviceApi> api0 =
      std::make_shared<cuda::FakeDeviceApi>(2, 8 << 20);
  std::shared_ptr<cuda::FakeDeviceApi> api1 =
      std::make_shared<cuda::FakeDeviceApi>(2, 8 << 20);
  WorkerGroup w;
};

Pair StartPair(const std::string& tag, const std::string& target,
               bool stage_to_cpu) {
  Pair p;
  std::shared_ptr<cuda::CachingDeviceAllocator> made1 =
      cuda::CachingDeviceAllocator::Create(p.api1, {}).value();
  std::vector<WorkerOptions> o(2);
  o[0].devices = {"cuda:0", "cuda:1"};
  o[0].device_maps = {{"w1", {{"cuda:0", target}}}};
  o[0].stage_unmapped_to_cpu = stage_to_cpu;
  o[0].device_api = p.api0;
  o[0].registry = Functions(nullptr, nullptr);
  o[1].devices = {"cuda:0", "cuda:1"};
  o[1].device_api = p.api1;
  o[1].registry = Functions(p.api1, made1);
  for (WorkerOptions& each : o) each.join_timeout = absl::Seconds(30);
  p.w = StartWorkerGroup(tag, o);
  return p;
}

TEST(DeviceStage, StageUnmappedToCpuLandsOnThePeersCpuBothWays) {
  Pair p = StartPair("to_cpu", "cuda:0", /*stage_to_cpu=*/true);
  WorkerGroup& w = p.w;
  for (auto& each : w) ASSERT_TRUE(each.ok()) << each.status();
  cuda::FakeDeviceApi* api0 = p.api0.get();
  Worker& w0 = **w[0];
  const Tensor cpu = arange(100, DType::kFloat32);
  const Tensor mapped = OnDevice(cpu, 0, *w0.device_allocator(), *api0);
  const Tensor unmapped = OnDevice(cpu, 1, *w0.device_allocator(), *api0);
  Result<std::string> where =
      w0.agent().rpc_sync<std::string>("w1", "where", mapped, unmapped);
  ASSERT_TRUE(where.ok()) << where.status();
  EXPECT_EQ(*where, "cuda:0,cpu");
  // The unmapped tensor's bytes arrive on the CPU.
  Result<Tensor> back = w0.rpc_sync<Tensor>("w1", "echo", unmapped);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_TRUE(back->device().is_cpu());
  EXPECT_EQ(std::memcmp(back->data_ptr(), cpu.data_ptr(), cpu.nbytes()), 0);
  // A reply from w1's cuda:1 (no reverse entry) lands on w0's CPU too.
  Result<Tensor> made = w0.rpc_sync<Tensor>("w1", "make_on", 1, 5);
  ASSERT_TRUE(made.ok()) << made.status();
  EXPECT_TRUE(made->device().is_cpu());
  EXPECT_EQ(w0.staged_traffic("w1").to_cpu_out, 2u);
  ShutdownWorkerGroup(w);
}

// The stage's copies go on its own stream; when the sending thread's current
// stream is another (a backward op on its forward's stream), the stage's
// stream first waits for it on the device. The fake's streams run only when
// driven: there the wait shows as the stage's host wait failing
// (FailedPrecondition, where CUDA would block until the side stream ran);
// without it the echo would carry the bytes from before the queued write.
TEST(DeviceStage, StagingWaitsForTheSendersCurrentStream) {
  Pair p;
  absl::StatusOr<std::unique_ptr<cuda::CudaContext>> ctx =
      cuda::CreateHostComputeContext(p.api0, {});
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  std::shared_ptr<cuda::CachingDeviceAllocator> made1 =
      cuda::CachingDeviceAllocator::Create(p.api1, {}).value();
  std::vector<WorkerOptions> o(2);
  o[0].devices = {"cuda:0"};
  o[0].device_maps = {{"w1", {{"cuda:0", "cuda:0"}}}};
  o[0].device_api = p.api0;
  o[0].device_compute = (*ctx)->shared_compute();
  o[0].registry = Functions(nullptr, nullptr);
  o[1].devices = {"cuda:0"};
  o[1].device_api = p.api1;
  o[1].registry = Functions(p.api1, made1);
  for (WorkerOptions& each : o) each.join_timeout = absl::Seconds(30);
  p.w = StartWorkerGroup("sender_stream", o);
  for (auto& each : p.w) ASSERT_TRUE(each.ok()) << each.status();
  Worker& w0 = **p.w[0];
  const Device dev = Device::CUDA(0);
  const Tensor want = arange(64, DType::kFloat32);
  absl::StatusOr<Tensor> src = (*ctx)->To(want, dev);
  absl::StatusOr<Tensor> dst = (*ctx)->To(zeros({64}), dev);
  ASSERT_TRUE(src.ok() && dst.ok());
  ASSERT_TRUE(p.api0->CompleteStream(0, 0));
  absl::StatusOr<cuda::StreamHandle> side = (*ctx)->NewStream(dev);
  ASSERT_TRUE(side.ok());
  {
    cuda::ThreadStreamGuard guard((*ctx)->compute(), dev, *side);
    ASSERT_TRUE(guard.status().ok());
    ASSERT_TRUE((*ctx)->compute()->CopyAsync(*dst, *src, *side).ok());
    Result<Tensor> early = w0.rpc_sync<Tensor>("w1", "echo", *dst);
    ASSERT_FALSE(early.ok()) << "staged without waiting for the side stream";
    EXPECT_EQ(early.status().code(), absl::StatusCode::kFailedPrecondition)
        << early.status();
  }
  ASSERT_TRUE(p.api0->CompleteStream(0, *side));
  ASSERT_TRUE(p.api0->CompleteStream(0, 0));
  Result<Tensor> back = w0.rpc_sync<Tensor>("w1", "echo", *dst);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(SameBytes(*back, want, *p.api0));
  ShutdownWorkerGroup(p.w);
}

// A message's tensors are staged through pinned memory with their copies
// queued and one wait per device on each side (not one per tensor), and the
// pinned blocks go back to each stage's allocator for the next message.
TEST(DeviceStage, CopiesGoThroughPinnedMemoryWithOneWaitPerDevice) {
  auto api0 = std::make_shared<cuda::FakeDeviceApi>(2, 8 << 20);
  auto api1 = std::make_shared<cuda::FakeDeviceApi>(2, 8 << 20);
  std::vector<WorkerOptions> o(2);
  o[0].devices = {"cuda:0", "cuda:1"};
  o[0].device_maps = {{"w1", {{"cuda:0", "cuda:1"}, {"cuda:1", "cuda:0"}}}};
  o[0].device_api = api0;
  o[1].devices = {"cuda:0", "cuda:1"};
  o[1].device_api = api1;
  auto registry = std::make_shared<rpc::FunctionRegistry>();
  ASSERT_TRUE(registry->Register("echo", [](Tensor t) { return t; }).ok());
  ASSERT_TRUE(registry
                  ->Register("four",
                             [](Tensor a, Tensor b, Tensor c, Tensor d) {
                               return absl::StrCat(
                                   a.device().ToString(), ",",
                                   b.device().ToString(), ",",
                                   c.device().ToString(), ",",
                                   d.device().ToString(), ",",
                                   a.numel() + b.numel() + c.numel() +
                                       d.numel());
                             })
                  .ok());
  for (WorkerOptions& each : o) {
    each.registry = registry;
    each.join_timeout = absl::Seconds(30);
  }
  WorkerGroup w = StartWorkerGroup("pinned", o);
  for (auto& each : w) ASSERT_TRUE(each.ok()) << each.status();
  Worker& w0 = **w[0];
  cuda::CachingDeviceAllocator& alloc0 = *w0.device_allocator();
  const Tensor a = OnDevice(arange(10, DType::kFloat32), 0, alloc0, *api0);
  const Tensor b = OnDevice(arange(20, DType::kFloat32), 0, alloc0, *api0);
  const Tensor c = OnDevice(arange(30, DType::kFloat32), 1, alloc0, *api0);
  const Tensor d = OnDevice(arange(40, DType::kFloat32), 1, alloc0, *api0);
  const uint64_t waits0 = api0->host_waits();
  const uint64_t waits1 = api1->host_waits();
  const uint64_t pinned0 = api0->pinned_copies();
  const uint64_t pinned1 = api1->pinned_copies();
  // Four tensors on two devices: one wait per device on the sender and on
  // the receiver (the reply is a string: no device work).
  Result<std::string> where =
      w0.agent().rpc_sync<std::string>("w1", "four", a, b, c, d);
  ASSERT_TRUE(where.ok()) << where.status();
  EXPECT_EQ(*where, "cuda:1,cuda:1,cuda:0,cuda:0,100");
  EXPECT_EQ(api0->host_waits() - waits0, 2u);
  EXPECT_EQ(api1->host_waits() - waits1, 2u);
  EXPECT_EQ(api0->pinned_copies() - pinned0, 4u);
  EXPECT_EQ(api1->pinned_copies() - pinned1, 4u);
  // Echoes: after the first, the pinned blocks come back and are reused
  // (a transport still holding a message's tensor may cost one more).
  const Tensor cpu = arange(1000, DType::kFloat32);
  const Tensor x = OnDevice(cpu, 0, alloc0, *api0);
  Result<Tensor> first = w0.rpc_sync<Tensor>("w1", "echo", x);
  ASSERT_TRUE(first.ok()) << first.status();
  const uint64_t allocs0 = api0->host_allocs();
  const uint64_t allocs1 = api1->host_allocs();
  for (int i = 0; i < 20; ++i) {
    Result<Tensor> back = w0.rpc_sync<Tensor>("w1", "echo", x);
    ASSERT_TRUE(back.ok()) << back.status();
    ASSERT_EQ(back->device(), Device::CUDA(0));
    EXPECT_TRUE(SameBytes(*back, cpu, *api0));
  }
  EXPECT_LE(api0->host_allocs() - allocs0, 2u);
  EXPECT_LE(api1->host_allocs() - allocs1, 2u);
  // Operators see the reuse in the pinned row of the inspector.
  absl::StatusOr<std::vector<rpc::Inspection>> seen =
      w0.agent().inspectors().Inspect("devices");
  ASSERT_TRUE(seen.ok()) << seen.status();
  const std::vector<rpc::InspectionRow>& rows = (*seen)[0].rows;
  auto pinned = std::find_if(rows.begin(), rows.end(), [](const auto& r) {
    return r.kind == "pinned";
  });
  ASSERT_NE(pinned, rows.end());
  int64_t hits = 0;
  ASSERT_TRUE(absl::SimpleAtoi(pinned->Get("cache_hits"), &hits));
  EXPECT_GE(hits, 18);  // 20 echoes' requests, less the slack above.
  ShutdownWorkerGroup(w);
}

TEST(DeviceStage, RRefValuesLandOnTheOwnersDeviceAndComeBackOnTheReverse) {
  Pair p = StartPair("rref", "cuda:1", /*stage_to_cpu=*/false);
  WorkerGroup& w = p.w;
  for (auto& each : w) ASSERT_TRUE(each.ok()) << each.status();
  cuda::FakeDeviceApi* api0 = p.api0.get();
  Worker& w0 = **w[0];
  // Values above the RRef layer's inline limit (4096 bytes), so the
  // creation reply never carries them and each to_here() fetches: the
  // counts below are exact whatever the reply's timing. (A carried value
  // counts once more when to_here() is issued after the reply arrived.)
  const Tensor cpu = arange(2000, DType::kFloat32);
  const Tensor x = OnDevice(cpu, 0, *w0.device_allocator(), *api0);
  {
    // remote(): the argument lands on w1's cuda:1, the owner keeps the
    // result there; to_here brings it back to w0's cuda:0 (RREF_FETCH's
    // reply, the reverse of w0's map).
    rref::RRef<Tensor> echoed = w0.remote<Tensor>("w1", "echo", x);
    absl::StatusOr<Tensor> here = echoed.to_here(absl::Seconds(20));
    ASSERT_TRUE(here.ok()) << here.status();
    EXPECT_EQ(here->device(), Device::CUDA(0));
    EXPECT_TRUE(SameBytes(*here, cpu, *api0));
    EXPECT_EQ((*w[1])->staged_traffic("w0").tensors_in, 1u);
    // A value the owner made on its cuda:1 comes home the same way.
    rref::RRef<Tensor> made =
        w0.remote<Tensor>("w1", "make_on", int64_t{1}, int64_t{2048});
    absl::StatusOr<Tensor> made_here = made.to_here(absl::Seconds(20));
    ASSERT_TRUE(made_here.ok()) << made_here.status();
    EXPECT_EQ(made_here->device(), Device::CUDA(0));
    EXPECT_TRUE(
        SameBytes(*made_here, arange(2048, DType::kFloat32), *api0));
    EXPECT_EQ(w0.staged_traffic("w1").tensors_in, 2u);
  }
  ShutdownWorkerGroup(w);
}

}  // namespace
}  // namespace ferry
