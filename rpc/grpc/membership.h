// The membership log of an elastic gRPC agent group, in the group's store
// (keys under "rpc/", beside the static rendezvous of rendezvous.h).
//
//   static_size      the static group's world size N, set by rank 0 once the
//                    group formed (joiners wait for it: they join a running
//                    group).
//   members/next_id  counter; a joiner's id is N + its value - 1 (ids are
//                    never reused; at most 65535, the id space of GlobalId).
//   members/count    counter; each event takes the next slot.
//   members/<slot>   "join|leave\n<id>\n<name>\n<address>".
//
// The present members after slot S are the static ones (join/0..N-1) with
// events 0..S-1 applied in order. Every reader applies the same rule, so
// all agree: a join whose name a present member holds is ignored (its
// joiner fails with AlreadyExists). An event's writer reads the events before
// its own slot and tells those members (a MEMBERSHIP notice); members whose
// events come later read its event. So every pair learns of each other.
// A joiner whose name a dead member holds writes a leave event for it, then
// its own join again (GrpcAgent::Join; docs/design/checkpoints.md).
#ifndef FERRY_RPC_GRPC_MEMBERSHIP_H_
#define FERRY_RPC_GRPC_MEMBERSHIP_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ferry/rpc/agent.h"
#include "ferry/store/store.h"

namespace ferry::rpc::grpc_agent {

// Rank 0 of a static group of `world_size`, once it formed.
absl::Status PublishStaticSize(std::shared_ptr<Store> store, int world_size);

struct JoinerId {
  int static_size = 0;
  int id = -1;
};
// Waits (up to `timeout`) for a running group and reserves a fresh id.
// DeadlineExceeded naming `name` when no group runs; ResourceExhausted when
// the ids are spent.
absl::StatusOr<JoinerId> ReserveJoinerId(std::shared_ptr<Store> store,
                                         const std::string& name,
                                         absl::Duration timeout);

// Appends `change` of `worker`; returns its slot.
absl::StatusOr<int64_t> AppendMembershipEvent(std::shared_ptr<Store> store,
                                              MembershipChange change,
                                              const WorkerInfo& worker);

// Records that `dead` (a present member whose health probe failed) left:
// a leave event on its behalf and, for a static member, its arrival at the
// shutdown barrier (once per id: not again if it had arrived, however many
// joiners evict it), so the static group's graceful shutdown does not wait
// for it.
absl::Status EvictDeadMember(std::shared_ptr<Store> store, int static_size,
                             const WorkerInfo& dead);

// The present members before `slot` (by id), as described above. Errors name
// `who` and the malformed record.
absl::StatusOr<std::vector<WorkerInfo>> ReadMembers(
    std::shared_ptr<Store> store, int static_size, int64_t slot,
    const std::string& who, absl::Duration timeout);

}  // namespace ferry::rpc::grpc_agent

#endif  // FERRY_RPC_GRPC_MEMBERSHIP_H_
