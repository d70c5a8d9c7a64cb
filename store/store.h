// Store: the key-value rendezvous every Ferry layer meets through.
//
// Semantics follow torch.distributed's Store: values are byte strings; Get
// and Wait block until the keys exist or the timeout passes; Add keeps an
// int64 as decimal text; queues are keyed FIFOs of byte strings.
//
// Errors: operations return absl::Status / StatusOr. A timeout is
// DeadlineExceeded and its message names the keys still missing, the store
// (its address or path) and the time waited. A broken connection is
// Unavailable. Limits (key length, value size, keys per request) give
// InvalidArgument or ResourceExhausted naming the limit.
//
// Thread safety: every implementation is safe for concurrent use from many
// threads. Clone() returns an independent handle (for TCPStore a new
// connection) to the same underlying store; the clone may outlive the
// original.
#ifndef FERRY_STORE_STORE_H_
#define FERRY_STORE_STORE_H_

#include <atomic>
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

namespace ferry {

// The store interface; implementations: TcpStore, FileStore, HashStore,
// PrefixStore (store.h at the repository's root includes them all).
class Store {
 public:
  // PyTorch's default store timeout.
  static constexpr absl::Duration kDefaultTimeout = absl::Seconds(300);

  virtual ~Store() = default;

  // Stores `value` at `key`, replacing any value there.
  virtual absl::Status Set(absl::string_view key, absl::string_view value) = 0;

  // Waits (up to Timeout()) for `key` to exist, then returns its value.
  virtual absl::StatusOr<std::string> Get(absl::string_view key) = 0;

  // Adds `delta` to the int64 stored as decimal text at `key` (absent: 0) and
  // returns the new value. A non-numeric existing value is InvalidArgument.
  virtual absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) = 0;

  // Atomically: if the current value equals `expected` (or the key is absent
  // and `expected` is empty), store `desired`. Returns the value now stored
  // (`desired` on success; the current value, or `expected` when the key is
  // absent and `expected` is non-empty, otherwise) — PyTorch's semantics.
  virtual absl::StatusOr<std::string> CompareSet(absl::string_view key,
                                                 absl::string_view expected,
                                                 absl::string_view desired) = 0;

  // Non-blocking: true iff every key exists.
  virtual absl::StatusOr<bool> Check(absl::Span<const std::string> keys) = 0;

  // Waits until every key exists; `timeout` nullopt means Timeout().
  virtual absl::Status Wait(absl::Span<const std::string> keys,
                            std::optional<absl::Duration> timeout) = 0;
  // Wait with Timeout().
  absl::Status Wait(absl::Span<const std::string> keys) {
    return Wait(keys, std::nullopt);
  }

  // Returns true if the key existed.
  virtual absl::StatusOr<bool> DeleteKey(absl::string_view key) = 0;

  // The number of keys (queues not counted).
  virtual absl::StatusOr<int64_t> NumKeys() = 0;

  // Waits (up to Timeout()) for all keys; values in the order of `keys`.
  virtual absl::StatusOr<std::vector<std::string>> MultiGet(
      absl::Span<const std::string> keys) = 0;
  // Set for each key and value (same lengths, else InvalidArgument).
  virtual absl::Status MultiSet(absl::Span<const std::string> keys,
                                absl::Span<const std::string> values) = 0;

  // Appends to the value at `key` (creating it).
  virtual absl::Status Append(absl::string_view key, absl::string_view value) = 0;

  // Appends `value` to the queue `key` (creating it).
  virtual absl::Status QueuePush(absl::string_view key, absl::string_view value) = 0;
  // Pops the oldest item. Blocking: waits up to `timeout` (nullopt:
  // Timeout()). Non-blocking on an empty queue: NotFound naming the key.
  virtual absl::StatusOr<std::string> QueuePop(
      absl::string_view key, bool block,
      std::optional<absl::Duration> timeout = std::nullopt) = 0;
  // The number of items in the queue `key` (absent: 0).
  virtual absl::StatusOr<int64_t> QueueLen(absl::string_view key) = 0;

  // A new, independent handle to the same store.
  virtual absl::StatusOr<std::unique_ptr<Store>> Clone() = 0;

  // Human-readable identity used in error messages ("tcp://127.0.0.1:29500",
  // "file:///tmp/x", "hash:0x...", "prefix 'pg0/' of ...").
  virtual std::string Describe() const = 0;

  // The default timeout of blocking operations on this handle.
  absl::Duration Timeout() const { return absl::Nanoseconds(timeout_ns_.load()); }
  // Sets Timeout(); safe from any thread.
  void SetTimeout(absl::Duration timeout) {
    timeout_ns_.store(absl::ToInt64Nanoseconds(timeout));
  }

 private:
  std::atomic<int64_t> timeout_ns_{absl::ToInt64Nanoseconds(kDefaultTimeout)};
};

}  // namespace ferry

#endif  // FERRY_STORE_STORE_H_
