#include "ferry/rref/owner_table.h"

#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ferry::rref {

std::string OwnedInfo::DebugString() const {
  std::vector<std::string> f;
  for (const auto& [fork, holder] : forks) {
    f.push_back(absl::StrCat(fork.ToString(), "@", holder));
  }
  return absl::StrCat(rref_id.ToString(), " type=", type_name, " forks=[",
                      absl::StrJoin(f, ", "), "] local=", local_handles,
                      created ? "" : " (creation pending)");
}

OwnerTable::OwnerTable(std::string self_name)
    : self_name_(std::move(self_name)) {}

OwnedInfo OwnerTable::Info(GlobalId rref_id, const Entry& e) {
  return OwnedInfo{rref_id, e.type_name, e.forks, e.local_handles,
                   e.slot->created()};
}

absl::StatusOr<std::shared_ptr<OwnedSlot>> OwnerTable::SlotFor(
    GlobalId rref_id, const std::string& type_name) {
  auto it = entries_.find(rref_id);
  if (it != entries_.end()) return it->second.slot;
  if (deleted_rrefs_.count(rref_id)) {
    return absl::NotFoundError(absl::StrCat(
        "RRef ", rref_id.ToString(), " owned by '", self_name_,
        "' (on worker '", self_name_, "') was already deleted on its owner"));
  }
  Entry& e = entries_[rref_id];  // A placeholder until created.
  e.type_name = type_name;
  e.slot = std::make_shared<OwnedSlot>();
  return e.slot;
}

std::shared_ptr<OwnedSlot> OwnerTable::Find(GlobalId rref_id) const {
  auto it = entries_.find(rref_id);
  return it == entries_.end() ? nullptr : it->second.slot;
}

bool OwnerTable::IsForkDeleted(GlobalId fork_id, int holder) const {
  return deleted_forks_.count({fork_id, holder}) > 0;
}

bool OwnerTable::IsDeleted(GlobalId rref_id) const {
  return deleted_rrefs_.count(rref_id) > 0;
}

bool OwnerTable::AddFork(GlobalId rref_id, GlobalId fork_id, int holder) {
  if (IsForkDeleted(fork_id, holder)) return false;
  if (!AddSentFork(rref_id, fork_id, holder)) return false;
  // Other workers' tombstones of this fork were forged: they go.
  auto it =
      deleted_forks_.lower_bound({fork_id, std::numeric_limits<int>::min()});
  while (it != deleted_forks_.end() && it->first == fork_id) {
    it = deleted_forks_.erase(it);
  }
  return true;
}

bool OwnerTable::AddSentFork(GlobalId rref_id, GlobalId fork_id, int holder) {
  auto it = entries_.find(rref_id);
  if (it == entries_.end()) return false;
  it->second.forks[fork_id] = holder;
  return true;
}

absl::StatusOr<std::shared_ptr<OwnedSlot>> OwnerTable::DeleteFork(
    GlobalId rref_id, GlobalId fork_id, int sender) {
  auto it = entries_.find(rref_id);
  if (it != entries_.end()) {
    auto fork = it->second.forks.find(fork_id);
    if (fork != it->second.forks.end() && fork->second != sender) {
      return absl::PermissionDeniedError(absl::StrCat(
          "worker '", self_name_, "': worker id ", sender,
          " may not delete fork ", fork_id.ToString(), " of RRef ",
          rref_id.ToString(), ": it is held by worker id ", fork->second));
    }
  }
  deleted_forks_.emplace(fork_id, sender);
  if (it == entries_.end()) return nullptr;
  it->second.forks.erase(fork_id);
  return MaybeDelete(rref_id);
}

std::vector<std::shared_ptr<OwnedSlot>> OwnerTable::DropHolder(int holder) {
  std::vector<GlobalId> touched;
  for (auto& [rref_id, e] : entries_) {
    bool dropped = false;
    for (auto it = e.forks.begin(); it != e.forks.end();) {
      if (it->second == holder) {
        deleted_forks_.emplace(it->first, holder);
        it = e.forks.erase(it);
        dropped = true;
      } else {
        ++it;
      }
    }
    if (dropped) touched.push_back(rref_id);
  }
  std::vector<std::shared_ptr<OwnedSlot>> doomed;
  for (GlobalId r : touched) {
    if (std::shared_ptr<OwnedSlot> slot = MaybeDelete(r)) {
      doomed.push_back(std::move(slot));
    }
  }
  return doomed;
}

bool OwnerTable::AddLocalHandle(GlobalId rref_id) {
  auto it = entries_.find(rref_id);
  if (it == entries_.end()) return false;
  ++it->second.local_handles;
  return true;
}

std::shared_ptr<OwnedSlot> OwnerTable::DropLocalHandle(GlobalId rref_id) {
  auto it = entries_.find(rref_id);
  if (it == entries_.end()) return nullptr;
  --it->second.local_handles;
  return MaybeDelete(rref_id);
}

std::shared_ptr<OwnedSlot> OwnerTable::MaybeDelete(GlobalId rref_id) {
  auto it = entries_.find(rref_id);
  if (it == entries_.end()) return nullptr;
  Entry& e = it->second;
  if (!e.forks.empty() || e.local_handles > 0 || !e.slot->created()) {
    return nullptr;
  }
  std::shared_ptr<OwnedSlot> slot = std::move(e.slot);
  entries_.erase(it);
  deleted_rrefs_.insert(rref_id);
  return slot;
}

OwnerTable::Drained OwnerTable::Drain() {
  Drained out;
  for (auto& [id, e] : entries_) {
    if (!e.forks.empty() || !e.slot->created()) {
      out.leaked.push_back(Info(id, e));
    }
    out.slots.push_back(std::move(e.slot));
  }
  entries_.clear();
  return out;
}

std::vector<OwnedInfo> OwnerTable::Owned() const {
  std::vector<OwnedInfo> out;
  out.reserve(entries_.size());
  for (const auto& [id, e] : entries_) out.push_back(Info(id, e));
  return out;
}

size_t OwnerTable::num_forks() const {
  size_t n = 0;
  for (const auto& [id, e] : entries_) n += e.forks.size();
  return n;
}

}  // namespace ferry::rref
