// StreamEvent: a small move-only handle on one event recorded on a device
// stream, which the holder can query (never blocks) or wait on. It holds
// no memory: what the work before it uses is kept by the allocators'
// stream-ordered release (RecordStream), which outlasts a dropped event.
//
// Ownership: the handle owns the event and destroys it (through the API,
// which it keeps alive) when destroyed or assigned over. A default-made
// handle holds no event and counts as done.
// Errors: the API's, naming the device and the call.
// Thread safety: one handle is not for concurrent use; distinct handles are
// independent. Design: docs/design/cuda_allocator.md.
#ifndef FERRY_TENSOR_CUDA_EVENT_H_
#define FERRY_TENSOR_CUDA_EVENT_H_

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ferry/tensor/cuda/device_api.h"

namespace ferry {
namespace cuda {

/// An event on a stream (see the top of the file).
class StreamEvent {
 public:
  /// No event: done() at once.
  StreamEvent() = default;
  /// Records an event after the work queued so far on `stream` of `device`.
  static absl::StatusOr<StreamEvent> Record(std::shared_ptr<DeviceMemoryApi> api,
                                            int device, StreamHandle stream);
  ~StreamEvent();
  StreamEvent(StreamEvent&& other) noexcept;             ///< Moves the event.
  StreamEvent& operator=(StreamEvent&& other) noexcept;  ///< Moves the event.
  StreamEvent(const StreamEvent&) = delete;
  StreamEvent& operator=(const StreamEvent&) = delete;

  /// Whether the work before the event has finished (never blocks).
  absl::StatusOr<bool> Query();
  /// Returns once the work before the event has finished.
  absl::Status Wait();
  /// Makes work queued later on `stream` of `device` wait, on the device,
  /// for the work before the event (the host does not wait; nothing for a
  /// handle without an event or one seen done).
  absl::Status MakeStreamWait(int device, StreamHandle stream) const;
  /// The device the event was recorded on (-1 when none).
  int device() const { return device_; }
  /// The API's handle (0 when none).
  EventHandle handle() const { return event_; }

 private:
  void Reset();
  std::shared_ptr<DeviceMemoryApi> api_;
  int device_ = -1;
  EventHandle event_ = 0;
  bool done_ = true;
};

}  // namespace cuda
}  // namespace ferry

#endif  // FERRY_TENSOR_CUDA_EVENT_H_
