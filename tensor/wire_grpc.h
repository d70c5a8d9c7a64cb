// The wire encoding (tensor/wire.h) as a grpc::ByteBuffer.
//
// Sending: the ByteBuffer is a list of slices: one for the header and
// metadata, one per tensor payload pointing straight at the tensor's storage,
// and static zero slices for padding. Each payload slice holds a reference to
// its tensor, dropped when gRPC releases the slice, so the tensor may be
// destroyed by the caller right after encoding. No tensor byte is copied.
// (The caller must not modify the tensors until gRPC has sent the message.)
//
// Receiving: the ByteBuffer's slices are referenced, not copied, and payloads
// lying inside one aligned slice become tensor storage that keeps the slice
// alive; others are copied once (see DecodeValue in wire.h). Note that a
// ByteBuffer that never crossed a socket (same process, EncodeToByteBuffer
// then DecodeFromByteBuffer) still holds the sender's slices: the decoded
// tensors then share memory with the sent ones. Clone before writing if the
// sender may still read them.
//
// gRPC's own default limit on received messages is 4 MiB; servers and
// channels carrying tensors should raise it (SetMaxReceiveMessageSize(-1)).
//
// Thread safety: reentrant.
#ifndef FERRY_TENSOR_WIRE_GRPC_H_
#define FERRY_TENSOR_WIRE_GRPC_H_

#include <grpc/slice.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include <cstddef>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "ferry/common/tsan.h"
#include "ferry/tensor/value.h"
#include "ferry/tensor/wire.h"

namespace ferry {

// A slice over `size` bytes at `data`, memory that `owner` keeps alive; gRPC
// deletes `owner` when it drops the slice's last reference, on whichever of
// its threads does.
template <typename T>
grpc::Slice SliceOwning(std::unique_ptr<T> owner, const void* data,
                        size_t size) {
  T* raw = owner.release();
  // gRPC's slice reference count orders the deleter after this hand-off.
  FERRY_TSAN_RELEASE(raw);
  grpc_slice s = grpc_slice_new_with_user_data(
      const_cast<void*>(data), size,
      [](void* p) {
        FERRY_TSAN_ACQUIRE(p);  // Pairs with the release above.
        delete static_cast<T*>(p);
      },
      raw);
  return grpc::Slice(s, grpc::Slice::STEAL_REF);
}

absl::StatusOr<grpc::ByteBuffer> EncodeToByteBuffer(
    const Value& value, const WireLimits& limits = {},
    WireStats* stats = nullptr);
// Wraps an already encoded value (consumed) without copying payloads.
grpc::ByteBuffer ToByteBuffer(EncodedValue encoded);

// The buffer's slices as decoder chunks, each keeping its slice referenced
// (no bytes copied). InvalidArgument if the buffer cannot be read.
absl::StatusOr<std::vector<WireChunk>> ChunksOfByteBuffer(
    const grpc::ByteBuffer& buffer);

absl::StatusOr<Value> DecodeFromByteBuffer(const grpc::ByteBuffer& buffer,
                                           const WireLimits& limits = {},
                                           WireStats* stats = nullptr);

}  // namespace ferry

#endif  // FERRY_TENSOR_WIRE_GRPC_H_
