// Message <-> gRPC envelope (proto/rpc.proto RpcRequest / RpcResponse, with
// the payload as separate slices: rpc/grpc/envelope.h).
//
// Deadlines cross as remaining time: EncodeRequest writes
// `request.deadline - now`; DecodeRequest sets `received + remaining`.
// Decoding trusts nothing: malformed fields are InvalidArgument naming what.
//
// Thread safety: reentrant.
#ifndef FERRY_RPC_GRPC_CODEC_H_
#define FERRY_RPC_GRPC_CODEC_H_

#include <grpcpp/support/byte_buffer.h>

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ferry/common/future.h"
#include "ferry/proto/rpc.pb.h"
#include "ferry/rpc/grpc/envelope.h"
#include "ferry/rpc/grpc/shm_channel.h"
#include "ferry/rpc/message.h"
#include "ferry/tensor/wire.h"

namespace ferry::rpc::grpc_agent {

struct EncodedMessage {
  grpc::ByteBuffer buffer;
  uint64_t bytes = 0;
};

absl::StatusOr<EncodedMessage> EncodeRequest(const Message& request,
                                             absl::Time now,
                                             const WireLimits& limits);

// An envelope not yet put together: its serialized fields (no payload) and
// the payload, so a sender can choose between one message (ToEnvelope) and
// a stream of pieces (rpc/grpc/stream.h). No tensor byte is copied.
struct EncodedParts {
  std::string header;
  EncodedValue payload;
  uint64_t bytes() const { return payload.total_bytes(); }
};
absl::StatusOr<EncodedParts> EncodeRequestParts(const Message& request,
                                                absl::Time now,
                                                const WireLimits& limits);
absl::StatusOr<EncodedParts> EncodeReplyParts(const Result<Message>& reply,
                                              const WireLimits& limits);
EncodedMessage ToEnvelope(EncodedParts parts);

// The same-host channel a message may use, and the peer's rank (the callee
// for requests sent and replies received, the caller for requests received
// and replies sent). No channel: payloads travel in the envelope.
struct SameHostLink {
  SameHostChannel* channel = nullptr;
  int peer = -1;
};
// Leaves the payload of `parts` in place when the same-host channel takes
// it (shm_channel.h): its descriptor joins the header and the payload is
// emptied, so the envelope is small (and never streamed: the channel takes
// precedence). With `lease` (a request), the payload stays readable until
// *lease is destroyed; a reply's lives until the peer acknowledges it.
// Returns whether the channel took it.
bool OfferSameHost(EncodedParts& parts, const SameHostLink& link,
                   std::shared_ptr<void>* lease);

// Splits a received request; the header is parsed, the payload left as
// chunks (decode it with DecodeRequest, off the transport thread).
struct ReceivedRequest {
  ferry::rpc::v1::RpcRequest header;
  EnvelopeParts parts;
};
absl::StatusOr<ReceivedRequest> SplitRequest(const grpc::ByteBuffer& buffer);
// A same-host payload is fetched through `link` (an error without one).
absl::StatusOr<Message> DecodeRequest(const ReceivedRequest& received,
                                      absl::Time received_at,
                                      const WireLimits& limits,
                                      SameHostLink link = {});

// A handler's reply or error. An error the reply cannot be encoded with is
// returned as the status (the caller then fails the RPC with it).
absl::StatusOr<EncodedMessage> EncodeReply(const Result<Message>& reply,
                                           const WireLimits& limits);
// The inner result is the reply or the handler's error (code and text as the
// callee gave them); the outer error is InvalidArgument for a malformed
// envelope or payload.
absl::StatusOr<Result<Message>> DecodeReply(const grpc::ByteBuffer& buffer,
                                            const WireLimits& limits,
                                            uint64_t* bytes,
                                            SameHostLink link = {});
// The same from a reply already split (or reassembled from a stream).
absl::StatusOr<Result<Message>> DecodeReplyParts(const EnvelopeParts& parts,
                                                 const WireLimits& limits,
                                                 uint64_t* bytes,
                                                 SameHostLink link = {});

}  // namespace ferry::rpc::grpc_agent

#endif  // FERRY_RPC_GRPC_CODEC_H_
