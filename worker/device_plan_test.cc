// DevicePlan: option parsing, records, path choice, and InitWorker settling
// the plan of two workers over a FakeDeviceApi (no GPU needed).
#include "ferry/worker/device_plan.h"

#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "ferry/tensor/cuda/fake_device_api.h"
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

std::string FreshFile(const std::string& tag) {
  const char* dir = std::getenv("TEST_TMPDIR");
  std::string path =
      absl::StrCat(dir ? dir : "/tmp", "/device_plan_", tag, "_", getpid());
  std::remove(path.c_str());
  return "file://" + path;
}

// Starts workers "w0".."w<n-1>" on one init method at once; options[r] may
// set devices, maps and timeouts; returns each InitWorker's result.
std::vector<absl::StatusOr<std::unique_ptr<Worker>>> StartGroup(
    const std::string& tag, std::vector<WorkerOptions> options) {
  const std::string init = FreshFile(tag);
  std::vector<absl::StatusOr<std::unique_ptr<Worker>>> out(options.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < options.size(); ++r) {
    threads.emplace_back([&, r] {
      WorkerOptions& o = options[r];
      o.name = absl::StrCat("w", r);
      o.init_method = init;
      o.rank = static_cast<int>(r);
      o.world_size = static_cast<int>(options.size());
      out[r] = InitWorker(o);
    });
  }
  for (std::thread& t : threads) t.join();
  return out;
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
  auto w = StartGroup("pair", o);
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
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].Get("devices"), "cuda:0,cuda:1");
  EXPECT_EQ(rows[1].Get("peer"), "w1");
  EXPECT_EQ(rows[1].Get("path"), "ipc");
  EXPECT_EQ(rows[1].Get("map"), "cuda:0->cuda:1,cuda:1->cuda:0");
  // Shutdown is collective: both at once.
  std::vector<std::thread> ends;
  for (auto& worker : w) {
    ends.emplace_back([&worker] { EXPECT_TRUE((*worker)->Shutdown().ok()); });
  }
  for (std::thread& t : ends) t.join();
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
  auto w = StartGroup("lacks", o);
  ASSERT_FALSE(w[0].ok());
  EXPECT_EQ(w[0].status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(w[0].status().message(), HasSubstr("worker 'w0'"));
  EXPECT_THAT(w[0].status().message(),
              HasSubstr("cuda:1, which 'w1' does not have"));
  EXPECT_FALSE(w[1].ok());
}

}  // namespace
}  // namespace ferry
