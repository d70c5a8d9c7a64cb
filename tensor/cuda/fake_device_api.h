// FakeDeviceApi: a DeviceMemoryApi over host memory for tests of what sits
// on a device API (the caching allocator) on machines without a GPU.
//
// Each device has a capacity: Malloc past it is ResourceExhausted, as a full
// GPU would answer. Streams do no work on their own: copies queued on a
// stream run, in order, and events recorded on it become done only when the
// test calls CompleteStream for that stream (or code under test calls
// SynchronizeStream), so a test decides when a stream's work ends, and a
// reader that forgot to wait for a copy sees the old bytes.
// FailRecordEvent makes the next RecordEvent calls fail, for error paths.
//
// Thread safety: every call is safe from any thread (one annotated mutex).
// Design: docs/design/cuda_allocator.md.
#ifndef FERRY_TENSOR_CUDA_FAKE_DEVICE_API_H_
#define FERRY_TENSOR_CUDA_FAKE_DEVICE_API_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "ferry/tensor/cuda/device_api.h"

namespace ferry {
namespace cuda {

/// Host-memory devices with hand-driven streams (see the top of the file).
class FakeDeviceApi : public DeviceMemoryApi {
 public:
  /// `devices` devices of `capacity_bytes` each.
  FakeDeviceApi(int devices, uint64_t capacity_bytes);
  ~FakeDeviceApi() override;

  std::string name() const override { return "fake"; }
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

  /// Runs everything queued on `stream` of `device` so far (its copies, in
  /// order) and marks its events done.
  void CompleteStream(int device, StreamHandle stream);
  /// The next `n` RecordEvent calls fail with Internal.
  void FailRecordEvent(int n);

  /// Bytes now allocated on `device`.
  uint64_t in_use_bytes(int device);
  /// Malloc calls that succeeded, Free calls that succeeded, and events not
  /// yet destroyed, over every device.
  uint64_t mallocs();
  uint64_t frees();   ///< See mallocs().
  uint64_t live_events();  ///< See mallocs().

 private:
  struct Event {
    int device;
    StreamHandle stream;
    uint64_t seq;  // Done once the stream's completed count reaches it.
  };
  const int devices_;
  const uint64_t capacity_;
  absl::Mutex mu_;
  std::map<void*, std::pair<int, size_t>> blocks_ ABSL_GUARDED_BY(mu_);
  std::map<int, uint64_t> in_use_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<int, StreamHandle>, uint64_t> recorded_
      ABSL_GUARDED_BY(mu_);
  std::map<std::pair<int, StreamHandle>, uint64_t> completed_
      ABSL_GUARDED_BY(mu_);
  std::map<EventHandle, Event> events_ ABSL_GUARDED_BY(mu_);
  struct Copy {
    void* dst;
    const void* src;
    size_t nbytes;
  };
  std::map<std::pair<int, StreamHandle>, std::vector<Copy>> copies_
      ABSL_GUARDED_BY(mu_);
  EventHandle next_event_ ABSL_GUARDED_BY(mu_) = 1;
  int fail_events_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t mallocs_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t frees_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace cuda
}  // namespace ferry

#endif  // FERRY_TENSOR_CUDA_FAKE_DEVICE_API_H_
