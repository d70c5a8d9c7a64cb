// PrefixStore: a namespacing decorator over another Store.
//
// Every key `k` becomes `<prefix>/k` in the underlying store, so several
// users (process groups, RPC agents) can share one store without clashes.
// Queue keys are prefixed the same way. NumKeys is the underlying store's
// count (all namespaces), as in PyTorch. Errors from the underlying store are
// returned with this store's Describe() prepended; they name the prefixed
// keys.
//
// Thread safety: as safe as the underlying store (every Ferry store is safe
// for concurrent use). The underlying store is shared: it stays alive as long
// as this handle does. Clone() clones the underlying store (a new connection
// for TCPStore) and wraps it with the same prefix.
#ifndef FERRY_STORE_PREFIX_STORE_H_
#define FERRY_STORE_PREFIX_STORE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "ferry/store/store.h"

namespace ferry {

// A view of another Store whose keys all carry a prefix (see above).
class PrefixStore : public Store {
 public:
  // `store` must not be null. The timeout starts as the underlying store's;
  // blocking calls use this handle's Timeout().
  PrefixStore(std::string prefix, std::shared_ptr<Store> store);
  ~PrefixStore() override;

  PrefixStore(const PrefixStore&) = delete;
  PrefixStore& operator=(const PrefixStore&) = delete;

  absl::Status Set(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<std::string> Get(absl::string_view key) override;
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) override;
  absl::StatusOr<std::string> CompareSet(absl::string_view key,
                                         absl::string_view expected,
                                         absl::string_view desired) override;
  absl::StatusOr<bool> Check(absl::Span<const std::string> keys) override;
  using Store::Wait;
  absl::Status Wait(absl::Span<const std::string> keys,
                    std::optional<absl::Duration> timeout) override;
  absl::StatusOr<bool> DeleteKey(absl::string_view key) override;
  absl::StatusOr<int64_t> NumKeys() override;
  absl::StatusOr<std::vector<std::string>> MultiGet(
      absl::Span<const std::string> keys) override;
  absl::Status MultiSet(absl::Span<const std::string> keys,
                        absl::Span<const std::string> values) override;
  absl::Status Append(absl::string_view key, absl::string_view value) override;
  absl::Status QueuePush(absl::string_view key,
                         absl::string_view value) override;
  absl::StatusOr<std::string> QueuePop(
      absl::string_view key, bool block,
      std::optional<absl::Duration> timeout = std::nullopt) override;
  absl::StatusOr<int64_t> QueueLen(absl::string_view key) override;
  absl::StatusOr<std::unique_ptr<Store>> Clone() override;
  // "prefix 'pg0/' of <underlying Describe()>".
  std::string Describe() const override;

  const std::string& prefix() const { return prefix_; }  // As given.
  // The store the keys go to, with the prefix.
  const std::shared_ptr<Store>& underlying() const { return store_; }

 private:
  std::string Key(absl::string_view key) const;
  std::vector<std::string> Keys(absl::Span<const std::string> keys) const;
  absl::Status Wrap(const absl::Status& status) const;
  // Blocking calls must honour this handle's Timeout(), but the underlying
  // handle is shared, so its timeout is never changed. When the two differ,
  // Get/MultiGet first Wait(keys, Timeout()) and then read.
  absl::Status AwaitIfTimeoutDiffers(absl::Span<const std::string> keys);

  const std::string prefix_;
  const std::shared_ptr<Store> store_;
};

}  // namespace ferry

#endif  // FERRY_STORE_PREFIX_STORE_H_
