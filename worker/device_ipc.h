// DeviceIpc: the CUDA IPC path of the device stage (issue #32) between
// workers on one host. The sender exports each CUDA tensor's allocation
// (tensor/cuda/device_ipc.h), records a pooled interprocess event after the
// work queued on its device, and sends a handle (worker/device_header.h's
// IpcTensor) with an empty CPU tensor of its dtype in the payload. It holds
// the tensor until the peer acknowledges the copy (a request: in its reply's
// header; a reply: on the caller's next request or in a DEVICE_IPC_ACK after
// kAckDelay), the deadline (a reply's plus kReplyHoldGrace) passes, or the
// peer fails; acknowledged events go back to the pool, others are destroyed.
// The receiver opens the handle and the event (each cached per peer, LRU
// bounded), makes its stream wait on the event, copies device to device into
// its caching allocator and waits for the copies before the handler (or the
// caller's future) sees the message. Replies go by IPC when the request
// asked (`ipc_replies`); past the hold limit they are staged.
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
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <thread>
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
  /// Of tensors_out, those in replies; of tensors_in, those in its replies.
  uint64_t reply_tensors_out = 0;
  uint64_t reply_tensors_in = 0;  ///< See reply_tensors_out.
  /// Of reply_tensors_out, those exported as a snapshot (the tensor was
  /// held elsewhere here too, so it may be written after the reply left).
  uint64_t reply_snapshots = 0;
  uint64_t held_replies = 0;  ///< Replies to it whose tensors are held now.
  /// Replies to it staged because its reply hold limit was reached.
  uint64_t replies_over_limit = 0;
  uint64_t acks_piggybacked = 0;  ///< Reply acks sent on its requests.
  uint64_t ack_messages = 0;      ///< DEVICE_IPC_ACK messages sent to it.
  uint64_t acks_in_messages = 0;  ///< Reply acks those messages carried.
  uint64_t events_created = 0;  ///< Interprocess events made for requests to it.
  uint64_t events_reused = 0;   ///< Its requests' events taken from the pool.
  uint64_t events_opened = 0;   ///< Its event handles opened here.
  uint64_t event_open_reuses = 0;  ///< Its events served by a cached one.
};

/// A pooled interprocess event of this worker and its exported handle.
struct IpcExportedEvent {
  int device = 0;               ///< Its device.
  cuda::EventHandle event = 0;  ///< The event.
  std::string handle;           ///< Its exported handle.
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
  /// A copy of contiguous CUDA tensor `t` from `allocator`, queued on
  /// `stream` of its device (counted as a reply snapshot).
  absl::StatusOr<Tensor> Snapshot(const Tensor& t,
                                  cuda::CachingDeviceAllocator& allocator,
                                  cuda::StreamHandle stream);
  /// Whether Add exported anything.
  bool empty() const { return tensors_.empty(); }
  /// Holds the tensors until the acknowledgement of `id` (a request's: its
  /// reply; a reply's, named by its request's id: the caller's reply_acks),
  /// `deadline`, or the peer's failure.
  void Commit(GlobalId id, absl::Time deadline);
  /// Without Commit, releases the events (the request was not sent).
  ~IpcOutgoing();
  IpcOutgoing(const IpcOutgoing&) = delete;             ///< Not copyable.
  IpcOutgoing& operator=(const IpcOutgoing&) = delete;  ///< Not copyable.

 private:
  friend class DeviceIpc;
  IpcOutgoing(std::shared_ptr<DeviceIpc> ipc, std::string peer, bool reply)
      : ipc_(std::move(ipc)), peer_(std::move(peer)), reply_(reply) {}
  std::shared_ptr<DeviceIpc> ipc_;
  std::string peer_;
  bool reply_;
  std::map<int, uint32_t> event_index_;  // Device -> index in the header.
  std::vector<IpcExportedEvent> events_;
  std::vector<Tensor> tensors_;
  uint64_t bytes_ = 0;
  uint64_t snapshots_ = 0;
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
              std::vector<std::string> events, std::optional<GlobalId> reply)
      : ipc_(std::move(ipc)),
        peer_(std::move(peer)),
        events_(std::move(events)),
        reply_(reply) {}
  std::shared_ptr<DeviceIpc> ipc_;
  std::string peer_;
  std::vector<std::string> events_;
  // A reply's request id: acknowledged once its copies ended (destructor).
  std::optional<GlobalId> reply_;
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
  /// interprocess event can be made on `probe_device` (probed also without
  /// peers: replies may go by IPC); otherwise carries none and remembers
  /// why (returned; OK when usable).
  absl::Status UsePeers(const std::vector<std::string>& peers,
                        int probe_device);
  /// An outgoing request's exporter, or null when `peer` is not carried.
  std::unique_ptr<IpcOutgoing> Begin(const std::string& peer);
  /// An outgoing reply's exporter (the request said `ipc_replies`), or null
  /// when IPC is unusable or the reply hold limit is reached for `peer`
  /// (then the reply is staged; counted).
  std::unique_ptr<IpcOutgoing> BeginReply(const std::string& peer);
  /// Callee: `peer` said it can open this worker's handles (a request's
  /// `ipc_replies`), so the gradients this worker returns to it may go by
  /// IPC (BeginReturning). Remembered for at most kMaxPeers peers.
  void AcceptsReturning(const std::string& peer);
  /// An outgoing returning request's exporter (gradients going back along
  /// `peer`'s forward request, held until its reply acknowledges them), or
  /// null when IPC is unusable or `peer` never said it can open handles.
  std::unique_ptr<IpcOutgoing> BeginReturning(const std::string& peer);
  /// An incoming message's lander (`events`: its header's; `reply`: a
  /// reply's request id, acknowledged to the peer once its copies ended).
  std::unique_ptr<IpcIncoming> Receive(
      const std::string& peer, std::vector<std::string> events,
      std::optional<GlobalId> reply = std::nullopt);

  /// Caller: `peer` acknowledged request `id`; releases its tensors.
  void Replied(const std::string& peer, GlobalId id);
  /// Callee: `peer` acknowledged the replies to its requests `ids`;
  /// releases their tensors (ids it holds nothing for are ignored).
  void RepliesAcked(const std::string& peer, const std::vector<uint64_t>& ids);
  /// Caller: the reply to request `id` from `peer` was landed (or failed
  /// after its copies ended, or before any began): acknowledge it.
  void OweAck(const std::string& peer, GlobalId id);
  /// Caller: the acknowledgements owed to `peer` (at most kMaxReplyAcks),
  /// for the request about to go to it; counted as piggybacked unless
  /// `explicit_message`.
  std::vector<uint64_t> TakeAcks(const std::string& peer,
                                 bool explicit_message);
  /// Caller: starts the thread that sends, with `send(peer)` (a
  /// DEVICE_IPC_ACK request, whose staging takes the acks), acks owed for
  /// kAckDelay that no request took. Call once; StopAckFlusher before the
  /// agent `send` uses goes.
  void StartAckFlusher(std::function<void(const std::string& peer)> send);
  /// Stops and joins that thread; idempotent.
  void StopAckFlusher();
  /// Longest an owed acknowledgement waits for a request to carry it.
  static constexpr absl::Duration kAckDelay = absl::Milliseconds(2);
  /// Sets the most reply bytes held for one caller (further replies to it
  /// are staged; WorkerOptions::ipc_reply_hold_bytes).
  void set_max_held_reply_bytes(uint64_t bytes);
  /// A reply's hold outlives its request's deadline by this much (the
  /// caller may be landing it as the deadline passes).
  static constexpr absl::Duration kReplyHoldGrace = absl::Seconds(30);
  /// `peer` is down: releases the tensors of every request to it, and
  /// closes the mappings of its memory (each once no landing uses it).
  void PeerFailed(const std::string& peer);
  /// How the reply to a request goes (ExpectReply, TakeReply).
  struct ReplyPlan {
    bool ack = false;  ///< It acknowledges the request's IPC tensors.
    bool ipc = false;  ///< Its tensors may go by IPC (`ipc_replies`).
    absl::Time deadline = absl::InfinitePast();  ///< The request's.
  };
  /// Callee: request `id` of `peer` (due by `deadline`) landed by IPC
  /// (`plan.ack`) or allows IPC replies (`plan.ipc`); remembered for its
  /// reply until the deadline. At most kMaxPendingAcks are remembered.
  void ExpectReply(const std::string& peer, GlobalId id, ReplyPlan plan);
  /// Callee: the plan of the reply to `peer`'s request `id` (once; all
  /// false when none was remembered).
  ReplyPlan TakeReply(const std::string& peer, GlobalId id);
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
    bool reply = false;
    uint64_t bytes = 0;
  };
  // Held tensors: (a reply's, the peer, request id). The peer is part of
  // the key: a reply is named by its caller's request id, which another
  // caller could repeat.
  using HeldKey = std::tuple<bool, std::string, uint64_t>;
  // Acknowledgements owed to one peer.
  struct Owed {
    std::vector<uint64_t> ids;
    absl::Time since;  // When the oldest was owed.
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
  void Count(const std::string& peer, const IpcTraffic& delta)
      ABSL_LOCKS_EXCLUDED(mu_);
  void CountLocked(const std::string& peer, const IpcTraffic& delta)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Hold(GlobalId id, Held held);
  // Moves `it`'s hold into `out` and forgets its bytes.
  void Release(std::map<HeldKey, Held>::iterator it, std::vector<Held>& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FlushLoop();
  // Releases the holds `ids` (replies' when `reply`) of `peer`, pooling
  // their events.
  void Acked(const std::string& peer, const std::vector<uint64_t>& ids,
             bool reply);
  // Peer `peer`'s event `handle` opened on `device`, cached.
  absl::StatusOr<std::shared_ptr<const IpcOpenedEvent>> OpenEvent(
      const std::string& peer, int device, const std::string& handle,
      IpcTraffic& counted);
  // A pooled event of `device`, else a new one, exported.
  absl::StatusOr<IpcExportedEvent> TakeEvent(int device, IpcTraffic& counted);
  // Pools acknowledged requests' `events` (destroys what the pool is full
  // for).
  void ReturnEvents(std::vector<IpcExportedEvent> events);
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
  bool usable_ ABSL_GUARDED_BY(mu_) = false;  // An event could be made.
  // Peers that can open this worker's handles (AcceptsReturning).
  std::set<std::string> returning_ ABSL_GUARDED_BY(mu_);
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
  std::map<HeldKey, Held> held_ ABSL_GUARDED_BY(mu_);
  // Callee: reply bytes held per caller, and the most allowed.
  std::map<std::string, uint64_t> reply_bytes_ ABSL_GUARDED_BY(mu_);
  uint64_t max_reply_bytes_ ABSL_GUARDED_BY(mu_) = uint64_t{4} << 30;
  // Callee: (peer, request id) -> its reply's plan.
  std::map<std::pair<std::string, uint64_t>, ReplyPlan> acks_
      ABSL_GUARDED_BY(mu_);
  // Caller: acknowledgements owed, per callee.
  // Its own lock: the flusher waits on it, and a waiter makes every unlock
  // of its mutex notify.
  mutable Mutex ack_mu_ ABSL_ACQUIRED_AFTER(mu_);
  std::map<std::string, Owed> owed_ ABSL_GUARDED_BY(ack_mu_);
  bool stop_ ABSL_GUARDED_BY(ack_mu_) = false;
  std::function<void(const std::string&)> send_acks_;  // Set once, at start.
  std::thread flusher_;
  // No hold (ack) expires before this: sweeps are skipped until then.
  absl::Time next_expiry_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  absl::Time next_ack_expiry_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  std::map<std::string, IpcTraffic> traffic_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ferry

#endif  // FERRY_WORKER_DEVICE_IPC_H_
