// OwnerTable without an agent: message sequences fed in every order the
// protocol allows (and some it does not), each ending with a leak check.
#include "ferry/rref/owner_table.h"

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace ferry::rref {
namespace {

const GlobalId kR(0, 1);    // The RRef, owned by worker 0.
const GlobalId kR2(0, 2);   // A second one.
const GlobalId kF1(1, 10);  // Worker 1's fork (its REMOTE_CALL).
const GlobalId kF2(2, 20);  // Worker 2's fork (shared to it by worker 1).
const GlobalId kF3(2, 21);  // Worker 2's fork of kR2.

// The owner's handlers, as RRefContext runs them, on a bare table. Counts
// every slot the table gives up, so a test can check each RRef went once.
class Owner {
 public:
  OwnerTable table{"owner"};
  std::vector<std::shared_ptr<OwnedSlot>> released;  // Slots given up.
  int denied = 0;     // Deletions refused (not the holder).
  int not_found = 0;  // Requests naming a deleted RRef.

  // REMOTE_CALL(R, F) from `from`: registers F and starts the creation.
  void RemoteCall(GlobalId r, GlobalId f, int from) {
    if (table.IsForkDeleted(f, from)) return;  // The user is gone (I4).
    absl::StatusOr<std::shared_ptr<OwnedSlot>> s = table.SlotFor(r, "int");
    if (!s.ok()) {
      ++not_found;
      return;
    }
    ASSERT_TRUE(table.AddFork(r, f, from));
    creating_[r] = *s;
  }
  // The creation started by REMOTE_CALL(R) completes.
  void Created(GlobalId r) {
    auto it = creating_.find(r);
    ASSERT_NE(it, creating_.end()) << "no creation of " << r.ToString();
    it->second->promise.SetValue(Value::Int(7));
    creating_.erase(it);
    Keep(table.MaybeDelete(r));
  }
  // RREF_FORK_REQUEST(R, F) from `from`.
  void ForkRequest(GlobalId r, GlobalId f, int from) {
    if (table.IsForkDeleted(f, from)) return;
    absl::StatusOr<std::shared_ptr<OwnedSlot>> s = table.SlotFor(r, "");
    if (!s.ok()) {
      EXPECT_EQ(s.status().code(), absl::StatusCode::kNotFound);
      ++not_found;
      return;
    }
    ASSERT_TRUE(table.AddFork(r, f, from));
  }
  // RREF_USER_DELETE(R, F) from `from`.
  void Delete(GlobalId r, GlobalId f, int from) {
    absl::StatusOr<std::shared_ptr<OwnedSlot>> d = table.DeleteFork(r, f, from);
    if (!d.ok()) {
      EXPECT_EQ(d.status().code(), absl::StatusCode::kPermissionDenied);
      ++denied;
      return;
    }
    Keep(*d);
  }
  // Worker `w` failed or left.
  void Fail(int w) {
    for (std::shared_ptr<OwnedSlot>& s : table.DropHolder(w)) Keep(s);
  }
  void Keep(std::shared_ptr<OwnedSlot> s) {
    if (s == nullptr) return;
    EXPECT_TRUE(s->created()) << "I3: a slot went before its value existed";
    released.push_back(std::move(s));
  }
  // Leak check: nothing owned, no fork, and each of `ids` given up once.
  void ExpectEmpty(const std::vector<GlobalId>& ids, const std::string& order) {
    EXPECT_EQ(table.size(), 0u) << order;
    EXPECT_EQ(table.num_forks(), 0u) << order;
    EXPECT_EQ(released.size(), ids.size()) << order;
    for (GlobalId id : ids) {
      EXPECT_TRUE(table.IsDeleted(id)) << id.ToString() << " " << order;
      EXPECT_EQ(table.Find(id), nullptr) << order;
    }
  }

 private:
  std::map<GlobalId, std::shared_ptr<OwnedSlot>> creating_;
};

struct Step {
  char name;  // For the failure message.
  std::function<void(Owner&)> run;
};

// Runs `steps` (after `setup`, if any) on a fresh Owner in every order where
// each (before, after) pair of `order` holds, calling `check` after each;
// returns how many orders ran.
int ForEachOrder(const std::vector<Step>& steps,
                 const std::vector<std::pair<char, char>>& order,
                 const std::function<void(Owner&, const std::string&)>& check,
                 const std::function<void(Owner&)>& setup = nullptr) {
  std::vector<int> idx(steps.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<int>(i);
  int runs = 0;
  do {
    std::string names;
    for (int i : idx) names += steps[i].name;
    bool allowed = true;
    for (const auto& [a, b] : order) {
      if (names.find(a) > names.find(b)) allowed = false;
    }
    if (!allowed) continue;
    Owner o;
    if (setup) setup(o);
    for (int i : idx) steps[i].run(o);
    check(o, names);
    ++runs;
  } while (std::next_permutation(idx.begin(), idx.end()));
  return runs;
}

// REMOTE_CALL from 1 (A), its creation (B), 1 shares R with 2 whose
// FORK_REQUEST (C) may overtake A, 1's delete (D), a duplicate of it (G),
// 2's delete (E) and a third worker's delete of 2's fork (F). Constraints:
// the creation follows the call; a holder deletes only a confirmed fork
// (I1); 1 keeps its reference while 2's fork is pending (I2).
TEST(OwnerTableTest, EveryProtocolOrderEndsEmpty) {
  const std::vector<Step> steps = {
      {'A', [](Owner& o) { o.RemoteCall(kR, kF1, 1); }},
      {'B', [](Owner& o) { o.Created(kR); }},
      {'C', [](Owner& o) { o.ForkRequest(kR, kF2, 2); }},
      {'D', [](Owner& o) { o.Delete(kR, kF1, 1); }},
      {'E', [](Owner& o) { o.Delete(kR, kF2, 2); }},
      {'F', [](Owner& o) { o.Delete(kR, kF2, 3); }},
      {'G', [](Owner& o) { o.Delete(kR, kF1, 1); }},
  };
  const int runs = ForEachOrder(
      steps, {{'A', 'B'}, {'A', 'D'}, {'C', 'D'}, {'C', 'E'}, {'D', 'G'},
              {'C', 'F'}},
      [](Owner& o, const std::string& order) {
        o.ExpectEmpty({kR}, order);
        // F came after C: refused unless 2 had deleted its fork first.
        const bool f_after_e = order.find('F') > order.find('E');
        EXPECT_EQ(o.denied, f_after_e ? 0 : 1) << order;
        EXPECT_EQ(o.not_found, 0) << order;
      });
  EXPECT_GT(runs, 100);
}

// A deletion that overtakes its fork's registration (a duplicate, or a
// FORK_REQUEST retried after the delete): the fork is tombstoned and never
// registered (I4), in either order, and R goes once.
TEST(OwnerTableTest, LateForkRequestAfterDeleteRegistersNothing) {
  const std::vector<Step> steps = {
      {'A', [](Owner& o) { o.RemoteCall(kR, kF1, 1); }},
      {'B', [](Owner& o) { o.Created(kR); }},
      {'C', [](Owner& o) { o.ForkRequest(kR, kF2, 2); }},
      {'E', [](Owner& o) { o.Delete(kR, kF2, 2); }},
      {'D', [](Owner& o) { o.Delete(kR, kF1, 1); }},
  };
  const int runs = ForEachOrder(
      steps, {{'A', 'B'}, {'A', 'D'}},
      [](Owner& o, const std::string& order) {
        // Once R is gone a FORK_REQUEST naming it is refused (NotFound)
        // unless its fork was already deleted: never resurrected.
        o.ExpectEmpty({kR}, order);
        EXPECT_EQ(o.denied, 0) << order;
        const size_t c = order.find('C');
        const bool r_gone_before_c = c > order.find('B') &&
                                     c > order.find('D') &&
                                     c < order.find('E');
        EXPECT_EQ(o.not_found, r_gone_before_c ? 1 : 0) << order;
      });
  EXPECT_EQ(runs, 40);  // 5!/3: A first of A, B and D.
}

// A holder failing with forks outstanding on two RRefs: its forks go with
// it (tombstoned), its late deletions and fork requests change nothing, and
// the other holder's deletions end the table, in every order.
TEST(OwnerTableTest, PeerFailureWithForksOutstanding) {
  auto setup = [](Owner& o) {
    o.RemoteCall(kR, kF1, 1);
    o.Created(kR);
    o.ForkRequest(kR, kF2, 2);
    o.RemoteCall(kR2, GlobalId(1, 11), 1);
    o.Created(kR2);
    o.ForkRequest(kR2, kF3, 2);
    ASSERT_EQ(o.table.num_forks(), 4u);
  };
  const std::vector<Step> steps = {
      {'X', [](Owner& o) { o.Fail(1); }},
      {'D', [](Owner& o) { o.Delete(kR, kF1, 1); }},  // 1's, maybe late.
      {'E', [](Owner& o) { o.Delete(kR, kF2, 2); }},
      {'F', [](Owner& o) { o.Delete(kR2, kF3, 2); }},
      {'L', [](Owner& o) { o.ForkRequest(kR2, GlobalId(1, 11), 1); }},
  };
  const int runs = ForEachOrder(
      steps, {},
      [](Owner& o, const std::string& order) {
        o.ExpectEmpty({kR, kR2}, order);
        EXPECT_EQ(o.denied, 0) << order;
        EXPECT_EQ(o.not_found, 0) << order;
      },
      setup);
  EXPECT_EQ(runs, 120);
}

TEST(OwnerTableTest, OnlyTheHolderDeletesItsFork) {
  Owner o;
  o.RemoteCall(kR, kF1, 1);
  o.Created(kR);
  absl::StatusOr<std::shared_ptr<OwnedSlot>> d = o.table.DeleteFork(kR, kF1, 2);
  ASSERT_EQ(d.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(d.status().message().find("worker id 2"), std::string::npos)
      << d.status();
  EXPECT_NE(d.status().message().find("held by worker id 1"), std::string::npos)
      << d.status();
  EXPECT_FALSE(o.table.IsForkDeleted(kF1, 1));
  EXPECT_FALSE(o.table.IsForkDeleted(kF1, 2));
  EXPECT_EQ(o.table.num_forks(), 1u);
  o.Delete(kR, kF1, 1);
  o.ExpectEmpty({kR}, "holder deletes");
}

// Local handles count like forks (I3); the entry goes with the last of
// them once the value exists, not before.
TEST(OwnerTableTest, LocalHandlesAndPendingCreationKeepTheEntry) {
  OwnerTable t("owner");
  absl::StatusOr<std::shared_ptr<OwnedSlot>> s = t.SlotFor(kR, "int");
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE(t.AddLocalHandle(kR));
  ASSERT_TRUE(t.AddLocalHandle(kR));
  EXPECT_EQ(t.DropLocalHandle(kR), nullptr);
  EXPECT_EQ(t.DropLocalHandle(kR), nullptr);  // Creation still pending.
  EXPECT_EQ(t.size(), 1u);
  (*s)->promise.SetValue(Value::Int(1));
  EXPECT_EQ(t.MaybeDelete(kR), *s);
  EXPECT_EQ(t.size(), 0u);
  EXPECT_FALSE(t.AddLocalHandle(kR));
  absl::StatusOr<std::shared_ptr<OwnedSlot>> again = t.SlotFor(kR, "int");
  ASSERT_EQ(again.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(again.status().message().find(kR.ToString()), std::string::npos);
}

// I4 for forks a peer names; the owner's own fresh fork ids register even
// when a peer named one in a delete before (no holder had it).
TEST(OwnerTableTest, DeletedForkIsNotRegisteredAgainButASentOneIs) {
  OwnerTable t("owner");
  absl::StatusOr<std::shared_ptr<OwnedSlot>> s = t.SlotFor(kR, "int");
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE(t.AddLocalHandle(kR));
  ASSERT_TRUE(t.DeleteFork(kR, kF2, 2).ok());  // Unknown: tombstoned.
  EXPECT_TRUE(t.IsForkDeleted(kF2, 2));
  EXPECT_FALSE(t.AddFork(kR, kF2, 2));
  EXPECT_EQ(t.num_forks(), 0u);
  const GlobalId sent(0, 99);
  ASSERT_TRUE(t.DeleteFork(kR, sent, 3).ok());
  EXPECT_TRUE(t.AddSentFork(kR, sent, 1));
  EXPECT_EQ(t.num_forks(), 1u);
  EXPECT_FALSE(t.AddSentFork(kR2, sent, 1));  // No entry.
  // Its holder's delete ends it; then the local handle.
  ASSERT_TRUE(t.DeleteFork(kR, sent, 1).ok());
  (*s)->promise.SetValue(Value::Int(3));
  EXPECT_EQ(t.DropLocalHandle(kR), *s);
  EXPECT_EQ(t.size(), 0u);
  EXPECT_EQ(t.num_forks(), 0u);
}

// A delete from a worker that does not hold the fork, sent before the
// fork's registration (a guessed id), does not keep the real holder out;
// the holder's own early delete does (I4).
TEST(OwnerTableTest, AForgedEarlyDeleteDoesNotKeepTheHolderOut) {
  Owner o;
  o.RemoteCall(kR, kF1, 1);
  o.Created(kR);
  o.Delete(kR, kF2, 3);  // Worker 3 names worker 2's fork before it exists.
  EXPECT_FALSE(o.table.IsForkDeleted(kF2, 2));
  o.ForkRequest(kR, kF2, 2);  // Registered: the tombstone was not 2's.
  EXPECT_EQ(o.table.num_forks(), 2u);
  o.Delete(kR, kF2, 3);  // Now refused: 3 is not the holder.
  EXPECT_EQ(o.denied, 1);
  EXPECT_EQ(o.table.num_forks(), 2u);
  o.Delete(kR, kF2, 2);
  EXPECT_TRUE(o.table.IsForkDeleted(kF2, 2));
  o.ForkRequest(kR, kF2, 2);  // A late duplicate: stays deleted.
  EXPECT_EQ(o.table.num_forks(), 1u);
  o.Delete(kR, kF1, 1);
  o.ExpectEmpty({kR}, "forged early delete");
}

// The holder's own early delete is kept whatever other workers name: a
// forged delete after it neither replaces it (the late registration stays
// out, no leak) nor is needed to keep it.
TEST(OwnerTableTest, AForgedDeleteAfterTheHoldersDoesNotReviveTheFork) {
  for (bool forged_first : {false, true}) {
    Owner o;
    o.RemoteCall(kR, kF1, 1);
    o.Created(kR);
    if (forged_first) o.Delete(kR, kF2, 3);
    o.Delete(kR, kF2, 2);  // Its holder, before the registration.
    if (!forged_first) o.Delete(kR, kF2, 3);
    EXPECT_TRUE(o.table.IsForkDeleted(kF2, 2));
    o.ForkRequest(kR, kF2, 2);  // Late: stays out.
    EXPECT_EQ(o.table.num_forks(), 1u) << forged_first;
    o.Delete(kR, kF1, 1);
    o.ExpectEmpty({kR}, forged_first ? "forged first" : "holder first");
  }
}

TEST(OwnerTableTest, DrainListsWhatWasLeaked) {
  OwnerTable t("owner");
  ASSERT_TRUE(t.SlotFor(kR, "int").ok());  // Creation pending.
  absl::StatusOr<std::shared_ptr<OwnedSlot>> s2 = t.SlotFor(kR2, "str");
  ASSERT_TRUE(s2.ok());
  (*s2)->promise.SetValue(Value::Int(2));
  ASSERT_TRUE(t.AddLocalHandle(kR2));  // Unforked, created: not a leak.
  OwnerTable::Drained d = t.Drain();
  EXPECT_EQ(d.slots.size(), 2u);
  ASSERT_EQ(d.leaked.size(), 1u);
  EXPECT_EQ(d.leaked[0].rref_id, kR);
  EXPECT_NE(d.leaked[0].DebugString().find("creation pending"),
            std::string::npos);
  EXPECT_EQ(t.size(), 0u);
}

}  // namespace
}  // namespace ferry::rref
