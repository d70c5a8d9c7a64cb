// Executors: where Ferry runs work that must not run on a network thread
// (user functions behind RPCs, Future continuations, c10d collectives).
//
// ThreadPoolExecutor is a fixed-size pool with a bounded FIFO queue.
//
// Lifecycle: Submit() is accepted until Shutdown() starts; afterwards it
// returns FailedPrecondition naming the executor. Shutdown(kDrain) runs every
// task already accepted; Shutdown(kCancelPending) runs none that has not
// started and calls their `on_cancel` with Cancelled instead. Both wait for
// running tasks and join every thread; they are idempotent and may be called
// concurrently. The destructor calls Shutdown(kDrain); as for any object, no
// call (Submit included) may still be running on another thread when it
// starts: Submit signals a thread after its task is queued, so a submitted
// task may finish before Submit returns.
//
// Shutdown() and the destructor must not run on one of the pool's own threads
// (a thread cannot join itself): such a call returns at once with Internal
// and leaves the joining to a later call from another thread.
//
// Thread safety: all methods are safe from any thread.
#ifndef FERRY_COMMON_EXECUTOR_H_
#define FERRY_COMMON_EXECUTOR_H_

#include <cstddef>
#include <deque>
#include <string>
#include <thread>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "ferry/common/sync.h"

namespace ferry {

using Task = absl::AnyInvocable<void()>;  // Work an executor runs once.
// Called instead of a task that was accepted but will never run.
using CancelCallback = absl::AnyInvocable<void(const absl::Status&)>;

// Runs submitted tasks somewhere else than the caller's thread.
class Executor {
 public:
  virtual ~Executor() = default;

  // Queues `task`. Errors (the task is then dropped and `on_cancel` is NOT
  // called; the caller still owns the failure): ResourceExhausted when the
  // queue is full, FailedPrecondition after shutdown began.
  virtual absl::Status Submit(Task task,
                              CancelCallback on_cancel = nullptr) = 0;
};

// A fixed pool of threads over a bounded FIFO queue (see the top of this
// file).
class ThreadPoolExecutor final : public Executor {
 public:
  // The pool's size and names.
  struct Options {
    std::string name = "executor";  // Appears in errors and log labels.
    int num_threads = 4;  // Threads started by the constructor.
    size_t max_queue = 1 << 16;  // Tasks waiting (not running).
    std::string log_label;       // Label for the threads' log lines.
  };

  // See Shutdown.
  enum class ShutdownMode { kDrain, kCancelPending };

  // Starts options.num_threads threads.
  explicit ThreadPoolExecutor(Options options);
  ~ThreadPoolExecutor() override;

  ThreadPoolExecutor(const ThreadPoolExecutor&) = delete;
  ThreadPoolExecutor& operator=(const ThreadPoolExecutor&) = delete;

  absl::Status Submit(Task task, CancelCallback on_cancel = nullptr) override
      ABSL_LOCKS_EXCLUDED(mu_);

  // Stops accepting tasks, runs (kDrain) or cancels (kCancelPending) the
  // queued ones, and joins the threads (see the top of this file).
  absl::Status Shutdown(ShutdownMode mode = ShutdownMode::kDrain)
      ABSL_LOCKS_EXCLUDED(mu_, join_mu_);

  // True if the calling thread is one of this pool's threads.
  bool InPool() const;

  // Tasks waiting now (not running).
  size_t QueueSize() const ABSL_LOCKS_EXCLUDED(mu_);
  int num_threads() const { return options_.num_threads; }  // As configured.
  const std::string& name() const { return options_.name; }  // As configured.

 private:
  struct Entry {
    Task task;
    CancelCallback on_cancel;
  };

  void WorkerLoop();
  // Whether to signal an idle thread (a task waits and no wake-up is in
  // flight); counts the wake-up. The caller signals work_ once mu_ is
  // released.
  bool WakeOneIfNeeded() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  mutable Mutex mu_;
  std::deque<Entry> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Threads waiting for work, and wake-ups signalled that no thread has
  // taken yet (at most one; see WakeOneIfNeeded).
  int idle_ ABSL_GUARDED_BY(mu_) = 0;
  int wakeups_ ABSL_GUARDED_BY(mu_) = 0;
  // Signalled per wake-up, and to all threads on shutdown.
  CondVar work_;
  // Serializes joiners; threads_ is written only in the constructor.
  Mutex join_mu_ ABSL_ACQUIRED_AFTER(mu_);
  bool joined_ ABSL_GUARDED_BY(join_mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace ferry

#endif  // FERRY_COMMON_EXECUTOR_H_
