// TcpStoreRelay: a node-local TCPStore relay on a libuv loop.
//
// Local clients (Ferry's TcpStore, PyTorch's TCPStore, either protocol
// generation) connect to the relay as to a server; the relay carries their
// requests to the real server over ONE upstream connection (current
// generation), plus one upstream connection per key being waited on, and
// answers each client in its own order. Identical reads and same-key ADDs
// queued in the same loop turn, not yet sent, travel upstream once (ADD
// results are apportioned as if the adds ran one after another); every WAIT
// on a key shares one upstream WAIT. Rules and failure behaviour:
// docs/design/tcp_store_scaling.md ("Node relays").
//
// Failure: when an upstream connection breaks, the relay logs the server's
// address and the cause, closes every local connection (a waiting or pending
// call fails at once: Ferry's client with Unavailable, and it reopens the
// connection on its next call), and reconnects in the background; local
// connections accepted while the server is unreachable are closed at once.
// A local client that breaks the protocol is dropped alone; one that
// disconnects frees its waits (the upstream WAIT is cancelled when it was the
// key's last waiter). Authentication (store_auth.h) is not relayed: a local
// AUTH frame drops that client, and the upstream must have no secret.
//
// Thread safety: Start, Stop, port, address and GetStats are safe from any
// thread; Stop is idempotent and the destructor stops.
#ifndef FERRY_STORE_TCP_STORE_RELAY_H_
#define FERRY_STORE_TCP_STORE_RELAY_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ferry/common/sync.h"
#include "ferry/store/tcp_store_protocol.h"

namespace ferry {

// The relay: a libuv loop on a thread of its own.
class TcpStoreRelay {
 public:
  // Where it listens and what it relays to.
  struct Options {
    std::string host = "127.0.0.1";  // Numeric address to listen on.
    int port = 0;                    // 0 picks a free port.
    int backlog = 65535;             // Listen backlog.
    std::string upstream_host = "127.0.0.1";  // The server (numeric address).
    int upstream_port = 0;                    // The server's port.
    // Start fails when the server cannot be reached within this.
    absl::Duration connect_timeout = absl::Seconds(30);
    tcpstore::Limits limits;  // As the server's: beyond them a client drops.
    // A local client with more unread response bytes, or more requests
    // awaiting an answer, is dropped.
    size_t max_pending_write_bytes = 256 * 1024 * 1024;
    size_t max_pending_requests = 64 * 1024;
    // Upstream connections carrying WAITs (one distinct key each): keys
    // beyond this wait in a queue for a connection to free up; idle ones
    // beyond max_idle_wait_connections are closed.
    size_t max_wait_connections = 1024;
    size_t max_idle_wait_connections = 8;
    // Backpressure: with more bytes than this written to the server and not
    // yet taken by the kernel, the relay reads from no local client until
    // half of them drained (a client flooding SETs cannot grow it beyond
    // this and one loop turn's reads).
    size_t max_upstream_queue_bytes = 64 * 1024 * 1024;
    // The store's shared secret (store_auth.h): the relay proves it on each
    // connection to the server and requires it of its local clients (so
    // PyTorch's clients, which cannot prove one, are refused). "": none.
    std::string secret;
  };

  // Counters (GetStats).
  struct Stats {
    int64_t clients = 0;    // local connections now
    int64_t accepted = 0;   // local connections since start
    int64_t dropped = 0;    // local clients dropped for a protocol violation
    int64_t local_requests = 0;     // frames from local clients
    int64_t upstream_requests = 0;  // frames sent upstream (WAITs included)
    int64_t coalesced = 0;  // local requests answered by another's upstream
    int64_t upstream_waits = 0;     // upstream WAITs pending now
    // Local WAITs registered upstream and not yet answered (tests read it to
    // know a waiter is parked before they wake it).
    int64_t waiting = 0;
    int64_t upstream_losses = 0;    // upstream connections lost
    bool upstream_connected = false;
    // Bytes queued to the server after the last flush; times the relay
    // stopped reading its clients for max_upstream_queue_bytes.
    int64_t upstream_queue_bytes = 0;
    int64_t throttles = 0;  // See upstream_queue_bytes.
  };

  // Binds, connects upstream and starts the loop thread. Errors: a bind
  // failure naming the address; Unavailable naming the server when it
  // cannot be reached within connect_timeout.
  static absl::StatusOr<std::unique_ptr<TcpStoreRelay>> Start(
      const Options& options);

  ~TcpStoreRelay();
  TcpStoreRelay(const TcpStoreRelay&) = delete;
  TcpStoreRelay& operator=(const TcpStoreRelay&) = delete;

  int port() const { return port_; }  // The port bound.
  const std::string& address() const { return address_; }  // "host:port"
  // "host:port" of the server.
  const std::string& upstream() const { return upstream_; }

  // Closes every connection and joins the loop thread; idempotent.
  void Stop();

  Stats GetStats() const;

  struct Loop;  // Loop-thread internals (the .cc's C callbacks reach them).

 private:
  TcpStoreRelay() = default;

  std::unique_ptr<Loop> loop_;
  std::thread thread_;
  int port_ = 0;
  std::string address_;
  std::string upstream_;
  std::atomic<bool> stopped_{false};
  Mutex stop_mu_;
};

}  // namespace ferry

#endif  // FERRY_STORE_TCP_STORE_RELAY_H_
