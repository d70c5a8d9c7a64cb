#include "ferry/rpc/grpc/codec.h"

#include <string>

#include "gtest/gtest.h"
#include "ferry/tensor/tensor.h"

namespace ferry::rpc::grpc_agent {
namespace {

// RpcRequest fields 1-6 of `m` set through the generated code.
ferry::rpc::v1::RpcRequest ScalarFields(const Message& m,
                                        int64_t remaining_us) {
  ferry::rpc::v1::RpcRequest r;
  r.set_type(static_cast<ferry::rpc::v1::MessageType>(m.type));
  r.set_function(m.function);
  r.set_caller_id(static_cast<uint32_t>(m.caller_id));
  r.set_caller_name(m.caller_name);
  r.set_request_id(m.id.value());
  r.set_remaining_us(remaining_us);
  return r;
}

// Without layer headers or context fields the header is written by hand:
// the bytes must be what the generated code writes for the same fields.
TEST(Codec, HandWrittenRequestHeaderIsTheProtobufEncoding) {
  const absl::Time now = absl::Now();
  for (int variant = 0; variant < 4; ++variant) {
    Message m;
    m.type = variant == 0   ? MessageType::kCall
             : variant == 1 ? static_cast<MessageType>(0x80000001u)
                            : static_cast<MessageType>(1000 + variant);
    m.id = variant == 2 ? GlobalId() : GlobalId(7, 123456789);
    m.function = variant == 3 ? "" : std::string(200, 'f');
    m.caller_name = variant == 1 ? "" : "caller";
    m.caller_id = variant == 1 ? -1 : variant;
    m.deadline =
        variant == 2 ? absl::InfiniteFuture() : now + absl::Milliseconds(250);
    auto parts = EncodeRequestParts(m, now, WireLimits{});
    ASSERT_TRUE(parts.ok()) << parts.status();
    ferry::rpc::v1::RpcRequest expected =
        ScalarFields(m, variant == 2 ? 0 : 250'000);
    EXPECT_EQ(parts->header, expected.SerializeAsString()) << variant;
  }
}

// With them, fields 1-6 are still written by hand and 9-10 appended by the
// generated code: together, the bytes of the whole message.
TEST(Codec, RequestHeaderWithMessageFieldsIsTheProtobufEncoding) {
  const absl::Time now = absl::Now();
  for (int variant = 0; variant < 3; ++variant) {
    Message m;
    m.type = static_cast<MessageType>(2);  // REMOTE_CALL (rref/).
    m.id = GlobalId(7, 99);
    m.function = "f";
    m.caller_name = variant == 1 ? "" : "caller";
    m.caller_id = 2;
    m.deadline = now + absl::Milliseconds(5);
    if (variant != 1) m.SetHeader(1, std::string("\x08\x01\0", 3));
    if (variant != 2) m.SetHeader(2, "");
    if (variant != 0) m.context = {{"k", std::string("v\0w", 3)}};
    auto parts = EncodeRequestParts(m, now, WireLimits{});
    ASSERT_TRUE(parts.ok()) << parts.status();
    ferry::rpc::v1::RpcRequest expected = ScalarFields(m, 5'000);
    for (const auto& [k, v] : m.context) (*expected.mutable_context())[k] = v;
    for (const LayerHeader& h : m.headers) {
      auto* out = expected.add_headers();
      out->set_layer(h.layer);
      out->set_bytes(h.bytes);
    }
    EXPECT_EQ(parts->header, expected.SerializeAsString()) << variant;
  }
}

TEST(Codec, RequestRoundTripsEveryFieldAndSendsTheRemainingTime) {
  const absl::Time now = absl::Now();
  Message m;
  m.type = static_cast<MessageType>(1005);
  m.id = GlobalId(3, 77);
  m.function = "f";
  m.caller_name = "a";
  m.caller_id = 3;
  m.deadline = now + absl::Milliseconds(1500);
  m.context = {{"k", std::string("v\0w", 3)}};
  m.SetHeader(9, std::string("\0typed", 6));
  m.SetHeader(2, "");
  m.payload = Value::FromList({Value::FromTensor(full({3}, 2.0))});
  auto encoded = EncodeRequest(m, now, WireLimits{});
  ASSERT_TRUE(encoded.ok()) << encoded.status();
  auto split = SplitRequest(encoded->buffer);
  ASSERT_TRUE(split.ok()) << split.status();
  EXPECT_EQ(split->header.remaining_us(), 1'500'000);
  // The callee's clock: its deadline is its receive time + the remaining time.
  const absl::Time received = now + absl::Hours(1);
  auto d = DecodeRequest(*split, received, WireLimits{});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->deadline, received + absl::Milliseconds(1500));
  EXPECT_EQ(d->type, m.type);
  EXPECT_EQ(d->id, m.id);
  EXPECT_EQ(d->function, "f");
  EXPECT_EQ(d->caller_name, "a");
  EXPECT_EQ(d->caller_id, 3);
  EXPECT_EQ(d->context, m.context);
  EXPECT_EQ(d->headers, m.headers);
  EXPECT_EQ(d->payload, m.payload);
}

TEST(Codec, NoDeadlineStaysNone) {
  Message m;
  m.type = MessageType::kCall;
  auto encoded = EncodeRequest(m, absl::Now(), WireLimits{});
  ASSERT_TRUE(encoded.ok());
  auto split = SplitRequest(encoded->buffer);
  ASSERT_TRUE(split.ok());
  auto d = DecodeRequest(*split, absl::Now(), WireLimits{});
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->deadline, absl::InfiniteFuture());
  EXPECT_TRUE(d->headers.empty());
}

TEST(Codec, RepliesCarryFieldsOrTheHandlersError) {
  Message reply;
  reply.type = static_cast<MessageType>(10);  // RREF_FETCH (rref/).
  reply.SetHeader(4, "typed");
  reply.payload = Value::Int(7);
  auto ok = EncodeReply(reply, WireLimits{});
  ASSERT_TRUE(ok.ok());
  uint64_t bytes = 0;
  auto d = DecodeReply(ok->buffer, WireLimits{}, &bytes);
  ASSERT_TRUE(d.ok() && d->ok()) << d.status();
  EXPECT_EQ((*d)->type, reply.type);
  EXPECT_EQ((*d)->headers, reply.headers);
  EXPECT_EQ(*(*d)->payload.if_int(), 7);
  EXPECT_GT(bytes, 0u);

  auto err = EncodeReply(absl::AbortedError("no"), WireLimits{});
  ASSERT_TRUE(err.ok());
  auto e = DecodeReply(err->buffer, WireLimits{}, &bytes);
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->status(), absl::AbortedError("no"));
}

TEST(Codec, MalformedRepliesAreInvalidArgument) {
  const std::string bytes("\x7a\x80\x80\x80\x80\x10", 6);  // 4 GiB payload.
  grpc::Slice slice(bytes);
  grpc::ByteBuffer buffer(&slice, 1);
  uint64_t n = 0;
  auto d = DecodeReply(buffer, WireLimits{}, &n);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument)
      << d.status();
}

// Layer headers no sender writes (layer 0, repeated or unordered layers)
// are refused, naming the layer.
TEST(Codec, MalformedLayerHeadersAreInvalidArgument) {
  for (const std::vector<uint32_t>& layers :
       {std::vector<uint32_t>{0}, std::vector<uint32_t>{3, 3},
        std::vector<uint32_t>{5, 2}}) {
    ferry::rpc::v1::RpcRequest r;
    r.set_type(ferry::rpc::v1::CALL);
    for (uint32_t l : layers) r.add_headers()->set_layer(l);
    grpc::Slice slice(r.SerializeAsString());
    grpc::ByteBuffer buffer(&slice, 1);
    auto split = SplitRequest(buffer);
    ASSERT_TRUE(split.ok()) << split.status();
    auto d = DecodeRequest(*split, absl::Now(), WireLimits{});
    EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument)
        << d.status();
    EXPECT_NE(d.status().message().find("layer header"), std::string::npos)
        << d.status();

    ferry::rpc::v1::RpcResponse reply;
    for (uint32_t l : layers) reply.add_headers()->set_layer(l);
    grpc::Slice reply_slice(reply.SerializeAsString());
    grpc::ByteBuffer reply_buffer(&reply_slice, 1);
    uint64_t n = 0;
    auto dr = DecodeReply(reply_buffer, WireLimits{}, &n);
    EXPECT_EQ(dr.status().code(), absl::StatusCode::kInvalidArgument)
        << dr.status();
  }
}

}  // namespace
}  // namespace ferry::rpc::grpc_agent
