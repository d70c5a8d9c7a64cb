#include "ferry/tests/util/run_ranks.h"

#include <atomic>
#include <chrono>
#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"

namespace ferry::testutil {
namespace {

TEST(RunRanksTest, RunsEachRankOnceOnItsOwnThread) {
  absl::Mutex mu;
  std::multiset<int> ranks;
  std::set<std::thread::id> threads;
  RunRanks(5, [&](int rank) {
    absl::MutexLock lock(&mu);
    ranks.insert(rank);
    threads.insert(std::this_thread::get_id());
  });
  EXPECT_EQ(ranks, (std::multiset<int>{0, 1, 2, 3, 4}));
  EXPECT_EQ(threads.size(), 5u);
  EXPECT_EQ(threads.count(std::this_thread::get_id()), 0u);
}

// The latch: a rank's thread (and so whatever it owns) ends only after every
// rank's body has returned. Each thread records, as it exits (a thread_local's
// destructor), how many bodies had returned by then. Rank 0's body returns at
// once; the others wait up to 200 ms for rank 0's thread to exit, which with
// the latch it cannot do, so every thread exits seeing all bodies returned.
// Without the latch rank 0 would exit seeing 1.
constexpr int kLatchRanks = 4;
std::atomic<int> returned{0};
std::atomic<int> seen_at_exit[kLatchRanks];

struct ExitProbe {
  int rank = -1;
  ~ExitProbe() {
    if (rank >= 0) seen_at_exit[rank].store(returned.load());
  }
};

TEST(RunRanksTest, NoThreadEndsBeforeEveryBodyReturned) {
  for (auto& s : seen_at_exit) s.store(-1);
  RunRanks(kLatchRanks, [&](int rank) {
    static thread_local ExitProbe probe;
    probe.rank = rank;
    if (rank > 0) {
      const auto deadline =
          std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
      while (seen_at_exit[0].load() == -1 &&
             std::chrono::steady_clock::now() < deadline) {
        std::this_thread::yield();
      }
    }
    returned.fetch_add(1);
  });
  for (int r = 0; r < kLatchRanks; ++r) {
    EXPECT_EQ(seen_at_exit[r].load(), kLatchRanks) << "rank " << r;
  }
}

// The two-callback form: what setup returned is destroyed only after every
// rank's body has returned (the ranks' bodies return one after another,
// rank r once rank r-1's has, bounded by 2 s each).
TEST(RunRanksTest, SetupResultOutlivesEveryBody) {
  constexpr int kRanks = 3;
  std::atomic<int> bodies{0};
  std::atomic<int> seen_at_destruction[kRanks];
  for (auto& s : seen_at_destruction) s.store(-1);
  struct Owned {
    int rank;
    std::atomic<int>* bodies;
    std::atomic<int>* seen;
    Owned(int r, std::atomic<int>* b, std::atomic<int>* s)
        : rank(r), bodies(b), seen(s) {}
    Owned(const Owned&) = delete;
    ~Owned() { seen[rank].store(bodies->load()); }
  };
  RunRanks(
      kRanks,
      [&](int rank) {
        return std::make_unique<Owned>(rank, &bodies, seen_at_destruction);
      },
      [&](int rank, std::unique_ptr<Owned>& owned) {
        EXPECT_EQ(owned->rank, rank);
        const auto deadline =
            std::chrono::steady_clock::now() + std::chrono::seconds(2);
        while (bodies.load() < rank &&
               std::chrono::steady_clock::now() < deadline) {
          std::this_thread::yield();
        }
        bodies.fetch_add(1);
      });
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(seen_at_destruction[r].load(), kRanks) << "rank " << r;
  }
}

TEST(RunRanksTest, ZeroRanksRunsNothing) {
  std::atomic<int> calls{0};
  RunRanks(0, [&](int) { calls.fetch_add(1); });
  EXPECT_EQ(calls.load(), 0);
}

}  // namespace
}  // namespace ferry::testutil
