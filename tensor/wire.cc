#include "tensor/wire.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/io/coded_stream.h"
#include "proto/tensor.pb.h"

namespace ferry {
namespace {

static_assert(std::endian::native == std::endian::little,
              "the wire format stores elements little-endian");

constexpr char kMagic[4] = {'F', 'R', 'Y', '1'};
alignas(kWireAlignment) constexpr char kZeros[kWireAlignment] = {};

size_t PadTo(size_t n) {
  return (kWireAlignment - n % kWireAlignment) % kWireAlignment;
}

absl::Status Invalid(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("wire decode: ", what));
}

// --- Encoding
// -------------------------------------------------------------------

class Encoder {
 public:
  Encoder(const WireLimits& limits, WireStats* stats, EncodedValue* out)
      : limits_(limits), stats_(stats), out_(out) {}

  absl::Status Encode(const Value& v, int depth, proto::ValueProto* p) {
    switch (v.kind()) {
      case Value::Kind::kNone:
        p->mutable_none();
        return absl::OkStatus();
      case Value::Kind::kBool:
        p->set_bool_value(*v.if_bool());
        return absl::OkStatus();
      case Value::Kind::kInt:
        p->set_int_value(*v.if_int());
        return absl::OkStatus();
      case Value::Kind::kDouble:
        p->set_double_value(*v.if_double());
        return absl::OkStatus();
      case Value::Kind::kString:
        p->set_string_value(*v.if_string());
        return absl::OkStatus();
      case Value::Kind::kBytes:
        p->set_bytes_value(v.if_bytes()->data);
        return absl::OkStatus();
      case Value::Kind::kTensor:
        return EncodeTensor(*v.if_tensor(), p->mutable_tensor());
      case Value::Kind::kList: {
        RETURN_IF_ERROR(CheckDepth(depth + 1));
        proto::ListValue* l = p->mutable_list();
        for (const Value& item : *v.if_list()) {
          RETURN_IF_ERROR(Encode(item, depth + 1, l->add_items()));
        }
        return absl::OkStatus();
      }
      case Value::Kind::kDict: {
        RETURN_IF_ERROR(CheckDepth(depth + 1));
        proto::DictValue* d = p->mutable_dict();
        for (const auto& [key, item] : *v.if_dict()) {
          proto::DictEntry* e = d->add_entries();
          e->set_key(key);
          RETURN_IF_ERROR(Encode(item, depth + 1, e->mutable_value()));
        }
        return absl::OkStatus();
      }
      case Value::Kind::kRRef: {
        const RRefHandle& r = *v.if_rref();
        proto::RRefHandleProto* rp = p->mutable_rref();
        rp->set_owner_id(r.owner_id);
        rp->set_rref_id(r.rref_id.value());
        rp->set_fork_id(r.fork_id.value());
        rp->set_type_name(r.type_name);
        rp->set_extra(r.extra);
        return absl::OkStatus();
      }
      case Value::Kind::kMessage: {
        proto::MessageValue* m = p->mutable_message();
        m->set_type_name(v.if_message()->type_name);
        m->set_data(v.if_message()->data);
        return absl::OkStatus();
      }
    }
    return absl::InternalError("wire encode: unknown value kind");
  }

  uint64_t payload_total() const { return payload_total_; }

 private:
  absl::Status CheckDepth(int depth) {
    if (depth > limits_.max_depth) {
      return absl::InvalidArgumentError(
          absl::StrCat("wire encode: value nests deeper than the limit of ",
                       limits_.max_depth));
    }
    return absl::OkStatus();
  }

  absl::Status EncodeTensor(const Tensor& t_in, proto::TensorMeta* meta) {
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
    meta->set_dtype(
        static_cast<proto::WireDType>(static_cast<int>(t.dtype()) + 1));
    for (int64_t s : t.sizes()) meta->add_sizes(s);
    meta->set_nbytes(t.nbytes());
    meta->set_device(t.device().ToString());
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
    proto::WireMetadata md;
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
    const std::string what = absl::StrCat("tensor #", index);
    const int code = static_cast<int>(meta.dtype());
    if (code < 1 || code > static_cast<int>(std::size(kAllDTypes))) {
      return Invalid(absl::StrCat(what, ": unknown dtype ", code));
    }
    const DType dtype = static_cast<DType>(code - 1);
    std::vector<int64_t> sizes(meta.sizes().begin(), meta.sizes().end());
    int64_t nbytes = 0;
    absl::Status shape = CheckShape(sizes, dtype, &nbytes);
    if (!shape.ok()) return Invalid(absl::StrCat(what, ": ", shape.message()));
    if (meta.nbytes() != static_cast<uint64_t>(nbytes)) {
      return Invalid(absl::StrCat(what, ": byte count mismatch: shape [",
                                  absl::StrJoin(sizes, ", "), "] of ",
                                  DTypeName(dtype), " needs ", nbytes,
                                  " bytes, metadata says ", meta.nbytes()));
    }
    const uint64_t n = static_cast<uint64_t>(nbytes);
    if (cursor_ > total_ || n > total_ - cursor_) {
      return Invalid(absl::StrCat("truncated: ", what, " needs ", n,
                                  " bytes at offset ", cursor_, ", stream has ",
                                  total_));
    }
    const uint64_t offset = cursor_;
    cursor_ += n;
    cursor_ += PadTo(cursor_);
    if (stats_) stats_->payload_bytes += n;

    const std::vector<int64_t> strides = ContiguousStrides(sizes);
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
        return Tensor::FromStorage(std::move(s), dtype, std::move(sizes),
                                   strides, 0);
      }
    }
    absl::StatusOr<Tensor> t =
        Tensor::TryEmpty(sizes, dtype, limits_.allocator);
    if (!t.ok())
      return Annotate(t.status(), absl::StrCat("wire decode: ", what));
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
  proto::WireMetadata md;
  Encoder enc(limits, stats, &out);
  RETURN_IF_ERROR(enc.Encode(value, 0, md.mutable_value()));
  const size_t meta_len = md.ByteSizeLong();
  if (meta_len > limits.max_metadata_bytes || meta_len > UINT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(
        "wire encode: metadata of ", meta_len, " bytes exceeds the limit of ",
        limits.max_metadata_bytes, " bytes"));
  }
  const size_t head_len = kWireHeaderBytes + meta_len;
  out.head.resize(head_len + PadTo(head_len));
  std::memcpy(out.head.data(), kMagic, sizeof(kMagic));
  const uint32_t len32 = static_cast<uint32_t>(meta_len);
  std::memcpy(out.head.data() + 4, &len32, sizeof(len32));
  md.SerializeWithCachedSizesToArray(
      reinterpret_cast<uint8_t*>(out.head.data()) + kWireHeaderBytes);
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
