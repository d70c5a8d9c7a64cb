// libFuzzer target for the wire decoder (tensor/wire.h).
//
// Any input must decode to a Value or an InvalidArgument, never crash, and
// the result must not depend on how the bytes are chunked or whether they are
// adopted. Whatever decodes must re-encode, and decoding that encoding must
// give back the same encoding (a fixed point).
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ferry/tensor/wire.h"

namespace {

[[noreturn]] void Fail(const char* what) {
  std::fprintf(stderr, "wire_fuzz: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ferry::WireLimits limits;
  limits.max_total_bytes = uint64_t{1} << 24;
  limits.max_metadata_bytes = uint64_t{1} << 20;
  const std::string input(reinterpret_cast<const char*>(data), size);

  absl::StatusOr<std::optional<std::vector<ferry::WirePayloadExtent>>> read =
      ferry::ReadPayloadExtents(input, limits);
  if (!read.ok() && read.status().code() != absl::StatusCode::kInvalidArgument) {
    Fail("extents error that is not InvalidArgument");
  }

  absl::StatusOr<ferry::Value> borrowed =
      ferry::DecodeValue(absl::string_view(input), limits);
  if (!borrowed.ok() &&
      borrowed.status().code() != absl::StatusCode::kInvalidArgument) {
    Fail("decode error that is not InvalidArgument");
  }

  // Same bytes in three owned chunks split at input-derived points.
  auto owned = std::make_shared<std::string>(input);
  const size_t a = size == 0 ? 0 : (data[0] * 7919u) % (size + 1);
  const size_t b = a + (size - a) / 2;
  std::vector<ferry::WireChunk> chunks = {{owned->data(), a, owned},
                                          {owned->data() + a, b - a, owned},
                                          {owned->data() + b, size - b, owned}};
  absl::StatusOr<ferry::Value> chunked =
      ferry::DecodeValue(absl::MakeConstSpan(chunks), limits);
  if (chunked.ok() != borrowed.ok()) Fail("chunking changed the outcome");
  if (!borrowed.ok()) {
    if (chunked.status() != borrowed.status())
      Fail("chunking changed the error");
    return 0;
  }

  absl::StatusOr<ferry::EncodedValue> e1 =
      ferry::EncodeValue(*borrowed, limits);
  if (!e1.ok()) Fail("a decoded value does not re-encode");
  const std::string s1 = e1->Flatten();
  absl::StatusOr<ferry::EncodedValue> e2 = ferry::EncodeValue(*chunked, limits);
  if (!e2.ok() || e2->Flatten() != s1)
    Fail("chunked decode differs from borrowed decode");
  absl::StatusOr<std::optional<std::vector<ferry::WirePayloadExtent>>>
      extents = ferry::ReadPayloadExtents(s1, limits);
  if (!extents.ok() || !extents->has_value() ||
      (*extents)->size() != e1->payloads.size()) {
    Fail("an encoding's extents are not its payloads");
  }
  uint64_t at = e1->head.size();
  for (size_t i = 0; i < e1->payloads.size(); ++i) {
    const ferry::WirePayload& p = e1->payloads[i];
    if ((**extents)[i].offset != at || (**extents)[i].size != p.size) {
      Fail("an extent is not where its payload lies");
    }
    at += p.size + p.padding;
  }

  absl::StatusOr<ferry::Value> again =
      ferry::DecodeValue(absl::string_view(s1), limits);
  if (!again.ok()) Fail("a re-encoded value does not decode");
  absl::StatusOr<ferry::EncodedValue> e3 = ferry::EncodeValue(*again, limits);
  if (!e3.ok() || e3->Flatten() != s1)
    Fail("encode(decode(x)) is not a fixed point");
  return 0;
}
