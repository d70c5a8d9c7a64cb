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
// IPC (device_ipc.h): fakes built on one FakeHost pose as processes of one
// machine and open each other's handles (the same host memory); a handle
// from another FakeHost, or any IPC call of a fake without one, fails as a
// handle from another host or container would. A stream that waits on a
// peer's event completes the peer's stream first when it completes.
// CompleteStreamAndWaits also completes the streams of this fake that a
// stream waits on, as a device would on its own.
//
// Thread safety: every call is safe from any thread (one annotated mutex
// per fake, and the FakeHost's, always taken before a fake's).
// Design: docs/design/cuda_allocator.md, docs/design/cuda_rpc.md.
#ifndef FERRY_TENSOR_CUDA_FAKE_DEVICE_API_H_
#define FERRY_TENSOR_CUDA_FAKE_DEVICE_API_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "ferry/tensor/cuda/device_api.h"
#include "ferry/tensor/cuda/device_ipc.h"

namespace ferry {
namespace cuda {

class FakeDeviceApi;

/// One machine shared by the FakeDeviceApis that pose as its processes:
/// what one exports, the others open (see the top of the file).
class FakeHost {
 public:
  /// A host called `name` (in errors).
  explicit FakeHost(std::string name);
  /// Its name.
  const std::string& name() const { return name_; }

 private:
  friend class FakeDeviceApi;
  struct Memory {
    FakeDeviceApi* owner;
    int device;
    void* base;
    uint64_t bytes;
  };
  struct SharedEvent {
    FakeDeviceApi* owner;
    int device;
    EventHandle event;
  };
  const std::string name_;
  const uint64_t nonce_;  // In every handle: another host's never matches.
  absl::Mutex mu_;
  std::map<uint64_t, Memory> memory_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, SharedEvent> events_ ABSL_GUARDED_BY(mu_);
  uint64_t next_ ABSL_GUARDED_BY(mu_) = 1;
};

/// Host-memory devices with hand-driven streams (see the top of the file).
class FakeDeviceApi : public DeviceMemoryApi, public DeviceIpcApi {
 public:
  /// `devices` devices of `capacity_bytes` each; IPC calls fail.
  FakeDeviceApi(int devices, uint64_t capacity_bytes);
  /// The same on `host` (not null), whose other fakes it shares IPC with.
  FakeDeviceApi(int devices, uint64_t capacity_bytes,
                std::shared_ptr<FakeHost> host);
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
  absl::Status DestroyIpcEvent(int device, EventHandle event) override;

  /// Runs what is queued on `stream` of `device` so far, in order (copies,
  /// events become done), up to a StreamWaitEvent whose event is not done;
  /// returns whether all of it ran. A wait on a peer's event (OpenEvent)
  /// completes the peer's stream first.
  bool CompleteStream(int device, StreamHandle stream);
  /// CompleteStream, and where `stream` waits for an event of another
  /// stream of this fake, that stream is completed first, the same way:
  /// what a device does by itself (host_ops.h runs a kernel after it).
  /// False when a wait cannot be met (the streams wait on each other).
  bool CompleteStreamAndWaits(int device, StreamHandle stream);
  /// The next `n` RecordEvent calls fail with Internal.
  void FailRecordEvent(int n);

  /// Bytes now allocated on `device`.
  uint64_t in_use_bytes(int device);
  /// Malloc calls that succeeded, Free calls that succeeded, and events not
  /// yet destroyed, over every device.
  uint64_t mallocs();
  uint64_t frees();   ///< See mallocs().
  uint64_t live_events();  ///< See mallocs().
  /// OpenMemory calls that succeeded, and mappings not yet closed.
  uint64_t ipc_opens();
  uint64_t open_mappings();  ///< See ipc_opens().
  /// CreateIpcEvent and OpenEvent calls that succeeded.
  uint64_t ipc_events_created();
  uint64_t ipc_event_opens();  ///< See ipc_events_created().

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
  /// SynchronizeStream and WaitEvent calls: how often the host waited.
  uint64_t host_waits();

 private:
  absl::Status NoHost(int device, absl::string_view call) const;
  absl::StatusOr<uint64_t> HandleId(int device, absl::string_view handle,
                                    char kind, absl::string_view call) const;
  absl::Status FreeLocked(int device, void* ptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // CompleteStreamAndWaits, with the streams being completed further up.
  bool CompleteWithWaits(std::pair<int, StreamHandle> where,
                         std::vector<std::pair<int, StreamHandle>>& up);
  // Completes the stream `event` was recorded on (a peer waits on it).
  void CompleteEventStream(EventHandle event);
  // Forgets what this fake exported at `base` (all when null).
  void UnexportLocked(void* base) ABSL_EXCLUSIVE_LOCKS_REQUIRED(host_->mu_);

  struct Event {
    int device;
    StreamHandle stream;
    uint64_t seq;  // Done once the stream's completed count reaches it.
  };
  const int devices_;
  const uint64_t capacity_;
  const std::shared_ptr<FakeHost> host_;  // Null: IPC calls fail.
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
  uint64_t host_waits_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::pair<int, StreamHandle>, bool> streams_ ABSL_GUARDED_BY(mu_);
  // Created streams get handles from here up, apart from hand-picked ones.
  StreamHandle next_stream_ ABSL_GUARDED_BY(mu_) = StreamHandle{1} << 32;
  // Events a peer's event handle was opened as: local handle -> the
  // host's id of the exported event.
  std::map<EventHandle, uint64_t> imported_ ABSL_GUARDED_BY(mu_);
  // Per stream: the host ids of peer events its completion waits for.
  std::map<std::pair<int, StreamHandle>, std::vector<uint64_t>> waits_
      ABSL_GUARDED_BY(mu_);
  std::map<void*, uint64_t> mappings_ ABSL_GUARDED_BY(mu_);  // Open counts.
  uint64_t ipc_opens_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t ipc_events_created_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t ipc_event_opens_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace cuda
}  // namespace ferry

#endif  // FERRY_TENSOR_CUDA_FAKE_DEVICE_API_H_
