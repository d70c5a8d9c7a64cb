// Writes the seed corpus for stream_fuzz: CallStream requests and replies as
// the agent sends them (PieceWriter), and hostile streams around them.
// Usage: bazel run //rpc/grpc:stream_corpus_gen --
// $PWD/rpc/grpc/testdata/stream_corpus
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ferry/rpc/grpc/codec.h"
#include "ferry/rpc/grpc/fuzz_support.h"
#include "ferry/rpc/grpc/stream_pieces.h"
#include "ferry/tensor/tensor.h"
#include "ferry/tools/fuzz/corpus_writer.h"

namespace ferry::rpc::grpc_agent {
namespace {

// Settings byte (stream_fuzz.cc): bit 0 reply side, bits 1-2 limits
// (0: 1 MiB), bits 3-7 the piece size for re-sending.
constexpr uint8_t kRequest = 0;
constexpr uint8_t kReply = 1;
constexpr uint8_t kTinyLimits = 2 << 1;  // 64-byte wire limit.

std::string Input(uint8_t settings, const std::vector<std::string>& messages) {
  std::string out;
  out.push_back(static_cast<char>(settings));
  out.push_back(static_cast<char>(37));  // Where slices are cut.
  for (const std::string& m : messages) {
    out.push_back(static_cast<char>(m.size() & 0xff));
    out.push_back(static_cast<char>(m.size() >> 8));
    out += m;
  }
  return out;
}

std::vector<std::string> Pieces(EncodedParts parts, size_t piece_bytes) {
  PieceWriter writer(std::move(parts), piece_bytes);
  std::vector<std::string> out;
  grpc::ByteBuffer message;
  uint64_t bytes = 0;
  while (writer.Next(&message, &bytes)) out.push_back(FlattenBuffer(message));
  return out;
}

EncodedParts Request() {
  Message m;
  m.type = MessageType::kCall;
  m.id = GlobalId(3, 77);
  m.function = "echo";
  m.caller_name = "trainer0";
  m.deadline = absl::FromUnixSeconds(1'700'000'002);
  m.payload = Value::FromList(
      {Value::FromTensor(arange(0.0, 200.0, 1.0, DType::kFloat64)),
       Value::String("s"), Value::FromTensor(full({3, 5}, 2.5))});
  return *EncodeRequestParts(m, absl::FromUnixSeconds(1'700'000'000), {});
}

EncodedParts Reply() {
  Message m;
  m.type = MessageType::kCall;
  m.payload = Value::FromTensor(arange(96, DType::kInt32));
  return *EncodeReplyParts(Result<Message>(m), {});
}

// A piece message: only the payload field.
std::string Piece(const std::string& bytes) {
  std::string out;
  AppendVarint(&out, (uint64_t{kPayloadField} << 3) | 2);
  AppendVarint(&out, bytes.size());
  return out + bytes;
}

// First message fields declaring `declared` payload bytes.
std::string Declares(uint64_t declared) {
  std::string out;
  AppendVarint(&out, (uint64_t{14} << 3) | 0);
  AppendVarint(&out, declared);
  return out;
}

fuzz::CorpusFiles Files() {
  fuzz::CorpusFiles files;
  const std::vector<std::string> request = Pieces(Request(), 256);
  files.emplace_back("request_pieces", Input(kRequest, request));
  files.emplace_back("request_one_piece",
                     Input(kRequest | (7 << 3), Pieces(Request(), 1 << 20)));
  files.emplace_back("reply_pieces", Input(kReply, Pieces(Reply(), 100)));
  files.emplace_back(
      "reply_error",
      Input(kReply,
            {FlattenBuffer(ToEnvelope(*EncodeReplyParts(
                                          Result<Message>(absl::NotFoundError(
                                              "no function 'f'")),
                                          {}))
                               .buffer)}));
  files.emplace_back("request_over_tiny_limit",
                     Input(kRequest | kTinyLimits, request));

  std::vector<std::string> truncated(request.begin(), request.end() - 1);
  files.emplace_back("hostile_truncated", Input(kRequest, truncated));
  std::vector<std::string> extra = request;
  extra.push_back(Piece("more"));
  files.emplace_back("hostile_message_after_end", Input(kRequest, extra));
  std::vector<std::string> fields_later = request;
  fields_later[1] = Declares(5) + fields_later[1];
  files.emplace_back("hostile_fields_in_a_piece",
                     Input(kRequest, fields_later));
  files.emplace_back("hostile_huge_declared",
                     Input(kReply, {Declares(uint64_t{1} << 40) + Piece("x")}));
  files.emplace_back("hostile_max_declared",
                     Input(kRequest, {Declares(~uint64_t{0}) + Piece("")}));
  files.emplace_back(
      "hostile_past_declared",
      Input(kReply, {Declares(6) + Piece("abcd"), Piece("efgh")}));
  files.emplace_back("hostile_smaller_than_first_piece",
                     Input(kRequest, {Declares(2) + Piece("abcd")}));
  // A same-host descriptor (field 13) where no channel was negotiated.
  std::string same_host;
  AppendVarint(&same_host, (uint64_t{13} << 3) | 2);
  AppendVarint(&same_host, 2);
  same_host += "\x28\x01";  // nonce = 1
  files.emplace_back("hostile_same_host_without_channel",
                     Input(kRequest, {same_host + Piece("")}));
  files.emplace_back(
      "hostile_empty_pieces",
      Input(kReply, {Declares(4), Piece(""), "", Piece("FRY1")}));
  return files;
}

}  // namespace
}  // namespace ferry::rpc::grpc_agent

int main(int argc, char** argv) {
  return ferry::fuzz::CorpusMain(argc, argv, ferry::rpc::grpc_agent::Files);
}
