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
#include "common/future.h"
#include "proto/rpc.pb.h"
#include "rpc/grpc/envelope.h"
#include "rpc/message.h"
#include "tensor/wire.h"

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

// Splits a received request; the header is parsed, the payload left as
// chunks (decode it with DecodeRequest, off the transport thread).
struct ReceivedRequest {
  ferry::rpc::v1::RpcRequest header;
  EnvelopeParts parts;
};
absl::StatusOr<ReceivedRequest> SplitRequest(const grpc::ByteBuffer& buffer);
absl::StatusOr<Message> DecodeRequest(const ReceivedRequest& received,
                                      absl::Time received_at,
                                      const WireLimits& limits);

// A handler's reply or error. An error the reply cannot be encoded with is
// returned as the status (the caller then fails the RPC with it).
absl::StatusOr<EncodedMessage> EncodeReply(const Result<Message>& reply,
                                           const WireLimits& limits);
// The inner result is the reply or the handler's error (code and text as the
// callee gave them); the outer error is InvalidArgument for a malformed
// envelope or payload.
absl::StatusOr<Result<Message>> DecodeReply(const grpc::ByteBuffer& buffer,
                                            const WireLimits& limits,
                                            uint64_t* bytes);
// The same from a reply already split (or reassembled from a stream).
absl::StatusOr<Result<Message>> DecodeReplyParts(const EnvelopeParts& parts,
                                                 const WireLimits& limits,
                                                 uint64_t* bytes);

}  // namespace ferry::rpc::grpc_agent

#endif  // FERRY_RPC_GRPC_CODEC_H_
