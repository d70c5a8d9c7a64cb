#include "ferry/store/testing/loopback_store.h"

namespace ferry::testutil {

absl::StatusOr<std::unique_ptr<TcpStore>> StartLoopbackStore(
    absl::Duration timeout) {
  TcpStoreOptions o;
  o.host = "127.0.0.1";
  o.port = 0;
  o.is_server = true;
  o.timeout = timeout;
  return TcpStore::Create(o);
}

}  // namespace ferry::testutil
