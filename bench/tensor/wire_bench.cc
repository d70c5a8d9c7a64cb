// Encode + decode of a Value holding one float32 tensor (4 KiB .. 256 MiB)
// through the grpc::ByteBuffer path, against memcpy of the same bytes.
//
//   bazel run --config=opt //bench/tensor:wire_bench [-- --max_mib=256]
//
// Paths:
//   inprocess: EncodeToByteBuffer, then DecodeFromByteBuffer of that same
//              buffer (slices preserved, as for an in-process channel).
//   received:  EncodeToByteBuffer, then DecodeFromByteBuffer of the same bytes
//              re-sliced into 16 KiB slices the way a transport delivers them
//              (the re-slicing is set up outside the timed loop).
// "copied" columns come from WireStats counters incremented by the wire code
// itself, per operation.
#include <grpcpp/support/slice.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tensor/wire_grpc.h"

namespace ferry {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

grpc::ByteBuffer Rechunk(const grpc::ByteBuffer& in, size_t chunk) {
  std::vector<grpc::Slice> slices;
  in.Dump(&slices);
  std::string flat;
  for (const grpc::Slice& s : slices)
    flat.append(reinterpret_cast<const char*>(s.begin()), s.size());
  std::vector<grpc::Slice> out;
  for (size_t pos = 0; pos < flat.size(); pos += chunk) {
    out.emplace_back(flat.data() + pos, std::min(chunk, flat.size() - pos));
  }
  return grpc::ByteBuffer(out.data(), out.size());
}

struct Result {
  double sec_per_op = 0;
  uint64_t copied_send = 0;  // Per op.
  uint64_t copied_recv = 0;  // Per op.
};

// Runs `reps` encode+decode iterations; `received` selects the decode input.
Result Run(const Tensor& t, const grpc::ByteBuffer* received, int reps) {
  Result r;
  WireStats send, recv;
  const Value v = Value::FromTensor(t);
  const auto start = Clock::now();
  for (int i = 0; i < reps; ++i) {
    absl::StatusOr<grpc::ByteBuffer> buf = EncodeToByteBuffer(v, {}, &send);
    if (!buf.ok()) {
      std::fprintf(stderr, "encode failed: %s\n",
                   buf.status().ToString().c_str());
      std::exit(1);
    }
    absl::StatusOr<Value> back =
        DecodeFromByteBuffer(received ? *received : *buf, {}, &recv);
    if (!back.ok() || back->if_tensor() == nullptr ||
        back->if_tensor()->nbytes() != t.nbytes()) {
      std::fprintf(stderr, "decode failed\n");
      std::exit(1);
    }
  }
  r.sec_per_op = Seconds(Clock::now() - start) / reps;
  r.copied_send = send.payload_bytes_copied / reps;
  r.copied_recv = recv.payload_bytes_copied / reps;
  return r;
}

double MemcpySeconds(const Tensor& src, int reps) {
  std::vector<char> dst(src.nbytes());
  std::memset(dst.data(), 1,
              dst.size());  // Touch the pages outside the timing.
  const auto start = Clock::now();
  for (int i = 0; i < reps; ++i) {
    std::memcpy(dst.data(), src.data_ptr(), src.nbytes());
    asm volatile("" : : "r"(dst.data()) : "memory");
  }
  return Seconds(Clock::now() - start) / reps;
}

int Main(int argc, char** argv) {
  size_t max_mib = 256;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--max_mib=", 10) == 0)
      max_mib = std::strtoul(argv[i] + 10, nullptr, 10);
  }
  std::printf("%-10s %-10s %12s %10s %12s %12s %12s %10s\n", "bytes", "path",
              "time/op(us)", "GB/s", "copied_send", "copied_recv", "memcpy(us)",
              "memcpy GB/s");
  std::vector<std::string> json;
  for (size_t bytes = 4096; bytes <= max_mib << 20; bytes *= 4) {
    Tensor t = empty({static_cast<int64_t>(bytes / 4)}, DType::kFloat32);
    std::memset(t.data_ptr(), 0x3f, bytes);
    // About 2 GiB of traffic per measurement, at least 3 and at most 20000 ops.
    const int reps = static_cast<int>(
        std::clamp<size_t>((size_t{2} << 30) / bytes, 3, 20000));
    const double mc = MemcpySeconds(t, reps);
    absl::StatusOr<grpc::ByteBuffer> proto_buf =
        EncodeToByteBuffer(Value::FromTensor(t));
    const grpc::ByteBuffer received = Rechunk(*proto_buf, 16 << 10);
    for (const char* path : {"inprocess", "received"}) {
      const bool rx = std::strcmp(path, "received") == 0;
      Run(t, rx ? &received : nullptr, 1);  // Warm up.
      Result r = Run(t, rx ? &received : nullptr, reps);
      const double gbps = bytes / r.sec_per_op / 1e9, mgbps = bytes / mc / 1e9;
      std::printf("%-10zu %-10s %12.2f %10.2f %12llu %12llu %12.2f %10.2f\n",
                  bytes, path, r.sec_per_op * 1e6, gbps,
                  static_cast<unsigned long long>(r.copied_send),
                  static_cast<unsigned long long>(r.copied_recv), mc * 1e6,
                  mgbps);
      char line[512];
      std::snprintf(
          line, sizeof(line),
          "{\"bench\":\"tensor_wire\",\"path\":\"%s\",\"bytes\":%zu,\"reps\":%"
          "d,"
          "\"us_per_op\":%.3f,\"gbps\":%.3f,\"payload_bytes_copied_send\":%llu,"
          "\"payload_bytes_copied_recv\":%llu,\"memcpy_us\":%.3f,\"memcpy_"
          "gbps\":%.3f}",
          path, bytes, reps, r.sec_per_op * 1e6, gbps,
          static_cast<unsigned long long>(r.copied_send),
          static_cast<unsigned long long>(r.copied_recv), mc * 1e6, mgbps);
      json.push_back(line);
    }
  }
  for (const std::string& j : json) std::printf("%s\n", j.c_str());
  return 0;
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) { return ferry::Main(argc, argv); }
