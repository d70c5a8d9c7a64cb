#include "ferry/rpc/layer.h"

#include "gtest/gtest.h"
#include "ferry/rpc/message.h"

namespace ferry::rpc {
namespace {

// Numbers no other test or layer in this binary claims.
LayerClaim Alpha() {
  return LayerClaim{"test.alpha",
                    901,
                    {{5000, 5009}, {5020, 5020}},
                    {{5000, "ALPHA_GET"}, {5020, "ALPHA_RUN", true}}};
}

TEST(LayerClaims, NamesTheirTypesAndAreIdempotent) {
  ASSERT_TRUE(ClaimLayer(Alpha()).ok());
  EXPECT_TRUE(ClaimLayer(Alpha()).ok()) << "the same claim again";
  EXPECT_EQ(MessageTypeName(static_cast<MessageType>(5000)), "ALPHA_GET");
  EXPECT_EQ(MessageTypeName(static_cast<MessageType>(5001)), "TYPE_5001");
  EXPECT_EQ(LayerOfType(5009), "test.alpha");
  EXPECT_EQ(LayerOfType(5010), std::nullopt);
  EXPECT_EQ(LayerOfType(1), "rpc");
  EXPECT_EQ(LayerOfHeader(901), "test.alpha");
  EXPECT_EQ(LayerOfHeader(902), std::nullopt);
  Message run;
  run.type = static_cast<MessageType>(5020);
  run.function = "step";
  EXPECT_EQ(DescribeTarget("b", run), "worker 'b' function 'step'");
  Message get;
  get.type = static_cast<MessageType>(5000);
  EXPECT_EQ(DescribeTarget("b", get), "worker 'b' message ALPHA_GET");
}

TEST(LayerClaims, OverlapsAreRefusedNamingBothLayers) {
  ASSERT_TRUE(ClaimLayer(Alpha()).ok());
  absl::Status s = ClaimLayer(LayerClaim{"test.beta", 902, {{5009, 5012}}, {}});
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists) << s;
  EXPECT_NE(s.message().find("'test.beta'"), std::string::npos) << s;
  EXPECT_NE(s.message().find("'test.alpha'"), std::string::npos) << s;
  // rpc/'s own numbers are taken.
  s = ClaimLayer(LayerClaim{"test.beta", 902, {{1, 1}}, {}});
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists) << s;
  EXPECT_NE(s.message().find("'rpc'"), std::string::npos) << s;
  // Another layer's header id.
  s = ClaimLayer(LayerClaim{"test.beta", 901, {{5100, 5100}}, {}});
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists) << s;
  // A layer that changes its claim.
  LayerClaim changed = Alpha();
  changed.ranges.push_back({5030, 5030});
  EXPECT_EQ(ClaimLayer(changed).code(), absl::StatusCode::kAlreadyExists);
  // None of the refused claims took anything.
  EXPECT_EQ(LayerOfType(5011), std::nullopt);
  EXPECT_EQ(LayerOfType(5100), std::nullopt);
  EXPECT_EQ(LayerOfType(5030), std::nullopt);
}

TEST(LayerClaims, MalformedClaimsAreInvalid) {
  EXPECT_EQ(ClaimLayer(LayerClaim{"", 0, {{6000, 6000}}, {}}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ClaimLayer(LayerClaim{"test.gamma", 0, {{6001, 6000}}, {}}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ClaimLayer(LayerClaim{"test.gamma", 0, {{6000, 6000}},
                                  {{6001, "OUTSIDE"}}})
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LayerOfType(6000), std::nullopt);
}

TEST(LayerHeaders, StayOrderedOnePerLayer) {
  Message m;
  m.SetHeader(7, "seven");
  m.SetHeader(2, "two");
  m.SetHeader(7, "SEVEN");
  ASSERT_EQ(m.headers.size(), 2u);
  EXPECT_EQ(m.headers[0], (LayerHeader{2, "two"}));
  EXPECT_EQ(m.headers[1], (LayerHeader{7, "SEVEN"}));
  ASSERT_NE(m.FindHeader(2), nullptr);
  EXPECT_EQ(*m.FindHeader(2), "two");
  EXPECT_EQ(m.FindHeader(3), nullptr);
  m.ClearHeader(2);
  m.ClearHeader(3);
  ASSERT_EQ(m.headers.size(), 1u);
  EXPECT_EQ(m.headers[0].layer, 7u);
}

}  // namespace
}  // namespace ferry::rpc
