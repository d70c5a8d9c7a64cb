#include "ferry/rref/internal_sender.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ferry::rref {

struct InternalSender::Pending {
  std::shared_ptr<const Config> config;
  Ledger* ledger = nullptr;  // Used while `anchor` can be locked.
  std::weak_ptr<const void> anchor;
  int to = -1;
  rpc::Message message;  // Copied for each attempt.
  int attempt = 0;  // Attempts made.
  Done done;
  absl::Duration timeout;
  bool retry_timeouts = true;
};

InternalSender::InternalSender(SendFn send, Options options)
    : config_(std::make_shared<const Config>(
          Config{std::move(send), std::move(options)})) {}

void InternalSender::Send(Ledger& ledger, std::weak_ptr<const void> anchor,
                          int to,
                          rpc::Message message, Done done,
                          std::optional<absl::Duration> timeout,
                          bool retry_timeouts) const {
  if (!ledger.BeginMessage(to)) {
    if (done) {
      done(absl::UnavailableError(
          absl::StrCat("worker is known dead; not sending ",
                       rpc::MessageTypeName(message.type))));
    }
    return;
  }
  auto m = std::make_shared<Pending>();
  m->config = config_;
  m->ledger = &ledger;
  m->anchor = std::move(anchor);
  m->to = to;
  m->message = std::move(message);
  m->done = std::move(done);
  m->timeout = timeout.value_or(config_->options.attempt_timeout);
  m->retry_timeouts = retry_timeouts;
  Try(m, ledger);
}

void InternalSender::Try(const std::shared_ptr<Pending>& m, Ledger& ledger) {
  ++m->attempt;
  ledger.CountAttempt(m->message.type);
  m->config->send(m->to, m->message, m->timeout)
      .OnComplete([m](const Result<rpc::Message>& r) {
        std::shared_ptr<const void> owner = m->anchor.lock();
        if (owner == nullptr) {  // The ledger is gone: no retry, no count.
          if (m->done) m->done(r);
          return;
        }
        Ledger* ledger = m->ledger;
        const absl::StatusCode code = r.status().code();
        const bool transient =
            code == absl::StatusCode::kUnavailable ||
            (m->retry_timeouts && code == absl::StatusCode::kDeadlineExceeded);
        if (transient && m->attempt < m->config->options.max_attempts &&
            !ledger->IsFailed(m->to)) {
          Try(m, *ledger);
          return;
        }
        if (code == absl::StatusCode::kUnavailable && m->retry_timeouts) {
          ledger->GaveUp(m->to, r.status());  // Retries exhausted.
        }
        if (m->done) m->done(r);
        ledger->EndMessage();
      });
}

}  // namespace ferry::rref
