#include "ferry/rpc/grpc/codec.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/utility/utility.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "ferry/common/proto_wire.h"
#include "ferry/common/status.h"

namespace ferry::rpc::grpc_agent {
namespace {

namespace v1 = ::ferry::rpc::v1;

// RpcRequest fields written by hand, named by the generated code.
constexpr int kTypeFieldNumber = v1::RpcRequest::kTypeFieldNumber;
constexpr int kFunctionFieldNumber = v1::RpcRequest::kFunctionFieldNumber;
constexpr int kCallerIdFieldNumber = v1::RpcRequest::kCallerIdFieldNumber;
constexpr int kCallerNameFieldNumber = v1::RpcRequest::kCallerNameFieldNumber;
constexpr int kRequestIdFieldNumber = v1::RpcRequest::kRequestIdFieldNumber;
constexpr int kRemainingUsFieldNumber = v1::RpcRequest::kRemainingUsFieldNumber;
// Appended to either message's serialized fields: one number in both.
constexpr int kSameHostFieldNumber = v1::RpcRequest::kSameHostFieldNumber;
static_assert(kSameHostFieldNumber == v1::RpcResponse::kSameHostFieldNumber);
// envelope.h writes the payload without seeing the generated code.
static_assert(kPayloadField == v1::RpcRequest::kPayloadFieldNumber &&
              kPayloadField == v1::RpcResponse::kPayloadFieldNumber);

void ToProto(const LayerHeaders& headers,
             google::protobuf::RepeatedPtrField<v1::LayerHeader>* p) {
  p->Reserve(static_cast<int>(headers.size()));
  for (const LayerHeader& h : headers) {
    v1::LayerHeader* out = p->Add();
    out->set_layer(h.layer);
    out->set_bytes(h.bytes);
  }
}

// Refuses what no sender writes: layer 0, or layers repeated or unordered.
absl::Status FromProto(
    const google::protobuf::RepeatedPtrField<v1::LayerHeader>& p,
    LayerHeaders* headers) {
  headers->reserve(p.size());
  for (const v1::LayerHeader& h : p) {
    if (h.layer() == 0 ||
        (!headers->empty() && headers->back().layer >= h.layer())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "envelope: layer header ", h.layer(),
          h.layer() == 0 ? " (0 is no layer)"
                         : " repeated or out of ascending order"));
    }
    headers->push_back(LayerHeader{h.layer(), h.bytes()});
  }
  return absl::OkStatus();
}

// A payload in the envelope, or (`same_host` set) in the peer's memory.
absl::StatusOr<Value> DecodePayload(const EnvelopeParts& parts,
                                    const v1::SameHostPayload* same_host,
                                    Value if_absent, const WireLimits& limits,
                                    const SameHostLink& link) {
  if (same_host != nullptr) {
    if (!parts.payload.empty()) {
      return absl::InvalidArgumentError(
          "envelope: both a payload and a same-host payload");
    }
    if (link.channel == nullptr) {
      // The peer sent what was never negotiated: a malformed message.
      return absl::InvalidArgumentError(
          "envelope: a same-host payload where no same-host channel is set "
          "up");
    }
    ASSIGN_OR_RETURN(WireChunk whole,
                     link.channel->Fetch(link.peer, *same_host, limits));
    return DecodeValue(absl::MakeConstSpan(&whole, 1), limits);
  }
  if (parts.payload.empty()) return if_absent;
  return DecodeValue(absl::MakeConstSpan(parts.payload), limits);
}

}  // namespace

absl::StatusOr<EncodedMessage> EncodeRequest(const Message& m, absl::Time now,
                                             const WireLimits& limits) {
  ASSIGN_OR_RETURN(EncodedParts parts, EncodeRequestParts(m, now, limits));
  return ToEnvelope(std::move(parts));
}

bool OfferSameHost(EncodedParts& parts, const SameHostLink& link,
                   std::shared_ptr<void>* lease) {
  // The channel takes tensor payloads only.
  if (link.channel == nullptr || parts.payload.payloads.empty()) return false;
  v1::SameHostPayload taken;
  if (!link.channel->Offer(link.peer, parts.payload, &taken, lease)) {
    return false;
  }
  // Appending the field to the serialized ones sets it.
  proto_wire::AppendLengthPrefix(&parts.header, kSameHostFieldNumber,
                                 taken.ByteSizeLong());
  taken.AppendToString(&parts.header);
  parts.payload = EncodedValue();
  return true;
}

EncodedMessage ToEnvelope(EncodedParts parts) {
  EncodedMessage out;
  out.bytes = parts.bytes();
  out.buffer =
      EncodeEnvelope(std::move(parts.header), std::move(parts.payload));
  return out;
}

namespace {

// Fields 1-6 of RpcRequest, serialized as protobuf would (in number order,
// zeros and empty strings left out), into room made once for the most they
// can take.
void AppendRequestScalars(const Message& m, int64_t remaining_us,
                          std::string* out) {
  using proto_wire::WriteOptionalBytesField;
  using proto_wire::WriteOptionalVarintField;
  // Six tags and six varints (two of them the strings' lengths).
  constexpr size_t kMaxFixedBytes = 12 * proto_wire::kMaxVarintBytes;
  const size_t start = out->size();
  out->resize(start + kMaxFixedBytes + m.function.size() +
              m.caller_name.size());
  char* p = out->data() + start;
  p = WriteOptionalVarintField(p, kTypeFieldNumber,
                               proto_wire::Int32Varint(static_cast<int32_t>(
                                   static_cast<uint32_t>(m.type))));
  p = WriteOptionalBytesField(p, kFunctionFieldNumber, m.function);
  p = WriteOptionalVarintField(p, kCallerIdFieldNumber,
                               static_cast<uint32_t>(m.caller_id));
  p = WriteOptionalBytesField(p, kCallerNameFieldNumber, m.caller_name);
  p = WriteOptionalVarintField(p, kRequestIdFieldNumber, m.id.value());
  p = WriteOptionalVarintField(p, kRemainingUsFieldNumber,
                               static_cast<uint64_t>(remaining_us));
  out->resize(p - out->data());
}

// Fields 9-10 of RpcRequest, when set, through the generated code; they
// follow fields 1-6 on the wire as protobuf orders them. Deterministic:
// the context map's entries in key order (a protobuf map's own order
// depends on its hash table), so one message always encodes to the same
// bytes.
void AppendRequestMessages(const Message& m, std::string* out) {
  if (m.context.empty() && m.headers.empty()) return;
  v1::RpcRequest header;
  for (const auto& [k, v] : m.context) (*header.mutable_context())[k] = v;
  if (!m.headers.empty()) ToProto(m.headers, header.mutable_headers());
  google::protobuf::io::StringOutputStream raw(out);  // Appends to *out.
  google::protobuf::io::CodedOutputStream coded(&raw);
  coded.SetSerializationDeterministic(true);
  header.SerializeToCodedStream(&coded);
}

}  // namespace

absl::StatusOr<EncodedParts> EncodeRequestParts(const Message& m,
                                                absl::Time now,
                                                const WireLimits& limits) {
  // At least 1 µs: 0 would mean "no deadline".
  const int64_t remaining_us =
      m.deadline == absl::InfiniteFuture()
          ? 0
          : std::max<int64_t>(1, absl::ToInt64Microseconds(m.deadline - now));
  EncodedParts out;
  AppendRequestScalars(m, remaining_us, &out.header);
  AppendRequestMessages(m, &out.header);
  // No arguments, no payload: the callee reads an absent one as an empty
  // list (DecodeRequest).
  const Value::List* args = m.payload.if_list();
  if (args == nullptr || !args->empty()) {
    ASSIGN_OR_RETURN(out.payload, EncodeValue(m.payload, limits));
  }
  return out;
}

absl::StatusOr<ReceivedRequest> SplitRequest(const grpc::ByteBuffer& buffer) {
  ReceivedRequest r;
  ASSIGN_OR_RETURN(r.parts, SplitEnvelope(buffer));
  if (!r.header.ParseFromString(r.parts.header)) {
    return absl::InvalidArgumentError("envelope: malformed RpcRequest fields");
  }
  return r;
}

absl::StatusOr<Message> DecodeRequest(const ReceivedRequest& r,
                                      absl::Time received_at,
                                      const WireLimits& limits,
                                      SameHostLink link) {
  const v1::RpcRequest& h = r.header;
  // Built in place: a Message is large, and moving it costs.
  absl::StatusOr<Message> out(absl::in_place);
  Message& m = *out;
  m.type = static_cast<MessageType>(h.type());
  m.id = GlobalId::FromValue(h.request_id());
  m.function = h.function();
  m.caller_name = h.caller_name();
  m.caller_id = static_cast<int>(h.caller_id());
  if (h.remaining_us() > 0) {
    m.deadline = received_at + absl::Microseconds(h.remaining_us());
  }
  for (const auto& [k, v] : h.context()) m.context.emplace(k, v);
  RETURN_IF_ERROR(FromProto(h.headers(), &m.headers));
  absl::StatusOr<Value> payload =
      DecodePayload(r.parts, h.has_same_host() ? &h.same_host() : nullptr,
                    Value::FromList({}), limits, link);
  if (!payload.ok()) {
    return Annotate(payload.status(), m.type == MessageType::kCall
                                          ? "decoding the arguments"
                                          : "decoding the payload");
  }
  m.payload = *std::move(payload);
  return out;
}

absl::StatusOr<EncodedMessage> EncodeReply(const Result<Message>& reply,
                                           const WireLimits& limits) {
  ASSIGN_OR_RETURN(EncodedParts parts, EncodeReplyParts(reply, limits));
  return ToEnvelope(std::move(parts));
}

absl::StatusOr<EncodedParts> EncodeReplyParts(const Result<Message>& reply,
                                              const WireLimits& limits) {
  v1::RpcResponse header;
  static const Value kNone;
  const Value* payload = &kNone;
  if (reply.ok()) {
    header.set_type(static_cast<v1::MessageType>(reply->type));
    if (!reply->headers.empty()) {
      ToProto(reply->headers, header.mutable_headers());
    }
    payload = &reply->payload;
  } else {
    header.set_error_code(static_cast<int>(reply.status().code()));
    header.set_error_message(std::string(reply.status().message()));
  }
  EncodedParts out;
  // None is left out: the caller reads an absent payload as None
  // (DecodeReplyParts).
  if (!payload->is_none()) {
    ASSIGN_OR_RETURN(out.payload, EncodeValue(*payload, limits));
  }
  header.AppendToString(&out.header);
  return out;
}

absl::StatusOr<Result<Message>> DecodeReply(const grpc::ByteBuffer& buffer,
                                            const WireLimits& limits,
                                            uint64_t* bytes,
                                            SameHostLink link) {
  ASSIGN_OR_RETURN(EnvelopeParts parts, SplitEnvelope(buffer));
  return DecodeReplyParts(parts, limits, bytes, link);
}

absl::StatusOr<Result<Message>> DecodeReplyParts(const EnvelopeParts& parts,
                                                 const WireLimits& limits,
                                                 uint64_t* bytes,
                                                 SameHostLink link) {
  v1::RpcResponse h;
  if (!h.ParseFromString(parts.header)) {
    return absl::InvalidArgumentError("envelope: malformed RpcResponse fields");
  }
  if (h.error_code() != 0) {
    const int code = h.error_code();
    return Result<Message>(absl::Status(
        code > 0 && code <= 16 ? static_cast<absl::StatusCode>(code)
                               : absl::StatusCode::kUnknown,
        h.error_message()));
  }
  *bytes = parts.total_bytes;
  // Built in place: a Message is large, and moving it costs.
  absl::StatusOr<Result<Message>> out(absl::in_place, absl::in_place);
  Message& m = **out;
  m.type = static_cast<MessageType>(h.type());
  RETURN_IF_ERROR(FromProto(h.headers(), &m.headers));
  ASSIGN_OR_RETURN(
      m.payload,
      DecodePayload(parts, h.has_same_host() ? &h.same_host() : nullptr,
                    Value::None(), limits, link));
  return out;
}

}  // namespace ferry::rpc::grpc_agent
