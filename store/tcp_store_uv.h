// libuv plumbing shared by the TCPStore server and relay (one loop thread
// each): error and address wording, the write path with its backlog limit,
// SIGPIPE, and closing a loop whose setup failed.
//
// Thread safety: every function runs on the thread of the loop that owns
// the handles it is given (the naming helpers are pure).
#ifndef FERRY_STORE_TCP_STORE_UV_H_
#define FERRY_STORE_TCP_STORE_UV_H_

#include <sys/socket.h>
#include <uv.h>

#include <cstddef>
#include <string>

namespace ferry {
namespace tcpstore {

// "UV_ECONNRESET (connection reset by peer)".
std::string UvError(int code);

// "1.2.3.4:80" or "[::1]:80"; "unknown" for other families.
std::string AddressName(const sockaddr_storage& addr);
// The address of `tcp`'s peer (`peer`) or its own; "unknown" on failure.
std::string EndpointName(uv_tcp_t* tcp, bool peer);
// The port `tcp` is bound to.
int BoundPort(uv_tcp_t* tcp);

// Called once a queued write finished (status < 0: it failed; UV_ECANCELED
// when the handle closed first).
using WriteDone = void (*)(uv_stream_t* stream, int status);

// Writes *buf to `s` (what the socket takes now, the rest queued), emptying
// *buf. Returns "" or why the connection must be dropped: a write error, or
// more than `max_pending` bytes queued unread. `done` (may be null) hears of
// queued writes' outcomes.
std::string WriteOut(uv_stream_t* s, std::string* buf, size_t max_pending,
                     WriteDone done);

// Ignores SIGPIPE when it still has the default disposition: libuv writes
// with write(2), and a peer hanging up mid-response must not kill us.
void IgnoreDefaultSigpipe();

// Closes every handle of a loop whose setup failed and the loop itself.
void AbandonLoop(uv_loop_t* loop);

}  // namespace tcpstore
}  // namespace ferry

#endif  // FERRY_STORE_TCP_STORE_UV_H_
