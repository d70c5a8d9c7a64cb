// Protobuf wire-format writers for the messages Ferry serializes by hand on
// the per-call path (tensor/wire.cc's WireMetadata, rpc/grpc's envelope
// fields). Written field by field in number order, with the Optional forms
// leaving out proto3 defaults, the bytes are exactly those of protobuf's
// generated code (common/proto_wire_test.cc compares them with
// CodedOutputStream).
//
// Field numbers come from the caller: each call site names them by the
// generated `k...FieldNumber` constants of the message it writes, so a
// renumbered .proto field cannot silently go out of step.
//
// Header-only and inline: these run several times per RPC.
// Thread safety: stateless; `out` belongs to the caller.
#ifndef FERRY_COMMON_PROTO_WIRE_H_
#define FERRY_COMMON_PROTO_WIRE_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

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

// --- Writers (append to `out`).

inline void AppendVarint(std::string* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

inline void AppendTag(std::string* out, int field, WireType type) {
  AppendVarint(out, Tag(field, type));
}

// A length-delimited field's tag and length; the caller appends the
// `length`-byte body (an embedded message) after it.
inline void AppendLengthPrefix(std::string* out, int field, size_t length) {
  AppendTag(out, field, WireType::kLength);
  AppendVarint(out, length);
}

inline void AppendBytesField(std::string* out, int field,
                             std::string_view bytes) {
  AppendLengthPrefix(out, field, bytes.size());
  out->append(bytes.data(), bytes.size());
}
inline void AppendOptionalBytesField(std::string* out, int field,
                                     std::string_view bytes) {
  if (!bytes.empty()) AppendBytesField(out, field, bytes);
}

inline void AppendVarintField(std::string* out, int field, uint64_t v) {
  AppendTag(out, field, WireType::kVarint);
  AppendVarint(out, v);
}
inline void AppendOptionalVarintField(std::string* out, int field, uint64_t v) {
  if (v != 0) AppendVarintField(out, field, v);
}

// A double (or any 64-bit fixed field), little-endian whatever the host.
inline void AppendFixed64Field(std::string* out, int field, double v) {
  AppendTag(out, field, WireType::kFixed64);
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  char bytes[8];
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>(bits >> (8 * i));
  out->append(bytes, sizeof(bytes));
}

}  // namespace ferry::proto_wire

#endif  // FERRY_COMMON_PROTO_WIRE_H_
