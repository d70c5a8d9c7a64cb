// A TCPStore server (with its own client) hosted by a test process on
// 127.0.0.1 at a port the kernel picks, for the processes the test spawns
// to meet through (MASTER_ADDR=127.0.0.1, MASTER_PORT=store->port()).
#ifndef FERRY_STORE_TESTING_LOOPBACK_STORE_H_
#define FERRY_STORE_TESTING_LOOPBACK_STORE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ferry/store/tcp_store.h"

namespace ferry::testutil {

// Waits of its client time out after `timeout`. Errors: TcpStore::Create's.
absl::StatusOr<std::unique_ptr<TcpStore>> StartLoopbackStore(
    absl::Duration timeout = absl::Seconds(60));

}  // namespace ferry::testutil

#endif  // FERRY_STORE_TESTING_LOOPBACK_STORE_H_
