// TcpStoreServer: the TCPStore daemon on a libuv event loop.
//
// One loop thread owns all state (the key-value map, the queues, the
// connections, the waiters); nothing blocks on it. It serves PyTorch's
// TCPStore protocol in both generations (see tcp_store_protocol.h), picking
// the generation per connection from its first frame. Waiters (WAIT, and the
// WAIT a client sends before a blocking GET or queue pop) are woken by SET,
// ADD, COMPARE_SET, APPEND, MULTI_SET and QUEUE_PUSH without polling.
//
// A WAIT on a connection that already has one pending replaces it (the
// client gave up on the first: PyTorch 1.13's timed wait() does so on the
// same connection); on a legacy connection any query does, since 1.13 has no
// CANCEL_WAIT. An abandoned wait never answers. Design:
// docs/design/tcp_store_scaling.md.
// A client that breaks the protocol or a limit (garbage, wrong magic, an
// oversized length prefix, an unknown query type, a non-integer ADD from a
// non-Ferry client...) is logged in one line and disconnected; every other
// client carries on. Idle clients are never dropped (PyTorch 1.13 keeps a
// silent second connection open).
//
// Ferry extension, invisible to PyTorch clients that never send a bad ADD:
// an ADD on a non-integer value, or one that overflows, leaves the value
// unchanged and answers INT64_MIN instead of dropping the client; the Ferry
// client then reads the value to build a precise error.
// Start sets SIGPIPE to SIG_IGN when it still has the default disposition
// (libuv writes without MSG_NOSIGNAL; a client hanging up mid-response must
// not kill the process).
//
// Thread safety: Start, Stop, port, GetStats and WaitForWorkers are safe from
// any thread. Stop is idempotent; the destructor stops.
#ifndef FERRY_STORE_TCP_STORE_SERVER_H_
#define FERRY_STORE_TCP_STORE_SERVER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "ferry/common/sync.h"
#include "ferry/store/tcp_store_protocol.h"

namespace ferry {

// The TCPStore server: a libuv loop on a thread of its own.
class TcpStoreServer {
 public:
  // How Start binds and what it accepts.
  struct Options {
    // Address to bind. Empty: all interfaces, IPv6 dual-stack ("::") with
    // fallback to IPv4 ("0.0.0.0"). Otherwise a numeric IPv4/IPv6 address.
    std::string host;
    // 0 picks a free port; port() reports it.
    int port = 0;
    // Listen backlog, sized for a burst of thousands of connecting ranks
    // (the kernel caps it at net.core.somaxconn).
    int backlog = 65535;
    tcpstore::Limits limits;  // Sizes beyond which a client is dropped.
    // A client whose unread responses exceed this is dropped.
    size_t max_pending_write_bytes = 256 * 1024 * 1024;
    // Shared secret (store_auth.h). Non-empty: every connection must
    // authenticate before its first query, and one that does not (every
    // PyTorch client) is dropped before any key is read or written.
    std::string secret;
  };

  // Counters of the server (GetStats).
  struct Stats {
    int64_t clients = 0;   // connected now
    int64_t accepted = 0;  // since start
    int64_t dropped = 0;   // disconnected for a protocol or limit violation
    int64_t keys = 0;  // keys stored now
    int64_t ops = 0;  // frames handled since start
    // Connections blocked in WAIT now (client Get, Wait, MultiGet and
    // blocking QueuePop all wait this way): tests read it to know a waiter
    // is parked before they wake it.
    int64_t waiting = 0;
    // Connections dropped for failing or skipping authentication.
    int64_t refused = 0;
  };

  // Binds, listens and starts the loop thread. Errors (bind failure, port in
  // use) come back here, naming the address.
  static absl::StatusOr<std::unique_ptr<TcpStoreServer>> Start(
      const Options& options);

  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  int port() const { return port_; }  // The port bound.
  // "host:port" as bound, e.g. "[::]:29500" or "127.0.0.1:41234".
  const std::string& address() const { return address_; }

  // Closes the listener and every connection and joins the loop thread.
  // Idempotent; safe from any thread except the loop thread itself.
  void Stop();

  // The counters now.
  Stats GetStats() const;

  // Blocks until the integer at tcpstore::kInitKey (the count of workers that
  // have joined) reaches `world_size`, or `timeout` passes:
  // DeadlineExceeded "... k/N workers joined ...".
  absl::Status WaitForWorkers(int64_t world_size, absl::Duration timeout)
      ABSL_LOCKS_EXCLUDED(workers_mu_);

  // Loop-thread internals (public so the .cc's C callbacks can reach them).
  struct Loop;
  // Loop thread: the join count is now `count` (read by WaitForWorkers).
  void OnWorkersJoined(int64_t count) ABSL_LOCKS_EXCLUDED(workers_mu_);

 private:
  TcpStoreServer() = default;

  std::unique_ptr<Loop> loop_;
  std::thread thread_;
  int port_ = 0;
  std::string address_;
  std::atomic<bool> stopped_{false};
  Mutex stop_mu_;

  mutable Mutex workers_mu_;
  int64_t workers_joined_ ABSL_GUARDED_BY(workers_mu_) = 0;
};

}  // namespace ferry

#endif  // FERRY_STORE_TCP_STORE_SERVER_H_
