#include "ferry/worker/device_ipc.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "ferry/common/logging.h"
#include "ferry/common/status.h"

namespace ferry {
namespace {

// The IPC path's copies run on each device's default stream, as the staged
// path's do (worker/device_stage.cc).
constexpr cuda::StreamHandle kStream = 0;

// Per-peer tables are bounded as the stage's are: names a caller makes up
// are counted together beyond this many.
constexpr size_t kMaxPeers = 1024;

// Removes the least recently used entry of an LRU table whose values are
// (item, last use) into `evicted`, to be let go of unlocked.
template <typename Table, typename Item>
void EvictOldest(Table& table, std::vector<Item>& evicted) {
  auto oldest = std::min_element(
      table.begin(), table.end(), [](const auto& a, const auto& b) {
        return a.second.second < b.second.second;
      });
  evicted.push_back(std::move(oldest->second.first));
  table.erase(oldest);
}

}  // namespace

// A peer's event opened here; closed when the last user lets go.
struct IpcOpenedEvent {
  std::shared_ptr<cuda::DeviceIpcApi> ipc;
  int device = 0;
  cuda::EventHandle event = 0;
  ~IpcOpenedEvent() {
    absl::Status s = ipc->DestroyIpcEvent(device, event);
    if (!s.ok()) FERRY_LOG(WARNING) << "closing an IPC event: " << s;
  }
};

// A peer's allocation opened here; closed when the last user lets go.
struct DeviceIpc::Mapping {
  std::shared_ptr<cuda::DeviceIpcApi> ipc;
  int device = 0;
  char* base = nullptr;
  uint64_t bytes = 0;
  ~Mapping() {
    absl::Status s = ipc->CloseMemory(device, base);
    if (!s.ok()) FERRY_LOG(WARNING) << "closing an IPC mapping: " << s;
  }
};

// --- Sending ---------------------------------------------------------------

absl::StatusOr<Tensor> IpcOutgoing::Add(const Tensor& t,
                                        DevicePlacement& placement,
                                        DeviceHeader& header) {
  const int device = t.device().index;
  cuda::DeviceIpcApi& api = *ipc_->ipc_;
  auto found = event_index_.find(device);
  if (found == event_index_.end()) {
    // One event per device and message (pooled, exported once), recorded
    // after the work queued on the device so far: the tensors' producers.
    ASSIGN_OR_RETURN(IpcExportedEvent ev, ipc_->TakeEvent(device, counted_));
    events_.push_back(ev);
    RETURN_IF_ERROR(api.RecordIpcEvent(device, ev.event, kStream));
    found = event_index_
                .emplace(device, static_cast<uint32_t>(header.events.size()))
                .first;
    header.events.push_back(std::move(ev.handle));
  }
  ASSIGN_OR_RETURN(cuda::IpcMemory memory,
                   api.ExportMemory(device, t.data_ptr()));
  ASSIGN_OR_RETURN(Tensor placeholder, Tensor::TryEmpty({0}, t.dtype()));
  placement.ipc = IpcTensor{std::move(memory.handle), memory.offset,
                            memory.allocation_bytes, t.sizes(),
                            found->second};
  tensors_.push_back(t);
  bytes_ += t.nbytes();
  return placeholder;
}

absl::StatusOr<Tensor> IpcOutgoing::Snapshot(
    const Tensor& t, cuda::CachingDeviceAllocator& allocator,
    cuda::StreamHandle stream) {
  const int device = t.device().index;
  ASSIGN_OR_RETURN(Storage copy, allocator.Allocate(device, t.nbytes(), stream));
  RETURN_IF_ERROR(ipc_->api_->MemcpyAsync(device, copy.data(), t.data_ptr(),
                                          t.nbytes(), stream));
  ++snapshots_;
  return Tensor::FromStorage(std::move(copy), t.dtype(), t.sizes(),
                             ContiguousStrides(t.sizes()));
}

void IpcOutgoing::Commit(GlobalId id, absl::Time deadline) {
  if (tensors_.empty() && events_.empty()) return;
  counted_.tensors_out = tensors_.size();
  counted_.bytes_out = bytes_;
  counted_.reply_tensors_out = reply_ ? tensors_.size() : 0;
  counted_.reply_snapshots = snapshots_;
  ipc_->Count(peer_, counted_);
  ipc_->Hold(id, DeviceIpc::Held{peer_, deadline, std::move(tensors_),
                                 std::move(events_), reply_, bytes_});
  tensors_.clear();
  events_.clear();
}

IpcOutgoing::~IpcOutgoing() { ipc_->DestroyEvents(events_); }

// --- Receiving -------------------------------------------------------------

absl::StatusOr<Tensor> IpcIncoming::Land(const DevicePlacement& p,
                                         const Tensor& placeholder, int target,
                                         const std::string& what,
                                         const std::string& tensor) {
  const IpcTensor& t = *p.ipc;
  const std::string on = absl::StrCat("cuda:", target);
  if (!placeholder.defined() || !placeholder.device().is_cpu() ||
      placeholder.numel() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": malformed device header: ", tensor,
                     " has an IPC handle but did not arrive as an empty CPU "
                     "tensor"));
  }
  int64_t nbytes = 0;
  absl::Status shape = CheckShape(t.sizes, placeholder.dtype(), &nbytes);
  if (!shape.ok() ||
      static_cast<uint64_t>(nbytes) > t.allocation_bytes - t.offset) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": malformed device header: ", tensor, "'s IPC shape (",
        shape.ok() ? absl::StrCat(nbytes, " bytes") : shape.message(),
        ") does not fit the ", t.allocation_bytes - t.offset,
        " bytes after offset ", t.offset, " of its allocation"));
  }
  absl::StatusOr<std::shared_ptr<const DeviceIpc::Mapping>> mapping =
      ipc_->Open(peer_, target, t.memory_handle, counted_);
  if (!mapping.ok()) {
    return Annotate(mapping.status(),
                    absl::StrCat(what, ": ", tensor, ": opening the IPC "
                                 "memory handle of '", peer_, "' on ", on));
  }
  const DeviceIpc::Mapping& m = **mapping;
  if (t.offset + static_cast<uint64_t>(nbytes) > m.bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": malformed device header: ", tensor, ": ", nbytes,
        " bytes at offset ", t.offset, " overrun the peer's allocation of ",
        m.bytes, " bytes opened on ", on));
  }
  cuda::DeviceIpcApi& api = *ipc_->ipc_;
  auto ev = opened_.find({target, t.event});
  if (ev == opened_.end()) {
    absl::StatusOr<std::shared_ptr<const IpcOpenedEvent>> opened =
        ipc_->OpenEvent(peer_, target, events_[t.event], counted_);
    if (!opened.ok()) {
      return Annotate(opened.status(),
                      absl::StrCat(what, ": ", tensor, ": opening the IPC "
                                   "event of '", peer_, "' on ", on));
    }
    ev = opened_.emplace(std::make_pair(target, t.event), *opened).first;
    // The copies below run after the sender's producers.
    RETURN_IF_ERROR(Annotate(
        api.StreamWaitEvent(target, kStream, (*opened)->event),
                             absl::StrCat(what, ": ", tensor, " on ", on)));
  }
  absl::StatusOr<Storage> storage = ipc_->allocator_->Allocate(
      target, static_cast<size_t>(nbytes), kStream);
  if (!storage.ok()) {
    return Annotate(storage.status(), absl::StrCat(what, ": landing ", tensor,
                                                   " on ", on));
  }
  targets_.insert(target);
  in_use_.push_back(*mapping);
  RETURN_IF_ERROR(Annotate(
      ipc_->api_->MemcpyAsync(target, storage->data(), m.base + t.offset,
                              static_cast<size_t>(nbytes), kStream),
      absl::StrCat(what, ": copying ", tensor, " onto ", on)));
  ++counted_.tensors_in;
  counted_.bytes_in += static_cast<uint64_t>(nbytes);
  return Tensor::FromStorage(*std::move(storage), placeholder.dtype(), t.sizes,
                             ContiguousStrides(t.sizes));
}

absl::Status IpcIncoming::Finish() {
  for (int target : targets_) {
    RETURN_IF_ERROR(Annotate(ipc_->api_->SynchronizeStream(target, kStream),
                             absl::StrCat("worker '", ipc_->me_,
                                          "': waiting for the IPC copies "
                                          "from '", peer_, "' on cuda:",
                                          target)));
  }
  finished_ = true;
  return absl::OkStatus();
}

IpcIncoming::~IpcIncoming() {
  if (!finished_) {
    // A failed message: no queued copy may outlive the mappings it reads.
    for (int target : targets_) {
      ipc_->api_->SynchronizeStream(target, kStream).IgnoreError();
    }
  }
  opened_.clear();  // The cache keeps them open for the next message.
  // Handles opened count even when the message failed afterwards.
  if (!finished_) counted_.tensors_in = counted_.bytes_in = 0;
  if (reply_.has_value()) counted_.reply_tensors_in = counted_.tensors_in;
  if (counted_.tensors_in > 0 || counted_.handles_opened > 0 ||
      counted_.handle_reuses > 0 || counted_.events_opened > 0 ||
      counted_.event_open_reuses > 0) {
    ipc_->Count(peer_, counted_);
  }
  // No copy reads the callee's memory any more: it may release it.
  if (reply_.has_value()) ipc_->OweAck(peer_, *reply_);
}

// --- DeviceIpc -------------------------------------------------------------

std::shared_ptr<DeviceIpc> DeviceIpc::Create(
    std::string me, const std::shared_ptr<cuda::DeviceMemoryApi>& api,
    cuda::CachingDeviceAllocator* allocator) {
  std::shared_ptr<cuda::DeviceIpcApi> ipc = cuda::AsIpc(api);
  if (ipc == nullptr || allocator == nullptr) return nullptr;
  return std::shared_ptr<DeviceIpc>(
      new DeviceIpc(std::move(me), std::move(ipc), api, allocator));
}

DeviceIpc::~DeviceIpc() {
  StopAckFlusher();
  std::map<HeldKey, Held> held;
  decltype(mappings_) mappings;
  decltype(opened_events_) opened;
  decltype(free_events_) pooled;
  {
    MutexLock lock(&mu_);
    held.swap(held_);
    mappings.swap(mappings_);
    opened.swap(opened_events_);
    pooled.swap(free_events_);
  }
  for (auto& [id, h] : held) DestroyEvents(h.events);
  for (auto& [device, events] : pooled) DestroyEvents(events);
}

absl::Status DeviceIpc::UsePeers(const std::vector<std::string>& peers,
                                 int probe_device) {
  absl::StatusOr<cuda::EventHandle> probe = ipc_->CreateIpcEvent(probe_device);
  MutexLock lock(&mu_);
  if (!probe.ok()) {
    unavailable_ = std::string(probe.status().message());
    return Annotate(probe.status(),
                    absl::StrCat("worker '", me_, "': CUDA IPC unavailable"));
  }
  ipc_->DestroyIpcEvent(probe_device, *probe).IgnoreError();
  usable_ = true;
  if (peers.empty()) return absl::OkStatus();
  peers_.insert(peers.begin(), peers.end());
  unavailable_.clear();
  return absl::OkStatus();
}

bool DeviceIpc::Carries(const std::string& peer) const {
  MutexLock lock(&mu_);
  return peers_.count(peer) > 0;
}

std::string DeviceIpc::unavailable() const {
  MutexLock lock(&mu_);
  return unavailable_;
}

std::unique_ptr<IpcOutgoing> DeviceIpc::Begin(const std::string& peer) {
  if (!Carries(peer)) return nullptr;
  ReleaseExpired();
  return std::unique_ptr<IpcOutgoing>(
      new IpcOutgoing(shared_from_this(), peer, /*reply=*/false));
}

std::unique_ptr<IpcOutgoing> DeviceIpc::BeginReply(const std::string& peer) {
  ReleaseExpired();
  {
    MutexLock lock(&mu_);
    if (!usable_) return nullptr;
    auto it = reply_bytes_.find(peer);
    if (it != reply_bytes_.end() && it->second >= max_reply_bytes_) {
      CountLocked(peer, IpcTraffic{.replies_over_limit = 1});
      return nullptr;
    }
  }
  return std::unique_ptr<IpcOutgoing>(
      new IpcOutgoing(shared_from_this(), peer, /*reply=*/true));
}

void DeviceIpc::AcceptsReturning(const std::string& peer) {
  MutexLock lock(&mu_);
  if (returning_.size() < kMaxPeers) returning_.insert(peer);
}

std::unique_ptr<IpcOutgoing> DeviceIpc::BeginReturning(
    const std::string& peer) {
  {
    MutexLock lock(&mu_);
    if (!usable_ || returning_.count(peer) == 0) return nullptr;
  }
  ReleaseExpired();
  return std::unique_ptr<IpcOutgoing>(
      new IpcOutgoing(shared_from_this(), peer, /*reply=*/false));
}

void DeviceIpc::set_max_held_reply_bytes(uint64_t bytes) {
  MutexLock lock(&mu_);
  max_reply_bytes_ = bytes;
}

std::unique_ptr<IpcIncoming> DeviceIpc::Receive(
    const std::string& peer, std::vector<std::string> events,
    std::optional<GlobalId> reply) {
  return std::unique_ptr<IpcIncoming>(
      new IpcIncoming(shared_from_this(), peer, std::move(events), reply));
}

absl::StatusOr<std::shared_ptr<const DeviceIpc::Mapping>> DeviceIpc::Open(
    const std::string& peer, int device, const std::string& handle,
    IpcTraffic& counted) {
  std::vector<std::shared_ptr<const Mapping>> evicted;  // Closed unlocked.
  MutexLock lock(&mu_);
  auto key = std::make_tuple(peer, device, handle);
  auto it = mappings_.find(key);
  if (it != mappings_.end()) {
    it->second.second = ++uses_;
    ++counted.handle_reuses;
    return it->second.first;
  }
  // Opened under the lock: two landings of one allocation never open it
  // twice (CUDA refuses a second open in one process).
  absl::StatusOr<cuda::IpcMapping> opened = ipc_->OpenMemory(device, handle);
  if (!opened.ok()) return opened.status();
  auto m = std::make_shared<Mapping>();
  m->ipc = ipc_;
  m->device = device;
  m->base = static_cast<char*>(opened->base);
  m->bytes = opened->bytes;
  ++counted.handles_opened;
  if (mappings_.size() >= kMaxMappings) EvictOldest(mappings_, evicted);
  mappings_[std::move(key)] = {m, ++uses_};
  return std::shared_ptr<const Mapping>(std::move(m));
}

absl::StatusOr<std::shared_ptr<const IpcOpenedEvent>> DeviceIpc::OpenEvent(
    const std::string& peer, int device, const std::string& handle,
    IpcTraffic& counted) {
  std::vector<std::shared_ptr<const IpcOpenedEvent>> evicted;  // Unlocked.
  MutexLock lock(&mu_);
  auto key = std::make_tuple(peer, device, handle);
  auto it = opened_events_.find(key);
  if (it != opened_events_.end()) {
    it->second.second = ++uses_;
    ++counted.event_open_reuses;
    return it->second.first;
  }
  absl::StatusOr<cuda::EventHandle> opened = ipc_->OpenEvent(device, handle);
  if (!opened.ok()) return opened.status();
  auto e = std::make_shared<IpcOpenedEvent>();
  e->ipc = ipc_;
  e->device = device;
  e->event = *opened;
  ++counted.events_opened;
  if (opened_events_.size() >= kMaxOpenedEvents) {
    EvictOldest(opened_events_, evicted);
  }
  opened_events_[std::move(key)] = {e, ++uses_};
  return std::shared_ptr<const IpcOpenedEvent>(std::move(e));
}

absl::StatusOr<IpcExportedEvent> DeviceIpc::TakeEvent(int device,
                                                      IpcTraffic& counted) {
  {
    MutexLock lock(&mu_);
    auto it = free_events_.find(device);
    if (it != free_events_.end() && !it->second.empty()) {
      IpcExportedEvent ev = std::move(it->second.back());
      it->second.pop_back();
      ++counted.events_reused;
      return ev;
    }
  }
  ASSIGN_OR_RETURN(cuda::EventHandle ev, ipc_->CreateIpcEvent(device));
  absl::StatusOr<std::string> handle = ipc_->ExportEvent(device, ev);
  if (!handle.ok()) {
    ipc_->DestroyIpcEvent(device, ev).IgnoreError();
    return handle.status();
  }
  ++counted.events_created;
  return IpcExportedEvent{device, ev, *std::move(handle)};
}

void DeviceIpc::ReturnEvents(std::vector<IpcExportedEvent> events) {
  std::vector<IpcExportedEvent> surplus;
  {
    MutexLock lock(&mu_);
    for (IpcExportedEvent& ev : events) {
      std::vector<IpcExportedEvent>& pool = free_events_[ev.device];
      if (pool.size() < kMaxPooledEvents) {
        pool.push_back(std::move(ev));
      } else {
        surplus.push_back(std::move(ev));
      }
    }
  }
  DestroyEvents(surplus);
}

void DeviceIpc::Count(const std::string& peer, const IpcTraffic& d) {
  MutexLock lock(&mu_);
  CountLocked(peer, d);
}

void DeviceIpc::CountLocked(const std::string& peer, const IpcTraffic& d) {
  const bool known = traffic_.count(peer) > 0;
  IpcTraffic& t =
      traffic_[known || traffic_.size() < kMaxPeers ? peer : "(other)"];
  t.tensors_out += d.tensors_out;
  t.bytes_out += d.bytes_out;
  t.tensors_in += d.tensors_in;
  t.bytes_in += d.bytes_in;
  t.handles_opened += d.handles_opened;
  t.handle_reuses += d.handle_reuses;
  t.reply_tensors_out += d.reply_tensors_out;
  t.reply_tensors_in += d.reply_tensors_in;
  t.reply_snapshots += d.reply_snapshots;
  t.replies_over_limit += d.replies_over_limit;
  t.acks_piggybacked += d.acks_piggybacked;
  t.ack_messages += d.ack_messages;
  t.acks_in_messages += d.acks_in_messages;
  t.events_created += d.events_created;
  t.events_reused += d.events_reused;
  t.events_opened += d.events_opened;
  t.event_open_reuses += d.event_open_reuses;
}

void DeviceIpc::Hold(GlobalId id, Held held) {
  MutexLock lock(&mu_);
  next_expiry_ = std::min(next_expiry_, held.deadline);
  if (held.reply) reply_bytes_[held.peer] += held.bytes;
  HeldKey key{held.reply, held.peer, id.value()};
  auto it = held_.find(key);
  if (it == held_.end()) {
    held_.emplace(std::move(key), std::move(held));
    return;
  }
  // An id the peer used twice (only a misbehaving caller repeats one): both
  // stay held until that id is acknowledged, so neither is released while
  // the peer may still read it.
  Held& both = it->second;
  both.deadline = std::max(both.deadline, held.deadline);
  both.bytes += held.bytes;
  for (Tensor& t : held.tensors) both.tensors.push_back(std::move(t));
  for (IpcExportedEvent& e : held.events) both.events.push_back(std::move(e));
}

void DeviceIpc::Release(std::map<HeldKey, Held>::iterator it,
                        std::vector<Held>& out) {
  Held& h = it->second;
  if (h.reply) {
    auto bytes = reply_bytes_.find(h.peer);
    if (bytes != reply_bytes_.end()) {
      bytes->second -= std::min(bytes->second, h.bytes);
      if (bytes->second == 0) reply_bytes_.erase(bytes);
    }
  }
  out.push_back(std::move(h));
  held_.erase(it);
}

void DeviceIpc::DestroyEvents(const std::vector<IpcExportedEvent>& events) {
  for (const IpcExportedEvent& ev : events) {
    absl::Status s = ipc_->DestroyIpcEvent(ev.device, ev.event);
    if (!s.ok()) FERRY_LOG(WARNING) << "worker '" << me_ << "': " << s;
  }
}

void DeviceIpc::TakeExpired(std::vector<Held>& out) {
  const absl::Time now = absl::Now();
  if (now <= next_expiry_) return;  // Nothing can have expired yet.
  next_expiry_ = absl::InfiniteFuture();
  for (auto it = held_.begin(); it != held_.end();) {
    if (it->second.deadline < now) {
      Release(it++, out);
    } else {
      next_expiry_ = std::min(next_expiry_, it->second.deadline);
      ++it;
    }
  }
}

void DeviceIpc::ReleaseExpired() {
  std::vector<Held> done;
  {
    MutexLock lock(&mu_);
    TakeExpired(done);
  }
  for (const Held& h : done) DestroyEvents(h.events);
}

void DeviceIpc::Replied(const std::string& peer, GlobalId id) {
  Acked(peer, {id.value()}, /*reply=*/false);
}

void DeviceIpc::RepliesAcked(const std::string& peer,
                             const std::vector<uint64_t>& ids) {
  Acked(peer, ids, /*reply=*/true);
}

void DeviceIpc::Acked(const std::string& peer, const std::vector<uint64_t>& ids,
                      bool reply) {
  std::vector<Held> acked;
  std::vector<Held> expired;
  {
    MutexLock lock(&mu_);
    for (uint64_t id : ids) {
      // Only the peer the message went to can name it.
      auto it = held_.find({reply, peer, id});
      if (it != held_.end()) Release(it, acked);
    }
    TakeExpired(expired);
  }
  // The peer enqueued its waits and finished its copies before it
  // acknowledged: the events may be recorded again. An expired hold's peer
  // may still wait on them.
  for (Held& h : acked) {
    if (!h.events.empty()) ReturnEvents(std::move(h.events));
  }
  for (const Held& h : expired) DestroyEvents(h.events);
}

void DeviceIpc::OweAck(const std::string& peer, GlobalId id) {
  MutexLock lock(&ack_mu_);
  Owed& owed = owed_[peer];
  if (owed.ids.empty()) owed.since = absl::Now();
  // Bounded: beyond kMaxReplyAcks owed to one peer, the oldest go unsent
  // (the callee then releases them at its hold's deadline).
  if (owed.ids.size() >= kMaxReplyAcks) owed.ids.erase(owed.ids.begin());
  owed.ids.push_back(id.value());
}

std::vector<uint64_t> DeviceIpc::TakeAcks(const std::string& peer,
                                          bool explicit_message) {
  std::vector<uint64_t> ids;
  {
    MutexLock lock(&ack_mu_);
    auto it = owed_.find(peer);
    if (it == owed_.end()) return ids;
    ids = std::move(it->second.ids);
    owed_.erase(it);
  }
  Count(peer, explicit_message
                  ? IpcTraffic{.ack_messages = 1,
                               .acks_in_messages = ids.size()}
                  : IpcTraffic{.acks_piggybacked = ids.size()});
  return ids;
}

void DeviceIpc::StartAckFlusher(
    std::function<void(const std::string& peer)> send) {
  send_acks_ = std::move(send);
  flusher_ = std::thread([this] { FlushLoop(); });
}

void DeviceIpc::StopAckFlusher() {
  {
    MutexLock lock(&ack_mu_);
    stop_ = true;
  }
  if (flusher_.joinable()) flusher_.join();
}

void DeviceIpc::FlushLoop() {
  MutexLock lock(&ack_mu_);
  auto owed = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(ack_mu_) {
    return stop_ || !owed_.empty();
  };
  auto stopped = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(ack_mu_) {
    return stop_;
  };
  while (!stop_) {
    ack_mu_.Await(absl::Condition(&owed));
    if (stop_) break;
    absl::Time due = absl::InfiniteFuture();
    for (const auto& [peer, o] : owed_) due = std::min(due, o.since + kAckDelay);
    // Requests to the peer may take them meanwhile; each wait is bounded.
    if (absl::Now() < due) {
      ack_mu_.AwaitWithDeadline(absl::Condition(&stopped), due);
      continue;
    }
    const absl::Time now = absl::Now();
    std::vector<std::pair<std::string, absl::Time>> late;
    for (const auto& [peer, o] : owed_) {
      if (o.since + kAckDelay <= now) late.emplace_back(peer, o.since);
    }
    ack_mu_.Unlock();
    // Each send's staging takes the peer's acks (TakeAcks).
    for (const auto& [peer, since] : late) send_acks_(peer);
    ack_mu_.Lock();
    // A send that never reached staging (an unknown peer, a stopped agent)
    // left them: dropped, not retried in a loop (the callee's hold ends at
    // its deadline or when it sees this worker down).
    for (const auto& [peer, since] : late) {
      auto it = owed_.find(peer);
      if (it != owed_.end() && it->second.since == since) owed_.erase(it);
    }
  }
}

void DeviceIpc::ExpectReply(const std::string& peer, GlobalId id,
                            ReplyPlan plan) {
  MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  if (now > next_ack_expiry_) {
    next_ack_expiry_ = absl::InfiniteFuture();
    for (auto it = acks_.begin(); it != acks_.end();) {
      if (it->second.deadline < now) {
        it = acks_.erase(it);
      } else {
        next_ack_expiry_ = std::min(next_ack_expiry_, it->second.deadline);
        ++it;
      }
    }
  }
  if (acks_.size() >= kMaxPendingAcks) acks_.erase(acks_.begin());
  next_ack_expiry_ = std::min(next_ack_expiry_, plan.deadline);
  acks_[{peer, id.value()}] = plan;
}

DeviceIpc::ReplyPlan DeviceIpc::TakeReply(const std::string& peer,
                                          GlobalId id) {
  MutexLock lock(&mu_);
  auto it = acks_.find({peer, id.value()});
  if (it == acks_.end()) return ReplyPlan{};
  ReplyPlan plan = it->second;
  acks_.erase(it);
  return plan;
}

void DeviceIpc::PeerFailed(const std::string& peer) {
  std::vector<Held> done;
  // Closed once unlocked, each when its last landing lets go of it.
  std::vector<std::shared_ptr<const Mapping>> closed;
  std::vector<std::shared_ptr<const IpcOpenedEvent>> closed_events;
  {
    MutexLock lock(&mu_);
    returning_.erase(peer);
    for (auto it = held_.begin(); it != held_.end();) {
      if (it->second.peer == peer) {
        Release(it++, done);
      } else {
        ++it;
      }
    }
    for (auto it = mappings_.begin(); it != mappings_.end();) {
      if (std::get<0>(it->first) == peer) {
        closed.push_back(std::move(it->second.first));
        it = mappings_.erase(it);
      } else {
        ++it;
      }
    }
    for (auto it = opened_events_.begin(); it != opened_events_.end();) {
      if (std::get<0>(it->first) == peer) {
        closed_events.push_back(std::move(it->second.first));
        it = opened_events_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (const Held& h : done) DestroyEvents(h.events);
  MutexLock lock(&ack_mu_);
  owed_.erase(peer);  // Nobody there to release anything.
}

IpcTraffic DeviceIpc::Traffic(const std::string& peer) {
  ReleaseExpired();
  MutexLock lock(&mu_);
  auto it = traffic_.find(peer);
  IpcTraffic t = it == traffic_.end() ? IpcTraffic{} : it->second;
  for (const auto& [key, h] : held_) {
    if (h.peer != peer) continue;
    ++(h.reply ? t.held_replies : t.held_calls);
  }
  return t;
}

size_t DeviceIpc::held_calls() {
  ReleaseExpired();
  MutexLock lock(&mu_);
  size_t n = 0;
  for (const auto& [key, h] : held_) n += h.reply ? 0 : 1;
  return n;
}

std::vector<rpc::InspectionRow> DeviceIpc::Inspect() {
  std::vector<std::string> peers;
  {
    MutexLock lock(&mu_);
    for (const auto& [peer, t] : traffic_) peers.push_back(peer);
  }
  std::vector<rpc::InspectionRow> rows;
  for (const std::string& peer : peers) {
    const IpcTraffic t = Traffic(peer);
    rows.push_back({"ipc",
                    {{"peer", peer},
                     {"tensors_out", absl::StrCat(t.tensors_out)},
                     {"bytes_out", absl::StrCat(t.bytes_out)},
                     {"tensors_in", absl::StrCat(t.tensors_in)},
                     {"bytes_in", absl::StrCat(t.bytes_in)},
                     {"handles_opened", absl::StrCat(t.handles_opened)},
                     {"handle_reuses", absl::StrCat(t.handle_reuses)},
                     {"events_created", absl::StrCat(t.events_created)},
                     {"events_reused", absl::StrCat(t.events_reused)},
                     {"events_opened", absl::StrCat(t.events_opened)},
                     {"event_open_reuses", absl::StrCat(t.event_open_reuses)},
                     {"held_calls", absl::StrCat(t.held_calls)},
                     {"reply_tensors_out", absl::StrCat(t.reply_tensors_out)},
                     {"reply_tensors_in", absl::StrCat(t.reply_tensors_in)},
                     {"reply_snapshots", absl::StrCat(t.reply_snapshots)},
                     {"held_replies", absl::StrCat(t.held_replies)},
                     {"replies_over_limit",
                      absl::StrCat(t.replies_over_limit)},
                     {"acks_piggybacked", absl::StrCat(t.acks_piggybacked)},
                     {"ack_messages", absl::StrCat(t.ack_messages)},
                     {"acks_in_messages", absl::StrCat(t.acks_in_messages)}}});
  }
  return rows;
}

}  // namespace ferry
