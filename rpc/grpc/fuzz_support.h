// Helpers of rpc/grpc's fuzz targets and their corpus generators: a
// received buffer as gRPC might slice it, a buffer flattened back to one
// string, the failure report, and protobuf's log kept quiet.
#ifndef FERRY_RPC_GRPC_FUZZ_SUPPORT_H_
#define FERRY_RPC_GRPC_FUZZ_SUPPORT_H_

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/stubs/logging.h"

namespace ferry::rpc::grpc_agent {

// `bytes` in slices split at `cuts` (ascending, at most bytes.size()).
inline grpc::ByteBuffer SlicedBuffer(absl::string_view bytes,
                                     const std::vector<size_t>& cuts = {}) {
  std::vector<grpc::Slice> slices;
  size_t from = 0;
  for (size_t cut : cuts) {
    slices.emplace_back(bytes.data() + from, cut - from);
    from = cut;
  }
  slices.emplace_back(bytes.data() + from, bytes.size() - from);
  return grpc::ByteBuffer(slices.data(), slices.size());
}

// All of `buffer` in one string ("" if it cannot be read).
inline std::string FlattenBuffer(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  if (!buffer.Dump(&slices).ok()) return "";
  std::string out;
  for (const grpc::Slice& s : slices) {
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return out;
}

// Reports a failed check of fuzz target `target` and aborts (libFuzzer
// keeps the input).
[[noreturn]] inline void FuzzFail(const char* target, const std::string& what,
                                  const absl::Status& status = {}) {
  std::fprintf(stderr, "%s: %s %s\n", target, what.c_str(),
               status.ok() ? "" : status.ToString().c_str());
  std::abort();
}

// Protobuf logs every invalid UTF-8 string it refuses; the refusal itself is
// checked, the log line only slows fuzzing. Call at every input (cheap).
inline void QuietProtobufLogs() {
  static const bool quiet = [] {
    google::protobuf::SetLogHandler(nullptr);
    return true;
  }();
  (void)quiet;
}

}  // namespace ferry::rpc::grpc_agent

#endif  // FERRY_RPC_GRPC_FUZZ_SUPPORT_H_
