#include "rpc/grpc/stream.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/status.h"
#include "common/tsan.h"
#include "rpc/grpc/envelope.h"
#include "rpc/grpc/service.h"
#include "tensor/wire_grpc.h"

namespace ferry::rpc::grpc_agent {
namespace {

namespace v1 = ::ferry::rpc::v1;

// Field 14 (payload_bytes) of RpcRequest and RpcResponse, as a varint.
constexpr uint64_t kPayloadBytesTag = (uint64_t{14} << 3) | 0;

void RecordPiece(StreamStats* stats, uint64_t bytes) {
  uint64_t seen = stats->max_piece_bytes.load(std::memory_order_relaxed);
  while (bytes > seen && !stats->max_piece_bytes.compare_exchange_weak(
                             seen, bytes, std::memory_order_relaxed)) {
  }
}

// Splits a received message; `first` allows envelope fields, later messages
// carry only a piece of the payload.
absl::StatusOr<EnvelopeParts> SplitMessage(const grpc::ByteBuffer& message,
                                           bool first) {
  ASSIGN_OR_RETURN(EnvelopeParts parts, SplitEnvelope(message));
  if (!first && !parts.header.empty()) {
    return absl::InvalidArgumentError(
        "stream: a payload piece carries envelope fields");
  }
  return parts;
}

// Reads the declared payload length of a first message. Any other
// payload_bytes than 0 must be at least the piece in the first message.
template <typename Header>
absl::StatusOr<Header> ParseHeader(const EnvelopeParts& parts,
                                   const char* type) {
  Header h;
  if (!h.ParseFromString(parts.header)) {
    return absl::InvalidArgumentError(
        absl::StrCat("stream: malformed ", type, " fields"));
  }
  if (h.payload_bytes() != 0 && h.payload_bytes() < parts.payload_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "stream: declared payload of ", h.payload_bytes(),
        " bytes is smaller than its first piece (", parts.payload_bytes, ")"));
  }
  return h;
}

}  // namespace

absl::Status CheckStreamSize(uint64_t bytes, int max_message_bytes,
                             const WireLimits& limits,
                             const std::string& what) {
  if (max_message_bytes >= 0 &&
      bytes > static_cast<uint64_t>(max_message_bytes)) {
    return absl::ResourceExhaustedError(
        absl::StrCat(what, " is ", bytes, " bytes, over the limit of ",
                     max_message_bytes, " bytes (max_message_bytes)"));
  }
  if (bytes > limits.max_total_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        what, " is ", bytes, " bytes, over the limit of ",
        limits.max_total_bytes, " bytes (WireLimits::max_total_bytes)"));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// PieceWriter / PieceAssembler.

PieceWriter::PieceWriter(EncodedParts parts, size_t piece_bytes)
    : header_(std::move(parts.header)), total_(parts.payload.total_bytes()) {
  grpc::ByteBuffer payload = ToByteBuffer(std::move(parts.payload));
  (void)payload.Dump(&slices_);
  // Even pieces, each at least piece_bytes (but the only one).
  const uint64_t step = std::max<uint64_t>(1, piece_bytes);
  const uint64_t count = std::max<uint64_t>(1, total_ / step);
  target_ = (total_ + count - 1) / count;
  AppendVarint(&header_, kPayloadBytesTag);
  AppendVarint(&header_, total_);
}

bool PieceWriter::Next(grpc::ByteBuffer* message, uint64_t* payload_bytes) {
  if (started_ && last()) return false;
  std::vector<grpc::Slice> slices(1);  // [0]: fields, piece tag and length.
  uint64_t taken = 0;
  while (taken < target_ && index_ < slices_.size()) {
    const grpc::Slice& s = slices_[index_];
    const size_t take = std::min<uint64_t>(target_ - taken, s.size() - offset_);
    if (take > 0) slices.push_back(s.sub(offset_, offset_ + take));
    taken += take;
    offset_ += take;
    if (offset_ == s.size()) {
      ++index_;
      offset_ = 0;
    }
  }
  std::string head = started_ ? std::string() : std::move(header_);
  started_ = true;
  AppendVarint(&head, (uint64_t{kPayloadField} << 3) | 2);
  AppendVarint(&head, taken);
  slices[0] = grpc::Slice(head);  // A few bytes, copied.
  *message = grpc::ByteBuffer(slices.data(), slices.size());
  *payload_bytes = taken;
  return true;
}

absl::Status PieceAssembler::Start(uint64_t total, Allocator* allocator) {
  if (allocator == nullptr) allocator = GetCpuAllocator();
  ASSIGN_OR_RETURN(storage_, allocator->Allocate(total));
  total_ = total;
  received_ = 0;
  return absl::OkStatus();
}

absl::Status PieceAssembler::Add(const std::vector<WireChunk>& piece,
                                 StreamStats* stats) {
  uint64_t bytes = 0;
  for (const WireChunk& c : piece) bytes += c.size;
  if (bytes > total_ - received_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "stream: pieces run past the declared payload of ", total_, " bytes"));
  }
  RecordPiece(stats, bytes);
  char* out = static_cast<char*>(storage_.data()) + received_;
  for (const WireChunk& c : piece) {
    std::memcpy(out, c.data, c.size);
    out += c.size;
  }
  received_ += bytes;
  stats->bytes_received.fetch_add(bytes, std::memory_order_relaxed);
  return absl::OkStatus();
}

EnvelopeParts PieceAssembler::Take(std::string header) {
  EnvelopeParts parts;
  parts.header = std::move(header);
  parts.payload_bytes = total_;
  parts.total_bytes = parts.header.size() + total_;
  auto held = std::make_shared<Storage>(std::move(storage_));
  const char* data = static_cast<const char*>(held->data());
  parts.payload.push_back(WireChunk{data, total_, std::move(held)});
  return parts;
}

// ---------------------------------------------------------------------------
// Client.

ClientStream::ClientStream(EncodedParts request, Config config,
                           std::function<void(const grpc::Status&)> done)
    : config_(config),
      done_(std::move(done)),
      writer_(std::move(request), config.options->piece_bytes) {}

void ClientStream::Start(grpc::GenericStub* stub,
                         grpc::ClientContext* context) {
  context_ = context;
  config_.stats->requests_sent.fetch_add(1, std::memory_order_relaxed);
  stub->PrepareBidiStreamingCall(context, kCallStreamMethod,
                                 grpc::StubOptions(), this);
  // Each release right before a Start*: gRPC orders the matching callback
  // after it.
  FERRY_TSAN_RELEASE(this);
  StartRead(&in_);
  WriteNext();
  FERRY_TSAN_RELEASE(this);
  StartCall();
}

void ClientStream::WriteNext() {
  writer_.Next(&out_, &out_bytes_);
  FERRY_TSAN_RELEASE(this);
  if (writer_.last()) {
    StartWriteLast(&out_, grpc::WriteOptions());
  } else {
    StartWrite(&out_);
  }
}

void ClientStream::OnWriteDone(bool ok) {
  FERRY_TSAN_ACQUIRE(this);
  if (!ok) return;  // The call failed; OnDone has its status.
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
  absl::Status received = Receive();
  in_.Clear();
  if (!received.ok()) {
    Fail(std::move(received));
  } else {
    FERRY_TSAN_RELEASE(this);
    StartRead(&in_);  // The next piece, or the end of the stream.
  }
  FERRY_TSAN_RELEASE(this);  // As in OnWriteDone.
}

absl::Status ClientStream::Receive() {
  if (reply_complete_) {
    return absl::InvalidArgumentError("stream: a message after the reply");
  }
  ASSIGN_OR_RETURN(EnvelopeParts parts, SplitMessage(in_, !have_header_));
  if (!have_header_) {
    have_header_ = true;
    ASSIGN_OR_RETURN(v1::RpcResponse h,
                     ParseHeader<v1::RpcResponse>(parts, "RpcResponse"));
    if (h.payload_bytes() == 0) {  // The whole reply in one message.
      reply_ = std::move(parts);
      reply_complete_ = true;
      return absl::OkStatus();
    }
    RETURN_IF_ERROR(CheckStreamSize(h.payload_bytes(),
                                    config_.max_message_bytes, *config_.limits,
                                    "the streamed reply"));
    config_.stats->replies_received.fetch_add(1, std::memory_order_relaxed);
    RETURN_IF_ERROR(
        assembler_.Start(h.payload_bytes(), config_.limits->allocator));
    reply_header_ = std::move(parts.header);
  }
  RETURN_IF_ERROR(assembler_.Add(parts.payload, config_.stats));
  if (config_.options->after_piece_received) {
    config_.options->after_piece_received(assembler_.received(),
                                          assembler_.total());
  }
  if (assembler_.complete()) {
    reply_ = assembler_.Take(std::move(reply_header_));
    reply_complete_ = true;
  }
  return absl::OkStatus();
}

void ClientStream::Fail(absl::Status error) {
  error_ = std::move(error);
  context_->TryCancel();  // OnDone follows, with CANCELLED.
}

void ClientStream::OnDone(const grpc::Status& status) {
  FERRY_TSAN_ACQUIRE(this);
  // May delete this (the owner's OutgoingCall): nothing after it.
  done_(status);
}

absl::StatusOr<Result<Message>> ClientStream::DecodeReply(uint64_t* bytes_in,
                                                          SameHostLink link) {
  if (!error_.ok()) return error_;
  if (!reply_complete_) {
    return absl::InvalidArgumentError(
        absl::StrCat("stream: the reply ended after ", assembler_.received(),
                     " of ", assembler_.total(), " payload bytes"));
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
      : service_(service), context_(context), start_(absl::Now()) {}

  void OnReadDone(bool ok) override {
    FERRY_TSAN_ACQUIRE(this);
    if (!ok) {
      // The client went away or closed early; nothing was dispatched.
      FinishWith(absl::CancelledError(absl::StrCat(
          "worker '", service_->name(), "': the request stream ended after ",
          assembler_.received(), " of ", assembler_.total(),
          " payload bytes")));
      return;
    }
    absl::StatusOr<bool> complete = Receive();
    in_.Clear();
    if (!complete.ok()) {
      FinishWith(complete.status());
    } else if (*complete) {
      Dispatch();
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

  // Takes one message; true once the request is complete.
  absl::StatusOr<bool> Receive() {
    const bool first = request_ == nullptr;
    ASSIGN_OR_RETURN(EnvelopeParts parts, SplitMessage(in_, first));
    if (first) {
      request_ = std::make_shared<ReceivedRequest>();
      ASSIGN_OR_RETURN(request_->header,
                       ParseHeader<v1::RpcRequest>(parts, "RpcRequest"));
      const v1::RpcRequest& h = request_->header;
      RETURN_IF_ERROR(CheckStreamSize(
          h.payload_bytes(), service_->options().max_message_bytes,
          service_->options().wire_limits,
          absl::StrCat("worker '", service_->name(), "': the streamed ",
                       h.type() == v1::CALL
                           ? absl::StrCat("arguments of '", h.function(), "'")
                           : std::string("payload"))));
      ASSIGN_OR_RETURN(slot_, service_->Admit(h, context_->peer()));
      if (h.payload_bytes() == 0) {
        request_->parts = std::move(parts);
        return true;
      }
      service_->stream_stats()->requests_received.fetch_add(
          1, std::memory_order_relaxed);
      RETURN_IF_ERROR(assembler_.Start(
          h.payload_bytes(), service_->options().wire_limits.allocator));
      header_ = std::move(parts.header);
    }
    RETURN_IF_ERROR(assembler_.Add(parts.payload, service_->stream_stats()));
    const StreamOptions& options = service_->options().stream;
    if (options.after_piece_received) {
      options.after_piece_received(assembler_.received(), assembler_.total());
    }
    if (!assembler_.complete()) return false;
    request_->parts = assembler_.Take(std::move(header_));
    return true;
  }

  void Dispatch() {
    service_->Serve(start_, std::move(request_), std::move(slot_),
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

  void WriteNext() {
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
  std::shared_ptr<ReceivedRequest> request_;
  std::shared_ptr<void> slot_;
  std::string header_;
  PieceAssembler assembler_;
  std::optional<PieceWriter> writer_;
};

}  // namespace

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* NewServerStream(
    WorkerService* service, grpc::CallbackServerContext* context) {
  return new ServerStream(service, context);
}

}  // namespace ferry::rpc::grpc_agent
