#include "ferry/tensor/cuda/event.h"

#include <utility>

#include "ferry/common/logging.h"

namespace ferry {
namespace cuda {

absl::StatusOr<StreamEvent> StreamEvent::Record(
    std::shared_ptr<DeviceMemoryApi> api, int device, StreamHandle stream) {
  if (api == nullptr) {
    return absl::InvalidArgumentError("StreamEvent: no device API");
  }
  absl::StatusOr<EventHandle> ev = api->RecordEvent(device, stream);
  if (!ev.ok()) return ev.status();
  StreamEvent e;
  e.api_ = std::move(api);
  e.device_ = device;
  e.event_ = *ev;
  e.done_ = false;
  return e;
}

StreamEvent::~StreamEvent() { Reset(); }

StreamEvent::StreamEvent(StreamEvent&& other) noexcept {
  *this = std::move(other);
}

StreamEvent& StreamEvent::operator=(StreamEvent&& other) noexcept {
  if (this != &other) {
    Reset();
    api_ = std::exchange(other.api_, nullptr);
    device_ = std::exchange(other.device_, -1);
    event_ = std::exchange(other.event_, 0);
    done_ = std::exchange(other.done_, true);
  }
  return *this;
}

void StreamEvent::Reset() {
  if (api_ != nullptr && event_ != 0) {
    absl::Status s = api_->DestroyEvent(device_, event_);
    if (!s.ok()) FERRY_LOG(WARNING) << "StreamEvent: " << s;
  }
  api_ = nullptr;
  device_ = -1;
  event_ = 0;
  done_ = true;
}

absl::StatusOr<bool> StreamEvent::Query() {
  if (done_) return true;
  absl::StatusOr<bool> d = api_->EventDone(device_, event_);
  if (!d.ok()) return d.status();
  done_ = *d;
  return *d;
}

absl::Status StreamEvent::Wait() {
  if (done_) return absl::OkStatus();
  absl::Status s = api_->WaitEvent(device_, event_);
  if (!s.ok()) return s;
  done_ = true;
  return absl::OkStatus();
}

absl::Status StreamEvent::MakeStreamWait(int device,
                                         StreamHandle stream) const {
  if (done_) return absl::OkStatus();
  return api_->StreamWaitEvent(device, stream, event_);
}

}  // namespace cuda
}  // namespace ferry
