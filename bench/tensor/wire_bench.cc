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
//   grpc_loopback: a real unary call over 127.0.0.1 (generic callback
//              service): client encode, HTTP/2 transport, server decode, an
//              empty reply. Time is the whole round trip; copied_recv is what
//              the server's decode copied out of the slices gRPC delivered.
// Baselines, same bytes, same run: memcpy into a warm buffer, and
// alloc+memcpy into a fresh tensor (what any receiver that copies pays,
// page faults included).
// "copied" columns come from WireStats counters incremented by the wire code
// itself, per operation.
#include <grpcpp/create_channel.h>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>
#include <grpcpp/support/slice.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "ferry/tensor/wire_grpc.h"

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

// Server that decodes each request and replies with an empty value.
class SinkService final : public grpc::CallbackGenericService {
 public:
  grpc::ServerGenericBidiReactor* CreateReactor(
      grpc::GenericCallbackServerContext*) override {
    return new Reactor(this);
  }
  std::atomic<uint64_t> copied{0};
  std::atomic<uint64_t> failures{0};

 private:
  class Reactor final : public grpc::ServerGenericBidiReactor {
   public:
    explicit Reactor(SinkService* s) : service_(s) { StartRead(&request_); }
    void OnReadDone(bool ok) override {
      if (!ok) {
        Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "no request"));
        return;
      }
      WireStats stats;
      absl::StatusOr<Value> v = DecodeFromByteBuffer(request_, {}, &stats);
      service_->copied += stats.payload_bytes_copied;
      if (!v.ok()) ++service_->failures;
      response_ = *EncodeToByteBuffer(Value());
      StartWriteAndFinish(&response_, grpc::WriteOptions(), grpc::Status::OK);
    }
    void OnDone() override { delete this; }

   private:
    SinkService* service_;
    grpc::ByteBuffer request_, response_;
  };
};

struct Loopback {
  SinkService service;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<grpc::GenericStub> stub;

  Loopback() {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port);
    builder.SetMaxReceiveMessageSize(-1);
    builder.RegisterCallbackGenericService(&service);
    server = builder.BuildAndStart();
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(-1);
    stub = std::make_unique<grpc::GenericStub>(
        grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", port),
                                  grpc::InsecureChannelCredentials(), args));
  }
  ~Loopback() { server->Shutdown(); }
};

Result RunLoopback(Loopback& lb, const Tensor& t, int reps) {
  Result r;
  WireStats send;
  const Value v = Value::FromTensor(t);
  const uint64_t copied_before = lb.service.copied.load();
  const auto start = Clock::now();
  for (int i = 0; i < reps; ++i) {
    grpc::ByteBuffer request = *EncodeToByteBuffer(v, {}, &send);
    grpc::ByteBuffer response;
    grpc::ClientContext ctx;
    absl::Notification done;
    grpc::Status status;
    lb.stub->UnaryCall(&ctx, "/ferry.bench.Sink/Sink", grpc::StubOptions(),
                       &request, &response, [&](grpc::Status s) {
                         status = std::move(s);
                         done.Notify();
                       });
    done.WaitForNotification();
    if (!status.ok() || lb.service.failures.load() != 0) {
      std::fprintf(stderr, "loopback call failed: %s\n",
                   status.error_message().c_str());
      std::exit(1);
    }
  }
  r.sec_per_op = Seconds(Clock::now() - start) / reps;
  r.copied_send = send.payload_bytes_copied / reps;
  r.copied_recv = (lb.service.copied.load() - copied_before) / reps;
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

// memcpy into freshly allocated memory, as a receiver that must copy pays.
double AllocMemcpySeconds(const Tensor& src, int reps) {
  const auto start = Clock::now();
  for (int i = 0; i < reps; ++i) {
    Tensor dst = empty(src.sizes(), src.dtype());
    std::memcpy(dst.data_ptr(), src.data_ptr(), src.nbytes());
    asm volatile("" : : "r"(dst.data_ptr()) : "memory");
  }
  return Seconds(Clock::now() - start) / reps;
}

int Main(int argc, char** argv) {
  size_t max_mib = 256;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--max_mib=", 10) == 0)
      max_mib = std::strtoul(argv[i] + 10, nullptr, 10);
  }
  std::printf("%-10s %-13s %12s %9s %11s %11s %11s %9s %13s %9s\n", "bytes",
              "path", "time/op(us)", "GB/s", "copied_send", "copied_recv",
              "memcpy(us)", "GB/s", "alloc+cpy(us)", "GB/s");
  std::vector<std::string> json;
  Loopback loopback;
  for (size_t bytes = 4096; bytes <= max_mib << 20; bytes *= 4) {
    Tensor t = empty({static_cast<int64_t>(bytes / 4)}, DType::kFloat32);
    std::memset(t.data_ptr(), 0x3f, bytes);
    // About 2 GiB of traffic per measurement, at least 3 and at most 20000 ops.
    const int reps = static_cast<int>(
        std::clamp<size_t>((size_t{2} << 30) / bytes, 3, 20000));
    const double mc = MemcpySeconds(t, reps);
    const double amc = AllocMemcpySeconds(t, reps);
    absl::StatusOr<grpc::ByteBuffer> proto_buf =
        EncodeToByteBuffer(Value::FromTensor(t));
    const grpc::ByteBuffer received = Rechunk(*proto_buf, 16 << 10);
    for (const char* path : {"inprocess", "received", "grpc_loopback"}) {
      const bool rx = std::strcmp(path, "received") == 0;
      Result r;
      int used_reps = reps;
      if (std::strcmp(path, "grpc_loopback") == 0) {
        RunLoopback(loopback, t, 1);  // Warm up.
        used_reps = std::min(reps, 2000);
        r = RunLoopback(loopback, t, used_reps);
      } else {
        Run(t, rx ? &received : nullptr, 1);  // Warm up.
        r = Run(t, rx ? &received : nullptr, reps);
      }
      const double gbps = bytes / r.sec_per_op / 1e9;
      const double mgbps = bytes / mc / 1e9, agbps = bytes / amc / 1e9;
      const auto send = static_cast<unsigned long long>(r.copied_send);
      const auto recv = static_cast<unsigned long long>(r.copied_recv);
      std::printf(
          "%-10zu %-13s %12.2f %9.2f %11llu %11llu %11.2f %9.2f %13.2f %9.2f\n",
          bytes, path, r.sec_per_op * 1e6, gbps, send, recv, mc * 1e6, mgbps,
          amc * 1e6, agbps);
      char line[640];
      std::snprintf(line, sizeof(line),
                    "{\"bench\":\"tensor_wire\",\"path\":\"%s\",\"bytes\":%zu,"
                    "\"reps\":%d,\"us_per_op\":%.3f,\"gbps\":%.3f,"
                    "\"payload_bytes_copied_send\":%llu,"
                    "\"payload_bytes_copied_recv\":%llu,\"memcpy_us\":%.3f,"
                    "\"memcpy_gbps\":%.3f,\"alloc_memcpy_us\":%.3f,"
                    "\"alloc_memcpy_gbps\":%.3f}",
                    path, bytes, used_reps, r.sec_per_op * 1e6, gbps, send,
                    recv, mc * 1e6, mgbps, amc * 1e6, agbps);
      json.push_back(line);
    }
  }
  for (const std::string& j : json) std::printf("%s\n", j.c_str());
  return 0;
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) { return ferry::Main(argc, argv); }
