#include "ferry/rpc/device_map.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ferry::rpc {
namespace {

using ::testing::HasSubstr;

TEST(ParseDevice, CpuAndCudaAndBadText) {
  EXPECT_EQ(*ParseDevice("cpu"), Device::CPU());
  EXPECT_EQ(*ParseDevice("cuda"), Device::CUDA(0));
  EXPECT_EQ(*ParseDevice("cuda:3"), Device::CUDA(3));
  for (const char* bad : {"", "gpu:0", "cuda:", "cuda:-1", "cuda:x", "CPU"}) {
    absl::StatusOr<Device> d = ParseDevice(bad);
    ASSERT_FALSE(d.ok()) << bad;
    EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(d.status().message()),
                HasSubstr(absl::StrCat("'", bad, "'")));
  }
}

TEST(DeviceMaps, MappedTensorsLandOnTheTargetAndRepliesComeBack) {
  DeviceMaps maps;
  ASSERT_TRUE(maps.Set("trainer1", "cuda:0", "cuda:1").ok());
  ASSERT_TRUE(maps.Set("trainer1", "cuda:1", "cuda:0").ok());
  ASSERT_TRUE(maps.Validate("ps", {Device::CUDA(0), Device::CUDA(1)}).ok());
  EXPECT_EQ(*maps.Target("ps", "trainer1", Device::CUDA(0), 0),
            Device::CUDA(1));
  EXPECT_EQ(*maps.Target("ps", "trainer1", Device::CUDA(1), 1),
            Device::CUDA(0));
  // A CPU tensor always lands on the peer's CPU, mapped or not.
  EXPECT_EQ(*maps.Target("ps", "trainer1", Device::CPU(), 2), Device::CPU());
  EXPECT_EQ(*maps.Target("ps", "other", Device::CPU(), 0), Device::CPU());
  // Replies: the reverse map.
  EXPECT_EQ(*maps.ReplyTarget("ps", "trainer1", Device::CUDA(1), 0),
            Device::CUDA(0));
  EXPECT_EQ(*maps.ReplyTarget("ps", "trainer1", Device::CUDA(0), 0),
            Device::CUDA(1));
  const std::vector<std::pair<std::string, std::string>> want = {
      {"cuda:0", "cuda:1"}, {"cuda:1", "cuda:0"}};
  EXPECT_EQ(maps.Describe("trainer1"), want);
  EXPECT_TRUE(maps.Describe("other").empty());
}

TEST(DeviceMaps, AnUnmappedDeviceIsNamedWithTheWorkerAndPosition) {
  DeviceMaps maps;
  ASSERT_TRUE(maps.Set("trainer1", "cuda:0", "cuda:0").ok());
  absl::StatusOr<Device> d = maps.Target("ps", "trainer1", Device::CUDA(1), 2);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string msg(d.status().message());
  EXPECT_THAT(msg, HasSubstr("worker 'ps'"));
  EXPECT_THAT(msg, HasSubstr("tensor 2 of the message to 'trainer1'"));
  EXPECT_THAT(msg, HasSubstr("is on cuda:1"));
  EXPECT_THAT(msg, HasSubstr("(cuda:0->cuda:0)"));
  // A peer with no map at all.
  d = maps.Target("ps", "trainer2", Device::CUDA(0), 0);
  ASSERT_FALSE(d.ok());
  EXPECT_THAT(std::string(d.status().message()), HasSubstr("(none)"));
  // A reply from a device nothing maps to.
  d = maps.ReplyTarget("ps", "trainer1", Device::CUDA(5), 1);
  ASSERT_FALSE(d.ok());
  EXPECT_THAT(std::string(d.status().message()),
              HasSubstr("tensor 1 of the reply from 'trainer1' is on its "
                        "cuda:5"));
}

TEST(DeviceMaps, StagingSendsUnmappedTensorsToTheCpu) {
  DeviceMaps maps;
  maps.set_stage_unmapped_to_cpu(true);
  ASSERT_TRUE(maps.Set("trainer1", "cuda:0", "cuda:1").ok());
  EXPECT_EQ(*maps.Target("ps", "trainer1", Device::CUDA(0), 0),
            Device::CUDA(1));  // Mapped devices still follow the map.
  EXPECT_EQ(*maps.Target("ps", "trainer1", Device::CUDA(3), 0), Device::CPU());
  EXPECT_EQ(*maps.ReplyTarget("ps", "trainer1", Device::CUDA(3), 0),
            Device::CPU());
}

TEST(DeviceMaps, SetRefusesAMixAndARemapAndBadText) {
  DeviceMaps maps;
  absl::Status s = maps.Set("t", Device::CUDA(0), Device::CPU());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("mixes CPU and CUDA"));
  s = maps.Set("t", Device::CPU(), Device::CUDA(0));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(maps.Set("t", "cuda:0", "cuda:1").ok());
  EXPECT_TRUE(maps.Set("t", "cuda:0", "cuda:1").ok());  // The same again.
  s = maps.Set("t", "cuda:0", "cuda:2");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("cuda:0 is already mapped to cuda:1, not cuda:2"));
  s = maps.Set("t", "cuda:x", "cuda:0");
  EXPECT_THAT(std::string(s.message()), HasSubstr("source device 'cuda:x'"));
  s = maps.Set("t", "cuda:0", "tpu");
  EXPECT_THAT(std::string(s.message()), HasSubstr("target device 'tpu'"));
  // CPU -> CPU is implicit and accepted.
  EXPECT_TRUE(maps.Set("t", "cpu", "cpu").ok());
}

TEST(DeviceMaps, ValidateRefusesANonInjectiveMapAndForeignDevices) {
  DeviceMaps maps;
  ASSERT_TRUE(maps.Set("t", "cuda:0", "cuda:0").ok());
  ASSERT_TRUE(maps.Set("t", "cuda:1", "cuda:0").ok());
  absl::Status s = maps.Validate("ps", {Device::CUDA(0), Device::CUDA(1)});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("worker 'ps': the device map to 't' is not 1:1: "
                        "cuda:0 and cuda:1 both map to cuda:0"));

  DeviceMaps other;
  ASSERT_TRUE(other.Set("t", "cuda:2", "cuda:0").ok());
  s = other.Validate("ps", {Device::CUDA(0), Device::CUDA(1)});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("maps cuda:2, which is not among the worker's "
                        "devices [cuda:0, cuda:1]"));
  // The same target for two different peers is fine (1:1 is per peer).
  DeviceMaps two;
  ASSERT_TRUE(two.Set("a", "cuda:0", "cuda:0").ok());
  ASSERT_TRUE(two.Set("b", "cuda:1", "cuda:0").ok());
  EXPECT_TRUE(two.Validate("ps", {Device::CUDA(0), Device::CUDA(1)}).ok());
}

TEST(DeviceMaps, APeerWithoutTheTargetDeviceIsNamed) {
  DeviceMaps maps;
  ASSERT_TRUE(maps.Set("t", "cuda:0", "cuda:3").ok());
  EXPECT_TRUE(maps.CheckPeerDevices("ps", "t", {Device::CUDA(3)}).ok());
  absl::Status s = maps.CheckPeerDevices("ps", "t", {Device::CUDA(0)});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("maps cuda:0 to cuda:3, which 't' does not have (it "
                        "has 1 CUDA device)"));
  // A peer without CUDA at all.
  s = maps.CheckPeerDevices("ps", "t", {});
  EXPECT_THAT(std::string(s.message()), HasSubstr("it has 0 CUDA devices"));
  // Peers without a map need nothing.
  EXPECT_TRUE(maps.CheckPeerDevices("ps", "u", {}).ok());
}

}  // namespace
}  // namespace ferry::rpc
