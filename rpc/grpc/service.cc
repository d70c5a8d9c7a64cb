#include "ferry/rpc/grpc/service.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "ferry/common/grpc_status.h"
#include "ferry/common/status.h"
#include "ferry/common/sync.h"
#include "ferry/common/tsan.h"
#include "ferry/rpc/grpc/codec.h"
#include "ferry/rpc/grpc/stream.h"

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
  absl::StatusOr<ReceivedRequest> split = SplitRequest(*request);
  if (!split.ok()) {
    reactor->Reply(ToGrpcStatus(
        Annotate(split.status(), absl::StrCat("worker '", name(), "'"))));
    return reactor;
  }
  bool stranger = false;
  absl::StatusOr<std::shared_ptr<void>> slot =
      Admit(split->header, *context, &stranger);
  if (!slot.ok()) {
    reactor->Reply(ToGrpcStatus(slot.status()));
    return reactor;
  }
  if (stranger) split->header.clear_headers();
  Serve(start, *std::move(split), *std::move(slot),
        [reactor](grpc::Status status, EncodedParts* parts) {
          absl::Status ready;
          if (parts != nullptr) ready = WaitPayloadsReady(parts->payload);
          if (parts == nullptr || !ready.ok()) {
            reactor->Reply(parts == nullptr ? std::move(status)
                                            : ToGrpcStatus(ready));
          } else {
            reactor->Reply(std::move(status),
                           ToEnvelope(std::move(*parts)).buffer);
          }
        });
  return reactor;
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>*
WorkerService::CallStream(grpc::CallbackServerContext* context) {
  return NewServerStream(this, context);
}

absl::Status WorkerService::CheckCaller(
    const ferry::rpc::v1::RpcRequest& header,
    const grpc::ServerContextBase& context, bool* stranger) {
  grpc_agent::CallerVerifier& verifier = *agent_->verifier_;
  const MessageType type = static_cast<MessageType>(header.type());
  const ProvenIdentity proven = verifier.Identify(context);
  absl::Status s = verifier.CheckCaller(
      proven, type, header.caller_name(),
      [this](const std::string& n) { return agent_->GetWorkerInfo(n).ok(); });
  const auto& names = proven.names;
  const bool proven_caller = std::find(names.begin(), names.end(),
                                       header.caller_name()) != names.end();
  // Admitted without being the worker it names: a stranger's plain CALL.
  *stranger = s.ok() && !proven_caller;
  if (s.ok() && proven_caller) {
    // The declared id is the proven name's (a joiner is not known yet).
    absl::StatusOr<WorkerInfo> w =
        agent_->GetWorkerInfo(static_cast<int>(header.caller_id()));
    if (w.ok() && w->name != header.caller_name()) {
      s = absl::PermissionDeniedError(absl::StrCat(
          "worker '", name(), "' refused ", MessageTypeName(type),
          " from worker '", header.caller_name(), "' declaring the id ",
          header.caller_id(), ", which is worker '", w->name, "''s"));
    }
  }
  if (!s.ok()) {
    agent_->identity_refusals_.fetch_add(1, std::memory_order_relaxed);
  }
  return s;
}

absl::StatusOr<std::shared_ptr<void>> WorkerService::Admit(
    const ferry::rpc::v1::RpcRequest& header,
    const grpc::ServerContextBase& context, bool* stranger) {
  *stranger = false;
  if (agent_->verifier_->enforcing()) {
    RETURN_IF_ERROR(CheckCaller(header, context, stranger));
  }
  const MessageType type = static_cast<MessageType>(header.type());
  // kCall's handler is built in (rpc/agent.h): no lookup for it.
  if (type != MessageType::kCall && !agent_->HasHandler(type)) {
    return absl::UnimplementedError(absl::StrCat(
        "worker '", name(), "' does not serve message type ",
        MessageTypeName(type), " (", static_cast<uint32_t>(type), ")"));
  }
  return limiter_.Acquire(context.peer(), name());
}

namespace {

// What serving one request keeps between its two steps (decoding it, then
// replying): one allocation, which both steps' closures share.
struct Served {
  GrpcAgent* agent;
  absl::Time start;
  WorkerService::Replier reply;
  std::shared_ptr<void> slot;
  SameHostLink link;
  uint64_t bytes_in;
  // Stats are kept per function for calls, per type for other messages.
  std::string key;
  std::optional<ReceivedRequest> received;  // Until decoded.
};

}  // namespace

void WorkerService::Serve(absl::Time start, ReceivedRequest received,
                          std::shared_ptr<void> slot, Replier reply) {
  const MessageType type = static_cast<MessageType>(received.header.type());
  auto served = std::make_shared<Served>(
      Served{agent_, start, std::move(reply), std::move(slot),
             SameHostLink{agent_->same_host_.get(),
                          static_cast<int>(received.header.caller_id())},
             received.parts.total_bytes,
             type == MessageType::kCall ? received.header.function()
                                        : std::string(MessageTypeName(type)),
             std::move(received)});
  auto receive = [served] {
    absl::StatusOr<Message> m =
        DecodeRequest(*served->received, served->start,
                      served->agent->grpc_options_.wire_limits, served->link);
    served->received.reset();  // Release the request's slices early.
    return m;
  };
  // Called once, on the thread that finished the call: gRPC's for a function
  // registered non-blocking (see rpc/agent.h), else an executor thread.
  auto done = [served](Result<Message> result) {
    Served& s = *served;
    GrpcAgent* agent = s.agent;
    absl::StatusOr<EncodedParts> encoded =
        EncodeReplyParts(result, agent->grpc_options_.wire_limits);
    if (!encoded.ok()) {
      agent->stats_.Record(RpcStats::Direction::kIn, s.key,
                           absl::Now() - s.start, true, s.bytes_in, 0);
      s.reply(ToGrpcStatus(Annotate(
                  encoded.status(),
                  absl::StrCat("worker '", agent->self().name,
                               "' encoding the result of '", s.key, "'"))),
              nullptr);
      return;
    }
    const uint64_t bytes_out = encoded->bytes();
    // Taken by the same-host channel, the reply is small: never streamed.
    // The channel's reader takes the payload whole: staged device bytes
    // still being copied are waited for first (the unary path waits too).
    if (s.link.channel != nullptr && s.link.channel->UsableTo(s.link.peer)) {
      if (absl::Status ready = WaitPayloadsReady(encoded->payload);
          !ready.ok()) {
        agent->stats_.Record(RpcStats::Direction::kIn, s.key,
                             absl::Now() - s.start, true, s.bytes_in, 0);
        s.reply(ToGrpcStatus(ready), nullptr);
        return;
      }
    }
    OfferSameHost(*encoded, s.link, /*lease=*/nullptr);
    agent->stats_.Record(RpcStats::Direction::kIn, s.key, absl::Now() - s.start,
                         !result.ok(), s.bytes_in, bytes_out);
    s.reply(grpc::Status::OK, &*encoded);
  };
  // The function's name lives in `served` until the request is decoded.
  agent_->Dispatch(type, served->received->header.function(),
                   std::move(receive), std::move(done));
}

}  // namespace ferry::rpc::grpc_agent
