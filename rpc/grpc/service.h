// The Worker gRPC service of a GrpcAgent: receives envelopes, hands them to
// the agent's handlers (on its executor; a function registered non-blocking
// runs on gRPC's thread), and sends the encoded reply. Call takes one unary
// message; CallStream a large payload in pieces (rpc/grpc/stream.h), then
// runs it through the same Admit and Serve steps.
// A request whose declared caller is not the identity its connection proved
// is refused with PermissionDenied before anything else (rpc/grpc/identity.h;
// counted in the agent's identity_refusals).
// Malformed envelopes are refused with InvalidArgument naming the worker;
// message types without a handler with Unimplemented; calls over the
// in-flight caps (GrpcAgentOptions) with ResourceExhausted naming the limit.
// Nothing a client sends can crash the server.
//
// TSAN: every call's OnDone releases the service's address; after
// grpc::Server::Wait (which returns once every call's OnDone ran) the agent
// acquires it, so what the calls did is seen before the agent is torn down.
#ifndef FERRY_RPC_GRPC_SERVICE_H_
#define FERRY_RPC_GRPC_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <string>

#include "ferry/proto/rpc.grpc.pb.h"
#include "ferry/rpc/grpc/agent.h"
#include "ferry/rpc/grpc/call_limiter.h"
#include "ferry/rpc/grpc/codec.h"
#include "ferry/rpc/grpc/identity.h"

namespace ferry::rpc::grpc_agent {

class WorkerService final
    : public ferry::rpc::v1::Worker::WithRawCallbackMethod_Call<
          ferry::rpc::v1::Worker::WithRawCallbackMethod_CallStream<
              ferry::rpc::v1::Worker::Service>> {
 public:
  // `agent` outlives the service.
  explicit WorkerService(GrpcAgent* agent)
      : agent_(agent),
        limiter_(agent->grpc_options_.max_inflight_calls,
                 agent->grpc_options_.max_inflight_calls_per_connection) {}

  grpc::ServerUnaryReactor* Call(grpc::CallbackServerContext* context,
                                 const grpc::ByteBuffer* request,
                                 grpc::ByteBuffer* response) override;

  // Streamed calls (rpc/grpc/stream.h).
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* CallStream(
      grpc::CallbackServerContext* context) override;

  const CallLimiter& limiter() const { return limiter_; }

  // The steps both methods share. Admit checks a request's fields (its
  // declared caller against the connection's identity; a handler serves its
  // type; a slot under the in-flight caps, held until the handle is
  // dropped). `*stranger` is set when it admits a plain CALL from a
  // connection that proved no worker's identity (the agent enforces one):
  // the caller drops that request's layer headers before serving it, so no
  // layer acts on a stranger's RRef, autograd or device fields under the
  // name it claims. Serve runs the admitted request and calls `reply` once,
  // on any thread, with the encoded reply (status OK) or the error to send.
  using Replier = std::function<void(grpc::Status, EncodedParts*)>;
  absl::StatusOr<std::shared_ptr<void>> Admit(
      const ferry::rpc::v1::RpcRequest& header,
      const grpc::ServerContextBase& context, bool* stranger);
  void Serve(absl::Time start, ReceivedRequest received,
             std::shared_ptr<void> slot, Replier reply);

  const std::string& name() const { return agent_->self().name; }
  const GrpcAgentOptions& options() const { return agent_->grpc_options_; }
  StreamStats* stream_stats() { return &agent_->stream_stats_; }
  ReceiveBufferPool* receive_pool() { return agent_->receive_pool_.get(); }
  // Where streamed replies wait for payload bytes still being written.
  Executor* gates() { return agent_->gates_.get(); }

 private:
  // Identity check of Admit (only when the agent enforces one).
  absl::Status CheckCaller(const ferry::rpc::v1::RpcRequest& header,
                           const grpc::ServerContextBase& context,
                           bool* stranger);

  GrpcAgent* const agent_;
  CallLimiter limiter_;
};

}  // namespace ferry::rpc::grpc_agent

#endif  // FERRY_RPC_GRPC_SERVICE_H_
