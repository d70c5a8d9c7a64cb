// Globally unique ids: 16 bits of worker id, 48 bits of a per-worker counter.
//
// Used for RRef ids, fork ids, autograd context and message ids. Ids minted by
// different workers never collide; one generator never repeats an id. A
// generator belongs to one worker (no process-wide state), so several workers
// may share a process.
//
// Thread safety: GlobalId is a value type. IdGenerator::Next is safe to call
// concurrently.
#ifndef FERRY_COMMON_IDS_H_
#define FERRY_COMMON_IDS_H_

#include <atomic>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace ferry {

// A worker id and a 48-bit local id in one 64-bit value (see above).
class GlobalId {
 public:
  static constexpr int kLocalBits = 48;  // Bits of the local id.
  // Largest local id.
  static constexpr uint64_t kMaxLocal = (uint64_t{1} << kLocalBits) - 1;
  static constexpr uint64_t kMaxWorker = 0xFFFF;  // Largest worker id.

  constexpr GlobalId() = default;
  // `local_id` is cut to kLocalBits.
  constexpr GlobalId(uint16_t worker_id, uint64_t local_id)
      : value_((uint64_t{worker_id} << kLocalBits) | (local_id & kMaxLocal)) {}
  // The id whose value() is `value`.
  static constexpr GlobalId FromValue(uint64_t value) {
    GlobalId id;
    id.value_ = value;
    return id;
  }

  constexpr uint64_t value() const { return value_; }  // Both parts.
  // The minting worker.
  constexpr uint16_t worker_id() const {
    return static_cast<uint16_t>(value_ >> kLocalBits);
  }
  // The counter part.
  constexpr uint64_t local_id() const { return value_ & kMaxLocal; }

  std::string ToString() const;  // "GlobalId(worker=3, local=17)"

  friend constexpr bool operator==(GlobalId a, GlobalId b) {
    return a.value_ == b.value_;
  }
  friend constexpr bool operator!=(GlobalId a, GlobalId b) { return !(a == b); }
  friend constexpr bool operator<(GlobalId a, GlobalId b) {
    return a.value_ < b.value_;
  }
  template <typename H>
  friend H AbslHashValue(H h, GlobalId id) {
    return H::combine(std::move(h), id.value_);
  }

 private:
  uint64_t value_ = 0;
};

// Mints one worker's GlobalIds.
class IdGenerator {
 public:
  // Ids start at local id `first_local` (default 0).
  explicit IdGenerator(uint16_t worker_id, uint64_t first_local = 0)
      : worker_id_(worker_id), next_(first_local) {}

  // The next id; ResourceExhausted (naming the worker) once 2^48 ids have
  // been minted, rather than wrapping into ids already in use.
  absl::StatusOr<GlobalId> Next();

  uint16_t worker_id() const { return worker_id_; }  // As constructed.

 private:
  const uint16_t worker_id_;
  std::atomic<uint64_t> next_;
};

}  // namespace ferry

#endif  // FERRY_COMMON_IDS_H_
