#include "ferry/c10d/gloo/store_adapter.h"

#include <utility>

#include "gloo/common/error.h"

namespace ferry {
namespace c10d {

GlooStoreAdapter::GlooStoreAdapter(std::shared_ptr<ferry::Store> store,
                                   absl::Duration timeout)
    : store_(std::move(store)), timeout_(timeout) {}

GlooStoreAdapter::~GlooStoreAdapter() = default;

void GlooStoreAdapter::Throw(const absl::Status& status) {
  {
    MutexLock lock(&mu_);
    if (first_error_.ok()) first_error_ = status;
  }
  throw ::gloo::IoException(status.ToString());
}

void GlooStoreAdapter::set(const std::string& key,
                           const std::vector<char>& data) {
  absl::Status s =
      store_->Set(key, absl::string_view(data.data(), data.size()));
  if (!s.ok()) Throw(s);
}

std::vector<char> GlooStoreAdapter::get(const std::string& key) {
  std::vector<std::string> keys = {key};
  absl::Status waited = store_->Wait(keys, timeout_);
  if (!waited.ok()) Throw(waited);
  absl::StatusOr<std::string> value = store_->Get(key);
  if (!value.ok()) Throw(value.status());
  return std::vector<char>(value->begin(), value->end());
}

void GlooStoreAdapter::wait(const std::vector<std::string>& keys) {
  absl::Status s = store_->Wait(keys, timeout_);
  if (!s.ok()) Throw(s);
}

void GlooStoreAdapter::wait(const std::vector<std::string>& keys,
                            const std::chrono::milliseconds& timeout) {
  absl::Duration t =
      timeout.count() > 0 ? absl::Milliseconds(timeout.count()) : timeout_;
  absl::Status s = store_->Wait(keys, t);
  if (!s.ok()) Throw(s);
}

absl::Status GlooStoreAdapter::first_error() const {
  MutexLock lock(&mu_);
  return first_error_;
}

}  // namespace c10d
}  // namespace ferry
