// DeviceIpc: the CUDA IPC path of the device stage (issue #32) for requests
// to a peer on this host whose plan path is "ipc". The sender exports each
// CUDA tensor's allocation (tensor/cuda/device_ipc.h), records an
// interprocess event after the work queued on the tensor's device, and sends
// a handle (worker/device_header.h's IpcTensor) with an empty CPU tensor of
// its dtype in the payload; it holds the tensor until the reply says the
// copy ended (the reply's header acknowledges the request: rpc/ gives a
// caller's reply interceptor no request id), the call's deadline passes, or
// the peer fails. Events come from a bounded pool per device, exported
// once: an acknowledged request's events go back to it, those of a hold
// released by deadline or peer failure are destroyed (the peer may still
// wait on them). The receiver opens the
// handle (cached per peer, device and allocation, so a hot path opens
// none) and the event (cached likewise, bounded, least recently used
// closed first), makes its stream wait on the event, copies device to device into
// its caching allocator, and waits for the copies before the handler runs:
// the reply proves the copy ended. Replies stay staged (see the design note).
//
// IPC is used only when the worker's DeviceMemoryApi is also a DeviceIpcApi
// and an interprocess event can be created (probed once at InitWorker);
// otherwise the pair stays staged and the inspector says why.
//
// Errors: a handle that cannot be opened fails the call naming the worker,
// the peer and the device, after the receiver released what it allocated;
// a shape or offset outside the opened allocation is InvalidArgument.
// Thread safety: every method is safe from any thread (one annotated mutex;
// handles are opened under it, copies run outside it). Ownership: the stage
// owns it; interceptors and listeners hold it weakly.
// Design: docs/design/cuda_rpc.md ("The IPC path").
#ifndef FERRY_WORKER_DEVICE_IPC_H_
#define FERRY_WORKER_DEVICE_IPC_H_

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ferry/common/ids.h"
#include "ferry/common/sync.h"
#include "ferry/rpc/agent.h"
#include "ferry/rpc/inspect.h"
#include "ferry/tensor/cuda/caching_allocator.h"
#include "ferry/tensor/cuda/device_ipc.h"
#include "ferry/tensor/tensor.h"
#include "ferry/worker/device_header.h"

namespace ferry {

/// Counters of the IPC traffic with one peer (monotonic but `held`).
struct IpcTraffic {
  uint64_t tensors_out = 0;     ///< CUDA tensors sent to it as handles.
  uint64_t bytes_out = 0;       ///< Their bytes.
  uint64_t tensors_in = 0;      ///< Its handles copied onto a device here.
  uint64_t bytes_in = 0;        ///< Their bytes.
  uint64_t handles_opened = 0;  ///< Its memory handles opened here.
  uint64_t handle_reuses = 0;   ///< Received tensors served by a cached one.
  uint64_t held_calls = 0;      ///< Requests to it whose tensors are held now.
  uint64_t events_created = 0;  ///< Interprocess events made for requests to it.
  uint64_t events_reused = 0;   ///< Its requests' events taken from the pool.
  uint64_t events_opened = 0;   ///< Its event handles opened here.
  uint64_t event_open_reuses = 0;  ///< Its events served by a cached one.
};

/// A pooled interprocess event of this worker and its exported handle.
struct IpcExportedEvent {
  int device = 0;               ///< This worker's device it belongs to.
  cuda::EventHandle event = 0;  ///< The event.
  std::string handle;           ///< Its handle, exported once.
};

/// A peer's event opened here (closed when the last user lets go).
struct IpcOpenedEvent;

class DeviceIpc;

/// One outgoing request's IPC tensors (DeviceIpc::Begin).
class IpcOutgoing {
 public:
  /// Exports contiguous CUDA tensor `t` (with bytes) into `placement` and
  /// `header`; returns the empty CPU tensor the payload carries instead.
  absl::StatusOr<Tensor> Add(const Tensor& t, DevicePlacement& placement,
                             DeviceHeader& header);
  /// Whether Add exported anything.
  bool empty() const { return tensors_.empty(); }
  /// Holds the tensors until the reply to `id`, `deadline`, or the peer's
  /// failure.
  void Commit(GlobalId id, absl::Time deadline);
  /// Without Commit, releases the events (the request was not sent).
  ~IpcOutgoing();
  IpcOutgoing(const IpcOutgoing&) = delete;             ///< Not copyable.
  IpcOutgoing& operator=(const IpcOutgoing&) = delete;  ///< Not copyable.

 private:
  friend class DeviceIpc;
  IpcOutgoing(std::shared_ptr<DeviceIpc> ipc, std::string peer)
      : ipc_(std::move(ipc)), peer_(std::move(peer)) {}
  std::shared_ptr<DeviceIpc> ipc_;
  std::string peer_;
  std::map<int, uint32_t> event_index_;  // Device -> index in the header.
  std::vector<IpcExportedEvent> events_;
  std::vector<Tensor> tensors_;
  uint64_t bytes_ = 0;
  IpcTraffic counted_;  // Events created and reused.
};

/// One incoming request's IPC tensors (DeviceIpc::Receive).
class IpcIncoming {
 public:
  /// Copies placement `p` (placeholder `placeholder` in the payload) onto
  /// this worker's `target` device; `what` and `tensor` start the errors.
  absl::StatusOr<Tensor> Land(const DevicePlacement& p,
                              const Tensor& placeholder, int target,
                              const std::string& what,
                              const std::string& tensor);
  /// Waits for every copy Land queued (before the handler may run).
  absl::Status Finish();
  /// Waits for copies a failed message queued, releases the opened events
  /// and counts what landed.
  ~IpcIncoming();
  IpcIncoming(const IpcIncoming&) = delete;             ///< Not copyable.
  IpcIncoming& operator=(const IpcIncoming&) = delete;  ///< Not copyable.

 private:
  friend class DeviceIpc;
  IpcIncoming(std::shared_ptr<DeviceIpc> ipc, std::string peer,
              std::vector<std::string> events)
      : ipc_(std::move(ipc)),
        peer_(std::move(peer)),
        events_(std::move(events)) {}
  std::shared_ptr<DeviceIpc> ipc_;
  std::string peer_;
  std::vector<std::string> events_;
  // (target, event index) -> the opened event its copies wait on.
  std::map<std::pair<int, uint32_t>, std::shared_ptr<const IpcOpenedEvent>>
      opened_;
  std::set<int> targets_;
  std::vector<std::shared_ptr<const void>> in_use_;  // Mappings copied from.
  IpcTraffic counted_;
  bool finished_ = false;
};

/// The IPC path of one worker (see the top of the file).
class DeviceIpc : public std::enable_shared_from_this<DeviceIpc> {
 public:
  /// Most peer allocations kept open; the least recently used is closed.
  static constexpr size_t kMaxMappings = 256;
  /// Most idle exported events pooled per device; more are destroyed.
  static constexpr size_t kMaxPooledEvents = 64;
  /// Most peer events kept open; the least recently used is closed.
  static constexpr size_t kMaxOpenedEvents = 256;

  /// The path of worker `me` over `api` (its allocator `allocator`), or
  /// null when `api` is no DeviceIpcApi.
  static std::shared_ptr<DeviceIpc> Create(
      std::string me, const std::shared_ptr<cuda::DeviceMemoryApi>& api,
      cuda::CachingDeviceAllocator* allocator);
  /// Closes every mapping and releases every held tensor.
  ~DeviceIpc();

  /// Carries requests to `peers` (their plan says "ipc") once an
  /// interprocess event can be made on `probe_device`; otherwise carries
  /// none and remembers why (returned; OK when carried).
  absl::Status UsePeers(const std::vector<std::string>& peers,
                        int probe_device);
  /// An outgoing request's exporter, or null when `peer` is not carried.
  std::unique_ptr<IpcOutgoing> Begin(const std::string& peer);
  /// An incoming request's lander (`events`: its header's).
  std::unique_ptr<IpcIncoming> Receive(const std::string& peer,
                                       std::vector<std::string> events);

  /// Caller: `peer` acknowledged request `id`; releases its tensors.
  void Replied(const std::string& peer, GlobalId id);
  /// `peer` is down: releases the tensors of every request to it, and
  /// closes the mappings of its memory (each once no landing uses it).
  void PeerFailed(const std::string& peer);
  /// Callee: request `id` of `peer` landed by IPC; its reply (before
  /// `deadline`) acknowledges it. At most kMaxPendingAcks are remembered.
  void ExpectReply(const std::string& peer, GlobalId id, absl::Time deadline);
  /// Callee: whether the reply to `peer`'s request `id` acknowledges it
  /// (once).
  bool TakeReply(const std::string& peer, GlobalId id);
  /// Most requests remembered for an acknowledgement.
  static constexpr size_t kMaxPendingAcks = 65536;

  /// Whether requests to `peer` travel by IPC.
  bool Carries(const std::string& peer) const;
  /// Why IPC carries nothing ("" when it may).
  std::string unavailable() const;
  /// The counters of `peer` (releases expired holds first).
  IpcTraffic Traffic(const std::string& peer);
  /// Requests whose tensors are held now, over every peer.
  size_t held_calls();
  /// Rows for the Admin inspector "devices": one "ipc" row per peer.
  std::vector<rpc::InspectionRow> Inspect();

 private:
  friend class IpcOutgoing;
  friend class IpcIncoming;
  struct Mapping;
  struct Held {
    std::string peer;
    absl::Time deadline;
    std::vector<Tensor> tensors;
    std::vector<IpcExportedEvent> events;
  };
  DeviceIpc(std::string me, std::shared_ptr<cuda::DeviceIpcApi> ipc,
            std::shared_ptr<cuda::DeviceMemoryApi> api,
            cuda::CachingDeviceAllocator* allocator)
      : me_(std::move(me)),
        ipc_(std::move(ipc)),
        api_(std::move(api)),
        allocator_(allocator) {}
  // The mapping of `handle` from `peer` on `device`, opened when new.
  absl::StatusOr<std::shared_ptr<const Mapping>> Open(
      const std::string& peer, int device, const std::string& handle,
      IpcTraffic& counted);
  // Peer `peer`'s event `handle` opened on `device`, cached.
  absl::StatusOr<std::shared_ptr<const IpcOpenedEvent>> OpenEvent(
      const std::string& peer, int device, const std::string& handle,
      IpcTraffic& counted);
  // A pooled event of `device`, else a new one, exported.
  absl::StatusOr<IpcExportedEvent> TakeEvent(int device, IpcTraffic& counted);
  // Pools acknowledged requests' `events` (destroys what the pool is full
  // for).
  void ReturnEvents(std::vector<IpcExportedEvent> events);
  void Count(const std::string& peer, const IpcTraffic& delta);
  void Hold(GlobalId id, Held held);
  void DestroyEvents(const std::vector<IpcExportedEvent>& events);
  // Moves the holds whose deadline passed into `out`.
  void TakeExpired(std::vector<Held>& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseExpired();

  const std::string me_;
  const std::shared_ptr<cuda::DeviceIpcApi> ipc_;
  const std::shared_ptr<cuda::DeviceMemoryApi> api_;
  cuda::CachingDeviceAllocator* const allocator_;  // Owned by the stage.
  mutable Mutex mu_;
  std::set<std::string> peers_ ABSL_GUARDED_BY(mu_);
  std::string unavailable_ ABSL_GUARDED_BY(mu_) = "no peer's plan says ipc";
  // (peer, device, handle) -> the open allocation, and its last use.
  std::map<std::tuple<std::string, int, std::string>,
           std::pair<std::shared_ptr<const Mapping>, uint64_t>>
      mappings_ ABSL_GUARDED_BY(mu_);
  uint64_t uses_ ABSL_GUARDED_BY(mu_) = 0;
  // (peer, device, handle) -> the opened event, and its last use.
  std::map<std::tuple<std::string, int, std::string>,
           std::pair<std::shared_ptr<const IpcOpenedEvent>, uint64_t>>
      opened_events_ ABSL_GUARDED_BY(mu_);
  // Device -> its idle exported events (at most kMaxPooledEvents).
  std::map<int, std::vector<IpcExportedEvent>> free_events_
      ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, Held> held_ ABSL_GUARDED_BY(mu_);  // By request id.
  // Callee: (peer, request id) -> deadline, of requests to acknowledge.
  std::map<std::pair<std::string, uint64_t>, absl::Time> acks_
      ABSL_GUARDED_BY(mu_);
  // No hold (ack) expires before this: sweeps are skipped until then.
  absl::Time next_expiry_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  absl::Time next_ack_expiry_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  std::map<std::string, IpcTraffic> traffic_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ferry

#endif  // FERRY_WORKER_DEVICE_IPC_H_
