#include "ferry/tensor/wire.h"

#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "ferry/common/proto_wire.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ferry/proto/tensor.pb.h"

namespace ferry {
namespace {

using ::testing::HasSubstr;

std::string Flat(const Value& v, WireStats* stats = nullptr) {
  absl::StatusOr<EncodedValue> e = EncodeValue(v, {}, stats);
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? e->Flatten() : "";
}

// A stream with hand-made metadata followed by `payload` (padded).
std::string Craft(const proto::WireMetadata& md,
                  const std::string& payload = "") {
  std::string meta = md.SerializeAsString();
  std::string out = "FRY1";
  const uint32_t len = static_cast<uint32_t>(meta.size());
  out.append(reinterpret_cast<const char*>(&len), 4);
  out += meta;
  out.resize((out.size() + 63) / 64 * 64, '\0');
  out += payload;
  out.resize((out.size() + 63) / 64 * 64, '\0');
  return out;
}

proto::WireMetadata TensorMd(int dtype, std::vector<int64_t> sizes,
                             uint64_t nbytes) {
  proto::WireMetadata md;
  proto::TensorMeta* t = md.mutable_value()->mutable_tensor();
  t->set_dtype(static_cast<proto::WireDType>(dtype));
  for (int64_t s : sizes) t->add_sizes(s);
  t->set_nbytes(nbytes);
  return md;
}

std::string DecodeError(absl::string_view bytes,
                        const WireLimits& limits = {}) {
  absl::StatusOr<Value> v = DecodeValue(bytes, limits);
  if (v.ok()) return "OK";
  EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument)
      << v.status();
  return std::string(v.status().message());
}

Value Sample() {
  Value::Dict d;
  d["none"] = Value::None();
  d["bool"] = Value::Bool(true);
  d["int"] = Value::Int(-1234567890123);
  d["double"] = Value::Double(2.5);
  d["string"] = Value::String("héllo");
  d["bytes"] = Value::FromBytes({std::string("\0\xff", 2)});
  d["tensor"] = Value::FromTensor(arange(10, DType::kFloat32).view({2, 5}));
  d["list"] = Value::FromList({Value::Int(1),
                               Value::FromTensor(ones({3}, DType::kInt8)),
                               Value::FromList({})});
  d["rref"] =
      Value::FromRRef(RRefHandle{3, GlobalId(1, 2), GlobalId(4, 5), "T", "x"});
  d["msg"] = Value::FromMessage(MessageValue{"pkg.Msg", "\x08\x01"});
  d["empty_tensor"] = Value::FromTensor(zeros({0, 4}));
  d["scalar_tensor"] = Value::FromTensor(full({}, 7, DType::kInt64));
  return Value::FromDict(std::move(d));
}

Value Nested(int depth) {
  Value v = Value::Int(0);
  for (int i = 0; i < depth; ++i) v = Value::FromList({std::move(v)});
  return v;
}

TEST(WireTest, EveryDTypeRoundTrips) {
  for (DType d : kAllDTypes) {
    Tensor t = randn({3, 7}, 11, DType::kFloat64).mul(10).to(d);
    Value v = Value::FromTensor(t);
    std::string bytes = Flat(v);
    absl::StatusOr<Value> back = DecodeValue(bytes);
    ASSERT_TRUE(back.ok()) << DTypeName(d) << ": " << back.status();
    ASSERT_NE(back->if_tensor(), nullptr);
    EXPECT_EQ(back->if_tensor()->dtype(), d);
    EXPECT_EQ(back->if_tensor()->sizes(), t.sizes());
    EXPECT_EQ(
        std::memcmp(back->if_tensor()->data_ptr(), t.data_ptr(), t.nbytes()), 0)
        << DTypeName(d);
    EXPECT_EQ(*back, v) << DTypeName(d);
  }
}

TEST(WireTest, NestedValueRoundTrips) {
  Value v = Sample();
  absl::StatusOr<Value> back = DecodeValue(Flat(v));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, v) << back->DebugString();
  EXPECT_EQ(back->DebugString(), v.DebugString());
}

// ReadPayloadExtents names, from the stream's first bytes, where each
// tensor's payload lies: the places DecodeValue adopts them from.
TEST(WireTest, PayloadExtentsAreWhereTheDecodedTensorsLie) {
  const Value v = Sample();
  auto flat = std::make_shared<std::string>(Flat(v));
  absl::StatusOr<Value> back = DecodeValue(flat);
  ASSERT_TRUE(back.ok()) << back.status();
  std::vector<const Tensor*> tensors;
  std::function<void(const Value&)> walk = [&](const Value& e) {
    if (const Tensor* t = e.if_tensor()) tensors.push_back(t);
    if (const Value::List* l = e.if_list()) {
      for (const Value& x : *l) walk(x);
    }
    if (const Value::Dict* d = e.if_dict()) {
      for (const auto& [k, x] : *d) walk(x);
    }
  };
  walk(*back);
  ASSERT_EQ(tensors.size(), 4u);
  absl::StatusOr<std::optional<std::vector<WirePayloadExtent>>> extents =
      ReadPayloadExtents(*flat);
  ASSERT_TRUE(extents.ok()) << extents.status();
  ASSERT_TRUE(extents->has_value());
  ASSERT_EQ((*extents)->size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const WirePayloadExtent& e = (**extents)[i];
    SCOPED_TRACE(i);
    EXPECT_EQ(e.size, tensors[i]->nbytes());
    EXPECT_EQ(e.offset % kWireAlignment, 0u);
    if (e.size > 0) {  // Adopted in place.
      EXPECT_EQ(static_cast<const char*>(tensors[i]->data_ptr()),
                flat->data() + e.offset);
    }
  }
  // The last payload ends the stream (padded).
  const WirePayloadExtent& last = (*extents)->back();
  EXPECT_LE(last.offset + last.size, flat->size());
  EXPECT_GT(last.offset + last.size + kWireAlignment, flat->size());
  // Known from the header and the metadata alone.
  const WirePayloadExtent& first = (*extents)->front();
  absl::StatusOr<std::optional<std::vector<WirePayloadExtent>>> early =
      ReadPayloadExtents(absl::string_view(*flat).substr(0, first.offset));
  ASSERT_TRUE(early.ok()) << early.status();
  ASSERT_TRUE(early->has_value());
  EXPECT_EQ((*early)->size(), tensors.size());
}

TEST(WireTest, PayloadExtentsWaitForTheMetadataAndRefuseBadHeads) {
  const std::string flat =
      Flat(Value::FromTensor(arange(100, DType::kFloat32)));
  uint32_t meta_len = 0;
  std::memcpy(&meta_len, flat.data() + 4, 4);
  for (size_t n : {size_t{0}, size_t{7}, size_t{8}, size_t{8} + meta_len - 1}) {
    absl::StatusOr<std::optional<std::vector<WirePayloadExtent>>> e =
        ReadPayloadExtents(absl::string_view(flat).substr(0, n));
    ASSERT_TRUE(e.ok()) << n << " " << e.status();
    EXPECT_FALSE(e->has_value()) << n;
  }
  absl::StatusOr<std::optional<std::vector<WirePayloadExtent>>> whole =
      ReadPayloadExtents(absl::string_view(flat).substr(0, 8 + meta_len));
  ASSERT_TRUE(whole.ok() && whole->has_value());
  EXPECT_EQ((*whole)->at(0).size, 400u);
  std::string bad = flat;
  bad[0] = 'X';
  EXPECT_THAT(ReadPayloadExtents(bad).status().message(),
              HasSubstr("bad magic"));
  EXPECT_THAT(
      ReadPayloadExtents(flat, WireLimits{.max_metadata_bytes = 4})
          .status()
          .message(),
      HasSubstr("exceeds the limit of 4 bytes"));
  EXPECT_THAT(
      ReadPayloadExtents(flat, WireLimits{.max_total_bytes = 100})
          .status()
          .message(),
      HasSubstr("past the limit of 100 bytes"));
  // Corrupt metadata.
  std::string corrupt = flat;
  corrupt[8] = '\xff';
  EXPECT_FALSE(ReadPayloadExtents(corrupt).ok());
  // Deeper than the limit.
  const std::string deep = Flat(Value::FromList({Value::FromList(
      {Value::FromTensor(arange(4, DType::kFloat32))})}));
  EXPECT_TRUE(ReadPayloadExtents(deep, WireLimits{.max_depth = 2}).ok());
  EXPECT_FALSE(ReadPayloadExtents(deep, WireLimits{.max_depth = 1}).ok());
}

// The metadata is written by hand (wire.cc); it must be the protobuf
// serialization itself: parsed and re-serialized, the bytes are unchanged.
TEST(WireTest, MetadataIsCanonicalProtobuf) {
  std::vector<Value> values = {
      Sample(),
      Value::None(),
      Value::Bool(false),
      Value::Int(0),
      Value::Int(std::numeric_limits<int64_t>::min()),
      Value::Double(0.0),
      Value::Double(-0.0),
      Value::String(""),
      Value::String(std::string(300, 'x')),
      Value::FromList({}),
      Value::FromDict({}),
      Value::FromDict({{"", Value::None()}}),
      Value::FromRRef(RRefHandle{-1, GlobalId(), GlobalId(), "", ""}),
      Value::FromMessage(MessageValue{"", ""}),
      Value::FromTensor(full({}, 1.0)),
      Value::FromTensor(zeros({0})),
      Value::FromTensor(ones({1 << 20}, DType::kInt8).view({-1, 1, 512})),
  };
  Value deep = Value::Int(1);
  for (int i = 0; i < 40; ++i) deep = Value::FromList({deep, Sample()});
  values.push_back(deep);
  for (const Value& v : values) {
    absl::StatusOr<EncodedValue> e = EncodeValue(v);
    ASSERT_TRUE(e.ok()) << e.status();
    uint32_t len;
    std::memcpy(&len, e->head.data() + 4, 4);
    ASSERT_LE(kWireHeaderBytes + len, e->head.size());
    const std::string meta = e->head.substr(kWireHeaderBytes, len);
    proto::WireMetadata md;
    ASSERT_TRUE(md.ParseFromString(meta)) << v.DebugString();
    EXPECT_EQ(md.SerializeAsString(), meta) << v.DebugString();
    EXPECT_EQ(e->head.size() % kWireAlignment, 0u);
    absl::StatusOr<Value> back = DecodeValue(e->Flatten());
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, v) << v.DebugString();
  }
}

// Only CPU tensors are sent, so the encoder writes the CPU device's name
// without asking each tensor; it must be the name Device gives.
// What EncodeValue writes is read by the hand-written reader; other valid
// encodings of the same value (field order, unpacked sizes, unknown fields,
// a repeated oneof member) go to the protobuf parser and decode alike.
TEST(WireTest, CanonicalMetadataIsReadByHandAndOtherFormsAlike) {
  for (const Value& v : {Sample(), Nested(64), Value::None(), Value::Int(-7),
                         Value::FromList({})}) {
    WireStats stats;
    absl::StatusOr<Value> back = DecodeValue(Flat(v), {}, &stats);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, v);
    EXPECT_EQ(stats.metadata_protobuf_parses, 0u) << v.DebugString();
  }
  using proto_wire::AppendLengthPrefix;
  using proto_wire::AppendVarint;
  auto varint = [](int field, uint64_t v) {
    std::string out;
    AppendVarint(&out, uint64_t(field) << 3);
    AppendVarint(&out, v);
    return out;
  };
  auto bytes = [](int field, const std::string& body) {
    std::string out;
    AppendLengthPrefix(&out, field, body.size());
    return out + body;
  };
  // A 2x3 int8 tensor, as ValueProto bodies of a TensorMeta (field 7).
  const std::string dtype = varint(1, 7), nbytes = varint(3, 6);
  const std::string sizes = bytes(2, "\x02\x03"), device = bytes(4, "cpu");
  // Each with the number of protobuf parses it takes: the hand-written
  // reader takes a tensor's fields in any order, each once.
  const std::vector<std::pair<std::string, uint64_t>> tensors = {
      {bytes(7, device + nbytes + sizes + dtype), 0},               // Order.
      {bytes(7, dtype + varint(2, 2) + varint(2, 3) + nbytes), 1},  // Unpacked.
      {bytes(7, dtype + sizes + nbytes + varint(99, 1)), 1},        // Unknown.
      {varint(20, 5) + bytes(7, dtype + sizes + nbytes), 1},        // Unknown.
      {varint(3, 1) + bytes(7, dtype + sizes + nbytes), 1},  // Oneof twice.
  };
  const Tensor expected = arange(6, DType::kInt8).view({2, 3});
  for (const auto& [value, protobuf_parses] : tensors) {
    std::string meta = bytes(1, value);
    std::string stream = "FRY1";
    const uint32_t len = static_cast<uint32_t>(meta.size());
    stream.append(reinterpret_cast<const char*>(&len), 4);
    stream += meta;
    stream.resize((stream.size() + 63) / 64 * 64, '\0');
    stream.append(static_cast<const char*>(expected.data_ptr()), 6);
    stream.resize((stream.size() + 63) / 64 * 64, '\0');
    WireStats stats;
    absl::StatusOr<Value> back = DecodeValue(stream, {}, &stats);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, Value::FromTensor(expected));
    EXPECT_EQ(stats.metadata_protobuf_parses, protobuf_parses);
    EXPECT_EQ(stats.payload_bytes, 6u);
    EXPECT_EQ(stats.payload_bytes_copied, 6u);
  }
}

TEST(WireTest, TensorMetadataNamesTheCpuDevice) {
  const Tensor t = ones({2, 3});
  absl::StatusOr<EncodedValue> e =
      EncodeValue(Value::FromList({Value::FromTensor(t), Value::Int(1)}));
  ASSERT_TRUE(e.ok()) << e.status();
  uint32_t len;
  std::memcpy(&len, e->head.data() + 4, 4);
  proto::WireMetadata md;
  ASSERT_TRUE(md.ParseFromString(e->head.substr(kWireHeaderBytes, len)));
  ASSERT_EQ(md.value().list().items_size(), 2);
  const proto::TensorMeta& meta = md.value().list().items(0).tensor();
  EXPECT_EQ(meta.device(), t.device().ToString());
  EXPECT_EQ(meta.device(), Device::CPU().ToString());
  EXPECT_THAT(meta.sizes(), ::testing::ElementsAre(2, 3));
  EXPECT_EQ(meta.nbytes(), 24u);
}

TEST(WireTest, LayoutIsAligned) {
  absl::StatusOr<EncodedValue> e = EncodeValue(Sample());
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->head.size() % kWireAlignment, 0u);
  EXPECT_EQ(e->head.substr(0, 4), "FRY1");
  for (const WirePayload& p : e->payloads)
    EXPECT_EQ((p.size + p.padding) % kWireAlignment, 0u);
  EXPECT_EQ(e->Flatten().size(), e->total_bytes());
}

TEST(WireTest, EncodeDoesNotCopyContiguousTensors) {
  Tensor a = rand({1000}, 1), b = arange(100);
  WireStats stats;
  absl::StatusOr<EncodedValue> e =
      EncodeValue(Value::FromList({Value::FromTensor(a), Value::FromTensor(b)}),
                  {}, &stats);
  ASSERT_TRUE(e.ok());
  ASSERT_EQ(e->payloads.size(), 2u);
  EXPECT_EQ(e->payloads[0].data, a.data_ptr());
  EXPECT_EQ(e->payloads[1].data, b.data_ptr());
  EXPECT_EQ(stats.payload_bytes, a.nbytes() + b.nbytes());
  EXPECT_EQ(stats.payload_bytes_copied, 0u);
  // The encoding keeps the tensors alive on its own.
  EXPECT_TRUE(e->payloads[0].tensor.storage().is_same(a.storage()));
}

TEST(WireTest, NonContiguousTensorIsCopiedOnceAndRoundTrips) {
  Tensor base = arange(12, DType::kInt32).view({3, 4});
  Tensor nc = base.t().slice(0, 1, 4);  // 3x3, non-contiguous, offset.
  ASSERT_FALSE(nc.is_contiguous());
  WireStats stats;
  std::string bytes = Flat(Value::FromTensor(nc), &stats);
  EXPECT_EQ(stats.payload_bytes_copied, nc.nbytes());
  absl::StatusOr<Value> back = DecodeValue(bytes);
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(back->if_tensor()->is_contiguous());
  EXPECT_TRUE(back->if_tensor()->equal(nc));
}

TEST(WireTest, DecodeAdoptsOwnedAlignedBuffer) {
  Tensor t = rand({256}, 3, DType::kFloat64);
  auto buf = std::make_shared<std::string>(Flat(Value::FromTensor(t)));
  WireStats stats;
  absl::StatusOr<Value> back = DecodeValue(buf, {}, &stats);
  ASSERT_TRUE(back.ok()) << back.status();
  const char* p = static_cast<const char*>(back->if_tensor()->data_ptr());
  EXPECT_GE(p, buf->data());
  EXPECT_LT(p, buf->data() + buf->size());
  EXPECT_EQ(stats.payload_bytes_adopted, t.nbytes());
  EXPECT_EQ(stats.payload_bytes_copied, 0u);
  EXPECT_TRUE(back->if_tensor()->equal(t));
  // The tensor keeps the buffer alive.
  std::weak_ptr<std::string> watch = buf;
  buf.reset();
  EXPECT_FALSE(watch.expired());
  *back = Value();
  EXPECT_TRUE(watch.expired());
}

TEST(WireTest, DecodeOfBorrowedBytesCopiesOnce) {
  Tensor t = rand({100}, 3);
  std::string bytes = Flat(Value::FromTensor(t));
  WireStats stats;
  absl::StatusOr<Value> back =
      DecodeValue(absl::string_view(bytes), {}, &stats);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(stats.payload_bytes_copied, t.nbytes());
  EXPECT_EQ(stats.payload_bytes_adopted, 0u);
}

TEST(WireTest, ArbitraryChunkingDecodes) {
  Value v = Sample();
  std::string bytes = Flat(v);
  auto owner = std::make_shared<std::string>(bytes);
  std::mt19937 rng(5);
  for (int round = 0; round < 50; ++round) {
    std::vector<WireChunk> chunks;
    size_t pos = 0;
    while (pos < owner->size()) {
      size_t n = std::min<size_t>(owner->size() - pos, rng() % 200);
      chunks.push_back({owner->data() + pos, n, round % 2 ? owner : nullptr});
      pos += n;
    }
    WireStats stats;
    absl::StatusOr<Value> back =
        DecodeValue(absl::MakeConstSpan(chunks), {}, &stats);
    ASSERT_TRUE(back.ok()) << back.status();
    ASSERT_EQ(*back, v);
    EXPECT_LE(stats.payload_bytes_copied, stats.payload_bytes);
    EXPECT_EQ(stats.payload_bytes_copied + stats.payload_bytes_adopted,
              stats.payload_bytes);
  }
}

TEST(WireTest, OneGiBTensorEncodesAndDecodesWithoutCopies) {
  // `empty` does not touch the pages, so this costs address space, not time.
  Tensor big = empty({int64_t{1} << 30}, DType::kUInt8);
  WireStats stats;
  absl::StatusOr<EncodedValue> e =
      EncodeValue(Value::FromTensor(big), {}, &stats);
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_EQ(e->payloads.size(), 1u);
  EXPECT_EQ(e->payloads[0].size, size_t{1} << 30);
  EXPECT_EQ(e->payloads[0].data, big.data_ptr());
  // Receive it as two chunks: the head and the payload (in place).
  std::vector<WireChunk> chunks = {{e->head.data(), e->head.size(), nullptr},
                                   {e->payloads[0].data, e->payloads[0].size,
                                    std::make_shared<Tensor>(big)}};
  absl::StatusOr<Value> back =
      DecodeValue(absl::MakeConstSpan(chunks), {}, &stats);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->if_tensor()->numel(), int64_t{1} << 30);
  EXPECT_EQ(back->if_tensor()->data_ptr(), big.data_ptr());
  EXPECT_EQ(stats.payload_bytes_copied, 0u);
  EXPECT_EQ(stats.payload_bytes_adopted, size_t{1} << 30);
}

// --- Hostile input
// -------------------------------------------------------------

TEST(WireHostileTest, UnknownDType) {
  EXPECT_THAT(DecodeError(Craft(TensorMd(42, {1}, 4), "abcd")),
              HasSubstr("unknown dtype 42"));
  EXPECT_THAT(DecodeError(Craft(TensorMd(0, {1}, 4), "abcd")),
              HasSubstr("unknown dtype 0"));
}

TEST(WireHostileTest, NegativeDimension) {
  EXPECT_THAT(DecodeError(Craft(TensorMd(1, {2, -3}, 0))),
              HasSubstr("tensor dimension 1 is negative (-3)"));
}

TEST(WireHostileTest, OverflowingDimensions) {
  // numel overflows int64.
  EXPECT_THAT(
      DecodeError(Craft(TensorMd(1, {int64_t{1} << 40, int64_t{1} << 40}, 0))),
      HasSubstr("overflows"));
  // numel fits but numel * itemsize does not.
  EXPECT_THAT(DecodeError(Craft(TensorMd(2, {int64_t{1} << 61}, 0))),
              HasSubstr("overflows"));
  EXPECT_THAT(
      DecodeError(Craft(TensorMd(1, std::vector<int64_t>(100, 1), 4), "abcd")),
      HasSubstr("more than the limit"));
}

TEST(WireHostileTest, ByteCountMismatch) {
  EXPECT_THAT(DecodeError(Craft(TensorMd(1, {2}, 4), "abcd")),
              HasSubstr("byte count mismatch: shape [2] of float32 needs 8 "
                        "bytes, metadata says 4"));
}

TEST(WireHostileTest, HugeShapeWithoutBytesIsTruncatedNotAllocated) {
  EXPECT_THAT(
      DecodeError(Craft(TensorMd(8, {int64_t{1} << 40}, uint64_t{1} << 40))),
      HasSubstr("truncated: tensor #0 needs 1099511627776 bytes"));
}

TEST(WireHostileTest, EveryTruncationFailsCleanly) {
  std::string bytes = Flat(Sample());
  for (size_t n = 0; n < bytes.size(); ++n) {
    std::string msg = DecodeError(absl::string_view(bytes.data(), n));
    ASSERT_NE(msg, "OK") << n;
  }
  EXPECT_THAT(DecodeError(""), HasSubstr("truncated"));
  EXPECT_THAT(DecodeError(bytes.substr(0, 20)),
              HasSubstr("truncated: metadata needs"));
  EXPECT_THAT(DecodeError(bytes.substr(0, bytes.size() - 64)),
              HasSubstr("truncated"));
}

TEST(WireHostileTest, TrailingBytesAndBadMagic) {
  std::string bytes = Flat(Value::Int(1));
  EXPECT_THAT(DecodeError(bytes + std::string(64, '\0')),
              HasSubstr("64 trailing bytes"));
  bytes[0] = 'X';
  EXPECT_THAT(DecodeError(bytes), HasSubstr("bad magic"));
}

TEST(WireHostileTest, GarbageMetadata) {
  std::string bytes = "FRY1";
  const uint32_t len = 8;
  bytes.append(reinterpret_cast<const char*>(&len), 4);
  bytes += "\xff\xff\xff\xff\xff\xff\xff\xff";
  EXPECT_THAT(DecodeError(bytes), HasSubstr("does not parse"));
  proto::WireMetadata md;
  EXPECT_THAT(DecodeError(Craft(md)), HasSubstr("no value"));
  md.mutable_value();
  EXPECT_THAT(DecodeError(Craft(md)), HasSubstr("no kind set"));
}

TEST(WireHostileTest, DuplicateDictKey) {
  proto::WireMetadata md;
  for (int i = 0; i < 2; ++i) {
    proto::DictEntry* e = md.mutable_value()->mutable_dict()->add_entries();
    e->set_key("k");
    e->mutable_value()->set_int_value(i);
  }
  EXPECT_THAT(DecodeError(Craft(md)), HasSubstr("duplicate dict key \"k\""));
}

TEST(WireHostileTest, NestingDeeperThanLimit) {
  WireLimits generous;
  generous.max_depth = 1000;
  absl::StatusOr<EncodedValue> deep = EncodeValue(Nested(65), generous);
  ASSERT_TRUE(deep.ok());
  EXPECT_THAT(DecodeError(deep->Flatten()),
              HasSubstr("nests deeper than the limit of 64"));
  EXPECT_EQ(DecodeError(deep->Flatten(), generous), "OK");
  // Far deeper: rejected by the parser's recursion limit, never a stack
  // overflow.
  absl::StatusOr<EncodedValue> deeper = EncodeValue(Nested(900), generous);
  ASSERT_TRUE(deeper.ok());
  EXPECT_THAT(DecodeError(deeper->Flatten()),
              HasSubstr("nested deeper than the limit of 64"));
  EXPECT_EQ(DecodeError(Flat(Nested(64))), "OK");
  // The encoder refuses to produce what a default decoder would reject.
  EXPECT_THAT(std::string(EncodeValue(Nested(65)).status().message()),
              HasSubstr("nests deeper than the limit of 64"));
}

TEST(WireHostileTest, TotalSizeOverLimit) {
  WireLimits small;
  small.max_total_bytes = 1000;
  std::string bytes = Flat(Value::FromTensor(zeros({1000}, DType::kUInt8)));
  EXPECT_THAT(
      DecodeError(bytes, small),
      HasSubstr("stream of 1088 bytes exceeds the limit of 1000 bytes"));
  EXPECT_THAT(
      std::string(
          EncodeValue(Value::FromTensor(zeros({1000}, DType::kUInt8)), small)
              .status()
              .message()),
      HasSubstr("exceeds the limit of 1000 bytes"));
  WireLimits meta;
  meta.max_metadata_bytes = 10;
  EXPECT_THAT(DecodeError(Flat(Value::String(std::string(100, 'x'))), meta),
              HasSubstr("exceeds the limit of 10 bytes"));
}

TEST(WireHostileTest, EncodeRejectsUndefinedTensor) {
  EXPECT_FALSE(EncodeValue(Value::FromTensor(Tensor())).ok());
}

}  // namespace
}  // namespace ferry
