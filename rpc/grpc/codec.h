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

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/future.h"
#include "proto/rpc.pb.h"
#include "rpc/grpc/envelope.h"
#include "rpc/grpc/shm_channel.h"
#include "rpc/message.h"
#include "tensor/wire.h"

namespace ferry::rpc::grpc_agent {

struct EncodedMessage {
  grpc::ByteBuffer buffer;
  uint64_t bytes = 0;  // The payload's wire bytes, wherever they travel.
  // On the same-host channel (shm_channel.h): the payload is not in
  // `buffer`; a request's `lease` keeps it readable until released.
  bool same_host = false;
  std::shared_ptr<void> lease;
};

// The same-host channel a message may use, and the peer's rank (the callee
// for requests and replies received, the caller for requests received and
// replies sent). No channel: payloads travel in the envelope.
struct SameHostLink {
  SameHostChannel* channel = nullptr;
  int peer = -1;
};

absl::StatusOr<EncodedMessage> EncodeRequest(const Message& request,
                                             absl::Time now,
                                             const WireLimits& limits,
                                             SameHostLink link = {});

// Splits a received request; the header is parsed, the payload left as
// chunks (decode it with DecodeRequest, off the transport thread).
struct ReceivedRequest {
  ferry::rpc::v1::RpcRequest header;
  EnvelopeParts parts;
};
absl::StatusOr<ReceivedRequest> SplitRequest(const grpc::ByteBuffer& buffer);
absl::StatusOr<Message> DecodeRequest(const ReceivedRequest& received,
                                      absl::Time received_at,
                                      const WireLimits& limits,
                                      SameHostLink link = {});

// A handler's reply or error. An error the reply cannot be encoded with is
// returned as the status (the caller then fails the RPC with it).
absl::StatusOr<EncodedMessage> EncodeReply(const Result<Message>& reply,
                                           const WireLimits& limits,
                                           SameHostLink link = {});
// The inner result is the reply or the handler's error (code and text as the
// callee gave them); the outer error is InvalidArgument for a malformed
// envelope or payload.
absl::StatusOr<Result<Message>> DecodeReply(const grpc::ByteBuffer& buffer,
                                            const WireLimits& limits,
                                            uint64_t* bytes,
                                            SameHostLink link = {});

}  // namespace ferry::rpc::grpc_agent

#endif  // FERRY_RPC_GRPC_CODEC_H_
