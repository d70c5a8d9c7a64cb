#include "rpc/grpc/codec.h"

#include <algorithm>
#include <utility>

#include "common/status.h"

namespace ferry::rpc::grpc_agent {
namespace {

namespace v1 = ::ferry::rpc::v1;

void ToProto(const RRefFields& r, v1::RRefFields* p) {
  p->set_rref_id(r.rref_id.value());
  p->set_fork_id(r.fork_id.value());
  p->set_owner_id(r.owner_id);
  p->set_peer_id(r.peer_id);
  p->set_type_name(r.type_name);
}

RRefFields FromProto(const v1::RRefFields& p) {
  return RRefFields{GlobalId::FromValue(p.rref_id()),
                    GlobalId::FromValue(p.fork_id()), p.owner_id(), p.peer_id(),
                    p.type_name()};
}

void ToProto(const AutogradFields& a, v1::AutogradFields* p) {
  p->set_context_id(a.context_id.value());
  p->set_message_id(a.message_id.value());
  p->set_retain_graph(a.retain_graph);
}

AutogradFields FromProto(const v1::AutogradFields& p) {
  return AutogradFields{GlobalId::FromValue(p.context_id()),
                        GlobalId::FromValue(p.message_id()), p.retain_graph()};
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
  // `same_host` has one number in RpcRequest and RpcResponse; appending the
  // field to the serialized ones sets it.
  static_assert(static_cast<int>(v1::RpcRequest::kSameHostFieldNumber) ==
                static_cast<int>(v1::RpcResponse::kSameHostFieldNumber));
  AppendVarint(&parts.header,
               (uint64_t{v1::RpcRequest::kSameHostFieldNumber} << 3) | 2);
  AppendVarint(&parts.header, taken.ByteSizeLong());
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
// zeros and empty strings left out); the generated code writes the rest.
void AppendRequestScalars(const Message& m, int64_t remaining_us,
                          std::string* out) {
  auto varint = [out](int field, uint64_t v) {
    if (v == 0) return;
    out->push_back(static_cast<char>(field << 3));
    AppendVarint(out, v);
  };
  auto bytes = [out](int field, const std::string& s) {
    if (s.empty()) return;
    out->push_back(static_cast<char>((field << 3) | 2));
    AppendVarint(out, s.size());
    out->append(s);
  };
  // An enum is an int32 on the wire (sign-extended).
  varint(1, static_cast<uint64_t>(static_cast<int64_t>(
                static_cast<int32_t>(static_cast<uint32_t>(m.type)))));
  bytes(2, m.function);
  varint(3, static_cast<uint32_t>(m.caller_id));
  bytes(4, m.caller_name);
  varint(5, m.id.value());
  varint(6, static_cast<uint64_t>(remaining_us));
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
  if (!m.rref && !m.autograd && m.context.empty()) {
    // The common case, without building a message.
    out.header.reserve(32 + m.function.size() + m.caller_name.size());
    AppendRequestScalars(m, remaining_us, &out.header);
  } else {
    v1::RpcRequest header;
    header.set_type(static_cast<v1::MessageType>(m.type));
    header.set_function(m.function);
    header.set_caller_id(static_cast<uint32_t>(m.caller_id));
    header.set_caller_name(m.caller_name);
    header.set_request_id(m.id.value());
    header.set_remaining_us(remaining_us);
    if (m.rref) ToProto(*m.rref, header.mutable_rref());
    if (m.autograd) ToProto(*m.autograd, header.mutable_autograd());
    for (const auto& [k, v] : m.context) (*header.mutable_context())[k] = v;
    header.AppendToString(&out.header);
  }
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
  Message m;
  m.type = static_cast<MessageType>(h.type());
  m.id = GlobalId::FromValue(h.request_id());
  m.function = h.function();
  m.caller_name = h.caller_name();
  m.caller_id = static_cast<int>(h.caller_id());
  if (h.remaining_us() > 0) {
    m.deadline = received_at + absl::Microseconds(h.remaining_us());
  }
  if (h.has_rref()) m.rref = FromProto(h.rref());
  if (h.has_autograd()) m.autograd = FromProto(h.autograd());
  for (const auto& [k, v] : h.context()) m.context.emplace(k, v);
  absl::StatusOr<Value> payload =
      DecodePayload(r.parts, h.has_same_host() ? &h.same_host() : nullptr,
                    Value::FromList({}), limits, link);
  if (!payload.ok()) {
    return Annotate(payload.status(), m.type == MessageType::kCall
                                          ? "decoding the arguments"
                                          : "decoding the payload");
  }
  m.payload = *std::move(payload);
  return m;
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
    if (reply->rref) ToProto(*reply->rref, header.mutable_rref());
    if (reply->autograd) ToProto(*reply->autograd, header.mutable_autograd());
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
  Message m;
  m.type = static_cast<MessageType>(h.type());
  if (h.has_rref()) m.rref = FromProto(h.rref());
  if (h.has_autograd()) m.autograd = FromProto(h.autograd());
  ASSIGN_OR_RETURN(
      m.payload,
      DecodePayload(parts, h.has_same_host() ? &h.same_host() : nullptr,
                    Value::None(), limits, link));
  return Result<Message>(std::move(m));
}

}  // namespace ferry::rpc::grpc_agent
