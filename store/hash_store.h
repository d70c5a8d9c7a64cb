// HashStore: an in-process Store backed by a hash map.
//
// For tests and single-process jobs (several workers in one process meeting
// through one store). Blocking operations sleep on a condition variable that
// every mutation signals; nothing polls.
//
// Thread safety: safe for concurrent use. Clone() returns a handle sharing
// the same data; the data lives until the last handle is destroyed. Queue
// keys are a namespace of their own: they do not count in NumKeys and are
// not seen by Check/Wait/Get.
#ifndef FERRY_STORE_HASH_STORE_H_
#define FERRY_STORE_HASH_STORE_H_

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

// An in-memory Store for the threads of one process (see above).
class HashStore : public Store {
 public:
  // A new, empty store.
  HashStore();
  ~HashStore() override;

  HashStore(const HashStore&) = delete;
  HashStore& operator=(const HashStore&) = delete;

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
  // Shares this store's data; copies the timeout. Never fails.
  absl::StatusOr<std::unique_ptr<Store>> Clone() override;
  // "hash:0x<address of the shared data>".
  std::string Describe() const override;

  // Calls (on this handle or any clone) blocked right now waiting for a key
  // or a queue item. Lets a test wake a waiter only once it is parked.
  int64_t BlockedCalls() const;

 private:
  struct State;
  explicit HashStore(std::shared_ptr<State> state);

  const std::shared_ptr<State> state_;
};

}  // namespace ferry

#endif  // FERRY_STORE_HASH_STORE_H_
