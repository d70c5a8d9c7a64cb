// The Worker gRPC service of a GrpcAgent: receives envelopes, hands them to
// the agent's handlers (on its executor; a function registered non-blocking
// runs on gRPC's thread), and sends the encoded reply.
// Malformed envelopes are refused with InvalidArgument naming the worker;
// message types without a handler with Unimplemented; calls over the
// in-flight caps (GrpcAgentOptions) with ResourceExhausted naming the limit.
// Nothing a client sends can crash the server.
#ifndef FERRY_RPC_GRPC_SERVICE_H_
#define FERRY_RPC_GRPC_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include "proto/rpc.grpc.pb.h"
#include "rpc/grpc/agent.h"
#include "rpc/grpc/call_limiter.h"

namespace ferry::rpc::grpc_agent {

class WorkerService final
    : public ferry::rpc::v1::Worker::WithRawCallbackMethod_Call<
          ferry::rpc::v1::Worker::Service> {
 public:
  // `agent` outlives the service.
  explicit WorkerService(GrpcAgent* agent)
      : agent_(agent),
        limiter_(agent->grpc_options_.max_inflight_calls,
                 agent->grpc_options_.max_inflight_calls_per_connection) {}

  grpc::ServerUnaryReactor* Call(grpc::CallbackServerContext* context,
                                 const grpc::ByteBuffer* request,
                                 grpc::ByteBuffer* response) override;

  const CallLimiter& limiter() const { return limiter_; }

 private:
  GrpcAgent* const agent_;
  CallLimiter limiter_;
};

}  // namespace ferry::rpc::grpc_agent

#endif  // FERRY_RPC_GRPC_SERVICE_H_
