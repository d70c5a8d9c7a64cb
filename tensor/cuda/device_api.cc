#include "ferry/tensor/cuda/device_api.h"

#include "absl/strings/str_cat.h"

namespace ferry {
namespace cuda {

absl::Status CheckDevice(const DeviceMemoryApi& api, int device) {
  const int count = api.DeviceCount();
  if (device < 0 || device >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat(api.name(), ":", device, ": no such device (", count,
                     count == 1 ? " device" : " devices", " visible)"));
  }
  return absl::OkStatus();
}

}  // namespace cuda
}  // namespace ferry
