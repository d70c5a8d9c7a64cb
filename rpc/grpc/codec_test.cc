#include "rpc/grpc/codec.h"

#include <string>

#include "gtest/gtest.h"
#include "tensor/tensor.h"

namespace ferry::rpc::grpc_agent {
namespace {

// Without RRef, autograd or context fields the header is written by hand:
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
    ferry::rpc::v1::RpcRequest expected;
    expected.set_type(static_cast<ferry::rpc::v1::MessageType>(m.type));
    expected.set_function(m.function);
    expected.set_caller_id(static_cast<uint32_t>(m.caller_id));
    expected.set_caller_name(m.caller_name);
    expected.set_request_id(m.id.value());
    if (variant != 2) expected.set_remaining_us(250'000);
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
  m.rref = RRefFields{GlobalId(1, 2), GlobalId(3, 4), -1, 0, "T"};
  m.autograd = AutogradFields{GlobalId(3, 9), GlobalId(3, 10), true};
  m.context = {{"k", std::string("v\0w", 3)}};
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
  EXPECT_EQ(d->rref, m.rref);  // Including owner_id -1.
  EXPECT_EQ(d->autograd, m.autograd);
  EXPECT_EQ(d->context, m.context);
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
  EXPECT_FALSE(d->rref.has_value());
  EXPECT_FALSE(d->autograd.has_value());
}

TEST(Codec, RepliesCarryFieldsOrTheHandlersError) {
  Message reply;
  reply.type = MessageType::kRRefFetch;
  reply.rref = RRefFields{GlobalId(2, 5), GlobalId(), 2, -1, ""};
  reply.payload = Value::Int(7);
  auto ok = EncodeReply(reply, WireLimits{});
  ASSERT_TRUE(ok.ok());
  uint64_t bytes = 0;
  auto d = DecodeReply(ok->buffer, WireLimits{}, &bytes);
  ASSERT_TRUE(d.ok() && d->ok()) << d.status();
  EXPECT_EQ((*d)->type, MessageType::kRRefFetch);
  EXPECT_EQ((*d)->rref, reply.rref);
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

}  // namespace
}  // namespace ferry::rpc::grpc_agent
