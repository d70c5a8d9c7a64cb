// TCPStore wire protocol: PyTorch-compatible frames, both generations.
//
// Every frame is a one-byte query type followed by its arguments. Integers
// are little-endian (what PyTorch writes on x86/ARM); a string or byte vector
// is a uint64 length followed by that many bytes.
//
// Two generations share the argument layouts and the responses but number
// the query types differently:
//  * current (PyTorch >= 2.x): the first frame is VALIDATE (type 0) carrying
//    the uint32 magic 0x3C85F7CE; then SET=1 ... QUEUE_LEN=16.
//  * legacy (PyTorch 1.13, Debian's python3-torch): no handshake, SET=0,
//    COMPARE_SET=1, GET=2, ADD=3, CHECK=4, WAIT=5, GETNUMKEYS=6,
//    WATCH_KEY=7, DELETE_KEY=8 (and, as later legacy servers did, APPEND=9,
//    MULTI_GET=10, MULTI_SET=11, CANCEL_WAIT=12).
// A server tells them apart by the first frame (FrameParser does so).
//
// Ferry extension, in both generations: AUTH_CHALLENGE (0xF0, one byte
// vector: the client's nonce) and AUTH_PROOF (0xF1, one byte vector: the
// client's proof), for stores with a shared secret (store_auth.h); answers:
// the server's nonce and proof (two byte vectors); one byte (0 = accepted).
//
// Responses: SET, APPEND, MULTI_SET, QUEUE_PUSH: none. GET, COMPARE_SET: a
// byte vector. ADD, GETNUMKEYS, DELETE_KEY, QUEUE_LEN: int64. CHECK: one byte
// (READY=0, NOT_READY=1). WAIT: one byte STOP_WAITING=0 once every key exists.
// CANCEL_WAIT: one byte WAIT_CANCELED=1. MULTI_GET: one byte vector per key.
// PING: the uint32 nonce. QUEUE_POP: int64 queue length before the pop, then
// the popped vector when that length was > 0.
//
// Thread safety: FrameParser is a plain value (one per connection); the free
// functions are stateless.
#ifndef FERRY_STORE_TCP_STORE_PROTOCOL_H_
#define FERRY_STORE_TCP_STORE_PROTOCOL_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace ferry {
namespace tcpstore {

inline constexpr uint32_t kValidationMagic = 0x3C85F7CE;  // VALIDATE's payload.

// The key workers Add 1 to on joining (PyTorch's initKey_, never prefixed).
inline constexpr absl::string_view kInitKey = "init/";
// PyTorch's client prefixes every user key with this.
inline constexpr absl::string_view kKeyPrefix = "/";

inline constexpr uint8_t kCheckReady = 0;  // CHECK: every key exists.
inline constexpr uint8_t kCheckNotReady = 1;  // CHECK: a key is missing.
inline constexpr uint8_t kStopWaiting = 0;  // WAIT: every key exists.
inline constexpr uint8_t kWaitCanceled = 1;  // CANCEL_WAIT's answer.

// The protocol generations (see above); kUnknown before the first frame.
enum class Generation { kUnknown, kCurrent, kLegacy };

// Generation-independent operations.
enum class Op : uint8_t {
  kValidate,
  kSet,
  kCompareSet,
  kGet,
  kAdd,
  kCheck,
  kWait,
  kGetNumKeys,
  kDeleteKey,
  kAppend,
  kMultiGet,
  kMultiSet,
  kCancelWait,
  kPing,
  kQueuePush,
  kQueuePop,
  kQueueLen,
  kWatchKey,       // legacy only; parsed so the server can refuse it by name.
  kAuthChallenge,  // Ferry extension (both generations)
  kAuthProof,      // Ferry extension (both generations)
};

// AUTH_CHALLENGE's query type.
inline constexpr uint8_t kAuthChallengeCode = 0xF0;
inline constexpr uint8_t kAuthProofCode = 0xF1;  // AUTH_PROOF's query type.

const char* OpName(Op op);  // "SET", "GET", ... (the wire names above).

// Wire byte of `op` in `generation`; nullopt when that generation lacks it.
std::optional<uint8_t> WireCode(Generation generation, Op op);
// The Op of wire byte `code` in `generation`; nullopt when unknown.
std::optional<Op> OpFromWire(Generation generation, uint8_t code);

// Limits enforced on every request (and checked by the client before
// sending). Defaults follow PyTorch's libuv server.
struct Limits {
  uint64_t max_key_bytes = 8 * 1024;  // Longest key.
  uint64_t max_value_bytes = 8 * 1024 * 1024;  // Longest value.
  uint64_t max_keys_per_request = 128 * 1024;  // Most keys in one frame.
  // Bounds one frame in total (a MULTI_SET of many values).
  uint64_t max_frame_bytes = 64 * 1024 * 1024;
};

// One parsed frame.
struct Request {
  Op op = Op::kValidate;  // The query.
  std::vector<std::string> keys;    // in frame order
  std::vector<std::string> values;  // SET/APPEND/QUEUE_PUSH: 1; COMPARE_SET: 2
  int64_t delta = 0;                // ADD
  uint32_t nonce = 0;               // PING, VALIDATE (magic)

  void Clear();  // Back to a default Request (the vectors keep their capacity).
};

// Incremental parser for the server side. Feed it the bytes received so far
// that have not been consumed; it parses at most one frame per call and never
// reads past `data`. A frame split across reads yields kNeedMore (nothing
// consumed) until it is complete. Any byte sequence is safe: malformed input
// gives kError with a message, never a crash, and the declared lengths are
// checked against Limits before anything is buffered, so a 2^63 length
// prefix fails at once.
class FrameParser {
 public:
  // What Parse found.
  enum class Result { kFrame, kNeedMore, kError };

  // Enforces `limits`.
  explicit FrameParser(const Limits& limits) : limits_(limits) {}

  // On kFrame: *out holds the frame and *consumed its size. On kError:
  // error() says why; the parser stays in the error state.
  Result Parse(absl::string_view data, Request* out, size_t* consumed);

  // From the first frame.
  Generation generation() const { return generation_; }
  const absl::Status& error() const { return error_; }  // After kError.

 private:
  Result Fail(absl::Status status);
  Result DetectGeneration(absl::string_view data);

  Limits limits_;
  Generation generation_ = Generation::kUnknown;
  absl::Status error_;
};

// Appends `r` as a frame of `generation` (the layouts above); false, with
// nothing appended, when that generation lacks r.op. A parsed Request
// re-encodes to the bytes it was parsed from (what a relay forwards).
bool EncodeRequest(Generation generation, const Request& r, std::string* out);

// The size of the complete response to `op` (sent with `num_keys` keys) at
// the start of `data`: 0 when more bytes are needed, SIZE_MAX when a length
// in it exceeds `max_value_bytes` (a broken peer). WAIT and CANCEL_WAIT: one
// byte; ops without a response: never asked.
size_t ResponseSize(Op op, size_t num_keys, absl::string_view data,
                    uint64_t max_value_bytes);

// Client-side encoding helpers (append to *out).
void PutU8(std::string* out, uint8_t v);
void PutU32(std::string* out, uint32_t v);  // Little-endian.
void PutU64(std::string* out, uint64_t v);  // Little-endian.
void PutBytes(std::string* out, absl::string_view bytes);  // length + bytes
uint32_t LoadU32(const char* p);  // Reads a little-endian uint32 at p.
uint64_t LoadU64(const char* p);  // Reads a little-endian uint64 at p.

}  // namespace tcpstore
}  // namespace ferry

#endif  // FERRY_STORE_TCP_STORE_PROTOCOL_H_
