// OwnerTable: the owner's half of one worker's RRef protocol state (a part of
// RRefContext, rref_context.h): the RRefs this worker owns, the forks other
// workers hold of each (fork id -> holder), its own local handles, and the
// tombstones of what was deleted. Needs no agent: tests feed it directly.
//
// Invariants (numbered as in the design note):
//  I3 an entry goes once its value exists or failed (OwnedSlot::created()),
//     it has no fork and no local handle; the calls that can make that true
//     return the entry's slot for the caller to destroy;
//  I4 a deleted fork id and a deleted RRef id stay deleted: a fork that was
//     deleted by its holder is never registered again for it (AddFork), an
//     RRef that was deleted is never recreated (SlotFor: NotFound); a
//     tombstone another worker made for a fork not yet registered does not
//     keep the holder out (a forged delete cannot fail another's fork);
//  H  a fork is deleted only for its holder: DeleteFork from another worker
//     leaves it (PermissionDenied naming both workers); a failed holder's
//     forks all go (DropHolder) and are tombstoned.
//
// Ownership: slots are shared with the handlers using them; a slot the table
// gives up is returned, and the caller destroys it outside its own lock (a
// value may hold RRef handles whose release re-enters the context).
// Errors: absl::Status naming the RRef, the fork and the workers involved.
// Thread safety: none; the caller serializes (RRefContext: its mutex).
// Design: docs/design/rref_protocol.md ("The context's parts").
#ifndef FERRY_RREF_OWNER_TABLE_H_
#define FERRY_RREF_OWNER_TABLE_H_

#include <atomic>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "ferry/common/future.h"
#include "ferry/common/ids.h"
#include "ferry/common/sync.h"
#include "ferry/tensor/value.h"

namespace ferry::rref {

struct ClassInfo;  // class_registry.h

// The value (or object) of one owned RRef. `object` and `cls` are written
// before `promise` completes and only read after `value` is ready.
struct OwnedSlot {
  Promise<Value> promise;  // Completed once, by the creation.
  Future<Value> value = promise.GetFuture();  // The value or creation error.
  std::shared_ptr<void> object;  // A remote object's instance; else null.
  std::shared_ptr<const ClassInfo> cls;  // The object's class; else null.
  Mutex method_mu;  // Serialized classes: one method at a time.
  std::atomic<bool> started{false};  // The creation was started.
  // Whether the value exists or its creation failed (I3).
  bool created() const { return value.IsReady(); }
};

// What an owner holds of one RRef, for inspection and leak reports.
struct OwnedInfo {
  GlobalId rref_id;  // The RRef.
  std::string type_name;  // The value's.
  std::map<GlobalId, int> forks;  // fork id -> holder worker id
  int local_handles = 0;  // This worker's own handles.
  bool created = false;  // The value exists.
  std::string DebugString() const;  // One line, for logs and errors.
};

// The owner side's table (see the top of this file).
class OwnerTable {
 public:
  // `self_name`: this worker's name, for errors.
  explicit OwnerTable(std::string self_name);

  // The slot of `rref_id`, adding a placeholder entry of `type_name` when it
  // is unknown (a handle or request may overtake its creation); NotFound
  // naming the RRef when it was deleted (I4).
  absl::StatusOr<std::shared_ptr<OwnedSlot>> SlotFor(
      GlobalId rref_id, const std::string& type_name);
  // The slot of `rref_id`; null when it has no entry.
  std::shared_ptr<OwnedSlot> Find(GlobalId rref_id) const;
  // Whether fork `fork_id` was deleted by worker `holder` (its own delete,
  // or its failure) (I4).
  bool IsForkDeleted(GlobalId fork_id, int holder) const;
  // Whether RRef `rref_id` was deleted (I4).
  bool IsDeleted(GlobalId rref_id) const;

  // Registers fork `fork_id` of `rref_id` as held by worker `holder`
  // (replacing an earlier holder). False, registering nothing, when
  // `rref_id` has no entry or `holder` deleted the fork (I4); a tombstone
  // made by another worker is dropped.
  bool AddFork(GlobalId rref_id, GlobalId fork_id, int holder);
  // The owner's early registration of a fork it sends (`fork_id`: an id it
  // just made): as AddFork, but registered even when a peer named that id
  // in a delete before (no holder had it yet). False when `rref_id` has no
  // entry.
  bool AddSentFork(GlobalId rref_id, GlobalId fork_id, int holder);
  // Deletes fork `fork_id` of `rref_id` for worker `sender` and tombstones
  // it (also when `rref_id` is unknown). PermissionDenied, deleting nothing,
  // when the fork is registered to another holder. Returns the slot when the
  // entry went (I3), else null.
  absl::StatusOr<std::shared_ptr<OwnedSlot>> DeleteFork(GlobalId rref_id,
                                                        GlobalId fork_id,
                                                        int sender);
  // Deletes every fork held by worker `holder` (it failed or left),
  // tombstoned; returns the slots of the entries that went (I3).
  std::vector<std::shared_ptr<OwnedSlot>> DropHolder(int holder);

  // Counts a local handle of `rref_id`; false when it has no entry.
  bool AddLocalHandle(GlobalId rref_id);
  // Releases a local handle of `rref_id`; returns the slot when the entry
  // went (I3), else null (also when `rref_id` has no entry).
  std::shared_ptr<OwnedSlot> DropLocalHandle(GlobalId rref_id);
  // Removes `rref_id` if I3 allows (call once its value exists); returns
  // its slot when it went, else null.
  std::shared_ptr<OwnedSlot> MaybeDelete(GlobalId rref_id);

  // What is left at shutdown: every slot (the caller destroys them) and
  // the entries that still had a fork or a pending creation.
  struct Drained {
    std::vector<std::shared_ptr<OwnedSlot>> slots;  // All of them.
    std::vector<OwnedInfo> leaked;  // Forks left, or creation pending.
  };
  // Empties the table (tombstones stay).
  Drained Drain();

  // The RRefs owned and not deleted.
  std::vector<OwnedInfo> Owned() const;
  size_t size() const { return entries_.size(); }  // Owned().size()
  // The forks registered, over every entry (leak checks).
  size_t num_forks() const;

 private:
  struct Entry {
    std::string type_name;
    std::shared_ptr<OwnedSlot> slot;
    std::map<GlobalId, int> forks;  // fork id -> holder worker id
    int local_handles = 0;
  };
  static OwnedInfo Info(GlobalId rref_id, const Entry& e);

  const std::string self_name_;
  std::map<GlobalId, Entry> entries_;
  // I4: (fork id, the worker that deleted it). One per deleter, so that a
  // forged delete neither replaces nor is replaced by the holder's own.
  std::set<std::pair<GlobalId, int>> deleted_forks_;
  std::set<GlobalId> deleted_rrefs_;  // I4
};

}  // namespace ferry::rref

#endif  // FERRY_RREF_OWNER_TABLE_H_
