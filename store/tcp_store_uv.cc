#include "ferry/store/tcp_store_uv.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>

#include <utility>

#include "absl/strings/str_cat.h"

namespace ferry {
namespace tcpstore {
namespace {

struct WriteReq {
  uv_write_t req;
  std::string data;
  WriteDone done;
};

}  // namespace

std::string UvError(int code) {
  return absl::StrCat(uv_err_name(code), " (", uv_strerror(code), ")");
}

std::string AddressName(const sockaddr_storage& addr) {
  char ip[INET6_ADDRSTRLEN] = "?";
  if (addr.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&addr);
    uv_ip4_name(a, ip, sizeof(ip));
    return absl::StrCat(ip, ":", ntohs(a->sin_port));
  }
  if (addr.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&addr);
    uv_ip6_name(a, ip, sizeof(ip));
    return absl::StrCat("[", ip, "]:", ntohs(a->sin6_port));
  }
  return "unknown";
}

std::string EndpointName(uv_tcp_t* tcp, bool peer) {
  sockaddr_storage addr{};
  int len = sizeof(addr);
  const int rc =
      peer ? uv_tcp_getpeername(tcp, reinterpret_cast<sockaddr*>(&addr), &len)
           : uv_tcp_getsockname(tcp, reinterpret_cast<sockaddr*>(&addr), &len);
  return rc == 0 ? AddressName(addr) : "unknown";
}

int BoundPort(uv_tcp_t* tcp) {
  sockaddr_storage bound{};
  int len = sizeof(bound);
  uv_tcp_getsockname(tcp, reinterpret_cast<sockaddr*>(&bound), &len);
  return bound.ss_family == AF_INET6
             ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
             : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
}

std::string WriteOut(uv_stream_t* s, std::string* buf, size_t max_pending,
                     WriteDone done) {
  if (buf->empty()) return "";
  uv_buf_t b = uv_buf_init(buf->data(), buf->size());
  int rc = uv_try_write(s, &b, 1);
  if (rc == static_cast<int>(buf->size())) {
    buf->clear();
    return "";
  }
  if (rc < 0 && rc != UV_EAGAIN) {
    return absl::StrCat("write failed: ", UvError(rc));
  }
  const size_t written = rc > 0 ? static_cast<size_t>(rc) : 0;
  auto* w = new WriteReq;
  w->req.data = w;
  w->done = done;
  // Moved, not copied: large values (MiBs per GET) would otherwise be copied
  // a second time here.
  w->data = std::move(*buf);
  buf->clear();
  b = uv_buf_init(w->data.data() + written, w->data.size() - written);
  rc = uv_write(&w->req, s, &b, 1, [](uv_write_t* req, int status) {
    auto* wr = static_cast<WriteReq*>(req->data);
    WriteDone cb = wr->done;
    uv_stream_t* stream = req->handle;
    delete wr;
    if (cb != nullptr) cb(stream, status);
  });
  if (rc != 0) {
    delete w;
    return absl::StrCat("write failed: ", UvError(rc));
  }
  if (uv_stream_get_write_queue_size(s) > max_pending) {
    return absl::StrCat("more than ", max_pending,
                        " bytes of responses unread");
  }
  return "";
}

void IgnoreDefaultSigpipe() {
  struct sigaction old_action {};
  if (sigaction(SIGPIPE, nullptr, &old_action) == 0 &&
      old_action.sa_handler == SIG_DFL) {
    signal(SIGPIPE, SIG_IGN);
  }
}

void AbandonLoop(uv_loop_t* loop) {
  uv_walk(
      loop,
      [](uv_handle_t* h, void*) {
        if (!uv_is_closing(h)) uv_close(h, nullptr);
      },
      nullptr);
  uv_run(loop, UV_RUN_DEFAULT);
  uv_loop_close(loop);
}

}  // namespace tcpstore
}  // namespace ferry
