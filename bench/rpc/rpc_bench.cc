// Ferry side of the RPC benchmark, with its floors (raw gRPC, raw TCP);
// bench/rpc/run.sh runs it next to PyTorch's TensorPipe agent.
//
//   rpc_bench [--sizes=4096,...] [--seconds=N]
//
// Run plainly it hosts a TcpStore on 127.0.0.1 (port 0) and starts two copies
// of itself, like a real job: rank 1 ("callee", --role=server) serves Ferry
// functions, a raw gRPC echo service and a raw TCP echo socket; rank 0
// ("caller", --role=client) measures, printing a table and one JSON line per
// figure. Both ranks meet through the store, then shut down gracefully.
//
// Figures (caller side, loopback):
//   rpc_sync_noop / rpc_sync_tensor4   round trip of rpc_sync: no argument /
//                                      a 4-element float tensor echoed (us)
//   rpc_async_64                       calls/s with 64 calls in flight
//   tensor_echo                        a float tensor of N bytes sent and
//                                      echoed back over gRPC (TCP), each way
//                                      one unary message (a second group
//                                      with streaming and the same-host
//                                      channel off); one-way GB/s =
//                                      N / (round trip / 2)
//   tensor_echo_stream                 the same over TCP with the default
//                                      stream options: >= 1 MiB streamed
//                                      both ways in 1 MiB pieces
//                                      (rpc/grpc/stream.h; a third worker,
//                                      "caller_tcp", with the same-host
//                                      channel off)
//   tensor_echo_samehost               the same over the same-host channel
//                                      (rpc/grpc/shm_channel.h), followed by
//                                      its copy counters: bytes the caller
//                                      left in place (0 copied on send) and
//                                      bytes it received (copied once)
//   memcpy_echo                        floor: N bytes memcpy'd to a warm
//                                      buffer and back (one memcpy each way)
//   grpc_sync_unary                    raw gRPC floor: sync stub, tiny
//                                      protobuf message, echoed (us)
//   grpc_callback_unary                raw gRPC floor: callback API, caller
//                                      waits for the completion (us)
//   grpc_unary_exec_hop                raw gRPC floor: as grpc_sync_unary, the
//                                      server replying from an executor
//                                      thread (Ferry's server-side hop) (us)
//   grpc_callback_64                   raw gRPC floor: callback API, 64 in
//                                      flight (calls/s)
//   grpc_unary_echo                    raw gRPC floor: N bytes in one protobuf
//                                      bytes field, echoed (GB/s one way)
//   grpc_stream_echo                   raw gRPC floor: N bytes as a bidi stream
//                                      of 1 MiB chunks, each echoed as it
//                                      arrives (GB/s one way; N >= 1 MiB)
//   latency_interleaved                rpc_sync no-op and 4-float tensor
//                                      (both serving paths), raw gRPC with
//                                      the executor hop and through the
//                                      callback API, over raw gRPC
//                                      sync unary, timed in alternating
//                                      batches of --batch calls: per round
//                                      the ratio of p50s; the median over
//                                      --rounds rounds (drift on a shared
//                                      machine hits every op alike)
//   tcp_pingpong                       raw TCP floor: 16 bytes each way (us)
//   tcp_echo                           raw TCP floor: N bytes, echoed (GB/s)
//
// The callee is rank 1 of 3: "caller" (rank 0, same-host channel on) and
// "caller_tcp" (rank 2, off) run in the client process.
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "ferry/bench/rpc/stream_echo.grpc.pb.h"
#include "ferry/common/executor.h"
#include "ferry/common/future.h"
#include "ferry/common/sync.h"
#include "ferry/proto/rpc.grpc.pb.h"
#include "ferry/rpc/grpc/agent.h"
#include "ferry/store/prefix_store.h"
#include "ferry/store/tcp_store.h"
#include "ferry/tensor/tensor.h"

ABSL_FLAG(std::string, role, "", "'' (launch both ranks), server or client.");
ABSL_FLAG(int, port, 0, "TcpStore port on 127.0.0.1 (roles).");
ABSL_FLAG(std::string, sizes, "4096,65536,1048576,16777216,67108864,268435456",
          "Tensor echo sizes in bytes.");
ABSL_FLAG(double, seconds, 3.0,
          "Upper bound on each latency/throughput figure's duration.");
ABSL_FLAG(int, iters, 3000, "Latency iterations (bounded by --seconds).");
ABSL_FLAG(int, async_calls, 20000,
          "Calls per throughput figure (bounded by --seconds).");
ABSL_FLAG(int64_t, piece_bytes, 0,
          "Streamed piece size of the agents (0: StreamOptions' default).");
ABSL_FLAG(int, floor_http2_window, 0,
          "HTTP/2 window of the raw gRPC stream floor (BDP probe off), as "
          "Ferry's GrpcAgentOptions::http2_window_bytes; 0: gRPC's default.");
ABSL_FLAG(int, rounds, 30, "Rounds of latency_interleaved.");
ABSL_FLAG(int, batch, 100, "Calls per op per round of latency_interleaved.");
ABSL_FLAG(std::string, figures, "",
          "Comma-separated figure names to measure (e.g. "
          "grpc_stream_echo,tensor_echo_stream); empty: all.");

extern char** environ;

namespace ferry {
namespace {

using Clock = std::chrono::steady_clock;

double Us(Clock::duration d) {
  return std::chrono::duration<double, std::micro>(d).count();
}

// Now plus --seconds: the bound on each figure's measuring time.
Clock::time_point Deadline() {
  return Clock::now() +
         std::chrono::duration_cast<Clock::duration>(
             std::chrono::duration<double>(absl::GetFlag(FLAGS_seconds)));
}

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "rpc_bench: %s\n", what.c_str());
  std::fflush(stderr);
  std::_Exit(1);
}

template <typename T>
T OrDie(absl::StatusOr<T> v, const std::string& what) {
  if (!v.ok()) Die(absl::StrCat(what, ": ", v.status().ToString()));
  return *std::move(v);
}
void OrDie(const absl::Status& s, const std::string& what) {
  if (!s.ok()) Die(absl::StrCat(what, ": ", s.ToString()));
}

// ---------------------------------------------------------------------------
// Reporting.

struct Latency {
  double mean_us = 0, p50_us = 0, p99_us = 0;
  int iters = 0;
};

Latency Summarize(std::vector<double> us) {
  Latency l;
  l.iters = static_cast<int>(us.size());
  if (us.empty()) return l;
  double sum = 0;
  for (double u : us) sum += u;
  l.mean_us = sum / us.size();
  std::sort(us.begin(), us.end());
  l.p50_us = us[us.size() / 2];
  l.p99_us = us[std::min(us.size() - 1, us.size() * 99 / 100)];
  return l;
}

void ReportLatency(const std::string& impl, const std::string& name,
                   const Latency& l) {
  std::printf("%-8s %-20s %12s %10.1f us  (p50 %.1f, p99 %.1f, n=%d)\n",
              impl.c_str(), name.c_str(), "", l.mean_us, l.p50_us, l.p99_us,
              l.iters);
  std::printf(
      "{\"bench\": \"rpc\", \"impl\": \"%s\", \"name\": \"%s\", \"unit\": "
      "\"us\", \"mean\": %.2f, \"p50\": %.2f, \"p99\": %.2f, \"iters\": %d}\n",
      impl.c_str(), name.c_str(), l.mean_us, l.p50_us, l.p99_us, l.iters);
  std::fflush(stdout);
}

void ReportRate(const std::string& impl, const std::string& name, int calls,
                double seconds) {
  const double rate = calls / seconds;
  std::printf("%-8s %-20s %12s %10.0f calls/s  (%d calls in %.2f s)\n",
              impl.c_str(), name.c_str(), "", rate, calls, seconds);
  std::printf(
      "{\"bench\": \"rpc\", \"impl\": \"%s\", \"name\": \"%s\", \"unit\": "
      "\"calls/s\", \"value\": %.1f, \"calls\": %d, \"seconds\": %.4f}\n",
      impl.c_str(), name.c_str(), rate, calls, seconds);
  std::fflush(stdout);
}

// `rtts_us`: round trips of `bytes` sent and echoed back.
void ReportBandwidth(const std::string& impl, const std::string& name,
                     int64_t bytes, std::vector<double> rtts_us) {
  Latency l = Summarize(std::move(rtts_us));
  // One way: bytes / (round trip / 2), on the median round trip.
  const double gbps = bytes / (l.p50_us / 2) / 1e3;
  std::printf(
      "%-8s %-20s %12lld %10.3f GB/s one way  (rtt p50 %.3f ms, n=%d)\n",
      impl.c_str(), name.c_str(), static_cast<long long>(bytes), gbps,
      l.p50_us / 1e3, l.iters);
  std::printf(
      "{\"bench\": \"rpc\", \"impl\": \"%s\", \"name\": \"%s\", \"unit\": "
      "\"GB/s\", \"bytes\": %lld, \"value\": %.4f, \"rtt_p50_ms\": %.4f, "
      "\"rtt_mean_ms\": %.4f, \"iters\": %d, \"definition\": \"bytes / "
      "(median round trip / 2)\"}\n",
      impl.c_str(), name.c_str(), static_cast<long long>(bytes), gbps,
      l.p50_us / 1e3, l.mean_us / 1e3, l.iters);
  std::fflush(stdout);
}

// Iterations for an echo of `bytes`: fewer for big sizes (about 1 GiB moved
// per figure), at least 3.
int EchoIters(int64_t bytes) {
  return static_cast<int>(std::clamp<int64_t>((1LL << 30) / bytes, 3, 300));
}

// Whether --figures selects `figure` (all when empty).
bool Want(absl::string_view figure) {
  const std::string figures = absl::GetFlag(FLAGS_figures);
  if (figures.empty()) return true;
  for (absl::string_view f : absl::StrSplit(figures, ',')) {
    if (f == figure) return true;
  }
  return false;
}

// Runs `op` (one round trip) up to --iters times or --seconds, after a warm-up.
template <typename Op>
std::vector<double> TimeLoop(int iters, Op op, int warmup = 50) {
  for (int i = 0; i < warmup; ++i) op();
  const auto limit = Deadline();
  std::vector<double> us;
  us.reserve(iters);
  for (int i = 0; i < iters; ++i) {
    auto t0 = Clock::now();
    op();
    auto t1 = Clock::now();
    us.push_back(Us(t1 - t0));
    if (t1 > limit) break;
  }
  return us;
}

// Times each op in `ops` (name, one round trip) in turn, --batch calls at a
// time, over --rounds rounds; reports each op's per-round p50 over the first
// op's p50 in the same round: the median and range over the rounds, and the
// ratio of the pooled p50s.
void ReportInterleaved(
    const std::vector<std::pair<std::string, std::function<void()>>>& ops) {
  const int rounds = std::max(1, absl::GetFlag(FLAGS_rounds));
  const int batch = std::max(1, absl::GetFlag(FLAGS_batch));
  for (const auto& op : ops) {
    for (int i = 0; i < 50; ++i) op.second();  // Warm-up.
  }
  std::vector<std::vector<double>> ratios(ops.size());
  std::vector<std::vector<double>> pooled(ops.size());
  for (int r = 0; r < rounds; ++r) {
    std::vector<double> p50(ops.size());
    for (size_t o = 0; o < ops.size(); ++o) {
      std::vector<double> us = TimeLoop(batch, ops[o].second, /*warmup=*/0);
      pooled[o].insert(pooled[o].end(), us.begin(), us.end());
      p50[o] = Summarize(std::move(us)).p50_us;
    }
    for (size_t o = 0; o < ops.size(); ++o)
      ratios[o].push_back(p50[o] / p50[0]);
  }
  const double base = Summarize(pooled[0]).p50_us;
  for (size_t o = 1; o < ops.size(); ++o) {
    std::vector<double> v = ratios[o];
    std::sort(v.begin(), v.end());
    const double median = v[v.size() / 2];
    const double pooled_p50 = Summarize(pooled[o]).p50_us;
    const double whole = pooled_p50 / base;
    const char* impl =
        absl::StartsWith(ops[o].first, "grpc") ? "grpc" : "ferry";
    std::printf(
        "%-8s %-20s %12s %10.3fx %s  (median of %d rounds of %d calls, "
        "range %.2f-%.2f; pooled p50 %.1f / %.1f us = %.3fx)\n",
        impl, ops[o].first.c_str(), "", median, ops[0].first.c_str(), rounds,
        batch, v.front(), v.back(), pooled_p50, base, whole);
    std::printf(
        "{\"bench\": \"rpc\", \"impl\": \"%s\", \"name\": "
        "\"%s_over_%s\", \"unit\": \"ratio\", \"value\": %.4f, "
        "\"min\": %.4f, \"max\": %.4f, \"pooled_p50_ratio\": %.4f, "
        "\"rounds\": %d, \"batch\": %d, \"definition\": \"median over "
        "rounds of p50 ratios, ops timed in alternating batches\"}\n",
        impl, ops[o].first.c_str(), ops[0].first.c_str(), median, v.front(),
        v.back(), whole, rounds, batch);
  }
  std::fflush(stdout);
}

// ---------------------------------------------------------------------------
// Raw TCP echo: 8-byte length, then that many bytes; echoed back whole.

bool WriteAll(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t w = write(fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    c += w;
    n -= w;
  }
  return true;
}
bool ReadAll(int fd, void* p, size_t n) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    ssize_t r = read(fd, c, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    c += r;
    n -= r;
  }
  return true;
}

void NoDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

class TcpEchoServer {
 public:
  TcpEchoServer() {
    listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
        listen(listen_fd_, 4) != 0 ||
        getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      Die("tcp echo server: bind/listen failed");
    }
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { Serve(); });
  }
  ~TcpEchoServer() {
    shutdown(listen_fd_, SHUT_RDWR);
    thread_.join();
    close(listen_fd_);
  }
  int port() const { return port_; }

 private:
  // One connection at a time, until the peer closes it.
  void Serve() {
    for (;;) {
      int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) return;
      NoDelay(fd);
      std::vector<char> buf;
      uint64_t n;
      while (ReadAll(fd, &n, sizeof(n))) {
        if (n > (1ULL << 31)) break;
        buf.resize(n);
        if (!ReadAll(fd, buf.data(), n)) break;
        if (!WriteAll(fd, buf.data(), n)) break;
      }
      close(fd);
    }
  }

  int listen_fd_ = -1;
  int port_ = 0;
  std::thread thread_;
};

int TcpConnect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    Die("tcp connect failed");
  }
  NoDelay(fd);
  return fd;
}

void TcpEcho(int fd, const char* data, uint64_t n, char* back) {
  if (!WriteAll(fd, &n, sizeof(n)) || !WriteAll(fd, data, n) ||
      !ReadAll(fd, back, n)) {
    Die("tcp echo failed");
  }
}

// ---------------------------------------------------------------------------
// Raw gRPC echo: ferry.rpc.v1.Worker/Call answering with the request's bytes
// (an RpcRequest holding only `payload` is also a valid RpcResponse), on
// gRPC's callback API, replying on gRPC's own thread.

// With `hop`, the reply is sent from an executor thread instead (as Ferry's
// agent does, running functions on its executor): that floor prices the hop.
class GrpcEchoService final
    : public ferry::rpc::v1::Worker::WithRawCallbackMethod_Call<
          ferry::rpc::v1::Worker::Service> {
 public:
  explicit GrpcEchoService(ThreadPoolExecutor* hop = nullptr) : hop_(hop) {}

  grpc::ServerUnaryReactor* Call(grpc::CallbackServerContext* context,
                                 const grpc::ByteBuffer* request,
                                 grpc::ByteBuffer* response) override {
    *response = *request;  // Shares the slices; no copy.
    grpc::ServerUnaryReactor* r = context->DefaultReactor();
    if (hop_ == nullptr) {
      r->Finish(grpc::Status::OK);
    } else {
      absl::Status s = hop_->Submit([r] { r->Finish(grpc::Status::OK); });
      if (!s.ok()) r->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, ""));
    }
    return r;
  }

 private:
  ThreadPoolExecutor* const hop_;
};

std::unique_ptr<grpc::Server> StartGrpcEcho(GrpcEchoService* service,
                                            int* port) {
  grpc::ServerBuilder b;
  b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), port);
  b.SetMaxReceiveMessageSize(0x7fffffff);
  b.SetMaxSendMessageSize(0x7fffffff);
  b.RegisterService(service);
  auto server = b.BuildAndStart();
  if (!server || *port == 0) Die("grpc echo server failed to start");
  return server;
}

// Raw gRPC streaming echo (sync API): every chunk goes back as it arrives.
class StreamEchoService final : public ferry::bench::v1::StreamEcho::Service {
 public:
  grpc::Status Echo(
      grpc::ServerContext*,
      grpc::ServerReaderWriter<ferry::bench::v1::Chunk,
                               ferry::bench::v1::Chunk>* stream) override {
    ferry::bench::v1::Chunk chunk;
    while (stream->Read(&chunk)) {
      if (!stream->Write(chunk)) break;
    }
    return grpc::Status::OK;
  }
};

constexpr int64_t kStreamChunk = 1 << 20;

// Sends `n` bytes as 1 MiB chunks on one stream (a writer thread) while
// reading the echoes; returns the bytes that came back.
int64_t StreamEcho(ferry::bench::v1::StreamEcho::Stub* stub,
                   const std::string& chunk_data, int64_t n) {
  grpc::ClientContext ctx;
  auto stream = stub->Echo(&ctx);
  std::thread writer([&] {
    ferry::bench::v1::Chunk chunk;
    for (int64_t sent = 0; sent < n; sent += kStreamChunk) {
      chunk.set_data(chunk_data.data(), std::min(kStreamChunk, n - sent));
      if (!stream->Write(chunk)) break;
    }
    stream->WritesDone();
  });
  int64_t got = 0;
  ferry::bench::v1::Chunk back;
  while (stream->Read(&back)) got += back.data().size();
  writer.join();
  grpc::Status s = stream->Finish();
  if (!s.ok()) Die("grpc stream echo: " + s.error_message());
  return got;
}

// ---------------------------------------------------------------------------
// Roles.

std::shared_ptr<Store> ConnectStore(int port) {
  TcpStoreOptions o;
  o.host = "127.0.0.1";
  o.port = port;
  o.timeout = absl::Minutes(20);
  return OrDie(TcpStore::Create(o), "connecting to the store");
}

// `unary`: streaming and the same-host channel off (every payload one gRPC
// message over TCP).
rpc::GrpcAgentOptions AgentOptions(bool unary = false) {
  rpc::GrpcAgentOptions o;
  o.stream.enabled = !unary;
  if (absl::GetFlag(FLAGS_piece_bytes) > 0) {
    o.stream.piece_bytes = absl::GetFlag(FLAGS_piece_bytes);
  }
  if (unary) o.same_host.enabled = false;
  o.rpc_timeout = absl::Minutes(5);
  o.join_timeout = absl::Minutes(2);
  return o;
}

// How often received payloads found a warm buffer (rpc/grpc/buffer_pool.h).
void PrintPoolStats(const char* who, const rpc::GrpcAgent& agent) {
  const auto s = agent.receive_pool_stats();
  std::printf(
      "# %s receive buffers: %llu reused, %llu allocated; %zu idle (%zu "
      "bytes)\n",
      who, static_cast<unsigned long long>(s.reused),
      static_cast<unsigned long long>(s.allocated), s.idle_buffers,
      s.idle_bytes);
  std::fflush(stdout);
}

int RunServer(int port) {
  std::shared_ptr<Store> store = ConnectStore(port);
  auto registry = std::make_shared<rpc::FunctionRegistry>();
  OrDie(registry->Register("noop", [] {}), "register noop");
  OrDie(registry->Register("echo", [](Tensor t) { return t; }), "register");
  // The same, registered non-blocking: served on gRPC's thread, no hop.
  OrDie(registry->RegisterNonBlocking("noop_nb", [] {}), "register noop_nb");
  OrDie(registry->RegisterNonBlocking("echo_nb", [](Tensor t) { return t; }),
        "register echo_nb");
  TcpEchoServer tcp;
  GrpcEchoService grpc_service;
  int grpc_port = 0;
  auto grpc_server = StartGrpcEcho(&grpc_service, &grpc_port);
  ThreadPoolExecutor::Options hop_options;
  hop_options.name = "hop";
  hop_options.num_threads = 16;  // As the agent's default.
  ThreadPoolExecutor hop_executor(hop_options);
  GrpcEchoService hop_service(&hop_executor);
  int hop_port = 0;
  auto hop_server = StartGrpcEcho(&hop_service, &hop_port);
  OrDie(store->Set("bench/hop_port", absl::StrCat(hop_port)), "set");
  StreamEchoService stream_service;
  int stream_port = 0;
  grpc::ServerBuilder stream_builder;
  stream_builder.AddListeningPort(
      "127.0.0.1:0", grpc::InsecureServerCredentials(), &stream_port);
  if (const int w = absl::GetFlag(FLAGS_floor_http2_window); w > 0) {
    stream_builder.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
    stream_builder.AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, w);
  }
  stream_builder.RegisterService(&stream_service);
  auto stream_server = stream_builder.BuildAndStart();
  if (!stream_server || stream_port == 0) Die("stream echo server failed");
  OrDie(store->Set("bench/stream_port", absl::StrCat(stream_port)), "set");
  OrDie(store->Set("bench/tcp_port", absl::StrCat(tcp.port())), "set");
  OrDie(store->Set("bench/grpc_port", absl::StrCat(grpc_port)), "set");
  auto agent = OrDie(
      rpc::GrpcAgent::Start("callee", 1, 3, store, AgentOptions(), registry),
      "starting the callee agent");
  // A second group whose agents only send unary TCP messages: tensor_echo.
  auto unary =
      OrDie(rpc::GrpcAgent::Start(
                "callee", 1, 2, std::make_shared<PrefixStore>("unary/", store),
                AgentOptions(/*unary=*/true), registry),
            "starting the unary callee agent");
  // The caller sets bench/done when it has measured everything.
  OrDie(store->Wait({std::string("bench/done")}, absl::Minutes(20)),
        "waiting for the caller");
  PrintPoolStats("callee", *agent);
  OrDie(unary->Shutdown(/*graceful=*/true), "unary callee shutdown");
  OrDie(agent->Shutdown(/*graceful=*/true), "callee shutdown");
  grpc_server->Shutdown();
  hop_server->Shutdown();
  hop_executor.Shutdown(ThreadPoolExecutor::ShutdownMode::kDrain).IgnoreError();
  stream_server->Shutdown();
  return 0;
}

std::vector<int64_t> Sizes() {
  std::vector<int64_t> sizes;
  for (absl::string_view s :
       absl::StrSplit(absl::GetFlag(FLAGS_sizes), ',', absl::SkipEmpty())) {
    int64_t n;
    if (!absl::SimpleAtoi(s, &n) || n < 4 || n % 4 != 0) {
      Die(absl::StrCat("bad --sizes entry '", s, "'"));
    }
    sizes.push_back(n);
  }
  return sizes;
}

// `calls` calls with `window` in flight; `issue(i)` returns call i's future.
// Returns {calls completed, seconds}.
template <typename Issue>
std::pair<int, double> Windowed(int calls, int window, Issue issue) {
  std::deque<Future<Value>> inflight;
  const auto limit = Deadline();
  auto t0 = Clock::now();
  int issued = 0;
  int done = 0;
  while (done < calls) {
    while (issued < calls && static_cast<int>(inflight.size()) < window) {
      inflight.push_back(issue(issued++));
    }
    Result<Value> r = inflight.front().Get();
    if (!r.ok()) Die(absl::StrCat("async call: ", r.status().ToString()));
    inflight.pop_front();
    ++done;
    // Past the time bound: stop issuing, drain what is in flight.
    if (Clock::now() > limit) calls = std::min(calls, issued);
  }
  return {done, std::chrono::duration<double>(Clock::now() - t0).count()};
}

// Raw gRPC callback API: `calls` calls, `window` in flight, each completion
// issuing the next from gRPC's callback thread.
struct CallbackBench {
  ferry::rpc::v1::Worker::Stub* stub;
  ferry::rpc::v1::RpcRequest request;
  int total = 0;
  Mutex mu;
  int issued ABSL_GUARDED_BY(mu) = 0;
  int done ABSL_GUARDED_BY(mu) = 0;
  bool failed ABSL_GUARDED_BY(mu) = false;
  Clock::time_point limit;

  struct Slot {
    std::unique_ptr<grpc::ClientContext> context;
    ferry::rpc::v1::RpcResponse response;
  };

  void Issue(Slot* slot) {
    slot->context = std::make_unique<grpc::ClientContext>();
    stub->async()->Call(slot->context.get(), &request, &slot->response,
                        [this, slot](grpc::Status s) { Done(slot, s); });
  }
  void Done(Slot* slot, const grpc::Status& s) {
    bool again;
    {
      MutexLock lock(&mu);
      ++done;
      if (!s.ok()) failed = true;
      if (Clock::now() > limit) total = std::min(total, issued);
      again = issued < total;
      if (again) ++issued;
    }
    if (again) Issue(slot);
  }
  // Returns {calls, seconds}.
  std::pair<int, double> Run(int calls, int window) {
    std::vector<Slot> slots(window);
    total = calls;
    limit = Deadline();
    auto t0 = Clock::now();
    {
      MutexLock lock(&mu);
      issued = std::min(window, calls);
      done = 0;
      failed = false;
    }
    for (int i = 0; i < std::min(window, calls); ++i) Issue(&slots[i]);
    int finished;
    {
      MutexLock lock(&mu);
      auto all_done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
        return done >= issued && issued >= total;
      };
      mu.Await(absl::Condition(&all_done));
      if (failed) Die("grpc callback call failed");
      finished = done;
    }
    return {finished, std::chrono::duration<double>(Clock::now() - t0).count()};
  }
};

// A path's copy counters, printed after its echo rows: `sent` bytes left in
// place or sent as slices of the tensors (copied 0 times on send), and
// `received` bytes copied once on receive (the decoder adopts those bytes:
// shm_channel_test, stream_test). `how` says how they were sent, `key` is
// its JSON field.
void ReportCopies(const char* figure, const char* how, const char* key,
                  int64_t n, uint64_t sent, uint64_t received) {
  std::printf(
      "%-8s %-20s %12lld %s %llu B (copied 0x), received %llu B "
      "(copied 1x)\n",
      "ferry", figure, static_cast<long long>(n), how,
      static_cast<unsigned long long>(sent),
      static_cast<unsigned long long>(received));
  std::printf(
      "{\"bench\": \"rpc\", \"impl\": \"ferry\", \"name\": \"%s\", "
      "\"unit\": \"bytes\", \"bytes\": %lld, \"%s\": %llu, "
      "\"send_copies\": 0, \"received\": %llu, \"receive_copies\": 1}\n",
      figure, static_cast<long long>(n), key,
      static_cast<unsigned long long>(sent),
      static_cast<unsigned long long>(received));
  std::fflush(stdout);
}

// One round trip each, for the latency loops: raw gRPC's sync stub; the
// same call through the callback API, the caller blocking until the
// completion (on gRPC's thread) wakes it (Ferry's client-side path); Ferry's
// rpc_sync of a no-op and of a tensor echo.
std::function<void()> GrpcUnaryOp(ferry::rpc::v1::Worker::Stub* stub,
                                  const ferry::rpc::v1::RpcRequest& request) {
  return [stub, &request] {
    grpc::ClientContext ctx;
    ferry::rpc::v1::RpcResponse resp;
    grpc::Status s = stub->Call(&ctx, request, &resp);
    if (!s.ok()) Die("grpc unary: " + s.error_message());
  };
}
std::function<void()> GrpcCallbackOp(
    ferry::rpc::v1::Worker::Stub* stub,
    const ferry::rpc::v1::RpcRequest& request) {
  return [stub, &request] {
    grpc::ClientContext ctx;
    ferry::rpc::v1::RpcResponse resp;
    Notification done;
    grpc::Status status;
    stub->async()->Call(&ctx, &request, &resp, [&](grpc::Status s) {
      status = std::move(s);
      done.Notify();
    });
    done.WaitForNotification();
    if (!status.ok()) Die("grpc callback: " + status.error_message());
  };
}
std::function<void()> NoopOp(rpc::GrpcAgent* agent, std::string fn) {
  return [agent, fn = std::move(fn)] {
    absl::Status s = agent->rpc_sync<void>(1, fn);
    if (!s.ok()) Die(s.ToString());
  };
}
std::function<void()> EchoOp(rpc::GrpcAgent* agent, std::string fn,
                             const Tensor& t) {
  return [agent, fn = std::move(fn), &t] {
    auto r = agent->rpc_sync<Tensor>(1, fn, t);
    if (!r.ok()) Die(r.status().ToString());
  };
}

int RunClient(int port) {
  std::shared_ptr<Store> store = ConnectStore(port);
  // Both callers join at once (Start returns when the group of 3 is there).
  std::unique_ptr<rpc::GrpcAgent> tcp_agent;
  std::thread tcp_start([&] {
    rpc::GrpcAgentOptions o = AgentOptions();
    o.same_host.enabled = false;
    // Its own connection: a store client serves one blocking wait at once.
    tcp_agent =
        OrDie(rpc::GrpcAgent::Start("caller_tcp", 2, 3, ConnectStore(port), o),
              "starting the caller_tcp agent");
  });
  auto agent =
      OrDie(rpc::GrpcAgent::Start("caller", 0, 3, store, AgentOptions()),
            "starting the caller agent");
  tcp_start.join();
  auto unary =
      OrDie(rpc::GrpcAgent::Start(
                "caller", 0, 2, std::make_shared<PrefixStore>("unary/", store),
                AgentOptions(/*unary=*/true)),
            "starting the unary caller agent");
  if (agent->same_host().usable_peers() < 2) {
    std::fprintf(stderr,
                 "rpc_bench: the same-host channel is refused here; "
                 "its rows measure the gRPC fallback\n");
  }
  const int tcp_port = std::stoi(OrDie(store->Get("bench/tcp_port"), "get"));
  const int grpc_port = std::stoi(OrDie(store->Get("bench/grpc_port"), "get"));
  const int hop_port = std::stoi(OrDie(store->Get("bench/hop_port"), "get"));
  const int stream_port =
      std::stoi(OrDie(store->Get("bench/stream_port"), "get"));
  const int iters = absl::GetFlag(FLAGS_iters);
  const int async_calls = absl::GetFlag(FLAGS_async_calls);
  const std::vector<int64_t> sizes = Sizes();

  std::printf("# RPC benchmark: 2 processes on loopback, %u CPUs\n",
              std::thread::hardware_concurrency());
  std::printf("%-8s %-20s %12s %10s\n", "impl", "figure", "bytes", "result");

  // --- Floors: raw TCP.
  {
    int fd = TcpConnect(tcp_port);
    char ping[16] = {1}, pong[16];
    if (Want("tcp_pingpong")) {
      ReportLatency("tcp", "tcp_pingpong", Summarize(TimeLoop(iters, [&] {
                      TcpEcho(fd, ping, sizeof(ping), pong);
                    })));
    }
    for (int64_t n : sizes) {
      if (!Want("tcp_echo")) break;
      std::vector<char> out(n, 7), back(n);
      ReportBandwidth(
          "tcp", "tcp_echo", n,
          TimeLoop(
              EchoIters(n), [&] { TcpEcho(fd, out.data(), n, back.data()); },
              /*warmup=*/1));
      if (back[n - 1] != 7) Die("tcp echo returned wrong bytes");
    }
    close(fd);
  }

  // --- Floors: raw gRPC.
  {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(0x7fffffff);
    args.SetMaxSendMessageSize(0x7fffffff);
    auto channel =
        grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", grpc_port),
                                  grpc::InsecureChannelCredentials(), args);
    auto stub = ferry::rpc::v1::Worker::NewStub(channel);
    ferry::rpc::v1::RpcRequest tiny;
    tiny.set_payload("0123456789abcdef");
    auto hop_stub = ferry::rpc::v1::Worker::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", hop_port),
                            grpc::InsecureChannelCredentials()));
    for (auto [figure, op] :
         {std::pair{"grpc_sync_unary", GrpcUnaryOp(stub.get(), tiny)},
          std::pair{"grpc_unary_exec_hop", GrpcUnaryOp(hop_stub.get(), tiny)},
          std::pair{"grpc_callback_unary", GrpcCallbackOp(stub.get(), tiny)}}) {
      if (Want(figure)) {
        ReportLatency("grpc", figure, Summarize(TimeLoop(iters, op)));
      }
    }
    if (Want("grpc_callback_64")) {
      CallbackBench cb;
      cb.stub = stub.get();
      cb.request = tiny;
      cb.Run(1000, 64);  // Warm-up.
      auto [calls, secs] = cb.Run(async_calls, 64);
      ReportRate("grpc", "grpc_callback_64", calls, secs);
    }
    for (int64_t n : sizes) {
      if (!Want("grpc_unary_echo")) break;
      ferry::rpc::v1::RpcRequest big;
      big.set_payload(std::string(n, '\x07'));
      size_t got = 0;
      ReportBandwidth("grpc", "grpc_unary_echo", n,
                      TimeLoop(
                          EchoIters(n),
                          [&] {
                            grpc::ClientContext ctx;
                            ferry::rpc::v1::RpcResponse resp;
                            grpc::Status s = stub->Call(&ctx, big, &resp);
                            if (!s.ok()) Die("grpc echo: " + s.error_message());
                            got = resp.payload().size();
                          },
                          /*warmup=*/1));
      if (got != static_cast<size_t>(n)) Die("grpc echo: wrong size");
    }
    grpc::ChannelArguments stream_args;
    if (const int w = absl::GetFlag(FLAGS_floor_http2_window); w > 0) {
      stream_args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
      stream_args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, w);
    }
    auto stream_stub =
        ferry::bench::v1::StreamEcho::NewStub(grpc::CreateCustomChannel(
            absl::StrCat("127.0.0.1:", stream_port),
            grpc::InsecureChannelCredentials(), stream_args));
    const std::string chunk_data(kStreamChunk, '\x07');
    for (int64_t n : sizes) {
      if (n < kStreamChunk || !Want("grpc_stream_echo")) continue;
      int64_t got = 0;
      ReportBandwidth(
          "grpc", "grpc_stream_echo", n,
          TimeLoop(
              EchoIters(n),
              [&] { got = StreamEcho(stream_stub.get(), chunk_data, n); },
              /*warmup=*/1));
      if (got != n) Die("grpc stream echo: wrong size");
    }
  }

  // --- Ferry: functions on the executor ("noop"), then registered
  // non-blocking ("noop_nb", rows suffixed _nb: served on gRPC's thread).
  for (const std::string suffix : {"", "_nb"}) {
    const std::string noop_fn = "noop" + suffix;
    const std::string echo_fn = "echo" + suffix;
    Tensor four = from_vector<float>({1, 2, 3, 4});
    for (auto [figure, op] :
         {std::pair{"rpc_sync_noop" + suffix, NoopOp(agent.get(), noop_fn)},
          std::pair{"rpc_sync_tensor4" + suffix,
                    EchoOp(agent.get(), echo_fn, four)}}) {
      if (Want(figure)) {
        ReportLatency("ferry", figure, Summarize(TimeLoop(iters, op)));
      }
    }
    if (!Want("rpc_async_64" + suffix)) continue;
    auto noop = [&](int) { return agent->CallAsync(1, noop_fn, {}); };
    Windowed(1000, 64, noop);  // Warm-up.
    auto [calls, secs] = Windowed(async_calls, 64, noop);
    ReportRate("ferry", "rpc_async_64" + suffix, calls, secs);
  }
  if (Want("latency_interleaved")) {
    auto stub = ferry::rpc::v1::Worker::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", grpc_port),
                            grpc::InsecureChannelCredentials()));
    auto hop_stub = ferry::rpc::v1::Worker::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", hop_port),
                            grpc::InsecureChannelCredentials()));
    ferry::rpc::v1::RpcRequest tiny;
    tiny.set_payload("0123456789abcdef");
    Tensor four = from_vector<float>({1, 2, 3, 4});
    rpc::GrpcAgent* a = agent.get();
    ReportInterleaved(
        {{"grpc_sync_unary", GrpcUnaryOp(stub.get(), tiny)},
         {"grpc_unary_exec_hop", GrpcUnaryOp(hop_stub.get(), tiny)},
         {"grpc_callback_unary", GrpcCallbackOp(stub.get(), tiny)},
         {"rpc_sync_noop", NoopOp(a, "noop")},
         {"rpc_sync_noop_nb", NoopOp(a, "noop_nb")},
         {"rpc_sync_tensor4", EchoOp(a, "echo", four)},
         {"rpc_sync_tensor4_nb", EchoOp(a, "echo_nb", four)}});
  }
  for (int64_t n : sizes) {
    Tensor t = full({n / 4}, 7.0);
    // TCP unary, TCP streamed (caller_tcp), then the same-host channel.
    for (auto [figure, a] : {std::pair{"tensor_echo", unary.get()},
                             std::pair{"tensor_echo_stream", tcp_agent.get()},
                             std::pair{"tensor_echo_samehost", agent.get()}}) {
      if (!Want(figure)) continue;
      const bool same_host = a == agent.get();
      const auto& s = a->same_host().stats();
      const uint64_t sent0 = s.bytes_sent.load();
      const uint64_t received0 = s.bytes_received.load();
      const rpc::StreamStats& ss = a->stream_stats();
      const uint64_t ssent0 = ss.bytes_sent.load();
      const uint64_t sreceived0 = ss.bytes_received.load();
      int64_t got = 0;
      ReportBandwidth("ferry", figure, n,
                      TimeLoop(
                          EchoIters(n),
                          [&, a = a] {
                            auto r = a->rpc_sync<Tensor>(1, "echo", t);
                            if (!r.ok()) Die(r.status().ToString());
                            got = static_cast<int64_t>(r->nbytes());
                          },
                          /*warmup=*/1));
      if (got != n) Die("ferry echo: wrong size");
      if (same_host) {
        ReportCopies("samehost_copies", "sent in place", "sent_in_place", n,
                     s.bytes_sent.load() - sent0,
                     s.bytes_received.load() - received0);
      }
      if (a == tcp_agent.get() && n >= 1 << 20) {
        ReportCopies("stream_copies", "sent as slices", "sent_as_slices", n,
                     ss.bytes_sent.load() - ssent0,
                     ss.bytes_received.load() - sreceived0);
      }
    }
    if (!Want("memcpy_echo")) continue;
    std::vector<char> src(n, 7), dst(n, 0);
    ReportBandwidth("floor", "memcpy_echo", n,
                    TimeLoop(
                        EchoIters(n),
                        [&] {
                          std::memcpy(dst.data(), src.data(), n);
                          std::memcpy(src.data(), dst.data(), n);
                        },
                        /*warmup=*/1));
    if (src[n - 1] != 7) Die("memcpy floor: wrong bytes");
  }

  const rpc::StreamStats& ss = tcp_agent->stream_stats();
  std::printf(
      "# streamed: %llu requests, %llu replies; %llu payload bytes "
      "received, all copied once into their tensors' buffer\n",
      static_cast<unsigned long long>(ss.requests_sent.load()),
      static_cast<unsigned long long>(ss.replies_received.load()),
      static_cast<unsigned long long>(ss.bytes_received.load()));
  PrintPoolStats("caller", *agent);
  PrintPoolStats("caller_tcp", *tcp_agent);
  OrDie(store->Set("bench/done", "1"), "set bench/done");
  OrDie(unary->Shutdown(/*graceful=*/true), "unary caller shutdown");
  std::thread tcp_down([&] {
    OrDie(tcp_agent->Shutdown(/*graceful=*/true), "caller_tcp shutdown");
  });
  OrDie(agent->Shutdown(/*graceful=*/true), "caller shutdown");
  tcp_down.join();
  return 0;
}

// Hosts the store and runs both ranks as child processes.
int Launch(const char* self, int argc, char** argv) {
  TcpStoreOptions o;
  o.host = "127.0.0.1";
  o.port = 0;
  o.is_server = true;
  o.timeout = absl::Minutes(20);
  auto store = OrDie(TcpStore::Create(o), "hosting the store");
  const std::string port = absl::StrCat("--port=", store->port());
  pid_t pids[2];
  const char* roles[2] = {"--role=server", "--role=client"};
  for (int i = 0; i < 2; ++i) {
    std::vector<std::string> args = {self, roles[i], port};
    for (int a = 1; a < argc; ++a) args.push_back(argv[a]);
    std::vector<char*> argp;
    for (auto& a : args) argp.push_back(a.data());
    argp.push_back(nullptr);
    if (posix_spawn(&pids[i], self, nullptr, nullptr, argp.data(), environ) !=
        0) {
      Die("cannot start a rank");
    }
  }
  int rc = 0;
  for (int done = 0; done < 2; ++done) {
    int status;
    pid_t pid = wait(&status);
    const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (!ok) {
      std::fprintf(stderr, "rpc_bench: rank process %d failed (status %d)\n",
                   pid, status);
      rc = 1;
      for (pid_t p : pids) {
        if (p != pid) kill(p, SIGKILL);
      }
    }
  }
  return rc;
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  const std::string role = absl::GetFlag(FLAGS_role);
  const int port = absl::GetFlag(FLAGS_port);
  if (role == "server") return ferry::RunServer(port);
  if (role == "client") return ferry::RunClient(port);
  if (!role.empty()) {
    std::fprintf(stderr, "rpc_bench: unknown --role=%s\n", role.c_str());
    return 2;
  }
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return 1;
  self[n] = '\0';
  return ferry::Launch(self, argc, argv);
}
