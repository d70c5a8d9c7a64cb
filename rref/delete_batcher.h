// DeleteBatcher: the batching of a user's fork deletions per owner (a part
// of RRefContext, rref_context.h). A deletion queues for its owner; at most
// one batch per owner is in flight (a USER_DELETE, or a request to the owner
// carrying it in its RRef header); what queues meanwhile goes together, at
// once, when that batch ends. With no batch in flight a queued deletion
// waits up to the flush delay for a carrier before it is due alone. Needs
// no agent and no clock: callers pass the time, and the context's flusher
// thread waits for NextFlush() and sends what TakeDue() returns.
//
// Invariants (numbered as in the design note):
//  I6 a queued deletion is never lost: it is in exactly one of the owner's
//     queue or a batch handed out (Queue, Attach, EndBatch, TakeDue), until
//     its owner is reported failed (then it is dropped and counted);
//  B  at most one batch per owner is in flight, from the call that hands it
//     out until EndBatch(owner); an armed flush is due at most the flush
//     delay after the queueing (after FlushAll(): at once).
//
// Errors: none (a batch that failed is the caller's to send again; EndBatch
// only once it is answered). Thread safety: none; the caller serializes
// (RRefContext: its mutex, whose waiters watch changes()).
// Design: docs/design/rref_protocol.md ("The context's parts").
#ifndef FERRY_RREF_DELETE_BATCHER_H_
#define FERRY_RREF_DELETE_BATCHER_H_

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/time/time.h"
#include "ferry/common/ids.h"

namespace ferry::rref {

// Fork deletions for one owner: (rref id, fork id) pairs.
using DeleteBatch = std::vector<std::pair<GlobalId, GlobalId>>;

// The per-owner deletion batches (see the top of this file).
class DeleteBatcher {
 public:
  // `flush_delay`: how long a deletion waits for a carrier; zero: none.
  explicit DeleteBatcher(absl::Duration flush_delay);

  // Queues fork `fork_id` of `rref_id` for `owner` at `now`. Returns the
  // batch to send now (then in flight): when no batch to `owner` is in
  // flight and there is no delay (zero, or FlushAll). Otherwise empty: it
  // goes with the batch in flight's successor, or once its flush is due.
  DeleteBatch Queue(int owner, GlobalId rref_id, GlobalId fork_id,
                    absl::Time now);
  // What is queued for `owner` for a request to it to carry (then in
  // flight); empty when nothing is queued or a batch is in flight.
  DeleteBatch Attach(int owner);
  // What ending a batch leaves to do.
  struct Ended {
    DeleteBatch next;  // Queued meanwhile: to send at once (in flight).
    int dropped = 0;   // Deletions dropped with a failed owner.
  };
  // The batch in flight to `owner` was answered. `owner_failed`: what is
  // queued for it is dropped instead.
  Ended EndBatch(int owner, bool owner_failed);

  // When the next flush is due (InfiniteFuture: none armed); after
  // FlushAll, `now` if anything waits.
  absl::Time NextFlush(absl::Time now) const;
  // The batches due at `now` (each then in flight), by owner; adds to
  // `*dropped` the deletions of owners `is_failed` names, dropped instead.
  std::vector<std::pair<int, DeleteBatch>> TakeDue(
      absl::Time now, absl::FunctionRef<bool(int)> is_failed, int* dropped);
  // From now on nothing waits for a carrier (shutdown).
  void FlushAll();
  // Bumped whenever NextFlush() may have moved earlier (and by Poke()).
  uint64_t changes() const { return changes_; }
  void Poke() { ++changes_; }  // Wakes the waiters on changes().

  // Whether a batch to `owner` is in flight.
  bool in_flight(int owner) const;
  // Deletions queued and not handed out, over every owner.
  size_t num_queued() const;
  // Nothing queued and no batch in flight (leak checks).
  bool idle() const;

 private:
  struct PerOwner {
    bool in_flight = false;  // A USER_DELETE or a carrier.
    DeleteBatch queued;
    absl::Time flush_at = absl::InfiniteFuture();  // Queued, not in flight.
  };
  // Marks `q`'s queue in flight and returns it.
  static DeleteBatch Launch(PerOwner& q);

  const absl::Duration flush_delay_;
  bool flush_all_ = false;
  uint64_t changes_ = 0;
  std::map<int, PerOwner> queues_;
};

}  // namespace ferry::rref

#endif  // FERRY_RREF_DELETE_BATCHER_H_
