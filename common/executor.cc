#include "ferry/common/executor.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "ferry/common/logging.h"

namespace ferry {

ThreadPoolExecutor::ThreadPoolExecutor(Options options)
    : options_(std::move(options)) {
  int n = std::max(1, options_.num_threads);
  threads_.reserve(n);
  for (int i = 0; i < n; ++i) threads_.emplace_back([this] { WorkerLoop(); });
}

ThreadPoolExecutor::~ThreadPoolExecutor() {
  absl::Status s = Shutdown(ShutdownMode::kDrain);
  if (!s.ok()) {
    // Destroyed from its own thread: the only way out without UB is to let
    // the other threads finish on their own.
    FERRY_LOG(ERROR) << s;
    for (std::thread& t : threads_) {
      if (t.joinable()) t.detach();
    }
  }
}

absl::Status ThreadPoolExecutor::Submit(Task task, CancelCallback on_cancel) {
  bool wake = false;
  {
    MutexLock lock(&mu_);
    if (stopping_) {
      return absl::FailedPreconditionError(
          absl::StrCat("executor '", options_.name, "' is shut down"));
    }
    if (queue_.size() >= options_.max_queue) {
      return absl::ResourceExhaustedError(
          absl::StrCat("executor '", options_.name, "' queue is full (limit ",
                       options_.max_queue, " pending tasks)"));
    }
    queue_.push_back(Entry{std::move(task), std::move(on_cancel)});
    wake = WakeOneIfNeeded();
  }
  // Signalled after the release, so the woken thread does not find mu_
  // still held and block on it a second time.
  if (wake) work_.Signal();
  return absl::OkStatus();
}

bool ThreadPoolExecutor::InPool() const {
  std::thread::id me = std::this_thread::get_id();
  for (const std::thread& t : threads_) {
    if (t.get_id() == me) return true;
  }
  return false;
}

size_t ThreadPoolExecutor::QueueSize() const {
  MutexLock lock(&mu_);
  return queue_.size();
}

absl::Status ThreadPoolExecutor::Shutdown(ShutdownMode mode) {
  std::deque<Entry> cancelled;
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    if (mode == ShutdownMode::kCancelPending) cancelled.swap(queue_);
    work_.SignalAll();
  }
  for (Entry& e : cancelled) {
    if (e.on_cancel) {
      e.on_cancel(absl::CancelledError(absl::StrCat(
          "executor '", options_.name, "' shut down before the task ran")));
    }
  }
  if (InPool()) {
    return absl::InternalError(absl::StrCat(
        "executor '", options_.name, "' cannot be joined from its own thread"));
  }
  MutexLock lock(&join_mu_);
  if (!joined_) {
    for (std::thread& t : threads_) t.join();
    joined_ = true;
  }
  return absl::OkStatus();
}

bool ThreadPoolExecutor::WakeOneIfNeeded() {
  // At most one wake-up in flight: the woken thread wakes the next if work
  // remains when it takes its task (below), so a burst of tasks does not
  // wake every idle thread at once, and every queued task still has a
  // thread on its way while any is idle (a task blocked in a nested call
  // never holds up the others).
  if (queue_.empty() || idle_ == 0 || wakeups_ > 0) return false;
  ++wakeups_;
  return true;
}

void ThreadPoolExecutor::WorkerLoop() {
  ScopedLogLabel label(options_.log_label.empty() ? ScopedLogLabel::Current()
                                                  : options_.log_label);
  mu_.Lock();
  while (true) {
    if (!queue_.empty()) {
      Entry e = std::move(queue_.front());
      queue_.pop_front();
      const bool wake = WakeOneIfNeeded();
      mu_.Unlock();
      if (wake) work_.Signal();
      e.task();
      e = Entry();  // The task's captures go before the lock is retaken.
      mu_.Lock();
      continue;
    }
    if (stopping_) break;  // Stopping and drained.
    ++idle_;
    while (wakeups_ == 0 && !stopping_) work_.Wait(&mu_);
    --idle_;
    if (wakeups_ > 0) --wakeups_;
  }
  mu_.Unlock();
}

}  // namespace ferry
