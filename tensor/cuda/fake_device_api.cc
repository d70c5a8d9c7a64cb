#include "ferry/tensor/cuda/fake_device_api.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ferry {
namespace cuda {

FakeDeviceApi::FakeDeviceApi(int devices, uint64_t capacity_bytes)
    : devices_(devices), capacity_(capacity_bytes) {}

FakeDeviceApi::~FakeDeviceApi() {
  absl::MutexLock lock(&mu_);
  for (auto& [ptr, where] : blocks_) std::free(ptr);
  for (auto& [ptr, size] : host_blocks_) std::free(const_cast<char*>(ptr));
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
  absl::MutexLock lock(&mu_);
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
  if (!CompleteStream(device, stream)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "fake:", device, ": stream ", stream,
        " waits for an event whose stream the test has not completed"));
  }
  return absl::OkStatus();
}

bool FakeDeviceApi::CompleteStream(int device, StreamHandle stream) {
  absl::MutexLock lock(&mu_);
  return RunQueue({device, stream});
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

uint64_t FakeDeviceApi::live_streams() {
  absl::MutexLock lock(&mu_);
  return streams_.size();
}

}  // namespace cuda
}  // namespace ferry
