// Links against NCCL and the CUDA runtime and checks that the library found at
// run time is of the release series (major.minor) whose headers we compiled
// against; patch releases keep the ABI (a GPU machine's system NCCL 2.28.3
// ran code built against 2.28.9 headers). Needs no GPU.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdio>

#include "gtest/gtest.h"

namespace {

TEST(NcclLink, RuntimeVersionMatchesHeaders) {
  int version = 0;
  ASSERT_EQ(ncclGetVersion(&version), ncclSuccess);
  // NCCL_VERSION_CODE is major * 10000 + minor * 100 + patch since 2.9.
  EXPECT_EQ(version / 100, NCCL_VERSION_CODE / 100)
      << "run time " << version << ", headers " << NCCL_VERSION_CODE;
  if (version != NCCL_VERSION_CODE) {
    std::printf("NCCL %d at run time, headers %d\n", version,
                NCCL_VERSION_CODE);
  }
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
