#include "tensor/wire.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/arena.h"
#include "google/protobuf/io/coded_stream.h"
#include "proto/tensor.pb.h"

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
// re-serialize unchanged through the generated code.
enum WireType { kVarint = 0, kFixed64 = 1, kLength = 2 };

size_t VarintSize(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

void PutVarint(std::string* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

void PutTag(std::string* out, int field, WireType type) {
  out->push_back(static_cast<char>((field << 3) | type));  // Fields < 16.
}

// A length-delimited field's tag, length and body size.
size_t LengthField(size_t body) { return 1 + VarintSize(body) + body; }
// The same, left out when empty (a proto3 string or bytes field).
size_t OptionalBytes(size_t size) { return size == 0 ? 0 : LengthField(size); }
// A proto3 integer field, left out when 0.
size_t OptionalVarint(uint64_t v) { return v == 0 ? 0 : 1 + VarintSize(v); }

void PutBytes(std::string* out, int field, absl::string_view bytes) {
  PutTag(out, field, kLength);
  PutVarint(out, bytes.size());
  out->append(bytes.data(), bytes.size());
}
void PutOptionalBytes(std::string* out, int field, absl::string_view bytes) {
  if (!bytes.empty()) PutBytes(out, field, bytes);
}
void PutOptionalVarint(std::string* out, int field, uint64_t v) {
  if (v == 0) return;
  PutTag(out, field, kVarint);
  PutVarint(out, v);
}

uint64_t ZigZag(int64_t v) {
  return (static_cast<uint64_t>(v) << 1) ^ static_cast<uint64_t>(v >> 63);
}

// proto::TensorMeta of a payload's (contiguous) tensor.
struct TensorMetaFields {
  explicit TensorMetaFields(const Tensor& t)
      : dtype(static_cast<int>(t.dtype()) + 1),
        sizes(t.sizes()),
        nbytes(t.nbytes()),
        device(t.device().ToString()) {
    for (int64_t s : sizes) packed += VarintSize(static_cast<uint64_t>(s));
  }
  size_t Size() const {
    return OptionalVarint(dtype) + (sizes.empty() ? 0 : LengthField(packed)) +
           OptionalVarint(nbytes) + OptionalBytes(device.size());
  }
  void Write(std::string* out) const {
    PutOptionalVarint(out, 1, dtype);
    if (!sizes.empty()) {
      PutTag(out, 2, kLength);
      PutVarint(out, packed);
      for (int64_t s : sizes) PutVarint(out, static_cast<uint64_t>(s));
    }
    PutOptionalVarint(out, 3, nbytes);
    PutOptionalBytes(out, 4, device);
  }

  int dtype;
  const std::vector<int64_t>& sizes;
  uint64_t nbytes;
  std::string device;
  size_t packed = 0;
};

size_t RRefSize(const RRefHandle& r) {
  return OptionalVarint(static_cast<uint64_t>(r.owner_id)) +
         OptionalBytes(r.type_name.size()) + OptionalBytes(r.extra.size()) +
         OptionalVarint(r.rref_id.value()) + OptionalVarint(r.fork_id.value());
}

size_t MessageSize(const MessageValue& m) {
  return OptionalBytes(m.type_name.size()) + OptionalBytes(m.data.size());
}

// The ValueProto size of a value with no payload and no nested value.
size_t ScalarSize(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kBool:
      return 2;
    case Value::Kind::kInt:
      return 1 + VarintSize(ZigZag(*v.if_int()));
    case Value::Kind::kDouble:
      return 9;
    case Value::Kind::kString:
      return LengthField(v.if_string()->size());
    case Value::Kind::kBytes:
      return LengthField(v.if_bytes()->data.size());
    case Value::Kind::kRRef:
      return LengthField(RRefSize(*v.if_rref()));
    case Value::Kind::kMessage:
      return LengthField(MessageSize(*v.if_message()));
    default:  // kNone (tensors, lists and dicts are not scalars).
      return LengthField(0);
  }
}

// Two passes over the value. Measure checks it, collects the payloads (in
// depth-first order) and records the size of every list, dict and entry body
// in pre-order; Write then emits the ValueProto with those sizes.
class Encoder {
 public:
  Encoder(const WireLimits& limits, WireStats* stats, EncodedValue* out)
      : limits_(limits), stats_(stats), out_(out) {}

  // The size of v's ValueProto.
  absl::StatusOr<size_t> Measure(const Value& v, int depth) {
    switch (v.kind()) {
      case Value::Kind::kTensor: {
        RETURN_IF_ERROR(AddTensor(*v.if_tensor()));
        return LengthField(
            TensorMetaFields(out_->payloads.back().tensor).Size());
      }
      case Value::Kind::kList: {
        RETURN_IF_ERROR(CheckDepth(depth + 1));
        const size_t slot = Reserve();
        size_t body = 0;
        for (const Value& item : *v.if_list()) {
          ASSIGN_OR_RETURN(size_t n, Measure(item, depth + 1));
          body += LengthField(n);
        }
        sizes_[slot] = body;
        return LengthField(body);
      }
      case Value::Kind::kDict: {
        RETURN_IF_ERROR(CheckDepth(depth + 1));
        const size_t slot = Reserve();
        size_t body = 0;
        for (const auto& [key, item] : *v.if_dict()) {
          const size_t entry_slot = Reserve();
          ASSIGN_OR_RETURN(size_t n, Measure(item, depth + 1));
          const size_t entry = OptionalBytes(key.size()) + LengthField(n);
          sizes_[entry_slot] = entry;
          body += LengthField(entry);
        }
        sizes_[slot] = body;
        return LengthField(body);
      }
      default:
        return ScalarSize(v);
    }
  }

  // Writes v's ValueProto body (after Measure of the whole value).
  void Write(const Value& v, std::string* out) {
    switch (v.kind()) {
      case Value::Kind::kNone:
        PutBytes(out, 1, "");
        return;
      case Value::Kind::kBool:
        PutTag(out, 2, kVarint);
        out->push_back(*v.if_bool() ? 1 : 0);
        return;
      case Value::Kind::kInt:
        PutTag(out, 3, kVarint);
        PutVarint(out, ZigZag(*v.if_int()));
        return;
      case Value::Kind::kDouble: {
        PutTag(out, 4, kFixed64);
        char bits[8];
        std::memcpy(bits, v.if_double(), 8);
        out->append(bits, 8);
        return;
      }
      case Value::Kind::kString:
        PutBytes(out, 5, *v.if_string());
        return;
      case Value::Kind::kBytes:
        PutBytes(out, 6, v.if_bytes()->data);
        return;
      case Value::Kind::kTensor: {
        TensorMetaFields meta(out_->payloads[written_tensors_++].tensor);
        PutTag(out, 7, kLength);
        PutVarint(out, meta.Size());
        meta.Write(out);
        return;
      }
      case Value::Kind::kList:
        PutTag(out, 8, kLength);
        PutVarint(out, sizes_[next_size_++]);
        for (const Value& item : *v.if_list()) WriteItem(1, item, out);
        return;
      case Value::Kind::kDict:
        PutTag(out, 9, kLength);
        PutVarint(out, sizes_[next_size_++]);
        for (const auto& [key, item] : *v.if_dict()) {
          PutTag(out, 1, kLength);
          PutVarint(out, sizes_[next_size_++]);
          PutOptionalBytes(out, 1, key);
          WriteItem(2, item, out);
        }
        return;
      case Value::Kind::kRRef: {
        const RRefHandle& r = *v.if_rref();
        PutTag(out, 10, kLength);
        PutVarint(out, RRefSize(r));
        PutOptionalVarint(out, 1, static_cast<uint64_t>(r.owner_id));
        PutOptionalBytes(out, 4, r.type_name);
        PutOptionalBytes(out, 5, r.extra);
        PutOptionalVarint(out, 6, r.rref_id.value());
        PutOptionalVarint(out, 7, r.fork_id.value());
        return;
      }
      case Value::Kind::kMessage: {
        const MessageValue& m = *v.if_message();
        PutTag(out, 11, kLength);
        PutVarint(out, MessageSize(m));
        PutOptionalBytes(out, 1, m.type_name);
        PutOptionalBytes(out, 2, m.data);
        return;
      }
    }
  }

  // `v` as the length-delimited message field `field`.
  void WriteItem(int field, const Value& v, std::string* out) {
    PutTag(out, field, kLength);
    PutVarint(out, ItemSize(v));
    Write(v, out);
  }

  uint64_t payload_total() const { return payload_total_; }

 private:
  // The ValueProto size of an item already measured (no tensor is added
  // again: sizes come from the recorded payloads and slots).
  size_t ItemSize(const Value& v) {
    switch (v.kind()) {
      case Value::Kind::kTensor:
        return LengthField(
            TensorMetaFields(out_->payloads[written_tensors_].tensor).Size());
      case Value::Kind::kList:
      case Value::Kind::kDict:
        return LengthField(sizes_[next_size_]);
      default:
        return ScalarSize(v);
    }
  }

  size_t Reserve() {
    sizes_.push_back(0);
    return sizes_.size() - 1;
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
  std::vector<size_t> sizes_;  // List, dict and entry bodies, pre-order.
  size_t next_size_ = 0;
  size_t written_tensors_ = 0;
};

// --- Decoding
// -------------------------------------------------------------------

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
    // Small metadata (a few tensors) parses into this stack block: no heap
    // allocation per message object, and nothing to free one by one.
    alignas(8) char block[kArenaBlockBytes];
    google::protobuf::Arena arena(block, sizeof(block));
    proto::WireMetadata& md =
        *google::protobuf::Arena::CreateMessage<proto::WireMetadata>(&arena);
    {
      google::protobuf::io::CodedInputStream in(
          reinterpret_cast<const uint8_t*>(meta), static_cast<int>(meta_len));
      // Each level of Value nesting costs two message levels (value, list).
      in.SetRecursionLimit(2 * std::max(limits_.max_depth, 0) + 8);
      if (!md.ParseFromCodedStream(&in) || !in.ConsumedEntireMessage()) {
        return Invalid(
            absl::StrCat("metadata does not parse (corrupt, or nested deeper "
                         "than the limit of ",
                         limits_.max_depth, ")"));
      }
    }
    cursor_ = kWireHeaderBytes + meta_len;
    cursor_ += PadTo(cursor_);
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
        ASSIGN_OR_RETURN(Tensor t, DecodeTensor(p.tensor()));
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

  absl::StatusOr<Tensor> DecodeTensor(const proto::TensorMeta& meta) {
    const size_t index = tensor_count_++;
    // Errors name the tensor; the text is made only for them.
    auto what = [index] { return absl::StrCat("tensor #", index); };
    const int code = static_cast<int>(meta.dtype());
    if (code < 1 || code > static_cast<int>(std::size(kAllDTypes))) {
      return Invalid(absl::StrCat(what(), ": unknown dtype ", code));
    }
    const DType dtype = static_cast<DType>(code - 1);
    std::vector<int64_t> sizes(meta.sizes().begin(), meta.sizes().end());
    int64_t nbytes = 0;
    absl::Status shape = CheckShape(sizes, dtype, &nbytes);
    if (!shape.ok())
      return Invalid(absl::StrCat(what(), ": ", shape.message()));
    if (meta.nbytes() != static_cast<uint64_t>(nbytes)) {
      return Invalid(absl::StrCat(what(), ": byte count mismatch: shape [",
                                  absl::StrJoin(sizes, ", "), "] of ",
                                  DTypeName(dtype), " needs ", nbytes,
                                  " bytes, metadata says ", meta.nbytes()));
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
  std::vector<uint64_t> starts_;
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
  const size_t meta_len = LengthField(value_len);
  if (meta_len > limits.max_metadata_bytes || meta_len > UINT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(
        "wire encode: metadata of ", meta_len, " bytes exceeds the limit of ",
        limits.max_metadata_bytes, " bytes"));
  }
  const size_t head_len = kWireHeaderBytes + meta_len;
  out.head.reserve(head_len + PadTo(head_len));
  out.head.append(kMagic, sizeof(kMagic));
  const uint32_t len32 = static_cast<uint32_t>(meta_len);
  out.head.append(reinterpret_cast<const char*>(&len32), sizeof(len32));
  PutTag(&out.head, 1, kLength);
  PutVarint(&out.head, value_len);
  enc.Write(value, &out.head);
  out.head.append(kZeros, PadTo(head_len));
  if (stats) stats->metadata_bytes += head_len;
  const uint64_t total = out.head.size() + enc.payload_total();
  if (total > limits.max_total_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "wire encode: stream of ", total, " bytes exceeds the limit of ",
        limits.max_total_bytes, " bytes"));
  }
  return out;
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
