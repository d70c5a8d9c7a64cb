#include "ferry/common/sync.h"

#include <atomic>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace ferry {
namespace {

TEST(Mutex, ExcludesAndCountsExactly) {
  Mutex mu;
  long counter = 0;
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t) {
    ts.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) {
        MutexLock lock(&mu);
        ++counter;
      }
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(counter, 40000);
}

TEST(Mutex, AwaitWakesWhenAnotherHolderMakesConditionTrue) {
  Mutex mu;
  int stage = 0;
  std::thread producer([&] {
    for (int i = 1; i <= 3; ++i) {
      MutexLock lock(&mu);
      stage = i;
    }
  });
  {
    MutexLock lock(&mu);
    auto done = [&] { return stage == 3; };
    EXPECT_TRUE(mu.AwaitWithTimeout(absl::Condition(&done), absl::Seconds(60)));
    EXPECT_EQ(stage, 3);
  }
  producer.join();
}

// A holder that changes state and then waits (instead of unlocking) must
// still wake a waiter whose condition it made true.
TEST(Mutex, AwaitAfterChangingStateWakesOtherWaiters) {
  Mutex mu;
  bool waiting = false, ready = false, done = false;
  std::thread other([&] {
    MutexLock lock(&mu);
    waiting = true;
    EXPECT_TRUE(
        mu.AwaitWithTimeout(absl::Condition(&ready), absl::Seconds(30)));
    done = true;
  });
  {
    const absl::Time start = absl::Now();
    MutexLock lock(&mu);
    EXPECT_TRUE(
        mu.AwaitWithTimeout(absl::Condition(&waiting), absl::Seconds(30)));
    ready = true;
    EXPECT_TRUE(mu.AwaitWithTimeout(absl::Condition(&done), absl::Seconds(30)));
    // Woken by each hand-off, not by either thread's 30 s timeout.
    EXPECT_LT(absl::Now() - start, absl::Seconds(20));
  }
  other.join();
}

// A waiter may destroy the Mutex as soon as Await returns (here: the object
// holding it), so the releasing thread must not touch it after the release.
// Under --config=tsan (or asan) a notify after the release is reported as a
// race with the destruction (or a use after free).
TEST(Mutex, WaiterMayDestroyTheMutexRightAfterAwait) {
  struct Shared {
    Mutex mu;
    bool done ABSL_GUARDED_BY(mu) = false;
  };
  for (int i = 0; i < 100; ++i) {
    auto* shared = new Shared;
    std::thread setter([shared] {
      MutexLock lock(&shared->mu);
      shared->done = true;
    });
    {
      MutexLock lock(&shared->mu);
      shared->mu.Await(absl::Condition(&shared->done));
      EXPECT_TRUE(shared->done);
    }
    delete shared;
    setter.join();
  }
}

TEST(Mutex, AwaitWithTimeoutReturnsFalseHoldingLock) {
  Mutex mu;
  bool never = false;
  MutexLock lock(&mu);
  absl::Time start = absl::Now();
  EXPECT_FALSE(
      mu.AwaitWithTimeout(absl::Condition(&never), absl::Milliseconds(20)));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(19));
  // Still held: TryLock from another thread fails.
  bool other_got_it = true;
  std::thread([&] {
    if (mu.TryLock()) {
      mu.Unlock();
    } else {
      other_got_it = false;
    }
  }).join();
  EXPECT_FALSE(other_got_it);
}

TEST(CondVar, SignalAndTimeout) {
  Mutex mu;
  CondVar cv;
  bool ready = false;
  std::thread t([&] {
    MutexLock lock(&mu);
    ready = true;
    cv.SignalAll();
  });
  {
    MutexLock lock(&mu);
    absl::Time deadline = absl::Now() + absl::Seconds(60);
    while (!ready) {
      if (cv.WaitWithDeadline(&mu, deadline)) break;
    }
    EXPECT_TRUE(ready);
    EXPECT_TRUE(cv.WaitWithTimeout(&mu, absl::Milliseconds(5)));  // Timed out.
  }
  t.join();
}

TEST(Notification, OneShotManyWaiters) {
  Notification n;
  EXPECT_FALSE(n.HasBeenNotified());
  EXPECT_FALSE(n.WaitForNotificationWithTimeout(absl::Milliseconds(5)));
  std::atomic<int> woke{0};
  std::vector<std::thread> ts;
  for (int i = 0; i < 4; ++i) {
    ts.emplace_back([&] {
      n.WaitForNotification();
      ++woke;
    });
  }
  n.Notify();
  for (auto& t : ts) t.join();
  EXPECT_EQ(woke.load(), 4);
  EXPECT_TRUE(n.HasBeenNotified());
}

}  // namespace
}  // namespace ferry
