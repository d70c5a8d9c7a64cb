// DeviceIpcApi: the calls that let another process on the same host read a
// device allocation in place (CUDA IPC): export a memory handle, open a
// peer's handle, and interprocess events that order the reader's stream
// after the writer's work. A DeviceMemoryApi that supports it also derives
// from DeviceIpcApi (AsIpc finds it); CudaDeviceApi implements it with
// cudaIpcGetMemHandle / cudaIpcOpenMemHandle / interprocess events,
// FakeDeviceApi over a FakeHost shared by the fakes posing as one machine.
//
// Handles are kIpcHandleBytes opaque bytes. ExportMemory names the whole
// allocation that holds a pointer plus the pointer's offset in it; OpenMemory
// maps that allocation here and answers its base and size, until
// CloseMemory. Events from CreateIpcEvent or OpenEvent are released with
// DestroyIpcEvent (never DeviceMemoryApi::DestroyEvent).
//
// Errors: a handle that cannot be opened here (another host or container,
// a freed allocation, malformed bytes) is FailedPrecondition or
// InvalidArgument naming the device and the call; never aborts.
// Thread safety: implementations are safe to call from any thread.
// Design: docs/design/cuda_rpc.md ("The IPC path").
#ifndef FERRY_TENSOR_CUDA_DEVICE_IPC_H_
#define FERRY_TENSOR_CUDA_DEVICE_IPC_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ferry/tensor/cuda/device_api.h"

namespace ferry {
namespace cuda {

/// Bytes of a memory or event handle (CUDA's cudaIpc*Handle_t).
inline constexpr size_t kIpcHandleBytes = 64;

/// An exported allocation: what a peer needs to open it.
struct IpcMemory {
  std::string handle;             ///< kIpcHandleBytes bytes.
  uint64_t offset = 0;            ///< The exported pointer's offset in it.
  uint64_t allocation_bytes = 0;  ///< The allocation's size.
};

/// A peer's allocation opened here.
struct IpcMapping {
  void* base = nullptr;  ///< Its first byte in this process.
  uint64_t bytes = 0;    ///< Its size, as this process sees it.
};

/// Interprocess memory and events (see the top of the file).
class DeviceIpcApi {
 public:
  virtual ~DeviceIpcApi() = default;
  /// The handle of the allocation on `device` that holds `ptr`.
  virtual absl::StatusOr<IpcMemory> ExportMemory(int device,
                                                 const void* ptr) = 0;
  /// Maps the allocation `handle` names (exported by another process on
  /// this host) for `device`; FailedPrecondition when it cannot be.
  virtual absl::StatusOr<IpcMapping> OpenMemory(int device,
                                                absl::string_view handle) = 0;
  /// Unmaps a base OpenMemory returned.
  virtual absl::Status CloseMemory(int device, void* base) = 0;
  /// A new event another process can open (not yet recorded).
  virtual absl::StatusOr<EventHandle> CreateIpcEvent(int device) = 0;
  /// Records `event` (from CreateIpcEvent) after the work on `stream`.
  virtual absl::Status RecordIpcEvent(int device, EventHandle event,
                                      StreamHandle stream) = 0;
  /// The handle of `event` (from CreateIpcEvent).
  virtual absl::StatusOr<std::string> ExportEvent(int device,
                                                  EventHandle event) = 0;
  /// Opens a peer's exported event here.
  virtual absl::StatusOr<EventHandle> OpenEvent(int device,
                                                absl::string_view handle) = 0;
  /// Work queued later on `stream` runs after `event`'s recorded work (an
  /// event of this process or one from OpenEvent). The same call as
  /// DeviceMemoryApi::StreamWaitEvent: a class implementing both interfaces
  /// defines it once.
  virtual absl::Status StreamWaitEvent(int device, StreamHandle stream,
                                       EventHandle event) = 0;
  /// Releases an event from CreateIpcEvent or OpenEvent.
  virtual absl::Status DestroyIpcEvent(int device, EventHandle event) = 0;
};

/// `api` as a DeviceIpcApi sharing its ownership, or null when it has none.
std::shared_ptr<DeviceIpcApi> AsIpc(const std::shared_ptr<DeviceMemoryApi>& api);

}  // namespace cuda
}  // namespace ferry

#endif  // FERRY_TENSOR_CUDA_DEVICE_IPC_H_
