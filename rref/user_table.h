// UserTable: the user's half of one worker's RRef protocol state (a part of
// RRefContext, rref_context.h): the user forks held here (fork id -> handle
// state, held weakly: the program owns the handles), the forks this worker
// sent on that their receivers have not accepted (pending children), and
// the count of dropped forks whose deletion the owner has not answered yet.
// Needs no agent; `State` is RRefContext's RRefState, or a test's stand-in.
//
// Invariants (numbered as in the design note):
//  I1 a dropped fork counts as a pending deletion from its drop until the
//     owner answered the message that carried its deletion (or the owner
//     failed): the context is settled only at zero (settled());
//  I2 a pending child holds its parent's reference (Child::parent) until
//     its receiver accepts it (TakeChild) or fails (DropChildrenTo);
//  D  a fork id names at most one live state: a handle delivered twice
//     finds the first (Find), and a dropped one is forgotten (Forget).
//
// Ownership: the parents TakeChild and DropChildrenTo return may be the last
// references; the caller releases them outside its own lock.
// Errors: none; a fork id that is unknown is a no-op (messages repeat).
// Thread safety: none; the caller serializes (RRefContext: its mutex).
// Design: docs/design/rref_protocol.md ("The context's parts").
#ifndef FERRY_RREF_USER_TABLE_H_
#define FERRY_RREF_USER_TABLE_H_

#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "ferry/common/ids.h"

namespace ferry::rref {

// The user side's table (see the top of this file).
template <typename State>
class UserTable {
 public:
  // A fork sent on, waiting for its receiver's RREF_CHILD_ACCEPT.
  struct Child {
    std::shared_ptr<State> parent;  // The sender's reference (I2).
    int to = -1;  // The receiver's worker id.
  };

  // --- User forks held here. ---

  // Records `state` as the holder of fork `fork_id` (replacing a dead one).
  void Add(GlobalId fork_id, const std::shared_ptr<State>& state) {
    users_[fork_id] = state;
  }
  // The live state of fork `fork_id`; null when none.
  std::shared_ptr<State> Find(GlobalId fork_id) const {
    auto it = users_.find(fork_id);
    return it == users_.end() ? nullptr : it->second.lock();
  }
  // Forgets fork `fork_id` once its state is gone (its last handle dropped).
  void Forget(GlobalId fork_id) {
    auto it = users_.find(fork_id);
    if (it != users_.end() && it->second.expired()) users_.erase(it);
  }
  // The live states, by fork id.
  std::map<GlobalId, std::shared_ptr<State>> Live() const {
    std::map<GlobalId, std::shared_ptr<State>> out;
    for (const auto& [fork, weak] : users_) {
      if (std::shared_ptr<State> s = weak.lock()) out.emplace(fork, s);
    }
    return out;
  }
  // How many of the recorded forks are live.
  size_t num_live() const {
    size_t n = 0;
    for (const auto& [fork, weak] : users_) n += weak.expired() ? 0 : 1;
    return n;
  }
  // Recorded forks, live or not yet forgotten (leak checks).
  size_t num_entries() const { return users_.size(); }

  // --- Pending children (I2). ---

  // Records fork `fork_id`, sent to worker `to`, as pending; holds `parent`.
  void AddChild(GlobalId fork_id, std::shared_ptr<State> parent, int to) {
    children_[fork_id] = Child{std::move(parent), to};
  }
  // Ends pending child `fork_id` (accepted); returns it (null parent: none).
  Child TakeChild(GlobalId fork_id) {
    Child child;
    auto it = children_.find(fork_id);
    if (it != children_.end()) {
      child = std::move(it->second);
      children_.erase(it);
    }
    return child;
  }
  // Ends every pending child sent to worker `to` (it failed); returns them.
  std::vector<Child> DropChildrenTo(int to) {
    std::vector<Child> out;
    for (auto it = children_.begin(); it != children_.end();) {
      if (it->second.to == to) {
        out.push_back(std::move(it->second));
        it = children_.erase(it);
      } else {
        ++it;
      }
    }
    return out;
  }
  // The pending children, by fork id.
  std::vector<std::pair<GlobalId, Child>> Children() const {
    return {children_.begin(), children_.end()};
  }
  size_t num_children() const { return children_.size(); }  // Pending.

  // --- Deletions not yet answered (I1). ---

  // Counts one dropped fork whose deletion is not yet answered.
  void AddPendingDelete() { ++pending_deletes_; }
  // Uncounts `n` of them (answered, handed on, or their owner failed).
  void SettleDeletes(int n) { pending_deletes_ -= n; }
  int pending_deletes() const { return pending_deletes_; }  // Counted.

  // No pending child and no pending deletion.
  bool settled() const { return children_.empty() && pending_deletes_ == 0; }

 private:
  std::map<GlobalId, std::weak_ptr<State>> users_;
  std::map<GlobalId, Child> children_;
  int pending_deletes_ = 0;
};

}  // namespace ferry::rref

#endif  // FERRY_RREF_USER_TABLE_H_
