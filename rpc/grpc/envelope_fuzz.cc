// libFuzzer target: the bytes of a gRPC Worker/Call as they arrive from the
// network, decoded the way the agent does it (codec.h): SplitRequest then
// DecodeRequest on the server side, DecodeReply on the client side.
//
// Checks, for any input:
//  * malformed input is InvalidArgument, never a crash or another code;
//  * the outcome does not depend on how gRPC sliced the bytes (one slice, or
//    three split at input-derived points, empty slices included);
//  * what decodes re-encodes (EncodeRequest / EncodeReply) and decodes again
//    to the same message: every field, and the payload's wire encoding;
//  * the names the service and logs print for it (MessageTypeName,
//    DebugString) are computable.
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "ferry/rpc/grpc/codec.h"
#include "ferry/rpc/grpc/fuzz_support.h"
#include "ferry/rpc/message.h"
#include "ferry/tensor/wire.h"

namespace {

using ferry::rpc::Message;
using ferry::rpc::grpc_agent::DecodeReply;
using ferry::rpc::grpc_agent::DecodeRequest;
using ferry::rpc::grpc_agent::EncodedMessage;
using ferry::rpc::grpc_agent::EncodeReply;
using ferry::rpc::grpc_agent::EncodeRequest;
using ferry::rpc::grpc_agent::ReceivedRequest;
using ferry::rpc::grpc_agent::SplitRequest;

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "envelope_fuzz: %s\n", what.c_str());
  std::abort();
}

ferry::WireLimits Limits() {
  ferry::WireLimits limits;
  limits.max_total_bytes = uint64_t{1} << 24;
  limits.max_metadata_bytes = uint64_t{1} << 20;
  return limits;
}

// A fixed receive time, so deadlines compare exactly.
const absl::Time kReceivedAt = absl::FromUnixSeconds(1'700'000'000);

grpc::ByteBuffer Buffer(absl::string_view bytes,
                        const std::vector<size_t>& cuts) {
  return ferry::rpc::grpc_agent::SlicedBuffer(bytes, cuts);
}

std::string Flatten(const grpc::ByteBuffer& buffer) {
  // An unreadable buffer flattens to "", which then fails to decode.
  return ferry::rpc::grpc_agent::FlattenBuffer(buffer);
}

std::string PayloadBytes(const ferry::Value& v) {
  absl::StatusOr<ferry::EncodedValue> e = ferry::EncodeValue(v, Limits());
  if (!e.ok()) Fail("a decoded payload does not re-encode");
  return e->Flatten();
}

void ExpectSameMessage(const Message& a, const Message& b,
                       const std::string& what) {
  if (a.type != b.type || a.id != b.id || a.function != b.function ||
      a.caller_name != b.caller_name || a.caller_id != b.caller_id ||
      a.deadline != b.deadline || a.context != b.context ||
      a.headers != b.headers ||
      PayloadBytes(a.payload) != PayloadBytes(b.payload)) {
    Fail(what);
  }
}

void ExpectInvalidArgument(const absl::Status& s, const std::string& what) {
  if (s.code() != absl::StatusCode::kInvalidArgument) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    Fail(what);
  }
}

absl::StatusOr<Message> ServerDecode(const grpc::ByteBuffer& buffer) {
  absl::StatusOr<ReceivedRequest> split = SplitRequest(buffer);
  if (!split.ok()) return split.status();
  (void)ferry::rpc::MessageTypeName(
      static_cast<ferry::rpc::MessageType>(split->header.type()));
  absl::StatusOr<Message> m = DecodeRequest(*split, kReceivedAt, Limits());
  if (m.ok()) (void)m->DebugString();
  return m;
}

absl::StatusOr<EncodedMessage> ServerEncode(const Message& m) {
  return EncodeRequest(m, kReceivedAt, Limits());
}

using Reply = ferry::Result<Message>;

absl::StatusOr<Reply> ClientDecode(const grpc::ByteBuffer& buffer) {
  uint64_t bytes = 0;
  return DecodeReply(buffer, Limits(), &bytes);
}

absl::StatusOr<EncodedMessage> ClientEncode(const Reply& r) {
  return EncodeReply(r, Limits());
}

void ExpectSameReply(const Reply& a, const Reply& b, const std::string& what) {
  if (a.ok() != b.ok()) Fail(what);
  if (!a.ok()) {
    if (a.status() != b.status()) Fail(what);
    return;
  }
  ExpectSameMessage(*a, *b, what);
}

// One side's decoder, its encoder and its equality.
template <typename T>
struct Side {
  const char* name;
  absl::StatusOr<T> (*decode)(const grpc::ByteBuffer&);
  absl::StatusOr<EncodedMessage> (*encode)(const T&);
  void (*expect_same)(const T&, const T&, const std::string&);
};

template <typename T>
void Check(const Side<T>& side, absl::string_view bytes,
           const std::vector<size_t>& cuts) {
  auto what = [&](const char* problem) {
    return std::string(side.name) + ": " + problem;
  };
  absl::StatusOr<T> whole = side.decode(Buffer(bytes, {}));
  absl::StatusOr<T> sliced = side.decode(Buffer(bytes, cuts));
  if (whole.ok() != sliced.ok()) Fail(what("slicing changed the outcome"));
  if (!whole.ok()) {
    ExpectInvalidArgument(whole.status(), what("unexpected error code"));
    if (whole.status() != sliced.status())
      Fail(what("slicing changed the error"));
    return;
  }
  side.expect_same(*whole, *sliced, what("slicing changed the message"));
  absl::StatusOr<EncodedMessage> encoded = side.encode(*whole);
  if (!encoded.ok()) Fail(what("a decoded message does not re-encode"));
  const std::string again_bytes = Flatten(encoded->buffer);
  absl::StatusOr<T> again = side.decode(Buffer(again_bytes, {}));
  if (!again.ok()) Fail(what("a re-encoded message does not decode"));
  side.expect_same(*whole, *again, what("re-encoding changed the message"));
}

const Side<Message> kServer{"request", ServerDecode, ServerEncode,
                            ExpectSameMessage};
const Side<Reply> kClient{"reply", ClientDecode, ClientEncode, ExpectSameReply};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ferry::rpc::grpc_agent::QuietProtobufLogs();
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  const size_t a = size == 0 ? 0 : (data[0] * 7919u) % (size + 1);
  const size_t b = a + (size - a) / 2;
  const std::vector<size_t> cuts = {a, b};
  Check(kServer, bytes, cuts);
  Check(kClient, bytes, cuts);
  return 0;
}
