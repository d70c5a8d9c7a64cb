#include "ferry/tensor/cuda/device_ipc.h"

namespace ferry {
namespace cuda {

std::shared_ptr<DeviceIpcApi> AsIpc(
    const std::shared_ptr<DeviceMemoryApi>& api) {
  auto* ipc = dynamic_cast<DeviceIpcApi*>(api.get());
  if (ipc == nullptr) return nullptr;
  return std::shared_ptr<DeviceIpcApi>(api, ipc);
}

}  // namespace cuda
}  // namespace ferry
