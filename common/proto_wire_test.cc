#include "ferry/common/proto_wire.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>

#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/wire_format_lite.h"
#include "gtest/gtest.h"

namespace ferry::proto_wire {
namespace {

using google::protobuf::internal::WireFormatLite;

constexpr uint64_t kEdgeValues[] = {
    0,
    1,
    127,
    128,
    16383,
    16384,
    uint64_t{1} << 32,
    (uint64_t{1} << 63) - 1,
    uint64_t{1} << 63,
    std::numeric_limits<uint64_t>::max(),
};

// Field numbers: the smallest, the last with a one-byte tag, the first
// with a two-byte one, and the largest protobuf allows.
constexpr int kFields[] = {1, 15, 16, (1 << 29) - 1};

// What protobuf's own writer produces for `write`.
template <typename Write>
std::string Protobuf(Write write) {
  std::string out;
  {
    google::protobuf::io::StringOutputStream stream(&out);
    google::protobuf::io::CodedOutputStream coded(&stream);
    write(&coded);
  }
  return out;
}

// Runs a pointer writer on a buffer of `size` bytes, its size function's
// answer, with guard bytes after it: it must fill exactly `size` bytes.
template <typename Write>
std::string Written(size_t size, Write write) {
  constexpr char kGuard = '\xA5';
  std::string buf(size + 16, kGuard);
  const char* end = write(buf.data());
  EXPECT_EQ(end - buf.data(), static_cast<ptrdiff_t>(size));
  EXPECT_EQ(buf.substr(size), std::string(16, kGuard)) << "wrote past the end";
  return buf.substr(0, std::min<size_t>(end - buf.data(), size));
}

TEST(ProtoWire, VarintBytesAndSizeMatchCodedOutputStream) {
  for (uint64_t v : kEdgeValues) {
    const std::string expected =
        Protobuf([v](auto* out) { out->WriteVarint64(v); });
    EXPECT_EQ(
        Written(VarintSize(v), [v](char* p) { return WriteVarint(p, v); }),
        expected)
        << v;
    EXPECT_EQ(VarintSize(v),
              google::protobuf::io::CodedOutputStream::VarintSize64(v))
        << v;
    std::string appended = "x";
    AppendVarint(&appended, v);
    EXPECT_EQ(appended, "x" + expected) << v;
  }
  // The smallest value of each length, 1 to 10 bytes.
  for (int bits = 0; bits < 64; bits += 7) {
    const uint64_t v = uint64_t{1} << bits;
    EXPECT_EQ(VarintSize(v), static_cast<size_t>(bits / 7 + 1)) << v;
  }
}

TEST(ProtoWire, TagsMatchWireFormatLite) {
  for (int field : kFields) {
    EXPECT_EQ(Tag(field, WireType::kVarint),
              WireFormatLite::MakeTag(field, WireFormatLite::WIRETYPE_VARINT));
    EXPECT_EQ(Tag(field, WireType::kFixed64),
              WireFormatLite::MakeTag(field, WireFormatLite::WIRETYPE_FIXED64));
    EXPECT_EQ(Tag(field, WireType::kLength),
              WireFormatLite::MakeTag(
                  field, WireFormatLite::WIRETYPE_LENGTH_DELIMITED));
  }
}

TEST(ProtoWire, VarintFieldsMatchProtobuf) {
  for (int field : kFields) {
    for (uint64_t v : kEdgeValues) {
      const std::string ours = Written(VarintFieldSize(field, v), [&](char* p) {
        return WriteVarintField(p, field, v);
      });
      EXPECT_EQ(ours, Protobuf([&](auto* out) {
                  WireFormatLite::WriteUInt64(field, v, out);
                }))
          << field << " " << v;
      EXPECT_EQ(Written(OptionalVarintFieldSize(field, v),
                        [&](char* p) {
                          return WriteOptionalVarintField(p, field, v);
                        }),
                v == 0 ? "" : ours)
          << field << " " << v;
    }
  }
}

TEST(ProtoWire, SignedEncodingsMatchProtobuf) {
  constexpr int64_t kSigned[] = {0,
                                 1,
                                 -1,
                                 63,
                                 -64,
                                 64,
                                 std::numeric_limits<int32_t>::min(),
                                 std::numeric_limits<int64_t>::max(),
                                 std::numeric_limits<int64_t>::min()};
  for (int64_t v : kSigned) {
    const uint64_t zigzag = ZigZag64(v);
    EXPECT_EQ(
        Written(VarintFieldSize(3, zigzag),
                [&](char* p) { return WriteVarintField(p, 3, zigzag); }),
        Protobuf([v](auto* out) { WireFormatLite::WriteSInt64(3, v, out); }))
        << v;
    const auto v32 = static_cast<int32_t>(v);
    const uint64_t as_enum = Int32Varint(v32);
    EXPECT_EQ(
        Written(VarintFieldSize(1, as_enum),
                [&](char* p) { return WriteVarintField(p, 1, as_enum); }),
        Protobuf([v32](auto* out) { WireFormatLite::WriteEnum(1, v32, out); }))
        << v32;
  }
}

TEST(ProtoWire, BytesFieldsAndSizesMatchProtobuf) {
  // Lengths around the one/two-byte length boundary.
  for (size_t size : {size_t{0}, size_t{1}, size_t{127}, size_t{128}}) {
    const std::string body(size, 'x');
    for (int field : kFields) {
      const std::string ours =
          Written(LengthFieldSize(field, size),
                  [&](char* p) { return WriteBytesField(p, field, body); });
      EXPECT_EQ(ours, Protobuf([&](auto* out) {
                  WireFormatLite::WriteBytes(field, body, out);
                }))
          << field << " " << size;
      const std::string prefix =
          Written(LengthFieldSize(field, size) - size,
                  [&](char* p) { return WriteLengthPrefix(p, field, size); });
      EXPECT_EQ(prefix + body, ours);
      std::string appended;
      AppendLengthPrefix(&appended, field, size);
      EXPECT_EQ(appended, prefix);
      EXPECT_EQ(Written(OptionalBytesFieldSize(field, size),
                        [&](char* p) {
                          return WriteOptionalBytesField(p, field, body);
                        }),
                size == 0 ? "" : ours);
    }
  }
}

TEST(ProtoWire, DoublesMatchProtobuf) {
  for (double v :
       {0.0, -0.0, 1.5, -1e300, std::numeric_limits<double>::infinity(),
        std::numeric_limits<double>::denorm_min()}) {
    EXPECT_EQ(
        Written(Fixed64FieldSize(4),
                [v](char* p) { return WriteFixed64Field(p, 4, v); }),
        Protobuf([v](auto* out) { WireFormatLite::WriteDouble(4, v, out); }))
        << v;
  }
}

}  // namespace
}  // namespace ferry::proto_wire
