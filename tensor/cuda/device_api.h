// DeviceMemoryApi: the few device calls a caching allocator needs (allocate,
// free, and events that say when the work queued on a stream has finished).
// CudaDeviceApi (cuda_device_api.h) implements it with the CUDA runtime;
// FakeDeviceApi (fake_device_api.h) with host memory and streams that a test
// advances by hand, so the allocator's bookkeeping is tested without a GPU.
// Both pass one conformance suite (device_api_conformance.h).
//
// Streams and events are small opaque handles: a StreamHandle is the
// implementation's stream (a cudaStream_t for CUDA; 0 is the device's
// default stream), an EventHandle is owned by whoever recorded it until
// DestroyEvent.
//
// Errors: a device index out of range is InvalidArgument naming it and the
// number of devices; out of memory is ResourceExhausted naming the device and
// the size; other failures name the call. Never aborts on a failed call.
//
// Thread safety: implementations are safe to call from any thread.
// Design: docs/design/cuda_allocator.md.
#ifndef FERRY_TENSOR_CUDA_DEVICE_API_H_
#define FERRY_TENSOR_CUDA_DEVICE_API_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ferry {
namespace cuda {

/// A stream of one device: work on it runs in the order it was queued.
using StreamHandle = uintptr_t;
/// A marker recorded on a stream; done once the work queued before it is.
using EventHandle = uintptr_t;

/// The device calls a caching allocator makes (see the top of the file).
class DeviceMemoryApi {
 public:
  virtual ~DeviceMemoryApi() = default;
  /// "cuda" or "fake": for messages.
  virtual std::string name() const = 0;
  /// Number of devices; indices are 0..DeviceCount()-1.
  virtual int DeviceCount() const = 0;
  /// `nbytes` (> 0) uninitialized bytes on `device`, aligned to at least 256.
  virtual absl::StatusOr<void*> Malloc(int device, size_t nbytes) = 0;
  /// Returns memory from Malloc on the same device. The device may still be
  /// using it: the caller orders the release (CUDA's cudaFree waits).
  virtual absl::Status Free(int device, void* ptr) = 0;
  /// Records an event after the work queued so far on `stream`.
  virtual absl::StatusOr<EventHandle> RecordEvent(int device,
                                                  StreamHandle stream) = 0;
  /// Whether the work before `event` has finished (never blocks).
  virtual absl::StatusOr<bool> EventDone(int device, EventHandle event) = 0;
  /// Releases `event` (done or not).
  virtual absl::Status DestroyEvent(int device, EventHandle event) = 0;
  /// Queues a copy of `nbytes` from `src` to `dst` on `stream`; either side
  /// may be host or device memory of `device`. Both must stay valid until
  /// the stream has run it.
  virtual absl::Status MemcpyAsync(int device, void* dst, const void* src,
                                   size_t nbytes, StreamHandle stream) = 0;
  /// Returns once the work queued on `stream` so far has finished.
  virtual absl::Status SynchronizeStream(int device, StreamHandle stream) = 0;

  // Pinned host memory (and the stream and event calls its asynchronous
  // copies need: copy.h, pinned_allocator.h).
  /// `nbytes` (> 0) page-locked host bytes, aligned to at least 256, that
  /// copies queued on any device's streams may read or write without the
  /// driver staging them (cudaHostAlloc, portable). Out of memory is
  /// ResourceExhausted naming the size.
  virtual absl::StatusOr<void*> HostAlloc(size_t nbytes) = 0;
  /// Returns memory from HostAlloc. Copies queued on it must have run: the
  /// caller orders the release, as for Free.
  virtual absl::Status HostFree(void* ptr) = 0;
  /// Returns once the work queued before `event` (recorded on `device` by
  /// RecordEvent) has finished; the event stays valid.
  virtual absl::Status WaitEvent(int device, EventHandle event) = 0;
  /// A new stream of `device` that does not wait for the default stream;
  /// the caller releases it with DestroyStream.
  virtual absl::StatusOr<StreamHandle> CreateStream(int device) = 0;
  /// Releases `stream` from CreateStream (its queued work still runs).
  virtual absl::Status DestroyStream(int device, StreamHandle stream) = 0;
  /// Work queued on `stream` of `device` after this call waits, on the
  /// device, for the work before `event` (recorded on any device); the host
  /// does not wait.
  virtual absl::Status StreamWaitEvent(int device, StreamHandle stream,
                                       EventHandle event) = 0;
};

/// OK if 0 <= device < api.DeviceCount(); else InvalidArgument naming both.
absl::Status CheckDevice(const DeviceMemoryApi& api, int device);

}  // namespace cuda
}  // namespace ferry

#endif  // FERRY_TENSOR_CUDA_DEVICE_API_H_
