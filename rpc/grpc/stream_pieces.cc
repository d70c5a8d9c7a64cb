#include "ferry/rpc/grpc/stream_pieces.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "ferry/common/status.h"
#include "ferry/tensor/wire_grpc.h"

namespace ferry::rpc::grpc_agent {
namespace {

namespace v1 = ::ferry::rpc::v1;

// Field 14 (payload_bytes) of RpcRequest and RpcResponse, as a varint.
constexpr uint64_t kPayloadBytesTag = (uint64_t{14} << 3) | 0;

void RecordPiece(StreamStats* stats, uint64_t bytes) {
  uint64_t seen = stats->max_piece_bytes.load(std::memory_order_relaxed);
  while (bytes > seen && !stats->max_piece_bytes.compare_exchange_weak(
                             seen, bytes, std::memory_order_relaxed)) {
  }
}

// Splits a received message; `first` allows envelope fields, later messages
// carry only a piece of the payload.
absl::StatusOr<EnvelopeParts> SplitMessage(const grpc::ByteBuffer& message,
                                           bool first) {
  ASSIGN_OR_RETURN(EnvelopeParts parts, SplitEnvelope(message));
  if (!first && !parts.header.empty()) {
    return absl::InvalidArgumentError(
        "stream: a payload piece carries envelope fields");
  }
  return parts;
}

// Parses a first message's fields. A payload_bytes other than 0 must be at
// least the piece in the first message.
template <typename Header>
absl::StatusOr<Header> ParseHeader(const EnvelopeParts& parts) {
  Header h;
  if (!h.ParseFromString(parts.header)) {
    return absl::InvalidArgumentError(
        absl::StrCat("stream: malformed ", h.GetTypeName(), " fields"));
  }
  if (h.payload_bytes() != 0 && h.payload_bytes() < parts.payload_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "stream: declared payload of ", h.payload_bytes(),
        " bytes is smaller than its first piece (", parts.payload_bytes, ")"));
  }
  return h;
}

}  // namespace

absl::Status CheckStreamSize(uint64_t bytes, int max_message_bytes,
                             const WireLimits& limits,
                             const std::string& what) {
  if (max_message_bytes >= 0 &&
      bytes > static_cast<uint64_t>(max_message_bytes)) {
    return absl::ResourceExhaustedError(
        absl::StrCat(what, " is ", bytes, " bytes, over the limit of ",
                     max_message_bytes, " bytes (max_message_bytes)"));
  }
  if (bytes > limits.max_total_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        what, " is ", bytes, " bytes, over the limit of ",
        limits.max_total_bytes, " bytes (WireLimits::max_total_bytes)"));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// PieceWriter / PieceAssembler.

PieceWriter::PieceWriter(EncodedParts parts, size_t piece_bytes)
    : header_(std::move(parts.header)), total_(parts.payload.total_bytes()) {
  uint64_t at = parts.payload.head.size();
  for (const WirePayload& p : parts.payload.payloads) {
    if (p.tensor.storage().gate() != nullptr && p.size > 0) {
      gated_.push_back({at, p});
    }
    at += p.size + p.padding;
  }
  grpc::ByteBuffer payload = ToByteBuffer(std::move(parts.payload));
  (void)payload.Dump(&slices_);
  // Empty slices carry nothing; without them an empty payload (no arguments,
  // a None result) ends after its first message instead of never.
  slices_.erase(
      std::remove_if(slices_.begin(), slices_.end(),
                     [](const grpc::Slice& s) { return s.size() == 0; }),
      slices_.end());
  // Even pieces, each at least piece_bytes (but the only one).
  const uint64_t step = std::max<uint64_t>(1, piece_bytes);
  const uint64_t count = std::max<uint64_t>(1, total_ / step);
  target_ = (total_ + count - 1) / count;
  AppendVarint(&header_, kPayloadBytesTag);
  AppendVarint(&header_, total_);
}

absl::Status PieceWriter::WaitForNext() { return Advance(true).status(); }

absl::StatusOr<bool> PieceWriter::NextReady() { return Advance(false); }

absl::StatusOr<bool> PieceWriter::Advance(bool wait) {
  const uint64_t end = std::min(total_, position_ + target_);
  while (gated_done_ < gated_.size()) {
    const Gated& g = gated_[gated_done_];
    if (g.begin >= end) break;
    const uint64_t covered = std::min<uint64_t>(end - g.begin, g.payload.size);
    if (wait) {
      RETURN_IF_ERROR(WaitPayloadReady(g.payload, covered));
    } else {
      ASSIGN_OR_RETURN(const bool ready, PollPayloadReady(g.payload, covered));
      if (!ready) return false;
    }
    if (covered < g.payload.size) break;
    ++gated_done_;
  }
  return true;
}

bool PieceWriter::Next(grpc::ByteBuffer* message, uint64_t* payload_bytes) {
  if (started_ && last()) return false;
  std::vector<grpc::Slice> slices(1);  // [0]: fields, piece tag and length.
  uint64_t taken = 0;
  while (taken < target_ && index_ < slices_.size()) {
    const grpc::Slice& s = slices_[index_];
    const size_t take = std::min<uint64_t>(target_ - taken, s.size() - offset_);
    if (take > 0) slices.push_back(s.sub(offset_, offset_ + take));
    taken += take;
    offset_ += take;
    if (offset_ == s.size()) {
      ++index_;
      offset_ = 0;
    }
  }
  std::string head = started_ ? std::string() : std::move(header_);
  started_ = true;
  AppendVarint(&head, (uint64_t{kPayloadField} << 3) | 2);
  AppendVarint(&head, taken);
  slices[0] = grpc::Slice(head);  // A few bytes, copied.
  *message = grpc::ByteBuffer(slices.data(), slices.size());
  *payload_bytes = taken;
  position_ += taken;
  return true;
}

absl::Status PieceAssembler::Start(uint64_t total, Allocator* allocator,
                                   ReceiveBufferPool* pool) {
  if (pool != nullptr) {
    ASSIGN_OR_RETURN(storage_, pool->Get(total, allocator));
  } else {
    if (allocator == nullptr) allocator = GetCpuAllocator();
    ASSIGN_OR_RETURN(storage_, allocator->Allocate(total));
  }
  total_ = total;
  received_ = 0;
  return absl::OkStatus();
}

absl::Status PieceAssembler::Add(absl::Span<const WireChunk> piece,
                                 StreamStats* stats) {
  uint64_t bytes = 0;
  for (const WireChunk& c : piece) bytes += c.size;
  if (bytes > total_ - received_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "stream: pieces run past the declared payload of ", total_, " bytes"));
  }
  RecordPiece(stats, bytes);
  char* out = static_cast<char*>(storage_.data()) + received_;
  for (const WireChunk& c : piece) {
    std::memcpy(out, c.data, c.size);
    out += c.size;
  }
  received_ += bytes;
  stats->bytes_received.fetch_add(bytes, std::memory_order_relaxed);
  return absl::OkStatus();
}

EnvelopeParts PieceAssembler::Take(std::string header,
                                   std::shared_ptr<const void> attached) {
  EnvelopeParts parts;
  parts.header = std::move(header);
  parts.payload_bytes = total_;
  parts.total_bytes = parts.header.size() + total_;
  // The attachment goes first (declared last): it may still refer to the
  // buffer while it is destroyed.
  struct Held {
    Storage storage;
    std::shared_ptr<const void> attached;
  };
  auto held = std::make_shared<Held>(Held{std::move(storage_),
                                          std::move(attached)});
  const char* data = static_cast<const char*>(held->storage.data());
  parts.payload.push_back(WireChunk{data, total_, std::move(held)});
  return parts;
}

// ---------------------------------------------------------------------------
// StreamReceiver.

template <typename Header>
StreamReceiver<Header>::StreamReceiver(
    Config config, std::function<std::string(const Header&)> describe,
    std::function<absl::Status(const Header&)> on_header, Observe observe)
    : config_(config),
      describe_(std::move(describe)),
      on_header_(std::move(on_header)),
      observe_(std::move(observe)) {}

template <typename Header>
absl::StatusOr<bool> StreamReceiver<Header>::Receive(
    const grpc::ByteBuffer& message) {
  if (complete_) {
    return absl::InvalidArgumentError(
        "stream: a message after the end of the envelope");
  }
  ASSIGN_OR_RETURN(EnvelopeParts parts, SplitMessage(message, !started_));
  if (!started_) {
    started_ = true;
    ASSIGN_OR_RETURN(header_, ParseHeader<Header>(parts));
    RETURN_IF_ERROR(CheckStreamSize(header_.payload_bytes(),
                                    config_.max_message_bytes, *config_.limits,
                                    describe_(header_)));
    if (on_header_) RETURN_IF_ERROR(on_header_(header_));
    if (header_.payload_bytes() == 0) {  // The whole envelope in one message.
      whole_ = std::move(parts);
      complete_ = true;
      return true;
    }
    if (config_.streamed != nullptr) {
      config_.streamed->fetch_add(1, std::memory_order_relaxed);
    }
    if (observe_) progress_ = observe_(header_);
    Allocator* allocator =
        progress_ != nullptr ? progress_->allocator() : nullptr;
    // Out of the observer's memory (pinned host memory, say), the payload
    // still arrives, only not observed.
    if (allocator != nullptr &&
        !assembler_.Start(header_.payload_bytes(), allocator).ok()) {
      progress_ = nullptr;
      allocator = nullptr;
    }
    if (allocator == nullptr) {
      RETURN_IF_ERROR(assembler_.Start(header_.payload_bytes(),
                                       config_.limits->allocator, config_.pool));
    }
    if (progress_ != nullptr) progress_->Started(assembler_.buffer());
    fields_ = std::move(parts.header);
  }
  RETURN_IF_ERROR(assembler_.Add(parts.payload, config_.stats));
  if (progress_ != nullptr) progress_->Received(assembler_.received());
  if (config_.options->after_piece_received) {
    config_.options->after_piece_received(assembler_.received(),
                                          assembler_.total());
  }
  if (!assembler_.complete()) return false;
  whole_ = assembler_.Take(std::move(fields_), std::move(progress_));
  complete_ = true;
  return true;
}

template class StreamReceiver<v1::RpcRequest>;
template class StreamReceiver<v1::RpcResponse>;

}  // namespace ferry::rpc::grpc_agent
