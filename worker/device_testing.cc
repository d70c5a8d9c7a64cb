#include "ferry/worker/device_testing.h"

#include <cstring>
#include <utility>

#include "ferry/tensor/cuda/copy.h"
#include "gtest/gtest.h"

namespace ferry {

Tensor OnDevice(const Tensor& cpu, int device,
                cuda::CachingDeviceAllocator& alloc,
                cuda::DeviceMemoryApi& api) {
  absl::StatusOr<Tensor> t = cuda::CopyToDevice(cpu, device, 0, alloc, api);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *std::move(t) : Tensor();
}

bool SameBytes(const Tensor& dev, const Tensor& cpu,
               cuda::DeviceMemoryApi& api) {
  absl::StatusOr<Tensor> host = cuda::CopyToHost(dev, 0, api);
  if (!host.ok()) {
    ADD_FAILURE() << host.status();
    return false;
  }
  return host->sizes() == cpu.sizes() && host->dtype() == cpu.dtype() &&
         (cpu.nbytes() == 0 ||
          std::memcmp(host->data_ptr(), cpu.data_ptr(), cpu.nbytes()) == 0);
}

}  // namespace ferry
