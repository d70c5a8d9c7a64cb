#include "ferry/tensor/cuda/fake_device_api.h"

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
  events_[id] = Event{device, stream, ++recorded_[{device, stream}]};
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
  copies_[{device, stream}].push_back(Copy{dst, src, nbytes});
  return absl::OkStatus();
}

absl::Status FakeDeviceApi::SynchronizeStream(int device, StreamHandle stream) {
  absl::Status valid = CheckDevice(*this, device);
  if (!valid.ok()) return valid;
  CompleteStream(device, stream);
  return absl::OkStatus();
}

void FakeDeviceApi::CompleteStream(int device, StreamHandle stream) {
  absl::MutexLock lock(&mu_);
  std::vector<Copy>& queued = copies_[{device, stream}];
  for (const Copy& c : queued) std::memcpy(c.dst, c.src, c.nbytes);
  queued.clear();
  completed_[{device, stream}] = recorded_[{device, stream}];
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

}  // namespace cuda
}  // namespace ferry
