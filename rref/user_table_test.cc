// UserTable without an agent: forks held, pending children and pending
// deletions fed in every order, each ending with a leak check.
#include "ferry/rref/user_table.h"

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace ferry::rref {
namespace {

struct FakeState {
  GlobalId fork_id;
};
using Table = UserTable<FakeState>;

const GlobalId kF1(1, 10);
const GlobalId kChild(1, 11);
const GlobalId kChild2(1, 12);

// Leak check: nothing recorded, nothing pending.
void ExpectEmpty(const Table& t, const std::string& order) {
  EXPECT_EQ(t.num_live(), 0u) << order;
  EXPECT_EQ(t.num_entries(), 0u) << order;
  EXPECT_EQ(t.num_children(), 0u) << order;
  EXPECT_EQ(t.pending_deletes(), 0) << order;
  EXPECT_TRUE(t.settled()) << order;
}

TEST(UserTableTest, DuplicateDeliveryFindsTheFirstAndDropForgets) {
  Table t;
  auto s = std::make_shared<FakeState>(FakeState{kF1});
  t.Add(kF1, s);
  EXPECT_EQ(t.Find(kF1), s);  // A second delivery of the handle.
  t.Forget(kF1);              // Still alive: kept.
  EXPECT_EQ(t.num_live(), 1u);
  std::weak_ptr<FakeState> weak = s;
  s.reset();
  EXPECT_EQ(t.Find(kF1), nullptr);
  EXPECT_EQ(t.num_live(), 0u);
  EXPECT_EQ(t.num_entries(), 1u);  // Until forgotten.
  t.Forget(kF1);
  t.Forget(kF1);  // A second drop notice is harmless.
  ExpectEmpty(t, "drop");
}

// A parent with two forks sent on (to workers 2 and 3): each child's
// acceptance (maybe duplicated), worker 2's failure and the parent's own
// handle going, in every order. The parent's reference lives exactly while
// a child is pending or the handle is held (I2), and nothing is left.
TEST(UserTableTest, PendingChildrenInEveryOrder) {
  struct Run {
    Table t;
    std::shared_ptr<FakeState> handle;  // The program's handle.
    std::weak_ptr<FakeState> weak;
    std::vector<Table::Child> released;  // Released after "the lock".
  };
  const std::vector<std::pair<char, std::function<void(Run&)>>> steps = {
      {'a', [](Run& r) { r.released.push_back(r.t.TakeChild(kChild)); }},
      {'A', [](Run& r) { r.released.push_back(r.t.TakeChild(kChild)); }},
      {'b', [](Run& r) { r.released.push_back(r.t.TakeChild(kChild2)); }},
      {'X',
       [](Run& r) {
         for (Table::Child& c : r.t.DropChildrenTo(2)) {
           r.released.push_back(std::move(c));
         }
       }},
      {'H',
       [](Run& r) {
         r.handle.reset();
         // The state may live on in a pending child; forgotten once gone.
       }},
  };
  std::vector<int> idx = {0, 1, 2, 3, 4};
  int runs = 0;
  do {
    std::string order;
    for (int i : idx) order += steps[i].first;
    Run r;
    r.handle = std::make_shared<FakeState>(FakeState{kF1});
    r.weak = r.handle;
    r.t.Add(kF1, r.handle);
    r.t.AddChild(kChild, r.handle, 2);
    r.t.AddChild(kChild2, r.handle, 3);
    for (int i : idx) {
      steps[i].second(r);
      const bool pending = r.t.num_children() > 0;
      const bool held = r.handle != nullptr;
      // I2: alive while held or a child pends (released ones are dropped
      // right away here, as the context does once its lock is released).
      r.released.clear();
      EXPECT_EQ(!r.weak.expired(), held || pending) << order;
    }
    r.t.Forget(kF1);
    ExpectEmpty(r.t, order);
    EXPECT_TRUE(r.weak.expired()) << order;
    ++runs;
  } while (std::next_permutation(idx.begin(), idx.end()));
  EXPECT_EQ(runs, 120);
}

TEST(UserTableTest, FailureDropsOnlyThatReceiversChildren) {
  Table t;
  auto s = std::make_shared<FakeState>(FakeState{kF1});
  t.AddChild(kChild, s, 2);
  t.AddChild(kChild2, s, 3);
  std::vector<Table::Child> dropped = t.DropChildrenTo(2);
  ASSERT_EQ(dropped.size(), 1u);
  EXPECT_EQ(dropped[0].to, 2);
  EXPECT_EQ(dropped[0].parent, s);
  ASSERT_EQ(t.Children().size(), 1u);
  EXPECT_EQ(t.Children()[0].first, kChild2);
  EXPECT_EQ(t.TakeChild(kChild).parent, nullptr);  // Already gone.
  EXPECT_EQ(t.TakeChild(kChild2).to, 3);
  ExpectEmpty(t, "failure");
}

// Deletions count from the drop until settled, whatever the mix of paths
// (answered in a batch, dropped with a failed owner, one by one).
TEST(UserTableTest, PendingDeletesSettle) {
  Table t;
  for (int i = 0; i < 5; ++i) t.AddPendingDelete();
  EXPECT_FALSE(t.settled());
  t.SettleDeletes(3);  // A batch of three answered.
  EXPECT_EQ(t.pending_deletes(), 2);
  t.SettleDeletes(1);  // An owner failed with one queued.
  EXPECT_FALSE(t.settled());
  t.SettleDeletes(1);
  ExpectEmpty(t, "deletes");
}

}  // namespace
}  // namespace ferry::rref
