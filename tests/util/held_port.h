// A loopback TCP port reserved for a test whose server must listen on a port
// known in advance (clients started first, or a tcp:// URL every rank reads).
//
// Picking a free port, closing it and binding it later races with every
// other process on the machine. A HeldPort binds 127.0.0.1:0 with
// SO_REUSEADDR and keeps the socket, without listening, until destroyed:
// no other process can take the port meanwhile, yet the test's server can
// bind and listen on it, because Linux lets a second SO_REUSEADDR socket
// bind a port nobody listens on (libuv sets SO_REUSEADDR on every TCP bind;
// so does TCPStore's server). Until a server listens, connecting to the port
// is refused.
#ifndef FERRY_TESTS_UTIL_HELD_PORT_H_
#define FERRY_TESTS_UTIL_HELD_PORT_H_

namespace ferry::testutil {

class HeldPort {
 public:
  HeldPort();
  ~HeldPort();
  HeldPort(const HeldPort&) = delete;
  HeldPort& operator=(const HeldPort&) = delete;

  // The port, or 0 if it could not be reserved.
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

}  // namespace ferry::testutil

#endif  // FERRY_TESTS_UTIL_HELD_PORT_H_
