// Wire encoding of ferry::Value: protobuf metadata plus uncopied tensor
// payloads.
//
// Stream layout (see proto/tensor.proto):
//   "FRY1" | uint32 LE metadata length | WireMetadata | pad to 64 |
//   payload 0 | pad to 64 | payload 1 | pad to 64 | ...
// Payload offsets are multiples of 64 from the start of the stream, so a
// receiver holding the stream in one aligned buffer can use the payloads in
// place. Nothing in the format limits the size of a tensor or of the stream.
//
// Encode never copies the bytes of contiguous CPU tensors: the EncodedValue
// points at their storage and holds a reference to each tensor. A
// non-contiguous tensor is first made contiguous (one copy, counted in
// WireStats::payload_bytes_copied); CUDA tensors are rejected (Unimplemented).
//
// Decode reads a stream split into arbitrary chunks (as a transport delivers
// it). Metadata in the form EncodeValue writes is read by hand; any other
// valid protobuf encoding of it decodes alike through the protobuf parser. A
// payload that lies inside one chunk that carries a keepalive and is aligned
// for its dtype becomes the tensor's storage without a copy (the tensor keeps
// the keepalive); any other payload is copied once into fresh storage.
// Untrusted input never crashes the decoder: every problem (truncation, bad
// magic, unknown dtype, negative or overflowing shapes, byte-count mismatches,
// nesting or sizes over WireLimits, trailing bytes) is an InvalidArgument
// naming it.
//
// A payload with a ReadyGate (tensor/storage.h) is still being written: its
// reader waits first (WaitPayloadsReady; the transports do, Flatten not).
// Thread safety: the functions are reentrant; WireStats is not synchronized
// (use one per call or per thread).
#ifndef FERRY_TENSOR_WIRE_H_
#define FERRY_TENSOR_WIRE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "ferry/tensor/tensor.h"
#include "ferry/tensor/value.h"

namespace ferry {

inline constexpr size_t kWireAlignment = 64;
inline constexpr size_t kWireHeaderBytes = 8;

struct WireLimits {
  // Deepest nesting of lists and dicts (a flat list has depth 1).
  int max_depth = 64;
  // Largest accepted stream (header + metadata + payloads + padding).
  uint64_t max_total_bytes = uint64_t{64} << 30;
  // Largest accepted metadata message.
  uint64_t max_metadata_bytes = uint64_t{256} << 20;
  // Where decoded tensors that must be copied get their memory (null: CPU).
  Allocator* allocator = nullptr;
};

// Counters the wire code increments as it works (it never resets them), so
// "bytes copied" figures are measured rather than inferred.
struct WireStats {
  uint64_t payload_bytes = 0;  // Tensor payload bytes encoded or decoded.
  uint64_t payload_bytes_copied = 0;   // Of those, bytes the wire code copied.
  uint64_t payload_bytes_adopted = 0;  // Decoded payload bytes used in place.
  uint64_t metadata_bytes = 0;         // Header + metadata bytes.
  uint64_t metadata_bytes_copied = 0;  // Metadata bytes gathered into a buffer.
  // Streams whose metadata the protobuf parser read: not in the form
  // EncodeValue writes (which a hand-written reader takes), or invalid.
  uint64_t metadata_protobuf_parses = 0;
};

// One tensor payload in an encoded stream.
struct WirePayload {
  Tensor tensor;  // Keeps `data` alive.
  const char* data = nullptr;
  size_t size = 0;
  size_t padding = 0;  // Zero bytes that follow it in the stream.
};

struct EncodedValue {
  // Header, metadata and the padding after them.
  std::string head;
  std::vector<WirePayload> payloads;

  size_t total_bytes() const;
  // The whole stream in one string (copies every payload).
  std::string Flatten() const;
};

/// Returns once the first `bytes` bytes of `p` are readable: at once when its
/// storage has no ReadyGate, else that gate's error if it fails.
absl::Status WaitPayloadReady(const WirePayload& p, size_t bytes);
/// WaitPayloadReady without blocking: whether those bytes are readable now
/// (true without a ReadyGate), or the gate's error.
absl::StatusOr<bool> PollPayloadReady(const WirePayload& p, size_t bytes);
/// WaitPayloadReady for the whole of every payload of `v`; the first error.
absl::Status WaitPayloadsReady(const EncodedValue& v);

// kWireAlignment zero bytes, for padding without allocating.
const char* WirePaddingBytes();

absl::StatusOr<EncodedValue> EncodeValue(const Value& value,
                                         const WireLimits& limits = {},
                                         WireStats* stats = nullptr);

// A piece of a received stream. `keepalive` (may be null) owns the bytes; if
// set, the decoder may keep it (through a tensor's storage) instead of
// copying, and the caller must not modify the bytes afterwards.
struct WireChunk {
  const char* data = nullptr;
  size_t size = 0;
  std::shared_ptr<const void> keepalive;
};

/// Where one tensor payload lies in an encoded stream (bytes from its start).
struct WirePayloadExtent {
  uint64_t offset = 0;  ///< A multiple of kWireAlignment.
  uint64_t size = 0;    ///< The payload's bytes (TensorMeta's nbytes).
};

/// The extents of a stream's tensor payloads, in stream order, read from its
/// first bytes `head` (a receiver may call it before the payloads arrived):
/// std::nullopt while `head` is shorter than the header and the metadata.
/// InvalidArgument for what DecodeValue would refuse in the header or the
/// metadata (bad magic, metadata over the limits or not parsing, extents
/// past max_total_bytes); the payloads themselves are not checked. The
/// metadata goes through the protobuf parser, so this costs one parse more
/// than decoding: for receivers that act on payloads as they arrive.
absl::StatusOr<std::optional<std::vector<WirePayloadExtent>>>
ReadPayloadExtents(absl::string_view head, const WireLimits& limits = {});

absl::StatusOr<Value> DecodeValue(absl::Span<const WireChunk> chunks,
                                  const WireLimits& limits = {},
                                  WireStats* stats = nullptr);
// Decodes bytes the caller keeps ownership of (payloads are copied).
absl::StatusOr<Value> DecodeValue(absl::string_view bytes,
                                  const WireLimits& limits = {},
                                  WireStats* stats = nullptr);
// Decodes a buffer the decoder may adopt (tensors may point into it).
absl::StatusOr<Value> DecodeValue(std::shared_ptr<std::string> bytes,
                                  const WireLimits& limits = {},
                                  WireStats* stats = nullptr);

}  // namespace ferry

#endif  // FERRY_TENSOR_WIRE_H_
