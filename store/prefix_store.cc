#include "ferry/store/prefix_store.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "ferry/common/status.h"

namespace ferry {

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> store)
    : prefix_(std::move(prefix)), store_(std::move(store)) {
  SetTimeout(store_->Timeout());
}

PrefixStore::~PrefixStore() = default;

std::string PrefixStore::Describe() const {
  return absl::StrCat("prefix '", prefix_, "/' of ", store_->Describe());
}

std::string PrefixStore::Key(absl::string_view key) const {
  return absl::StrCat(prefix_, "/", key);
}

std::vector<std::string> PrefixStore::Keys(
    absl::Span<const std::string> keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const std::string& key : keys) out.push_back(Key(key));
  return out;
}

absl::Status PrefixStore::Wrap(const absl::Status& status) const {
  if (status.ok()) return status;
  return Annotate(status, Describe());
}

absl::Status PrefixStore::AwaitIfTimeoutDiffers(
    absl::Span<const std::string> keys) {
  if (Timeout() == store_->Timeout()) return absl::OkStatus();
  return store_->Wait(keys, Timeout());
}

absl::Status PrefixStore::Set(absl::string_view key, absl::string_view value) {
  return Wrap(store_->Set(Key(key), value));
}

absl::StatusOr<std::string> PrefixStore::Get(absl::string_view key) {
  const std::string keys[] = {Key(key)};
  RETURN_IF_ERROR(Wrap(AwaitIfTimeoutDiffers(keys)));
  absl::StatusOr<std::string> value = store_->Get(keys[0]);
  if (!value.ok()) return Wrap(value.status());
  return value;
}

absl::StatusOr<int64_t> PrefixStore::Add(absl::string_view key, int64_t delta) {
  absl::StatusOr<int64_t> value = store_->Add(Key(key), delta);
  if (!value.ok()) return Wrap(value.status());
  return value;
}

absl::StatusOr<std::string> PrefixStore::CompareSet(absl::string_view key,
                                                    absl::string_view expected,
                                                    absl::string_view desired) {
  absl::StatusOr<std::string> value =
      store_->CompareSet(Key(key), expected, desired);
  if (!value.ok()) return Wrap(value.status());
  return value;
}

absl::StatusOr<bool> PrefixStore::Check(absl::Span<const std::string> keys) {
  absl::StatusOr<bool> value = store_->Check(Keys(keys));
  if (!value.ok()) return Wrap(value.status());
  return value;
}

absl::Status PrefixStore::Wait(absl::Span<const std::string> keys,
                               std::optional<absl::Duration> timeout) {
  return Wrap(store_->Wait(Keys(keys), timeout.value_or(Timeout())));
}

absl::StatusOr<bool> PrefixStore::DeleteKey(absl::string_view key) {
  absl::StatusOr<bool> value = store_->DeleteKey(Key(key));
  if (!value.ok()) return Wrap(value.status());
  return value;
}

absl::StatusOr<int64_t> PrefixStore::NumKeys() {
  absl::StatusOr<int64_t> value = store_->NumKeys();
  if (!value.ok()) return Wrap(value.status());
  return value;
}

absl::StatusOr<std::vector<std::string>> PrefixStore::MultiGet(
    absl::Span<const std::string> keys) {
  const std::vector<std::string> prefixed = Keys(keys);
  RETURN_IF_ERROR(Wrap(AwaitIfTimeoutDiffers(prefixed)));
  absl::StatusOr<std::vector<std::string>> values = store_->MultiGet(prefixed);
  if (!values.ok()) return Wrap(values.status());
  return values;
}

absl::Status PrefixStore::MultiSet(absl::Span<const std::string> keys,
                                   absl::Span<const std::string> values) {
  return Wrap(store_->MultiSet(Keys(keys), values));
}

absl::Status PrefixStore::Append(absl::string_view key,
                                 absl::string_view value) {
  return Wrap(store_->Append(Key(key), value));
}

absl::Status PrefixStore::QueuePush(absl::string_view key,
                                    absl::string_view value) {
  return Wrap(store_->QueuePush(Key(key), value));
}

absl::StatusOr<std::string> PrefixStore::QueuePop(
    absl::string_view key, bool block, std::optional<absl::Duration> timeout) {
  absl::StatusOr<std::string> value =
      store_->QueuePop(Key(key), block, timeout.value_or(Timeout()));
  if (!value.ok()) return Wrap(value.status());
  return value;
}

absl::StatusOr<int64_t> PrefixStore::QueueLen(absl::string_view key) {
  absl::StatusOr<int64_t> value = store_->QueueLen(Key(key));
  if (!value.ok()) return Wrap(value.status());
  return value;
}

absl::StatusOr<std::unique_ptr<Store>> PrefixStore::Clone() {
  absl::StatusOr<std::unique_ptr<Store>> underlying = store_->Clone();
  if (!underlying.ok()) return Wrap(underlying.status());
  auto clone = std::make_unique<PrefixStore>(
      prefix_, std::shared_ptr<Store>(std::move(*underlying)));
  clone->SetTimeout(Timeout());
  return clone;
}

}  // namespace ferry
