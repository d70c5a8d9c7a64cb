#include "ferry/store/tcp_store_protocol.h"

#include <string>

#include "gtest/gtest.h"

namespace ferry {
namespace tcpstore {
namespace {

using Result = FrameParser::Result;

std::string Validate() {
  std::string f;
  PutU8(&f, 0);
  PutU32(&f, kValidationMagic);
  return f;
}

std::string Set(Generation g, const std::string& k, const std::string& v) {
  std::string f;
  PutU8(&f, *WireCode(g, Op::kSet));
  PutBytes(&f, k);
  PutBytes(&f, v);
  return f;
}

TEST(WireCodeTest, BothGenerationsRoundTrip) {
  EXPECT_EQ(*WireCode(Generation::kCurrent, Op::kValidate), 0);
  EXPECT_EQ(*WireCode(Generation::kCurrent, Op::kSet), 1);
  EXPECT_EQ(*WireCode(Generation::kCurrent, Op::kPing), 13);
  EXPECT_EQ(*WireCode(Generation::kCurrent, Op::kQueueLen), 16);
  EXPECT_EQ(*WireCode(Generation::kLegacy, Op::kSet), 0);
  EXPECT_EQ(*WireCode(Generation::kLegacy, Op::kAdd), 3);
  EXPECT_EQ(*WireCode(Generation::kLegacy, Op::kWait), 5);
  EXPECT_EQ(*WireCode(Generation::kLegacy, Op::kWatchKey), 7);
  EXPECT_EQ(*WireCode(Generation::kLegacy, Op::kDeleteKey), 8);
  EXPECT_FALSE(WireCode(Generation::kLegacy, Op::kQueuePush).has_value());
  EXPECT_FALSE(WireCode(Generation::kLegacy, Op::kValidate).has_value());
  for (int c = 0; c < 256; ++c) {
    for (Generation g : {Generation::kCurrent, Generation::kLegacy}) {
      std::optional<Op> op = OpFromWire(g, static_cast<uint8_t>(c));
      if (op) {
        EXPECT_EQ(*WireCode(g, *op), c);
      }
    }
  }
}

TEST(FrameParserTest, CurrentHandshakeThenFrames) {
  FrameParser p{Limits{}};
  std::string data = Validate() + Set(Generation::kCurrent, "/k", "v");
  Request r;
  size_t n = 0;
  ASSERT_EQ(p.Parse(data, &r, &n), Result::kFrame);
  EXPECT_EQ(p.generation(), Generation::kCurrent);
  EXPECT_EQ(r.op, Op::kValidate);
  EXPECT_EQ(n, 5u);
  ASSERT_EQ(p.Parse(absl::string_view(data).substr(n), &r, &n), Result::kFrame);
  EXPECT_EQ(r.op, Op::kSet);
  EXPECT_EQ(r.keys[0], "/k");
  EXPECT_EQ(r.values[0], "v");
}

TEST(FrameParserTest, LegacyDetectedFromNonZeroFirstByte) {
  FrameParser p{Limits{}};
  std::string f;
  PutU8(&f, 3);  // legacy ADD
  PutBytes(&f, "init/");
  PutU64(&f, 1);
  Request r;
  size_t n = 0;
  ASSERT_EQ(p.Parse(f, &r, &n), Result::kFrame);
  EXPECT_EQ(p.generation(), Generation::kLegacy);
  EXPECT_EQ(r.op, Op::kAdd);
  EXPECT_EQ(r.keys[0], "init/");
  EXPECT_EQ(r.delta, 1);
  EXPECT_EQ(n, f.size());
}

TEST(FrameParserTest, LegacySetAsFirstFrame) {
  FrameParser p{Limits{}};
  std::string f = Set(Generation::kLegacy, "/a", "b");
  Request r;
  size_t n = 0;
  ASSERT_EQ(p.Parse(f, &r, &n), Result::kFrame);
  EXPECT_EQ(p.generation(), Generation::kLegacy);
  EXPECT_EQ(r.op, Op::kSet);
  EXPECT_EQ(r.values[0], "b");
}

TEST(FrameParserTest, EveryPrefixNeedsMoreThenCompletes) {
  std::string f = Validate();
  std::string body;
  PutU8(&body, *WireCode(Generation::kCurrent, Op::kCompareSet));
  PutBytes(&body, "/key");
  PutBytes(&body, "old");
  PutBytes(&body, "new");
  f += body;
  FrameParser p{Limits{}};
  Request r;
  size_t n = 0;
  ASSERT_EQ(p.Parse(f, &r, &n), Result::kFrame);
  for (size_t len = 0; len < body.size(); ++len) {
    EXPECT_EQ(p.Parse(absl::string_view(body).substr(0, len), &r, &n),
              Result::kNeedMore)
        << len;
    EXPECT_EQ(n, 0u);
  }
  ASSERT_EQ(p.Parse(body, &r, &n), Result::kFrame);
  EXPECT_EQ(r.values[1], "new");
}

TEST(FrameParserTest, HugeLengthPrefixFailsAtOnce) {
  FrameParser p{Limits{}};
  std::string f = Validate();
  Request r;
  size_t n;
  ASSERT_EQ(p.Parse(f, &r, &n), Result::kFrame);
  std::string g;
  PutU8(&g, *WireCode(Generation::kCurrent, Op::kGet));
  PutU64(&g, uint64_t{1} << 63);
  EXPECT_EQ(p.Parse(g, &r, &n), Result::kError);
  EXPECT_NE(p.error().message().find("exceeds the limit"), std::string::npos)
      << p.error();
}

TEST(FrameParserTest, WrongMagicIsRejected) {
  FrameParser p{Limits{}};
  std::string f;
  PutU8(&f, 0);
  PutU32(&f, 0xDEADBEEF);
  PutU32(&f, 0x12345678);
  Request r;
  size_t n;
  EXPECT_EQ(p.Parse(f, &r, &n), Result::kError);
  EXPECT_NE(p.error().message().find("magic"), std::string::npos) << p.error();
}

TEST(FrameParserTest, UnknownTypeAndLimits) {
  Limits l;
  l.max_key_bytes = 4;
  l.max_value_bytes = 4;
  l.max_keys_per_request = 2;
  {
    FrameParser p{l};
    std::string f = Validate();
    PutU8(&f, 200);
    Request r;
    size_t n;
    ASSERT_EQ(p.Parse(f, &r, &n), Result::kFrame);
    EXPECT_EQ(p.Parse(absl::string_view(f).substr(n), &r, &n), Result::kError);
    EXPECT_NE(p.error().message().find("unknown query type 200"),
              std::string::npos);
  }
  {
    FrameParser p{l};
    std::string f = Validate() + Set(Generation::kCurrent, "/abcd", "v");
    Request r;
    size_t n;
    ASSERT_EQ(p.Parse(f, &r, &n), Result::kFrame);
    EXPECT_EQ(p.Parse(absl::string_view(f).substr(n), &r, &n), Result::kError);
    EXPECT_NE(p.error().message().find("key of 5 bytes"), std::string::npos);
  }
  {
    FrameParser p{l};
    std::string f = Validate() + Set(Generation::kCurrent, "/a", "vvvvv");
    Request r;
    size_t n;
    ASSERT_EQ(p.Parse(f, &r, &n), Result::kFrame);
    EXPECT_EQ(p.Parse(absl::string_view(f).substr(n), &r, &n), Result::kError);
    EXPECT_NE(p.error().message().find("value of 5 bytes"), std::string::npos);
  }
  {
    FrameParser p{l};
    std::string f = Validate();
    PutU8(&f, *WireCode(Generation::kCurrent, Op::kWait));
    PutU64(&f, 3);
    Request r;
    size_t n;
    ASSERT_EQ(p.Parse(f, &r, &n), Result::kFrame);
    EXPECT_EQ(p.Parse(absl::string_view(f).substr(n), &r, &n), Result::kError);
    EXPECT_NE(p.error().message().find("3 keys exceed"), std::string::npos);
  }
}

TEST(FrameParserTest, FrameByteLimit) {
  Limits l;
  l.max_frame_bytes = 100;
  FrameParser p{l};
  std::string f = Validate();
  PutU8(&f, *WireCode(Generation::kCurrent, Op::kMultiSet));
  PutU64(&f, 3);
  Request r;
  size_t n;
  ASSERT_EQ(p.Parse(f, &r, &n), Result::kFrame);
  std::string rest = f.substr(n);
  for (int i = 0; i < 3; ++i) {
    PutBytes(&rest, "/k");
    PutBytes(&rest, std::string(40, 'x'));
  }
  EXPECT_EQ(p.Parse(rest, &r, &n), Result::kError);
  EXPECT_NE(p.error().message().find("frame exceeds"), std::string::npos);
}

}  // namespace
}  // namespace tcpstore
}  // namespace ferry
