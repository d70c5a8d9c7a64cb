// Ferry side of the TCPStore benchmark (bench/store/run.sh drives it; the
// PyTorch side is torch_bench.py). Subcommands, one per role:
//
//   server       --port --world_size   hosts a TcpStore (is_server); prints
//                "STARTING", then "INIT_DONE <seconds>" once world_size
//                handles (its own included) joined; serves until stdin closes.
//   init_clients --port --count --world_size
//                prints "READY", waits for a line on stdin ("go", or
//                "go PORT" to use that port instead of --port), then creates
//                `count` joining clients one after another; prints "JOINED";
//                keeps them until stdin closes.
//   barrier      --port --count --world_size --rounds
//                `count` ranks (threads) join and run `rounds` store-based
//                barriers (add + wait on a last-worker key); prints
//                "BARRIER <seconds per barrier>" (slowest rank).
//   latency      --port --iters   one client; prints "LAT <op> <median us>"
//                for set, get, add.
//   throughput   --port --count --seconds   `count` clients (threads) doing
//                add in a loop; prints "OPS <total ops> <seconds>".
//   relay        --port --upstream_port   a TcpStoreRelay on 127.0.0.1:port
//                in front of the server; prints "RELAY <port>" once it
//                serves and, when stdin closes, "RELAY_STATS <local
//                requests> <upstream requests> <coalesced>".
//   rtt          --iters   raw loopback TCP ping-pong (1 byte each way) with
//                blocking sockets; prints "RTT <median us>" (echo in a
//                thread of this process), then "RTT_EPOLL <median us>" (echo
//                in a forked process waiting in epoll_wait, as the store
//                server's loop does: the floor for a server process).
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/barrier.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "ferry/store/tcp_store.h"
#include "ferry/store/tcp_store_relay.h"

ABSL_FLAG(int, port, 0, "Store port on 127.0.0.1.");
ABSL_FLAG(int, world_size, 1, "Handles that join.");
ABSL_FLAG(int, count, 1, "Clients in this process.");
ABSL_FLAG(int, rounds, 20, "Barrier rounds.");
ABSL_FLAG(int, iters, 2000, "Latency iterations.");
ABSL_FLAG(double, seconds, 2, "Throughput duration.");
ABSL_FLAG(int, upstream_port, 0, "relay: the server's port on 127.0.0.1.");
ABSL_FLAG(std::string, key_prefix, "", "Prefix for benchmark keys.");
ABSL_FLAG(bool, legacy_protocol, false,
          "Clients speak PyTorch 1.13's protocol (to drive a 1.13 server).");

namespace ferry {
namespace {

void RaiseFdLimit() {
  rlimit rl{};
  getrlimit(RLIMIT_NOFILE, &rl);
  rl.rlim_cur = rl.rlim_max;
  setrlimit(RLIMIT_NOFILE, &rl);
}

TcpStoreOptions Client(int world) {
  TcpStoreOptions o;
  o.host = "127.0.0.1";
  o.port = absl::GetFlag(FLAGS_port);
  if (world > 0) o.world_size = world;
  o.timeout = absl::Seconds(600);
  o.legacy_protocol = absl::GetFlag(FLAGS_legacy_protocol);
  return o;
}

[[noreturn]] void Die(const absl::Status& s) {
  std::fprintf(stderr, "store_bench: %s\n", s.ToString().c_str());
  std::exit(1);
}

// The line read ("" at EOF).
std::string WaitStdinLine() {
  std::string line;
  std::getline(std::cin, line);
  return line;
}

void WaitStdinClosed() {
  std::string line;
  while (std::getline(std::cin, line)) {
  }
}

int Server() {
  TcpStoreOptions o = Client(absl::GetFlag(FLAGS_world_size));
  o.is_server = true;
  std::printf("STARTING\n");
  std::fflush(stdout);
  const absl::Time start = absl::Now();
  auto store = TcpStore::Create(o);
  if (!store.ok()) Die(store.status());
  std::printf("INIT_DONE %.6f\n", absl::ToDoubleSeconds(absl::Now() - start));
  std::fflush(stdout);
  WaitStdinClosed();
  return 0;
}

int Relay() {
  TcpStoreRelay::Options o;
  o.port = absl::GetFlag(FLAGS_port);
  o.upstream_port = absl::GetFlag(FLAGS_upstream_port);
  auto relay = TcpStoreRelay::Start(o);
  if (!relay.ok()) Die(relay.status());
  std::printf("RELAY %d\n", (*relay)->port());
  std::fflush(stdout);
  WaitStdinClosed();
  const TcpStoreRelay::Stats s = (*relay)->GetStats();
  std::printf("RELAY_STATS %lld %lld %lld\n",
              static_cast<long long>(s.local_requests),
              static_cast<long long>(s.upstream_requests),
              static_cast<long long>(s.coalesced));
  std::fflush(stdout);
  return 0;
}

int InitClients() {
  std::vector<std::unique_ptr<TcpStore>> clients;
  const int n = absl::GetFlag(FLAGS_count);
  clients.reserve(n);
  std::printf("READY\n");
  std::fflush(stdout);
  // "go" or "go PORT" (a port known only now, e.g. a relay's).
  const std::string go = WaitStdinLine();
  TcpStoreOptions options = Client(absl::GetFlag(FLAGS_world_size));
  if (go.size() > 3 && !absl::SimpleAtoi(go.substr(3), &options.port)) {
    Die(absl::InvalidArgumentError(absl::StrCat("bad go line: ", go)));
  }
  for (int i = 0; i < n; ++i) {
    auto c = TcpStore::Create(options);
    if (!c.ok()) Die(c.status());
    clients.push_back(*std::move(c));
  }
  std::printf("JOINED\n");
  std::fflush(stdout);
  WaitStdinClosed();
  return 0;
}

int Barrier() {
  const int n = absl::GetFlag(FLAGS_count);
  const int world = absl::GetFlag(FLAGS_world_size);
  const int rounds = absl::GetFlag(FLAGS_rounds);
  const std::string prefix = absl::GetFlag(FLAGS_key_prefix);
  std::vector<std::thread> threads;
  std::atomic<int64_t> slowest_ns{0};
  std::atomic<bool> failed{false};
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&] {
      auto c = TcpStore::Create(Client(world));
      if (!c.ok()) Die(c.status());
      Store& s = **c;
      auto barrier = [&](int r) {
        const std::string key = absl::StrCat(prefix, "barrier/", r);
        auto v = s.Add(key, 1);
        if (!v.ok()) Die(v.status());
        if (*v == world) {
          if (auto st = s.Set(key + "/last", "1"); !st.ok()) Die(st);
        }
        if (auto st = s.Wait({key + "/last"}); !st.ok()) Die(st);
      };
      barrier(-1);  // everyone connected
      const absl::Time start = absl::Now();
      for (int r = 0; r < rounds; ++r) barrier(r);
      const int64_t ns = absl::ToInt64Nanoseconds(absl::Now() - start);
      int64_t cur = slowest_ns.load();
      while (ns > cur && !slowest_ns.compare_exchange_weak(cur, ns)) {
      }
    });
  }
  for (auto& t : threads) t.join();
  if (failed) return 1;
  std::printf("BARRIER %.9f\n", slowest_ns.load() / 1e9 / rounds);
  return 0;
}

double MedianUs(std::vector<double>& v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int Latency() {
  auto c = TcpStore::Create(Client(0));
  if (!c.ok()) Die(c.status());
  Store& s = **c;
  const int iters = absl::GetFlag(FLAGS_iters);
  std::vector<double> t(iters);
  auto time = [&](const char* name, auto&& op) {
    for (int i = 0; i < iters / 10; ++i) op(i);  // warm-up
    for (int i = 0; i < iters; ++i) {
      const absl::Time a = absl::Now();
      op(i);
      t[i] = absl::ToDoubleMicroseconds(absl::Now() - a);
    }
    std::printf("LAT %s %.2f\n", name, MedianUs(t));
  };
  time("set", [&](int i) {
    if (auto st = s.Set("lat/k", absl::StrCat(i)); !st.ok()) Die(st);
  });
  time("get", [&](int) {
    if (auto v = s.Get("lat/k"); !v.ok()) Die(v.status());
  });
  time("add", [&](int) {
    if (auto v = s.Add("lat/n", 1); !v.ok()) Die(v.status());
  });
  return 0;
}

int Throughput() {
  const int n = absl::GetFlag(FLAGS_count);
  const absl::Duration d = absl::Seconds(absl::GetFlag(FLAGS_seconds));
  std::vector<std::unique_ptr<TcpStore>> clients;
  for (int i = 0; i < n; ++i) {
    auto c = TcpStore::Create(Client(0));
    if (!c.ok()) Die(c.status());
    clients.push_back(*std::move(c));
  }
  std::atomic<int64_t> total{0};
  absl::Barrier* start = new absl::Barrier(n + 1);
  std::vector<std::thread> threads;
  absl::Time end;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      const std::string key = absl::StrCat("tp/", i % 8);
      if (start->Block()) delete start;
      int64_t ops = 0;
      while (absl::Now() < end) {
        if (auto v = clients[i]->Add(key, 1); !v.ok()) Die(v.status());
        ++ops;
      }
      total += ops;
    });
  }
  const absl::Time t0 = absl::Now();
  end = t0 + d;
  if (start->Block()) delete start;
  for (auto& t : threads) t.join();
  std::printf("OPS %lld %.6f\n", static_cast<long long>(total.load()),
              absl::ToDoubleSeconds(absl::Now() - t0));
  return 0;
}

int Listener(sockaddr_in* a) {
  int ls = socket(AF_INET, SOCK_STREAM, 0);
  *a = sockaddr_in{};
  a->sin_family = AF_INET;
  a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(ls, reinterpret_cast<sockaddr*>(a), sizeof(*a));
  socklen_t len = sizeof(*a);
  getsockname(ls, reinterpret_cast<sockaddr*>(a), &len);
  listen(ls, 1);
  return ls;
}

int AcceptNoDelay(int ls) {
  int c = accept(ls, nullptr, nullptr);
  int one = 1;
  setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return c;
}

// Median round trip of `rounds` 1-byte ping-pongs to `a` (after a warm-up).
double PingPong(const sockaddr_in& a, int iters) {
  const int warm = iters / 10;
  int c = socket(AF_INET, SOCK_STREAM, 0);
  connect(c, reinterpret_cast<const sockaddr*>(&a), sizeof(a));
  int one = 1;
  setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  std::vector<double> t(iters);
  char b = 'x';
  for (int i = 0; i < iters + warm; ++i) {
    const absl::Time s = absl::Now();
    send(c, &b, 1, 0);
    recv(c, &b, 1, 0);
    if (i >= warm) t[i - warm] = absl::ToDoubleMicroseconds(absl::Now() - s);
  }
  close(c);
  return MedianUs(t);
}

int Rtt() {
  const int iters = absl::GetFlag(FLAGS_iters);
  const int rounds = iters + iters / 10;
  sockaddr_in a;
  int ls = Listener(&a);
  std::thread echo([&] {
    int c = AcceptNoDelay(ls);
    char b;
    for (int i = 0; i < rounds; ++i) {
      if (recv(c, &b, 1, 0) != 1 || send(c, &b, 1, 0) != 1) break;
    }
    close(c);
  });
  const double same_process = PingPong(a, iters);
  echo.join();
  close(ls);
  std::printf("RTT %.2f\n", same_process);
  std::fflush(stdout);
  // The echo in another process, parked in epoll_wait between requests.
  ls = Listener(&a);
  const pid_t child = fork();
  if (child == 0) {
    int c = AcceptNoDelay(ls);
    int ep = epoll_create1(0);
    epoll_event ev{};
    ev.events = EPOLLIN;
    epoll_ctl(ep, EPOLL_CTL_ADD, c, &ev);
    char b;
    for (int i = 0; i < rounds; ++i) {
      if (epoll_wait(ep, &ev, 1, 60000) != 1) break;
      if (recv(c, &b, 1, MSG_DONTWAIT) != 1 || send(c, &b, 1, 0) != 1) break;
    }
    _exit(0);
  }
  const double cross_process = PingPong(a, iters);
  close(ls);
  waitpid(child, nullptr, 0);
  std::printf("RTT_EPOLL %.2f\n", cross_process);
  return 0;
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  ferry::RaiseFdLimit();
  const std::string mode = rest.size() > 1 ? rest[1] : "";
  if (mode == "server") return ferry::Server();
  if (mode == "init_clients") return ferry::InitClients();
  if (mode == "barrier") return ferry::Barrier();
  if (mode == "latency") return ferry::Latency();
  if (mode == "throughput") return ferry::Throughput();
  if (mode == "rtt") return ferry::Rtt();
  if (mode == "relay") return ferry::Relay();
  std::fprintf(stderr,
               "usage: store_bench server|init_clients|barrier|latency|"
               "throughput|rtt|relay [flags]\n");
  return 2;
}
