#include "ferry/common/future.h"

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace ferry {
namespace {

TEST(Future, ValueThenGet) {
  Promise<int> p;
  Future<int> f = p.GetFuture();
  EXPECT_FALSE(f.IsReady());
  EXPECT_TRUE(p.SetValue(7));
  ASSERT_TRUE(f.IsReady());
  EXPECT_EQ(*f.Get(), 7);
  EXPECT_TRUE(f.status().ok());
}

TEST(Future, CompletesExactlyOnce) {
  Promise<std::string> p;
  Future<std::string> f = p.GetFuture();
  EXPECT_TRUE(p.SetError(absl::NotFoundError("k")));
  EXPECT_FALSE(p.SetValue("late"));
  EXPECT_FALSE(p.SetError(absl::InternalError("late")));
  EXPECT_EQ(f.status().code(), absl::StatusCode::kNotFound);
}

TEST(Future, RacingCompletersExactlyOneWins) {
  for (int round = 0; round < 50; ++round) {
    Promise<int> p;
    std::atomic<int> wins{0};
    std::vector<std::thread> ts;
    for (int t = 0; t < 4; ++t) {
      ts.emplace_back([&, t] { wins += p.SetValue(t) ? 1 : 0; });
    }
    for (auto& t : ts) t.join();
    EXPECT_EQ(wins.load(), 1);
    EXPECT_TRUE(p.GetFuture().IsReady());
  }
}

TEST(Future, WaitTimesOutWithDeadlineExceeded) {
  Promise<int> p;
  absl::Status s = p.GetFuture().Wait(absl::Milliseconds(20));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(s.message().find("20ms"), std::string::npos) << s;
  Result<int> r = p.GetFuture().Get(absl::Milliseconds(1));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST(Future, WaitWakesOnCompletionFromAnotherThread) {
  Promise<int> p;
  Future<int> f = p.GetFuture();
  std::thread t([p]() mutable { p.SetValue(3); });
  EXPECT_TRUE(f.Wait(absl::Seconds(30)).ok());
  EXPECT_EQ(*f.result(), 3);
  t.join();
}

// Waiters of both kinds racing one completion: none misses its wake-up (the
// completer signals after releasing the state's lock).
TEST(Future, EveryWaiterWakesOnOneCompletion) {
  for (int round = 0; round < 50; ++round) {
    Promise<int> p;
    Future<int> f = p.GetFuture();
    std::atomic<int> woken{0};
    std::vector<std::thread> waiters;
    for (int i = 0; i < 4; ++i) {
      waiters.emplace_back([&, i] {
        absl::Status s = i % 2 == 0 ? f.Wait() : f.Wait(absl::Seconds(60));
        if (s.ok() && *f.result() == round) ++woken;
      });
    }
    p.SetValue(round);
    for (std::thread& t : waiters) t.join();
    EXPECT_EQ(woken.load(), 4) << "round " << round;
  }
}

TEST(Future, WaitAfterATimedOutWaitStillWakes) {
  Promise<int> p;
  Future<int> f = p.GetFuture();
  EXPECT_EQ(f.Wait(absl::Milliseconds(1)).code(),
            absl::StatusCode::kDeadlineExceeded);
  std::thread t([p]() mutable { p.SetValue(5); });
  EXPECT_TRUE(f.Wait().ok());
  EXPECT_EQ(*f.result(), 5);
  t.join();
}

TEST(Future, CallbackInlineWhenAlreadyComplete) {
  Future<int> f = MakeReadyFuture<int>(5);
  std::thread::id ran_on;
  int seen = 0;
  f.OnComplete([&](const Result<int>& r) {
    ran_on = std::this_thread::get_id();
    seen = *r;
  });
  EXPECT_EQ(seen, 5);
  EXPECT_EQ(ran_on, std::this_thread::get_id());
}

TEST(Future, CallbacksRunOnCompleterInOrder) {
  Promise<int> p;
  std::vector<int> order;
  std::thread::id ran_on;
  for (int i = 0; i < 3; ++i) {
    p.GetFuture().OnComplete([&, i](const Result<int>&) {
      order.push_back(i);
      ran_on = std::this_thread::get_id();
    });
  }
  EXPECT_TRUE(order.empty());
  std::thread t([p]() mutable { p.SetValue(1); });
  std::thread::id completer = t.get_id();
  t.join();
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(ran_on, completer);
}

TEST(Future, ThenMapsValuesAndPropagatesErrors) {
  Promise<int> p;
  Future<std::string> s = p.GetFuture().Then(
      [](const Result<int>& r) -> absl::StatusOr<std::string> {
        if (!r.ok()) return r.status();
        return std::to_string(*r * 2);
      });
  Future<size_t> len = s.Then([](const Result<std::string>& r) {
    return r.ok() ? r->size() : size_t{0};
  });
  p.SetValue(21);
  EXPECT_EQ(*s.Get(), "42");
  EXPECT_EQ(*len.Get(), 2u);

  Promise<int> q;
  Future<std::string> e = q.GetFuture().Then(
      [](const Result<int>& r) -> absl::StatusOr<std::string> {
        return r.status();
      });
  q.SetError(absl::UnavailableError("peer gone"));
  EXPECT_EQ(e.status().code(), absl::StatusCode::kUnavailable);
}

TEST(Future, ThenFlattensFuturesAndSupportsVoid) {
  Promise<int> inner;
  Promise<void> start;
  Future<int> chained = start.GetFuture().Then(
      [inner](const absl::Status&) { return inner.GetFuture(); });
  start.SetValue();
  EXPECT_FALSE(chained.IsReady());
  inner.SetValue(9);
  EXPECT_EQ(*chained.Get(), 9);

  Future<void> v =
      chained.Then([](const Result<int>& r) { return r.status(); });
  EXPECT_TRUE(v.Get().ok());
}

TEST(Future, AbandonedPromiseCancels) {
  Future<int> f;
  {
    Promise<int> p;
    Promise<int> copy = p;
    f = p.GetFuture();
  }
  ASSERT_TRUE(f.IsReady());
  EXPECT_EQ(f.status().code(), absl::StatusCode::kCancelled);
}

TEST(Future, WhenAllKeepsOrderAndErrors) {
  std::vector<Promise<int>> ps(3);
  std::vector<Future<int>> fs;
  for (auto& p : ps) fs.push_back(p.GetFuture());
  auto all = WhenAll(fs);
  ps[2].SetValue(2);
  ps[0].SetError(absl::AbortedError("a"));
  EXPECT_FALSE(all.IsReady());
  ps[1].SetValue(1);
  ASSERT_TRUE(all.IsReady());
  const auto& rs = *all.result();
  ASSERT_EQ(rs.size(), 3u);
  EXPECT_EQ(rs[0].status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(*rs[1], 1);
  EXPECT_EQ(*rs[2], 2);

  EXPECT_TRUE(WhenAll(std::vector<Future<int>>{}).IsReady());
}

TEST(Future, CollectAllValuesOrFirstError) {
  std::vector<Promise<int>> ps(3);
  std::vector<Future<int>> fs;
  for (auto& p : ps) fs.push_back(p.GetFuture());
  Future<std::vector<int>> all = CollectAll(fs);
  for (int i = 2; i >= 0; --i) ps[i].SetValue(i * 10);
  EXPECT_EQ(*all.Get(), (std::vector<int>{0, 10, 20}));

  std::vector<Promise<void>> vs(2);
  Future<void> both = CollectAll(
      std::vector<Future<void>>{vs[0].GetFuture(), vs[1].GetFuture()});
  vs[1].SetError(absl::DeadlineExceededError("rank 1"));
  // The first error completes the collection without waiting for the rest.
  ASSERT_TRUE(both.IsReady());
  EXPECT_EQ(both.Get().code(), absl::StatusCode::kDeadlineExceeded);
  vs[0].SetValue();
  EXPECT_EQ(both.Get().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST(Future, ManyThreadsManyFutures) {
  constexpr int kN = 2000;
  std::vector<Promise<int>> ps(kN);
  std::vector<Future<int>> fs;
  std::atomic<int> callbacks{0};
  for (auto& p : ps) {
    fs.push_back(p.GetFuture());
    fs.back().OnComplete([&](const Result<int>&) { ++callbacks; });
  }
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t) {
    ts.emplace_back([&, t] {
      for (int i = t; i < kN; i += 4) ps[i].SetValue(i);
    });
  }
  auto all = CollectAll(fs);
  ASSERT_TRUE(all.Wait(absl::Seconds(60)).ok());
  for (auto& t : ts) t.join();
  EXPECT_EQ(callbacks.load(), kN);
  long sum = 0;
  for (int v : *all.result()) sum += v;
  EXPECT_EQ(sum, long{kN} * (kN - 1) / 2);
}

}  // namespace
}  // namespace ferry
