#include "ferry/store/testing/tcp_store_testing.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace ferry::testutil {

using tcpstore::Generation;
using tcpstore::Op;
using tcpstore::PutBytes;
using tcpstore::PutU8;
using tcpstore::PutU32;
using tcpstore::PutU64;
using tcpstore::LoadU64;
using tcpstore::WireCode;

RawClient::~RawClient() { Close(); }

RawClient::RawClient(RawClient&& other) noexcept : fd_(other.fd_) {
  other.fd_ = -1;
}

void RawClient::Close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

absl::Status RawClient::Connect(int port) {
  Close();
  fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd_ < 0)
    return absl::InternalError(absl::StrCat("socket: ", strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    int err = errno;
    Close();
    return absl::UnavailableError(absl::StrCat("connect: ", strerror(err)));
  }
  int one = 1;
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return absl::OkStatus();
}

absl::Status RawClient::Send(absl::string_view bytes) {
  size_t off = 0;
  while (off < bytes.size()) {
    ssize_t n =
        ::send(fd_, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::UnavailableError(absl::StrCat("send: ", strerror(errno)));
    }
    off += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> RawClient::Recv(size_t n, absl::Duration timeout) {
  std::string out(n, '\0');
  size_t got = 0;
  const absl::Time deadline = absl::Now() + timeout;
  while (got < n) {
    pollfd p{fd_, POLLIN, 0};
    const int ms = static_cast<int>(std::max<int64_t>(
        0, absl::ToInt64Milliseconds(deadline - absl::Now())));
    int rc = ::poll(&p, 1, ms);
    if (rc == 0) return absl::DeadlineExceededError("recv timed out");
    if (rc < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError(strerror(errno));
    }
    ssize_t r = ::recv(fd_, out.data() + got, n - got, 0);
    if (r == 0) return absl::UnavailableError("closed by peer");
    if (r < 0) {
      if (errno == EINTR) continue;
      return absl::UnavailableError(absl::StrCat("recv: ", strerror(errno)));
    }
    got += static_cast<size_t>(r);
  }
  return out;
}

absl::StatusOr<uint8_t> RawClient::RecvU8(absl::Duration timeout) {
  absl::StatusOr<std::string> b = Recv(1, timeout);
  if (!b.ok()) return b.status();
  return static_cast<uint8_t>((*b)[0]);
}

absl::StatusOr<int64_t> RawClient::RecvI64(absl::Duration timeout) {
  absl::StatusOr<std::string> b = Recv(8, timeout);
  if (!b.ok()) return b.status();
  return static_cast<int64_t>(LoadU64(b->data()));
}

absl::StatusOr<std::string> RawClient::RecvBytes(absl::Duration timeout) {
  absl::StatusOr<std::string> b = Recv(8, timeout);
  if (!b.ok()) return b.status();
  return Recv(LoadU64(b->data()), timeout);
}

bool RawClient::ClosedByPeer(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  char buf[4096];
  while (absl::Now() < deadline) {
    pollfd p{fd_, POLLIN, 0};
    const int ms = static_cast<int>(std::max<int64_t>(
        1, absl::ToInt64Milliseconds(deadline - absl::Now())));
    int rc = ::poll(&p, 1, ms);
    if (rc <= 0) continue;
    ssize_t r = ::recv(fd_, buf, sizeof(buf), 0);
    if (r == 0) return true;
    if (r < 0 && errno != EINTR && errno != EAGAIN) return true;
  }
  return false;
}

bool RawClient::Quiet(absl::Duration timeout) {
  pollfd p{fd_, POLLIN, 0};
  return ::poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(timeout))) ==
         0;
}

namespace {
void Code(std::string* out, Generation gen, Op op) {
  PutU8(out, WireCode(gen, op).value());
}
}  // namespace

std::string Validate(uint32_t magic) {
  std::string f;
  PutU8(&f, 0);
  PutU32(&f, magic);
  return f;
}

std::string SetFrame(Generation gen, absl::string_view key,
                     absl::string_view value) {
  return KeyValueFrame(gen, Op::kSet, key, value);
}

std::string GetFrame(Generation gen, absl::string_view key) {
  return KeyFrame(gen, Op::kGet, key);
}

std::string AddFrame(Generation gen, absl::string_view key, int64_t delta) {
  std::string f;
  Code(&f, gen, Op::kAdd);
  PutBytes(&f, key);
  PutU64(&f, static_cast<uint64_t>(delta));
  return f;
}

std::string KeysFrame(Generation gen, Op op,
                      const std::vector<std::string>& keys) {
  std::string f;
  Code(&f, gen, op);
  PutU64(&f, keys.size());
  for (const std::string& k : keys) PutBytes(&f, k);
  return f;
}

std::string KeyFrame(Generation gen, Op op, absl::string_view key) {
  std::string f;
  Code(&f, gen, op);
  PutBytes(&f, key);
  return f;
}

std::string KeyValueFrame(Generation gen, Op op, absl::string_view key,
                          absl::string_view value) {
  std::string f;
  Code(&f, gen, op);
  PutBytes(&f, key);
  PutBytes(&f, value);
  return f;
}

std::string CompareSetFrame(Generation gen, absl::string_view key,
                            absl::string_view expected,
                            absl::string_view desired) {
  std::string f;
  Code(&f, gen, Op::kCompareSet);
  PutBytes(&f, key);
  PutBytes(&f, expected);
  PutBytes(&f, desired);
  return f;
}

std::string BareFrame(Generation gen, Op op) {
  std::string f;
  Code(&f, gen, op);
  return f;
}

uint64_t RaiseFdLimit(uint64_t want) {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) return 0;
  if (rl.rlim_cur < want) {
    rl.rlim_cur = std::min<rlim_t>(want, rl.rlim_max);
    ::setrlimit(RLIMIT_NOFILE, &rl);
    ::getrlimit(RLIMIT_NOFILE, &rl);
  }
  return rl.rlim_cur;
}

}  // namespace ferry::testutil
