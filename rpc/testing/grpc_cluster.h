// Test support for groups of GrpcAgents in one process: StartGrpcGroup,
// ShutdownGrpcGroup (graceful) and StopGrpcGroup (abrupt) for the gRPC
// agent's own tests, and the AgentCluster implementations the agent
// conformance suite runs against (rpc/testing/agent_cluster.h). Not
// thread-safe: one test drives a group.
#ifndef FERRY_RPC_TESTING_GRPC_CLUSTER_H_
#define FERRY_RPC_TESTING_GRPC_CLUSTER_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ferry/rpc/grpc/agent.h"
#include "ferry/rpc/testing/agent_cluster.h"
#include "ferry/store/store.h"

namespace ferry::rpc::testing {

struct GrpcGroupSpec {
  std::vector<std::string> names;  // Worker i has rank i.
  std::shared_ptr<FunctionRegistry> registry;  // Shared; null: empty.
  // Worker i's options; unset: defaults.
  std::function<GrpcAgentOptions(int rank)> options;
  std::shared_ptr<Store> store;  // Null: a fresh HashStore.
};

// Starts every worker at once, each on its own thread (GrpcAgent::Start
// returns only when the whole group has formed), and returns each worker's
// result in rank order.
std::vector<absl::StatusOr<std::unique_ptr<GrpcAgent>>> StartGrpcAgents(
    const GrpcGroupSpec& spec);
// The same, worker i on store_for(i) (e.g. a client of its own; called on
// worker i's thread) instead of spec.store.
std::vector<absl::StatusOr<std::unique_ptr<GrpcAgent>>> StartGrpcAgents(
    const GrpcGroupSpec& spec,
    const std::function<std::shared_ptr<Store>(int rank)>& store_for);
// Every agent, or the first failure.
absl::StatusOr<std::vector<std::unique_ptr<GrpcAgent>>> StartGrpcGroup(
    const GrpcGroupSpec& spec);
// The same with one `options` for every worker (store null: a fresh
// HashStore).
absl::StatusOr<std::vector<std::unique_ptr<GrpcAgent>>> StartGrpcGroup(
    const std::vector<std::string>& names,
    std::shared_ptr<FunctionRegistry> registry, GrpcAgentOptions options = {},
    std::shared_ptr<Store> store = nullptr);
// A GrpcGroupSpec::options giving every rank `options`.
std::function<GrpcAgentOptions(int rank)> EveryRank(GrpcAgentOptions options);
// Graceful shutdown is collective (a barrier), so every non-null agent shuts
// down at once, each on its own thread. Returns the first error, naming the
// worker.
absl::Status ShutdownGrpcGroup(std::vector<std::unique_ptr<GrpcAgent>>& agents);
// Abrupt shutdown (graceful=false) of every non-null agent, one after the
// other; returns the first error, naming the worker.
absl::Status StopGrpcGroup(std::vector<std::unique_ptr<GrpcAgent>>& agents);

// Payloads travel in the gRPC envelopes (the same-host channel is off).
absl::StatusOr<std::unique_ptr<AgentCluster>> StartGrpcCluster(
    const ClusterSpec& spec);
// Every payload with a tensor byte takes the same-host channel
// (rpc/grpc/shm_channel.h); envelopes still travel over gRPC.
absl::StatusOr<std::unique_ptr<AgentCluster>> StartGrpcSameHostCluster(
    const ClusterSpec& spec);
// Over gRPC with every message streamed (rpc/grpc/stream.h: threshold 0,
// small pieces), so the suite runs over CallStream.
absl::StatusOr<std::unique_ptr<AgentCluster>> StartGrpcStreamedCluster(
    const ClusterSpec& spec);

}  // namespace ferry::rpc::testing

#endif  // FERRY_RPC_TESTING_GRPC_CLUSTER_H_
