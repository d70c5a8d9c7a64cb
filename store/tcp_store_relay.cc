#include "ferry/store/tcp_store_relay.h"

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
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "ferry/common/logging.h"
#include "ferry/store/store_auth.h"
#include "ferry/store/tcp_store_uv.h"

namespace ferry {

using tcpstore::FrameParser;
using tcpstore::Generation;
using tcpstore::Op;
using tcpstore::Request;
using tcpstore::UvError;

namespace {

constexpr size_t kReadBufferBytes = 64 * 1024;
constexpr int64_t kAddRefused = std::numeric_limits<int64_t>::min();

// Identical unsent requests share this key (op and first key).
std::string JoinKey(const Request& r) {
  return absl::StrCat(static_cast<int>(r.op), "/", r.keys[0]);
}

bool ParseAddress(const std::string& host, int port, sockaddr_storage* addr) {
  return uv_ip6_addr(host.c_str(), port,
                     reinterpret_cast<sockaddr_in6*>(addr)) == 0 ||
         uv_ip4_addr(host.c_str(), port,
                     reinterpret_cast<sockaddr_in*>(addr)) == 0;
}

struct LocalConn;

// One response owed to a local client, in that client's order. A WAIT's
// slot that is not answered when it reaches the front is passed over
// (`deferred`) and answers whenever its keys appear, as the server's WAIT.
struct Slot {
  LocalConn* conn;  // nullptr once the client is gone
  std::string bytes;
  bool ready = false;
  bool is_wait = false;
  bool deferred = false;
};
using SlotPtr = std::shared_ptr<Slot>;

// A local WAIT: the keys it still waits for upstream.
struct LocalWait {
  uint64_t id = 0;
  LocalConn* conn = nullptr;
  SlotPtr slot;
  std::vector<std::string> keys;
  int64_t remaining = 0;
  bool registered = false;  // keys entered in key_waits
};

// One request on the main upstream connection, answering one or more local
// requests (coalesced reads, combined ADDs).
struct UpReq {
  Request req;
  uint64_t seq = 0;
  std::vector<SlotPtr> slots;
  std::vector<int64_t> deltas;  // ADD: each slot's delta, in order
  bool combinable = true;
  // A fence (a PING): registers local wait `fence_wait` of connection
  // `fence_conn` once everything that client sent before it was handled.
  uint64_t fence_conn = 0;
  uint64_t fence_wait = 0;
  bool fence_append = false;  // ... or sends that client's held APPEND
};

struct Upstream {
  uv_tcp_t tcp{};
  uv_connect_t connect_req{};
  TcpStoreRelay::Loop* loop = nullptr;
  bool main = false;
  bool connected = false;
  bool closing = false;
  // With a secret: 1 while the server's nonce and proof are awaited, 2
  // while its verdict is; 0 once usable (nothing else is sent before).
  int auth = 0;
  std::string client_nonce;
  std::string pending;  // written once connected
  std::string inbuf;
  std::deque<std::unique_ptr<UpReq>> inflight;  // main: awaiting answers
  std::string key;   // wait connection: the key waited on; "" when idle
  int cancels = 0;   // CANCEL_WAITs not yet answered
  // Side connection carrying an APPEND (+ PING) for this local connection.
  uint64_t append_conn = 0;
  bool idle = false;  // in idle_waits
};

// Upstream WAIT for one key and the local waits sharing it.
struct KeyWait {
  Upstream* conn = nullptr;
  bool queued = false;  // in queued_keys, waiting for a connection
  std::vector<uint64_t> waits;  // LocalWait ids
};

}  // namespace

struct TcpStoreRelay::Loop {
  Loop(TcpStoreRelay* o, const Options& opts)
      : owner(o), options(opts), read_buf(kReadBufferBytes) {}

  TcpStoreRelay* owner;
  Options options;
  std::string upstream_name;
  uv_loop_t loop{};
  uv_tcp_t listener{};
  uv_async_t stop_async{};
  uv_check_t flush_check{};
  uv_timer_t reconnect_timer{};
  bool listener_open = false;
  bool stopping = false;
  std::vector<char> read_buf;
  Request request;

  uint64_t next_conn_id = 1;
  absl::flat_hash_map<uint64_t, LocalConn*> conns;

  // Upstream state, reset by TearDown.
  Upstream* main = nullptr;
  bool up = false;           // main is connected and usable
  std::string loss;          // non-empty: tear down at the next check
  std::vector<Upstream*> wait_conns;  // every wait connection
  std::vector<Upstream*> idle_waits;  // those with no key
  // Keys whose upstream WAIT waits for a wait connection (at most
  // max_wait_connections in use); stale entries (no waiter left) are skipped.
  std::deque<std::string> queued_keys;
  uint64_t next_seq = 1;
  uint64_t answered_seq = 0;  // main: everything up to here was handled
  std::vector<std::unique_ptr<UpReq>> unsent;
  absl::flat_hash_map<std::string, UpReq*> joinable;  // op byte + key
  absl::flat_hash_map<std::string, KeyWait> key_waits;
  absl::flat_hash_map<uint64_t, LocalWait*> waits_by_id;
  uint64_t next_wait_id = 1;

  // First connection: Start waits for its outcome.
  absl::Time first_deadline;
  Mutex start_mu;
  bool start_done ABSL_GUARDED_BY(start_mu) = false;
  absl::Status start_status ABSL_GUARDED_BY(start_mu);

  std::atomic<int64_t> clients{0};
  std::atomic<int64_t> accepted{0};
  std::atomic<int64_t> dropped{0};
  std::atomic<int64_t> local_requests{0};
  std::atomic<int64_t> upstream_requests{0};
  std::atomic<int64_t> coalesced{0};
  std::atomic<int64_t> upstream_waits{0};
  std::atomic<int64_t> waiting{0};
  std::atomic<int64_t> upstream_losses{0};
  std::atomic<bool> upstream_connected{false};
  std::atomic<int64_t> upstream_queue{0};
  std::atomic<int64_t> throttles{0};
  // Reading from local clients is stopped (max_upstream_queue_bytes).
  bool throttled = false;

  // Loop-thread only.
  void OnConnection(int status);
  void OnLocalRead(LocalConn* c, ssize_t nread);
  void ParseLocal(LocalConn* c);
  void StartAppend(LocalConn* c);
  void AppendDone(Upstream* u, bool ok);
  void Handle(LocalConn* c, Request& r);
  void Forward(LocalConn* c, Request& r, SlotPtr slot, bool may_join);
  // The unsent request `r` of client `c` may join (see Forward), or null.
  UpReq* JoinTarget(const LocalConn* c, const Request& r);
  // Stops reading from every client of combined ADD `t` (see held_add).
  void HoldAdd(UpReq* t);
  // Resumes the clients `ids` held by combined ADD `seq`.
  void ReleaseAdd(uint64_t seq, const std::vector<uint64_t>& ids);
  // Starts reading from `c` unless it is held, blocked or throttled; false
  // when it was dropped.
  bool ResumeRead(LocalConn* c);
  // Throttles or unthrottles by the main connection's write queue.
  void Backpressure();
  void StartWait(LocalConn* c, Request& r);
  bool Fence(LocalConn* c, uint64_t wait_id);
  void RegisterWait(LocalWait* w);
  void ClearWait(LocalConn* c);
  void KeyReady(const std::string& key);
  void Deliver(const SlotPtr& slot);
  void Pump(LocalConn* c);
  void FlushLocal(LocalConn* c);
  void DropLocal(LocalConn* c, absl::string_view reason);
  void CloseLocal(LocalConn* c);

  void ConnectMain();
  Upstream* NewUpstream(bool is_main);
  void OnUpstreamConnected(Upstream* u, int status);
  void OnUpstreamRead(Upstream* u, ssize_t nread);
  // Runs `u`'s side of the secret handshake on what it read.
  void AdvanceAuth(Upstream* u);
  // `u` is connected (and authenticated): sends what waited for it.
  void UpstreamReady(Upstream* u);
  void CompleteMain(std::unique_ptr<UpReq> r, absl::string_view response);
  void SendUpstream(Upstream* u, std::string bytes);
  Upstream* AcquireWaitConn();
  // Sends key `k`'s upstream WAIT on a wait connection, or queues it when
  // max_wait_connections are in use. False: the upstream is lost.
  bool StartKeyWait(const std::string& k, KeyWait& kw);
  // `u` has nothing left to answer: it takes the next queued key, or goes
  // idle, or is closed beyond max_idle_wait_connections.
  void WaitConnIdle(Upstream* u);
  void SendKeyWait(Upstream* u, const std::string& k);
  void Lost(absl::string_view reason);
  void TearDown();
  void FlushUnsent();
  void FinishStart(absl::Status status);
  void StopNow();
};

namespace {

struct LocalConn {
  LocalConn(TcpStoreRelay::Loop* l, uint64_t i)
      : loop(l), id(i), parser(l->options.limits) {}
  uv_tcp_t tcp{};
  TcpStoreRelay::Loop* loop;
  uint64_t id;
  std::string peer = "unknown";
  FrameParser parser;
  std::string inbuf;
  std::string outbuf;
  std::deque<SlotPtr> slots;
  std::unique_ptr<LocalWait> wait;
  uint64_t last_seq = 0;  // upstream position of this client's latest op
  bool closing = false;
  // An APPEND in flight on a side connection: nothing more is read from
  // this client until it is done (its later requests must see it).
  bool blocked = false;
  Request append;
  // With a secret: the handshake (store_auth.h) as the server runs it.
  bool authenticated = false;
  std::string client_nonce;
  std::string server_nonce;
  // The upstream seq of a combined ADD this client's ADD rides in: nothing
  // more is read from it until that ADD is answered (a refused sum is sent
  // again one by one, and the client's later requests must follow them).
  uint64_t held_add = 0;
};

uv_stream_t* AsStream(uv_tcp_t* t) { return reinterpret_cast<uv_stream_t*>(t); }
uv_handle_t* AsHandle(uv_tcp_t* t) { return reinterpret_cast<uv_handle_t*>(t); }

// Writes to the server: "" or why not. A queued write that fails later
// shows as a read error on the connection.
std::string WriteUpstream(uv_tcp_t* tcp, std::string* buf) {
  return tcpstore::WriteOut(AsStream(tcp), buf, SIZE_MAX, /*done=*/nullptr);
}

void AllocCb(uv_handle_t* h, size_t, uv_buf_t* buf);

void LocalReadCb(uv_stream_t* s, ssize_t nread, const uv_buf_t*) {
  auto* c = static_cast<LocalConn*>(s->data);
  c->loop->OnLocalRead(c, nread);
}

void UpstreamReadCb(uv_stream_t* s, ssize_t nread, const uv_buf_t*) {
  auto* u = static_cast<Upstream*>(s->data);
  u->loop->OnUpstreamRead(u, nread);
}

}  // namespace

namespace {
void AllocCb(uv_handle_t* h, size_t, uv_buf_t* buf) {
  // One buffer per loop: libuv hands it to the read callback before the next
  // allocation, and the read callbacks copy what they keep.
  auto* loop = static_cast<TcpStoreRelay::Loop*>(h->loop->data);
  *buf = uv_buf_init(loop->read_buf.data(), loop->read_buf.size());
}
}  // namespace

// --- local clients ----------------------------------------------------------

void TcpStoreRelay::Loop::OnConnection(int status) {
  if (status < 0) {
    FERRY_LOG(WARNING) << "tcp store relay: accept failed: "
                       << UvError(status);
    return;
  }
  auto* c = new LocalConn(this, next_conn_id++);
  uv_tcp_init(&loop, &c->tcp);
  c->tcp.data = c;
  auto close_now = [](LocalConn* conn) {
    conn->closing = true;
    uv_close(AsHandle(&conn->tcp),
             [](uv_handle_t* h) { delete static_cast<LocalConn*>(h->data); });
  };
  if (uv_accept(AsStream(&listener), AsStream(&c->tcp)) != 0) {
    close_now(c);
    return;
  }
  accepted.fetch_add(1, std::memory_order_relaxed);
  if (!up || !loss.empty()) {
    // The server is unreachable: fail the client's call now, not at its
    // timeout (Ferry's client reconnects on its next call).
    close_now(c);
    return;
  }
  uv_tcp_nodelay(&c->tcp, 1);
  c->peer = tcpstore::EndpointName(&c->tcp, /*peer=*/true);
  conns.emplace(c->id, c);
  clients.fetch_add(1, std::memory_order_relaxed);
  ResumeRead(c);
}

void TcpStoreRelay::Loop::OnLocalRead(LocalConn* c, ssize_t nread) {
  if (c->closing) return;
  if (nread < 0) {
    CloseLocal(c);
    return;
  }
  if (nread == 0) return;
  c->inbuf.append(read_buf.data(), nread);
  ParseLocal(c);
}

void TcpStoreRelay::Loop::ParseLocal(LocalConn* c) {
  absl::string_view data = c->inbuf;
  size_t offset = 0;
  while (!c->closing && !c->blocked && loss.empty()) {
    size_t consumed = 0;
    FrameParser::Result r =
        c->parser.Parse(data.substr(offset), &request, &consumed);
    if (r == FrameParser::Result::kNeedMore) break;
    if (r == FrameParser::Result::kError) {
      DropLocal(c, c->parser.error().message());
      return;
    }
    if (c->held_add != 0) {
      // Held by a combined ADD: only another ADD joining it goes on; the
      // frame is parsed again once the client is released.
      UpReq* t = request.op == Op::kAdd ? JoinTarget(c, request) : nullptr;
      if (t == nullptr || t->seq != c->held_add) break;
    }
    offset += consumed;
    local_requests.fetch_add(1, std::memory_order_relaxed);
    Handle(c, request);
  }
  if (c->closing) return;
  c->inbuf.erase(0, offset);
}

void TcpStoreRelay::Loop::Handle(LocalConn* c, Request& r) {
  if (c->slots.size() >= options.max_pending_requests) {
    DropLocal(c, absl::StrCat("more than ", options.max_pending_requests,
                              " requests awaiting an answer"));
    return;
  }
  // As the server: a legacy (PyTorch 1.13) client sends nothing while it
  // really waits, so any query means its wait() timed out.
  if (c->wait != nullptr &&
      c->parser.generation() == Generation::kLegacy) {
    ClearWait(c);
  }
  auto slot = [c](bool ready = false, std::string bytes = "") {
    auto s = std::make_shared<Slot>();
    s->conn = c;
    s->ready = ready;
    s->bytes = std::move(bytes);
    c->slots.push_back(s);
    return s;
  };
  const bool auth_op = r.op == Op::kAuthChallenge || r.op == Op::kAuthProof;
  if (!options.secret.empty() && (!c->authenticated || auth_op)) {
    auto refuse = [&](absl::string_view why) {
      DropLocal(c, absl::StrCat("authentication refused: ", why));
    };
    if (c->authenticated) return refuse("authentication repeated");
    switch (r.op) {
      case Op::kValidate:
        return;
      case Op::kAuthChallenge: {
        if (!c->client_nonce.empty() ||
            r.keys[0].size() != tcpstore::kAuthNonceBytes) {
          return refuse("malformed AUTH_CHALLENGE");
        }
        c->client_nonce = r.keys[0];
        c->server_nonce = tcpstore::RandomNonce();
        std::string out;
        tcpstore::PutBytes(&out, c->server_nonce);
        tcpstore::PutBytes(&out, tcpstore::AuthProof(options.secret, "server",
                                                     c->client_nonce,
                                                     c->server_nonce));
        slot(true, std::move(out));
        Pump(c);
        return;
      }
      case Op::kAuthProof:
        if (c->client_nonce.empty()) {
          return refuse("AUTH_PROOF before AUTH_CHALLENGE");
        }
        if (!tcpstore::ProofsEqual(
                r.keys[0], tcpstore::AuthProof(options.secret, "client",
                                               c->client_nonce,
                                               c->server_nonce))) {
          // Told first, so the client can say "wrong secret".
          slot(true, std::string(1, static_cast<char>(tcpstore::kAuthRefused)));
          Pump(c);
          return refuse("wrong secret");
        }
        c->authenticated = true;
        slot(true, std::string(1, static_cast<char>(tcpstore::kAuthAccepted)));
        Pump(c);
        return;
      default:
        return refuse(absl::StrCat(
            "unauthenticated client sent ", tcpstore::OpName(r.op),
            " (the store behind this relay requires a shared secret; "
            "PyTorch clients cannot authenticate)"));
    }
  }
  switch (r.op) {
    case Op::kValidate:
      return;
    case Op::kWatchKey:
      DropLocal(c, "WATCH_KEY (PyTorch 1.13 watchKey) is not supported");
      return;
    case Op::kAuthChallenge:
    case Op::kAuthProof:
      DropLocal(c, absl::StrCat("client sent ", tcpstore::OpName(r.op),
                                " but this relay has no secret (it does not "
                                "authenticate clients)"));
      return;
    case Op::kCancelWait:
      ClearWait(c);
      slot(true, std::string(1, static_cast<char>(tcpstore::kWaitCanceled)));
      Pump(c);
      return;
    case Op::kWait:
      StartWait(c, r);
      return;
    case Op::kAppend:
      // The server drops a connection whose APPEND grows a value past its
      // limit; the relay's main connection must never be that one. The
      // APPEND goes on a side connection once the client's earlier requests
      // were handled, and the client waits for it.
      c->blocked = true;
      uv_read_stop(AsStream(&c->tcp));  // the kernel holds what comes next
      c->append = std::move(r);
      if (!Fence(c, /*wait_id=*/0)) StartAppend(c);
      return;
    case Op::kSet:
    case Op::kMultiSet:
    case Op::kQueuePush:
      Forward(c, r, nullptr, false);
      return;
    case Op::kMultiGet:
      if (r.keys.empty()) return;  // answered by nothing
      Forward(c, r, slot(), false);
      return;
    case Op::kGet:
    case Op::kAdd:
      Forward(c, r, slot(), true);
      return;
    case Op::kCheck:
      Forward(c, r, slot(), r.keys.size() == 1);
      return;
    default:
      Forward(c, r, slot(), false);
      return;
  }
}

// The unsent request client `c`'s `r` may join (see Forward), or null.
UpReq* TcpStoreRelay::Loop::JoinTarget(const LocalConn* c, const Request& r) {
  auto it = joinable.find(JoinKey(r));
  if (it == joinable.end() || it->second->seq < c->last_seq) return nullptr;
  UpReq* t = it->second;
  if (r.op != Op::kAdd) return t;
  int64_t sum;
  if (!t->combinable ||
      !((r.delta >= 0 && t->req.delta >= 0) ||
        (r.delta <= 0 && t->req.delta <= 0)) ||
      __builtin_add_overflow(t->req.delta, r.delta, &sum)) {
    return nullptr;
  }
  // Its clients must have sent nothing after it. Once a second ADD joined,
  // HoldAdd holds every client of `t` and a held client sends only ADDs
  // joining `t`, so only the first client needs looking at.
  const LocalConn* first = t->slots.front()->conn;
  if (first != nullptr && first->last_seq != t->seq) return nullptr;
  return t;
}

// Queues `r` upstream. A GET, single-key CHECK or ADD may instead join an
// identical unsent request (an ADD: any unsent ADD on the key whose deltas
// have the same sign) when that request stands after everything this client
// sent before: the client's order is kept, and since the joined request is
// not sent yet, its answer reflects a moment after this request arrived.
// An ADD joins only when no client of the request has sent anything after
// it, and then holds them all (HoldAdd) until it is answered: if the server
// refuses the sum, the adds go again one by one before anything those
// clients send next.
void TcpStoreRelay::Loop::Forward(LocalConn* c, Request& r, SlotPtr slot,
                                  bool may_join) {
  if (may_join) {
    if (UpReq* t = JoinTarget(c, r)) {
      if (r.op == Op::kAdd) {
        t->req.delta += r.delta;  // JoinTarget checked for overflow
        t->deltas.push_back(r.delta);
      }
      t->slots.push_back(std::move(slot));
      c->last_seq = t->seq;
      coalesced.fetch_add(1, std::memory_order_relaxed);
      if (r.op == Op::kAdd) HoldAdd(t);
      return;
    }
  }
  auto u = std::make_unique<UpReq>();
  u->seq = next_seq++;
  u->req = r;
  if (r.op == Op::kAdd) u->deltas.push_back(r.delta);
  if (slot != nullptr) u->slots.push_back(std::move(slot));
  c->last_seq = u->seq;
  if (may_join) joinable[JoinKey(r)] = u.get();
  unsent.push_back(std::move(u));
}

void TcpStoreRelay::Loop::HoldAdd(UpReq* t) {
  for (const SlotPtr& s : t->slots) {
    LocalConn* h = s->conn;
    if (h == nullptr || h->held_add != 0) continue;
    h->held_add = t->seq;
    uv_read_stop(AsStream(&h->tcp));  // the kernel holds what comes next
  }
}

void TcpStoreRelay::Loop::ReleaseAdd(uint64_t seq,
                                     const std::vector<uint64_t>& ids) {
  for (uint64_t id : ids) {
    auto it = conns.find(id);
    if (it == conns.end()) continue;
    LocalConn* c = it->second;
    if (c->held_add != seq) continue;
    c->held_add = 0;
    if (!c->closing && !c->blocked && ResumeRead(c)) ParseLocal(c);
  }
}

bool TcpStoreRelay::Loop::ResumeRead(LocalConn* c) {
  if (c->closing) return false;
  if (c->blocked || c->held_add != 0 || throttled) return true;
  const int rc = uv_read_start(AsStream(&c->tcp), AllocCb, LocalReadCb);
  if (rc != 0) {
    DropLocal(c, absl::StrCat("read start failed: ", UvError(rc)));
    return false;
  }
  return true;
}

void TcpStoreRelay::Loop::Backpressure() {
  const size_t queued =
      main == nullptr ? 0 : uv_stream_get_write_queue_size(AsStream(&main->tcp));
  upstream_queue.store(static_cast<int64_t>(queued), std::memory_order_relaxed);
  if (!throttled && queued > options.max_upstream_queue_bytes) {
    throttled = true;
    throttles.fetch_add(1, std::memory_order_relaxed);
    for (auto& [id, c] : conns) {
      if (!c->closing) uv_read_stop(AsStream(&c->tcp));
    }
  } else if (throttled && queued <= options.max_upstream_queue_bytes / 2) {
    throttled = false;
    std::vector<LocalConn*> all;
    for (auto& [id, c] : conns) all.push_back(c);
    for (LocalConn* c : all) ResumeRead(c);  // may drop c, not the others
  }
}

void TcpStoreRelay::Loop::StartWait(LocalConn* c, Request& r) {
  ClearWait(c);  // a newer WAIT replaces a pending one, as on the server
  auto w = std::make_unique<LocalWait>();
  w->id = next_wait_id++;
  w->conn = c;
  w->slot = std::make_shared<Slot>();
  w->slot->conn = c;
  w->slot->is_wait = true;
  c->slots.push_back(w->slot);
  w->keys = std::move(r.keys);
  waits_by_id[w->id] = w.get();
  LocalWait* raw = w.get();
  c->wait = std::move(w);
  if (!Fence(c, raw->id)) RegisterWait(raw);
}

// The client's earlier requests (a DELETE of a waited key, say) must take
// effect before its wait is judged or its APPEND sent: when some are not
// answered yet, a PING behind them on the main connection goes on with the
// wait (`wait_id`) or the held APPEND (0) when it answers. False when
// nothing is pending (go on now).
bool TcpStoreRelay::Loop::Fence(LocalConn* c, uint64_t wait_id) {
  if (c->last_seq <= answered_seq) return false;
  auto fence = std::make_unique<UpReq>();
  fence->seq = next_seq++;
  fence->req.op = Op::kPing;
  fence->req.nonce = 0xfe7ce;
  fence->fence_conn = c->id;
  fence->fence_wait = wait_id;
  fence->fence_append = wait_id == 0;
  c->last_seq = fence->seq;
  unsent.push_back(std::move(fence));
  return true;
}

void TcpStoreRelay::Loop::StartAppend(LocalConn* c) {
  Upstream* u = AcquireWaitConn();
  if (u == nullptr) return;  // Lost() tears everything down
  u->append_conn = c->id;
  std::string frames;
  tcpstore::EncodeRequest(Generation::kCurrent, c->append, &frames);
  Request ping;
  ping.op = Op::kPing;
  ping.nonce = 0xa99e2d;
  tcpstore::EncodeRequest(Generation::kCurrent, ping, &frames);
  SendUpstream(u, std::move(frames));
}

// The side connection answered the APPEND's PING (`ok`) or closed: the
// server refused the APPEND, and drops that client as it would have.
void TcpStoreRelay::Loop::AppendDone(Upstream* u, bool ok) {
  auto it = conns.find(u->append_conn);
  u->append_conn = 0;
  u->inbuf.clear();
  if (it == conns.end()) return;
  LocalConn* c = it->second;
  if (!ok) {
    DropLocal(c, absl::StrCat("the server refused APPEND on key '",
                              c->append.keys[0],
                              "' (a value past its limit, most likely)"));
    return;
  }
  c->blocked = false;
  c->append.Clear();
  if (ResumeRead(c)) ParseLocal(c);
}

void TcpStoreRelay::Loop::RegisterWait(LocalWait* w) {
  w->registered = true;
  for (const std::string& k : w->keys) {
    KeyWait& kw = key_waits[k];
    kw.waits.push_back(w->id);
    ++w->remaining;
    if (kw.conn != nullptr || kw.queued) {
      coalesced.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    if (!StartKeyWait(k, kw)) return;  // Lost() tears everything down
  }
  if (w->remaining > 0) waiting.fetch_add(1, std::memory_order_relaxed);
  if (w->remaining == 0) {  // a WAIT on no keys
    LocalConn* c = w->conn;
    w->slot->bytes.assign(1, static_cast<char>(tcpstore::kStopWaiting));
    Deliver(w->slot);
    waits_by_id.erase(w->id);
    c->wait.reset();
  }
}

// Drops the client's pending wait: its slot never answers, and an upstream
// WAIT that no one else shares is cancelled.
void TcpStoreRelay::Loop::ClearWait(LocalConn* c) {
  LocalWait* w = c->wait.get();
  if (w == nullptr) return;
  if (w->registered) {
    if (w->remaining > 0) waiting.fetch_sub(1, std::memory_order_relaxed);
    for (const std::string& k : w->keys) {
      auto it = key_waits.find(k);
      if (it == key_waits.end()) continue;
      std::vector<uint64_t>& ids = it->second.waits;
      ids.erase(std::remove(ids.begin(), ids.end(), w->id), ids.end());
      if (!ids.empty()) continue;
      Upstream* u = it->second.conn;
      key_waits.erase(it);
      if (u == nullptr || u->closing) continue;
      u->key.clear();
      ++u->cancels;
      upstream_waits.fetch_sub(1, std::memory_order_relaxed);
      std::string frame;
      tcpstore::PutU8(&frame, *tcpstore::WireCode(Generation::kCurrent,
                                                  Op::kCancelWait));
      SendUpstream(u, std::move(frame));
    }
  }
  waits_by_id.erase(w->id);
  SlotPtr slot = w->slot;
  c->wait.reset();
  if (!slot->deferred) {
    slot->ready = true;  // answers nothing
    slot->bytes.clear();
    Pump(c);
  }
}

void TcpStoreRelay::Loop::KeyReady(const std::string& key) {
  auto it = key_waits.find(key);
  if (it == key_waits.end()) return;
  std::vector<uint64_t> ids = std::move(it->second.waits);
  key_waits.erase(it);
  upstream_waits.fetch_sub(1, std::memory_order_relaxed);
  for (uint64_t id : ids) {
    auto wit = waits_by_id.find(id);
    if (wit == waits_by_id.end()) continue;
    LocalWait* w = wit->second;
    if (--w->remaining > 0) continue;
    waits_by_id.erase(wit);
    waiting.fetch_sub(1, std::memory_order_relaxed);
    LocalConn* c = w->conn;
    SlotPtr slot = w->slot;
    c->wait.reset();
    slot->bytes.assign(1, static_cast<char>(tcpstore::kStopWaiting));
    Deliver(slot);
  }
}

void TcpStoreRelay::Loop::Deliver(const SlotPtr& slot) {
  LocalConn* c = slot->conn;
  if (c == nullptr || c->closing) return;
  if (slot->deferred) {
    c->outbuf.append(slot->bytes);
    FlushLocal(c);
    return;
  }
  slot->ready = true;
  Pump(c);
}

void TcpStoreRelay::Loop::Pump(LocalConn* c) {
  while (!c->slots.empty()) {
    Slot& s = *c->slots.front();
    if (s.ready) {
      c->outbuf.append(s.bytes);
    } else if (s.is_wait) {
      s.deferred = true;  // answers later, out of turn (as the server's)
    } else {
      break;
    }
    c->slots.pop_front();
  }
  FlushLocal(c);
}

void TcpStoreRelay::Loop::FlushLocal(LocalConn* c) {
  if (c->closing) return;
  // A failed queued write shows as a read error (the client is closed then).
  const std::string failed =
      tcpstore::WriteOut(AsStream(&c->tcp), &c->outbuf,
                         options.max_pending_write_bytes, /*done=*/nullptr);
  if (!failed.empty()) DropLocal(c, failed);
}

void TcpStoreRelay::Loop::DropLocal(LocalConn* c, absl::string_view reason) {
  if (c->closing) return;
  FERRY_LOG(WARNING) << "tcp store relay: dropping client " << c->peer << ": "
                     << reason;
  dropped.fetch_add(1, std::memory_order_relaxed);
  CloseLocal(c);
}

void TcpStoreRelay::Loop::CloseLocal(LocalConn* c) {
  if (c->closing) return;
  c->closing = true;  // first: ClearWait below writes nothing
  ClearWait(c);
  for (SlotPtr& s : c->slots) s->conn = nullptr;
  c->slots.clear();
  conns.erase(c->id);
  clients.fetch_sub(1, std::memory_order_relaxed);
  uv_close(AsHandle(&c->tcp),
           [](uv_handle_t* h) { delete static_cast<LocalConn*>(h->data); });
}

// --- upstream ---------------------------------------------------------------

Upstream* TcpStoreRelay::Loop::NewUpstream(bool is_main) {
  auto* u = new Upstream;
  u->loop = this;
  u->main = is_main;
  uv_tcp_init(&loop, &u->tcp);
  u->tcp.data = u;
  u->connect_req.data = u;
  sockaddr_storage addr{};
  ParseAddress(options.upstream_host, options.upstream_port, &addr);
  // VALIDATE first: the relay speaks the current generation upstream.
  Request validate;
  validate.op = Op::kValidate;
  validate.nonce = tcpstore::kValidationMagic;
  tcpstore::EncodeRequest(Generation::kCurrent, validate, &u->pending);
  const int rc = uv_tcp_connect(
      &u->connect_req, &u->tcp, reinterpret_cast<sockaddr*>(&addr),
      [](uv_connect_t* req, int status) {
        auto* up = static_cast<Upstream*>(req->data);
        up->loop->OnUpstreamConnected(up, status);
      });
  if (rc != 0) {
    u->closing = true;
    uv_close(AsHandle(&u->tcp),
             [](uv_handle_t* h) { delete static_cast<Upstream*>(h->data); });
    if (is_main) {
      FERRY_LOG(WARNING) << "tcp store relay: connect to " << upstream_name
                         << " failed: " << UvError(rc);
    } else {
      Lost(absl::StrCat("connect failed: ", UvError(rc)));
    }
    return nullptr;
  }
  return u;
}

void TcpStoreRelay::Loop::ConnectMain() {
  if (stopping) return;
  main = NewUpstream(true);
  if (main == nullptr) {
    uv_timer_start(&reconnect_timer,
                   [](uv_timer_t* t) {
                     static_cast<Loop*>(t->data)->ConnectMain();
                   },
                   100, 0);
  }
}

void TcpStoreRelay::Loop::OnUpstreamConnected(Upstream* u, int status) {
  if (u->closing) return;
  if (status < 0) {
    if (!u->main) {
      Lost(absl::StrCat("connect failed: ", UvError(status)));
      return;
    }
    // The main connection: retry until the server is back (and, at start,
    // until connect_timeout).
    u->closing = true;
    uv_close(AsHandle(&u->tcp),
             [](uv_handle_t* h) { delete static_cast<Upstream*>(h->data); });
    main = nullptr;
    if (!stopping && absl::Now() > first_deadline) {
      FinishStart(absl::UnavailableError(absl::StrCat(
          "tcp store relay: cannot reach the server ", upstream_name, ": ",
          UvError(status))));
    }
    uv_timer_start(&reconnect_timer,
                   [](uv_timer_t* t) {
                     static_cast<Loop*>(t->data)->ConnectMain();
                   },
                   100, 0);
    return;
  }
  u->connected = true;
  uv_tcp_nodelay(&u->tcp, 1);
  const int rc = uv_read_start(AsStream(&u->tcp), AllocCb, UpstreamReadCb);
  if (rc != 0) {
    Lost(absl::StrCat("read start failed: ", UvError(rc)));
    return;
  }
  if (!options.secret.empty()) {
    u->auth = 1;
    u->client_nonce = tcpstore::RandomNonce();
    // VALIDATE (moved from the front of `pending`), then the challenge.
    Request validate;
    validate.op = Op::kValidate;
    validate.nonce = tcpstore::kValidationMagic;
    std::string frame;
    tcpstore::EncodeRequest(Generation::kCurrent, validate, &frame);
    if (absl::StartsWith(u->pending, frame)) u->pending.erase(0, frame.size());
    Request challenge;
    challenge.op = Op::kAuthChallenge;
    challenge.keys.push_back(u->client_nonce);
    tcpstore::EncodeRequest(Generation::kCurrent, challenge, &frame);
    const std::string failed = WriteUpstream(&u->tcp, &frame);
    if (!failed.empty()) Lost(failed);
    return;  // UpstreamReady once the server accepted the proof
  }
  UpstreamReady(u);
}

void TcpStoreRelay::Loop::AdvanceAuth(Upstream* u) {
  auto refused = [&](absl::string_view why) {
    const std::string text = absl::StrCat(
        "tcp store relay: store authentication with the server ",
        upstream_name, " failed: ", why);
    if (u->main) FinishStart(absl::PermissionDeniedError(text));
    Lost(text);
  };
  std::string& in = u->inbuf;
  if (u->auth == 1) {
    // server nonce (u64 length + 32 bytes), then its proof (u64 + bytes).
    constexpr size_t kNonceEnd = 8 + tcpstore::kAuthNonceBytes;
    if (in.size() >= 8 && tcpstore::LoadU64(in.data()) !=
                              tcpstore::kAuthNonceBytes) {
      return refused("malformed answer to AUTH_CHALLENGE");
    }
    if (in.size() < kNonceEnd + 8) return;
    const uint64_t proof_len = tcpstore::LoadU64(in.data() + kNonceEnd);
    if (proof_len > 1024) return refused("malformed answer to AUTH_CHALLENGE");
    if (in.size() < kNonceEnd + 8 + proof_len) return;
    const std::string server_nonce = in.substr(8, tcpstore::kAuthNonceBytes);
    const std::string proof = in.substr(kNonceEnd + 8, proof_len);
    in.erase(0, kNonceEnd + 8 + proof_len);
    if (!tcpstore::ProofsEqual(
            proof, tcpstore::AuthProof(options.secret, "server",
                                       u->client_nonce, server_nonce))) {
      return refused("the server does not know the relay's secret");
    }
    Request answer;
    answer.op = Op::kAuthProof;
    answer.keys.push_back(tcpstore::AuthProof(options.secret, "client",
                                              u->client_nonce, server_nonce));
    std::string frame;
    tcpstore::EncodeRequest(Generation::kCurrent, answer, &frame);
    const std::string failed = WriteUpstream(&u->tcp, &frame);
    if (!failed.empty()) return Lost(failed);
    u->auth = 2;
  }
  if (u->auth == 2 && !in.empty()) {
    if (static_cast<uint8_t>(in[0]) != tcpstore::kAuthAccepted) {
      return refused("the server refused the relay's secret");
    }
    if (in.size() > 1) return Lost("the server sent bytes no request asked for");
    in.clear();
    u->auth = 0;
    UpstreamReady(u);
  }
}

void TcpStoreRelay::Loop::UpstreamReady(Upstream* u) {
  const std::string failed = WriteUpstream(&u->tcp, &u->pending);
  if (!failed.empty()) {
    Lost(failed);
    return;
  }
  if (u->main) {
    up = true;
    upstream_connected.store(true);
    FERRY_LOG(INFO) << "tcp store relay " << owner->address()
                    << ": connected to " << upstream_name;
    FinishStart(absl::OkStatus());
  }
}

void TcpStoreRelay::Loop::SendUpstream(Upstream* u, std::string bytes) {
  if (u->closing) return;
  upstream_requests.fetch_add(1, std::memory_order_relaxed);
  if (!u->connected || u->auth != 0) {
    // Nothing but the handshake goes before the server accepted the proof
    // (it drops a connection that sends a query first).
    u->pending.append(bytes);
    return;
  }
  const std::string failed = WriteUpstream(&u->tcp, &bytes);
  if (!failed.empty()) Lost(failed);
}

bool TcpStoreRelay::Loop::StartKeyWait(const std::string& k, KeyWait& kw) {
  if (idle_waits.empty() &&
      wait_conns.size() >= options.max_wait_connections) {
    kw.queued = true;
    queued_keys.push_back(k);
    return true;
  }
  Upstream* u = AcquireWaitConn();
  if (u == nullptr) return false;
  kw.conn = u;
  SendKeyWait(u, k);
  return true;
}

void TcpStoreRelay::Loop::SendKeyWait(Upstream* u, const std::string& k) {
  u->key = k;
  std::string frame;
  Request wait;
  wait.op = Op::kWait;
  wait.keys.push_back(k);
  tcpstore::EncodeRequest(Generation::kCurrent, wait, &frame);
  upstream_waits.fetch_add(1, std::memory_order_relaxed);
  SendUpstream(u, std::move(frame));
}

void TcpStoreRelay::Loop::WaitConnIdle(Upstream* u) {
  // Bounded by the queue's length; stale keys (their waiters left) go.
  while (!queued_keys.empty()) {
    std::string k = std::move(queued_keys.front());
    queued_keys.pop_front();
    auto it = key_waits.find(k);
    if (it == key_waits.end() || !it->second.queued) continue;
    it->second.queued = false;
    it->second.conn = u;
    SendKeyWait(u, k);
    return;
  }
  if (idle_waits.size() >= options.max_idle_wait_connections) {
    u->closing = true;
    wait_conns.erase(std::remove(wait_conns.begin(), wait_conns.end(), u),
                     wait_conns.end());
    uv_close(AsHandle(&u->tcp),
             [](uv_handle_t* h) { delete static_cast<Upstream*>(h->data); });
    return;
  }
  u->idle = true;
  idle_waits.push_back(u);
}

Upstream* TcpStoreRelay::Loop::AcquireWaitConn() {
  if (!idle_waits.empty()) {
    Upstream* u = idle_waits.back();
    idle_waits.pop_back();
    u->idle = false;
    return u;
  }
  Upstream* u = NewUpstream(false);
  if (u != nullptr) wait_conns.push_back(u);
  return u;
}

void TcpStoreRelay::Loop::OnUpstreamRead(Upstream* u, ssize_t nread) {
  if (u->closing || !loss.empty()) return;
  if (nread < 0 && !u->main && u->append_conn != 0) {
    // The server dropped the side connection at the APPEND; a dead server
    // is seen on the main connection too.
    u->closing = true;
    wait_conns.erase(std::remove(wait_conns.begin(), wait_conns.end(), u),
                     wait_conns.end());
    uv_close(AsHandle(&u->tcp),
             [](uv_handle_t* h) { delete static_cast<Upstream*>(h->data); });
    AppendDone(u, false);
    return;
  }
  if (nread < 0) {
    Lost(nread == UV_EOF ? std::string("the server closed the connection")
                         : UvError(static_cast<int>(nread)));
    return;
  }
  if (nread == 0) return;
  if (u->auth != 0) {
    u->inbuf.append(read_buf.data(), nread);
    AdvanceAuth(u);
    return;
  }
  if (!u->main && u->append_conn != 0) {
    u->inbuf.append(read_buf.data(), nread);
    if (u->inbuf.size() > 4) {
      Lost("the server sent bytes no request asked for");
    } else if (u->inbuf.size() == 4) {
      AppendDone(u, true);
      WaitConnIdle(u);
    }
    return;
  }
  if (!u->main) {
    // A wait connection answers STOP_WAITING (0) and WAIT_CANCELED (1). A
    // 0 while a CANCEL_WAIT is unanswered belongs to the cancelled wait.
    for (ssize_t i = 0; i < nread; ++i) {
      const uint8_t b = static_cast<uint8_t>(read_buf[i]);
      if (b == tcpstore::kWaitCanceled && u->cancels > 0) {
        --u->cancels;
      } else if (b == tcpstore::kStopWaiting && u->cancels == 0 &&
                 !u->key.empty()) {
        std::string key = std::move(u->key);
        u->key.clear();
        KeyReady(key);
      } else if (b != tcpstore::kStopWaiting) {
        Lost(absl::StrCat("unexpected byte ", b, " on a WAIT connection"));
        return;
      }
      if (u->key.empty() && u->cancels == 0 && !u->idle) {
        WaitConnIdle(u);  // May send the next queued key's WAIT, or close u.
        if (u->closing) return;
      }
    }
    return;
  }
  u->inbuf.append(read_buf.data(), nread);
  absl::string_view data = u->inbuf;
  size_t offset = 0;
  while (!u->inflight.empty() && loss.empty()) {
    UpReq& front = *u->inflight.front();
    const size_t n =
        tcpstore::ResponseSize(front.req.op, front.req.keys.size(),
                               data.substr(offset),
                               options.limits.max_frame_bytes);
    if (n == 0) break;
    if (n == SIZE_MAX) {
      Lost(absl::StrCat("malformed answer to ", tcpstore::OpName(front.req.op)));
      return;
    }
    std::unique_ptr<UpReq> r = std::move(u->inflight.front());
    u->inflight.pop_front();
    answered_seq = r->seq;
    CompleteMain(std::move(r), data.substr(offset, n));
    offset += n;
  }
  if (!loss.empty()) return;
  if (u->inflight.empty() && offset < data.size()) {
    Lost("the server sent bytes no request asked for");
    return;
  }
  u->inbuf.erase(0, offset);
}

void TcpStoreRelay::Loop::CompleteMain(std::unique_ptr<UpReq> r,
                                       absl::string_view response) {
  if (r->fence_append) {
    auto it = conns.find(r->fence_conn);
    if (it != conns.end() && it->second->blocked) StartAppend(it->second);
    return;
  }
  if (r->fence_wait != 0) {
    auto it = waits_by_id.find(r->fence_wait);
    if (it != waits_by_id.end() && !it->second->registered) {
      RegisterWait(it->second);
    }
    return;
  }
  if (r->req.op == Op::kAdd && r->slots.size() > 1) {
    const int64_t result = static_cast<int64_t>(tcpstore::LoadU64(response.data()));
    std::vector<uint64_t> held;  // the clients HoldAdd stopped
    for (const SlotPtr& s : r->slots) {
      if (s->conn != nullptr && s->conn->held_add == r->seq) {
        held.push_back(s->conn->id);
      }
    }
    if (result == kAddRefused) {
      // The server refused the sum (a non-integer value, or an overflow
      // that one of the adds alone might not cause): send them one by one,
      // before anything their clients send next (they are still held).
      for (size_t i = 0; i < r->slots.size(); ++i) {
        auto single = std::make_unique<UpReq>();
        single->seq = next_seq++;
        single->req = r->req;
        single->req.delta = r->deltas[i];
        single->deltas.push_back(r->deltas[i]);
        single->slots.push_back(r->slots[i]);
        single->combinable = false;
        if (LocalConn* c = r->slots[i]->conn) c->last_seq = single->seq;
        unsent.push_back(std::move(single));
      }
      ReleaseAdd(r->seq, held);
      return;
    }
    // As if applied one after another in slot order.
    int64_t value = result - r->req.delta;
    for (size_t i = 0; i < r->slots.size(); ++i) {
      value += r->deltas[i];
      std::string bytes;
      tcpstore::PutU64(&bytes, static_cast<uint64_t>(value));
      r->slots[i]->bytes = std::move(bytes);
      Deliver(r->slots[i]);
    }
    ReleaseAdd(r->seq, held);
    return;
  }
  for (const SlotPtr& s : r->slots) {
    s->bytes.assign(response.data(), response.size());
    Deliver(s);
  }
}

// Sends what the loop turn queued, in one write.
void TcpStoreRelay::Loop::FlushUnsent() {
  if (!loss.empty()) {
    TearDown();
    return;
  }
  if (throttled) Backpressure();
  if (unsent.empty() || main == nullptr || !up) return;
  joinable.clear();
  std::string out;
  std::vector<std::unique_ptr<UpReq>> batch = std::move(unsent);
  unsent.clear();
  for (std::unique_ptr<UpReq>& r : batch) {
    tcpstore::EncodeRequest(Generation::kCurrent, r->req, &out);
    upstream_requests.fetch_add(1, std::memory_order_relaxed);
    switch (r->req.op) {
      case Op::kSet:
      case Op::kAppend:
      case Op::kMultiSet:
      case Op::kQueuePush:
        break;  // no answer
      default:
        main->inflight.push_back(std::move(r));
    }
  }
  const std::string failed = WriteUpstream(&main->tcp, &out);
  if (!failed.empty()) {
    Lost(failed);
    TearDown();
    return;
  }
  Backpressure();
}

void TcpStoreRelay::Loop::Lost(absl::string_view reason) {
  if (!loss.empty()) return;
  loss = absl::StrCat("lost the server ", upstream_name, ": ", reason);
}

// After a loss: every local client is closed (its pending call fails at
// once), all upstream state goes, and the main connection is retried.
void TcpStoreRelay::Loop::TearDown() {
  if (!stopping) {
    FERRY_LOG(WARNING) << "tcp store relay " << owner->address() << ": "
                       << loss << "; closing " << conns.size()
                       << " local client(s)";
    upstream_losses.fetch_add(1, std::memory_order_relaxed);
  }
  loss.clear();
  up = false;
  throttled = false;  // the clients are closed below
  upstream_queue.store(0, std::memory_order_relaxed);
  upstream_connected.store(false);
  key_waits.clear();  // first: closing the clients below cancels nothing
  std::vector<LocalConn*> all;
  for (auto& [id, c] : conns) all.push_back(c);
  for (LocalConn* c : all) CloseLocal(c);
  unsent.clear();
  joinable.clear();
  waits_by_id.clear();
  upstream_waits.store(0);
  waiting.store(0);
  idle_waits.clear();
  queued_keys.clear();
  auto close_up = [](Upstream* u) {
    if (u == nullptr || u->closing) return;
    u->closing = true;
    uv_close(AsHandle(&u->tcp),
             [](uv_handle_t* h) { delete static_cast<Upstream*>(h->data); });
  };
  for (Upstream* u : wait_conns) close_up(u);
  wait_conns.clear();
  close_up(main);
  main = nullptr;
  if (!stopping) {
    uv_timer_start(&reconnect_timer,
                   [](uv_timer_t* t) {
                     static_cast<Loop*>(t->data)->ConnectMain();
                   },
                   100, 0);
  }
}

void TcpStoreRelay::Loop::FinishStart(absl::Status status) {
  MutexLock lock(&start_mu);
  if (start_done) return;
  start_done = true;
  start_status = std::move(status);
}

void TcpStoreRelay::Loop::StopNow() {
  stopping = true;
  if (listener_open) {
    listener_open = false;
    uv_close(AsHandle(&listener), nullptr);
  }
  loss = "the relay is stopping";
  TearDown();
  uv_timer_stop(&reconnect_timer);
  uv_close(reinterpret_cast<uv_handle_t*>(&reconnect_timer), nullptr);
  uv_check_stop(&flush_check);
  uv_close(reinterpret_cast<uv_handle_t*>(&flush_check), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&stop_async), nullptr);
}

// ---------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<TcpStoreRelay>> TcpStoreRelay::Start(
    const Options& options) {
  sockaddr_storage listen_addr{};
  if (!ParseAddress(options.host, options.port, &listen_addr)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tcp store relay: host '", options.host, "' is not a numeric address"));
  }
  sockaddr_storage up_addr{};
  if (!ParseAddress(options.upstream_host, options.upstream_port, &up_addr) ||
      options.upstream_port <= 0 || options.upstream_port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("tcp store relay: upstream ", options.upstream_host, ":",
                     options.upstream_port, " is not a numeric address and port"));
  }
  tcpstore::IgnoreDefaultSigpipe();
  std::unique_ptr<TcpStoreRelay> relay(new TcpStoreRelay);
  relay->loop_ = std::make_unique<Loop>(relay.get(), options);
  Loop* l = relay->loop_.get();
  relay->upstream_ =
      options.upstream_host.find(':') != std::string::npos
          ? absl::StrCat("[", options.upstream_host, "]:", options.upstream_port)
          : absl::StrCat(options.upstream_host, ":", options.upstream_port);
  l->upstream_name = absl::StrCat("tcp://", relay->upstream_);
  int rc = uv_loop_init(&l->loop);
  if (rc != 0) {
    return absl::InternalError(absl::StrCat("uv_loop_init: ", UvError(rc)));
  }
  l->loop.data = l;
  uv_async_init(&l->loop, &l->stop_async,
                [](uv_async_t* a) { static_cast<Loop*>(a->data)->StopNow(); });
  l->stop_async.data = l;
  uv_timer_init(&l->loop, &l->reconnect_timer);
  l->reconnect_timer.data = l;
  uv_check_init(&l->loop, &l->flush_check);
  l->flush_check.data = l;
  uv_check_start(&l->flush_check, [](uv_check_t* c) {
    static_cast<Loop*>(c->data)->FlushUnsent();
  });
  uv_tcp_init(&l->loop, &l->listener);
  l->listener.data = l;
  rc = uv_tcp_bind(&l->listener, reinterpret_cast<sockaddr*>(&listen_addr), 0);
  if (rc == 0) {
    rc = uv_listen(AsStream(&l->listener), options.backlog,
                   [](uv_stream_t* s, int status) {
                     static_cast<Loop*>(s->data)->OnConnection(status);
                   });
  }
  if (rc != 0) {
    tcpstore::AbandonLoop(&l->loop);
    return absl::UnavailableError(
        absl::StrCat("tcp store relay: cannot listen on ", options.host, ":",
                     options.port, ": ", UvError(rc)));
  }
  l->listener_open = true;
  relay->port_ = tcpstore::BoundPort(&l->listener);
  relay->address_ = tcpstore::EndpointName(&l->listener, /*peer=*/false);
  l->first_deadline = absl::Now() + options.connect_timeout;
  l->ConnectMain();
  relay->thread_ = std::thread([l] {
    uv_run(&l->loop, UV_RUN_DEFAULT);
    while (uv_loop_close(&l->loop) == UV_EBUSY) uv_run(&l->loop, UV_RUN_NOWAIT);
  });
  absl::Status status;
  {
    MutexLock lock(&l->start_mu);
    l->start_mu.Await(absl::Condition(&l->start_done));
    status = l->start_status;
  }
  if (!status.ok()) {
    relay->Stop();
    return status;
  }
  FERRY_LOG(INFO) << "tcp store relay listening on " << relay->address_
                  << ", relaying to " << l->upstream_name;
  return relay;
}

TcpStoreRelay::~TcpStoreRelay() { Stop(); }

void TcpStoreRelay::Stop() {
  MutexLock lock(&stop_mu_);
  if (stopped_.exchange(true)) return;
  if (!thread_.joinable()) return;
  uv_async_send(&loop_->stop_async);
  thread_.join();
}

TcpStoreRelay::Stats TcpStoreRelay::GetStats() const {
  Stats s;
  const Loop& l = *loop_;
  s.clients = l.clients.load(std::memory_order_relaxed);
  s.accepted = l.accepted.load(std::memory_order_relaxed);
  s.dropped = l.dropped.load(std::memory_order_relaxed);
  s.local_requests = l.local_requests.load(std::memory_order_relaxed);
  s.upstream_requests = l.upstream_requests.load(std::memory_order_relaxed);
  s.coalesced = l.coalesced.load(std::memory_order_relaxed);
  s.upstream_waits = l.upstream_waits.load(std::memory_order_relaxed);
  s.waiting = l.waiting.load(std::memory_order_relaxed);
  s.upstream_losses = l.upstream_losses.load(std::memory_order_relaxed);
  s.upstream_connected = l.upstream_connected.load();
  s.upstream_queue_bytes = l.upstream_queue.load(std::memory_order_relaxed);
  s.throttles = l.throttles.load(std::memory_order_relaxed);
  return s;
}

}  // namespace ferry
