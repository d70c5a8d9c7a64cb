// A started group of GrpcAgents in this process (over a HashStore), for the
// agent conformance suite (rpc/testing/agent_cluster.h).
#ifndef FERRY_RPC_GRPC_CLUSTER_H_
#define FERRY_RPC_GRPC_CLUSTER_H_

#include <memory>

#include "absl/status/statusor.h"
#include "ferry/rpc/testing/agent_cluster.h"

namespace ferry::rpc::grpc_agent {

// Payloads travel in the gRPC envelopes (the same-host channel is off).
absl::StatusOr<std::unique_ptr<testing::AgentCluster>> StartGrpcCluster(
    const testing::ClusterSpec& spec);
// Every payload with a tensor byte takes the same-host channel
// (rpc/grpc/shm_channel.h); envelopes still travel over gRPC.
absl::StatusOr<std::unique_ptr<testing::AgentCluster>> StartGrpcSameHostCluster(
    const testing::ClusterSpec& spec);
// Over gRPC with every message streamed (rpc/grpc/stream.h: threshold 0,
// small pieces), so the suite runs over CallStream.
absl::StatusOr<std::unique_ptr<testing::AgentCluster>> StartGrpcStreamedCluster(
    const testing::ClusterSpec& spec);

}  // namespace ferry::rpc::grpc_agent

#endif  // FERRY_RPC_GRPC_CLUSTER_H_
