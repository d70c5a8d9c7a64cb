#include "ferry/tensor/wire_grpc.h"

#include <grpc/slice.h>
#include <grpcpp/support/slice.h>

#include <memory>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ferry {
namespace {

// A head this small is copied into its slice rather than handed over.
constexpr size_t kCopiedHeadBytes = 512;

}  // namespace

grpc::ByteBuffer ToByteBuffer(EncodedValue encoded) {
  absl::InlinedVector<grpc::Slice, 4> slices;
  slices.reserve(1 + 2 * encoded.payloads.size());
  if (encoded.head.size() <= kCopiedHeadBytes) {
    // Metadata only (never tensor bytes): one allocation, not two.
    slices.emplace_back(encoded.head.data(), encoded.head.size());
  } else {
    auto head = std::make_unique<std::string>(std::move(encoded.head));
    const char* head_data = head->data();
    const size_t head_size = head->size();
    slices.push_back(SliceOwning(std::move(head), head_data, head_size));
  }
  for (WirePayload& p : encoded.payloads) {
    if (p.size > 0) {
      slices.push_back(SliceOwning(
          std::make_unique<Tensor>(std::move(p.tensor)), p.data, p.size));
    }
    if (p.padding > 0) {
      slices.push_back(grpc::Slice(
          grpc_slice_from_static_buffer(WirePaddingBytes(), p.padding),
          grpc::Slice::STEAL_REF));
    }
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

absl::StatusOr<grpc::ByteBuffer> EncodeToByteBuffer(const Value& value,
                                                    const WireLimits& limits,
                                                    WireStats* stats) {
  absl::StatusOr<EncodedValue> encoded = EncodeValue(value, limits, stats);
  if (!encoded.ok()) return encoded.status();
  return ToByteBuffer(*std::move(encoded));
}

namespace {

// Payloads that adopt the chunk keep the slice referenced. Small slices store
// their bytes inline in the slice object, so the address is taken only once
// the slice has its final (heap) home.
WireChunk ChunkOf(grpc::Slice slice) {
  auto held = std::make_shared<grpc::Slice>(std::move(slice));
  WireChunk c;
  c.data = reinterpret_cast<const char*>(held->begin());
  c.size = held->size();
  c.keepalive = std::move(held);
  return c;
}

}  // namespace

absl::StatusOr<std::vector<WireChunk>> ChunksOfByteBuffer(
    const grpc::ByteBuffer& buffer) {
  std::vector<WireChunk> chunks;
  // Most small messages arrive as one slice: no list of slices for them.
  grpc::Slice single;
  if (buffer.TrySingleSlice(&single).ok()) {
    chunks.push_back(ChunkOf(std::move(single)));
    return chunks;
  }
  std::vector<grpc::Slice> slices;
  grpc::Status st = buffer.Dump(&slices);
  if (!st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "wire decode: cannot read the byte buffer: ", st.error_message()));
  }
  chunks.reserve(slices.size());
  for (grpc::Slice& s : slices) chunks.push_back(ChunkOf(std::move(s)));
  return chunks;
}

absl::StatusOr<Value> DecodeFromByteBuffer(const grpc::ByteBuffer& buffer,
                                           const WireLimits& limits,
                                           WireStats* stats) {
  absl::StatusOr<std::vector<WireChunk>> chunks = ChunksOfByteBuffer(buffer);
  if (!chunks.ok()) return chunks.status();
  return DecodeValue(absl::MakeConstSpan(*chunks), limits, stats);
}

}  // namespace ferry
