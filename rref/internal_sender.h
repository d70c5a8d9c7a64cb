// InternalSender: the retried sends of the RRef protocol's internal messages
// (fork request, child accept, user delete, and REMOTE_CALL's one attempt),
// a part of RRefContext (rref_context.h). It sends through a SendFn (the
// agent's Send, or a test's) and reports to a Ledger (the context: what is
// in flight, which peers failed), so it needs no agent.
//
// Invariants (numbered as in the design note):
//  I5 a message is retried on Unavailable (and, when retry_timeouts, on
//     DeadlineExceeded), each attempt bounded by its timeout, at most
//     max_attempts in all, and not after its peer is known failed; on
//     Unavailable with every retry spent (retry_timeouts) the peer is
//     reported failed (Ledger::GaveUp);
//  L  every message the ledger admitted (BeginMessage) ends exactly once
//     (EndMessage, after `done`); one to a failed peer is never sent (its
//     `done` gets Unavailable naming the message type).
//
// Lifetime: attempts hold the ledger's owner weakly; once it is gone a
// completing attempt only runs `done` with its result. The sender's configuration is
// shared with its attempts, so the sender itself may go first.
// Errors: `done` gets the last attempt's result (the transport's error).
// Thread safety: Send is safe from any thread; callbacks run on the send
// function's completion threads, never under a ledger lock.
// Design: docs/design/rref_protocol.md ("The context's parts").
#ifndef FERRY_RREF_INTERNAL_SENDER_H_
#define FERRY_RREF_INTERNAL_SENDER_H_

#include <functional>
#include <memory>
#include <optional>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "ferry/common/future.h"
#include "ferry/rpc/message.h"

namespace ferry::rref {

// Retried internal sends (see the top of this file).
class InternalSender {
 public:
  // Sends `message` to worker `to` with a deadline of `timeout`; completes
  // with the reply or an error. Called from any thread.
  using SendFn = std::function<Future<rpc::Message>(
      int to, rpc::Message message, absl::Duration timeout)>;
  // Runs once with the final result.
  using Done = absl::AnyInvocable<void(const Result<rpc::Message>&)>;

  // What the sender reports to, and asks of, its owner. Called without the
  // sender holding anything; each method takes the ledger's own lock.
  class Ledger {
   public:
    virtual ~Ledger() = default;
    // Counts a message to `to` as in flight; false (counting nothing) when
    // `to` is known failed.
    virtual bool BeginMessage(int to) = 0;
    // Counts one attempt of a message of `type`.
    virtual void CountAttempt(rpc::MessageType type) = 0;
    // Whether worker `to` is known failed.
    virtual bool IsFailed(int to) = 0;
    // Every retry to `to` failed with Unavailable, the last with `last`: it
    // is known failed now (the context reports it to its agent).
    virtual void GaveUp(int to, const absl::Status& last) = 0;
    // A message BeginMessage counted ended (after its `done` ran).
    virtual void EndMessage() = 0;
  };

  // The retry policy.
  struct Options {
    absl::Duration attempt_timeout = absl::Seconds(10);  // Default, each.
    int max_attempts = 5;  // Attempts per message, the first included.
  };

  // `send` must be callable from any thread.
  InternalSender(SendFn send, Options options);

  // Sends `message` to `to` for `ledger` (retried, I5), then runs `done`.
  // `ledger` must be alive during the call; `anchor` owns it: completions
  // use the ledger only while they can lock the anchor. `timeout`: per
  // attempt (default Options::attempt_timeout). `retry_timeouts`: false
  // retries Unavailable only and never reports the peer failed (REMOTE_CALL:
  // a retry after a timeout would fork its arguments again).
  void Send(Ledger& ledger, std::weak_ptr<const void> anchor, int to,
            rpc::Message message, Done done,
            std::optional<absl::Duration> timeout = std::nullopt,
            bool retry_timeouts = true) const;

 private:
  struct Config {
    SendFn send;
    Options options;
  };
  struct Pending;  // One message's state across its attempts.
  static void Try(const std::shared_ptr<Pending>& m, Ledger& ledger);

  std::shared_ptr<const Config> config_;
};

}  // namespace ferry::rref

#endif  // FERRY_RREF_INTERNAL_SENDER_H_
