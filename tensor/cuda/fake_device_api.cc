#include "ferry/tensor/cuda/fake_device_api.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "ferry/common/status.h"

namespace ferry {
namespace cuda {

namespace {

// A handle: magic, the host's nonce, the kind ('M' memory, 'E' event) and
// the host's id, then zeros up to kIpcHandleBytes.
constexpr char kMagic[8] = {'f', 'e', 'r', 'r', 'y', 'f', 'k', '1'};

std::string MakeHandle(uint64_t nonce, char kind, uint64_t id) {
  std::string h(kIpcHandleBytes, '\0');
  std::memcpy(h.data(), kMagic, 8);
  std::memcpy(h.data() + 8, &nonce, 8);
  h[16] = kind;
  std::memcpy(h.data() + 24, &id, 8);
  return h;
}

}  // namespace

FakeHost::FakeHost(std::string name)
    : name_(std::move(name)), nonce_(absl::Uniform<uint64_t>(absl::BitGen())) {}

FakeDeviceApi::FakeDeviceApi(int devices, uint64_t capacity_bytes)
    : devices_(devices), capacity_(capacity_bytes) {}

FakeDeviceApi::FakeDeviceApi(int devices, uint64_t capacity_bytes,
                             std::shared_ptr<FakeHost> host)
    : devices_(devices), capacity_(capacity_bytes), host_(std::move(host)) {}

FakeDeviceApi::~FakeDeviceApi() {
  if (host_ != nullptr) {
    absl::MutexLock host_lock(&host_->mu_);
    UnexportLocked(nullptr);
  }
  absl::MutexLock lock(&mu_);
  for (auto& [ptr, where] : blocks_) std::free(ptr);
  for (auto& [ptr, size] : host_blocks_) std::free(const_cast<char*>(ptr));
}

void FakeDeviceApi::UnexportLocked(void* base) {
  for (auto it = host_->memory_.begin(); it != host_->memory_.end();) {
    const bool mine = it->second.owner == this &&
                      (base == nullptr || it->second.base == base);
    it = mine ? host_->memory_.erase(it) : std::next(it);
  }
  if (base != nullptr) return;
  for (auto it = host_->events_.begin(); it != host_->events_.end();) {
    it = it->second.owner == this ? host_->events_.erase(it) : std::next(it);
  }
}

absl::StatusOr<void*> FakeDeviceApi::Malloc(int device, size_t nbytes) {
  absl::Status valid = CheckDevice(*this, device);
  if (!valid.ok()) return valid;
  if (nbytes == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("fake:", device, ": Malloc of 0 bytes"));
  }
  absl::MutexLock lock(&mu_);
  uint64_t& used = in_use_[device];
  if (nbytes > capacity_ - used) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "fake:%d: out of memory: %d bytes requested, %d of %d in use", device,
        nbytes, used, capacity_));
  }
  const size_t rounded = (nbytes + 255) / 256 * 256;
  void* p = std::aligned_alloc(256, rounded);
  if (p == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("fake:", device, ": host allocation of ", nbytes,
                     " bytes failed"));
  }
  used += nbytes;
  blocks_[p] = {device, nbytes};
  ++mallocs_;
  return p;
}

absl::Status FakeDeviceApi::Free(int device, void* ptr) {
  absl::Status valid = CheckDevice(*this, device);
  if (!valid.ok()) return valid;
  if (host_ != nullptr) {
    // An exported allocation is forgotten by its host (peers' opens fail).
    absl::MutexLock host_lock(&host_->mu_);
    UnexportLocked(ptr);
    absl::MutexLock lock(&mu_);
    return FreeLocked(device, ptr);
  }
  absl::MutexLock lock(&mu_);
  return FreeLocked(device, ptr);
}

absl::Status FakeDeviceApi::FreeLocked(int device, void* ptr) {
  auto it = blocks_.find(ptr);
  if (it == blocks_.end() || it->second.first != device) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "fake:%d: Free of %p, which Malloc did not return on this device",
        device, ptr));
  }
  in_use_[device] -= it->second.second;
  std::free(ptr);
  blocks_.erase(it);
  ++frees_;
  return absl::OkStatus();
}

absl::StatusOr<EventHandle> FakeDeviceApi::RecordEvent(int device,
                                                       StreamHandle stream) {
  absl::Status valid = CheckDevice(*this, device);
  if (!valid.ok()) return valid;
  absl::MutexLock lock(&mu_);
  if (fail_events_ > 0) {
    --fail_events_;
    return absl::InternalError(
        absl::StrCat("fake:", device, ": RecordEvent failed (injected)"));
  }
  const EventHandle id = next_event_++;
  const uint64_t seq = ++recorded_[{device, stream}];
  events_[id] = Event{device, stream, seq};
  Op marker;
  marker.seq = seq;
  queues_[{device, stream}].push_back(marker);
  return id;
}

absl::StatusOr<bool> FakeDeviceApi::EventDone(int device, EventHandle event) {
  absl::MutexLock lock(&mu_);
  auto it = events_.find(event);
  if (it == events_.end() || it->second.device != device) {
    return absl::InvalidArgumentError(
        absl::StrCat("fake:", device, ": no event ", event));
  }
  return completed_[{device, it->second.stream}] >= it->second.seq;
}

absl::Status FakeDeviceApi::DestroyEvent(int device, EventHandle event) {
  absl::MutexLock lock(&mu_);
  auto it = events_.find(event);
  if (it == events_.end() || it->second.device != device) {
    return absl::InvalidArgumentError(
        absl::StrCat("fake:", device, ": no event ", event));
  }
  events_.erase(it);
  return absl::OkStatus();
}

absl::Status FakeDeviceApi::MemcpyAsync(int device, void* dst, const void* src,
                                        size_t nbytes, StreamHandle stream) {
  absl::Status valid = CheckDevice(*this, device);
  if (!valid.ok()) return valid;
  if (nbytes > 0 && (dst == nullptr || src == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fake:", device, ": MemcpyAsync of ", nbytes, " bytes with a null side"));
  }
  absl::MutexLock lock(&mu_);
  if (InHostBlock(dst) || InHostBlock(src)) ++pinned_copies_;
  Op copy;
  copy.dst = dst;
  copy.src = src;
  copy.nbytes = nbytes;
  queues_[{device, stream}].push_back(copy);
  return absl::OkStatus();
}

absl::Status FakeDeviceApi::SynchronizeStream(int device, StreamHandle stream) {
  absl::Status valid = CheckDevice(*this, device);
  if (!valid.ok()) return valid;
  {
    absl::MutexLock lock(&mu_);
    ++host_waits_;
  }
  if (!CompleteStream(device, stream)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "fake:", device, ": stream ", stream,
        " waits for an event whose stream the test has not completed"));
  }
  return absl::OkStatus();
}

bool FakeDeviceApi::CompleteStream(int device, StreamHandle stream) {
  std::vector<uint64_t> waits;
  {
    absl::MutexLock lock(&mu_);
    auto it = waits_.find({device, stream});
    if (it != waits_.end()) {
      waits = std::move(it->second);
      waits_.erase(it);
    }
  }
  // Peers' events first: their streams complete before this one's queue
  // runs (a peer that went away counts as done).
  if (!waits.empty() && host_ != nullptr) {
    absl::MutexLock host_lock(&host_->mu_);
    for (uint64_t id : waits) {
      auto ev = host_->events_.find(id);
      if (ev == host_->events_.end()) continue;
      ev->second.owner->CompleteEventStream(ev->second.event);
    }
  }
  absl::MutexLock lock(&mu_);
  return RunQueue({device, stream});
}

bool FakeDeviceApi::CompleteStreamAndWaits(int device, StreamHandle stream) {
  std::vector<std::pair<int, StreamHandle>> up;
  return CompleteWithWaits({device, stream}, up);
}

bool FakeDeviceApi::CompleteWithWaits(
    std::pair<int, StreamHandle> where,
    std::vector<std::pair<int, StreamHandle>>& up) {
  if (std::find(up.begin(), up.end(), where) != up.end()) return false;
  up.push_back(where);
  bool done = false;
  // Each round passes at least one wait, so the queue's length bounds it.
  for (;;) {
    if (CompleteStream(where.first, where.second)) {
      done = true;
      break;
    }
    std::pair<int, StreamHandle> on;
    {
      absl::MutexLock lock(&mu_);
      const std::vector<Op>& queued = queues_[where];
      if (queued.empty() || !queued.front().wait) break;
      on = queued.front().wait_on;
    }
    if (!CompleteWithWaits(on, up)) break;
  }
  up.pop_back();
  return done;
}

bool FakeDeviceApi::RunQueue(std::pair<int, StreamHandle> where) {
  std::vector<Op>& queued = queues_[where];
  size_t ran = 0;
  for (; ran < queued.size(); ++ran) {
    const Op& op = queued[ran];
    if (op.wait) {
      if (completed_[op.wait_on] < op.seq) break;
    } else if (op.seq > 0) {
      completed_[where] = op.seq;
    } else {
      std::memcpy(op.dst, op.src, op.nbytes);
    }
  }
  queued.erase(queued.begin(), queued.begin() + ran);
  return queued.empty();
}

void FakeDeviceApi::CompleteEventStream(EventHandle event) {
  absl::MutexLock lock(&mu_);
  auto it = events_.find(event);
  if (it == events_.end() || it->second.seq == 0) return;
  RunQueue({it->second.device, it->second.stream});
}

absl::Status FakeDeviceApi::NoHost(int device, absl::string_view call) const {
  return absl::FailedPreconditionError(absl::StrCat(
      "fake:", device, ": ", call,
      ": this FakeDeviceApi is on no FakeHost, so it shares no memory with "
      "another process"));
}

absl::StatusOr<uint64_t> FakeDeviceApi::HandleId(int device,
                                                 absl::string_view handle,
                                                 char kind,
                                                 absl::string_view call) const {
  if (handle.size() != kIpcHandleBytes ||
      std::memcmp(handle.data(), kMagic, 8) != 0 || handle[16] != kind) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fake:", device, ": ", call, ": not a fake IPC ",
        kind == 'M' ? "memory" : "event", " handle (", handle.size(),
        " bytes)"));
  }
  uint64_t nonce = 0;
  uint64_t id = 0;
  std::memcpy(&nonce, handle.data() + 8, 8);
  std::memcpy(&id, handle.data() + 24, 8);
  if (nonce != host_->nonce_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "fake:", device, ": ", call,
        ": the handle was exported on another host than fake host '",
        host_->name(), "'"));
  }
  return id;
}

absl::StatusOr<IpcMemory> FakeDeviceApi::ExportMemory(int device,
                                                      const void* ptr) {
  RETURN_IF_ERROR(CheckDevice(*this, device));
  if (host_ == nullptr) return NoHost(device, "ExportMemory");
  absl::MutexLock host_lock(&host_->mu_);
  absl::MutexLock lock(&mu_);
  const char* p = static_cast<const char*>(ptr);
  auto it = blocks_.upper_bound(const_cast<void*>(ptr));
  bool held = it != blocks_.begin();
  if (held) {
    --it;
    held = it->second.first == device &&
           p < static_cast<const char*>(it->first) + it->second.second;
  }
  if (!held) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "fake:%d: ExportMemory of %p, which no allocation of this device "
        "holds", device, ptr));
  }
  void* base = it->first;
  const uint64_t bytes = it->second.second;
  uint64_t id = 0;
  for (const auto& [each, m] : host_->memory_) {
    if (m.owner == this && m.base == base) id = each;
  }
  if (id == 0) {
    id = host_->next_++;
    host_->memory_[id] = FakeHost::Memory{this, device, base, bytes};
  }
  return IpcMemory{MakeHandle(host_->nonce_, 'M', id),
                   static_cast<uint64_t>(p - static_cast<const char*>(base)),
                   bytes};
}

absl::StatusOr<IpcMapping> FakeDeviceApi::OpenMemory(int device,
                                                     absl::string_view handle) {
  RETURN_IF_ERROR(CheckDevice(*this, device));
  if (host_ == nullptr) return NoHost(device, "OpenMemory");
  ASSIGN_OR_RETURN(uint64_t id, HandleId(device, handle, 'M', "OpenMemory"));
  absl::MutexLock host_lock(&host_->mu_);
  auto it = host_->memory_.find(id);
  if (it == host_->memory_.end()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "fake:", device, ": OpenMemory: no allocation is exported under the "
        "handle on fake host '", host_->name(), "' (freed?)"));
  }
  const FakeHost::Memory m = it->second;
  absl::MutexLock lock(&mu_);
  ++mappings_[m.base];
  ++ipc_opens_;
  return IpcMapping{m.base, m.bytes};
}

absl::Status FakeDeviceApi::CloseMemory(int device, void* base) {
  RETURN_IF_ERROR(CheckDevice(*this, device));
  absl::MutexLock lock(&mu_);
  auto it = mappings_.find(base);
  if (it == mappings_.end()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "fake:%d: CloseMemory of %p, which OpenMemory did not return", device,
        base));
  }
  if (--it->second == 0) mappings_.erase(it);
  return absl::OkStatus();
}

absl::StatusOr<EventHandle> FakeDeviceApi::CreateIpcEvent(int device) {
  RETURN_IF_ERROR(CheckDevice(*this, device));
  if (host_ == nullptr) return NoHost(device, "CreateIpcEvent");
  absl::MutexLock lock(&mu_);
  const EventHandle id = next_event_++;
  events_[id] = Event{device, 0, 0};  // Never recorded: done.
  ++ipc_events_created_;
  return id;
}

absl::Status FakeDeviceApi::RecordIpcEvent(int device, EventHandle event,
                                           StreamHandle stream) {
  RETURN_IF_ERROR(CheckDevice(*this, device));
  absl::MutexLock lock(&mu_);
  auto it = events_.find(event);
  if (it == events_.end() || it->second.device != device) {
    return absl::InvalidArgumentError(
        absl::StrCat("fake:", device, ": RecordIpcEvent: no event ", event));
  }
  it->second.stream = stream;
  it->second.seq = ++recorded_[{device, stream}];
  Op marker;  // Done once the stream's queue runs past it.
  marker.seq = it->second.seq;
  queues_[{device, stream}].push_back(marker);
  return absl::OkStatus();
}

absl::StatusOr<std::string> FakeDeviceApi::ExportEvent(int device,
                                                       EventHandle event) {
  RETURN_IF_ERROR(CheckDevice(*this, device));
  if (host_ == nullptr) return NoHost(device, "ExportEvent");
  absl::MutexLock host_lock(&host_->mu_);
  {
    absl::MutexLock lock(&mu_);
    auto it = events_.find(event);
    if (it == events_.end() || it->second.device != device) {
      return absl::InvalidArgumentError(
          absl::StrCat("fake:", device, ": ExportEvent: no event ", event));
    }
  }
  const uint64_t id = host_->next_++;
  host_->events_[id] = FakeHost::SharedEvent{this, device, event};
  return MakeHandle(host_->nonce_, 'E', id);
}

absl::StatusOr<EventHandle> FakeDeviceApi::OpenEvent(int device,
                                                     absl::string_view handle) {
  RETURN_IF_ERROR(CheckDevice(*this, device));
  if (host_ == nullptr) return NoHost(device, "OpenEvent");
  ASSIGN_OR_RETURN(uint64_t id, HandleId(device, handle, 'E', "OpenEvent"));
  absl::MutexLock host_lock(&host_->mu_);
  if (host_->events_.count(id) == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "fake:", device, ": OpenEvent: no event is exported under the handle "
        "on fake host '", host_->name(), "'"));
  }
  absl::MutexLock lock(&mu_);
  const EventHandle local = next_event_++;
  imported_[local] = id;
  ++ipc_event_opens_;
  return local;
}

absl::Status FakeDeviceApi::DestroyIpcEvent(int device, EventHandle event) {
  RETURN_IF_ERROR(CheckDevice(*this, device));
  if (host_ == nullptr) return NoHost(device, "DestroyIpcEvent");
  absl::MutexLock host_lock(&host_->mu_);
  absl::MutexLock lock(&mu_);
  if (imported_.erase(event) > 0) return absl::OkStatus();
  auto it = events_.find(event);
  if (it == events_.end() || it->second.device != device) {
    return absl::InvalidArgumentError(
        absl::StrCat("fake:", device, ": DestroyIpcEvent: no event ", event));
  }
  events_.erase(it);
  for (auto e = host_->events_.begin(); e != host_->events_.end();) {
    const bool mine = e->second.owner == this && e->second.event == event;
    e = mine ? host_->events_.erase(e) : std::next(e);
  }
  return absl::OkStatus();
}

uint64_t FakeDeviceApi::ipc_opens() {
  absl::MutexLock lock(&mu_);
  return ipc_opens_;
}

uint64_t FakeDeviceApi::ipc_events_created() {
  absl::MutexLock lock(&mu_);
  return ipc_events_created_;
}

uint64_t FakeDeviceApi::ipc_event_opens() {
  absl::MutexLock lock(&mu_);
  return ipc_event_opens_;
}

uint64_t FakeDeviceApi::open_mappings() {
  absl::MutexLock lock(&mu_);
  uint64_t n = 0;
  for (const auto& [base, count] : mappings_) n += count;
  return n;
}

void FakeDeviceApi::FailRecordEvent(int n) {
  absl::MutexLock lock(&mu_);
  fail_events_ = n;
}

uint64_t FakeDeviceApi::in_use_bytes(int device) {
  absl::MutexLock lock(&mu_);
  return in_use_[device];
}

uint64_t FakeDeviceApi::mallocs() {
  absl::MutexLock lock(&mu_);
  return mallocs_;
}

uint64_t FakeDeviceApi::frees() {
  absl::MutexLock lock(&mu_);
  return frees_;
}

uint64_t FakeDeviceApi::live_events() {
  absl::MutexLock lock(&mu_);
  return events_.size();
}

bool FakeDeviceApi::InHostBlock(const void* p) const {
  const char* c = static_cast<const char*>(p);
  auto it = host_blocks_.upper_bound(c);
  if (it == host_blocks_.begin()) return false;
  --it;
  return c < it->first + it->second;
}

absl::StatusOr<void*> FakeDeviceApi::HostAlloc(size_t nbytes) {
  if (nbytes == 0) {
    return absl::InvalidArgumentError("fake:host: HostAlloc of 0 bytes");
  }
  absl::MutexLock lock(&mu_);
  if (nbytes > host_capacity_ - std::min(host_capacity_, host_in_use_)) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "fake:host: out of pinned memory: %d bytes requested, %d of %d in use",
        nbytes, host_in_use_, host_capacity_));
  }
  void* p = std::aligned_alloc(256, (nbytes + 255) / 256 * 256);
  if (p == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "fake:host: host allocation of ", nbytes, " bytes failed"));
  }
  host_blocks_[static_cast<const char*>(p)] = nbytes;
  host_in_use_ += nbytes;
  ++host_allocs_;
  return p;
}

absl::Status FakeDeviceApi::HostFree(void* ptr) {
  absl::MutexLock lock(&mu_);
  auto it = host_blocks_.find(static_cast<const char*>(ptr));
  if (it == host_blocks_.end()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "fake:host: HostFree of %p, which HostAlloc did not return", ptr));
  }
  const char* lo = it->first;
  const char* hi = lo + it->second;
  for (const auto& [where, queued] : queues_) {
    for (const Op& c : queued) {
      if (c.nbytes == 0) continue;  // Not a copy.
      const char* d = static_cast<const char*>(c.dst);
      const char* s = static_cast<const char*>(c.src);
      if ((d >= lo && d < hi) || (s >= lo && s < hi)) {
        return absl::FailedPreconditionError(absl::StrFormat(
            "fake:host: HostFree of %p while a copy queued on fake:%d stream "
            "%d still uses it",
            ptr, where.first, where.second));
      }
    }
  }
  host_in_use_ -= it->second;
  std::free(ptr);
  host_blocks_.erase(it);
  ++host_frees_;
  return absl::OkStatus();
}

absl::Status FakeDeviceApi::WaitEvent(int device, EventHandle event) {
  StreamHandle stream;
  {
    absl::MutexLock lock(&mu_);
    ++host_waits_;
    auto it = events_.find(event);
    if (it == events_.end() || it->second.device != device) {
      return absl::InvalidArgumentError(
          absl::StrCat("fake:", device, ": no event ", event));
    }
    stream = it->second.stream;
  }
  CompleteStream(device, stream);
  absl::StatusOr<bool> done = EventDone(device, event);
  if (done.ok() && !*done) {
    return absl::FailedPreconditionError(absl::StrCat(
        "fake:", device, ": event ", event, " is behind a stream wait that "
        "the test has not let through"));
  }
  return done.status();
}

absl::Status FakeDeviceApi::StreamWaitEvent(int device, StreamHandle stream,
                                            EventHandle event) {
  absl::Status valid = CheckDevice(*this, device);
  if (!valid.ok()) return valid;
  absl::MutexLock lock(&mu_);
  auto imported = imported_.find(event);
  if (imported != imported_.end()) {  // A peer's (OpenEvent).
    waits_[{device, stream}].push_back(imported->second);
    return absl::OkStatus();
  }
  auto it = events_.find(event);
  if (it == events_.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("fake:", device, ": StreamWaitEvent: no event ", event));
  }
  Op wait;
  wait.seq = it->second.seq;
  wait.wait = true;
  wait.wait_on = {it->second.device, it->second.stream};
  queues_[{device, stream}].push_back(wait);
  return absl::OkStatus();
}

absl::StatusOr<StreamHandle> FakeDeviceApi::CreateStream(int device) {
  absl::Status valid = CheckDevice(*this, device);
  if (!valid.ok()) return valid;
  absl::MutexLock lock(&mu_);
  const StreamHandle s = next_stream_++;
  streams_[{device, s}] = true;
  return s;
}

absl::Status FakeDeviceApi::DestroyStream(int device, StreamHandle stream) {
  absl::Status valid = CheckDevice(*this, device);
  if (!valid.ok()) return valid;
  absl::MutexLock lock(&mu_);
  if (streams_.erase({device, stream}) == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fake:", device, ": DestroyStream of stream ", stream,
        ", which CreateStream did not return on this device"));
  }
  return absl::OkStatus();
}

void FakeDeviceApi::SetHostCapacity(uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  host_capacity_ = bytes;
}

bool FakeDeviceApi::IsPinned(const void* p) {
  absl::MutexLock lock(&mu_);
  return InHostBlock(p);
}

uint64_t FakeDeviceApi::live_host_blocks() {
  absl::MutexLock lock(&mu_);
  return host_blocks_.size();
}

uint64_t FakeDeviceApi::host_allocs() {
  absl::MutexLock lock(&mu_);
  return host_allocs_;
}

uint64_t FakeDeviceApi::host_frees() {
  absl::MutexLock lock(&mu_);
  return host_frees_;
}

uint64_t FakeDeviceApi::pinned_copies() {
  absl::MutexLock lock(&mu_);
  return pinned_copies_;
}

uint64_t FakeDeviceApi::host_waits() {
  absl::MutexLock lock(&mu_);
  return host_waits_;
}

uint64_t FakeDeviceApi::live_streams() {
  absl::MutexLock lock(&mu_);
  return streams_.size();
}

}  // namespace cuda
}  // namespace ferry
