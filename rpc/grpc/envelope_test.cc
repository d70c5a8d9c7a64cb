#include "ferry/rpc/grpc/envelope.h"

#include <grpcpp/support/byte_buffer.h>

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "ferry/common/proto_wire.h"
#include "gtest/gtest.h"

namespace ferry::rpc {
namespace {

std::string Tag(int field, int wire_type) {
  std::string out;
  AppendVarint(&out, (static_cast<uint64_t>(field) << 3) | wire_type);
  return out;
}

std::string BytesField(int field, absl::string_view bytes) {
  std::string out = Tag(field, 2);
  AppendVarint(&out, bytes.size());
  out.append(bytes.data(), bytes.size());
  return out;
}

std::string VarintField(int field, uint64_t v) {
  std::string out = Tag(field, 0);
  AppendVarint(&out, v);
  return out;
}

// Header fields of every wire type (a 2-byte tag, a 10-byte varint), the
// payload between them, and more fields after.
struct Sample {
  explicit Sample(size_t payload_bytes) : payload(payload_bytes, 'p') {}
  std::string before = VarintField(1, 7) + BytesField(2, "a function name") +
                       VarintField(3, ~uint64_t{0}) + Tag(4, 1) +
                       std::string(8, '\x11') + Tag(5, 5) +
                       std::string(4, '\x22') + BytesField(1000, "far");
  std::string payload;
  std::string after = BytesField(6, "after the payload") + VarintField(7, 300);
  std::string bytes = before + BytesField(kPayloadField, payload) + after;
};

std::string Joined(absl::Span<const WireChunk> chunks) {
  std::string out;
  for (const WireChunk& c : chunks) out.append(c.data, c.size);
  return out;
}

// Whether `chunks` hold `bytes`, compared in place (no 2 MiB copy per case).
bool SameBytes(absl::Span<const WireChunk> chunks, absl::string_view bytes) {
  size_t at = 0;
  for (const WireChunk& c : chunks) {
    if (bytes.substr(at, c.size) != absl::string_view(c.data, c.size)) {
      return false;
    }
    at += c.size;
  }
  return at == bytes.size();
}

// `bytes` cut at `cuts` into chunks, as a received buffer's (gRPC merges
// small slices of a ByteBuffer, so chunks are built here to reach the reader
// with every cut and empty chunk).
std::vector<WireChunk> Cut(absl::string_view bytes, std::vector<size_t> cuts) {
  cuts.push_back(bytes.size());
  std::vector<WireChunk> chunks;
  size_t from = 0;
  for (size_t cut : cuts) {
    chunks.push_back(WireChunk{bytes.data() + from, cut - from, nullptr});
    from = cut;
  }
  return chunks;
}

void ExpectSplitsTo(const std::vector<WireChunk>& chunks, const Sample& s,
                    const std::string& how) {
  absl::StatusOr<EnvelopeParts> parts = SplitEnvelope(chunks);
  ASSERT_TRUE(parts.ok()) << how << ": " << parts.status();
  EXPECT_EQ(parts->header, s.before + s.after) << how;
  EXPECT_TRUE(SameBytes(parts->payload, s.payload)) << how;
  EXPECT_EQ(parts->payload_bytes, s.payload.size()) << how;
  EXPECT_EQ(parts->total_bytes, s.bytes.size()) << how;
}

TEST(Envelope, EverySlicingSplitsAlike) {
  // A payload whose length is a 4-byte varint.
  const Sample s((size_t{1} << 21) + 3);
  ExpectSplitsTo(Cut(s.bytes, {}), s, "one slice");
  // Every cut in the fields and the payload's first and last bytes (every
  // varint split between chunks), and, with a small payload, every pair of
  // cuts in the first 40 bytes, empty chunks included.
  const size_t payload_at = s.bytes.size() - s.after.size() - s.payload.size();
  std::vector<size_t> cuts;
  for (size_t a = 0; a <= s.bytes.size(); ++a) {
    if (a == payload_at + 8) a = s.bytes.size() - s.after.size() - 8;
    cuts.push_back(a);
  }
  for (size_t a : cuts) {
    ExpectSplitsTo(Cut(s.bytes, {a}), s, "cut at " + std::to_string(a));
  }
  const Sample small(300);
  for (size_t a = 0; a <= 40; ++a) {
    for (size_t b = a; b <= 40; ++b) {
      ExpectSplitsTo(Cut(small.bytes, {a, b}), small,
                     "cuts at " + std::to_string(a) + ", " + std::to_string(b));
    }
  }
}

TEST(Envelope, EncodedEnvelopeSplitsBackIntoItsParts) {
  const std::string header = VarintField(1, 3) + BytesField(2, "f");
  EncodedValue payload;
  payload.head = "wire head";
  grpc::ByteBuffer buffer = EncodeEnvelope(header, std::move(payload));
  absl::StatusOr<EnvelopeParts> parts = SplitEnvelope(buffer);
  ASSERT_TRUE(parts.ok()) << parts.status();
  EXPECT_EQ(parts->header, header);
  EXPECT_EQ(Joined(parts->payload), "wire head");
}

absl::Status SplitError(absl::string_view bytes,
                        const std::vector<size_t>& cuts = {},
                        size_t max_header_bytes = 1 << 20) {
  return SplitEnvelope(Cut(bytes, cuts), max_header_bytes).status();
}

// `bytes` fails with InvalidArgument containing `want` wherever it is cut.
void ExpectErrorAtEveryCut(const std::string& bytes, const std::string& want) {
  for (size_t cut = 0; cut <= bytes.size(); ++cut) {
    absl::Status s = SplitError(bytes, {cut});
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << cut;
    EXPECT_NE(s.message().find(want), std::string::npos) << cut << ": " << s;
  }
}

TEST(Envelope, MalformedVarintsAreNamedWhereverTheyAreCut) {
  ExpectErrorAtEveryCut(std::string(11, '\x80'),
                        "longer than 10 bytes (field tag)");
  ExpectErrorAtEveryCut(Tag(2, 2) + "\x80\x80",
                        "truncated varint (field length) at byte 3");
}

TEST(Envelope, BadFieldsAreInvalidArgument) {
  struct Case {
    std::string bytes;
    std::string error;
  };
  const std::string payload = BytesField(kPayloadField, "x");
  const Case cases[] = {
      {Tag(0, 0) + "\x01", "field number 0"},
      {Tag(3, 3), "unsupported wire type 3"},
      {payload + payload, "payload field appears twice"},
      {Tag(4, 1) + "1234567", "1 bytes missing after byte 8"},
      {BytesField(2, "abc").substr(0, 4), "1 bytes missing after byte 4"},
  };
  for (const Case& c : cases) {
    absl::Status s = SplitError(c.bytes);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.error;
    EXPECT_NE(s.message().find(c.error), std::string::npos)
        << "want '" << c.error << "', got " << s;
  }
}

TEST(Envelope, HeaderLimitCountsEveryFieldButThePayload) {
  // 3 fields of 10 bytes each around a large payload: 30 header bytes.
  const std::string field = BytesField(2, std::string(8, 'h'));
  const std::string bytes =
      field + field + BytesField(kPayloadField, std::string(100, 'p')) + field;
  EXPECT_TRUE(SplitError(bytes, {}, 30).ok());
  absl::Status s = SplitError(bytes, {15}, 29);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("header fields exceed the limit of 29 bytes"),
            std::string::npos)
      << s;
  // One field alone over the limit is refused before it is read.
  s = SplitError(field, {}, 7);
  EXPECT_NE(s.message().find("field 2 is 8 bytes, over the limit of 7"),
            std::string::npos)
      << s;
}

}  // namespace
}  // namespace ferry::rpc
