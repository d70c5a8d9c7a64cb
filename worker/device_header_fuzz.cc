// libFuzzer target for the device layer's header (worker/device_header.h).
//
// Any input, as a request's or a reply's header over a payload of 0..7
// tensors, must decode or be InvalidArgument, never crash; whatever decodes
// must re-encode to a header that decodes to the same placements.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "ferry/worker/device_header.h"

namespace {

[[noreturn]] void Fail(const char* what) {
  std::fprintf(stderr, "device_header_fuzz: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  for (bool request : {true, false}) {
    for (size_t tensors = 0; tensors < 8; ++tensors) {
      absl::StatusOr<ferry::DeviceHeader> h =
          ferry::DecodeDeviceHeader(input, tensors, request, "fuzz");
      if (!h.ok()) {
        if (h.status().code() != absl::StatusCode::kInvalidArgument) {
          Fail("decode error that is not InvalidArgument");
        }
        continue;
      }
      absl::StatusOr<ferry::DeviceHeader> again = ferry::DecodeDeviceHeader(
          ferry::EncodeDeviceHeader(*h), tensors, request, "fuzz");
      if (!again.ok() || again->placements != h->placements ||
          again->returning != h->returning ||
          again->events != h->events ||
          again->ipc_ack != h->ipc_ack ||
          again->ipc_replies != h->ipc_replies ||
          again->reply_acks != h->reply_acks ||
          again->ipc_reply != h->ipc_reply) {
        Fail("a decoded header does not survive re-encoding");
      }
    }
  }
  return 0;
}
