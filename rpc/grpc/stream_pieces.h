// The transport-free parts of streamed calls (rpc/grpc/stream.h): cutting an
// envelope into CallStream messages (PieceWriter) and putting a received
// stream back together (StreamReceiver, PieceAssembler). They take and
// return grpc::ByteBuffers but need no channel or server, so the receive
// path is fuzzed (//rpc/grpc:stream_fuzz) exactly as the reactors run it.
//
// Thread safety: StreamStats counters are atomics; every other class here
// is driven by one thread at a time (a reactor's sequential callbacks).
#ifndef FERRY_RPC_GRPC_STREAM_PIECES_H_
#define FERRY_RPC_GRPC_STREAM_PIECES_H_

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "ferry/proto/rpc.pb.h"
#include "ferry/rpc/grpc/buffer_pool.h"
#include "ferry/rpc/grpc/codec.h"
#include "ferry/rpc/grpc/envelope.h"
#include "ferry/rpc/receive_observer.h"
#include "ferry/tensor/storage.h"
#include "ferry/tensor/wire.h"

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
  // A layer that acts on streamed payloads as they arrive
  // (rpc/receive_observer.h); null: none.
  std::shared_ptr<ReceiveObserver> observer;
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
  // Pieces whose payload bytes were still being written when their turn
  // came (pipelined device staging): waited for on the agent's gates
  // thread instead of gRPC's.
  std::atomic<uint64_t> writes_deferred{0};
};

namespace grpc_agent {

// ResourceExhausted when `bytes` is over `max_message_bytes` or the wire
// limit; `what` names the payload ("worker 'a' sending the arguments of
// 'f'").
absl::Status CheckStreamSize(uint64_t bytes, int max_message_bytes,
                             const WireLimits& limits, const std::string& what);

// Cuts an envelope into CallStream messages. No tensor byte is copied.
// Payloads still being written (a ReadyGate on their storage, pipelined
// device staging) are waited for piece by piece: WaitForNext, before Next.
class PieceWriter {
 public:
  PieceWriter(EncodedParts parts, size_t piece_bytes);
  // Returns once the payload bytes the next message covers are readable
  // (at once without gated payloads); the gate's error if a write failed.
  absl::Status WaitForNext();
  // Without blocking: whether WaitForNext would return at once (true), or
  // the gate's error.
  absl::StatusOr<bool> NextReady();
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
  uint64_t position_ = 0;  // Payload bytes taken into messages so far.
  bool started_ = false;
  // Gated payloads, in stream order, from where each begins in the stream.
  struct Gated {
    uint64_t begin;
    WirePayload payload;
  };
  std::vector<Gated> gated_;
  size_t gated_done_ = 0;  // gated_[0, gated_done_) are wholly readable.
  // WaitForNext (`wait`) or NextReady.
  absl::StatusOr<bool> Advance(bool wait);
};

// Puts a streamed payload back together in one aligned buffer.
class PieceAssembler {
 public:
  // Allocates `total` bytes (from `allocator`, null: CPU), through `pool`
  // when there is one (a reused buffer is already faulted in).
  absl::Status Start(uint64_t total, Allocator* allocator,
                     ReceiveBufferPool* pool = nullptr);
  // The buffer, once started.
  const Storage& buffer() const { return storage_; }
  // Copies the next piece into place; InvalidArgument past the end.
  absl::Status Add(absl::Span<const WireChunk> piece, StreamStats* stats);
  bool complete() const { return received_ == total_; }
  uint64_t received() const { return received_; }
  uint64_t total() const { return total_; }
  // The whole envelope: `header` and the payload as one chunk that keeps the
  // buffer alive (tensors decoded from it adopt it), and `attached` with it.
  EnvelopeParts Take(std::string header,
                     std::shared_ptr<const void> attached = nullptr);

 private:
  Storage storage_;
  uint64_t total_ = 0;
  uint64_t received_ = 0;
};

// The progress of a received message with `header` (v1::RpcRequest or
// v1::RpcResponse) from `peer`, when `observer` has one for it.
template <typename Header>
std::shared_ptr<ReceiveProgress> ObserveReceive(ReceiveObserver* observer,
                                                bool request,
                                                std::string_view peer,
                                                const Header& header) {
  if (observer == nullptr) return nullptr;
  for (const auto& h : header.headers()) {
    if (h.layer() == observer->layer()) {
      return observer->Observe({.request = request,
                                .peer = peer,
                                .header = &h.bytes(),
                                .payload_bytes = header.payload_bytes()});
    }
  }
  return nullptr;
}

// The receiving side of one CallStream call (the request on the server, the
// reply on the client), fed the messages in order. The first message
// carries the envelope fields (`Header`: v1::RpcRequest or v1::RpcResponse)
// and payload_bytes; 0 means the whole envelope is in that message. A
// declared length is checked against the limits (ResourceExhausted, named
// by `describe`) and `on_header` runs before anything is allocated; then
// the pieces are copied into one aligned buffer (PieceAssembler). A
// streamed payload's progress, when `observe` returns one
// (rpc/receive_observer.h), supplies the buffer's allocator, sees each piece
// arrive and goes with the payload (or is dropped with a failed stream).
// Malformed streams (envelope fields after the first message, pieces past
// the declared length, a message after the last) are InvalidArgument.
template <typename Header>
class StreamReceiver {
 public:
  struct Config {
    const StreamOptions* options;
    const WireLimits* limits;
    int max_message_bytes;  // < 0: none.
    StreamStats* stats;
    // Incremented for each stream whose payload comes in pieces.
    std::atomic<uint64_t>* streamed = nullptr;
    // Where payload buffers come from (null: allocated fresh each time).
    ReceiveBufferPool* pool = nullptr;
  };
  using Observe =
      std::function<std::shared_ptr<ReceiveProgress>(const Header&)>;
  StreamReceiver(Config config,
                 std::function<std::string(const Header&)> describe,
                 std::function<absl::Status(const Header&)> on_header = {},
                 Observe observe = {});

  // Takes the next message; true once the envelope is complete.
  absl::StatusOr<bool> Receive(const grpc::ByteBuffer& message);

  bool started() const { return started_; }
  bool complete() const { return complete_; }
  // The first message's fields, once started.
  const Header& header() const { return header_; }
  uint64_t received() const { return assembler_.received(); }
  uint64_t total() const { return assembler_.total(); }
  // Once complete, once: the whole envelope.
  EnvelopeParts Take() { return std::move(whole_); }

 private:
  const Config config_;
  const std::function<std::string(const Header&)> describe_;
  const std::function<absl::Status(const Header&)> on_header_;
  const Observe observe_;
  std::shared_ptr<ReceiveProgress> progress_;  // Until complete.
  bool started_ = false;
  bool complete_ = false;
  Header header_;
  std::string fields_;  // The serialized fields, until complete.
  PieceAssembler assembler_;
  EnvelopeParts whole_;
};

}  // namespace grpc_agent
}  // namespace ferry::rpc

#endif  // FERRY_RPC_GRPC_STREAM_PIECES_H_
