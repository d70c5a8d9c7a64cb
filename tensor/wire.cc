#include "ferry/tensor/wire.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <string_view>
#include <utility>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ferry/common/proto_wire.h"
#include "google/protobuf/arena.h"
#include "google/protobuf/io/coded_stream.h"
#include "ferry/proto/tensor.pb.h"

namespace ferry {
namespace {

static_assert(std::endian::native == std::endian::little,
              "the wire format stores elements little-endian");

constexpr char kMagic[4] = {'F', 'R', 'Y', '1'};
// The decoder's first arena block, on its stack.
constexpr size_t kArenaBlockBytes = 2048;
alignas(kWireAlignment) constexpr char kZeros[kWireAlignment] = {};

size_t PadTo(size_t n) {
  return (kWireAlignment - n % kWireAlignment) % kWireAlignment;
}

absl::Status Invalid(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("wire decode: ", what));
}

// --- Encoding
// -------------------------------------------------------------------

// The metadata is written straight to bytes, as protobuf would serialize the
// WireMetadata message (fields in number order, proto3 defaults left out), so
// no message objects are built per call. wire_test checks that the bytes
// re-serialize unchanged through the generated code. Measure sizes the
// metadata, and Write fills a buffer of exactly that size.
using proto_wire::Fixed64FieldSize;
using proto_wire::LengthFieldSize;
using proto_wire::OptionalBytesFieldSize;
using proto_wire::OptionalVarintFieldSize;
using proto_wire::VarintFieldSize;
using proto_wire::VarintSize;
using proto_wire::WriteBytesField;
using proto_wire::WriteFixed64Field;
using proto_wire::WriteLengthPrefix;
using proto_wire::WriteOptionalBytesField;
using proto_wire::WriteOptionalVarintField;
using proto_wire::WriteVarint;
using proto_wire::WriteVarintField;
using proto_wire::ZigZag64;

// Field numbers of proto/tensor.proto, from the generated code.
constexpr int kMetadataValueFieldNumber =
    proto::WireMetadata::kValueFieldNumber;
constexpr int kMetaDtypeFieldNumber = proto::TensorMeta::kDtypeFieldNumber;
constexpr int kMetaSizesFieldNumber = proto::TensorMeta::kSizesFieldNumber;
constexpr int kMetaNbytesFieldNumber = proto::TensorMeta::kNbytesFieldNumber;
constexpr int kMetaDeviceFieldNumber = proto::TensorMeta::kDeviceFieldNumber;
constexpr int kNoneFieldNumber = proto::ValueProto::kNoneFieldNumber;
constexpr int kBoolFieldNumber = proto::ValueProto::kBoolValueFieldNumber;
constexpr int kIntFieldNumber = proto::ValueProto::kIntValueFieldNumber;
constexpr int kDoubleFieldNumber = proto::ValueProto::kDoubleValueFieldNumber;
constexpr int kStringFieldNumber = proto::ValueProto::kStringValueFieldNumber;
constexpr int kBytesFieldNumber = proto::ValueProto::kBytesValueFieldNumber;
constexpr int kTensorFieldNumber = proto::ValueProto::kTensorFieldNumber;
constexpr int kListFieldNumber = proto::ValueProto::kListFieldNumber;
constexpr int kDictFieldNumber = proto::ValueProto::kDictFieldNumber;
constexpr int kRRefFieldNumber = proto::ValueProto::kRrefFieldNumber;
constexpr int kMessageFieldNumber = proto::ValueProto::kMessageFieldNumber;
constexpr int kListItemsFieldNumber = proto::ListValue::kItemsFieldNumber;
constexpr int kDictEntriesFieldNumber = proto::DictValue::kEntriesFieldNumber;
constexpr int kEntryKeyFieldNumber = proto::DictEntry::kKeyFieldNumber;
constexpr int kEntryValueFieldNumber = proto::DictEntry::kValueFieldNumber;
constexpr int kRRefOwnerFieldNumber =
    proto::RRefHandleProto::kOwnerIdFieldNumber;
constexpr int kRRefTypeFieldNumber =
    proto::RRefHandleProto::kTypeNameFieldNumber;
constexpr int kRRefExtraFieldNumber = proto::RRefHandleProto::kExtraFieldNumber;
constexpr int kRRefIdFieldNumber = proto::RRefHandleProto::kRrefIdFieldNumber;
constexpr int kRRefForkFieldNumber = proto::RRefHandleProto::kForkIdFieldNumber;
constexpr int kMessageTypeFieldNumber =
    proto::MessageValue::kTypeNameFieldNumber;
constexpr int kMessageDataFieldNumber = proto::MessageValue::kDataFieldNumber;

// The TensorMeta `device` of every tensor sent: AddTensor admits CPU tensors
// only, and Device::CPU().ToString() is this name (wire_test checks it).
constexpr std::string_view kCpuDeviceName = "cpu";

// TensorMeta's `dtype`: ferry::DType + 1 (proto::WireDType).
uint64_t DTypeCode(const Tensor& t) {
  return static_cast<uint64_t>(t.dtype()) + 1;
}

// TensorMeta's body size; `packed` gets the packed `sizes` body size.
size_t TensorMetaSize(const Tensor& t, size_t* packed) {
  *packed = 0;
  for (int64_t s : t.sizes()) *packed += VarintSize(static_cast<uint64_t>(s));
  const size_t sizes_field =
      t.sizes().empty() ? 0 : LengthFieldSize(kMetaSizesFieldNumber, *packed);
  return OptionalVarintFieldSize(kMetaDtypeFieldNumber, DTypeCode(t)) +
         sizes_field +
         OptionalVarintFieldSize(kMetaNbytesFieldNumber, t.nbytes()) +
         OptionalBytesFieldSize(kMetaDeviceFieldNumber, kCpuDeviceName.size());
}

char* WriteTensorMeta(const Tensor& t, size_t packed, char* p) {
  p = WriteOptionalVarintField(p, kMetaDtypeFieldNumber, DTypeCode(t));
  if (!t.sizes().empty()) {
    p = WriteLengthPrefix(p, kMetaSizesFieldNumber, packed);
    for (int64_t s : t.sizes()) p = WriteVarint(p, static_cast<uint64_t>(s));
  }
  p = WriteOptionalVarintField(p, kMetaNbytesFieldNumber, t.nbytes());
  return WriteOptionalBytesField(p, kMetaDeviceFieldNumber, kCpuDeviceName);
}

size_t RRefSize(const RRefHandle& r) {
  return OptionalVarintFieldSize(kRRefOwnerFieldNumber,
                                 static_cast<uint64_t>(r.owner_id)) +
         OptionalBytesFieldSize(kRRefTypeFieldNumber, r.type_name.size()) +
         OptionalBytesFieldSize(kRRefExtraFieldNumber, r.extra.size()) +
         OptionalVarintFieldSize(kRRefIdFieldNumber, r.rref_id.value()) +
         OptionalVarintFieldSize(kRRefForkFieldNumber, r.fork_id.value());
}

char* WriteRRef(const RRefHandle& r, char* p) {
  p = WriteLengthPrefix(p, kRRefFieldNumber, RRefSize(r));
  p = WriteOptionalVarintField(p, kRRefOwnerFieldNumber,
                               static_cast<uint64_t>(r.owner_id));
  p = WriteOptionalBytesField(p, kRRefTypeFieldNumber, r.type_name);
  p = WriteOptionalBytesField(p, kRRefExtraFieldNumber, r.extra);
  p = WriteOptionalVarintField(p, kRRefIdFieldNumber, r.rref_id.value());
  return WriteOptionalVarintField(p, kRRefForkFieldNumber, r.fork_id.value());
}

size_t MessageSize(const MessageValue& m) {
  return OptionalBytesFieldSize(kMessageTypeFieldNumber, m.type_name.size()) +
         OptionalBytesFieldSize(kMessageDataFieldNumber, m.data.size());
}

char* WriteMessage(const MessageValue& m, char* p) {
  p = WriteLengthPrefix(p, kMessageFieldNumber, MessageSize(m));
  p = WriteOptionalBytesField(p, kMessageTypeFieldNumber, m.type_name);
  return WriteOptionalBytesField(p, kMessageDataFieldNumber, m.data);
}

// The ValueProto size of a value with no payload and no nested value.
size_t ScalarSize(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kBool:
      return VarintFieldSize(kBoolFieldNumber, *v.if_bool() ? 1 : 0);
    case Value::Kind::kInt:
      return VarintFieldSize(kIntFieldNumber, ZigZag64(*v.if_int()));
    case Value::Kind::kDouble:
      return Fixed64FieldSize(kDoubleFieldNumber);
    case Value::Kind::kString:
      return LengthFieldSize(kStringFieldNumber, v.if_string()->size());
    case Value::Kind::kBytes:
      return LengthFieldSize(kBytesFieldNumber, v.if_bytes()->data.size());
    case Value::Kind::kRRef:
      return LengthFieldSize(kRRefFieldNumber, RRefSize(*v.if_rref()));
    case Value::Kind::kMessage:
      return LengthFieldSize(kMessageFieldNumber, MessageSize(*v.if_message()));
    default:  // kNone (tensors, lists and dicts are not scalars).
      return LengthFieldSize(kNoneFieldNumber, 0);
  }
}

// Two passes over the value. Measure checks it, collects the payloads (in
// depth-first order) and records in pre-order the body size of every list,
// dict, dict entry and tensor metadata (and a tensor's packed `sizes`); Write
// then emits the ValueProto with those sizes, computing none of them again.
class Encoder {
 public:
  Encoder(const WireLimits& limits, WireStats* stats, EncodedValue* out)
      : limits_(limits), stats_(stats), out_(out) {}

  // The size of v's ValueProto.
  absl::StatusOr<size_t> Measure(const Value& v, int depth) {
    switch (v.kind()) {
      case Value::Kind::kTensor:
        return MeasureTensor(*v.if_tensor());
      case Value::Kind::kList:
        return MeasureList(*v.if_list(), depth);
      case Value::Kind::kDict:
        return MeasureDict(*v.if_dict(), depth);
      default:
        return ScalarSize(v);
    }
  }

  // Writes v's ValueProto body at `p` (after Measure of the whole value);
  // returns its end.
  char* Write(const Value& v, char* p) {
    switch (v.kind()) {
      case Value::Kind::kNone:
        return WriteBytesField(p, kNoneFieldNumber, "");
      case Value::Kind::kBool:
        return WriteVarintField(p, kBoolFieldNumber, *v.if_bool() ? 1 : 0);
      case Value::Kind::kInt:
        return WriteVarintField(p, kIntFieldNumber, ZigZag64(*v.if_int()));
      case Value::Kind::kDouble:
        return WriteFixed64Field(p, kDoubleFieldNumber, *v.if_double());
      case Value::Kind::kString:
        return WriteBytesField(p, kStringFieldNumber, *v.if_string());
      case Value::Kind::kBytes:
        return WriteBytesField(p, kBytesFieldNumber, v.if_bytes()->data);
      case Value::Kind::kTensor:
        return WriteTensor(p);
      case Value::Kind::kList:
        return WriteList(*v.if_list(), p);
      case Value::Kind::kDict:
        return WriteDict(*v.if_dict(), p);
      case Value::Kind::kRRef:
        return WriteRRef(*v.if_rref(), p);
      case Value::Kind::kMessage:
        return WriteMessage(*v.if_message(), p);
    }
    return p;
  }

  uint64_t payload_total() const { return payload_total_; }

 private:
  absl::StatusOr<size_t> MeasureTensor(const Tensor& t) {
    RETURN_IF_ERROR(AddTensor(t));
    const size_t slot = Reserve(2);  // Metadata body, packed `sizes` body.
    sizes_[slot] =
        TensorMetaSize(out_->payloads.back().tensor, &sizes_[slot + 1]);
    return LengthFieldSize(kTensorFieldNumber, sizes_[slot]);
  }

  absl::StatusOr<size_t> MeasureList(const Value::List& list, int depth) {
    RETURN_IF_ERROR(CheckDepth(depth + 1));
    const size_t slot = Reserve(1);
    size_t body = 0;
    for (const Value& item : list) {
      ASSIGN_OR_RETURN(size_t n, Measure(item, depth + 1));
      body += LengthFieldSize(kListItemsFieldNumber, n);
    }
    sizes_[slot] = body;
    return LengthFieldSize(kListFieldNumber, body);
  }

  absl::StatusOr<size_t> MeasureDict(const Value::Dict& dict, int depth) {
    RETURN_IF_ERROR(CheckDepth(depth + 1));
    const size_t slot = Reserve(1);
    size_t body = 0;
    for (const auto& [key, item] : dict) {
      const size_t entry_slot = Reserve(1);
      ASSIGN_OR_RETURN(size_t n, Measure(item, depth + 1));
      const size_t entry =
          OptionalBytesFieldSize(kEntryKeyFieldNumber, key.size()) +
          LengthFieldSize(kEntryValueFieldNumber, n);
      sizes_[entry_slot] = entry;
      body += LengthFieldSize(kDictEntriesFieldNumber, entry);
    }
    sizes_[slot] = body;
    return LengthFieldSize(kDictFieldNumber, body);
  }

  char* WriteTensor(char* p) {
    const size_t body = sizes_[next_size_++];
    const size_t packed = sizes_[next_size_++];
    p = WriteLengthPrefix(p, kTensorFieldNumber, body);
    return WriteTensorMeta(out_->payloads[written_tensors_++].tensor, packed,
                           p);
  }

  char* WriteList(const Value::List& list, char* p) {
    p = WriteLengthPrefix(p, kListFieldNumber, sizes_[next_size_++]);
    for (const Value& item : list)
      p = WriteItem(kListItemsFieldNumber, item, p);
    return p;
  }

  char* WriteDict(const Value::Dict& dict, char* p) {
    p = WriteLengthPrefix(p, kDictFieldNumber, sizes_[next_size_++]);
    for (const auto& [key, item] : dict) {
      p = WriteLengthPrefix(p, kDictEntriesFieldNumber, sizes_[next_size_++]);
      p = WriteOptionalBytesField(p, kEntryKeyFieldNumber, key);
      p = WriteItem(kEntryValueFieldNumber, item, p);
    }
    return p;
  }

  // `v` as the length-delimited message field `field`.
  char* WriteItem(int field, const Value& v, char* p) {
    return Write(v, WriteLengthPrefix(p, field, ItemSize(v)));
  }

  // The ValueProto size of an item already measured, from its recorded
  // slot (tensors, lists and dicts: the next one) or its scalar fields.
  size_t ItemSize(const Value& v) const {
    switch (v.kind()) {
      case Value::Kind::kTensor:
        return LengthFieldSize(kTensorFieldNumber, sizes_[next_size_]);
      case Value::Kind::kList:
        return LengthFieldSize(kListFieldNumber, sizes_[next_size_]);
      case Value::Kind::kDict:
        return LengthFieldSize(kDictFieldNumber, sizes_[next_size_]);
      default:
        return ScalarSize(v);
    }
  }

  // Appends `n` slots; returns the first one's index.
  size_t Reserve(size_t n) {
    sizes_.resize(sizes_.size() + n);
    return sizes_.size() - n;
  }
  absl::Status CheckDepth(int depth) {
    if (depth > limits_.max_depth) {
      return absl::InvalidArgumentError(
          absl::StrCat("wire encode: value nests deeper than the limit of ",
                       limits_.max_depth));
    }
    return absl::OkStatus();
  }

  absl::Status AddTensor(const Tensor& t_in) {
    const size_t index = out_->payloads.size();
    if (!t_in.defined()) {
      return absl::InvalidArgumentError(
          absl::StrCat("wire encode: tensor #", index, " is undefined"));
    }
    if (!t_in.device().is_cpu()) {
      return absl::UnimplementedError(absl::StrCat(
          "wire encode: tensor #", index, " is on ", t_in.device().ToString(),
          "; only CPU tensors can be sent"));
    }
    Tensor t = t_in;
    if (!t.is_contiguous()) {
      if (ReadyGate* gate = t.storage().gate()) {
        RETURN_IF_ERROR(gate->WaitReady(t.storage().nbytes()));
      }
      t = t.contiguous();
      if (stats_) stats_->payload_bytes_copied += t.nbytes();
    }
    WirePayload p;
    p.data = static_cast<const char*>(t.data_ptr());
    p.size = t.nbytes();
    p.padding = PadTo(p.size);
    p.tensor = std::move(t);
    payload_total_ += p.size + p.padding;
    if (stats_) stats_->payload_bytes += p.size;
    out_->payloads.push_back(std::move(p));
    return absl::OkStatus();
  }

  const WireLimits& limits_;
  WireStats* stats_;
  EncodedValue* out_;
  uint64_t payload_total_ = 0;
  // Recorded sizes, pre-order; inline for the common small values.
  absl::InlinedVector<size_t, 16> sizes_;
  size_t next_size_ = 0;
  size_t written_tensors_ = 0;
};

// --- Decoding
// -------------------------------------------------------------------

// A bounds-checked cursor over protobuf fields in one buffer, for the
// decoder's fast path: every read returns false on anything malformed.
class FieldReader {
 public:
  explicit FieldReader(std::string_view body)
      : p_(reinterpret_cast<const uint8_t*>(body.data())),
        end_(p_ + body.size()) {}

  bool done() const { return p_ == end_; }

  // The next field's number and wire type.
  bool Tag(uint64_t* field, proto_wire::WireType* type) {
    uint64_t tag;
    if (!Varint(&tag) || tag > UINT32_MAX) return false;
    *field = tag >> 3;
    *type = static_cast<proto_wire::WireType>(tag & 7);
    return *field != 0;
  }

  // At most 10 bytes, the tenth holding only the top bit.
  bool Varint(uint64_t* v) {
    uint64_t value = 0;
    for (int i = 0; i < 10 && p_ < end_; ++i) {
      const uint8_t b = *p_++;
      if (i == 9 && b > 1) return false;
      value |= static_cast<uint64_t>(b & 0x7F) << (7 * i);
      if ((b & 0x80) == 0) {
        *v = value;
        return true;
      }
    }
    return false;
  }

  bool Fixed64(uint64_t* v) {
    if (end_ - p_ < 8) return false;
    std::memcpy(v, p_, 8);
    p_ += 8;
    return true;
  }

  // A length-delimited body.
  bool Length(std::string_view* body) {
    uint64_t n;
    if (!Varint(&n) || n > static_cast<uint64_t>(end_ - p_)) return false;
    *body = std::string_view(reinterpret_cast<const char*>(p_), n);
    p_ += n;
    return true;
  }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
};

using proto_wire::WireType;
constexpr WireType kVarint = WireType::kVarint;
constexpr WireType kFixed64 = WireType::kFixed64;
constexpr WireType kLength = WireType::kLength;

class Decoder {
 public:
  Decoder(absl::Span<const WireChunk> chunks, const WireLimits& limits,
          WireStats* stats)
      : chunks_(chunks), limits_(limits), stats_(stats) {
    starts_.reserve(chunks.size());
    for (const WireChunk& c : chunks) {
      starts_.push_back(total_);
      total_ += c.size;
    }
  }

  absl::StatusOr<Value> Decode() {
    if (total_ > limits_.max_total_bytes) {
      return Invalid(absl::StrCat("stream of ", total_,
                                  " bytes exceeds the limit of ",
                                  limits_.max_total_bytes, " bytes"));
    }
    if (total_ < kWireHeaderBytes) {
      return Invalid(absl::StrCat("truncated: ", total_,
                                  " bytes, the header alone needs ",
                                  kWireHeaderBytes));
    }
    char header[kWireHeaderBytes];
    Gather(0, kWireHeaderBytes, header);
    if (std::memcmp(header, kMagic, sizeof(kMagic)) != 0) {
      return Invalid("bad magic (not a Ferry value stream)");
    }
    uint32_t meta_len;
    std::memcpy(&meta_len, header + 4, sizeof(meta_len));
    if (meta_len > limits_.max_metadata_bytes || meta_len > INT32_MAX) {
      return Invalid(absl::StrCat("metadata of ", meta_len,
                                  " bytes exceeds the limit of ",
                                  limits_.max_metadata_bytes, " bytes"));
    }
    if (kWireHeaderBytes + meta_len > total_) {
      return Invalid(absl::StrCat(
          "truncated: metadata needs ", meta_len, " bytes, stream has ",
          total_ - kWireHeaderBytes, " after the header"));
    }
    // Parse the metadata in place when it lies in one chunk.
    std::string gathered;
    const char* meta = ContiguousAt(kWireHeaderBytes, meta_len);
    if (meta == nullptr) {
      gathered.resize(meta_len);
      Gather(kWireHeaderBytes, meta_len, gathered.data());
      meta = gathered.data();
      if (stats_) stats_->metadata_bytes_copied += meta_len;
    }
    if (stats_) stats_->metadata_bytes += kWireHeaderBytes + meta_len;
    const uint64_t payloads_start =
        kWireHeaderBytes + meta_len + PadTo(kWireHeaderBytes + meta_len);
    // Fast path: the metadata as EncodeValue writes it, read by hand. On
    // anything else (other field orders or repetitions, unknown fields, any
    // error) the work is dropped and the protobuf parser below, which
    // defines the format and words every error, decodes the stream.
    {
      const WireStats saved = stats_ != nullptr ? *stats_ : WireStats{};
      cursor_ = payloads_start;
      Value v;
      if (FastMetadata(std::string_view(meta, meta_len), &v) &&
          cursor_ == total_) {
        return v;
      }
      if (stats_ != nullptr) *stats_ = saved;
    }
    if (stats_ != nullptr) ++stats_->metadata_protobuf_parses;
    cursor_ = payloads_start;
    tensor_count_ = 0;
    // Small metadata (a few tensors) parses into this stack block: no heap
    // allocation per message object, and nothing to free one by one.
    alignas(8) char block[kArenaBlockBytes];
    google::protobuf::Arena arena(block, sizeof(block));
    proto::WireMetadata& md =
        *google::protobuf::Arena::CreateMessage<proto::WireMetadata>(&arena);
    {
      google::protobuf::io::CodedInputStream in(
          reinterpret_cast<const uint8_t*>(meta), static_cast<int>(meta_len));
      in.SetRecursionLimit(RecursionLimit());
      if (!md.ParseFromCodedStream(&in) || !in.ConsumedEntireMessage()) {
        return Invalid(
            absl::StrCat("metadata does not parse (corrupt, or nested deeper "
                         "than the limit of ",
                         limits_.max_depth, ")"));
      }
    }
    if (!md.has_value()) return Invalid("metadata holds no value");
    ASSIGN_OR_RETURN(Value v, DecodeValue(md.value(), 0));
    if (cursor_ > total_) {
      return Invalid(absl::StrCat("truncated: stream has ", total_,
                                  " bytes, expected ", cursor_));
    }
    if (cursor_ < total_) {
      return Invalid(absl::StrCat(total_ - cursor_,
                                  " trailing bytes after the last payload"));
    }
    return v;
  }

 private:
  // The protobuf parser's limit on message nesting: each level of Value
  // nesting costs two message levels (value, list).
  int RecursionLimit() const { return 2 * std::max(limits_.max_depth, 0) + 8; }

  // --- Fast path: each returns false where the protobuf path must decide.

  bool FastMetadata(std::string_view meta, Value* out) {
    FieldReader in(meta);
    uint64_t field;
    WireType type;
    std::string_view body;
    return in.Tag(&field, &type) && field == kMetadataValueFieldNumber &&
           type == kLength && in.Length(&body) && in.done() &&
           FastValue(body, 0, 1, out);
  }

  // A ValueProto holding exactly one field of its oneof, at list/dict depth
  // `depth` and message nesting `level`. Nesting near the protobuf parser's
  // recursion limit is left to it: it decides what is too deep.
  bool FastValue(std::string_view proto, int depth, int level, Value* out) {
    if (level + 3 > RecursionLimit()) return false;
    FieldReader in(proto);
    uint64_t field;
    WireType type;
    if (!in.Tag(&field, &type)) return false;
    uint64_t n = 0;
    std::string_view body;
    bool ok = false;
    switch (type) {
      case kVarint:
        ok = in.Varint(&n);
        break;
      case kFixed64:
        ok = in.Fixed64(&n);
        break;
      case kLength:
        ok = in.Length(&body);
        break;
    }
    if (!ok || !in.done()) return false;
    switch (field) {
      case kNoneFieldNumber:
        *out = Value::None();
        return type == kLength && body.empty();
      case kBoolFieldNumber:
        *out = Value::Bool(n != 0);
        return type == kVarint;
      case kIntFieldNumber:
        *out = Value::Int(static_cast<int64_t>((n >> 1) ^ (~(n & 1) + 1)));
        return type == kVarint;
      case kDoubleFieldNumber:
        *out = Value::Double(std::bit_cast<double>(n));
        return type == kFixed64;
    }
    if (type != kLength) return false;
    switch (field) {
      case kStringFieldNumber:
        *out = Value::String(std::string(body));
        return true;
      case kBytesFieldNumber:
        *out = Value::FromBytes(Bytes{std::string(body)});
        return true;
      case kTensorFieldNumber:
        return FastTensor(body, out);
      case kListFieldNumber:
        return depth + 1 <= limits_.max_depth &&
               FastList(body, depth + 1, level, out);
      case kDictFieldNumber:
        return depth + 1 <= limits_.max_depth &&
               FastDict(body, depth + 1, level, out);
      case kRRefFieldNumber:
        return FastRRef(body, out);
      case kMessageFieldNumber:
        return FastMessage(body, out);
    }
    return false;
  }

  // Calls `read(field, type, in)` for each field of `proto`, which must
  // read the field's value from `in`; false (for the protobuf path) on a
  // field number over `max_field` (at most 31) or one seen before: the fast
  // path takes each field of a message once.
  template <typename Read>
  static bool ForEachFieldOnce(std::string_view proto, int max_field,
                               Read read) {
    FieldReader in(proto);
    uint32_t seen = 0;  // A bit per field number.
    while (!in.done()) {
      uint64_t field;
      WireType type;
      if (!in.Tag(&field, &type) || field > static_cast<uint64_t>(max_field) ||
          (seen & (1u << field)) != 0 || !read(field, type, in)) {
        return false;
      }
      seen |= 1u << field;
    }
    return true;
  }

  bool FastTensor(std::string_view meta, Value* out) {
    uint64_t code = 0, nbytes = 0;
    std::vector<int64_t> sizes;
    auto read = [&](uint64_t field, WireType type, FieldReader& in) {
      uint64_t v;
      std::string_view body;
      if (field == kMetaSizesFieldNumber || field == kMetaDeviceFieldNumber) {
        if (type != kLength || !in.Length(&body)) return false;
        if (field == kMetaDeviceFieldNumber) return true;  // Informational.
        FieldReader packed(body);
        while (!packed.done()) {
          if (!packed.Varint(&v)) return false;
          sizes.push_back(static_cast<int64_t>(v));
        }
        return true;
      }
      if (type != kVarint || !in.Varint(&v)) return false;
      (field == kMetaDtypeFieldNumber ? code : nbytes) = v;
      return true;
    };
    if (!ForEachFieldOnce(meta, kMetaDeviceFieldNumber, read)) return false;
    if (code < 1 || code > std::size(kAllDTypes)) return false;
    absl::StatusOr<Tensor> t =
        DecodeTensor(static_cast<int>(code), std::move(sizes), nbytes);
    if (!t.ok()) return false;
    *out = Value::FromTensor(*std::move(t));
    return true;
  }

  // Repeated length-delimited field `field` and nothing else; `item` reads
  // each body.
  template <typename Item>
  static bool ForEachItem(std::string_view proto, uint64_t field, Item item) {
    FieldReader in(proto);
    while (!in.done()) {
      uint64_t f;
      WireType type;
      std::string_view body;
      if (!in.Tag(&f, &type) || f != field || type != kLength ||
          !in.Length(&body) || !item(body)) {
        return false;
      }
    }
    return true;
  }

  // `level`: the nesting of the ValueProto holding the list (or dict).
  bool FastList(std::string_view proto, int depth, int level, Value* out) {
    Value::List l;
    const bool ok =
        ForEachItem(proto, kListItemsFieldNumber, [&](std::string_view item) {
          return FastValue(item, depth, level + 2, &l.emplace_back());
        });
    if (ok) *out = Value::FromList(std::move(l));
    return ok;
  }

  bool FastDict(std::string_view proto, int depth, int level, Value* out) {
    Value::Dict d;
    auto entry = [&](std::string_view e) {
      FieldReader in(e);
      uint64_t f1, f2;
      WireType t1, t2;
      std::string_view key, value;
      Value v;
      return in.Tag(&f1, &t1) && f1 == kEntryKeyFieldNumber && t1 == kLength &&
             in.Length(&key) && in.Tag(&f2, &t2) &&
             f2 == kEntryValueFieldNumber && t2 == kLength &&
             in.Length(&value) && in.done() &&
             FastValue(value, depth, level + 3, &v) &&
             d.emplace(std::string(key), std::move(v)).second;
    };
    const bool ok = ForEachItem(proto, kDictEntriesFieldNumber, entry);
    if (ok) *out = Value::FromDict(std::move(d));
    return ok;
  }

  bool FastRRef(std::string_view proto, Value* out) {
    RRefHandle r;
    auto read = [&r](uint64_t field, WireType type, FieldReader& in) {
      uint64_t v = 0;
      std::string_view body;
      const bool bytes =
          field == kRRefTypeFieldNumber || field == kRRefExtraFieldNumber;
      if (bytes ? type != kLength || !in.Length(&body)
                : type != kVarint || !in.Varint(&v)) {
        return false;
      }
      switch (field) {
        case kRRefOwnerFieldNumber:
          r.owner_id = static_cast<int64_t>(v);
          break;
        case kRRefIdFieldNumber:
          r.rref_id = GlobalId::FromValue(v);
          break;
        case kRRefForkFieldNumber:
          r.fork_id = GlobalId::FromValue(v);
          break;
        case kRRefTypeFieldNumber:
          r.type_name = std::string(body);
          break;
        case kRRefExtraFieldNumber:
          r.extra = std::string(body);
          break;
        default:
          return false;  // Reserved numbers.
      }
      return true;
    };
    if (!ForEachFieldOnce(proto, kRRefForkFieldNumber, read)) return false;
    *out = Value::FromRRef(std::move(r));
    return true;
  }

  bool FastMessage(std::string_view proto, Value* out) {
    MessageValue m;
    auto read = [&m](uint64_t field, WireType type, FieldReader& in) {
      std::string_view body;
      if (type != kLength || !in.Length(&body)) return false;
      (field == kMessageTypeFieldNumber ? m.type_name : m.data) =
          std::string(body);
      return true;
    };
    if (!ForEachFieldOnce(proto, kMessageDataFieldNumber, read)) return false;
    *out = Value::FromMessage(std::move(m));
    return true;
  }

  // --- The protobuf path.

  absl::StatusOr<Value> DecodeValue(const proto::ValueProto& p, int depth) {
    switch (p.kind_case()) {
      case proto::ValueProto::kNone:
        return Value::None();
      case proto::ValueProto::kBoolValue:
        return Value::Bool(p.bool_value());
      case proto::ValueProto::kIntValue:
        return Value::Int(p.int_value());
      case proto::ValueProto::kDoubleValue:
        return Value::Double(p.double_value());
      case proto::ValueProto::kStringValue:
        return Value::String(p.string_value());
      case proto::ValueProto::kBytesValue:
        return Value::FromBytes(Bytes{p.bytes_value()});
      case proto::ValueProto::kTensor: {
        const proto::TensorMeta& meta = p.tensor();
        ASSIGN_OR_RETURN(Tensor t,
                         DecodeTensor(static_cast<int>(meta.dtype()),
                                      std::vector<int64_t>(meta.sizes().begin(),
                                                           meta.sizes().end()),
                                      meta.nbytes()));
        return Value::FromTensor(std::move(t));
      }
      case proto::ValueProto::kList: {
        RETURN_IF_ERROR(CheckDepth(depth + 1));
        Value::List l;
        l.reserve(p.list().items_size());
        for (const proto::ValueProto& item : p.list().items()) {
          ASSIGN_OR_RETURN(Value v, DecodeValue(item, depth + 1));
          l.push_back(std::move(v));
        }
        return Value::FromList(std::move(l));
      }
      case proto::ValueProto::kDict: {
        RETURN_IF_ERROR(CheckDepth(depth + 1));
        Value::Dict d;
        for (const proto::DictEntry& e : p.dict().entries()) {
          ASSIGN_OR_RETURN(Value v, DecodeValue(e.value(), depth + 1));
          if (!d.emplace(e.key(), std::move(v)).second) {
            return Invalid(absl::StrCat("duplicate dict key \"",
                                        absl::CHexEscape(e.key()), "\""));
          }
        }
        return Value::FromDict(std::move(d));
      }
      case proto::ValueProto::kRref: {
        const proto::RRefHandleProto& rp = p.rref();
        RRefHandle r;
        r.owner_id = rp.owner_id();
        r.rref_id = GlobalId::FromValue(rp.rref_id());
        r.fork_id = GlobalId::FromValue(rp.fork_id());
        r.type_name = rp.type_name();
        r.extra = rp.extra();
        return Value::FromRRef(std::move(r));
      }
      case proto::ValueProto::kMessage:
        return Value::FromMessage(
            MessageValue{p.message().type_name(), p.message().data()});
      case proto::ValueProto::KIND_NOT_SET:
        break;
    }
    return Invalid("value with no kind set (unknown or missing field)");
  }

  absl::Status CheckDepth(int depth) {
    if (depth > limits_.max_depth) {
      return Invalid(absl::StrCat("value nests deeper than the limit of ",
                                  limits_.max_depth));
    }
    return absl::OkStatus();
  }

  // A tensor's metadata: its dtype code (proto::WireDType), shape and
  // payload length.
  absl::StatusOr<Tensor> DecodeTensor(int code, std::vector<int64_t> sizes,
                                      uint64_t meta_nbytes) {
    const size_t index = tensor_count_++;
    // Errors name the tensor; the text is made only for them.
    auto what = [index] { return absl::StrCat("tensor #", index); };
    if (code < 1 || code > static_cast<int>(std::size(kAllDTypes))) {
      return Invalid(absl::StrCat(what(), ": unknown dtype ", code));
    }
    const DType dtype = static_cast<DType>(code - 1);
    int64_t nbytes = 0;
    absl::Status shape = CheckShape(sizes, dtype, &nbytes);
    if (!shape.ok())
      return Invalid(absl::StrCat(what(), ": ", shape.message()));
    if (meta_nbytes != static_cast<uint64_t>(nbytes)) {
      return Invalid(absl::StrCat(what(), ": byte count mismatch: shape [",
                                  absl::StrJoin(sizes, ", "), "] of ",
                                  DTypeName(dtype), " needs ", nbytes,
                                  " bytes, metadata says ", meta_nbytes));
    }
    const uint64_t n = static_cast<uint64_t>(nbytes);
    if (cursor_ > total_ || n > total_ - cursor_) {
      return Invalid(absl::StrCat("truncated: ", what(), " needs ", n,
                                  " bytes at offset ", cursor_, ", stream has ",
                                  total_));
    }
    const uint64_t offset = cursor_;
    cursor_ += n;
    cursor_ += PadTo(cursor_);
    if (stats_) stats_->payload_bytes += n;

    // Adopt the received bytes when they are in one owned, aligned chunk.
    if (n > 0) {
      const size_t c = ChunkAt(offset);
      const WireChunk& chunk = chunks_[c];
      const char* p = chunk.data + (offset - starts_[c]);
      if (chunk.keepalive != nullptr && offset + n <= starts_[c] + chunk.size &&
          reinterpret_cast<uintptr_t>(p) % ItemSize(dtype) == 0) {
        Storage s = Storage::Wrap(const_cast<char*>(p), n, Device::CPU(),
                                  chunk.keepalive);
        if (stats_) stats_->payload_bytes_adopted += n;
        std::vector<int64_t> strides = ContiguousStrides(sizes);
        return Tensor::FromStorage(std::move(s), dtype, std::move(sizes),
                                   std::move(strides), 0);
      }
    }
    absl::StatusOr<Tensor> t =
        Tensor::TryEmpty(sizes, dtype, limits_.allocator);
    if (!t.ok())
      return Annotate(t.status(), absl::StrCat("wire decode: ", what()));
    if (n > 0) {
      if (!t->device().is_cpu()) {
        return absl::UnimplementedError(
            "wire decode: the decode allocator must be a CPU one");
      }
      Gather(offset, n, static_cast<char*>(t->data_ptr()));
      if (stats_) stats_->payload_bytes_copied += n;
    }
    return t;
  }

  // Index of the chunk holding stream byte `offset` (< total_).
  size_t ChunkAt(uint64_t offset) const {
    auto it = std::upper_bound(starts_.begin(), starts_.end(), offset);
    // The last chunk starting at or before `offset`: with empty chunks, the
    // non-empty one holding `offset` comes after them.
    return static_cast<size_t>(it - starts_.begin()) - 1;
  }

  // Pointer to [offset, offset + n) if it lies within one chunk, else null.
  const char* ContiguousAt(uint64_t offset, uint64_t n) const {
    if (n == 0) return "";
    const size_t c = ChunkAt(offset);
    if (offset + n > starts_[c] + chunks_[c].size) return nullptr;
    return chunks_[c].data + (offset - starts_[c]);
  }

  // Copies stream bytes [offset, offset + n) to `out`; the range is in bounds.
  void Gather(uint64_t offset, uint64_t n, char* out) const {
    if (n == 0) return;
    size_t c = ChunkAt(offset);
    while (n > 0) {
      const uint64_t in_chunk = offset - starts_[c];
      const uint64_t take = std::min<uint64_t>(n, chunks_[c].size - in_chunk);
      std::memcpy(out, chunks_[c].data + in_chunk, take);
      out += take;
      offset += take;
      n -= take;
      ++c;
    }
  }

  absl::Span<const WireChunk> chunks_;
  const WireLimits& limits_;
  WireStats* stats_;
  absl::InlinedVector<uint64_t, 4> starts_;  // Where each chunk begins.
  uint64_t total_ = 0;
  uint64_t cursor_ = 0;
  size_t tensor_count_ = 0;
};

}  // namespace

const char* WirePaddingBytes() { return kZeros; }

size_t EncodedValue::total_bytes() const {
  size_t n = head.size();
  for (const WirePayload& p : payloads) n += p.size + p.padding;
  return n;
}

absl::Status WaitPayloadReady(const WirePayload& p, size_t bytes) {
  const Storage& s = p.tensor.storage();
  ReadyGate* gate = s.gate();
  if (gate == nullptr || bytes == 0) return absl::OkStatus();
  const size_t offset = static_cast<size_t>(
      p.data - static_cast<const char*>(s.data()));
  return gate->WaitReady(offset + std::min(bytes, p.size));
}

absl::StatusOr<bool> PollPayloadReady(const WirePayload& p, size_t bytes) {
  const Storage& s = p.tensor.storage();
  ReadyGate* gate = s.gate();
  if (gate == nullptr || bytes == 0) return true;
  const size_t offset = static_cast<size_t>(
      p.data - static_cast<const char*>(s.data()));
  return gate->PollReady(offset + std::min(bytes, p.size));
}

absl::Status WaitPayloadsReady(const EncodedValue& v) {
  for (const WirePayload& p : v.payloads) {
    RETURN_IF_ERROR(WaitPayloadReady(p, p.size));
  }
  return absl::OkStatus();
}

std::string EncodedValue::Flatten() const {
  std::string out;
  out.reserve(total_bytes());
  out.append(head);
  for (const WirePayload& p : payloads) {
    out.append(p.data, p.size);
    out.append(kZeros, p.padding);
  }
  return out;
}

absl::StatusOr<EncodedValue> EncodeValue(const Value& value,
                                         const WireLimits& limits,
                                         WireStats* stats) {
  EncodedValue out;
  Encoder enc(limits, stats, &out);
  // WireMetadata: its one field, `value`.
  ASSIGN_OR_RETURN(const size_t value_len, enc.Measure(value, 0));
  const size_t meta_len = LengthFieldSize(kMetadataValueFieldNumber, value_len);
  if (meta_len > limits.max_metadata_bytes || meta_len > UINT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(
        "wire encode: metadata of ", meta_len, " bytes exceeds the limit of ",
        limits.max_metadata_bytes, " bytes"));
  }
  const size_t head_len = kWireHeaderBytes + meta_len;
  // Zero-filled: the padding after the metadata is already in place.
  out.head.resize(head_len + PadTo(head_len));
  char* p = out.head.data();
  std::memcpy(p, kMagic, sizeof(kMagic));
  const uint32_t len32 = static_cast<uint32_t>(meta_len);
  std::memcpy(p + sizeof(kMagic), &len32, sizeof(len32));
  p = WriteLengthPrefix(p + kWireHeaderBytes, kMetadataValueFieldNumber,
                        value_len);
  if (enc.Write(value, p) != out.head.data() + head_len) {
    return absl::InternalError("wire encode: metadata size mismatch");
  }
  if (stats) stats->metadata_bytes += head_len;
  const uint64_t total = out.head.size() + enc.payload_total();
  if (total > limits.max_total_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "wire encode: stream of ", total, " bytes exceeds the limit of ",
        limits.max_total_bytes, " bytes"));
  }
  return out;
}

namespace {

// Appends the extents of `v`'s tensors, depth first in stream order, from
// `*at`; false past `limit` or with lists and dicts nested deeper than
// `depth` (a flat list has depth 1).
bool CollectExtents(const proto::ValueProto& v, int depth, uint64_t limit,
                    uint64_t* at, std::vector<WirePayloadExtent>* out) {
  const bool container = v.kind_case() == proto::ValueProto::kList ||
                         v.kind_case() == proto::ValueProto::kDict;
  if (container && depth <= 0) return false;
  switch (v.kind_case()) {
    case proto::ValueProto::kTensor: {
      const uint64_t n = v.tensor().nbytes();
      if (n > limit || *at > limit - n) return false;
      out->push_back({*at, n});
      *at += n + PadTo(n);
      return true;
    }
    case proto::ValueProto::kList:
      for (const proto::ValueProto& e : v.list().items()) {
        if (!CollectExtents(e, depth - 1, limit, at, out)) return false;
      }
      return true;
    case proto::ValueProto::kDict:
      for (const proto::DictEntry& e : v.dict().entries()) {
        if (!CollectExtents(e.value(), depth - 1, limit, at, out)) {
          return false;
        }
      }
      return true;
    default:
      return true;
  }
}

}  // namespace

absl::StatusOr<std::optional<std::vector<WirePayloadExtent>>>
ReadPayloadExtents(absl::string_view head, const WireLimits& limits) {
  if (head.size() < kWireHeaderBytes) return std::nullopt;
  if (std::memcmp(head.data(), kMagic, sizeof(kMagic)) != 0) {
    return Invalid("bad magic (not a Ferry value stream)");
  }
  uint32_t meta_len;
  std::memcpy(&meta_len, head.data() + 4, sizeof(meta_len));
  if (meta_len > limits.max_metadata_bytes || meta_len > INT32_MAX) {
    return Invalid(absl::StrCat("metadata of ", meta_len,
                                " bytes exceeds the limit of ",
                                limits.max_metadata_bytes, " bytes"));
  }
  if (head.size() - kWireHeaderBytes < meta_len) return std::nullopt;
  proto::WireMetadata md;
  google::protobuf::io::CodedInputStream in(
      reinterpret_cast<const uint8_t*>(head.data() + kWireHeaderBytes),
      static_cast<int>(meta_len));
  in.SetRecursionLimit(2 * std::max(limits.max_depth, 0) + 8);
  if (!md.ParseFromCodedStream(&in) || !in.ConsumedEntireMessage()) {
    return Invalid("metadata does not parse");
  }
  const uint64_t head_len = kWireHeaderBytes + meta_len;
  uint64_t at = head_len + PadTo(head_len);
  std::vector<WirePayloadExtent> out;
  if (!CollectExtents(md.value(), limits.max_depth,
                      limits.max_total_bytes, &at, &out)) {
    return Invalid(absl::StrCat(
        "payload extents nest deeper than ", limits.max_depth,
        " or run past the limit of ", limits.max_total_bytes, " bytes"));
  }
  return std::optional<std::vector<WirePayloadExtent>>(std::move(out));
}

absl::StatusOr<Value> DecodeValue(absl::Span<const WireChunk> chunks,
                                  const WireLimits& limits, WireStats* stats) {
  return Decoder(chunks, limits, stats).Decode();
}

absl::StatusOr<Value> DecodeValue(absl::string_view bytes,
                                  const WireLimits& limits, WireStats* stats) {
  WireChunk chunk{bytes.data(), bytes.size(), nullptr};
  return DecodeValue(absl::MakeConstSpan(&chunk, 1), limits, stats);
}

absl::StatusOr<Value> DecodeValue(std::shared_ptr<std::string> bytes,
                                  const WireLimits& limits, WireStats* stats) {
  if (bytes == nullptr)
    return absl::InvalidArgumentError("wire decode: null buffer");
  WireChunk chunk{bytes->data(), bytes->size(), bytes};
  return DecodeValue(absl::MakeConstSpan(&chunk, 1), limits, stats);
}

}  // namespace ferry
