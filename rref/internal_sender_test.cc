// InternalSender without an agent: a scripted send function and a counting
// ledger. Every sequence of attempt outcomes up to max_attempts, a peer
// failing between attempts, a ledger that goes mid-flight; each run ends
// with a leak check (nothing in flight, `done` run once).
#include "ferry/rref/internal_sender.h"

#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "ferry/common/sync.h"
#include "gtest/gtest.h"

namespace ferry::rref {
namespace {

using rpc::Message;
constexpr rpc::MessageType kType = rpc::MessageType::kFirstLayerType;

class FakeLedger : public InternalSender::Ledger {
 public:
  bool BeginMessage(int to) override {
    MutexLock lock(&mu_);
    if (failed_.count(to)) return false;
    ++in_flight_;
    return true;
  }
  void CountAttempt(rpc::MessageType type) override {
    MutexLock lock(&mu_);
    ++attempts_[type];
  }
  bool IsFailed(int to) override {
    MutexLock lock(&mu_);
    return failed_.count(to) > 0;
  }
  void GaveUp(int to, const absl::Status& last) override {
    MutexLock lock(&mu_);
    ++gave_up_;
    failed_.insert(to);
    last_give_up_ = last;
  }
  void EndMessage() override {
    MutexLock lock(&mu_);
    --in_flight_;
  }
  void Fail(int to) {
    MutexLock lock(&mu_);
    failed_.insert(to);
  }
  int in_flight() const {
    MutexLock lock(&mu_);
    return in_flight_;
  }
  int attempts() const {
    MutexLock lock(&mu_);
    auto it = attempts_.find(kType);
    return it == attempts_.end() ? 0 : it->second;
  }
  int gave_up() const {
    MutexLock lock(&mu_);
    return gave_up_;
  }
  // The last attempt's status GaveUp was given (OK: never called).
  absl::Status last_give_up() const {
    MutexLock lock(&mu_);
    return last_give_up_;
  }

 private:
  mutable Mutex mu_;
  std::set<int> failed_ ABSL_GUARDED_BY(mu_);
  std::map<rpc::MessageType, int> attempts_ ABSL_GUARDED_BY(mu_);
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  int gave_up_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status last_give_up_ ABSL_GUARDED_BY(mu_);
};

// The send function: answers each attempt with the next scripted status
// (OK when the script is spent), recording the timeouts it was given.
struct Script {
  std::deque<absl::Status> outcomes;
  std::vector<absl::Duration> timeouts;
  std::function<void(int attempt)> before;  // Runs before answering.

  InternalSender::SendFn Fn() {
    return [this](int to, Message m, absl::Duration timeout) {
      EXPECT_EQ(to, 7);
      EXPECT_EQ(m.type, kType);
      timeouts.push_back(timeout);
      if (before) before(static_cast<int>(timeouts.size()));
      absl::Status s = absl::OkStatus();
      if (!outcomes.empty()) {
        s = outcomes.front();
        outcomes.pop_front();
      }
      return s.ok() ? MakeReadyFuture<Message>(Message())
                    : MakeErrorFuture<Message>(s);
    };
  }
};

Message Msg() {
  Message m;
  m.type = kType;
  return m;
}

// Every sequence of three outcomes (OK, Unavailable, DeadlineExceeded,
// NotFound) with max_attempts 3, retrying timeouts or not: the attempts,
// the final result and the failure report follow I5.
TEST(InternalSenderTest, EveryOutcomeSequence) {
  const absl::Status kinds[] = {absl::OkStatus(),
                                absl::UnavailableError("down"),
                                absl::DeadlineExceededError("slow"),
                                absl::NotFoundError("no")};
  int runs = 0;
  for (bool retry_timeouts : {true, false}) {
    for (int a = 0; a < 4; ++a) {
      for (int b = 0; b < 4; ++b) {
        for (int c = 0; c < 4; ++c) {
          const std::vector<absl::Status> seq = {kinds[a], kinds[b], kinds[c]};
          // The model: retry while transient and attempts remain.
          int expect_attempts = 0;
          absl::StatusCode expect_code = absl::StatusCode::kOk;
          for (const absl::Status& s : seq) {
            ++expect_attempts;
            expect_code = s.code();
            const bool transient =
                s.code() == absl::StatusCode::kUnavailable ||
                (retry_timeouts &&
                 s.code() == absl::StatusCode::kDeadlineExceeded);
            if (!transient) break;
          }
          const bool expect_gave_up =
              expect_code == absl::StatusCode::kUnavailable && retry_timeouts;
          const std::string what = absl::StrCat(a, b, c, " retry_timeouts=",
                                                retry_timeouts);

          Script script;
          script.outcomes = {seq.begin(), seq.end()};
          InternalSender sender(script.Fn(), {absl::Seconds(3), 3});
          auto ledger = std::make_shared<FakeLedger>();
          int done_runs = 0;
          absl::StatusCode got = absl::StatusCode::kUnknown;
          sender.Send(
              *ledger, ledger, 7, Msg(),
              [&](const Result<Message>& r) {
                ++done_runs;
                got = r.status().code();
              },
              std::nullopt, retry_timeouts);
          EXPECT_EQ(done_runs, 1) << what;
          EXPECT_EQ(got, expect_code) << what;
          EXPECT_EQ(ledger->attempts(), expect_attempts) << what;
          EXPECT_EQ(script.timeouts.size(),
                    static_cast<size_t>(expect_attempts))
              << what;
          EXPECT_EQ(ledger->gave_up(), expect_gave_up ? 1 : 0) << what;
          // The report carries the last attempt's error (the agent records
          // it as the peer's cause).
          if (expect_gave_up) {
            EXPECT_EQ(ledger->last_give_up().code(),
                      absl::StatusCode::kUnavailable)
                << what;
            EXPECT_EQ(ledger->last_give_up().message(), "down") << what;
          }
          EXPECT_EQ(ledger->in_flight(), 0) << what;  // Leak check.
          ++runs;
        }
      }
    }
  }
  EXPECT_EQ(runs, 128);
}

TEST(InternalSenderTest, NoRetryOnceThePeerIsKnownFailed) {
  Script script;
  script.outcomes = {absl::UnavailableError("a"), absl::UnavailableError("b"),
                     absl::UnavailableError("c")};
  auto ledger = std::make_shared<FakeLedger>();
  // Another path (the agent's failure detector) reports the peer during
  // the second attempt.
  script.before = [&](int attempt) {
    if (attempt == 2) ledger->Fail(7);
  };
  InternalSender sender(script.Fn(), {absl::Seconds(1), 5});
  absl::Status got;
  sender.Send(*ledger, ledger, 7, Msg(),
              [&](const Result<Message>& r) { got = r.status(); });
  EXPECT_EQ(script.timeouts.size(), 2u);
  EXPECT_EQ(got.message(), "b");
  EXPECT_EQ(ledger->in_flight(), 0);
  // A later message to it is never sent, and says why.
  sender.Send(*ledger, ledger, 7, Msg(),
              [&](const Result<Message>& r) { got = r.status(); });
  EXPECT_EQ(script.timeouts.size(), 2u);
  EXPECT_EQ(got.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(got.message().find("not sending"), std::string::npos) << got;
  EXPECT_EQ(ledger->in_flight(), 0);
}

TEST(InternalSenderTest, TimeoutPerAttemptDefaultsToTheOptions) {
  Script script;
  script.outcomes = {absl::DeadlineExceededError("slow")};
  InternalSender sender(script.Fn(), {absl::Seconds(4), 3});
  auto ledger = std::make_shared<FakeLedger>();
  sender.Send(*ledger, ledger, 7, Msg(), nullptr);
  sender.Send(*ledger, ledger, 7, Msg(), nullptr, absl::Milliseconds(5));
  EXPECT_EQ(script.timeouts,
            (std::vector<absl::Duration>{absl::Seconds(4), absl::Seconds(4),
                                         absl::Milliseconds(5)}));
  EXPECT_EQ(ledger->in_flight(), 0);
}

// The ledger's owner goes while an attempt is out: the completion runs
// `done` with its result and neither retries nor touches the ledger.
TEST(InternalSenderTest, OwnerGoneMidFlightOnlyRunsDone) {
  Promise<Message> reply;
  int sends = 0;
  InternalSender sender(
      [&](int, Message, absl::Duration) {
        ++sends;
        return reply.GetFuture();
      },
      {absl::Seconds(1), 5});
  FakeLedger ledger;
  auto anchor = std::make_shared<int>(0);
  absl::StatusCode got = absl::StatusCode::kOk;
  sender.Send(ledger, anchor, 7, Msg(), [&](const Result<Message>& r) {
    got = r.status().code();
  });
  EXPECT_EQ(ledger.in_flight(), 1);
  anchor.reset();
  reply.Set(absl::UnavailableError("down"));
  EXPECT_EQ(got, absl::StatusCode::kUnavailable);
  EXPECT_EQ(sends, 1);
  EXPECT_EQ(ledger.gave_up(), 0);
  EXPECT_EQ(ledger.in_flight(), 1);  // Not ended: its owner is gone.
}

// Sends from several threads, answered from another: each message's first
// attempt fails with Unavailable (retried), its second succeeds; every
// message ends once and nothing stays in flight.
TEST(InternalSenderTest, ConcurrentSendsAllEnd) {
  struct Out {
    Promise<Message> reply;
    bool fail = false;  // A first attempt.
  };
  Mutex mu;
  std::vector<Out> pending;  // Guarded by mu.
  std::set<int64_t> tried;  // Message ids seen; guarded by mu.
  InternalSender sender(
      [&](int, Message m, absl::Duration) {
        Out out;
        Future<Message> f = out.reply.GetFuture();
        MutexLock lock(&mu);
        out.fail = tried.insert(*m.payload.if_int()).second;
        pending.push_back(std::move(out));
        return f;
      },
      {absl::Seconds(1), 3});
  auto ledger = std::make_shared<FakeLedger>();
  std::atomic<int> done{0};
  constexpr int kThreads = 4, kEach = 50;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        Message m = Msg();
        m.payload = Value::Int(t * kEach + i);
        sender.Send(*ledger, ledger, 7, std::move(m),
                    [&](const Result<Message>& r) {
                      EXPECT_TRUE(r.ok()) << r.status();
                      ++done;
                    });
      }
    });
  }
  // Answer until every message is done, bounded in time.
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (done.load() < kThreads * kEach && absl::Now() < deadline) {
    std::vector<Out> batch;
    {
      MutexLock lock(&mu);
      auto some = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
        return !pending.empty();
      };
      mu.AwaitWithTimeout(absl::Condition(&some), absl::Milliseconds(100));
      batch.swap(pending);
    }
    for (Out& out : batch) {
      if (out.fail) {
        out.reply.Set(absl::UnavailableError("first attempt"));
      } else {
        out.reply.SetValue(Message());
      }
    }
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(done.load(), kThreads * kEach);
  EXPECT_EQ(ledger->attempts(), 2 * kThreads * kEach);
  EXPECT_EQ(ledger->in_flight(), 0);
  EXPECT_EQ(ledger->gave_up(), 0);
}

}  // namespace
}  // namespace ferry::rref
