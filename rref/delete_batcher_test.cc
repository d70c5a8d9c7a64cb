// DeleteBatcher without an agent or a clock: the test passes the time.
// Queueing, carriers, flushes, answers, shutdown and the owner's failure
// in every order; each run ends with a leak check (every deletion delivered
// or dropped exactly once, nothing queued, nothing in flight).
#include "ferry/rref/delete_batcher.h"

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace ferry::rref {
namespace {

constexpr absl::Duration kDelay = absl::Milliseconds(2);
const absl::Time kT0 = absl::UnixEpoch() + absl::Hours(1);
const GlobalId kR(1, 1);

GlobalId Fork(int i) { return GlobalId(2, static_cast<uint64_t>(100 + i)); }

TEST(DeleteBatcherTest, WaitsForACarrierThenFlushesAlone) {
  DeleteBatcher b(kDelay);
  EXPECT_TRUE(b.Queue(1, kR, Fork(1), kT0).empty());
  EXPECT_TRUE(b.Queue(1, kR, Fork(2), kT0 + absl::Milliseconds(1)).empty());
  EXPECT_EQ(b.NextFlush(kT0), kT0 + kDelay);  // Armed by the first.
  auto never = [](int) { return false; };
  int dropped = 0;
  EXPECT_TRUE(b.TakeDue(kT0 + kDelay - absl::Nanoseconds(1), never, &dropped)
                  .empty());
  auto due = b.TakeDue(kT0 + kDelay, never, &dropped);
  ASSERT_EQ(due.size(), 1u);
  EXPECT_EQ(due[0].first, 1);
  EXPECT_EQ(due[0].second, (DeleteBatch{{kR, Fork(1)}, {kR, Fork(2)}}));
  EXPECT_TRUE(b.in_flight(1));
  // Queued while in flight: no flush armed; it goes when the batch ends.
  const uint64_t changes = b.changes();
  EXPECT_TRUE(b.Queue(1, kR, Fork(3), kT0 + kDelay).empty());
  EXPECT_EQ(b.changes(), changes);
  EXPECT_EQ(b.NextFlush(kT0 + kDelay), absl::InfiniteFuture());
  DeleteBatcher::Ended e = b.EndBatch(1, /*owner_failed=*/false);
  EXPECT_EQ(e.next, (DeleteBatch{{kR, Fork(3)}}));
  EXPECT_TRUE(b.in_flight(1));
  EXPECT_TRUE(b.EndBatch(1, false).next.empty());
  EXPECT_TRUE(b.idle());
  EXPECT_EQ(dropped, 0);
}

TEST(DeleteBatcherTest, ACarrierTakesTheQueueAndOtherOwnersWait) {
  DeleteBatcher b(kDelay);
  b.Queue(1, kR, Fork(1), kT0);
  b.Queue(2, kR, Fork(2), kT0);
  EXPECT_EQ(b.Attach(1), (DeleteBatch{{kR, Fork(1)}}));
  EXPECT_TRUE(b.Attach(1).empty());  // One batch in flight per owner.
  EXPECT_EQ(b.num_queued(), 1u);     // Owner 2's.
  EXPECT_EQ(b.NextFlush(kT0), kT0 + kDelay);
  b.EndBatch(1, false);
  EXPECT_FALSE(b.idle());
  EXPECT_EQ(b.Attach(2), (DeleteBatch{{kR, Fork(2)}}));
  b.EndBatch(2, false);
  EXPECT_TRUE(b.idle());
}

TEST(DeleteBatcherTest, NoDelayOrFlushAllSendsAtOnce) {
  DeleteBatcher none(absl::ZeroDuration());
  EXPECT_EQ(none.Queue(1, kR, Fork(1), kT0), (DeleteBatch{{kR, Fork(1)}}));
  EXPECT_TRUE(none.Queue(1, kR, Fork(2), kT0).empty());  // In flight.
  EXPECT_EQ(none.EndBatch(1, false).next, (DeleteBatch{{kR, Fork(2)}}));
  none.EndBatch(1, false);
  EXPECT_TRUE(none.idle());

  DeleteBatcher b(kDelay);
  b.Queue(1, kR, Fork(1), kT0);
  const uint64_t changes = b.changes();
  b.FlushAll();
  EXPECT_NE(b.changes(), changes);  // Wakes the flusher.
  EXPECT_EQ(b.NextFlush(kT0), kT0);  // Due at once.
  EXPECT_EQ(b.Queue(1, kR, Fork(2), kT0),
            (DeleteBatch{{kR, Fork(1)}, {kR, Fork(2)}}));
  b.EndBatch(1, false);
  EXPECT_TRUE(b.idle());
}

TEST(DeleteBatcherTest, AFailedOwnersDeletionsAreDroppedAndCounted) {
  DeleteBatcher b(kDelay);
  b.Queue(1, kR, Fork(1), kT0);
  ASSERT_FALSE(b.Attach(1).empty());
  b.Queue(1, kR, Fork(2), kT0);
  b.Queue(1, kR, Fork(3), kT0);
  DeleteBatcher::Ended e = b.EndBatch(1, /*owner_failed=*/true);
  EXPECT_TRUE(e.next.empty());
  EXPECT_EQ(e.dropped, 2);
  b.Queue(2, kR, Fork(4), kT0);
  int dropped = 0;
  EXPECT_TRUE(
      b.TakeDue(kT0 + kDelay, [](int o) { return o == 2; }, &dropped).empty());
  EXPECT_EQ(dropped, 1);
  EXPECT_TRUE(b.idle());
}

// One owner's three deletions, a carrier, a flush, an answer, shutdown and
// the owner's failure, in all 8! orders, driven as RRefContext drives the
// batcher. I6: each deletion is delivered (or dropped with the failed
// owner) exactly once; B: one batch in flight, and a waiting deletion's
// flush is due within the delay.
TEST(DeleteBatcherTest, EveryOrderDeliversEachDeletionOnce) {
  struct Sim {
    DeleteBatcher b{kDelay};
    absl::Time now = kT0;
    bool failed = false;
    bool in_flight = false;
    DeleteBatch flying;
    std::map<GlobalId, int> delivered;  // fork -> times
    int dropped = 0;
    std::string order;

    void HandOut(DeleteBatch batch) {
      if (batch.empty()) return;
      EXPECT_FALSE(in_flight) << "two batches in flight: " << order;
      in_flight = true;
      flying = std::move(batch);
    }
    void Answer() {  // The owner answers the batch in flight.
      if (!in_flight) return;
      for (const auto& [r, f] : flying) ++delivered[f];
      in_flight = false;
      flying.clear();
      DeleteBatcher::Ended e = b.EndBatch(1, failed);
      dropped += e.dropped;
      HandOut(std::move(e.next));
    }
    void Flush() {  // The flusher's turn, once the delay passed.
      now += kDelay;
      int d = 0;
      for (auto& [owner, batch] : b.TakeDue(
               now, [this](int) { return failed; }, &d)) {
        EXPECT_EQ(owner, 1);
        HandOut(std::move(batch));
      }
      dropped += d;
    }
    void Step(char c) {
      order += c;
      switch (c) {
        case '1': case '2': case '3':
          now += absl::Microseconds(100);
          if (failed) {
            ++dropped;  // The context queues nothing for a dead owner.
          } else {
            HandOut(b.Queue(1, kR, Fork(c - '0'), now));
          }
          break;
        case 'A':
          if (!failed) HandOut(b.Attach(1));
          break;
        case 'T': Flush(); break;
        case 'E': Answer(); break;
        case 'F': b.FlushAll(); break;
        case 'X': failed = true; break;
      }
      EXPECT_EQ(b.in_flight(1), in_flight) << order;
      if (!in_flight && b.num_queued() > 0) {
        EXPECT_LE(b.NextFlush(now), now + kDelay) << order;
      }
    }
  };
  std::string events = "123AEFTX";
  std::sort(events.begin(), events.end());
  int runs = 0;
  do {
    Sim s;
    for (char c : events) s.Step(c);
    // Drain: the network answers, the flusher flushes, until quiet.
    for (int i = 0; i < 10 && (s.in_flight || s.b.num_queued() > 0); ++i) {
      s.Answer();
      s.Flush();
    }
    EXPECT_TRUE(s.b.idle()) << s.order;
    int total = s.dropped;
    for (int i = 1; i <= 3; ++i) {
      const int n = s.delivered[Fork(i)];
      EXPECT_LE(n, 1) << "fork " << i << " delivered twice: " << s.order;
      total += n;
    }
    EXPECT_EQ(total, 3) << s.order;
    if (!s.failed) {
      EXPECT_EQ(s.dropped, 0) << s.order;
    }
    ++runs;
  } while (std::next_permutation(events.begin(), events.end()));
  EXPECT_EQ(runs, 40320);
}

}  // namespace
}  // namespace ferry::rref
