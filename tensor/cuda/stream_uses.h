// StreamUses: the streams that used a cached block besides the one it was
// made for, and the events that order its reuse after their work. Shared by
// CachingDeviceAllocator and CachingHostAllocator (pinned_allocator.h): on
// release an event is recorded on each stream used, and the block is reused
// only once every event is done (polled, never waited for on the hot path).
//
// Ownership: the events belong to the object until DestroyEvents; it never
// destroys them itself, so its owner must call DestroyEvents before dropping
// an object that holds events.
// Errors: the API's, naming the device and the call.
// Thread safety: none of its own; the owning allocator's mutex guards it.
// Design: docs/design/cuda_allocator.md.
#ifndef FERRY_TENSOR_CUDA_STREAM_USES_H_
#define FERRY_TENSOR_CUDA_STREAM_USES_H_

#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ferry/tensor/cuda/device_api.h"

namespace ferry {
namespace cuda {

/// Streams that used a block and the events recorded on them (see above).
class StreamUses {
 public:
  /// Notes a use of the block by work queued on `stream` of `device` (once
  /// per stream).
  void Add(int device, StreamHandle stream);
  /// Whether uses were added since the last RecordEvents.
  bool has_uses() const { return !uses_.empty(); }
  /// Records an event on each stream used, which then stop being uses. On
  /// the first failure the events recorded by this call are destroyed, the
  /// uses stay, and the error is returned.
  absl::Status RecordEvents(DeviceMemoryApi& api);
  /// Whether every recorded event is done (queries, never blocks).
  absl::StatusOr<bool> EventsDone(DeviceMemoryApi& api) const;
  /// Returns once every recorded event is done and every stream still
  /// listed as a use has drained (the fallback when an event could not be
  /// recorded): after it the block is free of queued work.
  absl::Status Wait(DeviceMemoryApi& api) const;
  /// Destroys the recorded events (failures are logged).
  void DestroyEvents(DeviceMemoryApi& api);

 private:
  std::vector<std::pair<int, StreamHandle>> uses_;
  std::vector<std::pair<int, EventHandle>> events_;
};

}  // namespace cuda
}  // namespace ferry

#endif  // FERRY_TENSOR_CUDA_STREAM_USES_H_
