#include "ferry/common/executor.h"

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ferry/common/future.h"
#include "ferry/common/sync.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

ThreadPoolExecutor::Options Opts(int threads, size_t queue) {
  ThreadPoolExecutor::Options o;
  o.name = "test-pool";
  o.num_threads = threads;
  o.max_queue = queue;
  return o;
}

TEST(ThreadPoolExecutor, RunsEveryTask) {
  ThreadPoolExecutor ex(Opts(4, 10000));
  constexpr int kTasks = 5000;
  std::atomic<int> ran{0};
  std::vector<Future<void>> done;
  for (int i = 0; i < kTasks; ++i) {
    Promise<void> p;
    done.push_back(p.GetFuture());
    ASSERT_TRUE(ex.Submit([&ran, p]() mutable {
                    ++ran;
                    p.SetValue();
                  }).ok());
  }
  ASSERT_TRUE(CollectAll(done).Wait(absl::Seconds(60)).ok());
  EXPECT_EQ(ran.load(), kTasks);
}

TEST(ThreadPoolExecutor, UsesAllThreadsConcurrently) {
  ThreadPoolExecutor ex(Opts(3, 100));
  // Three tasks that each wait for the other two prove three threads run.
  std::atomic<int> arrived{0};
  Notification all_in;
  std::vector<Future<void>> done;
  for (int i = 0; i < 3; ++i) {
    Promise<void> p;
    done.push_back(p.GetFuture());
    ASSERT_TRUE(ex.Submit([&, p]() mutable {
                    if (++arrived == 3) all_in.Notify();
                    p.Set(
                        all_in.WaitForNotificationWithTimeout(absl::Seconds(30))
                            ? absl::OkStatus()
                            : absl::DeadlineExceededError("peers never ran"));
                  }).ok());
  }
  EXPECT_TRUE(CollectAll(done).Get(absl::Seconds(60)).ok());
}

// Wake-ups are chained (one in flight at a time): tasks that block still
// each get a thread, whether they come in a burst or are submitted by tasks
// already blocked (as a nested call's request is).
TEST(ThreadPoolExecutor, BlockedTasksEachGetAThreadInBurstsAndNested) {
  constexpr int kThreads = 16;
  ThreadPoolExecutor ex(Opts(kThreads, 100));
  std::atomic<int> arrived{0};
  Notification all_in;
  std::vector<Promise<void>> promises(kThreads);
  std::vector<Future<void>> done;
  for (Promise<void>& p : promises) done.push_back(p.GetFuture());
  std::function<Task(int)> make = [&](int i) -> Task {
    return [&, i] {
      // The second half: each task submits the next before it blocks.
      if (i >= kThreads / 2 && i + 1 < kThreads) {
        EXPECT_TRUE(ex.Submit(make(i + 1)).ok());
      }
      if (++arrived == kThreads) all_in.Notify();
      promises[i].Set(
          all_in.WaitForNotificationWithTimeout(absl::Seconds(30))
              ? absl::OkStatus()
              : absl::DeadlineExceededError("a blocked task got no thread"));
    };
  };
  for (int i = 0; i <= kThreads / 2; ++i) ASSERT_TRUE(ex.Submit(make(i)).ok());
  EXPECT_TRUE(CollectAll(done).Get(absl::Seconds(60)).ok());
}

TEST(ThreadPoolExecutor, BoundedQueueRejectsWithClearError) {
  ThreadPoolExecutor ex(Opts(1, 2));
  Notification release;
  Notification started;
  ASSERT_TRUE(ex.Submit([&] {
                  started.Notify();
                  release.WaitForNotification();
                }).ok());
  started.WaitForNotification();  // The single thread is now busy.
  EXPECT_TRUE(ex.Submit([] {}).ok());
  EXPECT_TRUE(ex.Submit([] {}).ok());
  absl::Status full = ex.Submit([] {});
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(full.message().find("test-pool"), std::string::npos) << full;
  EXPECT_NE(full.message().find("limit 2"), std::string::npos) << full;
  release.Notify();
}

TEST(ThreadPoolExecutor, DrainShutdownRunsAcceptedTasks) {
  std::atomic<int> ran{0};
  auto ex = std::make_unique<ThreadPoolExecutor>(Opts(1, 100));
  Notification release;
  ASSERT_TRUE(ex->Submit([&] { release.WaitForNotification(); }).ok());
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(ex->Submit([&] { ++ran; }).ok());
  std::thread releaser([&] { release.Notify(); });
  EXPECT_TRUE(ex->Shutdown().ok());
  releaser.join();
  EXPECT_EQ(ran.load(), 10);
  absl::Status after = ex->Submit([] {});
  EXPECT_EQ(after.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(after.message().find("test-pool"), std::string::npos);
  EXPECT_TRUE(ex->Shutdown().ok());  // Idempotent.
}

TEST(ThreadPoolExecutor, CancelShutdownCancelsPendingTasks) {
  ThreadPoolExecutor ex(Opts(1, 100));
  Notification release, started;
  ASSERT_TRUE(ex.Submit([&] {
                  started.Notify();
                  release.WaitForNotification();
                }).ok());
  started.WaitForNotification();  // The only thread is busy: the rest queue.
  constexpr int kPending = 5;
  std::vector<Promise<int>> ps(kPending);
  std::atomic<int> cancelled{0};
  for (auto& p : ps) {
    ASSERT_TRUE(
        ex.Submit([p]() mutable { p.SetValue(1); },
                  [p, &cancelled, &release](const absl::Status& s) mutable {
                    p.SetError(s);
                    // The busy task may finish once all are cancelled.
                    if (++cancelled == kPending) release.Notify();
                  })
            .ok());
  }
  EXPECT_TRUE(
      ex.Shutdown(ThreadPoolExecutor::ShutdownMode::kCancelPending).ok());
  EXPECT_EQ(cancelled.load(), kPending);
  for (auto& p : ps) {
    EXPECT_EQ(p.GetFuture().status().code(), absl::StatusCode::kCancelled);
    EXPECT_NE(p.GetFuture().status().message().find("test-pool"),
              std::string::npos);
  }
}

TEST(ThreadPoolExecutor, ConcurrentShutdownsAndSubmits) {
  for (int round = 0; round < 20; ++round) {
    ThreadPoolExecutor ex(Opts(2, 1000));
    std::atomic<int> accepted{0}, ran{0};
    std::vector<std::thread> ts;
    for (int t = 0; t < 3; ++t) {
      ts.emplace_back([&] {
        for (int i = 0; i < 100; ++i) {
          if (ex.Submit([&] { ++ran; }).ok()) ++accepted;
        }
      });
    }
    ts.emplace_back([&] { EXPECT_TRUE(ex.Shutdown().ok()); });
    ts.emplace_back([&] { EXPECT_TRUE(ex.Shutdown().ok()); });
    for (auto& t : ts) t.join();
    // Draining means every accepted task ran.
    EXPECT_EQ(ran.load(), accepted.load());
  }
}

TEST(ThreadPoolExecutor, ShutdownFromOwnThreadIsRefusedNotDeadlocked) {
  ThreadPoolExecutor ex(Opts(2, 10));
  Promise<absl::Status> p;
  ASSERT_TRUE(
      ex.Submit([&ex, p]() mutable { p.SetValue(ex.Shutdown()); }).ok());
  auto r = p.GetFuture().Get(absl::Seconds(30));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(ex.Shutdown().ok());
}

}  // namespace
}  // namespace ferry
