// Streamed calls of the gRPC agent: payloads at or above
// StreamOptions::threshold_bytes travel through the Worker service's
// CallStream method (proto/rpc.proto) as pieces of about `piece_bytes`,
// instead of one unary message. Replies to a streamed request come back the
// same way when they are at or above the callee's threshold, else as one
// message; replies to unary requests stay unary (see StreamOptions).
//
// Contract: no tensor byte is copied on send; on receive, payload_bytes is
// checked against the limits (max_message_bytes, WireLimits::max_total_bytes)
// before anything is allocated, each piece is copied once into one aligned
// buffer that the decoded tensors then live in, and at most one received
// piece is held outside it (StreamStats::max_piece_bytes shows it). One
// write is outstanding per call, so HTTP/2 flow control holds back a sender
// whose receiver is slow.
//
// Errors are those of the unary path: oversize payloads are
// ResourceExhausted naming the worker, function and limit; a peer that goes
// away mid-stream fails the call with Unavailable naming it (and starts the
// agent's peer probe); malformed streams are InvalidArgument.
//
// Thread safety: StreamStats counters are atomics. The reactors follow
// gRPC's callback rules (one read and one write outstanding, sequential
// callbacks per direction). A piece whose payload bytes are still being
// written (pipelined device staging) is waited for on the agent's gates
// thread, not on gRPC's (a client stream holds itself open meanwhile).
// Design: docs/design/grpc_agent.md ("Streamed calls").
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
#include "ferry/common/executor.h"
#include "ferry/common/sync.h"
#include "ferry/proto/rpc.pb.h"
#include "ferry/rpc/grpc/codec.h"
#include "ferry/rpc/grpc/stream_pieces.h"
#include "ferry/tensor/storage.h"
#include "ferry/tensor/wire.h"

namespace ferry::rpc::grpc_agent {

inline constexpr char kCallStreamMethod[] = "/ferry.rpc.v1.Worker/CallStream";

class WorkerService;

// Whether a payload of `bytes` goes through CallStream.
inline bool ShouldStream(const StreamOptions& options, uint64_t bytes) {
  return options.enabled && bytes >= options.threshold_bytes;
}

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
    ReceiveBufferPool* pool = nullptr;  // For the reply's payload.
    std::string peer;  // The callee's name (for StreamOptions::observer).
    // Where a write waits for payload bytes still being written, instead
    // of gRPC's thread (null: on that thread).
    Executor* gates = nullptr;
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
  absl::Status error() const ABSL_LOCKS_EXCLUDED(error_mu_);

  void OnWriteDone(bool ok) override;
  void OnReadDone(bool ok) override;
  void OnDone(const grpc::Status& status) override;

 private:
  // The next write: at once when its payload bytes are readable, else
  // from config_.gates once they are.
  void WriteNext();
  void WriteWhenReady();
  // Ends the hold Start took (config_.gates set), once the writes ended.
  void EndWrites();
  void Fail(absl::Status error);

  const Config config_;
  std::function<void(const grpc::Status&)> done_;
  grpc::ClientContext* context_ = nullptr;
  PieceWriter writer_;
  grpc::ByteBuffer out_;
  uint64_t out_bytes_ = 0;
  grpc::ByteBuffer in_;
  StreamReceiver<v1::RpcResponse> receiver_;
  EnvelopeParts reply_;  // Once the receiver completed.
  // The first failure on this side: the read side and the write side (the
  // gates thread) may fail at once.
  mutable Mutex error_mu_;
  absl::Status error_ ABSL_GUARDED_BY(error_mu_);
};

// The reactor serving one CallStream call (it deletes itself when done).
grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* NewServerStream(
    WorkerService* service, grpc::CallbackServerContext* context);

}  // namespace ferry::rpc::grpc_agent

#endif  // FERRY_RPC_GRPC_STREAM_H_
