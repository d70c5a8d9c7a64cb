// ferry_store: a standalone TCPStore daemon (PyTorch-compatible, both
// protocol generations) that outlives any rank.
//
//   ferry_store --port=29500 [--host=] [--stats=5] [--max_key_bytes=...]
//
// Prints "ferry_store listening on <addr> port <port>" once serving. With
// --stats=N it prints a line every N seconds: clients connected, keys, ops/s
// over the interval, accepted and dropped connections. SIGINT/SIGTERM stop
// it cleanly.
#include <signal.h>
#include <time.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "ferry/common/logging.h"
#include "ferry/store/store_auth.h"
#include "ferry/store/tcp_store_server.h"

ABSL_FLAG(std::string, host, "",
          "Numeric address to bind; empty: all interfaces (IPv6 dual-stack, "
          "IPv4 fallback).");
ABSL_FLAG(int, port, 29500, "TCP port; 0 picks a free one (printed).");
ABSL_FLAG(int, backlog, 65535,
          "Listen backlog (capped by net.core.somaxconn).");
ABSL_FLAG(uint64_t, max_key_bytes, 8 * 1024, "Longest key accepted.");
ABSL_FLAG(uint64_t, max_value_bytes, 8 * 1024 * 1024,
          "Largest value accepted.");
ABSL_FLAG(uint64_t, max_keys_per_request, 128 * 1024,
          "Most keys in one CHECK/WAIT/MULTI_GET/MULTI_SET.");
ABSL_FLAG(uint64_t, max_frame_bytes, 64 * 1024 * 1024,
          "Largest request frame.");
ABSL_FLAG(double, stats, 0,
          "Print a stats line every this many seconds (0: off).");
ABSL_FLAG(double, exit_after, 0,
          "Stop after this many seconds (0: run until SIGINT/SIGTERM); for "
          "scripts and tests.");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("ferry_store: standalone TCPStore daemon");
  absl::ParseCommandLine(argc, argv);

  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  // Blocked before the loop thread starts, so only sigtimedwait sees them.
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  ferry::TcpStoreServer::Options options;
  options.host = absl::GetFlag(FLAGS_host);
  options.port = absl::GetFlag(FLAGS_port);
  options.backlog = absl::GetFlag(FLAGS_backlog);
  options.limits.max_key_bytes = absl::GetFlag(FLAGS_max_key_bytes);
  options.limits.max_value_bytes = absl::GetFlag(FLAGS_max_value_bytes);
  options.limits.max_keys_per_request =
      absl::GetFlag(FLAGS_max_keys_per_request);
  options.limits.max_frame_bytes = absl::GetFlag(FLAGS_max_frame_bytes);
  // FERRY_STORE_SECRET_FILE / FERRY_STORE_SECRET (store/store_auth.h).
  auto secret = ferry::tcpstore::StoreSecretFromEnv();
  if (!secret.ok()) {
    std::fprintf(stderr, "ferry_store: %s\n",
                 secret.status().ToString().c_str());
    return 1;
  }
  options.secret = *secret;
  auto server = ferry::TcpStoreServer::Start(options);
  if (!server.ok()) {
    std::fprintf(stderr, "ferry_store: %s\n",
                 server.status().ToString().c_str());
    return 1;
  }
  std::printf("ferry_store listening on %s port %d\n",
              (*server)->address().c_str(), (*server)->port());
  std::fflush(stdout);

  const double stats_s = absl::GetFlag(FLAGS_stats);
  const double exit_after = absl::GetFlag(FLAGS_exit_after);
  const absl::Time start = absl::Now();
  absl::Time last = start;
  int64_t last_ops = 0;
  while (true) {
    absl::Duration wait = absl::Hours(1);
    if (stats_s > 0) wait = absl::Seconds(stats_s);
    if (exit_after > 0) {
      wait = std::min(wait, start + absl::Seconds(exit_after) - absl::Now());
      if (wait <= absl::ZeroDuration()) break;
    }
    const timespec ts = absl::ToTimespec(wait);
    const int sig = sigtimedwait(&signals, nullptr, &ts);
    if (sig == SIGINT || sig == SIGTERM) break;
    if (stats_s > 0) {
      const absl::Time now = absl::Now();
      const ferry::TcpStoreServer::Stats s = (*server)->GetStats();
      const double secs = absl::ToDoubleSeconds(now - last);
      std::printf(
          "stats: clients=%lld keys=%lld ops/s=%.0f ops=%lld accepted=%lld "
          "dropped=%lld\n",
          static_cast<long long>(s.clients), static_cast<long long>(s.keys),
          secs > 0 ? (s.ops - last_ops) / secs : 0.0,
          static_cast<long long>(s.ops), static_cast<long long>(s.accepted),
          static_cast<long long>(s.dropped));
      std::fflush(stdout);
      last = now;
      last_ops = s.ops;
    }
  }
  (*server)->Stop();
  std::printf("ferry_store stopped\n");
  return 0;
}
