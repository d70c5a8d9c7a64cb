#include "ferry/tensor/cuda/local_rank.h"

#include "gtest/gtest.h"

namespace ferry {
namespace cuda {
namespace {

TEST(DeviceForLocalRank, RanksBeyondTheDevicesShareOneWithTheirOwnHostId) {
  // Four ranks on two GPUs: 0 and 1 own their devices, 2 and 3 share them.
  std::vector<LocalRankDevice> got;
  for (int r = 0; r < 4; ++r) got.push_back(DeviceForLocalRank(r, 2));
  EXPECT_EQ(got[0].device, Device::CUDA(0));
  EXPECT_EQ(got[1].device, Device::CUDA(1));
  EXPECT_EQ(got[2].device, Device::CUDA(0));
  EXPECT_EQ(got[3].device, Device::CUDA(1));
  EXPECT_TRUE(got[0].nccl_hostid.empty());
  EXPECT_TRUE(got[1].nccl_hostid.empty());
  EXPECT_FALSE(got[2].nccl_hostid.empty());
  EXPECT_FALSE(got[3].nccl_hostid.empty());
  EXPECT_NE(got[2].nccl_hostid, got[3].nccl_hostid);
}

TEST(DeviceForLocalRank, OutOfRangeInputsFallBackToTheFirstDevice) {
  EXPECT_EQ(DeviceForLocalRank(-1, 2).device, Device::CUDA(0));
  EXPECT_EQ(DeviceForLocalRank(3, 0).device, Device::CUDA(0));
  EXPECT_TRUE(DeviceForLocalRank(3, 0).nccl_hostid.empty());
}

}  // namespace
}  // namespace cuda
}  // namespace ferry
