// Writes the seed corpus for tcp_store_server_fuzz: a setting byte (see the
// fuzz target) followed by client frames of both generations, honest and
// hostile, with and without the authentication frames.
// Usage: bazel run //store:tcp_store_server_corpus_gen --
// $PWD/store/testdata/tcp_store_server
#include <string>
#include <utility>
#include <vector>

#include "ferry/store/store_auth.h"
#include "ferry/store/tcp_store_protocol.h"
#include "ferry/store/testing/tcp_store_testing.h"
#include "ferry/tools/fuzz/corpus_writer.h"

namespace ferry::tcpstore {
namespace {

using namespace ::ferry::testutil;  // NOLINT: frame builders read better bare.

constexpr Generation kCur = Generation::kCurrent;
constexpr Generation kLeg = Generation::kLegacy;

std::string Mode(uint8_t m) { return std::string(1, static_cast<char>(m)); }

std::string Ping(uint32_t nonce) {
  std::string f = BareFrame(kCur, Op::kPing);
  PutU32(&f, nonce);
  return f;
}

// Every current-generation query once.
std::string CurrentOps() {
  return SetFrame(kCur, "/a", "1") + GetFrame(kCur, "/a") +
         AddFrame(kCur, "/n", 5) + AddFrame(kCur, "/a", -1) +
         KeysFrame(kCur, Op::kCheck, {"/a", "/b"}) +
         KeysFrame(kCur, Op::kWait, {"/a"}) +
         KeyValueFrame(kCur, Op::kAppend, "/a", "23") +
         CompareSetFrame(kCur, "/a", "123", "x") +
         KeysFrame(kCur, Op::kMultiGet, {"/a", "/n", "/none"}) +
         BareFrame(kCur, Op::kGetNumKeys) +
         KeyValueFrame(kCur, Op::kQueuePush, "q", "item") +
         KeyFrame(kCur, Op::kQueueLen, "q") +
         KeyFrame(kCur, Op::kQueuePop, "q") +
         KeyFrame(kCur, Op::kDeleteKey, "/a") + Ping(7) +
         BareFrame(kCur, Op::kCancelWait);
}

std::string LegacyOps() {
  return SetFrame(kLeg, "/a", "1") + GetFrame(kLeg, "/a") +
         AddFrame(kLeg, "init/", 1) + KeysFrame(kLeg, Op::kCheck, {"/a"}) +
         BareFrame(kLeg, Op::kGetNumKeys) +
         KeyFrame(kLeg, Op::kDeleteKey, "/a");
}

std::string Auth(Op op, const std::string& bytes) {
  std::string f;
  PutU8(&f, *WireCode(kCur, op));
  PutBytes(&f, bytes);
  return f;
}

fuzz::CorpusFiles Files() {
  const std::string nonce(kAuthNonceBytes, 'n');
  fuzz::CorpusFiles files = {
      {"open_current_all", Mode(0) + Validate() + CurrentOps()},
      {"open_legacy_all", Mode(0) + LegacyOps()},
      {"open_wait_pending_at_eof",
       Mode(0) + Validate() + KeysFrame(kCur, Op::kWait, {"/never"})},
      {"open_wait_twice", Mode(0) + Validate() +
                              KeysFrame(kCur, Op::kWait, {"/x"}) +
                              KeysFrame(kCur, Op::kWait, {"/y"})},
      // A 1.13 client whose timed wait() gave up: the next query drops it.
      {"open_legacy_wait_abandoned",
       Mode(0) + KeysFrame(kLeg, Op::kWait, {"/x"}) +
           KeysFrame(kLeg, Op::kWait, {"/y"}) + AddFrame(kLeg, "/n", 1) +
           SetFrame(kLeg, "/y", "1") + KeysFrame(kLeg, Op::kWait, {"/x"})},
      {"open_legacy_watch_key", Mode(0) + KeyFrame(kLeg, Op::kWatchKey, "/a")},
      {"open_append_past_limit",
       Mode(0) + Validate() +
           KeyValueFrame(kCur, Op::kAppend, "/a", std::string(200, 'v')) +
           KeyValueFrame(kCur, Op::kAppend, "/a", std::string(200, 'v'))},
      {"open_add_not_integer", Mode(0) + Validate() +
                                   SetFrame(kCur, "/a", "x") +
                                   AddFrame(kCur, "/a", 1)},
      {"open_auth_on_open_store",
       Mode(0) + Validate() + Auth(Op::kAuthChallenge, nonce)},
      {"open_wrong_magic", Mode(0) + Validate(0x12345678)},
      {"secret_set_unauthenticated",
       Mode(1) + Validate() + SetFrame(kCur, "/a", "1")},
      {"secret_legacy_set_unauthenticated",
       Mode(1) + SetFrame(kLeg, "/a", "1")},
      {"secret_wrong_proof", Mode(1) + Validate() +
                                 Auth(Op::kAuthChallenge, nonce) +
                                 Auth(Op::kAuthProof, std::string(32, 'p'))},
      {"secret_proof_first", Mode(1) + Auth(Op::kAuthProof, nonce)},
      {"secret_short_nonce", Mode(1) + Auth(Op::kAuthChallenge, "short")},
      {"secret_challenge_twice", Mode(1) + Auth(Op::kAuthChallenge, nonce) +
                                     Auth(Op::kAuthChallenge, nonce)},
      {"authenticated_current_all", Mode(2) + CurrentOps()},
      {"authenticated_repeat_auth", Mode(2) + Auth(Op::kAuthChallenge, nonce)},
      {"authenticated_legacy_all", Mode(3) + LegacyOps()},
  };
  return files;
}

}  // namespace
}  // namespace ferry::tcpstore

int main(int argc, char** argv) {
  return ferry::fuzz::CorpusMain(argc, argv, ferry::tcpstore::Files);
}
