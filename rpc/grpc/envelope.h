// Envelopes: an RpcRequest/RpcResponse whose `payload` field (a ferry Value
// wire stream, tensor/wire.h) travels as separate gRPC slices.
//
// EncodeEnvelope writes the message's other fields, then the payload's tag
// and length and its head (wire header and metadata) in one slice, then the
// payload's tensor slices, which point at tensor storage (no tensor byte is
// copied). An empty payload is left out. The result is valid protobuf for
// the message type.
//
// SplitEnvelope walks the top-level fields of a received buffer without
// flattening it: every field but the payload is copied into `header` (small;
// parse it with ParseFromString), and the payload is handed back as chunks
// that reference the received slices, for DecodeValue to adopt. Malformed
// input (bad varints, truncation, groups, a duplicated payload, a header over
// the limit) is InvalidArgument naming the problem; nothing is trusted.
//
// Thread safety: reentrant.
#ifndef FERRY_RPC_GRPC_ENVELOPE_H_
#define FERRY_RPC_GRPC_ENVELOPE_H_

#include <grpcpp/support/byte_buffer.h>

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "ferry/common/proto_wire.h"
#include "google/protobuf/message_lite.h"
#include "ferry/tensor/wire.h"

namespace ferry::rpc {

// The field number of `payload` in RpcRequest and RpcResponse (codec.cc,
// which sees the generated code, checks it against both).
inline constexpr int kPayloadField = 15;

// `header` must not have its payload field set.
grpc::ByteBuffer EncodeEnvelope(const google::protobuf::MessageLite& header,
                                EncodedValue payload);
// The same with the header already serialized.
grpc::ByteBuffer EncodeEnvelope(std::string header, EncodedValue payload);

// Appends a protobuf varint (for writing envelope fields by hand).
using ::ferry::proto_wire::AppendVarint;

struct EnvelopeParts {
  std::string header;              // Serialized non-payload fields.
  std::vector<WireChunk> payload;  // Empty when the payload is absent.
  size_t payload_bytes = 0;
  size_t total_bytes = 0;
};

absl::StatusOr<EnvelopeParts> SplitEnvelope(const grpc::ByteBuffer& buffer,
                                            size_t max_header_bytes = 1 << 20);
// The same over the buffer's chunks (ChunksOfByteBuffer), empty ones
// included; the payload's chunks share their keepalives.
absl::StatusOr<EnvelopeParts> SplitEnvelope(absl::Span<const WireChunk> chunks,
                                            size_t max_header_bytes = 1 << 20);

}  // namespace ferry::rpc

#endif  // FERRY_RPC_GRPC_ENVELOPE_H_
