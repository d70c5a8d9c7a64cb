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
// Pinned host memory is tracked: IsPinned tells a HostAlloc block from
// pageable memory, pinned_copies counts copies that used one, and HostFree
// of a block a queued copy still uses fails (FailedPrecondition) instead of
// freeing it, so a release ordered too early shows up in a test. WaitEvent
// completes the event's stream, as SynchronizeStream does. StreamWaitEvent
// queues a wait: completing the stream stops there until the awaited
// event's stream has been completed past it (SynchronizeStream and
// WaitEvent then fail with FailedPrecondition, where CUDA would hang).
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
  absl::StatusOr<void*> HostAlloc(size_t nbytes) override;
  absl::Status HostFree(void* ptr) override;
  absl::Status WaitEvent(int device, EventHandle event) override;
  absl::StatusOr<StreamHandle> CreateStream(int device) override;
  absl::Status DestroyStream(int device, StreamHandle stream) override;
  absl::Status StreamWaitEvent(int device, StreamHandle stream,
                               EventHandle event) override;

  /// Runs what is queued on `stream` of `device` so far, in order (copies,
  /// events become done), up to a StreamWaitEvent whose event is not done;
  /// returns whether all of it ran.
  bool CompleteStream(int device, StreamHandle stream);
  /// The next `n` RecordEvent calls fail with Internal.
  void FailRecordEvent(int n);

  /// Bytes now allocated on `device`.
  uint64_t in_use_bytes(int device);
  /// Malloc calls that succeeded, Free calls that succeeded, and events not
  /// yet destroyed, over every device.
  uint64_t mallocs();
  uint64_t frees();   ///< See mallocs().
  uint64_t live_events();  ///< See mallocs().

  /// HostAlloc past `bytes` of live pinned memory is ResourceExhausted
  /// (default: no limit).
  void SetHostCapacity(uint64_t bytes);
  /// Whether `p` lies in a live HostAlloc block.
  bool IsPinned(const void* p);
  /// HostAlloc blocks not yet freed.
  uint64_t live_host_blocks();
  /// HostAlloc and HostFree calls that succeeded.
  uint64_t host_allocs();
  uint64_t host_frees();  ///< See host_allocs().
  /// MemcpyAsync calls whose source or destination was in a pinned block.
  uint64_t pinned_copies();
  /// Streams from CreateStream not yet destroyed.
  uint64_t live_streams();

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
  // One item queued on a stream: a copy (nbytes, dst, src), an event
  // (seq > 0: done once run), or a wait for (wait_on, seq).
  struct Op {
    void* dst = nullptr;
    const void* src = nullptr;
    size_t nbytes = 0;
    uint64_t seq = 0;
    bool wait = false;
    std::pair<int, StreamHandle> wait_on;
  };
  std::map<std::pair<int, StreamHandle>, std::vector<Op>> queues_
      ABSL_GUARDED_BY(mu_);
  // Runs the queue of `where` (see CompleteStream).
  bool RunQueue(std::pair<int, StreamHandle> where)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  EventHandle next_event_ ABSL_GUARDED_BY(mu_) = 1;
  int fail_events_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t mallocs_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t frees_ ABSL_GUARDED_BY(mu_) = 0;
  // Whether `p` is in a live pinned block.
  bool InHostBlock(const void* p) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  std::map<const char*, size_t> host_blocks_ ABSL_GUARDED_BY(mu_);
  uint64_t host_capacity_ ABSL_GUARDED_BY(mu_) = UINT64_MAX;
  uint64_t host_in_use_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t host_allocs_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t host_frees_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t pinned_copies_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::pair<int, StreamHandle>, bool> streams_ ABSL_GUARDED_BY(mu_);
  // Created streams get handles from here up, apart from hand-picked ones.
  StreamHandle next_stream_ ABSL_GUARDED_BY(mu_) = StreamHandle{1} << 32;
};

}  // namespace cuda
}  // namespace ferry

#endif  // FERRY_TENSOR_CUDA_FAKE_DEVICE_API_H_
