// libFuzzer target: the messages of a Worker/CallStream call as they arrive
// from the network, put back together by the StreamReceiver the agent's
// reactors use (stream_pieces.h) and decoded the way the agent does it: a
// request on the server side (DecodeRequest), a reply on the client side
// (DecodeReplyParts).
//
// Input: one byte of settings (side, limits, piece size for re-sending), one
// byte that places slice cuts, then the messages, each as a 2-byte
// little-endian length and that many bytes (the last one may be short).
//
// Checks, for any input:
//  * errors are InvalidArgument, or ResourceExhausted naming the payload
//    when the declared length is over a limit; never a crash;
//  * nothing is allocated before the header passed the size check and the
//    admission hook, at most once, exactly the declared length, never over
//    max_message_bytes or WireLimits::max_total_bytes;
//  * a complete envelope holds the first message's fields and exactly the
//    payload bytes the messages carried, in order; the receive counters
//    match; a message after the end is refused;
//  * the outcome does not depend on how gRPC sliced each message;
//  * what decodes, sent again through PieceWriter (any piece size), comes
//    back complete at its last message and decodes to the same message.
#include <grpcpp/support/byte_buffer.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "ferry/proto/rpc.pb.h"
#include "ferry/rpc/grpc/codec.h"
#include "ferry/rpc/grpc/envelope.h"
#include "ferry/rpc/grpc/fuzz_support.h"
#include "ferry/rpc/grpc/stream_pieces.h"
#include "ferry/tensor/storage.h"
#include "ferry/tensor/wire.h"

namespace ferry::rpc::grpc_agent {
namespace {

namespace v1 = ::ferry::rpc::v1;

[[noreturn]] void Fail(const std::string& what,
                       const absl::Status& status = absl::OkStatus()) {
  FuzzFail("stream_fuzz", what, status);
}

constexpr char kLabel[] = "worker 'fuzz': the streamed payload";
const absl::Time kReceivedAt = absl::FromUnixSeconds(1'700'000'000);

struct Setup {
  bool reply = false;  // The client's side; else the server's.
  WireLimits limits;
  int max_message_bytes = -1;
  size_t resend_piece_bytes = 1;
};

Setup ParseSetup(uint8_t b) {
  Setup s;
  s.reply = (b & 1) != 0;
  s.limits.max_metadata_bytes = uint64_t{1} << 16;
  switch ((b >> 1) & 3) {
    case 0:
      s.limits.max_total_bytes = uint64_t{1} << 20;
      break;
    case 1:
      s.limits.max_total_bytes = uint64_t{1} << 16;
      s.max_message_bytes = 4096;
      break;
    case 2:
      s.limits.max_total_bytes = 64;
      s.max_message_bytes = 1 << 20;
      break;
    default:
      s.limits.max_total_bytes = uint64_t{1} << 24;
      s.max_message_bytes = 1 << 18;
      break;
  }
  s.resend_piece_bytes = 1 + (b >> 3) * 13;
  return s;
}

uint64_t Limit(const Setup& s) {
  uint64_t limit = s.limits.max_total_bytes;
  if (s.max_message_bytes >= 0) {
    limit = std::min<uint64_t>(limit, s.max_message_bytes);
  }
  return limit;
}

// Fails the target on an allocation the receiver must not make.
class CheckingAllocator final : public Allocator {
 public:
  Device device() const override { return Device::CPU(); }
  absl::StatusOr<Storage> Allocate(size_t n) override {
    if (!admitted) Fail("allocated before the header was admitted");
    if (++count > 1) Fail("allocated twice for one stream");
    if (n > limit) Fail("allocated over the limit");
    if (n != declared) Fail("allocated other than the declared length");
    return GetCpuAllocator()->Allocate(n);
  }
  bool admitted = false;
  int count = 0;
  uint64_t limit = 0;
  uint64_t declared = 0;
};

struct Outcome {
  absl::Status status;
  bool complete = false;
  size_t used = 0;  // Messages taken, including a refused one.
  EnvelopeParts parts;
};

std::string Payload(const EnvelopeParts& parts) {
  std::string out;
  for (const WireChunk& c : parts.payload) out.append(c.data, c.size);
  return out;
}

// Feeds `messages` (each cut at `cuts[i]` when given) to a receiver until it
// fails or the messages run out.
template <typename Header>
Outcome Receive(const std::vector<std::string>& messages,
                const std::vector<size_t>& cuts, const Setup& setup) {
  StreamOptions options;
  StreamStats stats;
  std::atomic<uint64_t> streamed{0};
  CheckingAllocator allocator;
  allocator.limit = Limit(setup);
  WireLimits limits = setup.limits;
  limits.allocator = &allocator;
  StreamReceiver<Header> receiver(
      {&options, &limits, setup.max_message_bytes, &stats, &streamed},
      [](const Header&) { return std::string(kLabel); },
      [&](const Header& h) {
        if (allocator.admitted) Fail("admitted twice");
        if (h.payload_bytes() > allocator.limit) Fail("admitted over a limit");
        allocator.admitted = true;
        allocator.declared = h.payload_bytes();
        return absl::OkStatus();
      });
  Outcome out;
  std::string expected_payload;
  for (const std::string& m : messages) {
    ++out.used;
    // One slice, or two cut where the input says.
    absl::StatusOr<bool> r = receiver.Receive(
        cuts.empty() ? SlicedBuffer(m) : SlicedBuffer(m, {cuts[out.used - 1]}));
    if (!r.ok()) {
      out.status = r.status();
      break;
    }
    // The message's payload, split independently of the receiver.
    absl::StatusOr<EnvelopeParts> alone = SplitEnvelope(SlicedBuffer(m));
    if (!alone.ok()) Fail("the receiver took a message that does not split");
    expected_payload += Payload(*alone);
    if (*r) {
      out.complete = true;
      break;
    }
  }
  if (!out.status.ok()) {
    const absl::StatusCode code = out.status.code();
    if (code == absl::StatusCode::kResourceExhausted) {
      if (!receiver.started() ||
          receiver.header().payload_bytes() <= allocator.limit ||
          !absl::StrContains(out.status.message(), kLabel)) {
        Fail("ResourceExhausted without a declared length over a limit",
             out.status);
      }
    } else if (code != absl::StatusCode::kInvalidArgument) {
      Fail("unexpected error code", out.status);
    }
    return out;
  }
  const uint64_t declared =
      receiver.started() ? receiver.header().payload_bytes() : 0;
  if (!out.complete) {
    if (receiver.complete()) Fail("complete() without Receive saying so");
    if (declared != 0 && receiver.received() >= receiver.total()) {
      Fail("an incomplete stream has all its bytes");
    }
    return out;
  }
  out.parts = receiver.Take();
  const std::string payload = Payload(out.parts);
  if (payload != expected_payload) Fail("the payload is not what was sent");
  if (out.parts.payload_bytes != payload.size()) Fail("payload_bytes is off");
  if (declared != 0) {
    if (payload.size() != declared) Fail("complete short of the declared size");
    if (out.parts.payload.size() != 1) Fail("not one reassembled buffer");
    if (stats.bytes_received.load() != declared || streamed.load() != 1) {
      Fail("receive counters disagree with the stream");
    }
  } else if (stats.bytes_received.load() != 0 || allocator.count != 0) {
    Fail("a one-message envelope was copied");
  }
  Header fields;
  if (!fields.ParseFromString(out.parts.header) ||
      fields.payload_bytes() != declared) {
    Fail("the envelope's fields are not the first message's");
  }
  if (receiver.Receive(SlicedBuffer("")).status().code() !=
      absl::StatusCode::kInvalidArgument) {
    Fail("a message after the end was taken");
  }
  return out;
}

// The envelope decoded (as the agent decodes it) and encoded again in parts.
absl::StatusOr<EncodedParts> DecodeAndEncode(const EnvelopeParts& parts,
                                             const Setup& setup) {
  if (setup.reply) {
    uint64_t bytes = 0;
    absl::StatusOr<Result<Message>> r =
        DecodeReplyParts(parts, setup.limits, &bytes);
    if (!r.ok()) return r.status();
    return EncodeReplyParts(*r, setup.limits);
  }
  ReceivedRequest received;
  if (!received.header.ParseFromString(parts.header)) {
    Fail("a complete request's fields do not parse");
  }
  received.parts = parts;
  absl::StatusOr<Message> m =
      DecodeRequest(received, kReceivedAt, setup.limits);
  if (!m.ok()) return m.status();
  return EncodeRequestParts(*m, kReceivedAt, setup.limits);
}

std::string Bytes(EncodedParts parts) {
  return FlattenBuffer(ToEnvelope(std::move(parts)).buffer);
}

template <typename Header>
void Check(const std::vector<std::string>& messages,
           const std::vector<size_t>& cuts, const Setup& setup) {
  Outcome whole = Receive<Header>(messages, {}, setup);
  Outcome sliced = Receive<Header>(messages, cuts, setup);
  if (whole.status != sliced.status || whole.complete != sliced.complete ||
      whole.used != sliced.used ||
      Payload(whole.parts) != Payload(sliced.parts)) {
    Fail("slicing changed the outcome", whole.status);
  }
  if (!whole.complete) return;
  absl::StatusOr<EncodedParts> again = DecodeAndEncode(whole.parts, setup);
  if (!again.ok()) {
    if (again.status().code() != absl::StatusCode::kInvalidArgument) {
      Fail("decoding: unexpected error code", again.status());
    }
    return;
  }
  // Sent again in pieces, it comes back whole, at its last message.
  const std::string expected = Bytes(*DecodeAndEncode(whole.parts, setup));
  PieceWriter writer(*std::move(again), setup.resend_piece_bytes);
  std::vector<std::string> resent;
  grpc::ByteBuffer message;
  uint64_t bytes = 0;
  while (writer.Next(&message, &bytes)) {
    resent.push_back(FlattenBuffer(message));
  }
  Outcome back = Receive<Header>(resent, {}, setup);
  if (back.status.code() == absl::StatusCode::kResourceExhausted) return;
  if (!back.status.ok() || !back.complete || back.used != resent.size()) {
    Fail("a re-sent envelope did not come back whole", back.status);
  }
  absl::StatusOr<EncodedParts> round = DecodeAndEncode(back.parts, setup);
  if (!round.ok()) Fail("a re-sent envelope does not decode", round.status());
  if (Bytes(*std::move(round)) != expected) {
    Fail("re-sending changed the message");
  }
}

// One input (the format is at the top of this file).
void FuzzOne(const uint8_t* data, size_t size) {
  if (size < 2) return;
  const Setup setup = ParseSetup(data[0]);
  const uint8_t cut_seed = data[1];
  std::vector<std::string> messages;
  std::vector<size_t> cuts;
  for (size_t at = 2; at < size && messages.size() < 64;) {
    size_t n = data[at];
    if (at + 1 < size) n |= size_t{data[at + 1]} << 8;
    at = std::min(size, at + 2);
    n = std::min(n, size - at);
    messages.emplace_back(reinterpret_cast<const char*>(data + at), n);
    cuts.push_back(n == 0 ? 0 : (cut_seed * 7919u + messages.size()) % (n + 1));
    at += n;
  }
  if (setup.reply) {
    Check<v1::RpcResponse>(messages, cuts, setup);
  } else {
    Check<v1::RpcRequest>(messages, cuts, setup);
  }
}

}  // namespace
}  // namespace ferry::rpc::grpc_agent

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ferry::rpc::grpc_agent::QuietProtobufLogs();
  ferry::rpc::grpc_agent::FuzzOne(data, size);
  return 0;
}
