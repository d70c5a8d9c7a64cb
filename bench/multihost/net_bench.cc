// Ferry side of the network-shape benchmark (bench/multihost/run.sh): one
// rank per "host" (network namespace), rank 0 at --master_addr. In order:
//
//   raw-tcp   (measured before and after Ferry; the faster pass reported)
//             ping-pong of 16 bytes on one TCP connection (TCP_NODELAY): the
//             floor of an rpc_sync round trip through the same link;
//             lock-step exchange of N bytes both ways per iteration (each
//             iteration waits for the other side's bytes, as an all-reduce
//             loop does): the floor of a 2-rank all-reduce of N bytes;
//   ferry     rpc_sync of a no-op (int64 in, int64 out) over the gRPC agent
//             (InitRpc tcp://); all-reduce of N bytes of float32 through
//             c10d's default "auto" backend (InitProcessGroup tcp://),
//             whose backend is reported (across namespaces: gloo, not the
//             same-host shared memory).
//
// Rank 0 prints a table line and one JSON line per figure:
//   {"bench":"multihost","impl":..,"name":"rpc_sync"|"allreduce","bytes":..,
//    "rtt_us":..,"shape":..,"p50_us":..,"mean_us":..,"p99_us":..,"iters":..}
// Iteration counts are fixed per figure (both ranks run the same loops).
//
//   net_bench --rank=R --master_addr=10.213.0.1 [--port=29600]
//             [--sizes=4096,262144,4194304] [--rpc_iters=200]
//             [--rtt_us=N --shape=S]   (labels only)
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "ferry/c10d/backend.h"
#include "ferry/c10d/init.h"
#include "ferry/common/status.h"
#include "ferry/rpc/grpc/init.h"
#include "ferry/tensor/tensor.h"

ABSL_FLAG(int, rank, -1, "0 (measures, prints) or 1 (peer)");
ABSL_FLAG(std::string, master_addr, "", "rank 0's address");
ABSL_FLAG(int, port, 29600, "first of the 4 ports used on rank 0");
ABSL_FLAG(std::string, sizes, "4096,262144,4194304", "all-reduce bytes");
ABSL_FLAG(int, rpc_iters, 200, "timed rpc_sync / ping-pong round trips");
ABSL_FLAG(int64_t, rtt_us, 0, "added round trip (label)");
ABSL_FLAG(std::string, shape, "none", "how the link is shaped (label)");

namespace ferry {
namespace {

constexpr int kWarmup = 5;

// Timed iterations of an all-reduce (or exchange) of `bytes`.
int IterationsFor(size_t bytes) {
  return bytes <= 65536 ? 100 : bytes <= (1 << 20) ? 40 : 15;
}

void Report(const std::string& impl, const std::string& name, size_t bytes,
            std::vector<double> us, const std::string& extra = "") {
  std::sort(us.begin(), us.end());
  const size_t n = us.size();
  double sum = 0;
  for (double u : us) sum += u;
  const double p50 = us[n / 2], p99 = us[std::min(n - 1, n * 99 / 100)];
  std::printf(
      "%-12s %-10s %10zu B  rtt+%-6lld us  p50 %10.1f us  mean %10.1f"
      " us  p99 %10.1f us  n=%zu %s\n",
      impl.c_str(), name.c_str(), bytes,
      static_cast<long long>(absl::GetFlag(FLAGS_rtt_us)), p50, sum / n, p99, n,
      extra.c_str());
  std::printf(
      "{\"bench\":\"multihost\",\"impl\":\"%s\",\"name\":\"%s\",\"bytes\":%zu,"
      "\"rtt_us\":%lld,\"shape\":\"%s\",\"p50_us\":%.1f,\"mean_us\":%.1f,"
      "\"p99_us\":%.1f,\"iters\":%zu%s}\n",
      impl.c_str(), name.c_str(), bytes,
      static_cast<long long>(absl::GetFlag(FLAGS_rtt_us)),
      absl::GetFlag(FLAGS_shape).c_str(), p50, sum / n, p99, n,
      extra.empty() ? ""
                    : absl::StrCat(",\"backend\":\"", extra, "\"").c_str());
  std::fflush(stdout);
}

template <typename Fn>
absl::StatusOr<std::vector<double>> Time(int iters, Fn&& fn) {
  std::vector<double> us;
  for (int i = 0; i < kWarmup + iters; ++i) {
    const absl::Time t0 = absl::Now();
    RETURN_IF_ERROR(fn());
    if (i >= kWarmup)
      us.push_back(absl::ToDoubleMicroseconds(absl::Now() - t0));
  }
  return us;
}

absl::Status Errno(const std::string& what) {
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(errno)));
}

// --- raw TCP floor -----------------------------------------------------------

// Rank 0 accepts, rank 1 connects (retrying for up to 30 s while rank 0
// starts).
absl::StatusOr<int> Connect(int rank, const std::string& addr, int port) {
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  if (inet_pton(AF_INET, addr.c_str(), &sa.sin_addr) != 1) {
    return absl::InvalidArgumentError("bad --master_addr " + addr);
  }
  int fd = -1;
  if (rank == 0) {
    const int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const int one = 1;
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(lfd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 ||
        listen(lfd, 1) != 0) {
      return Errno("bind/listen");
    }
    fd = accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
    close(lfd);
    if (fd < 0) return Errno("accept");
  } else {
    const absl::Time until = absl::Now() + absl::Seconds(30);
    for (int i = 0; i < 300; ++i) {
      fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0) break;
      close(fd);
      fd = -1;
      if (absl::Now() > until) break;
      absl::SleepFor(absl::Milliseconds(100));  // Rank 0 not listening yet.
    }
    if (fd < 0) return Errno("connect " + addr);
  }
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

absl::Status ReadFull(int fd, char* p, size_t n) {
  while (n > 0) {
    const ssize_t r = read(fd, p, n);
    if (r <= 0)
      return r == 0 ? absl::UnavailableError("peer closed") : Errno("read");
    p += r;
    n -= r;
  }
  return absl::OkStatus();
}

absl::Status WriteFull(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t w = write(fd, p, n);
    if (w < 0) return Errno("write");
    p += w;
    n -= w;
  }
  return absl::OkStatus();
}

// Sends `out` and receives as many bytes into `in` at once (full duplex).
absl::Status Exchange(int fd, const std::string& out, std::string& in) {
  size_t sent = 0, got = 0;
  while (sent < out.size() || got < in.size()) {
    pollfd p{fd,
             static_cast<short>((got < in.size() ? POLLIN : 0) |
                                (sent < out.size() ? POLLOUT : 0)),
             0};
    if (poll(&p, 1, 60000) != 1) return absl::DeadlineExceededError("exchange");
    if (p.revents & POLLIN) {
      const ssize_t r =
          recv(fd, in.data() + got, in.size() - got, MSG_DONTWAIT);
      if (r == 0) return absl::UnavailableError("peer closed");
      if (r > 0) got += r;
    }
    if (p.revents & POLLOUT) {
      const ssize_t w =
          send(fd, out.data() + sent, out.size() - sent, MSG_DONTWAIT);
      if (w > 0) sent += w;
    }
  }
  return absl::OkStatus();
}

// The floor's samples per figure: (name, bytes) -> microseconds.
using Samples = std::map<std::pair<std::string, size_t>, std::vector<double>>;

double Median(std::vector<double> us) {
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

// One pass of the raw TCP floor on a new connection (port + `pass`).
absl::Status RawTcp(int rank, const std::vector<size_t>& sizes, int pass,
                    Samples& best) {
  auto keep = [&](const std::string& name, size_t bytes,
                  std::vector<double> us) {
    std::vector<double>& b = best[{name, bytes}];
    if (b.empty() || Median(us) < Median(b)) b = std::move(us);
  };
  ASSIGN_OR_RETURN(int fd, Connect(rank, absl::GetFlag(FLAGS_master_addr),
                                   absl::GetFlag(FLAGS_port) + 3 * pass));
  char msg[16] = {};
  ASSIGN_OR_RETURN(std::vector<double> us,
                   Time(absl::GetFlag(FLAGS_rpc_iters), [&]() -> absl::Status {
                     if (rank == 0) {
                       RETURN_IF_ERROR(WriteFull(fd, msg, sizeof(msg)));
                       return ReadFull(fd, msg, sizeof(msg));
                     }
                     RETURN_IF_ERROR(ReadFull(fd, msg, sizeof(msg)));
                     return WriteFull(fd, msg, sizeof(msg));
                   }));
  keep("rpc_sync", sizeof(msg), us);
  for (size_t bytes : sizes) {
    std::string out(bytes, 'x'), in(bytes, '\0');
    ASSIGN_OR_RETURN(
        us, Time(IterationsFor(bytes), [&] { return Exchange(fd, out, in); }));
    keep("allreduce", bytes, us);
  }
  close(fd);
  return absl::OkStatus();
}

// --- Ferry -------------------------------------------------------------------

absl::Status FerryRpc(int rank) {
  auto registry = std::make_shared<rpc::FunctionRegistry>();
  RETURN_IF_ERROR(registry->Register("noop", [](int64_t x) { return x; }));
  rpc::GrpcAgentOptions options;
  options.rpc_timeout = absl::Seconds(60);
  const std::string init =
      absl::StrCat("tcp://", absl::GetFlag(FLAGS_master_addr), ":",
                   absl::GetFlag(FLAGS_port) + 1);
  ASSIGN_OR_RETURN(auto agent, rpc::InitRpc(absl::StrCat("worker", rank), init,
                                            rank, 2, options, registry));
  if (rank == 0) {
    ASSIGN_OR_RETURN(
        std::vector<double> us, Time(absl::GetFlag(FLAGS_rpc_iters), [&] {
          return agent->rpc_sync<int64_t>("worker1", "noop", int64_t{1})
              .status();
        }));
    Report("ferry", "rpc_sync", 8, us);
  }
  return agent->Shutdown(/*graceful=*/true);
}

absl::Status FerryAllreduce(int rank, const std::vector<size_t>& sizes) {
  c10d::InitProcessGroupOptions o;
  o.init_method = absl::StrCat("tcp://", absl::GetFlag(FLAGS_master_addr), ":",
                               absl::GetFlag(FLAGS_port) + 2);
  o.rank = rank;
  o.world_size = 2;
  o.group.timeout = absl::Minutes(2);
  ASSIGN_OR_RETURN(std::shared_ptr<c10d::ProcessGroup> pg,
                   c10d::InitProcessGroup(o));
  ASSIGN_OR_RETURN(c10d::Backend * backend, pg->GetBackend(DeviceType::kCPU));
  for (size_t bytes : sizes) {
    Tensor t = full({static_cast<int64_t>(bytes / 4)}, 1.0);
    ASSIGN_OR_RETURN(std::vector<double> us, Time(IterationsFor(bytes), [&] {
                       return pg->Allreduce(t)->Wait(absl::Minutes(1));
                     }));
    if (rank == 0) Report("ferry", "allreduce", bytes, us, backend->name());
  }
  return pg->Barrier()->Wait(absl::Minutes(1));
}

absl::Status Run() {
  const int rank = absl::GetFlag(FLAGS_rank);
  if ((rank != 0 && rank != 1) || absl::GetFlag(FLAGS_master_addr).empty()) {
    return absl::InvalidArgumentError("need --rank=0|1 and --master_addr");
  }
  std::vector<size_t> sizes;
  for (absl::string_view s :
       absl::StrSplit(absl::GetFlag(FLAGS_sizes), ',', absl::SkipEmpty())) {
    size_t b;
    if (!absl::SimpleAtoi(s, &b) || b < 4) {
      return absl::InvalidArgumentError(absl::StrCat("bad size '", s, "'"));
    }
    sizes.push_back(b);
  }
  // The floor is measured before and after Ferry, on fresh connections, and
  // the faster pass (by median) reported: load and TCP's state drift.
  Samples floor;
  RETURN_IF_ERROR(RawTcp(rank, sizes, 0, floor));
  RETURN_IF_ERROR(FerryRpc(rank));
  RETURN_IF_ERROR(FerryAllreduce(rank, sizes));
  RETURN_IF_ERROR(RawTcp(rank, sizes, 1, floor));
  if (rank == 0) {
    for (auto& [key, us] : floor) {
      Report("raw-tcp", key.first, key.second, std::move(us));
    }
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  absl::ParseCommandLine(argc, argv);
  absl::Status s = ferry::Run();
  if (!s.ok()) {
    std::fprintf(stderr, "net_bench rank %d: %s\n", absl::GetFlag(FLAGS_rank),
                 s.ToString().c_str());
    return 1;
  }
  return 0;
}
