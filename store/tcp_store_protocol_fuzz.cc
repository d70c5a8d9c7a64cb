// libFuzzer target: the server's incremental frame parser on arbitrary bytes,
// fed in two chunks split at a data-chosen point, as a socket would deliver
// them. Checks the parser's contract: it never consumes more than it was
// given, never reports a frame of size 0, and parses the same frames whether
// the bytes came in one piece or two.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "ferry/store/tcp_store_protocol.h"

namespace {

using ferry::tcpstore::FrameParser;
using ferry::tcpstore::Limits;
using ferry::tcpstore::Request;

// Parses `data` delivered in pieces ending at `cuts`; returns the ops seen
// (and 0xff for an error).
std::vector<int> Run(const std::string& data, const std::vector<size_t>& cuts) {
  Limits limits;
  limits.max_key_bytes = 64;
  limits.max_value_bytes = 256;
  limits.max_keys_per_request = 16;
  limits.max_frame_bytes = 4096;
  FrameParser parser(limits);
  std::vector<int> ops;
  std::string buffer;
  size_t fed = 0;
  Request request;
  for (size_t cut : cuts) {
    buffer.append(data, fed, cut - fed);
    fed = cut;
    while (true) {
      size_t consumed = 0;
      FrameParser::Result r = parser.Parse(buffer, &request, &consumed);
      if (r == FrameParser::Result::kNeedMore) {
        if (consumed != 0) abort();
        break;
      }
      if (r == FrameParser::Result::kError) {
        if (parser.error().ok()) abort();
        ops.push_back(0xff);
        return ops;
      }
      if (consumed == 0 || consumed > buffer.size()) abort();
      ops.push_back(static_cast<int>(request.op));
      buffer.erase(0, consumed);
    }
  }
  return ops;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  const size_t split = bytes.empty() ? 0 : data[0] % (bytes.size() + 1);
  const std::vector<int> whole = Run(bytes, {bytes.size()});
  const std::vector<int> pieces = Run(bytes, {split, bytes.size()});
  if (whole != pieces) abort();
  return 0;
}
