#include "rpc/grpc/service.h"

#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/status.h"
#include "common/sync.h"
#include "common/tsan.h"
#include "rpc/grpc/codec.h"

namespace ferry::rpc::grpc_agent {
namespace {

// The reactor of one Call: the reply is usually ready on the executor, after
// Call returned, and gRPC binds the call to the reactor on its own thread
// right after Call returns, so the two race. ServerUnaryReactor keeps a reply
// that comes first under an absl::Mutex, which TSAN cannot see in Debian's
// uninstrumented Abseil; this reactor keeps it under a ferry::Mutex instead
// (gRPC 1.51's InternalBindCall is the binding hook; the base's Finish is
// never used, so its own backlog stays empty).
class CallReactor final : public grpc::ServerUnaryReactor {
 public:
  // `done_token`: the address OnDone releases (see WorkerService).
  CallReactor(grpc::ByteBuffer* response, const void* done_token)
      : response_(response), done_token_(done_token) {}

  // Sends `status`, with `body` as the response when OK. Once, any thread.
  void Reply(grpc::Status status, grpc::ByteBuffer body = {}) {
    grpc::ServerCallbackUnary* call;
    {
      MutexLock lock(&mu_);
      if (status.ok()) *response_ = std::move(body);
      call = call_;
      if (call == nullptr) {
        pending_ = std::move(status);
        return;
      }
    }
    FinishCall(call, std::move(status));
  }

  // Trivial, so gRPC may run it inline on the thread that completes the
  // call, after the call's reference count (visible to TSAN) reached zero.
  bool InternalInlineable() override { return true; }

  void OnDone() override {
    FERRY_TSAN_ACQUIRE(this);  // Pairs with the release in FinishCall.
    FERRY_TSAN_RELEASE(done_token_);
    delete this;
  }

 private:
  void InternalBindCall(grpc::ServerCallbackUnary* call) override {
    std::optional<grpc::Status> pending;
    {
      MutexLock lock(&mu_);
      call_ = call;
      pending.swap(pending_);
    }
    if (pending.has_value()) FinishCall(call, *std::move(pending));
  }

  void FinishCall(grpc::ServerCallbackUnary* call, grpc::Status status) {
    // gRPC sends `response_` and calls OnDone on its own threads, after this
    // Finish by its completion queue's ordering.
    FERRY_TSAN_RELEASE(this);
    call->Finish(std::move(status));
  }

  grpc::ByteBuffer* const response_;  // gRPC's; written before FinishCall.
  const void* const done_token_;
  Mutex mu_;
  grpc::ServerCallbackUnary* call_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::optional<grpc::Status> pending_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

grpc::ServerUnaryReactor* WorkerService::Call(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
    grpc::ByteBuffer* response) {
  auto* reactor = new CallReactor(response, this);
  const absl::Time start = absl::Now();
  const std::string& me = agent_->self().name;
  absl::StatusOr<ReceivedRequest> split = SplitRequest(*request);
  if (!split.ok()) {
    reactor->Reply(ToGrpcStatus(
        Annotate(split.status(), absl::StrCat("worker '", me, "'"))));
    return reactor;
  }
  const MessageType type = static_cast<MessageType>(split->header.type());
  if (!agent_->HasHandler(type)) {
    reactor->Reply(grpc::Status(
        grpc::StatusCode::UNIMPLEMENTED,
        absl::StrCat("worker '", me, "' does not serve message type ",
                     MessageTypeName(type), " (", static_cast<uint32_t>(type),
                     ")")));
    return reactor;
  }
  absl::StatusOr<std::shared_ptr<void>> slot =
      limiter_.Acquire(context->peer(), me);
  if (!slot.ok()) {
    reactor->Reply(ToGrpcStatus(slot.status()));
    return reactor;
  }
  // Stats are kept per function for calls, per type for other messages.
  std::string key = type == MessageType::kCall ? split->header.function()
                                               : MessageTypeName(type);
  const uint64_t bytes_in = split->parts.total_bytes;
  const WireLimits limits = agent_->grpc_options_.wire_limits;
  const SameHostLink link{agent_->same_host_.get(),
                          static_cast<int>(split->header.caller_id())};
  auto received = std::make_shared<ReceivedRequest>(*std::move(split));
  GrpcAgent* agent = agent_;
  // A non-blocking function runs here, on gRPC's thread (see rpc/agent.h).
  agent_
      ->Dispatch(type, received->header.function(),
                 [received, start, limits, link]() mutable {
                   absl::StatusOr<Message> m =
                       DecodeRequest(*received, start, limits, link);
                   received.reset();  // Release the request's slices early.
                   return m;
                 })
      .OnComplete([agent, reactor, start, bytes_in, link, key = std::move(key),
                   slot = *std::move(slot)](const Result<Message>& reply) {
        absl::StatusOr<EncodedMessage> encoded =
            EncodeReply(reply, agent->grpc_options_.wire_limits, link);
        if (!encoded.ok()) {
          agent->stats_.Record(RpcStats::Direction::kIn, key,
                               absl::Now() - start, true, bytes_in, 0);
          reactor->Reply(ToGrpcStatus(
              Annotate(encoded.status(),
                       absl::StrCat("worker '", agent->self().name,
                                    "' encoding the result of '", key, "'"))));
          return;
        }
        agent->stats_.Record(RpcStats::Direction::kIn, key, absl::Now() - start,
                             !reply.ok(), bytes_in, encoded->bytes);
        reactor->Reply(grpc::Status::OK, std::move(encoded->buffer));
      });
  return reactor;
}

}  // namespace ferry::rpc::grpc_agent
