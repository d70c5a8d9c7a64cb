// ferry_store_relay: a node-local TCPStore relay (store/tcp_store_relay.h).
//
//   ferry_store_relay --upstream=HOST:PORT [--host=127.0.0.1] [--port=0]
//                     [--stats=N]
//
// Prints "ferry_store_relay listening on <addr> port <port> upstream
// <host:port>" once the server is reached and the relay serves; with
// --stats=N a line every N seconds (local clients, local and upstream
// requests, coalesced requests, upstream waits and losses). The store's
// secret comes from FERRY_STORE_SECRET_FILE / FERRY_STORE_SECRET, as for
// workers (store/store_auth.h). Exits 1 when the server cannot be reached
// within --connect_timeout or refuses the secret. SIGINT/SIGTERM stop it.
#include <signal.h>
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "ferry/store/store_auth.h"
#include "ferry/store/tcp_store_relay.h"

ABSL_FLAG(std::string, host, "127.0.0.1", "Numeric address to listen on.");
ABSL_FLAG(int, port, 0, "TCP port; 0 picks a free one (printed).");
ABSL_FLAG(std::string, upstream, "",
          "The server as HOST:PORT (numeric host; [v6]:PORT for IPv6).");
ABSL_FLAG(double, connect_timeout, 30,
          "Seconds to wait for the server at start.");
ABSL_FLAG(double, stats, 0, "Print a stats line every this many seconds.");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("ferry_store_relay: node-local TCPStore relay");
  absl::ParseCommandLine(argc, argv);
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  ferry::TcpStoreRelay::Options options;
  options.host = absl::GetFlag(FLAGS_host);
  options.port = absl::GetFlag(FLAGS_port);
  const std::string upstream = absl::GetFlag(FLAGS_upstream);
  const size_t colon = upstream.rfind(':');
  if (colon == std::string::npos ||
      !absl::SimpleAtoi(upstream.substr(colon + 1), &options.upstream_port)) {
    std::fprintf(stderr,
                 "ferry_store_relay: --upstream=HOST:PORT is required (got "
                 "'%s')\n",
                 upstream.c_str());
    return 1;
  }
  std::string host = upstream.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  options.upstream_host = host;
  options.connect_timeout =
      absl::Seconds(absl::GetFlag(FLAGS_connect_timeout));
  absl::StatusOr<std::string> secret = ferry::tcpstore::StoreSecretFromEnv();
  if (!secret.ok()) {
    std::fprintf(stderr, "ferry_store_relay: %s\n",
                 secret.status().ToString().c_str());
    return 1;
  }
  options.secret = *secret;
  auto relay = ferry::TcpStoreRelay::Start(options);
  if (!relay.ok()) {
    std::fprintf(stderr, "ferry_store_relay: %s\n",
                 relay.status().ToString().c_str());
    return 1;
  }
  std::printf("ferry_store_relay listening on %s port %d upstream %s\n",
              (*relay)->address().c_str(), (*relay)->port(),
              (*relay)->upstream().c_str());
  std::fflush(stdout);
  const double stats_s = absl::GetFlag(FLAGS_stats);
  while (true) {
    const timespec ts = absl::ToTimespec(
        stats_s > 0 ? absl::Seconds(stats_s) : absl::Hours(1));
    const int sig = sigtimedwait(&signals, nullptr, &ts);
    if (sig == SIGINT || sig == SIGTERM) break;
    if (stats_s > 0) {
      const ferry::TcpStoreRelay::Stats s = (*relay)->GetStats();
      std::printf(
          "stats: clients=%lld local_requests=%lld upstream_requests=%lld "
          "coalesced=%lld upstream_waits=%lld upstream_losses=%lld "
          "upstream_connected=%d\n",
          static_cast<long long>(s.clients),
          static_cast<long long>(s.local_requests),
          static_cast<long long>(s.upstream_requests),
          static_cast<long long>(s.coalesced),
          static_cast<long long>(s.upstream_waits),
          static_cast<long long>(s.upstream_losses), s.upstream_connected);
      std::fflush(stdout);
    }
  }
  (*relay)->Stop();
  std::printf("ferry_store_relay stopped\n");
  return 0;
}
