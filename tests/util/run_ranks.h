// RunRanks: a thread-per-rank harness for in-process group tests.
//
//   testutil::RunRanks(4, [&](int rank) { ... this rank's part ... });
//   testutil::RunRanks(
//       4, [&](int rank) { return MakeBackend(store, rank); },  // kept
//       [&](int rank, auto& backend) { ... });
//
// Runs rank 0..n-1 each on its own thread and returns once every thread has
// finished. Each rank, after its body returns, waits on a latch until every
// rank's body has returned. In the two-callback form, what `setup(rank)`
// returns is passed to `body` and destroyed only after that latch, so a
// rank's backend, process group or agent outlives every peer's use of it: no
// rank tears down a connection another rank is still reading. Bodies bound
// their own waits (every Ferry group call takes a timeout); RunRanks adds
// none.
//
// Thread safety: setup and body run concurrently on n threads and must
// synchronize what they share. gtest assertions inside them are fine
// (ASSERT_* returns from the callback only; the rank still reaches the
// latch).
#ifndef FERRY_TESTS_UTIL_RUN_RANKS_H_
#define FERRY_TESTS_UTIL_RUN_RANKS_H_

#include <functional>
#include <latch>

namespace ferry::testutil {

// Runs fn(rank) for rank 0..n-1 on n threads; joins them.
void RunThreads(int n, const std::function<void(int rank)>& fn);

inline void RunRanks(int n, const std::function<void(int rank)>& body) {
  std::latch done(n);
  RunThreads(n, [&](int r) {
    body(r);
    done.arrive_and_wait();
  });
}

template <typename Setup, typename Body>
void RunRanks(int n, const Setup& setup, const Body& body) {
  std::latch done(n);
  RunThreads(n, [&](int r) {
    auto owned = setup(r);
    body(r, owned);
    done.arrive_and_wait();
  });
}

}  // namespace ferry::testutil

#endif  // FERRY_TESTS_UTIL_RUN_RANKS_H_
