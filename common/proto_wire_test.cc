#include "common/proto_wire.h"

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

TEST(ProtoWire, VarintBytesAndSizeMatchCodedOutputStream) {
  for (uint64_t v : kEdgeValues) {
    std::string ours;
    AppendVarint(&ours, v);
    EXPECT_EQ(ours, Protobuf([v](auto* out) { out->WriteVarint64(v); })) << v;
    EXPECT_EQ(VarintSize(v), ours.size()) << v;
    EXPECT_EQ(VarintSize(v),
              google::protobuf::io::CodedOutputStream::VarintSize64(v))
        << v;
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
      std::string ours;
      AppendVarintField(&ours, field, v);
      EXPECT_EQ(ours, Protobuf([&](auto* out) {
                  WireFormatLite::WriteUInt64(field, v, out);
                }))
          << field << " " << v;
      std::string optional;
      AppendOptionalVarintField(&optional, field, v);
      EXPECT_EQ(optional, v == 0 ? "" : ours) << field << " " << v;
      EXPECT_EQ(OptionalVarintFieldSize(field, v), optional.size());
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
    std::string ours;
    AppendVarintField(&ours, 3, ZigZag64(v));
    EXPECT_EQ(ours, Protobuf([v](auto* out) {
                WireFormatLite::WriteSInt64(3, v, out);
              }))
        << v;
    const auto v32 = static_cast<int32_t>(v);
    std::string as_enum;
    AppendVarintField(&as_enum, 1, Int32Varint(v32));
    EXPECT_EQ(as_enum, Protobuf([v32](auto* out) {
                WireFormatLite::WriteEnum(1, v32, out);
              }))
        << v32;
  }
}

TEST(ProtoWire, BytesFieldsAndSizesMatchProtobuf) {
  // Lengths around the one/two-byte length boundary.
  for (size_t size : {size_t{0}, size_t{1}, size_t{127}, size_t{128}}) {
    const std::string body(size, 'x');
    for (int field : kFields) {
      std::string ours;
      AppendBytesField(&ours, field, body);
      EXPECT_EQ(ours, Protobuf([&](auto* out) {
                  WireFormatLite::WriteBytes(field, body, out);
                }))
          << field << " " << size;
      EXPECT_EQ(LengthFieldSize(field, size), ours.size());
      std::string prefix;
      AppendLengthPrefix(&prefix, field, size);
      EXPECT_EQ(prefix + body, ours);
      std::string optional;
      AppendOptionalBytesField(&optional, field, body);
      EXPECT_EQ(optional, size == 0 ? "" : ours);
      EXPECT_EQ(OptionalBytesFieldSize(field, size), optional.size());
    }
  }
}

TEST(ProtoWire, DoublesMatchProtobuf) {
  for (double v :
       {0.0, -0.0, 1.5, -1e300, std::numeric_limits<double>::infinity(),
        std::numeric_limits<double>::denorm_min()}) {
    std::string ours;
    AppendFixed64Field(&ours, 4, v);
    EXPECT_EQ(ours, Protobuf([v](auto* out) {
                WireFormatLite::WriteDouble(4, v, out);
              }))
        << v;
  }
}

}  // namespace
}  // namespace ferry::proto_wire
