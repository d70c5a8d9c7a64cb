// TcpStore: a Store client speaking PyTorch's TCPStore protocol, optionally
// hosting the server (TcpStoreServer, libuv) in-process.
//
//   TcpStoreOptions o;
//   o.host = "127.0.0.1"; o.port = 29500;
//   o.is_server = (rank == 0); o.world_size = world;
//   ASSIGN_OR_RETURN(std::unique_ptr<TcpStore> store, TcpStore::Create(o));
//
// Semantics follow torch.distributed.TCPStore: user keys travel with a "/"
// prefix (so Ferry and PyTorch clients share keys); with world_size set,
// every handle adds 1 to "init/" on creation and the server handle waits
// (wait_for_workers) until world_size have joined, failing with
// DeadlineExceeded "k/N workers joined" when they do not come in time.
//
// Connecting retries with jittered exponential backoff until the timeout,
// then fails with Unavailable naming host:port, the attempts and the last
// error. A connection that breaks is reopened by the next operation.
//
// legacy_protocol speaks PyTorch 1.13's protocol (no VALIDATE, SET = 0) so
// this client can use a PyTorch 1.13 server; 1.13 has no queues, so the
// queue operations are Unimplemented there, Append is emulated with
// COMPARE_SET, and a timed-out Wait reopens the connection (1.13 has no
// CANCEL_WAIT).
//
// Thread safety: all operations are safe from many threads; they serialize
// on the connection (one request in flight per handle). Use Clone() for
// parallel requests. A clone of the server handle shares ownership of the
// server, so the server lives until the last handle is gone.
#ifndef FERRY_STORE_TCP_STORE_H_
#define FERRY_STORE_TCP_STORE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "ferry/common/sync.h"
#include "ferry/store/store.h"
#include "ferry/store/tcp_store_protocol.h"
#include "ferry/store/tcp_store_server.h"

namespace ferry {

// Where the store is and how to reach it; TcpStore::Create's argument.
struct TcpStoreOptions {
  std::string host = "127.0.0.1";  // the server's host name or address
  // With is_server, 0 picks a free port (TcpStore::port() reports it).
  int port = 29500;
  bool is_server = false;  // This handle hosts the server in-process.
  // Number of handles expected to join (PyTorch's world_size); unset: no
  // join accounting.
  std::optional<int64_t> world_size;
  bool wait_for_workers = true;  // The server handle waits (see above).
  absl::Duration timeout = Store::kDefaultTimeout;  // Timeout() at start.
  // Speak PyTorch 1.13's protocol (see above).
  bool legacy_protocol = false;
  // Client-side checks, and the server's limits when is_server.
  tcpstore::Limits limits;
  // When is_server: bind address ("" = all interfaces, IPv6 with IPv4
  // fallback). Default: `host` if it is a numeric address, else "".
  std::optional<std::string> bind_host;
  // Shared secret (store/store_auth.h): the client proves it on every
  // connection, and when is_server the hosted server requires it. Empty: no
  // authentication (PyTorch-compatible). A store that refuses the secret, or
  // has none, fails Create / the operation with PermissionDenied.
  std::string secret;
};

// A TCPStore client handle (see the top of this file).
class TcpStore : public Store {
 public:
  // Connects (hosting the server first when options.is_server). Errors: the
  // server's bind failure; Unavailable when no connection succeeds before the
  // timeout; PermissionDenied on a refused secret; DeadlineExceeded when the
  // workers do not join in time (see above).
  static absl::StatusOr<std::unique_ptr<TcpStore>> Create(
      const TcpStoreOptions& options);

  ~TcpStore() override;

  absl::Status Set(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<std::string> Get(absl::string_view key) override;
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) override;
  absl::StatusOr<std::string> CompareSet(absl::string_view key,
                                         absl::string_view expected,
                                         absl::string_view desired) override;
  absl::StatusOr<bool> Check(absl::Span<const std::string> keys) override;
  using Store::Wait;
  absl::Status Wait(absl::Span<const std::string> keys,
                    std::optional<absl::Duration> timeout) override;
  absl::StatusOr<bool> DeleteKey(absl::string_view key) override;
  absl::StatusOr<int64_t> NumKeys() override;
  absl::StatusOr<std::vector<std::string>> MultiGet(
      absl::Span<const std::string> keys) override;
  absl::Status MultiSet(absl::Span<const std::string> keys,
                        absl::Span<const std::string> values) override;
  absl::Status Append(absl::string_view key, absl::string_view value) override;
  absl::Status QueuePush(absl::string_view key,
                         absl::string_view value) override;
  absl::StatusOr<std::string> QueuePop(
      absl::string_view key, bool block,
      std::optional<absl::Duration> timeout = std::nullopt) override;
  absl::StatusOr<int64_t> QueueLen(absl::string_view key) override;
  absl::StatusOr<std::unique_ptr<Store>> Clone() override;
  std::string Describe() const override;

  // Round trip with a PING (current protocol only).
  absl::Status Ping();

  int port() const { return port_; }  // The server's port (as bound).
  const std::string& host() const { return options_.host; }  // As given.
  // The in-process server when this handle (or the handle it was cloned
  // from) hosts it; nullptr otherwise.
  TcpStoreServer* server() const { return server_.get(); }

 private:
  TcpStore(const TcpStoreOptions& options,
           std::shared_ptr<TcpStoreServer> server, int port);

  // Everything below runs with mu_ held.
  absl::Status EnsureConnected() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Disconnect() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The store_auth.h handshake on a fresh connection; PermissionDenied when
  // the server refuses us or does not prove the secret.
  absl::Status AuthenticateLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status SendFrame(const std::string& frame)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reads exactly n bytes by `deadline`; DeadlineExceeded (connection kept)
  // when nothing at all arrived, Unavailable on a broken connection.
  absl::Status Recv(size_t n, absl::Time deadline, std::string* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Arms `option` (SO_RCVTIMEO/SO_SNDTIMEO) so a blocking call ends by
  // `deadline`; false when the deadline has passed.
  bool SetSocketTimeout(absl::Time deadline, int option, absl::Duration* cached)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<uint8_t> RecvU8(absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<int64_t> RecvI64(absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::string> RecvBytes(absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void BeginFrame(std::string* frame, tcpstore::Op op)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits for the (already prefixed) keys; reports misses by user key.
  absl::Status WaitLocked(const std::vector<std::string>& wire_keys,
                          absl::Duration timeout, absl::string_view op)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::vector<std::string>> MissingLocked(
      const std::vector<std::string>& wire_keys)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::string> CompareSetLocked(const std::string& wire_key,
                                               absl::string_view expected,
                                               absl::string_view desired)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<int64_t> AddLocked(const std::string& wire_key, int64_t delta,
                                    absl::string_view user_key)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Status CheckKey(absl::string_view op, absl::string_view key) const;
  absl::Status CheckValue(absl::string_view op, absl::string_view key,
                          absl::string_view value) const;
  absl::Status CheckCount(absl::string_view op, size_t n) const;
  absl::Time ResponseDeadline() const { return absl::Now() + Timeout(); }
  // Annotates a transport error with the operation and store.
  absl::Status Fail(absl::string_view op, const absl::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string Wire(absl::string_view key) const;

  const TcpStoreOptions options_;
  const tcpstore::Generation generation_;
  std::shared_ptr<TcpStoreServer> server_;
  const int port_;
  const std::string describe_;

  Mutex mu_;
  int fd_ ABSL_GUARDED_BY(mu_) = -1;
  // Received bytes not yet consumed are rbuf_[rpos_, rend_).
  std::string rbuf_ ABSL_GUARDED_BY(mu_);
  size_t rpos_ ABSL_GUARDED_BY(mu_) = 0;
  size_t rend_ ABSL_GUARDED_BY(mu_) = 0;
  // The SO_RCVTIMEO / SO_SNDTIMEO currently armed on fd_.
  absl::Duration rcv_timeout_ ABSL_GUARDED_BY(mu_);
  absl::Duration snd_timeout_ ABSL_GUARDED_BY(mu_);
  uint32_t ping_nonce_ ABSL_GUARDED_BY(mu_) = 1;
};

// The factory the init_method layer uses for tcp:// and env:// addresses
// (the same type as init_method.h's TcpStoreFactory; StoreFactories::tcp).
// world_size <= 0 means no join accounting. The secret comes from
// FERRY_STORE_SECRET_FILE or FERRY_STORE_SECRET (store_auth.h).
std::function<absl::StatusOr<std::unique_ptr<Store>>(
    const std::string& host, int port, bool is_server, int world_size,
    absl::Duration timeout)>
MakeTcpStoreFactory();

}  // namespace ferry

#endif  // FERRY_STORE_TCP_STORE_H_
