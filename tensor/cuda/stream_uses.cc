#include "ferry/tensor/cuda/stream_uses.h"

#include <algorithm>

#include "ferry/common/logging.h"

namespace ferry {
namespace cuda {

void StreamUses::Add(int device, StreamHandle stream) {
  const std::pair<int, StreamHandle> use(device, stream);
  if (std::find(uses_.begin(), uses_.end(), use) == uses_.end()) {
    uses_.push_back(use);
  }
}

absl::Status StreamUses::RecordEvents(DeviceMemoryApi& api) {
  const size_t before = events_.size();
  for (const auto& [device, stream] : uses_) {
    absl::StatusOr<EventHandle> ev = api.RecordEvent(device, stream);
    if (!ev.ok()) {
      while (events_.size() > before) {
        const auto [d, e] = events_.back();
        api.DestroyEvent(d, e).IgnoreError();  // Never queried: harmless.
        events_.pop_back();
      }
      return ev.status();
    }
    events_.emplace_back(device, *ev);
  }
  uses_.clear();
  return absl::OkStatus();
}

absl::StatusOr<bool> StreamUses::EventsDone(DeviceMemoryApi& api) const {
  for (const auto& [device, event] : events_) {
    absl::StatusOr<bool> done = api.EventDone(device, event);
    if (!done.ok() || !*done) return done;
  }
  return true;
}

absl::Status StreamUses::Wait(DeviceMemoryApi& api) const {
  for (const auto& [device, event] : events_) {
    absl::Status s = api.WaitEvent(device, event);
    if (!s.ok()) return s;
  }
  for (const auto& [device, stream] : uses_) {
    absl::Status s = api.SynchronizeStream(device, stream);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

void StreamUses::DestroyEvents(DeviceMemoryApi& api) {
  for (const auto& [device, event] : events_) {
    absl::Status s = api.DestroyEvent(device, event);
    if (!s.ok()) FERRY_LOG(WARNING) << api.name() << ":" << device << ": " << s;
  }
  events_.clear();
}

}  // namespace cuda
}  // namespace ferry
