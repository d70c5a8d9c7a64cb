// CudaDeviceApi: DeviceMemoryApi over the CUDA runtime (cudaMalloc, cudaFree,
// cudaEventRecord / cudaEventQuery). A StreamHandle is a cudaStream_t (0: the
// device's legacy default stream); an EventHandle is a cudaEvent_t created
// without timing.
//
// Without a driver or a visible device, Create answers FailedPrecondition
// naming the CUDA error, so callers (and tests, which skip) report it cleanly.
// Out of memory is ResourceExhausted naming the device and the size; other
// CUDA errors name the call and CUDA's message. Pinned host memory is
// cudaHostAlloc(portable), so copies on every device may use it; its errors
// name "cuda:host".
//
// IPC (device_ipc.h): cudaIpcGetMemHandle of the allocation's base (found
// with the driver's cuMemGetAddressRange), cudaIpcOpenMemHandle with lazy
// peer access, interprocess events (cudaEventInterprocess). CUDA refuses to
// open a handle in the process that exported it. Compiled, never run here.
//
// Thread safety: every call may be made from any thread; each sets the
// device it needs and restores the thread's current device before it
// returns. Design: docs/design/cuda_allocator.md, docs/design/cuda_rpc.md.
#ifndef FERRY_TENSOR_CUDA_CUDA_DEVICE_API_H_
#define FERRY_TENSOR_CUDA_CUDA_DEVICE_API_H_

#include <memory>
#include <string>

#include "ferry/tensor/cuda/device_api.h"
#include "ferry/tensor/cuda/device_ipc.h"

namespace ferry {
namespace cuda {

/// The CUDA runtime as a DeviceMemoryApi (see the top of the file).
class CudaDeviceApi : public DeviceMemoryApi, public DeviceIpcApi {
 public:
  /// The API over every visible device, or FailedPrecondition naming why
  /// there is none.
  static absl::StatusOr<std::shared_ptr<CudaDeviceApi>> Create();

  std::string name() const override { return "cuda"; }
  int DeviceCount() const override { return devices_; }
  absl::StatusOr<void*> Malloc(int device, size_t nbytes) override;
  absl::Status Free(int device, void* ptr) override;
  absl::StatusOr<EventHandle> RecordEvent(int device,
                                          StreamHandle stream) override;
  absl::StatusOr<bool> EventDone(int device, EventHandle event) override;
  absl::Status DestroyEvent(int device, EventHandle event) override;
  absl::Status MemcpyAsync(int device, void* dst, const void* src,
                           size_t nbytes, StreamHandle stream) override;
  absl::Status SynchronizeStream(int device, StreamHandle stream) override;
  absl::StatusOr<void*> HostAlloc(size_t nbytes) override;
  absl::Status HostFree(void* ptr) override;
  absl::Status WaitEvent(int device, EventHandle event) override;
  absl::StatusOr<StreamHandle> CreateStream(int device) override;
  absl::Status DestroyStream(int device, StreamHandle stream) override;
  absl::Status StreamWaitEvent(int device, StreamHandle stream,
                               EventHandle event) override;

  // IPC (device_ipc.h).
  absl::StatusOr<IpcMemory> ExportMemory(int device, const void* ptr) override;
  absl::StatusOr<IpcMapping> OpenMemory(int device,
                                        absl::string_view handle) override;
  absl::Status CloseMemory(int device, void* base) override;
  absl::StatusOr<EventHandle> CreateIpcEvent(int device) override;
  absl::Status RecordIpcEvent(int device, EventHandle event,
                              StreamHandle stream) override;
  absl::StatusOr<std::string> ExportEvent(int device,
                                          EventHandle event) override;
  absl::StatusOr<EventHandle> OpenEvent(int device,
                                        absl::string_view handle) override;
  // StreamWaitEvent (above) serves both interfaces.
  absl::Status DestroyIpcEvent(int device, EventHandle event) override;

 private:
  explicit CudaDeviceApi(int devices) : devices_(devices) {}
  const int devices_;
};

}  // namespace cuda
}  // namespace ferry

#endif  // FERRY_TENSOR_CUDA_CUDA_DEVICE_API_H_
