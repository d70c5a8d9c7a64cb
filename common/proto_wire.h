// Protobuf wire-format writers for the messages Ferry serializes by hand on
// the per-call path (tensor/wire.cc's WireMetadata, rpc/grpc's envelope
// fields). Written field by field in number order, with the Optional forms
// leaving out proto3 defaults, the bytes are exactly those of protobuf's
// generated code (common/proto_wire_test.cc compares them with
// CodedOutputStream). Sizes, then raw-pointer writers for a buffer sized
// from them (no per-byte std::string call), then two appenders.
//
// Field numbers come from the caller: each call site names them by the
// generated `k...FieldNumber` constants of the message it writes, so a
// renumbered .proto field cannot silently go out of step.
//
// Header-only and inline: these run several times per RPC.
// Thread safety: stateless; the buffer written belongs to the caller.
#ifndef FERRY_COMMON_PROTO_WIRE_H_
#define FERRY_COMMON_PROTO_WIRE_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "absl/base/attributes.h"

namespace ferry::proto_wire {

enum class WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLength = 2 };

// A field's key: its number (1 to 2^29 - 1) and wire type.
constexpr uint64_t Tag(int field, WireType type) {
  return (uint64_t{static_cast<uint32_t>(field)} << 3) |
         static_cast<uint32_t>(type);
}

// Bytes the varint encoding of `v` takes (1 to 10).
constexpr size_t VarintSize(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

// sint64's zigzag mapping: small magnitudes of either sign stay short.
constexpr uint64_t ZigZag64(int64_t v) {
  return (static_cast<uint64_t>(v) << 1) ^ static_cast<uint64_t>(v >> 63);
}

// An int32 or enum value as protobuf writes it: negative values sign-extend
// to 64 bits (10 bytes on the wire).
constexpr uint64_t Int32Varint(int32_t v) {
  return static_cast<uint64_t>(static_cast<int64_t>(v));
}

// --- Sizes of whole fields (tag included).

// A length-delimited field with a `body`-byte body, written even if empty
// (a set message field, a oneof member).
constexpr size_t LengthFieldSize(int field, size_t body) {
  return VarintSize(Tag(field, WireType::kLength)) + VarintSize(body) + body;
}
// A proto3 string or bytes field: nothing when empty.
constexpr size_t OptionalBytesFieldSize(int field, size_t size) {
  return size == 0 ? 0 : LengthFieldSize(field, size);
}
// An integer field, written even if 0 (a oneof member).
constexpr size_t VarintFieldSize(int field, uint64_t v) {
  return VarintSize(Tag(field, WireType::kVarint)) + VarintSize(v);
}
// A proto3 integer field: nothing when 0.
constexpr size_t OptionalVarintFieldSize(int field, uint64_t v) {
  return v == 0 ? 0 : VarintFieldSize(field, v);
}
constexpr size_t Fixed64FieldSize(int field) {
  return VarintSize(Tag(field, WireType::kFixed64)) + 8;
}

// --- Writers into a buffer sized beforehand.
//
// Each writes at `p`, which must have room for the bytes the matching size
// function above gives, and returns the end of what it wrote. Callers size
// the whole message once, then write it without a per-byte capacity check.

inline constexpr size_t kMaxVarintBytes = 10;

// Forced inline: with a constant tag or a small length it folds to a store.
ABSL_ATTRIBUTE_ALWAYS_INLINE inline char* WriteVarint(char* p, uint64_t v) {
  while (v >= 0x80) {
    *p++ = static_cast<char>((v & 0x7F) | 0x80);
    v >>= 7;
  }
  *p++ = static_cast<char>(v);
  return p;
}

ABSL_ATTRIBUTE_ALWAYS_INLINE inline char* WriteTag(char* p, int field,
                                                   WireType type) {
  return WriteVarint(p, Tag(field, type));
}

// A length-delimited field's tag and length; its `length`-byte body (an
// embedded message) is written after it.
inline char* WriteLengthPrefix(char* p, int field, size_t length) {
  return WriteVarint(WriteTag(p, field, WireType::kLength), length);
}

inline char* WriteBytesField(char* p, int field, std::string_view bytes) {
  p = WriteLengthPrefix(p, field, bytes.size());
  if (!bytes.empty()) std::memcpy(p, bytes.data(), bytes.size());
  return p + bytes.size();
}
inline char* WriteOptionalBytesField(char* p, int field,
                                     std::string_view bytes) {
  return bytes.empty() ? p : WriteBytesField(p, field, bytes);
}

inline char* WriteVarintField(char* p, int field, uint64_t v) {
  return WriteVarint(WriteTag(p, field, WireType::kVarint), v);
}
inline char* WriteOptionalVarintField(char* p, int field, uint64_t v) {
  return v == 0 ? p : WriteVarintField(p, field, v);
}

// A double, little-endian whatever the host.
inline char* WriteFixed64Field(char* p, int field, double v) {
  p = WriteTag(p, field, WireType::kFixed64);
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  for (int i = 0; i < 8; ++i) *p++ = static_cast<char>(bits >> (8 * i));
  return p;
}

// --- Appending to a string (a few fields after ones serialized elsewhere).

inline void AppendVarint(std::string* out, uint64_t v) {
  char buf[kMaxVarintBytes];
  out->append(buf, WriteVarint(buf, v) - buf);
}

inline void AppendLengthPrefix(std::string* out, int field, size_t length) {
  char buf[2 * kMaxVarintBytes];
  out->append(buf, WriteLengthPrefix(buf, field, length) - buf);
}

}  // namespace ferry::proto_wire

#endif  // FERRY_COMMON_PROTO_WIRE_H_
