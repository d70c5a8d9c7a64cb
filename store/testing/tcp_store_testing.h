// Test helpers for TCPStore: a raw blocking socket speaking bytes, so tests
// can send exactly what a (hostile or PyTorch) client would, and frame
// builders for both protocol generations.
//
// Thread safety: a RawClient is used by one thread at a time.
#ifndef FERRY_STORE_TESTING_TCP_STORE_TESTING_H_
#define FERRY_STORE_TESTING_TCP_STORE_TESTING_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "ferry/store/tcp_store_protocol.h"

namespace ferry::testutil {

class RawClient {
 public:
  RawClient() = default;
  ~RawClient();
  RawClient(RawClient&& other) noexcept;
  RawClient& operator=(RawClient&&) = delete;
  RawClient(const RawClient&) = delete;

  // Connects to 127.0.0.1:port (one attempt).
  absl::Status Connect(int port);
  absl::Status Send(absl::string_view bytes);
  // Exactly n bytes within `timeout`.
  absl::StatusOr<std::string> Recv(size_t n,
                                   absl::Duration timeout = absl::Seconds(10));
  absl::StatusOr<uint8_t> RecvU8(absl::Duration timeout = absl::Seconds(10));
  absl::StatusOr<int64_t> RecvI64(absl::Duration timeout = absl::Seconds(10));
  absl::StatusOr<std::string> RecvBytes(
      absl::Duration timeout = absl::Seconds(10));
  // True when the peer closed the connection (EOF or reset) within
  // `timeout`, false when it stays open (any data received is discarded).
  bool ClosedByPeer(absl::Duration timeout = absl::Seconds(10));
  // True when no data is readable and the peer has not closed within
  // `timeout`.
  bool Quiet(absl::Duration timeout);
  void Close();
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
};

// Frame builders. `gen` picks the query-type numbering.
std::string Validate(uint32_t magic = tcpstore::kValidationMagic);
std::string SetFrame(tcpstore::Generation gen, absl::string_view key,
                     absl::string_view value);
std::string GetFrame(tcpstore::Generation gen, absl::string_view key);
std::string AddFrame(tcpstore::Generation gen, absl::string_view key, int64_t delta);
std::string KeysFrame(tcpstore::Generation gen, tcpstore::Op op,
                      const std::vector<std::string>& keys);
std::string KeyFrame(tcpstore::Generation gen, tcpstore::Op op, absl::string_view key);
std::string KeyValueFrame(tcpstore::Generation gen, tcpstore::Op op, absl::string_view key,
                          absl::string_view value);
std::string CompareSetFrame(tcpstore::Generation gen, absl::string_view key,
                            absl::string_view expected,
                            absl::string_view desired);
std::string BareFrame(tcpstore::Generation gen, tcpstore::Op op);

// Raises RLIMIT_NOFILE's soft limit to min(hard, want); returns the new soft
// limit.
uint64_t RaiseFdLimit(uint64_t want);

}  // namespace ferry::testutil

#endif  // FERRY_STORE_TESTING_TCP_STORE_TESTING_H_
