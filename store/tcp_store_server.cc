#include "ferry/store/tcp_store_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <uv.h>

#include <algorithm>
#include <deque>
#include <limits>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "ferry/common/logging.h"
#include "ferry/store/store_auth.h"
#include "ferry/store/tcp_store_uv.h"

namespace ferry {

using tcpstore::FrameParser;
using tcpstore::Op;
using tcpstore::Request;
using tcpstore::UvError;

namespace {

constexpr size_t kReadBufferBytes = 64 * 1024;

struct Conn;

}  // namespace

struct TcpStoreServer::Loop {
  explicit Loop(TcpStoreServer* o, const Options& opts)
      : owner(o), options(opts), read_buf(kReadBufferBytes) {}

  TcpStoreServer* owner;
  Options options;
  uv_loop_t loop{};
  uv_tcp_t listener{};
  uv_async_t stop_async{};
  bool listener_open = false;
  uint64_t next_id = 1;
  absl::flat_hash_map<uint64_t, Conn*> conns;
  absl::flat_hash_map<std::string, std::string> kv;
  absl::flat_hash_map<std::string, std::deque<std::string>> queues;
  absl::flat_hash_map<std::string, std::vector<uint64_t>> waiters;
  std::vector<char> read_buf;
  Request request;  // reused across frames

  std::atomic<int64_t> clients{0};
  std::atomic<int64_t> accepted{0};
  // Connections with a pending WAIT (kWait in, Wake or ClearWait out).
  std::atomic<int64_t> waiting{0};
  std::atomic<int64_t> dropped{0};
  std::atomic<int64_t> refused{0};
  std::atomic<int64_t> keys{0};
  std::atomic<int64_t> ops{0};

  // Loop-thread only.
  void OnConnection(int status);
  void OnRead(Conn* c, ssize_t nread);
  void Handle(Conn* c, const Request& r);
  // With a secret: runs the handshake; false when `r` must not be handled
  // (answered here, or the connection dropped).
  bool Authenticate(Conn* c, const Request& r);
  void Flush(Conn* c);
  void Drop(Conn* c, absl::string_view reason);
  void Close(Conn* c);
  void ClearWait(Conn* c);
  void WakeAll(const std::string& key);
  void WakeOne(const std::string& key);
  void Wake(Conn* c);
  bool Exists(const std::string& key) const;
  void StopNow();
  void UpdateKeys() {
    keys.store(static_cast<int64_t>(kv.size()), std::memory_order_relaxed);
  }
};

namespace {

struct Conn {
  Conn(TcpStoreServer::Loop* l, uint64_t i)
      : loop(l), id(i), parser(l->options.limits) {}
  uv_tcp_t tcp{};
  TcpStoreServer::Loop* loop;
  uint64_t id;
  std::string peer = "unknown";
  FrameParser parser;
  std::string inbuf;
  std::string outbuf;
  int64_t wait_remaining = 0;
  std::vector<std::string> wait_keys;
  bool closing = false;
  bool registered = false;
  bool authenticated = false;
  std::string client_nonce;  // set by AUTH_CHALLENGE
  std::string server_nonce;
};

uv_stream_t* Stream(Conn* c) { return reinterpret_cast<uv_stream_t*>(&c->tcp); }

void OnClosed(uv_handle_t* h) { delete static_cast<Conn*>(h->data); }

void AllocCb(uv_handle_t* h, size_t, uv_buf_t* buf) {
  auto* c = static_cast<Conn*>(h->data);
  // One buffer per loop suffices: libuv hands it to the read callback before
  // the next allocation, and the read callback copies what it keeps.
  *buf = uv_buf_init(c->loop->read_buf.data(), c->loop->read_buf.size());
}

void ReadCb(uv_stream_t* s, ssize_t nread, const uv_buf_t*) {
  auto* c = static_cast<Conn*>(s->data);
  c->loop->OnRead(c, nread);
}

void WriteDone(uv_stream_t* s, int status) {
  if (status < 0 && status != UV_ECANCELED) {
    auto* c = static_cast<Conn*>(s->data);
    c->loop->Drop(c, absl::StrCat("write failed: ", UvError(status)));
  }
}

void ConnectionCb(uv_stream_t* server, int status) {
  static_cast<TcpStoreServer::Loop*>(server->data)->OnConnection(status);
}

void StopCb(uv_async_t* a) {
  static_cast<TcpStoreServer::Loop*>(a->data)->StopNow();
}

}  // namespace

void TcpStoreServer::Loop::OnConnection(int status) {
  if (status < 0) {
    FERRY_LOG(WARNING) << "tcp store server: accept failed: "
                       << UvError(status);
    return;
  }
  auto* c = new Conn(this, next_id++);
  uv_tcp_init(&loop, &c->tcp);
  c->tcp.data = c;
  int rc = uv_accept(reinterpret_cast<uv_stream_t*>(&listener), Stream(c));
  if (rc != 0) {
    FERRY_LOG(WARNING) << "tcp store server: accept failed: " << UvError(rc);
    c->closing = true;
    uv_close(reinterpret_cast<uv_handle_t*>(&c->tcp), OnClosed);
    return;
  }
  uv_tcp_nodelay(&c->tcp, 1);
  c->peer = tcpstore::EndpointName(&c->tcp, /*peer=*/true);
  conns.emplace(c->id, c);
  c->registered = true;
  clients.fetch_add(1, std::memory_order_relaxed);
  accepted.fetch_add(1, std::memory_order_relaxed);
  rc = uv_read_start(Stream(c), AllocCb, ReadCb);
  if (rc != 0) Drop(c, absl::StrCat("read start failed: ", UvError(rc)));
}

void TcpStoreServer::Loop::OnRead(Conn* c, ssize_t nread) {
  if (c->closing) return;
  if (nread < 0) {
    if (c->wait_remaining > 0) {
      FERRY_LOG(WARNING) << "tcp store server: client " << c->peer
                         << " disconnected while waiting for "
                         << c->wait_remaining << " key(s)";
    } else if (nread != UV_EOF) {
      FERRY_LOG(INFO) << "tcp store server: client " << c->peer
                      << " read error: " << UvError(static_cast<int>(nread));
    }
    Close(c);
    return;
  }
  if (nread == 0) return;
  absl::string_view data;
  const bool buffered = !c->inbuf.empty();
  if (buffered) {
    c->inbuf.append(read_buf.data(), nread);
    data = c->inbuf;
  } else {
    data = absl::string_view(read_buf.data(), nread);
  }
  size_t offset = 0;
  while (!c->closing) {
    size_t consumed = 0;
    FrameParser::Result r =
        c->parser.Parse(data.substr(offset), &request, &consumed);
    if (r == FrameParser::Result::kNeedMore) break;
    if (r == FrameParser::Result::kError) {
      Drop(c, c->parser.error().message());
      return;
    }
    offset += consumed;
    ops.fetch_add(1, std::memory_order_relaxed);
    // A legacy (PyTorch 1.13) client has no CANCEL_WAIT and sends nothing
    // while it waits: any query on a connection with a pending WAIT means its
    // wait() timed out, so the wait is dropped before it can answer out of
    // turn. (Current clients cancel with CANCEL_WAIT and may pipeline.)
    if (c->wait_remaining > 0 &&
        c->parser.generation() == tcpstore::Generation::kLegacy) {
      ClearWait(c);
    }
    if (Authenticate(c, request)) Handle(c, request);
  }
  if (c->closing) return;
  if (buffered) {
    c->inbuf.erase(0, offset);
  } else {
    c->inbuf.assign(data.data() + offset, data.size() - offset);
  }
  Flush(c);
}

bool TcpStoreServer::Loop::Exists(const std::string& key) const {
  if (kv.contains(key)) return true;
  auto it = queues.find(key);
  return it != queues.end() && !it->second.empty();
}

void TcpStoreServer::Loop::Wake(Conn* c) {
  waiting.fetch_sub(1, std::memory_order_relaxed);
  c->wait_keys.clear();
  tcpstore::PutU8(&c->outbuf, tcpstore::kStopWaiting);
  Flush(c);
}

void TcpStoreServer::Loop::WakeAll(const std::string& key) {
  auto it = waiters.find(key);
  if (it == waiters.end()) return;
  std::vector<uint64_t> ids = std::move(it->second);
  waiters.erase(it);
  for (uint64_t id : ids) {
    auto cit = conns.find(id);
    if (cit == conns.end()) continue;
    Conn* w = cit->second;
    if (w->wait_remaining > 0 && --w->wait_remaining == 0) Wake(w);
  }
}

// A pushed item can satisfy one popper; waking them all would only make the
// rest find the queue empty again.
void TcpStoreServer::Loop::WakeOne(const std::string& key) {
  auto it = waiters.find(key);
  if (it == waiters.end()) return;
  std::vector<uint64_t>& ids = it->second;
  size_t i = 0;
  Conn* woken = nullptr;
  for (; i < ids.size() && woken == nullptr; ++i) {
    auto cit = conns.find(ids[i]);
    if (cit == conns.end()) continue;
    Conn* w = cit->second;
    if (w->wait_remaining > 0 && --w->wait_remaining == 0) woken = w;
  }
  ids.erase(ids.begin(), ids.begin() + i);
  if (ids.empty()) waiters.erase(it);
  if (woken != nullptr) Wake(woken);
}

void TcpStoreServer::Loop::ClearWait(Conn* c) {
  for (const std::string& k : c->wait_keys) {
    auto it = waiters.find(k);
    if (it == waiters.end()) continue;
    auto& ids = it->second;
    ids.erase(std::remove(ids.begin(), ids.end(), c->id), ids.end());
    if (ids.empty()) waiters.erase(it);
  }
  c->wait_keys.clear();
  if (c->wait_remaining > 0) waiting.fetch_sub(1, std::memory_order_relaxed);
  c->wait_remaining = 0;
}

bool TcpStoreServer::Loop::Authenticate(Conn* c, const Request& r) {
  const bool auth_op = r.op == Op::kAuthChallenge || r.op == Op::kAuthProof;
  if (options.secret.empty()) {
    if (!auth_op) return true;
    Drop(c, absl::StrCat("client sent ", tcpstore::OpName(r.op),
                         " but this store has no secret (it does not "
                         "authenticate clients)"));
    return false;
  }
  if (c->authenticated) {
    if (!auth_op) return true;
    Drop(c, "authentication repeated on an authenticated connection");
    return false;
  }
  auto refuse = [&](absl::string_view why) {
    refused.fetch_add(1, std::memory_order_relaxed);
    Drop(c, absl::StrCat("authentication refused: ", why));
  };
  switch (r.op) {
    case Op::kValidate:
      return true;  // PyTorch's handshake frame touches nothing.
    case Op::kAuthChallenge:
      if (!c->client_nonce.empty() ||
          r.keys[0].size() != tcpstore::kAuthNonceBytes) {
        refuse("malformed AUTH_CHALLENGE");
        return false;
      }
      c->client_nonce = r.keys[0];
      c->server_nonce = tcpstore::RandomNonce();
      tcpstore::PutBytes(&c->outbuf, c->server_nonce);
      tcpstore::PutBytes(&c->outbuf,
                         tcpstore::AuthProof(options.secret, "server",
                                             c->client_nonce, c->server_nonce));
      return false;
    case Op::kAuthProof:
      if (c->client_nonce.empty()) {
        refuse("AUTH_PROOF before AUTH_CHALLENGE");
        return false;
      }
      if (!tcpstore::ProofsEqual(
              r.keys[0],
              tcpstore::AuthProof(options.secret, "client", c->client_nonce,
                                  c->server_nonce))) {
        // Tell the client before closing, so it can say "wrong secret".
        tcpstore::PutU8(&c->outbuf, tcpstore::kAuthRefused);
        Flush(c);
        refuse("wrong secret");
        return false;
      }
      c->authenticated = true;
      tcpstore::PutU8(&c->outbuf, tcpstore::kAuthAccepted);
      return false;
    default:
      refuse(absl::StrCat("unauthenticated client sent ",
                          tcpstore::OpName(r.op),
                          " (this store requires a shared secret; PyTorch "
                          "clients cannot authenticate)"));
      return false;
  }
}

void TcpStoreServer::Loop::Handle(Conn* c, const Request& r) {
  std::string& out = c->outbuf;
  const tcpstore::Limits& limits = options.limits;
  switch (r.op) {
    case Op::kValidate:
      return;
    case Op::kPing:
      tcpstore::PutU32(&out, r.nonce);
      return;
    case Op::kSet:
      kv[r.keys[0]] = r.values[0];
      UpdateKeys();
      WakeAll(r.keys[0]);
      return;
    case Op::kCompareSet: {
      const std::string& key = r.keys[0];
      auto it = kv.find(key);
      if (it == kv.end()) {
        if (r.values[0].empty()) {
          kv.emplace(key, r.values[1]);
          UpdateKeys();
          tcpstore::PutBytes(&out, r.values[1]);
          WakeAll(key);
        } else {
          tcpstore::PutBytes(&out, r.values[0]);
        }
        return;
      }
      if (it->second == r.values[0]) it->second = r.values[1];
      tcpstore::PutBytes(&out, it->second);
      WakeAll(key);
      return;
    }
    case Op::kGet: {
      auto it = kv.find(r.keys[0]);
      tcpstore::PutBytes(&out,
                         it == kv.end() ? absl::string_view() : it->second);
      return;
    }
    case Op::kAdd: {
      const std::string& key = r.keys[0];
      auto it = kv.find(key);
      int64_t current = 0;
      int64_t sum = 0;
      if ((it != kv.end() && !absl::SimpleAtoi(it->second, &current)) ||
          __builtin_add_overflow(current, r.delta, &sum)) {
        // Ferry extension: see the header. PyTorch's server drops the client.
        tcpstore::PutU64(
            &out, static_cast<uint64_t>(std::numeric_limits<int64_t>::min()));
        return;
      }
      if (it == kv.end()) {
        kv.emplace(key, absl::StrCat(sum));
        UpdateKeys();
      } else {
        it->second = absl::StrCat(sum);
      }
      tcpstore::PutU64(&out, static_cast<uint64_t>(sum));
      if (key == tcpstore::kInitKey) owner->OnWorkersJoined(sum);
      WakeAll(key);
      return;
    }
    case Op::kCheck: {
      bool ready = std::all_of(r.keys.begin(), r.keys.end(),
                               [&](const std::string& k) { return Exists(k); });
      tcpstore::PutU8(&out,
                      ready ? tcpstore::kCheckReady : tcpstore::kCheckNotReady);
      return;
    }
    case Op::kWait: {
      // A WAIT while one is pending: the client gave up on the first (a
      // PyTorch 1.13 wait() that timed out sends its next WAIT on the same
      // connection). The newer one replaces it, and the abandoned one never
      // answers.
      ClearWait(c);
      for (const std::string& k : r.keys) {
        if (Exists(k)) continue;
        waiters[k].push_back(c->id);
        c->wait_keys.push_back(k);
        ++c->wait_remaining;
      }
      if (c->wait_remaining == 0) {
        tcpstore::PutU8(&out, tcpstore::kStopWaiting);
      } else {
        waiting.fetch_add(1, std::memory_order_relaxed);
      }
      return;
    }
    case Op::kGetNumKeys:
      tcpstore::PutU64(&out, kv.size());
      return;
    case Op::kDeleteKey: {
      const size_t n = kv.erase(r.keys[0]);
      UpdateKeys();
      tcpstore::PutU64(&out, n);
      return;
    }
    case Op::kAppend: {
      std::string& v = kv[r.keys[0]];
      if (v.size() + r.values[0].size() > limits.max_value_bytes) {
        if (v.empty()) kv.erase(r.keys[0]);
        Drop(c, absl::StrCat("APPEND would grow a value past the limit of ",
                             limits.max_value_bytes, " bytes"));
        return;
      }
      v.append(r.values[0]);
      UpdateKeys();
      WakeAll(r.keys[0]);
      return;
    }
    case Op::kMultiGet:
      for (const std::string& k : r.keys) {
        auto it = kv.find(k);
        tcpstore::PutBytes(&out,
                           it == kv.end() ? absl::string_view() : it->second);
      }
      return;
    case Op::kMultiSet:
      for (size_t i = 0; i < r.keys.size(); ++i) kv[r.keys[i]] = r.values[i];
      UpdateKeys();
      for (const std::string& k : r.keys) WakeAll(k);
      return;
    case Op::kCancelWait:
      ClearWait(c);
      tcpstore::PutU8(&out, tcpstore::kWaitCanceled);
      return;
    case Op::kQueuePush:
      queues[r.keys[0]].push_back(r.values[0]);
      WakeOne(r.keys[0]);
      return;
    case Op::kQueuePop: {
      auto it = queues.find(r.keys[0]);
      const size_t len = it == queues.end() ? 0 : it->second.size();
      tcpstore::PutU64(&out, len);
      if (len > 0) {
        tcpstore::PutBytes(&out, it->second.front());
        it->second.pop_front();
        if (it->second.empty()) queues.erase(it);
      }
      return;
    }
    case Op::kQueueLen: {
      auto it = queues.find(r.keys[0]);
      tcpstore::PutU64(&out, it == queues.end() ? 0 : it->second.size());
      return;
    }
    case Op::kWatchKey:
      Drop(c, "WATCH_KEY (PyTorch 1.13 watchKey) is not supported");
      return;
    case Op::kAuthChallenge:
    case Op::kAuthProof:
      return;  // Answered by Authenticate.
  }
}

void TcpStoreServer::Loop::Flush(Conn* c) {
  if (c->closing) return;
  const std::string failed = tcpstore::WriteOut(
      Stream(c), &c->outbuf, options.max_pending_write_bytes, WriteDone);
  if (!failed.empty()) Drop(c, failed);
}

void TcpStoreServer::Loop::Drop(Conn* c, absl::string_view reason) {
  if (c->closing) return;
  FERRY_LOG(WARNING) << "tcp store server: dropping client " << c->peer << ": "
                     << reason;
  dropped.fetch_add(1, std::memory_order_relaxed);
  Close(c);
}

void TcpStoreServer::Loop::Close(Conn* c) {
  if (c->closing) return;
  c->closing = true;
  ClearWait(c);
  if (c->registered) {
    conns.erase(c->id);
    clients.fetch_sub(1, std::memory_order_relaxed);
  }
  uv_close(reinterpret_cast<uv_handle_t*>(&c->tcp), OnClosed);
}

void TcpStoreServer::Loop::StopNow() {
  if (listener_open) {
    listener_open = false;
    uv_close(reinterpret_cast<uv_handle_t*>(&listener), nullptr);
  }
  std::vector<Conn*> all;
  all.reserve(conns.size());
  for (auto& [id, c] : conns) all.push_back(c);
  for (Conn* c : all) Close(c);
  uv_close(reinterpret_cast<uv_handle_t*>(&stop_async), nullptr);
}

// ---------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<TcpStoreServer>> TcpStoreServer::Start(
    const Options& options) {
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("tcp store server: port ", options.port, " out of range"));
  }
  // libuv writes with write(2), not send(MSG_NOSIGNAL): a client that hangs
  // up before reading its response must not kill the process with SIGPIPE.
  // Only a default disposition is changed (CPython already ignores it).
  tcpstore::IgnoreDefaultSigpipe();
  std::unique_ptr<TcpStoreServer> server(new TcpStoreServer);
  server->loop_ = std::make_unique<Loop>(server.get(), options);
  Loop* l = server->loop_.get();
  int rc = uv_loop_init(&l->loop);
  if (rc != 0) {
    return absl::InternalError(absl::StrCat("uv_loop_init: ", UvError(rc)));
  }
  // Closes handles and the loop when setup fails part way.
  auto abandon = [l](absl::Status status) {
    tcpstore::AbandonLoop(&l->loop);
    return status;
  };
  uv_async_init(&l->loop, &l->stop_async, StopCb);
  l->stop_async.data = l;

  std::vector<std::string> hosts;
  if (options.host.empty()) {
    hosts = {"::", "0.0.0.0"};
  } else {
    hosts = {options.host};
  }
  std::string last_error;
  for (const std::string& host : hosts) {
    sockaddr_storage addr{};
    if (uv_ip6_addr(host.c_str(), options.port,
                    reinterpret_cast<sockaddr_in6*>(&addr)) != 0 &&
        uv_ip4_addr(host.c_str(), options.port,
                    reinterpret_cast<sockaddr_in*>(&addr)) != 0) {
      return abandon(absl::InvalidArgumentError(
          absl::StrCat("tcp store server: host '", host,
                       "' is not a numeric IPv4/IPv6 address")));
    }
    uv_tcp_init(&l->loop, &l->listener);
    l->listener.data = l;
    rc = uv_tcp_bind(&l->listener, reinterpret_cast<sockaddr*>(&addr), 0);
    if (rc == 0) {
      rc = uv_listen(reinterpret_cast<uv_stream_t*>(&l->listener),
                     options.backlog, ConnectionCb);
    }
    if (rc == 0) {
      l->listener_open = true;
      break;
    }
    last_error = absl::StrCat(host, ":", options.port, ": ", UvError(rc));
    uv_close(reinterpret_cast<uv_handle_t*>(&l->listener), nullptr);
    uv_run(&l->loop, UV_RUN_NOWAIT);
  }
  if (!l->listener_open) {
    return abandon(absl::UnavailableError(
        absl::StrCat("tcp store server: cannot listen on ", last_error)));
  }
  server->port_ = tcpstore::BoundPort(&l->listener);
  server->address_ = tcpstore::EndpointName(&l->listener, /*peer=*/false);
  server->thread_ = std::thread([l] {
    uv_run(&l->loop, UV_RUN_DEFAULT);
    // Every handle is closed by StopNow; drain their close callbacks.
    while (uv_loop_close(&l->loop) == UV_EBUSY) uv_run(&l->loop, UV_RUN_NOWAIT);
  });
  FERRY_LOG(INFO) << "tcp store server listening on " << server->address_;
  return server;
}

TcpStoreServer::~TcpStoreServer() { Stop(); }

void TcpStoreServer::Stop() {
  MutexLock lock(&stop_mu_);
  if (stopped_.exchange(true)) return;
  if (!thread_.joinable()) return;
  uv_async_send(&loop_->stop_async);
  thread_.join();
}

TcpStoreServer::Stats TcpStoreServer::GetStats() const {
  Stats s;
  s.clients = loop_->clients.load(std::memory_order_relaxed);
  s.accepted = loop_->accepted.load(std::memory_order_relaxed);
  s.dropped = loop_->dropped.load(std::memory_order_relaxed);
  s.keys = loop_->keys.load(std::memory_order_relaxed);
  s.ops = loop_->ops.load(std::memory_order_relaxed);
  s.waiting = loop_->waiting.load(std::memory_order_relaxed);
  s.refused = loop_->refused.load(std::memory_order_relaxed);
  return s;
}

void TcpStoreServer::OnWorkersJoined(int64_t count) {
  MutexLock lock(&workers_mu_);
  workers_joined_ = count;
}

absl::Status TcpStoreServer::WaitForWorkers(int64_t world_size,
                                            absl::Duration timeout) {
  const absl::Time start = absl::Now();
  MutexLock lock(&workers_mu_);
  auto done = [this, world_size]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(workers_mu_) {
    return workers_joined_ >= world_size;
  };
  if (workers_mu_.AwaitWithTimeout(absl::Condition(&done), timeout)) {
    return absl::OkStatus();
  }
  return absl::DeadlineExceededError(
      absl::StrCat("tcp://", address_, ": timed out after ",
                   absl::FormatDuration(absl::Now() - start),
                   " waiting for workers: ", workers_joined_, "/", world_size,
                   " workers joined (key \"", tcpstore::kInitKey, "\")"));
}

}  // namespace ferry
