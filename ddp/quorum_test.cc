// Quorum over an in-memory HashStore: first generation, dead members left
// out, stale members refused, step verdicts, joiners, bounded waits.
#include "ferry/ddp/quorum.h"

#include <atomic>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "ferry/common/poll.h"
#include "ferry/store/hash_store.h"
#include "gtest/gtest.h"

namespace ferry::ddp {
namespace {

// A Store whose heartbeat writes can be dropped (a stalled process, as
// SIGSTOP would stall it), sharing the flag with its clones.
class PausableStore : public Store {
 public:
  PausableStore(std::shared_ptr<Store> inner,
                std::shared_ptr<std::atomic<bool>> paused)
      : inner_(std::move(inner)), paused_(std::move(paused)) {}
  absl::Status Set(absl::string_view key, absl::string_view value) override {
    if (*paused_ && absl::StrContains(key, "/hb/")) return absl::OkStatus();
    return inner_->Set(key, value);
  }
  absl::StatusOr<std::string> Get(absl::string_view key) override {
    return inner_->Get(key);
  }
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) override {
    return inner_->Add(key, delta);
  }
  absl::StatusOr<std::string> CompareSet(absl::string_view key,
                                         absl::string_view expected,
                                         absl::string_view desired) override {
    return inner_->CompareSet(key, expected, desired);
  }
  absl::StatusOr<bool> Check(absl::Span<const std::string> keys) override {
    return inner_->Check(keys);
  }
  using Store::Wait;
  absl::Status Wait(absl::Span<const std::string> keys,
                    std::optional<absl::Duration> timeout) override {
    return inner_->Wait(keys, timeout);
  }
  absl::StatusOr<bool> DeleteKey(absl::string_view key) override {
    return inner_->DeleteKey(key);
  }
  absl::StatusOr<int64_t> NumKeys() override { return inner_->NumKeys(); }
  absl::StatusOr<std::vector<std::string>> MultiGet(
      absl::Span<const std::string> keys) override {
    return inner_->MultiGet(keys);
  }
  absl::Status MultiSet(absl::Span<const std::string> keys,
                        absl::Span<const std::string> values) override {
    return inner_->MultiSet(keys, values);
  }
  absl::Status Append(absl::string_view key, absl::string_view value) override {
    return inner_->Append(key, value);
  }
  absl::Status QueuePush(absl::string_view key,
                         absl::string_view value) override {
    return inner_->QueuePush(key, value);
  }
  absl::StatusOr<std::string> QueuePop(
      absl::string_view key, bool block,
      std::optional<absl::Duration> timeout) override {
    return inner_->QueuePop(key, block, timeout);
  }
  absl::StatusOr<int64_t> QueueLen(absl::string_view key) override {
    return inner_->QueueLen(key);
  }
  absl::StatusOr<std::unique_ptr<Store>> Clone() override {
    auto c = inner_->Clone();
    if (!c.ok()) return c.status();
    return std::unique_ptr<Store>(
        new PausableStore(std::shared_ptr<Store>(std::move(*c)), paused_));
  }
  std::string Describe() const override { return inner_->Describe(); }

 private:
  std::shared_ptr<Store> inner_;
  std::shared_ptr<std::atomic<bool>> paused_;
};

QuorumOptions Fast() {
  QuorumOptions o;
  o.heartbeat_interval = absl::Milliseconds(20);
  o.heartbeat_timeout = absl::Milliseconds(400);
  o.tick = absl::Milliseconds(10);
  o.form_timeout = absl::Seconds(20);
  o.commit_timeout = absl::Seconds(20);
  return o;
}

std::unique_ptr<Quorum> Make(std::shared_ptr<Store> store,
                             const std::string& id,
                             QuorumOptions o = Fast()) {
  auto q = Quorum::Create(std::move(store), id, o);
  EXPECT_TRUE(q.ok()) << q.status();
  return q.ok() ? std::move(*q) : nullptr;
}

// Runs fn(i) for i in [0, n) on n threads and joins them.
void Parallel(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) threads.emplace_back(fn, i);
  for (auto& t : threads) t.join();
}

// Forms a generation with every quorum in `qs` taking part.
std::vector<absl::StatusOr<QuorumView>> FormAll(
    const std::vector<Quorum*>& qs, int min_size) {
  std::vector<absl::StatusOr<QuorumView>> out(qs.size(),
                                              absl::UnknownError("unset"));
  Parallel(static_cast<int>(qs.size()),
           [&](int i) { out[i] = qs[i]->Form(min_size); });
  return out;
}

// FormAll, and how long it took.
std::vector<absl::StatusOr<QuorumView>> TimedFormAll(
    const std::vector<Quorum*>& qs, int min_size, absl::Duration* took) {
  const absl::Time start = absl::Now();
  auto views = FormAll(qs, min_size);
  *took = absl::Now() - start;
  return views;
}

std::vector<absl::StatusOr<StepVerdict>> CommitAll(
    const std::vector<Quorum*>& qs, int64_t step, std::vector<bool> ok) {
  std::vector<absl::StatusOr<StepVerdict>> out(qs.size(),
                                               absl::UnknownError("unset"));
  Parallel(static_cast<int>(qs.size()),
           [&](int i) { out[i] = qs[i]->Commit(step, ok[i]); });
  return out;
}

// Polls (bounded: 10 s) until `q` sees a joiner waiting for the next
// generation; the members hold their step until then.
bool AwaitJoiner(Quorum& q) {
  absl::Status error;
  const bool pending = PollUntil(
      [&] {
        absl::StatusOr<bool> p = q.JoinerPending();
        if (!p.ok()) error = p.status();
        return !p.ok() || *p;
      },
      absl::Seconds(10));
  if (!error.ok()) ADD_FAILURE() << error;
  return pending && error.ok();
}

TEST(Quorum, EncodeDecode) {
  EXPECT_EQ(EncodeMembers({"a", "b"}), "a,b");
  EXPECT_EQ(DecodeMembers("a,b"), (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(DecodeMembers("").empty());
}

TEST(Quorum, RejectsBadIdAndOptions) {
  auto store = std::make_shared<HashStore>();
  EXPECT_FALSE(Quorum::Create(store, "a,b", Fast()).ok());
  EXPECT_FALSE(Quorum::Create(store, "", Fast()).ok());
  QuorumOptions o = Fast();
  o.heartbeat_timeout = o.heartbeat_interval;
  EXPECT_FALSE(Quorum::Create(store, "a", o).ok());
}

TEST(Quorum, FirstGenerationAgreedWithDenseDistinctRanks) {
  auto store = std::make_shared<HashStore>();
  auto a = Make(store, "a"), b = Make(store, "b"), c = Make(store, "c");
  auto views = FormAll({a.get(), b.get(), c.get()}, 3);
  std::vector<bool> seen(3, false);
  for (const auto& v : views) {
    ASSERT_TRUE(v.ok()) << v.status();
    EXPECT_EQ(v->generation, 1);
    EXPECT_EQ(v->members, views[0]->members);
    ASSERT_EQ(v->size(), 3);
    ASSERT_GE(v->rank, 0);
    ASSERT_LT(v->rank, 3);
    EXPECT_FALSE(seen[v->rank]);
    seen[v->rank] = true;
  }
  EXPECT_EQ(views[0]->members[views[0]->rank], "a");
  EXPECT_EQ(views[1]->members[views[1]->rank], "b");
  auto current = a->CurrentGeneration();
  ASSERT_TRUE(current.ok());
  EXPECT_EQ(*current, 1);
}

TEST(Quorum, DeadMemberLeftOutOldOrderKept) {
  auto store = std::make_shared<HashStore>();
  auto a = Make(store, "a"), b = Make(store, "b"), c = Make(store, "c");
  auto v1 = FormAll({a.get(), b.get(), c.get()}, 3);
  ASSERT_TRUE(v1[0].ok());
  const std::vector<std::string> order = v1[0]->members;
  // Kill the member at rank 0 (the would-be proposer): its heartbeat stops.
  Quorum* survivors[2];
  int k = 0;
  std::unique_ptr<Quorum>* all[3] = {&a, &b, &c};
  for (auto* q : all) {
    if ((*q)->id() == order[0]) {
      q->reset();
    } else {
      survivors[k++] = q->get();
    }
  }
  absl::Duration took;
  auto v2 = TimedFormAll({survivors[0], survivors[1]}, 1, &took);
  for (const auto& v : v2) {
    ASSERT_TRUE(v.ok()) << v.status();
    EXPECT_EQ(v->generation, 2);
    EXPECT_EQ(v->members,
              (std::vector<std::string>{order[1], order[2]}));
    EXPECT_TRUE(v->joined.empty());
  }
  // Detected by the heartbeat timeout, not by the form timeout.
  EXPECT_LT(took, absl::Seconds(10)) << took;
}

TEST(Quorum, StalledMemberRefusedAfterwardAndWritesNothingNew) {
  auto base = std::make_shared<HashStore>();
  auto paused = std::make_shared<std::atomic<bool>>(false);
  auto c_store = std::make_shared<PausableStore>(base, paused);
  auto a = Make(base, "a"), b = Make(base, "b"), c = Make(c_store, "c");
  auto v1 = FormAll({a.get(), b.get(), c.get()}, 3);
  ASSERT_TRUE(v1[2].ok());
  *paused = true;  // "c" stalls: no heartbeat, no participation.
  auto v2 = FormAll({a.get(), b.get()}, 1);
  ASSERT_TRUE(v2[0].ok()) << v2[0].status();
  EXPECT_EQ(v2[0]->generation, 2);
  EXPECT_EQ(v2[0]->size(), 2);
  // The survivors finish a step in generation 2.
  auto verdicts = CommitAll({a.get(), b.get()}, 7, {true, true});
  ASSERT_TRUE(verdicts[0].ok()) << verdicts[0].status();
  EXPECT_EQ(*verdicts[0], StepVerdict::kApply);
  *paused = false;  // "c" wakes up.
  auto stale_commit = c->Commit(7, true);
  ASSERT_FALSE(stale_commit.ok());
  EXPECT_EQ(stale_commit.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(stale_commit.status().message(),
                                "generation 1"))
      << stale_commit.status();
  auto stale_form = c->Form();
  ASSERT_FALSE(stale_form.ok());
  EXPECT_EQ(stale_form.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(stale_form.status().message(),
                                "generation 2"))
      << stale_form.status();
  // Generation 2's members and step 7's verdict are unchanged.
  auto members = base->Get("ftddp/g/2/members");
  ASSERT_TRUE(members.ok());
  EXPECT_EQ(DecodeMembers(*members), v2[0]->members);
  auto verdict = base->Get("ftddp/g/2/step/7/verdict");
  ASSERT_TRUE(verdict.ok());
  EXPECT_EQ(*verdict, "apply");
  auto count = base->Get("ftddp/g/2/step/7/count");
  ASSERT_TRUE(count.ok());
  EXPECT_EQ(*count, "2");
}

TEST(Quorum, OneFailureDiscardsTheStepForAll) {
  auto store = std::make_shared<HashStore>();
  auto a = Make(store, "a"), b = Make(store, "b"), c = Make(store, "c");
  ASSERT_TRUE(FormAll({a.get(), b.get(), c.get()}, 3)[0].ok());
  auto ok = CommitAll({a.get(), b.get(), c.get()}, 1, {true, true, true});
  for (const auto& v : ok) {
    ASSERT_TRUE(v.ok()) << v.status();
    EXPECT_EQ(*v, StepVerdict::kApply);
  }
  auto bad = CommitAll({a.get(), b.get(), c.get()}, 2, {true, false, true});
  for (const auto& v : bad) {
    ASSERT_TRUE(v.ok()) << v.status();
    EXPECT_EQ(*v, StepVerdict::kDiscard);
  }
}

TEST(Quorum, DeadMemberDuringCommitDiscards) {
  auto store = std::make_shared<HashStore>();
  auto a = Make(store, "a"), b = Make(store, "b"), c = Make(store, "c");
  ASSERT_TRUE(FormAll({a.get(), b.get(), c.get()}, 3)[0].ok());
  c.reset();  // Dies without reporting step 1.
  auto v = CommitAll({a.get(), b.get()}, 1, {true, true});
  for (const auto& x : v) {
    ASSERT_TRUE(x.ok()) << x.status();
    EXPECT_EQ(*x, StepVerdict::kDiscard);
  }
}

TEST(Quorum, JoinerAdmittedAtNextQuorumAfterAllRanks) {
  auto store = std::make_shared<HashStore>();
  auto a = Make(store, "a"), b = Make(store, "b");
  ASSERT_TRUE(FormAll({a.get(), b.get()}, 2)[0].ok());
  auto j = Make(store, "j");
  absl::StatusOr<QuorumView> jv = absl::UnknownError("unset");
  std::thread joiner([&] { jv = j->Form(); });
  ASSERT_TRUE(AwaitJoiner(*a));
  auto verdicts = CommitAll({a.get(), b.get()}, 1, {true, true});
  for (const auto& v : verdicts) {
    ASSERT_TRUE(v.ok()) << v.status();
    EXPECT_EQ(*v, StepVerdict::kApplyAndReform);
  }
  auto v2 = FormAll({a.get(), b.get()}, 1);
  joiner.join();
  ASSERT_TRUE(jv.ok()) << jv.status();
  EXPECT_EQ(jv->generation, 2);
  EXPECT_EQ(jv->rank, 2);
  EXPECT_EQ(jv->joined, (std::vector<std::string>{"j"}));
  ASSERT_TRUE(v2[0].ok());
  EXPECT_EQ(v2[0]->members, jv->members);
  EXPECT_EQ(v2[0]->members[2], "j");
  EXPECT_EQ(v2[0]->joined, (std::vector<std::string>{"j"}));
}

TEST(Quorum, ProbeFindsAnExitedMemberBeforeItsHeartbeatIsStale) {
  auto store = std::make_shared<HashStore>();
  QuorumOptions o = Fast();
  o.heartbeat_timeout = absl::Seconds(60);  // Only the probe can be quick.
  o.probe_host = "127.0.0.1";
  auto a = Make(store, "a", o), b = Make(store, "b", o), c = Make(store, "c", o);
  ASSERT_TRUE(FormAll({a.get(), b.get(), c.get()}, 3)[0].ok());
  c.reset();  // Exits: its listener is closed.
  absl::Duration took;
  auto v = TimedFormAll({a.get(), b.get()}, 1, &took);
  ASSERT_TRUE(v[0].ok()) << v[0].status();
  EXPECT_EQ(v[0]->size(), 2);
  EXPECT_LT(took, absl::Seconds(10)) << took;
  // A step with a member gone is discarded at once too.
  auto d = Make(store, "d", o);
  auto jv = std::async(std::launch::async, [&] { return d->Form(); });
  ASSERT_TRUE(AwaitJoiner(*a));
  ASSERT_TRUE(CommitAll({a.get(), b.get()}, 1, {true, true})[0].ok());
  ASSERT_TRUE(FormAll({a.get(), b.get()}, 1)[0].ok());
  ASSERT_TRUE(jv.get().ok());
  d.reset();
  const absl::Time t2 = absl::Now();
  auto verdicts = CommitAll({a.get(), b.get()}, 2, {true, true});
  for (const auto& x : verdicts) {
    ASSERT_TRUE(x.ok()) << x.status();
    EXPECT_EQ(*x, StepVerdict::kDiscard);
  }
  EXPECT_LT(absl::Now() - t2, absl::Seconds(10));
}

TEST(Quorum, ProbeLeavesAStalledMemberToTheHeartbeat) {
  auto base = std::make_shared<HashStore>();
  auto paused = std::make_shared<std::atomic<bool>>(false);
  QuorumOptions o = Fast();
  o.heartbeat_timeout = absl::Milliseconds(800);
  o.probe_host = "127.0.0.1";
  auto a = Make(base, "a", o), b = Make(base, "b", o);
  auto c = Make(std::make_shared<PausableStore>(base, paused), "c", o);
  ASSERT_TRUE(FormAll({a.get(), b.get(), c.get()}, 3)[0].ok());
  *paused = true;  // Stalled, but its process (and listener) lives.
  auto v = FormAll({a.get(), b.get()}, 1);
  const int64_t formed_ms = absl::ToUnixMillis(absl::Now());
  ASSERT_TRUE(v[0].ok()) << v[0].status();
  EXPECT_EQ(v[0]->size(), 2);
  // Not before its heartbeat went stale: c's last beat that reached the
  // store (its value is the beat's time) is over heartbeat_timeout old. A
  // heartbeat thread delayed by load beats earlier, so this is measured
  // from the beat, not from the pause.
  absl::StatusOr<std::string> beat = base->Get(o.prefix + "hb/c");
  ASSERT_TRUE(beat.ok()) << beat.status();
  int64_t beat_ms = 0;
  ASSERT_TRUE(absl::SimpleAtoi(*beat, &beat_ms)) << *beat;
  EXPECT_GT(formed_ms - beat_ms,
            absl::ToInt64Milliseconds(o.heartbeat_timeout));
}

TEST(Quorum, ProbeHostMustBeIpv4) {
  QuorumOptions o = Fast();
  o.probe_host = "localhost";
  EXPECT_FALSE(Quorum::Create(std::make_shared<HashStore>(), "a", o).ok());
}

TEST(Quorum, FormIsBoundedAndNamesGeneration) {
  auto store = std::make_shared<HashStore>();
  QuorumOptions o = Fast();
  o.form_timeout = absl::Milliseconds(300);
  auto a = Make(store, "a", o);
  const absl::Time start = absl::Now();
  auto v = a->Form(2);  // Nobody else comes.
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(absl::StrContains(v.status().message(), "generation 1"))
      << v.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

}  // namespace
}  // namespace ferry::ddp
