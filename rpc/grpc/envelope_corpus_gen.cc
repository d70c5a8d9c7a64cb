// Writes the seed corpus for envelope_fuzz: requests and replies as the agent
// encodes them, and hostile variants of their framing.
// Usage: bazel run //rpc/grpc:envelope_corpus_gen --
// $PWD/rpc/grpc/testdata/envelope_corpus
#include <string>
#include <utility>
#include <vector>

#include "ferry/rpc/grpc/codec.h"
#include "ferry/rpc/grpc/fuzz_support.h"
#include "ferry/tensor/tensor.h"
#include "ferry/tools/fuzz/corpus_writer.h"

namespace ferry::rpc::grpc_agent {
namespace {

std::string Request(const Message& m) {
  const absl::Time now = absl::FromUnixSeconds(1'700'000'000);
  return FlattenBuffer(EncodeRequest(m, now, WireLimits{})->buffer);
}

std::string Reply(const Result<Message>& r) {
  return FlattenBuffer(EncodeReply(r, WireLimits{})->buffer);
}

Message FullRequest() {
  Message m;
  m.type = MessageType::kCall;
  m.id = GlobalId(3, 77);
  m.function = "add";
  m.caller_name = "trainer0";
  m.caller_id = 3;
  m.deadline = absl::FromUnixSeconds(1'700'000'002);
  m.context = {{"trace", "abc"}, {"k", std::string("v\0w", 3)}};
  m.SetHeader(1, std::string("\x08\x01\x12\x00", 4));
  m.SetHeader(3, "opaque");
  m.payload = Value::FromList({Value::FromTensor(full({2, 3}, 2.0)),
                               Value::Int(7), Value::String("s")});
  return m;
}

// A varint-encoded protobuf tag or length.
std::string Varint(uint64_t v) {
  std::string out;
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
  return out;
}

std::string Tag(int field, int wire_type) {
  return Varint((uint64_t(field) << 3) | wire_type);
}

fuzz::CorpusFiles Files() {
  fuzz::CorpusFiles files;
  const std::string full_request = Request(FullRequest());
  files.emplace_back("request_full", full_request);
  Message minimal;
  minimal.type = MessageType::kPing;
  files.emplace_back("request_ping", Request(minimal));
  Message rref = FullRequest();
  rref.type = static_cast<MessageType>(12);  // RREF_FORK_REQUEST (rref/).
  rref.payload = Value::None();
  rref.ClearHeader(3);
  files.emplace_back("request_rref", Request(rref));
  Message layer = FullRequest();
  layer.type = static_cast<MessageType>(1003);
  files.emplace_back("request_layer_type", Request(layer));

  // A layer header as a layer writes it: autograd's (layer 2,
  // proto/dist_autograd.proto), encoded by hand since rpc/ does not know
  // it: context; fields with grad-tensor indices; carried releases; a
  // fused step.
  const std::string fields = Tag(1, 0) + Varint(GlobalId(3, 5).value()) +
                             Tag(2, 0) + Varint(GlobalId(3, 9).value()) +
                             Tag(4, 2) + Varint(2) + Varint(0) + Varint(2);
  const std::string context = Tag(1, 0) + Varint(GlobalId(3, 5).value());
  const std::string released = Varint(GlobalId(3, 4).value());
  const std::string releases = Tag(1, 0) + Varint(3) + Tag(2, 0) + Varint(1) +
                               Tag(3, 2) + Varint(released.size()) + released;
  const std::string fused = Tag(1, 0) + Varint(1) + Tag(2, 0) + Varint(4);
  const std::string autograd =
      Tag(1, 2) + Varint(context.size()) + context + Tag(2, 2) +
      Varint(fields.size()) + fields + Tag(3, 2) + Varint(releases.size()) +
      releases + Tag(4, 2) + Varint(fused.size()) + fused;
  Message with_autograd = FullRequest();
  with_autograd.ClearHeader(1);
  with_autograd.ClearHeader(3);
  with_autograd.SetHeader(2, autograd);
  files.emplace_back("request_autograd_header", Request(with_autograd));

  // The device layer's header (layer 3, proto/device_rpc.proto) as
  // worker/device_stage writes it: a request's staged tensors with source
  // and target device; a reply's with the source only. Encoded by hand:
  // rpc/ does not know it (its decoder's own corpus: worker/testdata).
  const std::string to_cuda1 = Tag(1, 0) + Varint(0) + Tag(2, 0) + Varint(0) +
                               Tag(3, 0) + Varint(1);
  Message with_device = FullRequest();
  with_device.ClearHeader(1);
  with_device.SetHeader(3, Tag(1, 2) + Varint(to_cuda1.size()) + to_cuda1);
  files.emplace_back("request_device_header", Request(with_device));
  const std::string from_cuda2 = Tag(1, 0) + Varint(0) + Tag(2, 0) + Varint(2);
  Message device_reply;
  device_reply.type = MessageType::kCall;
  device_reply.SetHeader(3,
                         Tag(1, 2) + Varint(from_cuda2.size()) + from_cuda2);
  device_reply.payload = Value::FromTensor(arange(16, DType::kFloat32));
  files.emplace_back("reply_device_header",
                     Reply(Result<Message>(device_reply)));

  Message reply;
  reply.type = MessageType::kCall;
  reply.SetHeader(2, "h");
  reply.payload = Value::FromTensor(arange(8, DType::kFloat32));
  files.emplace_back("reply_tensor", Reply(Result<Message>(reply)));
  Message autograd_reply;  // A reply's tensors that required grad.
  autograd_reply.type = MessageType::kCall;
  autograd_reply.SetHeader(2, Tag(2, 2) + Varint(fields.size()) + fields);
  autograd_reply.payload = Value::FromList(
      {Value::FromTensor(arange(4, DType::kFloat32)), Value::Int(1),
       Value::FromTensor(arange(2, DType::kFloat32))});
  files.emplace_back("reply_autograd_header",
                     Reply(Result<Message>(autograd_reply)));
  files.emplace_back("reply_error",
                     Reply(Result<Message>(absl::NotFoundError(
                         "worker 'w1' has no function 'nope'"))));

  // Hostile framing around an otherwise valid request.
  files.emplace_back("hostile_truncated",
                     full_request.substr(0, full_request.size() - 9));
  files.emplace_back("hostile_payload_twice",
                     full_request + Tag(15, 2) + Varint(0));
  files.emplace_back("hostile_group", Tag(2, 3) + Tag(2, 4));
  files.emplace_back("hostile_field_zero", Tag(0, 0) + Varint(1));
  files.emplace_back("hostile_long_varint", std::string(11, '\xff'));
  files.emplace_back("hostile_huge_header_field",
                     Tag(2, 2) + Varint(uint64_t{1} << 40) + "x");
  files.emplace_back("hostile_huge_payload",
                     Tag(15, 2) + Varint(~uint64_t{0} >> 1) + "FRY1");
  files.emplace_back(
      "hostile_payload_garbage",
      Tag(1, 0) + Varint(1) + Tag(15, 2) + Varint(8) + "FRY1\xff\xff\xff\x7f");
  files.emplace_back("hostile_bad_utf8_function",
                     Tag(2, 2) + Varint(2) + "\xc3\x28");
  files.emplace_back(
      "hostile_negative_type",
      Tag(1, 0) + Varint(~uint64_t{0}) + Tag(6, 0) + Varint(~uint64_t{0} >> 1));
  // Layer headers no sender writes: layer 0; layers out of order.
  const std::string layer0 = Tag(1, 0) + Varint(0) + Tag(2, 2) + Varint(1) + "x";
  files.emplace_back("hostile_layer_header_zero",
                     Tag(1, 0) + Varint(1) + Tag(10, 2) +
                         Varint(layer0.size()) + layer0);
  const std::string layer5 = Tag(1, 0) + Varint(5);
  const std::string layer3 = Tag(1, 0) + Varint(3);
  files.emplace_back("hostile_layer_headers_unordered",
                     Tag(1, 0) + Varint(1) + Tag(10, 2) +
                         Varint(layer5.size()) + layer5 + Tag(10, 2) +
                         Varint(layer3.size()) + layer3);
  files.emplace_back("hostile_layer_header_truncated",
                     Tag(1, 0) + Varint(1) + Tag(10, 2) + Varint(9) + layer5);
  return files;
}

}  // namespace
}  // namespace ferry::rpc::grpc_agent

int main(int argc, char** argv) {
  return ferry::fuzz::CorpusMain(argc, argv, ferry::rpc::grpc_agent::Files);
}
