// Links against NCCL and the CUDA runtime and checks that the library found at
// run time is the one whose headers we compiled against. Needs no GPU.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include "gtest/gtest.h"

namespace {

TEST(NcclLink, RuntimeVersionMatchesHeaders) {
  int version = 0;
  ASSERT_EQ(ncclGetVersion(&version), ncclSuccess);
  EXPECT_EQ(version, NCCL_VERSION_CODE);
}

TEST(NcclLink, DeviceQueryAnswersWithoutCrashing) {
  int count = -1;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    GTEST_SKIP() << "no usable CUDA device: " << cudaGetErrorString(err);
  }
  EXPECT_GE(count, 0);
}

}  // namespace
