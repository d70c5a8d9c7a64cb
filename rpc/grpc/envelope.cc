#include "ferry/rpc/grpc/envelope.h"

#include <grpc/slice.h>
#include <grpcpp/support/slice.h>

#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "ferry/common/proto_wire.h"
#include "ferry/common/status.h"
#include "ferry/tensor/wire_grpc.h"

namespace ferry::rpc {

namespace {

// A read cursor over a list of chunks.
class ChunkReader {
 public:
  explicit ChunkReader(absl::Span<const WireChunk> chunks) : chunks_(chunks) {
    Normalize();
  }

  bool AtEnd() const { return index_ >= chunks_.size(); }
  size_t consumed() const { return consumed_; }

  bool ReadByte(uint8_t* b) {
    if (AtEnd()) return false;
    *b = static_cast<uint8_t>(chunks_[index_].data[offset_]);
    Advance(1);
    return true;
  }

  // Reads a varint. Decoded in place when it ends in the current chunk (the
  // usual case); byte by byte across chunk boundaries.
  absl::Status ReadVarint(uint64_t* v, const char* what) {
    if (!AtEnd()) {
      const WireChunk& c = chunks_[index_];
      const auto* p = reinterpret_cast<const uint8_t*>(c.data + offset_);
      const size_t n =
          std::min<size_t>(c.size - offset_, proto_wire::kMaxVarintBytes);
      uint64_t value = 0;
      for (size_t i = 0; i < n; ++i) {
        value |= static_cast<uint64_t>(p[i] & 0x7F) << (7 * i);
        if ((p[i] & 0x80) == 0) {
          *v = value;
          Advance(i + 1);
          return absl::OkStatus();
        }
      }
      if (n == proto_wire::kMaxVarintBytes) return TooLong(what);
    }
    *v = 0;
    for (size_t i = 0; i < proto_wire::kMaxVarintBytes; ++i) {
      uint8_t b;
      if (!ReadByte(&b)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "envelope: truncated varint (", what, ") at byte ", consumed_));
      }
      *v |= static_cast<uint64_t>(b & 0x7F) << (7 * i);
      if ((b & 0x80) == 0) return absl::OkStatus();
    }
    return TooLong(what);
  }

  // Skips the next `n` bytes.
  absl::Status Skip(uint64_t n) {
    while (n > 0) {
      if (AtEnd()) return Truncated(n);
      size_t take = std::min<uint64_t>(n, chunks_[index_].size - offset_);
      Advance(take);
      n -= take;
    }
    return absl::OkStatus();
  }

  // Where the cursor stands, to copy what was read since (AppendSince).
  struct Mark {
    size_t index = 0;
    size_t offset = 0;
    size_t consumed = 0;
  };
  Mark mark() const { return Mark{index_, offset_, consumed_}; }

  // Appends the bytes read between `from` and `to` (a later mark) to `out`.
  void AppendSince(const Mark& from, const Mark& to, std::string* out) const {
    size_t left = to.consumed - from.consumed;
    size_t index = from.index;
    size_t offset = from.offset;
    while (left > 0) {
      const WireChunk& c = chunks_[index];
      const size_t take = std::min(left, c.size - offset);
      out->append(c.data + offset, take);
      left -= take;
      ++index;
      offset = 0;
    }
  }

  // References the next `n` bytes as chunks sharing the source keepalives.
  absl::Status Reference(uint64_t n, std::vector<WireChunk>* out) {
    while (n > 0) {
      if (AtEnd()) return Truncated(n);
      const WireChunk& c = chunks_[index_];
      size_t take = std::min<uint64_t>(n, c.size - offset_);
      out->push_back(WireChunk{c.data + offset_, take, c.keepalive});
      Advance(take);
      n -= take;
    }
    return absl::OkStatus();
  }

 private:
  static absl::Status TooLong(const char* what) {
    return absl::InvalidArgumentError(
        absl::StrCat("envelope: varint longer than 10 bytes (", what, ")"));
  }
  absl::Status Truncated(uint64_t missing) const {
    return absl::InvalidArgumentError(
        absl::StrCat("envelope: field runs past the end of the message (",
                     missing, " bytes missing after byte ", consumed_, ")"));
  }
  void Advance(size_t n) {
    offset_ += n;
    consumed_ += n;
    Normalize();
  }
  void Normalize() {
    while (index_ < chunks_.size() && offset_ >= chunks_[index_].size) {
      ++index_;
      offset_ = 0;
    }
  }

  const absl::Span<const WireChunk> chunks_;
  size_t index_ = 0;
  size_t offset_ = 0;
  size_t consumed_ = 0;
};

}  // namespace

grpc::ByteBuffer EncodeEnvelope(const google::protobuf::MessageLite& header,
                                EncodedValue payload) {
  std::string head;
  header.AppendToString(&head);
  return EncodeEnvelope(std::move(head), std::move(payload));
}

grpc::ByteBuffer EncodeEnvelope(std::string header, EncodedValue payload) {
  const uint64_t payload_size = payload.total_bytes();
  // The fields, the payload's tag and length and its head (wire header and
  // metadata, small) go in one slice; the tensor memory after it is
  // referenced as is. An empty payload is left out (decoders read an absent
  // one as empty).
  if (payload_size > 0) {
    header.reserve(header.size() + 20 + payload.head.size());
    proto_wire::AppendLengthPrefix(&header, kPayloadField, payload_size);
    header += payload.head;
  }
  payload.head = std::move(header);
  return ToByteBuffer(std::move(payload));
}

absl::StatusOr<EnvelopeParts> SplitEnvelope(const grpc::ByteBuffer& buffer,
                                            size_t max_header_bytes) {
  grpc::Slice single;
  if (!buffer.TrySingleSlice(&single).ok()) {
    ASSIGN_OR_RETURN(std::vector<WireChunk> chunks, ChunksOfByteBuffer(buffer));
    return SplitEnvelope(chunks, max_header_bytes);
  }
  // One slice (most messages): split it borrowed, and give it an owner only
  // when a payload references it, so a message without one allocates none.
  const auto* base = reinterpret_cast<const char*>(single.begin());
  const WireChunk borrowed{base, single.size(), nullptr};
  ASSIGN_OR_RETURN(
      EnvelopeParts parts,
      SplitEnvelope(absl::MakeConstSpan(&borrowed, 1), max_header_bytes));
  if (!parts.payload.empty()) {
    // A small slice keeps its bytes inside the object, so the payload is
    // re-pointed at the held copy by offset.
    auto held = std::make_shared<grpc::Slice>(std::move(single));
    const auto* moved = reinterpret_cast<const char*>(held->begin());
    for (WireChunk& c : parts.payload) {
      c.data = moved + (c.data - base);
      c.keepalive = held;
    }
  }
  return parts;
}

absl::StatusOr<EnvelopeParts> SplitEnvelope(absl::Span<const WireChunk> chunks,
                                            size_t max_header_bytes) {
  EnvelopeParts parts;
  ChunkReader in(chunks);
  bool have_payload = false;
  // Fields other than the payload are copied to `header` a run at a time:
  // `run` marks where the current run of them began.
  ChunkReader::Mark run = in.mark();
  while (!in.AtEnd()) {
    const ChunkReader::Mark field = in.mark();
    uint64_t tag;
    RETURN_IF_ERROR(in.ReadVarint(&tag, "field tag"));
    const uint64_t number = tag >> 3;
    const int wire_type = static_cast<int>(tag & 7);
    if (number == 0) {
      return absl::InvalidArgumentError("envelope: field number 0");
    }
    if (number == kPayloadField && wire_type == 2) {
      if (have_payload) {
        return absl::InvalidArgumentError(
            "envelope: payload field appears twice");
      }
      have_payload = true;
      in.AppendSince(run, field, &parts.header);
      uint64_t len;
      RETURN_IF_ERROR(in.ReadVarint(&len, "payload length"));
      RETURN_IF_ERROR(in.Reference(len, &parts.payload));
      parts.payload_bytes = len;
      run = in.mark();
      continue;
    }
    switch (wire_type) {
      case 0: {
        uint64_t ignored;
        RETURN_IF_ERROR(in.ReadVarint(&ignored, "varint field"));
        break;
      }
      case 1:
        RETURN_IF_ERROR(in.Skip(8));
        break;
      case 5:
        RETURN_IF_ERROR(in.Skip(4));
        break;
      case 2: {
        uint64_t len;
        RETURN_IF_ERROR(in.ReadVarint(&len, "field length"));
        if (len > max_header_bytes) {
          return absl::InvalidArgumentError(
              absl::StrCat("envelope: field ", number, " is ", len,
                           " bytes, over the limit of ", max_header_bytes,
                           " for envelope fields"));
        }
        RETURN_IF_ERROR(in.Skip(len));
        break;
      }
      default:
        return absl::InvalidArgumentError(
            absl::StrCat("envelope: field ", number,
                         " has unsupported wire type ", wire_type));
    }
    if (parts.header.size() + (in.consumed() - run.consumed) >
        max_header_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("envelope: header fields exceed the limit of ",
                       max_header_bytes, " bytes"));
    }
  }
  in.AppendSince(run, in.mark(), &parts.header);
  parts.total_bytes = in.consumed();
  return parts;
}

}  // namespace ferry::rpc
