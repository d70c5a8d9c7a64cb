// Writes the relay-specific seeds of tcp_store_relay_fuzz (the fuzz target
// also replays the server's corpus): pipelines the relay coalesces or
// combines, waits it shares, fences and cancels. The first byte: odd sends
// VALIDATE first (see the fuzz target).
// Usage: bazel run //store:tcp_store_relay_corpus_gen --
// $PWD/store/testdata/tcp_store_relay
#include <string>

#include "ferry/store/tcp_store_protocol.h"
#include "ferry/store/testing/tcp_store_testing.h"
#include "ferry/tools/fuzz/corpus_writer.h"

namespace ferry::tcpstore {
namespace {

using namespace ::ferry::testutil;  // NOLINT: frame builders read better bare.

constexpr Generation kCur = Generation::kCurrent;
constexpr Generation kLeg = Generation::kLegacy;

std::string Repeat(const std::string& frame, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += frame;
  return out;
}

fuzz::CorpusFiles Files() {
  const std::string current(1, '\1');
  const std::string legacy(1, '\0');
  return {
      {"coalesced_gets", current + SetFrame(kCur, "/k", "v") +
                             Repeat(GetFrame(kCur, "/k"), 8) +
                             Repeat(KeysFrame(kCur, Op::kCheck, {"/k"}), 4)},
      {"combined_adds", current + Repeat(AddFrame(kCur, "/n", 3), 6) +
                            AddFrame(kCur, "/n", -2) +
                            Repeat(AddFrame(kCur, "/n", 1), 3)},
      {"combined_adds_overflow",
       current + AddFrame(kCur, "/big", 0x7ffffffffffffff0) +
           Repeat(AddFrame(kCur, "/big", 9), 4)},
      {"set_then_wait_fence", current + SetFrame(kCur, "/f", "1") +
                                  KeyFrame(kCur, Op::kDeleteKey, "/f") +
                                  KeysFrame(kCur, Op::kWait, {"/f", "/g"}) +
                                  BareFrame(kCur, Op::kGetNumKeys)},
      {"wait_cancel_wait",
       current + KeysFrame(kCur, Op::kWait, {"/w"}) +
           BareFrame(kCur, Op::kCancelWait) +
           KeysFrame(kCur, Op::kWait, {"/w", "/w"}) +
           SetFrame(kCur, "/w", "1") + BareFrame(kCur, Op::kCancelWait)},
      {"empty_wait_and_multi_get",
       current + KeysFrame(kCur, Op::kWait, {}) +
           KeysFrame(kCur, Op::kMultiGet, {}) +
           KeysFrame(kCur, Op::kMultiGet, {"/a", "/b"})},
      {"legacy_waits_abandoned",
       legacy + KeysFrame(kLeg, Op::kWait, {"/x"}) +
           KeysFrame(kLeg, Op::kWait, {"/y"}) + AddFrame(kLeg, "/n", 1) +
           Repeat(GetFrame(kLeg, "/n"), 3)},
      {"queue_ops", current + KeyValueFrame(kCur, Op::kQueuePush, "q", "i") +
                        KeyFrame(kCur, Op::kQueueLen, "q") +
                        Repeat(KeyFrame(kCur, Op::kQueuePop, "q"), 2)},
  };
}

}  // namespace
}  // namespace ferry::tcpstore

int main(int argc, char** argv) {
  return ferry::fuzz::CorpusMain(argc, argv, ferry::tcpstore::Files);
}
