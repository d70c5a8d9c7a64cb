// Self-check of tools/build_tsan_libs: run under TSAN against the
// instrumented Abseil, it must print no report. Threads block on a CondVar
// and are woken by the main thread, so Mutex posts waiters whose thread
// identities were freshly allocated; without abseil-lla-tsan.patch TSAN
// reports Waiter::Post racing with LowLevelAlloc's mmap on the first round.
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"

int main() {
  constexpr int kThreads = 4;
  for (int round = 0; round < 20; ++round) {
    absl::Mutex mu;
    absl::CondVar cv;
    int waiting = 0;
    bool go = false;
    std::vector<std::thread> threads;
    for (int i = 0; i < kThreads; ++i) {
      threads.emplace_back([&] {
        absl::MutexLock lock(&mu);
        ++waiting;
        while (!go) cv.Wait(&mu);
      });
    }
    {
      absl::MutexLock lock(&mu);
      mu.Await(absl::Condition(
          +[](int* n) { return *n == kThreads; }, &waiting));
      go = true;
      cv.SignalAll();
    }
    for (auto& t : threads) t.join();
  }
  return 0;
}
