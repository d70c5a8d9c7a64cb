#include "ferry/worker/device_testing.h"

#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "ferry/rpc/inspect.h"
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

int64_t PinnedBytesInUse(Worker& w) {
  absl::StatusOr<std::vector<rpc::Inspection>> seen =
      w.agent().inspectors().Inspect("devices");
  if (!seen.ok() || seen->empty()) return -1;
  for (const rpc::InspectionRow& row : (*seen)[0].rows) {
    int64_t bytes = 0;
    if (row.kind == "pinned" &&
        absl::SimpleAtoi(row.Get("allocated_bytes"), &bytes)) {
      return bytes;
    }
  }
  return -1;
}

}  // namespace ferry
