// Streamed calls of the gRPC agent: payloads at or above
// StreamOptions::threshold_bytes travel through the Worker service's
// CallStream method (proto/rpc.proto) as pieces of about `piece_bytes`,
// instead of one unary message.
//
// Sending: the first message carries the envelope fields and payload_bytes
// (the payload's length), every message one piece of the payload. Pieces are
// sub-slices of the encoded Value (tensor/wire_grpc.h): no tensor byte is
// copied. One write is outstanding per call, so gRPC's HTTP/2 flow control
// holds a sender back while its receiver is slow.
//
// Receiving: payload_bytes is checked against the limits (max_message_bytes,
// WireLimits::max_total_bytes) before anything is allocated; then one
// 64-byte aligned buffer of that size is allocated and each piece is copied
// into it as it arrives (the one copy on receive, as on the unary path), and
// the next piece is read only after that. The decoded tensors live in that
// buffer (no further copy). Ferry holds at most one received piece outside
// it at a time (StreamStats::max_piece_bytes shows it).
//
// Replies to a streamed request come back the same way when they are at or
// above the callee's threshold, else as one message. Replies to unary
// requests stay unary (a small request with a large result: see
// StreamOptions).
//
// Errors are those of the unary path: oversize payloads are
// ResourceExhausted naming the worker, function and limit; a peer that goes
// away mid-stream fails the call with Unavailable naming it (and starts the
// agent's peer probe); malformed streams are InvalidArgument.
//
// Thread safety: StreamStats counters are atomics. The reactors follow
// gRPC's callback rules (one read and one write outstanding, sequential
// callbacks per direction).
#ifndef FERRY_RPC_GRPC_STREAM_H_
#define FERRY_RPC_GRPC_STREAM_H_

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/rpc.pb.h"
#include "rpc/grpc/codec.h"
#include "tensor/storage.h"
#include "tensor/wire.h"

namespace ferry::rpc {

struct StreamOptions {
  // false: every message is one unary gRPC message (the path before
  // streaming; limited to max_message_bytes <= 2 GiB - 1 by gRPC).
  bool enabled = true;
  // Requests whose encoded payload has at least this many bytes are
  // streamed; a streamed request's reply is streamed when it has at least
  // this many bytes (the callee's setting). Smaller calls stay unary (their
  // latency is unchanged). Replies to unary requests are never streamed.
  uint64_t threshold_bytes = uint64_t{1} << 20;
  // Target size of one piece (pieces are the payload split evenly, each
  // between this and twice this, the last message possibly smaller).
  size_t piece_bytes = size_t{1} << 20;
  // For tests: called on gRPC's thread after each received piece was copied
  // into place, with the payload bytes received so far and the total. A slow
  // hook is a slow receiver. Must not block on this agent's calls.
  std::function<void(uint64_t received, uint64_t total)> after_piece_received;
};

// Counters of one agent's streamed calls; monotonic.
struct StreamStats {
  std::atomic<uint64_t> requests_sent{0};      // Streamed requests started.
  std::atomic<uint64_t> requests_received{0};  // Streamed requests admitted.
  std::atomic<uint64_t> replies_sent{0};       // Replies streamed back.
  std::atomic<uint64_t> replies_received{0};   // Streamed replies begun.
  // Payload bytes whose write gRPC completed (requests and replies).
  std::atomic<uint64_t> bytes_sent{0};
  // Payload bytes copied from received pieces into their destination buffer
  // (the only copy on receive).
  std::atomic<uint64_t> bytes_received{0};
  // Largest received piece Ferry held at once before copying it.
  std::atomic<uint64_t> max_piece_bytes{0};
};

namespace grpc_agent {

inline constexpr char kCallStreamMethod[] = "/ferry.rpc.v1.Worker/CallStream";

class WorkerService;

// Whether a payload of `bytes` goes through CallStream.
inline bool ShouldStream(const StreamOptions& options, uint64_t bytes) {
  return options.enabled && bytes >= options.threshold_bytes;
}

// ResourceExhausted when `bytes` is over `max_message_bytes` or the wire
// limit; `what` names the payload ("worker 'a' sending the arguments of
// 'f'").
absl::Status CheckStreamSize(uint64_t bytes, int max_message_bytes,
                             const WireLimits& limits, const std::string& what);

// Cuts an envelope into CallStream messages. No tensor byte is copied.
class PieceWriter {
 public:
  PieceWriter(EncodedParts parts, size_t piece_bytes);
  // The next message, and the payload bytes in it; false after the last.
  bool Next(grpc::ByteBuffer* message, uint64_t* payload_bytes);
  bool last() const { return index_ >= slices_.size(); }
  uint64_t total_bytes() const { return total_; }

 private:
  std::string header_;  // Sent in the first message only.
  std::vector<grpc::Slice> slices_;
  size_t index_ = 0;   // Current slice.
  size_t offset_ = 0;  // Bytes of it already sent.
  uint64_t total_ = 0;
  uint64_t target_ = 0;  // Payload bytes per message.
  bool started_ = false;
};

// Puts a streamed payload back together in one aligned buffer.
class PieceAssembler {
 public:
  // Allocates `total` bytes (from `allocator`, null: CPU).
  absl::Status Start(uint64_t total, Allocator* allocator);
  // Copies the next piece into place; InvalidArgument past the end.
  absl::Status Add(const std::vector<WireChunk>& piece, StreamStats* stats);
  bool complete() const { return received_ == total_; }
  uint64_t received() const { return received_; }
  uint64_t total() const { return total_; }
  // The whole envelope: `header` and the payload as one chunk that keeps the
  // buffer alive (tensors decoded from it adopt it).
  EnvelopeParts Take(std::string header);

 private:
  Storage storage_;
  uint64_t total_ = 0;
  uint64_t received_ = 0;
};

// One streamed outgoing call. Shared by the agent's OutgoingCall, which the
// done callback (run from OnDone, the reactor's last event) deletes, and the
// thread that runs Start, which holds it until Start returned.
class ClientStream final
    : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  struct Config {
    const StreamOptions* options;
    const WireLimits* limits;
    int max_message_bytes;
    StreamStats* stats;
  };
  ClientStream(EncodedParts request, Config config,
               std::function<void(const grpc::Status&)> done);

  void Start(grpc::GenericStub* stub, grpc::ClientContext* context);
  // After done: the decoded reply, or the stream's own error (a reply over
  // the limits, a malformed or truncated reply) when there was one.
  // `link`: a reply the peer left on the same-host channel is fetched there.
  absl::StatusOr<Result<Message>> DecodeReply(uint64_t* bytes_in,
                                              SameHostLink link = {});
  // Set when the stream failed on this side (the call was cancelled for it).
  const absl::Status& error() const { return error_; }

  void OnWriteDone(bool ok) override;
  void OnReadDone(bool ok) override;
  void OnDone(const grpc::Status& status) override;

 private:
  void WriteNext();
  absl::Status Receive();
  void Fail(absl::Status error);

  const Config config_;
  std::function<void(const grpc::Status&)> done_;
  grpc::ClientContext* context_ = nullptr;
  PieceWriter writer_;
  grpc::ByteBuffer out_;
  uint64_t out_bytes_ = 0;
  grpc::ByteBuffer in_;
  bool have_header_ = false;
  bool reply_complete_ = false;
  std::string reply_header_;
  EnvelopeParts reply_;  // When the reply came in one message.
  PieceAssembler assembler_;
  absl::Status error_;
};

// The reactor serving one CallStream call (it deletes itself when done).
grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* NewServerStream(
    WorkerService* service, grpc::CallbackServerContext* context);

}  // namespace grpc_agent
}  // namespace ferry::rpc

#endif  // FERRY_RPC_GRPC_STREAM_H_
