#include "ferry/store/tcp_store.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <thread>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "ferry/common/status.h"
#include "ferry/store/store_auth.h"
#include "ferry/store/store_util.h"

namespace ferry {

using tcpstore::Generation;
using tcpstore::Op;

namespace {

constexpr int64_t kAddSentinel = std::numeric_limits<int64_t>::min();
// Bytes a receive may read beyond the response being read.
constexpr size_t kReadAhead = 2048;
// How long to wait for the server to answer CANCEL_WAIT.
constexpr absl::Duration kCancelGrace = absl::Seconds(10);

int PollMillis(absl::Time deadline) {
  absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  int64_t ms =
      absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1)));
  return static_cast<int>(std::min<int64_t>(ms, 1 << 30));
}

std::string ErrnoText(int err) {
  return absl::StrCat(strerror(err), " (errno ", err, ")");
}

bool IsNumericAddress(const std::string& host) {
  in6_addr a6;
  in_addr a4;
  return inet_pton(AF_INET6, host.c_str(), &a6) == 1 ||
         inet_pton(AF_INET, host.c_str(), &a4) == 1;
}

#ifndef IP_LOCAL_PORT_RANGE
#define IP_LOCAL_PORT_RANGE 51  // Linux >= 6.3
#endif

// Lets connect() pick an ephemeral port of either parity. By default Linux
// tries only the even half of the range and then scans every even port before
// trying an odd one: once thousands of clients on one host hold ~14K
// connections to the same server (half of the default 28K ports), each
// further connect costs ~2 ms of kernel time (16384 clients took 5x the
// 8192 init time). A per-socket range (any, here the whole range, which the
// kernel clamps to the system's) turns the parity rule off. Best effort:
// older kernels refuse the option and keep their default.
void AllowEitherPortParity(int fd) {
  const uint32_t range = 1u | (65535u << 16);  // lo | hi << 16
  ::setsockopt(fd, IPPROTO_IP, IP_LOCAL_PORT_RANGE, &range, sizeof(range));
}

// Tries one connect to `ai` until `deadline`; returns the fd or -errno.
int ConnectOnce(const addrinfo* ai, absl::Time deadline) {
  int fd =
      ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
               ai->ai_protocol);
  if (fd < 0) return -errno;
  AllowEitherPortParity(fd);
  if (::connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
    if (errno != EINPROGRESS) {
      int err = errno;
      ::close(fd);
      return -err;
    }
    pollfd p{fd, POLLOUT, 0};
    int rc;
    do {
      rc = ::poll(&p, 1, std::min(PollMillis(deadline), 2000));
    } while (rc < 0 && errno == EINTR);
    if (rc <= 0) {
      ::close(fd);
      return -ETIMEDOUT;
    }
    int err = 0;
    socklen_t len = sizeof(err);
    ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) {
      ::close(fd);
      return -err;
    }
  }
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

}  // namespace

TcpStore::TcpStore(const TcpStoreOptions& options,
                   std::shared_ptr<TcpStoreServer> server, int port)
    : options_(options),
      generation_(options.legacy_protocol ? Generation::kLegacy
                                          : Generation::kCurrent),
      server_(std::move(server)),
      port_(port),
      describe_(absl::StrCat("tcp://",
                             options.host.find(':') != std::string::npos
                                 ? absl::StrCat("[", options.host, "]")
                                 : options.host,
                             ":", port)) {
  SetTimeout(options.timeout);
}

absl::StatusOr<std::unique_ptr<TcpStore>> TcpStore::Create(
    const TcpStoreOptions& options) {
  if (options.port < 0 || options.port > 65535 ||
      (options.port == 0 && !options.is_server)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TcpStore: invalid port ", options.port, " for ", options.host,
        options.is_server ? "" : " (port 0 is only valid with is_server)"));
  }
  if (options.world_size.has_value() && *options.world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("TcpStore: world_size ", *options.world_size, " < 1"));
  }
  std::shared_ptr<TcpStoreServer> server;
  int port = options.port;
  if (options.is_server) {
    TcpStoreServer::Options so;
    so.host = options.bind_host.has_value()
                  ? *options.bind_host
                  : (IsNumericAddress(options.host) ? options.host : "");
    so.port = options.port;
    so.limits = options.limits;
    so.secret = options.secret;
    ASSIGN_OR_RETURN(std::unique_ptr<TcpStoreServer> s,
                     TcpStoreServer::Start(so));
    port = s->port();
    server = std::move(s);
  }
  std::unique_ptr<TcpStore> store(new TcpStore(options, server, port));
  {
    MutexLock lock(&store->mu_);
    RETURN_IF_ERROR(store->EnsureConnected());
    if (options.world_size.has_value()) {
      // Joining: PyTorch's waitForWorkers adds 1 to the unprefixed init key.
      ASSIGN_OR_RETURN(int64_t joined,
                       store->AddLocked(std::string(tcpstore::kInitKey), 1,
                                        tcpstore::kInitKey));
      (void)joined;
    }
  }
  if (options.is_server && options.world_size.has_value() &&
      options.wait_for_workers) {
    RETURN_IF_ERROR(
        server->WaitForWorkers(*options.world_size, options.timeout));
  }
  return store;
}

TcpStore::~TcpStore() {
  MutexLock lock(&mu_);
  Disconnect();
}

std::string TcpStore::Describe() const { return describe_; }

std::string TcpStore::Wire(absl::string_view key) const {
  return absl::StrCat(tcpstore::kKeyPrefix, key);
}

absl::Status TcpStore::CheckKey(absl::string_view op,
                                absl::string_view key) const {
  if (key.size() + tcpstore::kKeyPrefix.size() >
      options_.limits.max_key_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        describe_, ": ", op, ": key ", QuoteKey(key), " of ", key.size(),
        " bytes exceeds the key limit of ", options_.limits.max_key_bytes,
        " bytes (including the \"/\" prefix)"));
  }
  return absl::OkStatus();
}

absl::Status TcpStore::CheckValue(absl::string_view op, absl::string_view key,
                                  absl::string_view value) const {
  RETURN_IF_ERROR(CheckKey(op, key));
  if (value.size() > options_.limits.max_value_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        describe_, ": ", op, ": value of ", value.size(), " bytes for key ",
        QuoteKey(key), " exceeds the value limit of ",
        options_.limits.max_value_bytes, " bytes"));
  }
  return absl::OkStatus();
}

absl::Status TcpStore::CheckCount(absl::string_view op, size_t n) const {
  if (n > options_.limits.max_keys_per_request) {
    return absl::InvalidArgumentError(absl::StrCat(
        describe_, ": ", op, ": ", n, " keys exceed the limit of ",
        options_.limits.max_keys_per_request, " keys per request"));
  }
  return absl::OkStatus();
}

// --- connection ------------------------------------------------------------

void TcpStore::Disconnect() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  rpos_ = rend_ = 0;
}

absl::Status TcpStore::EnsureConnected() {
  if (fd_ >= 0) return absl::OkStatus();
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + Timeout();
  absl::Duration backoff = absl::Milliseconds(10);
  absl::BitGen gen;
  int attempts = 0;
  std::string last_error = "no attempt";
  const std::string port_text = absl::StrCat(port_);
  while (true) {
    ++attempts;
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    int gai =
        ::getaddrinfo(options_.host.c_str(), port_text.c_str(), &hints, &res);
    if (gai != 0) {
      last_error = absl::StrCat("cannot resolve host: ", gai_strerror(gai));
    } else {
      for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
        int fd = ConnectOnce(ai, deadline);
        if (fd >= 0) {
          fd_ = fd;
          // Blocking from here on; timeouts come from SO_RCVTIMEO/SNDTIMEO.
          ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) & ~O_NONBLOCK);
          rcv_timeout_ = snd_timeout_ = absl::InfiniteDuration();
          break;
        }
        last_error = ErrnoText(-fd);
      }
      ::freeaddrinfo(res);
    }
    if (fd_ >= 0 && generation_ == Generation::kCurrent) {
      std::string frame;
      tcpstore::PutU8(&frame, 0);  // VALIDATE
      tcpstore::PutU32(&frame, tcpstore::kValidationMagic);
      absl::Status s = SendFrame(frame);
      if (!s.ok()) {
        last_error = std::string(s.message());
        Disconnect();
      }
    }
    if (fd_ >= 0 && !options_.secret.empty()) {
      // A refusal is an answer, not a transient failure: no retry.
      absl::Status s = AuthenticateLocked();
      if (!s.ok()) {
        Disconnect();
        return s;
      }
    }
    if (fd_ >= 0) return absl::OkStatus();
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::UnavailableError(absl::StrCat(
          describe_, ": could not connect to ", options_.host, ":", port_,
          " after ", attempts, " attempt(s) in ",
          absl::FormatDuration(absl::Trunc(now - start, absl::Milliseconds(1))),
          ": ", last_error));
    }
    absl::Duration sleep = backoff * absl::Uniform(gen, 0.75, 1.25);
    absl::SleepFor(std::min(sleep, deadline - now));
    backoff = std::min(backoff * 2, absl::Seconds(1));
  }
}

// The socket is blocking with SO_RCVTIMEO / SO_SNDTIMEO: one syscall per
// send or receive on the fast path (no poll, no EAGAIN round).
bool TcpStore::SetSocketTimeout(absl::Time deadline, int option,
                                absl::Duration* cached) {
  const absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return false;
  // Re-arm only when the armed timeout would overshoot the deadline (beyond
  // a little slack) or is much shorter than needed; an early expiry just
  // loops.
  const absl::Duration slack = std::max(absl::Milliseconds(1), left / 100);
  if (*cached > left + slack || *cached < left / 2) {
    const absl::Duration t = absl::Ceil(left, absl::Milliseconds(1));
    timeval tv = absl::ToTimeval(t);
    ::setsockopt(fd_, SOL_SOCKET, option, &tv, sizeof(tv));
    *cached = t;
  }
  return true;
}

absl::Status TcpStore::SendFrame(const std::string& frame) {
  size_t off = 0;
  const absl::Time deadline = ResponseDeadline();
  while (off < frame.size()) {
    if (!SetSocketTimeout(deadline, SO_SNDTIMEO, &snd_timeout_)) {
      Disconnect();
      return absl::DeadlineExceededError("send timed out");
    }
    ssize_t n =
        ::send(fd_, frame.data() + off, frame.size() - off, MSG_NOSIGNAL);
    if (n > 0) {
      off += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) {
      continue;  // the deadline check above ends this
    }
    int err = errno;
    Disconnect();
    return absl::UnavailableError(
        absl::StrCat("send failed: ", ErrnoText(err)));
  }
  return absl::OkStatus();
}

absl::Status TcpStore::Recv(size_t n, absl::Time deadline, std::string* out) {
  if (rend_ - rpos_ < n) {
    // Make room for n bytes (and some read-ahead) at the end of the buffer.
    if (rbuf_.size() - rpos_ < n + kReadAhead && rpos_ > 0) {
      std::memmove(rbuf_.data(), rbuf_.data() + rpos_, rend_ - rpos_);
      rend_ -= rpos_;
      rpos_ = 0;
    }
    // Grown on demand, doubling: a handle that only ever reads small answers
    // keeps one small buffer. (A fixed 64 KiB, zero-filled and faulted in by
    // every new handle, was most of a client's cost in a 16384-rank init.)
    if (rbuf_.size() < n + kReadAhead) {
      rbuf_.resize(std::max(n + kReadAhead, 2 * rbuf_.size()));
    }
  }
  bool got_any = false;
  while (rend_ - rpos_ < n) {
    if (!SetSocketTimeout(deadline, SO_RCVTIMEO, &rcv_timeout_)) {
      // A half-read response leaves the stream out of step: reconnect later.
      if (got_any || rend_ > rpos_) Disconnect();
      return absl::DeadlineExceededError(
          "timed out waiting for the server's response");
    }
    ssize_t r = ::recv(fd_, rbuf_.data() + rend_, rbuf_.size() - rend_, 0);
    if (r > 0) {
      rend_ += static_cast<size_t>(r);
      got_any = true;
      continue;
    }
    if (r == 0) {
      Disconnect();
      return absl::UnavailableError("connection closed by the server");
    }
    if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
    int err = errno;
    Disconnect();
    return absl::UnavailableError(
        absl::StrCat("recv failed: ", ErrnoText(err)));
  }
  out->assign(rbuf_.data() + rpos_, n);
  rpos_ += n;
  if (rpos_ == rend_) rpos_ = rend_ = 0;
  return absl::OkStatus();
}

absl::StatusOr<uint8_t> TcpStore::RecvU8(absl::Time deadline) {
  std::string b;
  RETURN_IF_ERROR(Recv(1, deadline, &b));
  return static_cast<uint8_t>(b[0]);
}

absl::StatusOr<int64_t> TcpStore::RecvI64(absl::Time deadline) {
  std::string b;
  RETURN_IF_ERROR(Recv(8, deadline, &b));
  return static_cast<int64_t>(tcpstore::LoadU64(b.data()));
}

absl::StatusOr<std::string> TcpStore::RecvBytes(absl::Time deadline) {
  std::string b;
  RETURN_IF_ERROR(Recv(8, deadline, &b));
  const uint64_t len = tcpstore::LoadU64(b.data());
  // The server is trusted less than memory: a response longer than any value
  // we accept means a confused stream.
  if (len > options_.limits.max_value_bytes) {
    Disconnect();
    return absl::InternalError(absl::StrCat("server sent a value of ", len,
                                            " bytes, beyond the value limit"));
  }
  std::string v;
  RETURN_IF_ERROR(Recv(static_cast<size_t>(len), deadline, &v));
  return v;
}

absl::Status TcpStore::AuthenticateLocked() {
  const absl::Time deadline = ResponseDeadline();
  auto refused = [this](absl::string_view why) {
    return absl::PermissionDeniedError(
        absl::StrCat(describe_, ": store authentication failed: ", why));
  };
  const std::string client_nonce = tcpstore::RandomNonce();
  std::string frame;
  BeginFrame(&frame, Op::kAuthChallenge);
  tcpstore::PutBytes(&frame, client_nonce);
  RETURN_IF_ERROR(SendFrame(frame));
  absl::StatusOr<std::string> server_nonce = RecvBytes(deadline);
  absl::StatusOr<std::string> server_proof =
      server_nonce.ok() ? RecvBytes(deadline) : server_nonce.status();
  if (!server_proof.ok()) {
    return refused(absl::StrCat(
        "the server closed the connection on AUTH_CHALLENGE (it has no "
        "secret, or is not a Ferry store): ",
        server_proof.status().message()));
  }
  if (server_nonce->size() != tcpstore::kAuthNonceBytes ||
      !tcpstore::ProofsEqual(
          *server_proof, tcpstore::AuthProof(options_.secret, "server",
                                             client_nonce, *server_nonce))) {
    return refused("the server does not know our secret (its proof differs)");
  }
  frame.clear();
  BeginFrame(&frame, Op::kAuthProof);
  tcpstore::PutBytes(&frame, tcpstore::AuthProof(options_.secret, "client",
                                                 client_nonce, *server_nonce));
  RETURN_IF_ERROR(SendFrame(frame));
  absl::StatusOr<uint8_t> verdict = RecvU8(deadline);
  if (!verdict.ok() || *verdict != tcpstore::kAuthAccepted) {
    return refused("the server refused our proof (wrong secret)");
  }
  return absl::OkStatus();
}

void TcpStore::BeginFrame(std::string* frame, Op op) {
  // Every op used here exists in the generation it is sent in (callers check
  // the legacy-only gaps first).
  tcpstore::PutU8(frame, tcpstore::WireCode(generation_, op).value_or(0xff));
}

absl::Status TcpStore::Fail(absl::string_view op, const absl::Status& status) {
  if (absl::IsDeadlineExceeded(status) || absl::IsUnavailable(status) ||
      absl::IsInternal(status)) {
    Disconnect();
  }
  return absl::Status(
      status.code(), absl::StrCat(describe_, ": ", op, ": ", status.message()));
}

// --- operations ------------------------------------------------------------

#define TCP_RETURN_IF_ERROR(op, expr)                    \
  do {                                                   \
    ::absl::Status tcp_status_ = (expr);                 \
    if (!tcp_status_.ok()) return Fail(op, tcp_status_); \
  } while (0)

absl::Status TcpStore::Set(absl::string_view key, absl::string_view value) {
  RETURN_IF_ERROR(CheckValue("Set", key, value));
  std::string frame;
  MutexLock lock(&mu_);
  TCP_RETURN_IF_ERROR("Set", EnsureConnected());
  BeginFrame(&frame, Op::kSet);
  tcpstore::PutBytes(&frame, Wire(key));
  tcpstore::PutBytes(&frame, value);
  TCP_RETURN_IF_ERROR("Set", SendFrame(frame));
  return absl::OkStatus();
}

absl::StatusOr<std::string> TcpStore::Get(absl::string_view key) {
  RETURN_IF_ERROR(CheckKey("Get", key));
  const std::string wire = Wire(key);
  MutexLock lock(&mu_);
  TCP_RETURN_IF_ERROR("Get", EnsureConnected());
  std::string frame;
  if (generation_ == Generation::kCurrent) {
    // CHECK and GET in one write: one round trip when the key exists (a GET
    // of a missing key answers an empty value, which is then discarded).
    BeginFrame(&frame, Op::kCheck);
    tcpstore::PutU64(&frame, 1);
    tcpstore::PutBytes(&frame, wire);
    BeginFrame(&frame, Op::kGet);
    tcpstore::PutBytes(&frame, wire);
    TCP_RETURN_IF_ERROR("Get", SendFrame(frame));
    const absl::Time deadline = ResponseDeadline();
    absl::StatusOr<uint8_t> ready = RecvU8(deadline);
    if (!ready.ok()) return Fail("Get", ready.status());
    absl::StatusOr<std::string> value = RecvBytes(deadline);
    if (!value.ok()) return Fail("Get", value.status());
    if (*ready == tcpstore::kCheckReady) return value;
    frame.clear();
  }
  RETURN_IF_ERROR(WaitLocked({wire}, Timeout(), "Get"));
  BeginFrame(&frame, Op::kGet);
  tcpstore::PutBytes(&frame, wire);
  TCP_RETURN_IF_ERROR("Get", SendFrame(frame));
  absl::StatusOr<std::string> value = RecvBytes(ResponseDeadline());
  if (!value.ok()) return Fail("Get", value.status());
  return value;
}

absl::StatusOr<int64_t> TcpStore::AddLocked(const std::string& wire_key,
                                            int64_t delta,
                                            absl::string_view user_key) {
  TCP_RETURN_IF_ERROR("Add", EnsureConnected());
  for (int attempt = 0; attempt < 3; ++attempt) {
    std::string frame;
    BeginFrame(&frame, Op::kAdd);
    tcpstore::PutBytes(&frame, wire_key);
    tcpstore::PutU64(&frame, static_cast<uint64_t>(delta));
    TCP_RETURN_IF_ERROR("Add", SendFrame(frame));
    absl::StatusOr<int64_t> sum = RecvI64(ResponseDeadline());
    if (!sum.ok()) return Fail("Add", sum.status());
    if (*sum != kAddSentinel) return *sum;
    // A Ferry server refused the ADD (non-integer value or overflow) and
    // left the value alone; read it to say which.
    frame.clear();
    BeginFrame(&frame, Op::kGet);
    tcpstore::PutBytes(&frame, wire_key);
    TCP_RETURN_IF_ERROR("Add", SendFrame(frame));
    absl::StatusOr<std::string> current = RecvBytes(ResponseDeadline());
    if (!current.ok()) return Fail("Add", current.status());
    int64_t c;
    if (!absl::SimpleAtoi(*current, &c)) {
      return NotAnIntegerError(describe_, user_key, *current);
    }
    if (c == kAddSentinel) return c;  // the sum really is INT64_MIN
    int64_t sum2;
    if (__builtin_add_overflow(c, delta, &sum2)) {
      return AddOverflowError(describe_, user_key, c, delta);
    }
    // The value changed under us; try again.
  }
  return absl::AbortedError(absl::StrCat(describe_, ": Add on key ",
                                         QuoteKey(user_key),
                                         ": value kept changing; gave up"));
}

absl::StatusOr<int64_t> TcpStore::Add(absl::string_view key, int64_t delta) {
  RETURN_IF_ERROR(CheckKey("Add", key));
  MutexLock lock(&mu_);
  return AddLocked(Wire(key), delta, key);
}

absl::StatusOr<std::string> TcpStore::CompareSetLocked(
    const std::string& wire, absl::string_view expected,
    absl::string_view desired) {
  TCP_RETURN_IF_ERROR("CompareSet", EnsureConnected());
  std::string frame;
  BeginFrame(&frame, Op::kCompareSet);
  tcpstore::PutBytes(&frame, wire);
  tcpstore::PutBytes(&frame, expected);
  tcpstore::PutBytes(&frame, desired);
  TCP_RETURN_IF_ERROR("CompareSet", SendFrame(frame));
  absl::StatusOr<std::string> v = RecvBytes(ResponseDeadline());
  if (!v.ok()) return Fail("CompareSet", v.status());
  return v;
}

absl::StatusOr<std::string> TcpStore::CompareSet(absl::string_view key,
                                                 absl::string_view expected,
                                                 absl::string_view desired) {
  RETURN_IF_ERROR(CheckValue("CompareSet", key, expected));
  RETURN_IF_ERROR(CheckValue("CompareSet", key, desired));
  MutexLock lock(&mu_);
  return CompareSetLocked(Wire(key), expected, desired);
}

absl::StatusOr<bool> TcpStore::Check(absl::Span<const std::string> keys) {
  RETURN_IF_ERROR(CheckCount("Check", keys.size()));
  std::string frame;
  MutexLock lock(&mu_);
  BeginFrame(&frame, Op::kCheck);
  tcpstore::PutU64(&frame, keys.size());
  for (const std::string& k : keys) {
    RETURN_IF_ERROR(CheckKey("Check", k));
    tcpstore::PutBytes(&frame, Wire(k));
  }
  TCP_RETURN_IF_ERROR("Check", EnsureConnected());
  TCP_RETURN_IF_ERROR("Check", SendFrame(frame));
  absl::StatusOr<uint8_t> r = RecvU8(ResponseDeadline());
  if (!r.ok()) return Fail("Check", r.status());
  return *r == tcpstore::kCheckReady;
}

absl::StatusOr<std::vector<std::string>> TcpStore::MissingLocked(
    const std::vector<std::string>& wire_keys) {
  RETURN_IF_ERROR(EnsureConnected());
  std::string frame;
  for (const std::string& k : wire_keys) {
    BeginFrame(&frame, Op::kCheck);
    tcpstore::PutU64(&frame, 1);
    tcpstore::PutBytes(&frame, k);
  }
  RETURN_IF_ERROR(SendFrame(frame));
  std::vector<std::string> missing;
  const absl::Time deadline = ResponseDeadline();
  for (const std::string& k : wire_keys) {
    ASSIGN_OR_RETURN(uint8_t r, RecvU8(deadline));
    if (r != tcpstore::kCheckReady) {
      absl::string_view user = k;
      absl::ConsumePrefix(&user, tcpstore::kKeyPrefix);
      missing.emplace_back(user);
    }
  }
  return missing;
}

absl::Status TcpStore::WaitLocked(const std::vector<std::string>& wire_keys,
                                  absl::Duration timeout,
                                  absl::string_view op) {
  TCP_RETURN_IF_ERROR(op, EnsureConnected());
  std::string frame;
  BeginFrame(&frame, Op::kWait);
  tcpstore::PutU64(&frame, wire_keys.size());
  for (const std::string& k : wire_keys) tcpstore::PutBytes(&frame, k);
  TCP_RETURN_IF_ERROR(op, SendFrame(frame));
  const absl::Time start = absl::Now();
  absl::StatusOr<uint8_t> r = RecvU8(start + timeout);
  if (r.ok()) {
    if (*r != tcpstore::kStopWaiting) {
      return Fail(op, absl::InternalError(
                          absl::StrCat("unexpected WAIT response ", *r)));
    }
    return absl::OkStatus();
  }
  if (!absl::IsDeadlineExceeded(r.status())) return Fail(op, r.status());
  const absl::Duration waited = absl::Now() - start;
  if (generation_ == Generation::kCurrent) {
    frame.clear();
    BeginFrame(&frame, Op::kCancelWait);
    TCP_RETURN_IF_ERROR(op, SendFrame(frame));
    absl::StatusOr<uint8_t> c = RecvU8(absl::Now() + kCancelGrace);
    if (!c.ok()) return Fail(op, c.status());
    if (*c == tcpstore::kStopWaiting) {
      // The keys arrived just as we gave up: drain the cancel ack, succeed.
      absl::StatusOr<uint8_t> ack = RecvU8(absl::Now() + kCancelGrace);
      if (!ack.ok()) return Fail(op, ack.status());
      return absl::OkStatus();
    }
  } else {
    // PyTorch 1.13 cannot cancel a wait: start over on a fresh connection.
    Disconnect();
  }
  absl::StatusOr<std::vector<std::string>> missing = MissingLocked(wire_keys);
  std::vector<std::string> names;
  if (missing.ok()) {
    names = *std::move(missing);
  } else {
    for (const std::string& k : wire_keys) {
      absl::string_view user = k;
      absl::ConsumePrefix(&user, tcpstore::kKeyPrefix);
      names.emplace_back(user);
    }
  }
  return StoreTimeoutError(describe_, op, names, waited, timeout);
}

absl::Status TcpStore::Wait(absl::Span<const std::string> keys,
                            std::optional<absl::Duration> timeout) {
  RETURN_IF_ERROR(CheckCount("Wait", keys.size()));
  std::vector<std::string> wire;
  wire.reserve(keys.size());
  for (const std::string& k : keys) {
    RETURN_IF_ERROR(CheckKey("Wait", k));
    wire.push_back(Wire(k));
  }
  MutexLock lock(&mu_);
  return WaitLocked(wire, timeout.value_or(Timeout()), "Wait");
}

absl::StatusOr<bool> TcpStore::DeleteKey(absl::string_view key) {
  RETURN_IF_ERROR(CheckKey("DeleteKey", key));
  std::string frame;
  MutexLock lock(&mu_);
  TCP_RETURN_IF_ERROR("DeleteKey", EnsureConnected());
  BeginFrame(&frame, Op::kDeleteKey);
  tcpstore::PutBytes(&frame, Wire(key));
  TCP_RETURN_IF_ERROR("DeleteKey", SendFrame(frame));
  absl::StatusOr<int64_t> n = RecvI64(ResponseDeadline());
  if (!n.ok()) return Fail("DeleteKey", n.status());
  return *n > 0;
}

absl::StatusOr<int64_t> TcpStore::NumKeys() {
  std::string frame;
  MutexLock lock(&mu_);
  TCP_RETURN_IF_ERROR("NumKeys", EnsureConnected());
  BeginFrame(&frame, Op::kGetNumKeys);
  TCP_RETURN_IF_ERROR("NumKeys", SendFrame(frame));
  absl::StatusOr<int64_t> n = RecvI64(ResponseDeadline());
  if (!n.ok()) return Fail("NumKeys", n.status());
  return *n;
}

absl::StatusOr<std::vector<std::string>> TcpStore::MultiGet(
    absl::Span<const std::string> keys) {
  RETURN_IF_ERROR(CheckCount("MultiGet", keys.size()));
  std::vector<std::string> wire;
  wire.reserve(keys.size());
  for (const std::string& k : keys) {
    RETURN_IF_ERROR(CheckKey("MultiGet", k));
    wire.push_back(Wire(k));
  }
  MutexLock lock(&mu_);
  TCP_RETURN_IF_ERROR("MultiGet", EnsureConnected());
  auto get_all = [&](bool with_check, bool* ready)
                     ABSL_EXCLUSIVE_LOCKS_REQUIRED(
                         mu_) -> absl::StatusOr<std::vector<std::string>> {
    std::string frame;
    if (with_check) {
      BeginFrame(&frame, Op::kCheck);
      tcpstore::PutU64(&frame, wire.size());
      for (const std::string& k : wire) tcpstore::PutBytes(&frame, k);
    }
    if (generation_ == Generation::kCurrent) {
      BeginFrame(&frame, Op::kMultiGet);
      tcpstore::PutU64(&frame, wire.size());
      for (const std::string& k : wire) tcpstore::PutBytes(&frame, k);
    } else {
      for (const std::string& k : wire) {
        BeginFrame(&frame, Op::kGet);
        tcpstore::PutBytes(&frame, k);
      }
    }
    TCP_RETURN_IF_ERROR("MultiGet", SendFrame(frame));
    const absl::Time deadline = ResponseDeadline();
    if (with_check) {
      absl::StatusOr<uint8_t> r = RecvU8(deadline);
      if (!r.ok()) return Fail("MultiGet", r.status());
      *ready = *r == tcpstore::kCheckReady;
    }
    std::vector<std::string> values;
    values.reserve(wire.size());
    for (size_t i = 0; i < wire.size(); ++i) {
      absl::StatusOr<std::string> v = RecvBytes(deadline);
      if (!v.ok()) return Fail("MultiGet", v.status());
      values.push_back(*std::move(v));
    }
    return values;
  };
  if (generation_ == Generation::kCurrent) {
    bool ready = false;
    ASSIGN_OR_RETURN(std::vector<std::string> values, get_all(true, &ready));
    if (ready) return values;
  }
  RETURN_IF_ERROR(WaitLocked(wire, Timeout(), "MultiGet"));
  bool unused = false;
  return get_all(false, &unused);
}

absl::Status TcpStore::MultiSet(absl::Span<const std::string> keys,
                                absl::Span<const std::string> values) {
  if (keys.size() != values.size()) {
    return MultiSetLengthError(describe_, keys.size(), values.size());
  }
  RETURN_IF_ERROR(CheckCount("MultiSet", keys.size()));
  for (size_t i = 0; i < keys.size(); ++i) {
    RETURN_IF_ERROR(CheckValue("MultiSet", keys[i], values[i]));
  }
  std::string frame;
  MutexLock lock(&mu_);
  if (generation_ == Generation::kCurrent) {
    BeginFrame(&frame, Op::kMultiSet);
    tcpstore::PutU64(&frame, keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      tcpstore::PutBytes(&frame, Wire(keys[i]));
      tcpstore::PutBytes(&frame, values[i]);
    }
  } else {
    for (size_t i = 0; i < keys.size(); ++i) {
      BeginFrame(&frame, Op::kSet);
      tcpstore::PutBytes(&frame, Wire(keys[i]));
      tcpstore::PutBytes(&frame, values[i]);
    }
  }
  TCP_RETURN_IF_ERROR("MultiSet", EnsureConnected());
  TCP_RETURN_IF_ERROR("MultiSet", SendFrame(frame));
  return absl::OkStatus();
}

absl::Status TcpStore::Append(absl::string_view key, absl::string_view value) {
  RETURN_IF_ERROR(CheckValue("Append", key, value));
  const std::string wire = Wire(key);
  MutexLock lock(&mu_);
  TCP_RETURN_IF_ERROR("Append", EnsureConnected());
  if (generation_ == Generation::kCurrent) {
    std::string frame;
    BeginFrame(&frame, Op::kAppend);
    tcpstore::PutBytes(&frame, wire);
    tcpstore::PutBytes(&frame, value);
    TCP_RETURN_IF_ERROR("Append", SendFrame(frame));
    return absl::OkStatus();
  }
  // PyTorch 1.13 has no APPEND: compare-and-set until nobody raced us.
  std::string current;
  for (int attempt = 0; attempt < 1000; ++attempt) {
    std::string desired = absl::StrCat(current, value);
    ASSIGN_OR_RETURN(std::string now, CompareSetLocked(wire, current, desired));
    if (now == desired) return absl::OkStatus();
    current = std::move(now);
  }
  return absl::AbortedError(absl::StrCat(
      describe_, ": Append on key ", QuoteKey(key), ": too much contention"));
}

absl::Status TcpStore::QueuePush(absl::string_view key,
                                 absl::string_view value) {
  if (generation_ == Generation::kLegacy) {
    return absl::UnimplementedError(absl::StrCat(
        describe_,
        ": QueuePush: the legacy (PyTorch 1.13) protocol has no queues"));
  }
  RETURN_IF_ERROR(CheckValue("QueuePush", key, value));
  std::string frame;
  MutexLock lock(&mu_);
  TCP_RETURN_IF_ERROR("QueuePush", EnsureConnected());
  BeginFrame(&frame, Op::kQueuePush);
  tcpstore::PutBytes(&frame, Wire(key));
  tcpstore::PutBytes(&frame, value);
  TCP_RETURN_IF_ERROR("QueuePush", SendFrame(frame));
  return absl::OkStatus();
}

absl::StatusOr<std::string> TcpStore::QueuePop(
    absl::string_view key, bool block, std::optional<absl::Duration> timeout) {
  if (generation_ == Generation::kLegacy) {
    return absl::UnimplementedError(absl::StrCat(
        describe_,
        ": QueuePop: the legacy (PyTorch 1.13) protocol has no queues"));
  }
  RETURN_IF_ERROR(CheckKey("QueuePop", key));
  const std::string wire = Wire(key);
  const absl::Duration limit = timeout.value_or(Timeout());
  const absl::Time start = absl::Now();
  MutexLock lock(&mu_);
  while (true) {
    TCP_RETURN_IF_ERROR("QueuePop", EnsureConnected());
    std::string frame;
    BeginFrame(&frame, Op::kQueuePop);
    tcpstore::PutBytes(&frame, wire);
    TCP_RETURN_IF_ERROR("QueuePop", SendFrame(frame));
    const absl::Time deadline = ResponseDeadline();
    absl::StatusOr<int64_t> len = RecvI64(deadline);
    if (!len.ok()) return Fail("QueuePop", len.status());
    if (*len > 0) {
      absl::StatusOr<std::string> v = RecvBytes(deadline);
      if (!v.ok()) return Fail("QueuePop", v.status());
      return v;
    }
    if (!block) return QueueEmptyError(describe_, key);
    const absl::Duration left = limit - (absl::Now() - start);
    absl::Status s =
        left > absl::ZeroDuration()
            ? WaitLocked({wire}, left, "QueuePop")
            : StoreTimeoutError(describe_, "QueuePop", {std::string(key)},
                                absl::Now() - start, limit);
    if (absl::IsDeadlineExceeded(s)) {
      return StoreTimeoutError(describe_, "QueuePop", {std::string(key)},
                               absl::Now() - start, limit);
    }
    RETURN_IF_ERROR(s);
  }
}

absl::StatusOr<int64_t> TcpStore::QueueLen(absl::string_view key) {
  if (generation_ == Generation::kLegacy) {
    return absl::UnimplementedError(absl::StrCat(
        describe_,
        ": QueueLen: the legacy (PyTorch 1.13) protocol has no queues"));
  }
  RETURN_IF_ERROR(CheckKey("QueueLen", key));
  std::string frame;
  MutexLock lock(&mu_);
  TCP_RETURN_IF_ERROR("QueueLen", EnsureConnected());
  BeginFrame(&frame, Op::kQueueLen);
  tcpstore::PutBytes(&frame, Wire(key));
  TCP_RETURN_IF_ERROR("QueueLen", SendFrame(frame));
  absl::StatusOr<int64_t> n = RecvI64(ResponseDeadline());
  if (!n.ok()) return Fail("QueueLen", n.status());
  return *n;
}

absl::Status TcpStore::Ping() {
  if (generation_ == Generation::kLegacy) {
    return absl::UnimplementedError(
        absl::StrCat(describe_, ": Ping: the legacy protocol has no PING"));
  }
  std::string frame;
  MutexLock lock(&mu_);
  TCP_RETURN_IF_ERROR("Ping", EnsureConnected());
  const uint32_t nonce = ping_nonce_++;
  BeginFrame(&frame, Op::kPing);
  tcpstore::PutU32(&frame, nonce);
  TCP_RETURN_IF_ERROR("Ping", SendFrame(frame));
  std::string b;
  TCP_RETURN_IF_ERROR("Ping", Recv(4, ResponseDeadline(), &b));
  if (tcpstore::LoadU32(b.data()) != nonce) {
    return Fail("Ping",
                absl::InternalError("PING answered with the wrong nonce"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Store>> TcpStore::Clone() {
  TcpStoreOptions o = options_;
  o.port = port_;
  o.is_server = false;
  o.world_size.reset();
  o.timeout = Timeout();
  std::unique_ptr<TcpStore> clone(new TcpStore(o, server_, port_));
  {
    MutexLock lock(&clone->mu_);
    RETURN_IF_ERROR(clone->EnsureConnected());
  }
  return std::unique_ptr<Store>(std::move(clone));
}

std::function<absl::StatusOr<std::unique_ptr<Store>>(
    const std::string& host, int port, bool is_server, int world_size,
    absl::Duration timeout)>
MakeTcpStoreFactory() {
  return [](const std::string& host, int port, bool is_server, int world_size,
            absl::Duration timeout) -> absl::StatusOr<std::unique_ptr<Store>> {
    TcpStoreOptions o;
    o.host = host;
    o.port = port;
    o.is_server = is_server;
    if (world_size > 0) o.world_size = world_size;
    o.timeout = timeout;
    ASSIGN_OR_RETURN(o.secret, tcpstore::StoreSecretFromEnv());
    ASSIGN_OR_RETURN(std::unique_ptr<TcpStore> store, TcpStore::Create(o));
    return std::unique_ptr<Store>(std::move(store));
  };
}

}  // namespace ferry
