// Store rendezvous of a gRPC agent group, and the collective shutdown
// barrier. Keys live under "rpc/" in the group's store.
//
// Join: every worker publishes {rank, name, address}, waits until all
// `world_size` have joined, and checks the group (names unique, ranks exactly
// 0..world_size-1). Every worker sees the same records, so a duplicate name
// or rank is reported by every worker, naming the culprits.
#ifndef FERRY_RPC_GRPC_RENDEZVOUS_H_
#define FERRY_RPC_GRPC_RENDEZVOUS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ferry/rpc/agent.h"
#include "ferry/store/store.h"

namespace ferry::rpc::grpc_agent {

// The group's workers, indexed by rank. InvalidArgument for an invalid group,
// DeadlineExceeded when not everyone arrives within `timeout`, naming `self`.
absl::StatusOr<std::vector<WorkerInfo>> FormGroup(std::shared_ptr<Store> store,
                                                  const WorkerInfo& self,
                                                  int world_size,
                                                  absl::Duration timeout);

// Counts static worker `id` in at the shutdown barrier without waiting (a
// static member that leaves the group early, or a dead one evicted). Once
// per id: a repeat (a dead worker that had arrived before it was evicted)
// counts nothing.
absl::Status ArriveAtShutdownBarrier(std::shared_ptr<Store> store,
                                     int world_size, int id);

// Returns once all `world_size` workers called it (or arrived), or an error
// at `deadline`.
absl::Status ShutdownBarrier(std::shared_ptr<Store> store,
                             const std::string& self_name, int self_id,
                             int world_size, absl::Time deadline);

// Whether every one of the static group's workers arrived at the shutdown
// barrier (the group is shutting down: it takes no joiner).
absl::StatusOr<bool> ShutdownBarrierDone(std::shared_ptr<Store> store);

// How many workers arrived at the shutdown barrier so far (tests observe a
// member waiting there).
absl::StatusOr<int64_t> ShutdownBarrierArrivals(std::shared_ptr<Store> store);

}  // namespace ferry::rpc::grpc_agent

#endif  // FERRY_RPC_GRPC_RENDEZVOUS_H_
