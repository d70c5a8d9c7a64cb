#include "rpc/grpc/service.h"

#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/status.h"
#include "rpc/grpc/codec.h"

namespace ferry::rpc::grpc_agent {

grpc::ServerUnaryReactor* WorkerService::Call(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
    grpc::ByteBuffer* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const absl::Time start = absl::Now();
  const std::string& me = agent_->self().name;
  absl::StatusOr<ReceivedRequest> split = SplitRequest(*request);
  if (!split.ok()) {
    reactor->Finish(ToGrpcStatus(
        Annotate(split.status(), absl::StrCat("worker '", me, "'"))));
    return reactor;
  }
  const MessageType type = static_cast<MessageType>(split->header.type());
  if (!agent_->HasHandler(type)) {
    reactor->Finish(grpc::Status(
        grpc::StatusCode::UNIMPLEMENTED,
        absl::StrCat("worker '", me, "' does not serve message type ",
                     MessageTypeName(type), " (", static_cast<uint32_t>(type),
                     ")")));
    return reactor;
  }
  absl::StatusOr<std::shared_ptr<void>> slot =
      limiter_.Acquire(context->peer(), me);
  if (!slot.ok()) {
    reactor->Finish(ToGrpcStatus(slot.status()));
    return reactor;
  }
  // Stats are kept per function for calls, per type for other messages.
  std::string key = type == MessageType::kCall ? split->header.function()
                                               : MessageTypeName(type);
  const uint64_t bytes_in = split->parts.total_bytes;
  const WireLimits limits = agent_->grpc_options_.wire_limits;
  auto received = std::make_shared<ReceivedRequest>(*std::move(split));
  GrpcAgent* agent = agent_;
  // A non-blocking function runs here, on gRPC's thread (see rpc/agent.h).
  agent_
      ->Dispatch(type, received->header.function(),
                 [received, start, limits]() mutable {
                   absl::StatusOr<Message> m =
                       DecodeRequest(*received, start, limits);
                   received.reset();  // Release the request's slices early.
                   return m;
                 })
      .OnComplete([agent, reactor, response, start, bytes_in,
                   key = std::move(key),
                   slot = *std::move(slot)](const Result<Message>& reply) {
        absl::StatusOr<EncodedMessage> encoded =
            EncodeReply(reply, agent->grpc_options_.wire_limits);
        if (!encoded.ok()) {
          agent->stats_.Record(RpcStats::Direction::kIn, key,
                               absl::Now() - start, true, bytes_in, 0);
          reactor->Finish(ToGrpcStatus(
              Annotate(encoded.status(),
                       absl::StrCat("worker '", agent->self().name,
                                    "' encoding the result of '", key, "'"))));
          return;
        }
        *response = std::move(encoded->buffer);
        agent->stats_.Record(RpcStats::Direction::kIn, key, absl::Now() - start,
                             !reply.ok(), bytes_in, encoded->bytes);
        reactor->Finish(grpc::Status::OK);
      });
  return reactor;
}

}  // namespace ferry::rpc::grpc_agent
