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

TEST(NcclLink, EveryReportedDeviceAnswersAPropertyQuery) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    GTEST_SKIP() << "no usable CUDA device: " << cudaGetErrorString(err);
  }
  // CUDA reports "no device" as an error, so success means at least one.
  ASSERT_GE(count, 1);
  for (int d = 0; d < count; ++d) {
    cudaDeviceProp prop{};
    ASSERT_EQ(cudaGetDeviceProperties(&prop, d), cudaSuccess) << "device " << d;
    EXPECT_NE(prop.name[0], '\0') << "device " << d;
    EXPECT_GT(prop.totalGlobalMem, 0u) << "device " << d;
    EXPECT_GE(prop.major, 1) << "device " << d;
  }
}

}  // namespace
