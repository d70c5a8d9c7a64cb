#include "ferry/rpc/grpc/stream.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "ferry/common/grpc_status.h"
#include "ferry/common/status.h"
#include "ferry/common/tsan.h"
#include "ferry/rpc/grpc/envelope.h"
#include "ferry/rpc/grpc/service.h"
#include "ferry/tensor/wire_grpc.h"

namespace ferry::rpc::grpc_agent {

namespace v1 = ::ferry::rpc::v1;

namespace {

// When the next piece of `writer` is not readable yet (pipelined device
// staging), hands `write` to `gates` (null: none), where it waits for the
// bytes instead of gRPC's thread, and returns true; false: write now (also
// when the gate failed: WaitForNext reports it). The executor's queue
// orders the hand-off.
bool DeferWrite(PieceWriter& writer, Executor* gates, StreamStats* stats,
                Task write) {
  if (gates == nullptr) return false;
  absl::StatusOr<bool> ready = writer.NextReady();
  if (!ready.ok() || *ready) return false;
  if (!gates->Submit(std::move(write)).ok()) return false;  // Shutting down.
  stats->writes_deferred.fetch_add(1, std::memory_order_relaxed);
  return true;
}

}  // namespace

// ---------------------------------------------------------------------------
// Client.

ClientStream::ClientStream(EncodedParts request, Config config,
                           std::function<void(const grpc::Status&)> done)
    : config_(config),
      done_(std::move(done)),
      writer_(std::move(request), config.options->piece_bytes),
      receiver_({config.options, config.limits, config.max_message_bytes,
                 config.stats, &config.stats->replies_received, config.pool},
                [](const v1::RpcResponse&) {
                  return std::string("the streamed reply");
                },
                {},
                [this](const v1::RpcResponse& h) {
                  return ObserveReceive(config_.options->observer.get(),
                                        /*request=*/false, config_.peer, h);
                }) {}

void ClientStream::Start(grpc::GenericStub* stub,
                         grpc::ClientContext* context) {
  context_ = context;
  config_.stats->requests_sent.fetch_add(1, std::memory_order_relaxed);
  stub->PrepareBidiStreamingCall(context, kCallStreamMethod,
                                 grpc::StubOptions(), this);
  // A write may start from the gates thread, outside any reaction: the hold
  // keeps OnDone back until the writes ended (gRPC wants it before
  // StartCall).
  if (config_.gates != nullptr) AddHold();
  // Each release right before a Start*: gRPC orders the matching callback
  // after it.
  FERRY_TSAN_RELEASE(this);
  StartRead(&in_);
  // The first piece waits for its bytes on this thread, the caller's.
  WriteWhenReady();
  FERRY_TSAN_RELEASE(this);
  StartCall();
}

void ClientStream::WriteNext() {
  // A piece of a payload still being written waits for its bytes on the
  // gates thread, for about one chunk's copy (docs/design/cuda_rpc.md,
  // "Pipelined staging"); gRPC's thread goes back at once.
  if (!DeferWrite(writer_, config_.gates, config_.stats,
                  [this] { WriteWhenReady(); })) {
    WriteWhenReady();
  }
}

void ClientStream::WriteWhenReady() {
  if (absl::Status ready = writer_.WaitForNext(); !ready.ok()) {
    Fail(std::move(ready));  // OnDone follows; nothing more is written.
    EndWrites();
    return;
  }
  writer_.Next(&out_, &out_bytes_);
  FERRY_TSAN_RELEASE(this);
  if (writer_.last()) {
    StartWriteLast(&out_, grpc::WriteOptions());
    EndWrites();  // The write is outstanding: OnDone waits for it.
  } else {
    StartWrite(&out_);
  }
}

void ClientStream::EndWrites() {
  if (config_.gates == nullptr) return;
  FERRY_TSAN_RELEASE(this);
  RemoveHold();  // May let OnDone (and the owner's delete) run: the end.
}

void ClientStream::OnWriteDone(bool ok) {
  FERRY_TSAN_ACQUIRE(this);
  if (!ok) {  // The call failed; OnDone has its status.
    if (!writer_.last()) EndWrites();  // Else the last write ended them.
    return;
  }
  config_.stats->bytes_sent.fetch_add(out_bytes_, std::memory_order_relaxed);
  out_.Clear();
  if (!writer_.last()) WriteNext();
  // Our reads of gRPC's stream pointer (inline in Start*) come before OnDone,
  // which gRPC runs only after this callback returned.
  FERRY_TSAN_RELEASE(this);
}

void ClientStream::OnReadDone(bool ok) {
  FERRY_TSAN_ACQUIRE(this);
  if (!ok) return;  // End of the stream; OnDone follows.
  absl::StatusOr<bool> complete = receiver_.Receive(in_);
  in_.Clear();
  if (!complete.ok()) {
    Fail(complete.status());
  } else {
    if (*complete) reply_ = receiver_.Take();
    FERRY_TSAN_RELEASE(this);
    StartRead(&in_);  // The next piece, or the end of the stream.
  }
  FERRY_TSAN_RELEASE(this);  // As in OnWriteDone.
}

void ClientStream::Fail(absl::Status error) {
  {
    MutexLock lock(&error_mu_);
    if (error_.ok()) error_ = std::move(error);
  }
  context_->TryCancel();  // OnDone follows, with CANCELLED.
}

absl::Status ClientStream::error() const {
  MutexLock lock(&error_mu_);
  return error_;
}

void ClientStream::OnDone(const grpc::Status& status) {
  FERRY_TSAN_ACQUIRE(this);
  // May delete this (the owner's OutgoingCall): nothing after it.
  done_(status);
}

absl::StatusOr<Result<Message>> ClientStream::DecodeReply(uint64_t* bytes_in,
                                                          SameHostLink link) {
  if (absl::Status failed = error(); !failed.ok()) return failed;
  if (!receiver_.complete()) {
    return absl::InvalidArgumentError(
        absl::StrCat("stream: the reply ended after ", receiver_.received(),
                     " of ", receiver_.total(), " payload bytes"));
  }
  return DecodeReplyParts(reply_, *config_.limits, bytes_in, link);
}

// ---------------------------------------------------------------------------
// Server.

namespace {

class ServerStream final
    : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  ServerStream(WorkerService* service, grpc::CallbackServerContext* context)
      : service_(service),
        context_(context),
        start_(absl::Now()),
        receiver_(
            {&service->options().stream, &service->options().wire_limits,
             service->options().max_message_bytes, service->stream_stats(),
             &service->stream_stats()->requests_received,
             service->receive_pool()},
            [service](const v1::RpcRequest& h) {
              return absl::StrCat(
                  "worker '", service->name(), "': the streamed ",
                  h.type() == v1::CALL
                      ? absl::StrCat("arguments of '", h.function(), "'")
                      : std::string("payload"));
            },
            [this](const v1::RpcRequest& h) {
              ASSIGN_OR_RETURN(slot_,
                               service_->Admit(h, *context_, &stranger_));
              return absl::OkStatus();
            },
            // A stranger's layer headers reach no layer (Admit).
            [this](const v1::RpcRequest& h) {
              return stranger_ ? nullptr
                               : ObserveReceive(
                                     service_->options().stream.observer.get(),
                                     /*request=*/true, h.caller_name(), h);
            }) {}

  void OnReadDone(bool ok) override {
    FERRY_TSAN_ACQUIRE(this);
    if (!ok) {
      // The client went away or closed early; nothing was dispatched.
      FinishWith(absl::CancelledError(absl::StrCat(
          "worker '", service_->name(), "': the request stream ended after ",
          receiver_.received(), " of ", receiver_.total(), " payload bytes")));
      return;
    }
    absl::StatusOr<bool> complete = receiver_.Receive(in_);
    in_.Clear();
    if (!complete.ok()) {
      FinishWith(complete.status());
    } else if (*complete) {
      ReceivedRequest request;
      request.header = receiver_.header();
      // A stranger's layer headers reach no layer (WorkerService::Admit).
      if (stranger_) request.header.clear_headers();
      request.parts = receiver_.Take();
      Dispatch(std::move(request));
    } else {
      Read();
    }
  }

  void OnWriteDone(bool ok) override {
    FERRY_TSAN_ACQUIRE(this);
    if (!ok) {
      FinishWith(absl::CancelledError("the reply stream was cut"));
      return;
    }
    service_->stream_stats()->bytes_sent.fetch_add(out_bytes_,
                                                   std::memory_order_relaxed);
    out_.Clear();
    WriteNext();
  }

  void OnDone() override {
    FERRY_TSAN_ACQUIRE(this);  // Pairs with the release before Finish.
    // As for unary calls (rpc/grpc/service.h).
    FERRY_TSAN_RELEASE(service_);
    delete this;
  }

 private:
  // The reactor drives gRPC's stream object itself, as CallReactor does for
  // unary calls (rpc/grpc/service.cc): the base class's Start* methods read
  // its members after the call is handed over, which TSAN cannot order
  // before OnDone's delete. Each operation below reads `stream_` into a
  // local first, releases, and touches nothing of this object afterwards.
  // gRPC binds the stream (once, before any operation) right after
  // CallStream returned the reactor; the first read starts there.
  void InternalBindStream(
      grpc::ServerCallbackReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>*
          stream) override {
    stream_ = stream;
    Read();
  }

  void Read() {
    auto* stream = stream_;
    FERRY_TSAN_RELEASE(this);  // gRPC orders OnReadDone after Read.
    stream->Read(&in_);
  }

  void Dispatch(ReceivedRequest request) {
    service_->Serve(start_, std::move(request), std::move(slot_),
                    [this](grpc::Status status, EncodedParts* parts) {
                      Reply(std::move(status), parts);
                    });
  }

  // Once, on any thread; no read is outstanding any more.
  void Reply(grpc::Status status, EncodedParts* parts) {
    if (!status.ok()) {
      FinishWith(FromGrpcStatus(status));
      return;
    }
    const GrpcAgentOptions& options = service_->options();
    // An empty payload (a None result, an error) goes in one message.
    if (parts->bytes() == 0 || !ShouldStream(options.stream, parts->bytes())) {
      if (absl::Status ready = WaitPayloadsReady(parts->payload); !ready.ok()) {
        FinishWith(ready);
        return;
      }
      out_ = ToEnvelope(std::move(*parts)).buffer;
      WriteLast();
      return;
    }
    absl::Status size = CheckStreamSize(
        parts->bytes(), options.max_message_bytes, options.wire_limits,
        absl::StrCat("worker '", service_->name(), "': the result"));
    if (!size.ok()) {
      FinishWith(size);
      return;
    }
    service_->stream_stats()->replies_sent.fetch_add(1,
                                                     std::memory_order_relaxed);
    writer_.emplace(std::move(*parts), options.stream.piece_bytes);
    WriteNext();
  }

  // As the client's: a piece whose bytes are still being written waits on
  // the gates thread. No hold is needed: OnDone follows Finish only, which
  // nothing calls while the wait is queued.
  void WriteNext() {
    if (!DeferWrite(*writer_, service_->gates(), service_->stream_stats(),
                    [this] { WriteWhenReady(); })) {
      WriteWhenReady();
    }
  }

  void WriteWhenReady() {
    if (absl::Status ready = writer_->WaitForNext(); !ready.ok()) {
      FinishWith(ready);  // As the client's WriteNext.
      return;
    }
    writer_->Next(&out_, &out_bytes_);
    if (writer_->last()) {
      // No OnWriteDone for this one: counted as handed over.
      service_->stream_stats()->bytes_sent.fetch_add(out_bytes_,
                                                     std::memory_order_relaxed);
      WriteLast();
      return;
    }
    auto* stream = stream_;
    FERRY_TSAN_RELEASE(this);  // gRPC orders OnWriteDone after Write.
    stream->Write(&out_, grpc::WriteOptions());
  }

  // Writes `out_` and the OK status.
  void WriteLast() {
    auto* stream = stream_;
    FERRY_TSAN_RELEASE(this);  // gRPC orders OnDone after this.
    stream->WriteAndFinish(&out_, grpc::WriteOptions(), grpc::Status::OK);
  }

  void FinishWith(const absl::Status& error) {
    grpc::Status status = ToGrpcStatus(error);
    auto* stream = stream_;
    FERRY_TSAN_RELEASE(this);  // gRPC orders OnDone after Finish.
    stream->Finish(std::move(status));
  }

  WorkerService* const service_;
  grpc::CallbackServerContext* const context_;
  const absl::Time start_;
  grpc::ServerCallbackReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>*
      stream_ = nullptr;
  grpc::ByteBuffer in_;
  grpc::ByteBuffer out_;
  uint64_t out_bytes_ = 0;
  std::shared_ptr<void> slot_;  // Set by Admit, before receiver_ allocates.
  bool stranger_ = false;       // Set by Admit (see there).
  StreamReceiver<v1::RpcRequest> receiver_;
  std::optional<PieceWriter> writer_;
};

}  // namespace

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* NewServerStream(
    WorkerService* service, grpc::CallbackServerContext* context) {
  return new ServerStream(service, context);
}

}  // namespace ferry::rpc::grpc_agent
