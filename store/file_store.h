// FileStore: a Store kept in a file, shared by processes on one host.
//
// The file is an append-only log of operations (a magic header, then
// records: set, append, delete, queue push/pop, join/leave). Every handle
// keeps an in-memory copy of the state and the log offset it has applied;
// each operation takes flock(2) on the file (shared for reads, exclusive for
// writes), applies the records appended since, and, for a write, appends its
// own records. Because writers first catch up under the exclusive lock,
// read-modify-write operations (Add, CompareSet, QueuePop) are atomic across
// processes.
//
// Blocking operations re-check the file every 1 ms doubling to 10 ms (file
// changes are not observable portably): a waiter sees a change ~10 ms late.
//
// Lifetime and cleanup: Open() records a join, Clone() a new reference, and
// destruction a leave. The handle whose leave brings the live count to zero
// removes the file, provided at least `world_size` handles have joined
// (world_size <= 0: no such condition). So a fast rank that finishes before a
// slow one starts does not delete the rendezvous from under it. A crashed
// process never leaves, so its file stays behind (as with PyTorch's
// FileStore); delete stale files before reusing a path.
//
// The log is never compacted: every handle replays it whole when it opens, so
// FileStore suits rendezvous traffic (thousands of operations), not heavy
// key-value use.
//
// Thread safety: safe for concurrent use; operations on one handle are
// serialized by a mutex, different handles (in this or other processes) by
// the file lock. Queue keys are a namespace of their own (not in NumKeys,
// not seen by Check/Wait/Get).
#ifndef FERRY_STORE_FILE_STORE_H_
#define FERRY_STORE_FILE_STORE_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "ferry/common/sync.h"
#include "ferry/store/store.h"

namespace ferry {

// A Store in a file shared by processes of one host (see above).
class FileStore : public Store {
 public:
  // Opens (creating if absent) the store file at `path` and joins it as one
  // of `world_size` users. Errors: InvalidArgument for an empty path,
  // the errno text (as Unavailable/PermissionDenied/...) when the file cannot
  // be opened or locked, DataLoss when it is not a FileStore log.
  static absl::StatusOr<std::unique_ptr<FileStore>> Open(std::string path,
                                                         int world_size);
  // Leaves; the last user removes the file (see above). Errors are logged.
  ~FileStore() override;

  FileStore(const FileStore&) = delete;
  FileStore& operator=(const FileStore&) = delete;

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
  // A new handle with its own file descriptor (counted as a reference, not a
  // join); copies the timeout.
  absl::StatusOr<std::unique_ptr<Store>> Clone() override;
  // "file://<path>".
  std::string Describe() const override;

  const std::string& path() const { return path_; }  // The store file.

  // Calls on this handle that have found their keys (or queue item) missing
  // at least once and are still polling. A write made after this count
  // covers a call is what that call's next poll finds. For tests.
  int64_t BlockedCalls() const {
    return blocked_.load(std::memory_order_relaxed);
  }

 private:
  enum class LockMode { kShared, kExclusive };
  // An attempt run under the file lock after catching up: returns true when
  // done, or false with the keys it still waits for in *missing.
  using Attempt =
      std::function<absl::StatusOr<bool>(std::vector<std::string>* missing)>;

  FileStore(std::string path, int world_size);

  // Opens the file, locks it and appends a join (or reference) record;
  // retries when the file was removed between open and lock.
  absl::Status Attach(bool join);

  // Runs `fn` holding mu_ and the file lock, after applying new records.
  absl::StatusOr<bool> RunLocked(LockMode mode, const Attempt& fn);
  // Repeats `fn` with backoff until it returns true or `timeout` passes.
  absl::Status Poll(absl::string_view op, LockMode mode, absl::Duration timeout,
                    const Attempt& fn);

  absl::Status CatchUpLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Appends records (the file must be locked exclusively and caught up) and
  // applies them to the local copy.
  absl::Status AppendLocked(absl::string_view records)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ApplyLocked(absl::string_view bytes, int64_t base_offset,
                           size_t* consumed) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;
  const std::string name_;
  const int world_size_;

  Mutex mu_;
  // See BlockedCalls().
  std::atomic<int64_t> blocked_{0};
  int fd_ ABSL_GUARDED_BY(mu_) = -1;
  int64_t offset_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<std::string, std::string> kv_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::deque<std::string>> queues_
      ABSL_GUARDED_BY(mu_);
  int64_t live_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t joined_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ferry

#endif  // FERRY_STORE_FILE_STORE_H_
