#include "ferry/tests/util/held_port.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "gtest/gtest.h"
#include "ferry/store/tcp_store_server.h"

namespace ferry::testutil {
namespace {

// Binds 127.0.0.1:port without SO_REUSEADDR, as an unrelated process would.
bool PlainBindSucceeds(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  const bool ok =
      bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return ok;
}

TEST(HeldPort, OthersCannotTakeItButOurServerCan) {
  HeldPort held;
  ASSERT_GT(held.port(), 0);
  EXPECT_FALSE(PlainBindSucceeds(held.port()));
  TcpStoreServer::Options options;
  options.host = "127.0.0.1";
  options.port = held.port();
  auto server = TcpStoreServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_EQ((*server)->port(), held.port());
}

}  // namespace
}  // namespace ferry::testutil
