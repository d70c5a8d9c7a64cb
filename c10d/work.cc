#include "ferry/c10d/work.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace ferry {
namespace c10d {
namespace {

// Callers get their own copy of the result rather than sharing its storage
// with the completing thread: Debian's Abseil is not built for TSAN, which
// then cannot see the shared reference count (see CopyStatus in backend.h).
absl::Status CopyOf(const absl::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(s.code(), std::string(s.message()));
}

}  // namespace

Work::Work(std::string description)
    : description_(std::move(description)), future_(promise_.GetFuture()) {}

Work::~Work() = default;

std::shared_ptr<Work> Work::Completed(std::string description,
                                      absl::Status status) {
  auto work = std::make_shared<Work>(std::move(description));
  work->Complete(std::move(status));
  return work;
}

bool Work::IsCompleted() const { return future_.IsReady(); }

bool Work::IsSuccess() const {
  return future_.IsReady() && future_.status().ok();
}

absl::Status Work::status() const {
  if (!future_.IsReady()) return absl::OkStatus();
  return CopyOf(future_.status());
}

absl::Status Work::Wait(absl::Duration timeout) {
  if (!future_.IsReady()) {
    const absl::Time start = absl::Now();
    PollBeforeBlocking(timeout);
    if (!future_.Wait(timeout - (absl::Now() - start)).ok()) {
      return absl::DeadlineExceededError(
          absl::StrCat(description_, " not complete after waiting ",
                       absl::FormatDuration(timeout)));
    }
  }
  return CopyOf(future_.status());
}

bool Work::Complete(absl::Status status) {
  return promise_.Set(std::move(status));
}

}  // namespace c10d
}  // namespace ferry
