// Protocol-level tests of TcpStoreServer with raw sockets: both PyTorch
// protocol generations byte for byte, partial and pipelined frames, hostile
// input, limits, many concurrent clients and shutdown.
#include "ferry/store/tcp_store_server.h"

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "ferry/common/logging.h"
#include "ferry/common/sync.h"
#include "gtest/gtest.h"
#include "ferry/store/tcp_store_protocol.h"
#include "ferry/store/testing/tcp_store_testing.h"

namespace ferry {
namespace {

using tcpstore::Generation;
using tcpstore::Op;
using namespace testutil;  // NOLINT: frame builders read better bare.

constexpr Generation kCur = Generation::kCurrent;
constexpr Generation kLeg = Generation::kLegacy;

// Collects WARNING lines from the server (the log sink is process-wide).
class LogCapture {
 public:
  LogCapture() {
    Instance() = this;
    SetLogSinkForTest(&Sink);
  }
  ~LogCapture() {
    SetLogSinkForTest(nullptr);
    Instance() = nullptr;
  }
  std::vector<std::string> Lines() {
    MutexLock lock(&mu_);
    return lines_;
  }
  // Lines containing `needle`, waiting up to 10 s for at least `min`.
  int CountWithin(absl::string_view needle, int min) {
    MutexLock lock(&mu_);
    auto count = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      int n = 0;
      for (const std::string& l : lines_) n += absl::StrContains(l, needle);
      return n;
    };
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return count() >= min;
    };
    mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(10));
    return count();
  }

 private:
  static LogCapture*& Instance() {
    static LogCapture* instance = nullptr;
    return instance;
  }
  static void Sink(absl::string_view line) {
    LogCapture* c = Instance();
    if (c == nullptr) return;
    MutexLock lock(&c->mu_);
    c->lines_.emplace_back(line);
  }
  Mutex mu_;
  std::vector<std::string> lines_ ABSL_GUARDED_BY(mu_);
};

class TcpStoreServerTest : public ::testing::Test {
 protected:
  void SetUp() override { Start(TcpStoreServer::Options{}); }

  void Start(TcpStoreServer::Options options) {
    server_.reset();
    options.host = "127.0.0.1";
    options.port = 0;
    auto server = TcpStoreServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  RawClient Connect(Generation gen) {
    RawClient c;
    EXPECT_TRUE(c.Connect(server_->port()).ok());
    if (gen == kCur) {
      EXPECT_TRUE(c.Send(Validate()).ok());
    }
    return c;
  }

  // A working client proves the server still serves (within `timeout`).
  void ExpectServing(absl::Duration timeout = absl::Seconds(10)) {
    RawClient c = Connect(kCur);
    ASSERT_TRUE(c.Send(AddFrame(kCur, "/alive", 1)).ok());
    absl::StatusOr<int64_t> v = c.RecvI64(timeout);
    ASSERT_TRUE(v.ok()) << v.status();
    EXPECT_GE(*v, 1);
  }

  std::unique_ptr<TcpStoreServer> server_;
};

TEST_F(TcpStoreServerTest, PortZeroReportsChosenPort) {
  EXPECT_GT(server_->port(), 0);
  EXPECT_TRUE(
      absl::StrContains(server_->address(), absl::StrCat(server_->port())));
}

TEST_F(TcpStoreServerTest, CurrentProtocolEveryQueryType) {
  RawClient c = Connect(kCur);
  ASSERT_TRUE(c.Send(SetFrame(kCur, "/a", "1")).ok());
  ASSERT_TRUE(c.Send(GetFrame(kCur, "/a")).ok());
  EXPECT_EQ(c.RecvBytes().value_or("?"), "1");
  ASSERT_TRUE(c.Send(AddFrame(kCur, "/n", 5)).ok());
  EXPECT_EQ(c.RecvI64().value_or(-1), 5);
  ASSERT_TRUE(c.Send(AddFrame(kCur, "/n", -7)).ok());
  EXPECT_EQ(c.RecvI64().value_or(-1), -2);
  ASSERT_TRUE(c.Send(KeysFrame(kCur, Op::kCheck, {"/a", "/n"})).ok());
  EXPECT_EQ(c.RecvU8().value_or(9), tcpstore::kCheckReady);
  ASSERT_TRUE(c.Send(KeysFrame(kCur, Op::kCheck, {"/a", "/zz"})).ok());
  EXPECT_EQ(c.RecvU8().value_or(9), tcpstore::kCheckNotReady);
  ASSERT_TRUE(c.Send(BareFrame(kCur, Op::kGetNumKeys)).ok());
  EXPECT_EQ(c.RecvI64().value_or(-1), 2);
  ASSERT_TRUE(c.Send(CompareSetFrame(kCur, "/a", "1", "2")).ok());
  EXPECT_EQ(c.RecvBytes().value_or("?"), "2");
  ASSERT_TRUE(c.Send(CompareSetFrame(kCur, "/a", "1", "3")).ok());
  EXPECT_EQ(c.RecvBytes().value_or("?"), "2");
  ASSERT_TRUE(c.Send(CompareSetFrame(kCur, "/new", "", "x")).ok());
  EXPECT_EQ(c.RecvBytes().value_or("?"), "x");
  ASSERT_TRUE(c.Send(KeyValueFrame(kCur, Op::kAppend, "/a", "bc")).ok());
  ASSERT_TRUE(c.Send(GetFrame(kCur, "/a")).ok());
  EXPECT_EQ(c.RecvBytes().value_or("?"), "2bc");
  {
    std::string f;
    tcpstore::PutU8(&f, *tcpstore::WireCode(kCur, Op::kMultiSet));
    tcpstore::PutU64(&f, 2);
    tcpstore::PutBytes(&f, "/m1");
    tcpstore::PutBytes(&f, "v1");
    tcpstore::PutBytes(&f, "/m2");
    tcpstore::PutBytes(&f, "v2");
    ASSERT_TRUE(c.Send(f).ok());
  }
  ASSERT_TRUE(c.Send(KeysFrame(kCur, Op::kMultiGet, {"/m2", "/m1"})).ok());
  EXPECT_EQ(c.RecvBytes().value_or("?"), "v2");
  EXPECT_EQ(c.RecvBytes().value_or("?"), "v1");
  ASSERT_TRUE(c.Send(KeyFrame(kCur, Op::kDeleteKey, "/m1")).ok());
  EXPECT_EQ(c.RecvI64().value_or(-1), 1);
  ASSERT_TRUE(c.Send(KeyFrame(kCur, Op::kDeleteKey, "/m1")).ok());
  EXPECT_EQ(c.RecvI64().value_or(-1), 0);
  {
    std::string f;
    tcpstore::PutU8(&f, *tcpstore::WireCode(kCur, Op::kPing));
    tcpstore::PutU32(&f, 0xABCD1234);
    ASSERT_TRUE(c.Send(f).ok());
    absl::StatusOr<std::string> nonce = c.Recv(4);
    ASSERT_TRUE(nonce.ok());
    EXPECT_EQ(tcpstore::LoadU32(nonce->data()), 0xABCD1234u);
  }
  ASSERT_TRUE(c.Send(KeyValueFrame(kCur, Op::kQueuePush, "/q", "i1")).ok());
  ASSERT_TRUE(c.Send(KeyValueFrame(kCur, Op::kQueuePush, "/q", "i2")).ok());
  ASSERT_TRUE(c.Send(KeyFrame(kCur, Op::kQueueLen, "/q")).ok());
  EXPECT_EQ(c.RecvI64().value_or(-1), 2);
  ASSERT_TRUE(c.Send(KeyFrame(kCur, Op::kQueuePop, "/q")).ok());
  EXPECT_EQ(c.RecvI64().value_or(-1), 2);
  EXPECT_EQ(c.RecvBytes().value_or("?"), "i1");
  ASSERT_TRUE(c.Send(KeyFrame(kCur, Op::kQueuePop, "/q")).ok());
  EXPECT_EQ(c.RecvI64().value_or(-1), 1);
  EXPECT_EQ(c.RecvBytes().value_or("?"), "i2");
  ASSERT_TRUE(c.Send(KeyFrame(kCur, Op::kQueuePop, "/q")).ok());
  EXPECT_EQ(c.RecvI64().value_or(-1), 0);
  // GET of a missing key answers an empty value (PyTorch's libuv server).
  ASSERT_TRUE(c.Send(GetFrame(kCur, "/missing")).ok());
  EXPECT_EQ(c.RecvBytes().value_or("?"), "");
}

TEST_F(TcpStoreServerTest, WaitIsWokenBySetFromAnotherClient) {
  RawClient waiter = Connect(kCur);
  RawClient setter = Connect(kCur);
  ASSERT_TRUE(waiter.Send(KeysFrame(kCur, Op::kWait, {"/w1", "/w2"})).ok());
  // Round trip on the waiter's connection: the WAIT has been registered.
  ASSERT_TRUE(waiter.Send(BareFrame(kCur, Op::kGetNumKeys)).ok());
  EXPECT_EQ(waiter.RecvI64().value_or(-1), 0);
  ASSERT_TRUE(setter.Send(SetFrame(kCur, "/w1", "x")).ok());
  EXPECT_TRUE(waiter.Quiet(absl::Milliseconds(50)));
  ASSERT_TRUE(setter.Send(AddFrame(kCur, "/w2", 1)).ok());
  EXPECT_EQ(setter.RecvI64().value_or(-1), 1);
  EXPECT_EQ(waiter.RecvU8().value_or(9), tcpstore::kStopWaiting);
}

TEST_F(TcpStoreServerTest, CancelWait) {
  RawClient c = Connect(kCur);
  ASSERT_TRUE(c.Send(KeysFrame(kCur, Op::kWait, {"/never"})).ok());
  ASSERT_TRUE(c.Send(BareFrame(kCur, Op::kCancelWait)).ok());
  EXPECT_EQ(c.RecvU8().value_or(9), tcpstore::kWaitCanceled);
  // The canceled wait is gone: setting the key sends nothing more.
  RawClient other = Connect(kCur);
  ASSERT_TRUE(other.Send(SetFrame(kCur, "/never", "x")).ok());
  ASSERT_TRUE(other.Send(BareFrame(kCur, Op::kGetNumKeys)).ok());
  ASSERT_TRUE(other.RecvI64().ok());  // the SET has been applied
  ASSERT_TRUE(c.Send(KeyFrame(kCur, Op::kDeleteKey, "/never")).ok());
  EXPECT_EQ(c.RecvI64().value_or(-1), 1);
}

TEST_F(TcpStoreServerTest, QueuePushWakesOneWaiter) {
  RawClient a = Connect(kCur);
  RawClient b = Connect(kCur);
  for (RawClient* c : {&a, &b}) {
    ASSERT_TRUE(c->Send(KeysFrame(kCur, Op::kWait, {"/q"})).ok());
    ASSERT_TRUE(c->Send(BareFrame(kCur, Op::kGetNumKeys)).ok());
    ASSERT_TRUE(c->RecvI64().ok());
  }
  RawClient p = Connect(kCur);
  ASSERT_TRUE(p.Send(KeyValueFrame(kCur, Op::kQueuePush, "/q", "item")).ok());
  EXPECT_EQ(a.RecvU8().value_or(9), tcpstore::kStopWaiting);
  EXPECT_TRUE(b.Quiet(absl::Milliseconds(50)));
  ASSERT_TRUE(p.Send(KeyValueFrame(kCur, Op::kQueuePush, "/q", "item2")).ok());
  EXPECT_EQ(b.RecvU8().value_or(9), tcpstore::kStopWaiting);
}

// PyTorch 1.13: no VALIDATE, SET = 0, and the first frame is ADD("init/").
TEST_F(TcpStoreServerTest, LegacyProtocolAsPyTorch113SpeaksIt) {
  RawClient c = Connect(kLeg);
  ASSERT_TRUE(c.Send(AddFrame(kLeg, "init/", 1)).ok());
  EXPECT_EQ(c.RecvI64().value_or(-1), 1);
  ASSERT_TRUE(c.Send(SetFrame(kLeg, "/k", "v")).ok());
  ASSERT_TRUE(c.Send(KeysFrame(kLeg, Op::kWait, {"/k"})).ok());
  EXPECT_EQ(c.RecvU8().value_or(9), tcpstore::kStopWaiting);
  ASSERT_TRUE(c.Send(GetFrame(kLeg, "/k")).ok());
  EXPECT_EQ(c.RecvBytes().value_or("?"), "v");
  ASSERT_TRUE(c.Send(KeysFrame(kLeg, Op::kCheck, {"/k", "/none"})).ok());
  EXPECT_EQ(c.RecvU8().value_or(9), tcpstore::kCheckNotReady);
  ASSERT_TRUE(c.Send(CompareSetFrame(kLeg, "/k", "v", "w")).ok());
  EXPECT_EQ(c.RecvBytes().value_or("?"), "w");
  ASSERT_TRUE(c.Send(BareFrame(kLeg, Op::kGetNumKeys)).ok());
  EXPECT_EQ(c.RecvI64().value_or(-1), 2);
  ASSERT_TRUE(c.Send(KeyFrame(kLeg, Op::kDeleteKey, "/k")).ok());
  EXPECT_EQ(c.RecvI64().value_or(-1), 1);
  // A legacy waiter woken by a current-generation client.
  ASSERT_TRUE(c.Send(KeysFrame(kLeg, Op::kWait, {"/later"})).ok());
  RawClient cur = Connect(kCur);
  ASSERT_TRUE(cur.Send(SetFrame(kCur, "/later", "1")).ok());
  EXPECT_EQ(c.RecvU8().value_or(9), tcpstore::kStopWaiting);
}

TEST_F(TcpStoreServerTest, LegacySetAsFirstFrame) {
  RawClient c = Connect(kLeg);
  ASSERT_TRUE(c.Send(SetFrame(kLeg, "/first", "1")).ok());
  ASSERT_TRUE(c.Send(GetFrame(kLeg, "/first")).ok());
  EXPECT_EQ(c.RecvBytes().value_or("?"), "1");
}

TEST_F(TcpStoreServerTest, FramesSplitIntoSingleBytes) {
  RawClient c;
  ASSERT_TRUE(c.Connect(server_->port()).ok());
  const std::string bytes = Validate() + SetFrame(kCur, "/split", "value") +
                            GetFrame(kCur, "/split") + AddFrame(kCur, "/c", 3);
  for (char b : bytes) ASSERT_TRUE(c.Send(std::string(1, b)).ok());
  EXPECT_EQ(c.RecvBytes().value_or("?"), "value");
  EXPECT_EQ(c.RecvI64().value_or(-1), 3);
}

TEST_F(TcpStoreServerTest, PipelinedFramesInOneWrite) {
  RawClient c;
  ASSERT_TRUE(c.Connect(server_->port()).ok());
  std::string bytes = Validate();
  for (int i = 0; i < 100; ++i) bytes += AddFrame(kCur, "/p", 1);
  ASSERT_TRUE(c.Send(bytes).ok());
  for (int i = 1; i <= 100; ++i) EXPECT_EQ(c.RecvI64().value_or(-1), i);
}

// --- hostile input: one log line, only that client dropped ---------------

class HostileTest : public TcpStoreServerTest {
 protected:
  void ExpectDropped(RawClient& c, absl::string_view reason) {
    EXPECT_TRUE(c.ClosedByPeer()) << reason;
    EXPECT_EQ(log_.CountWithin("dropping client", 1), 1) << reason;
    EXPECT_EQ(log_.CountWithin(reason, 1), 1) << reason;
    ExpectServing();
    EXPECT_EQ(server_->GetStats().dropped, 1);
  }
  // The server's loop may still log (a late write error) until it stops: stop
  // it while log_ is alive (members die before the base's server_).
  void TearDown() override { server_.reset(); }
  LogCapture log_;
};

TEST_F(HostileTest, GarbageBytes) {
  RawClient bystander = Connect(kCur);
  RawClient c;
  ASSERT_TRUE(c.Connect(server_->port()).ok());
  ASSERT_TRUE(c.Send(std::string(64, '\xff')).ok());
  ExpectDropped(c, "unknown query type 255");
  ASSERT_TRUE(bystander.Send(AddFrame(kCur, "/b", 1)).ok());
  EXPECT_EQ(bystander.RecvI64().value_or(-1), 1);
}

TEST_F(HostileTest, WrongMagic) {
  RawClient c;
  ASSERT_TRUE(c.Connect(server_->port()).ok());
  ASSERT_TRUE(c.Send(Validate(0xDEADBEEF) + std::string(8, '\x01')).ok());
  ExpectDropped(c, "bad handshake");
}

TEST_F(HostileTest, HugeLengthPrefix) {
  RawClient c = Connect(kCur);
  std::string f;
  tcpstore::PutU8(&f, *tcpstore::WireCode(kCur, Op::kSet));
  tcpstore::PutU64(&f, uint64_t{1} << 63);
  ASSERT_TRUE(c.Send(f).ok());
  ExpectDropped(c, "exceeds the limit");
}

TEST_F(HostileTest, TruncatedFrameThenHangUp) {
  RawClient c = Connect(kCur);
  std::string f = SetFrame(kCur, "/t", "0123456789");
  ASSERT_TRUE(c.Send(f.substr(0, f.size() - 3)).ok());
  c.Close();
  ExpectServing();
  RawClient check = Connect(kCur);
  ASSERT_TRUE(check.Send(KeysFrame(kCur, Op::kCheck, {"/t"})).ok());
  EXPECT_EQ(check.RecvU8().value_or(9), tcpstore::kCheckNotReady);
  EXPECT_EQ(server_->GetStats().dropped, 0);
}

// The server's writes to a client that already hung up fail with EPIPE;
// they must neither kill the process (SIGPIPE) nor disturb others.
TEST_F(HostileTest, HangUpBeforeReadingResponses) {
  RawClient setter = Connect(kCur);
  ASSERT_TRUE(setter.Send(SetFrame(kCur, "/big", std::string(1 << 20, 'b'))).ok());
  // 16 MiB of responses per client: more than loopback's socket buffers
  // hold, so the server still has writes queued when it learns of the
  // hang-up.
  for (int round = 0; round < 2; ++round) {
    RawClient c = Connect(kCur);
    std::string gets;
    for (int i = 0; i < 16; ++i) gets += GetFrame(kCur, "/big");
    ASSERT_TRUE(c.Send(gets).ok());
    c.Close();
  }
  // Copying 32 MiB of fresh responses is page-fault heavy: at load ~20 on
  // two cores it took the loop seconds of wall time (the 10 s default failed).
  ExpectServing(absl::Seconds(60));
}

TEST_F(HostileTest, SilentClientIsKeptAndHarmless) {
  RawClient silent;
  ASSERT_TRUE(silent.Connect(server_->port()).ok());
  ExpectServing();
  EXPECT_TRUE(silent.Quiet(absl::Milliseconds(20)));
  EXPECT_EQ(server_->GetStats().dropped, 0);
}

TEST_F(HostileTest, DisconnectMidWait) {
  {
    RawClient c = Connect(kCur);
    ASSERT_TRUE(c.Send(KeysFrame(kCur, Op::kWait, {"/gone"})).ok());
    ASSERT_TRUE(c.Send(BareFrame(kCur, Op::kGetNumKeys)).ok());
    ASSERT_TRUE(c.RecvI64().ok());
  }
  EXPECT_EQ(log_.CountWithin("disconnected while waiting", 1), 1);
  // Waking the departed waiter's key is harmless.
  RawClient s = Connect(kCur);
  ASSERT_TRUE(s.Send(SetFrame(kCur, "/gone", "x")).ok());
  ExpectServing();
}

TEST_F(HostileTest, WatchKeyIsRefusedByName) {
  RawClient c = Connect(kLeg);
  ASSERT_TRUE(c.Send(KeyFrame(kLeg, Op::kWatchKey, "/k")).ok());
  ExpectDropped(c, "WATCH_KEY");
}

// A second WAIT while one is pending (the first abandoned by a client whose
// wait timed out) replaces it: only the newer one answers, and setting the
// abandoned key later sends nothing.
TEST_F(HostileTest, SecondWaitReplacesAbandonedWait) {
  RawClient c = Connect(kCur);
  RawClient setter = Connect(kCur);
  ASSERT_TRUE(c.Send(KeysFrame(kCur, Op::kWait, {"/x"}) +
                     KeysFrame(kCur, Op::kWait, {"/y"}) +
                     BareFrame(kCur, Op::kGetNumKeys))
                  .ok());
  EXPECT_EQ(c.RecvI64().value_or(-1), 0);  // both WAITs handled
  EXPECT_EQ(server_->GetStats().waiting, 1);
  ASSERT_TRUE(setter.Send(SetFrame(kCur, "/x", "1") +
                          BareFrame(kCur, Op::kGetNumKeys))
                  .ok());
  EXPECT_EQ(setter.RecvI64().value_or(-1), 1);  // /x set: no reply to c
  ASSERT_TRUE(setter.Send(SetFrame(kCur, "/y", "1")).ok());
  EXPECT_EQ(c.RecvU8().value_or(9), tcpstore::kStopWaiting);
  // In step: the next response is exactly the next query's.
  ASSERT_TRUE(c.Send(AddFrame(kCur, "/n", 7)).ok());
  EXPECT_EQ(c.RecvI64().value_or(-1), 7);
  EXPECT_TRUE(c.Quiet(absl::Milliseconds(20)));
  const TcpStoreServer::Stats stats = server_->GetStats();
  EXPECT_EQ(stats.dropped, 0);
  EXPECT_EQ(stats.waiting, 0);
}

// PyTorch 1.13's timed wait() in a loop, then other queries, as elastic
// rendezvous polls: every abandoned WAIT is dropped (a legacy client has no
// CANCEL_WAIT and sends nothing while it really waits), so setting the
// abandoned keys afterwards never sends a stale STOP_WAITING.
TEST_F(HostileTest, LegacyTimedWaitsInALoopStayInStep) {
  RawClient c = Connect(kLeg);
  ASSERT_TRUE(c.Send(AddFrame(kLeg, "init/", 1)).ok());
  EXPECT_EQ(c.RecvI64().value_or(-1), 1);
  constexpr int kWaits = 5;
  for (int i = 0; i < kWaits; ++i) {
    ASSERT_TRUE(
        c.Send(KeysFrame(kLeg, Op::kWait, {absl::StrCat("/late", i)})).ok());
  }
  // The last WAIT is abandoned by the next non-WAIT query.
  ASSERT_TRUE(c.Send(AddFrame(kLeg, "/polls", 1)).ok());
  EXPECT_EQ(c.RecvI64().value_or(-1), 1);
  EXPECT_EQ(server_->GetStats().waiting, 0);
  RawClient setter = Connect(kCur);
  std::string sets;
  for (int i = 0; i < kWaits; ++i) {
    sets += SetFrame(kCur, absl::StrCat("/late", i), "v");
  }
  ASSERT_TRUE(setter.Send(sets + BareFrame(kCur, Op::kGetNumKeys)).ok());
  EXPECT_EQ(setter.RecvI64().value_or(-1), kWaits + 2);
  // A stale STOP_WAITING would shift every later response by one byte.
  ASSERT_TRUE(c.Send(KeysFrame(kLeg, Op::kWait, {"/late0"})).ok());
  EXPECT_EQ(c.RecvU8().value_or(9), tcpstore::kStopWaiting);
  ASSERT_TRUE(c.Send(GetFrame(kLeg, "/late4")).ok());
  EXPECT_EQ(c.RecvBytes().value_or("?"), "v");
  EXPECT_TRUE(c.Quiet(absl::Milliseconds(20)));
  EXPECT_EQ(server_->GetStats().dropped, 0);
}

TEST_F(HostileTest, NonIntegerAddAnswersSentinelAndKeepsValue) {
  RawClient c = Connect(kCur);
  ASSERT_TRUE(
      c.Send(SetFrame(kCur, "/txt", "abc") + AddFrame(kCur, "/txt", 1)).ok());
  EXPECT_EQ(c.RecvI64().value_or(0), std::numeric_limits<int64_t>::min());
  ASSERT_TRUE(
      c.Send(AddFrame(kCur, "/max", std::numeric_limits<int64_t>::max()) +
             AddFrame(kCur, "/max", 1))
          .ok());
  EXPECT_EQ(c.RecvI64().value_or(0), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(c.RecvI64().value_or(0), std::numeric_limits<int64_t>::min());
  ASSERT_TRUE(c.Send(GetFrame(kCur, "/txt")).ok());
  EXPECT_EQ(c.RecvBytes().value_or("?"), "abc");
}

// --- limits ----------------------------------------------------------------

class LimitsTest : public HostileTest {
 protected:
  void SetUp() override {
    TcpStoreServer::Options o;
    o.limits.max_key_bytes = 16;
    o.limits.max_value_bytes = 32;
    o.limits.max_keys_per_request = 4;
    Start(o);
  }
};

TEST_F(LimitsTest, KeyTooLong) {
  RawClient c = Connect(kCur);
  ASSERT_TRUE(c.Send(SetFrame(kCur, std::string(17, 'k'), "v")).ok());
  ExpectDropped(c, "key of 17 bytes exceeds the limit of 16");
}

TEST_F(LimitsTest, ValueTooBig) {
  RawClient c = Connect(kCur);
  ASSERT_TRUE(c.Send(SetFrame(kCur, "/k", std::string(33, 'v'))).ok());
  ExpectDropped(c, "value of 33 bytes exceeds the limit of 32");
}

TEST_F(LimitsTest, TooManyKeys) {
  RawClient c = Connect(kCur);
  ASSERT_TRUE(
      c.Send(KeysFrame(kCur, Op::kCheck, {"a", "b", "c", "d", "e"})).ok());
  ExpectDropped(c, "5 keys exceed the limit of 4");
}

TEST_F(LimitsTest, AppendCannotGrowPastValueLimit) {
  RawClient c = Connect(kCur);
  ASSERT_TRUE(
      c.Send(KeyValueFrame(kCur, Op::kAppend, "/a", std::string(20, 'x')))
          .ok());
  ASSERT_TRUE(
      c.Send(KeyValueFrame(kCur, Op::kAppend, "/a", std::string(20, 'x')))
          .ok());
  ExpectDropped(c, "APPEND would grow");
}

TEST_F(LimitsTest, AtTheLimitIsFine) {
  RawClient c = Connect(kCur);
  ASSERT_TRUE(
      c.Send(SetFrame(kCur, std::string(16, 'k'), std::string(32, 'v'))).ok());
  ASSERT_TRUE(c.Send(GetFrame(kCur, std::string(16, 'k'))).ok());
  EXPECT_EQ(c.RecvBytes().value_or("?"), std::string(32, 'v'));
  EXPECT_EQ(server_->GetStats().dropped, 0);
}

// --- scale and lifecycle ----------------------------------------------------

TEST_F(TcpStoreServerTest, ThousandConcurrentClients) {
  constexpr int kClients = 1000;
  ASSERT_GE(RaiseFdLimit(2 * kClients + 256), 2u * kClients + 64)
      << "cannot raise RLIMIT_NOFILE";
  std::vector<RawClient> clients(kClients);
  // Everyone joins (PyTorch's init/ accounting) and then waits on one key.
  for (int i = 0; i < kClients; ++i) {
    ASSERT_TRUE(clients[i].Connect(server_->port()).ok()) << i;
    ASSERT_TRUE(clients[i]
                    .Send(Validate() + AddFrame(kCur, "init/", 1) +
                          KeysFrame(kCur, Op::kWait, {"/go"}))
                    .ok());
  }
  std::vector<bool> seen(kClients + 1, false);
  for (int i = 0; i < kClients; ++i) {
    absl::StatusOr<int64_t> v = clients[i].RecvI64();
    ASSERT_TRUE(v.ok()) << v.status();
    ASSERT_GE(*v, 1);
    ASSERT_LE(*v, kClients);
    EXPECT_FALSE(seen[*v]);
    seen[*v] = true;
  }
  EXPECT_EQ(server_->GetStats().clients, kClients);
  EXPECT_TRUE(server_->WaitForWorkers(kClients, absl::Seconds(10)).ok());
  RawClient go = Connect(kCur);
  ASSERT_TRUE(go.Send(SetFrame(kCur, "/go", "1")).ok());
  for (int i = 0; i < kClients; ++i) {
    EXPECT_EQ(clients[i].RecvU8().value_or(9), tcpstore::kStopWaiting) << i;
  }
}

TEST_F(TcpStoreServerTest, WaitForWorkersTimesOutNamingCounts) {
  RawClient c = Connect(kCur);
  ASSERT_TRUE(c.Send(AddFrame(kCur, "init/", 1)).ok());
  ASSERT_TRUE(c.RecvI64().ok());
  absl::Status s = server_->WaitForWorkers(3, absl::Milliseconds(100));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(absl::StrContains(s.message(), "1/3 workers joined")) << s;
}

TEST_F(TcpStoreServerTest, StopIsCleanIdempotentAndFromAnyThread) {
  RawClient waiter = Connect(kCur);
  ASSERT_TRUE(waiter.Send(KeysFrame(kCur, Op::kWait, {"/never"})).ok());
  RawClient idle;
  ASSERT_TRUE(idle.Connect(server_->port()).ok());
  std::vector<std::thread> stoppers;
  for (int i = 0; i < 4; ++i)
    stoppers.emplace_back([this] { server_->Stop(); });
  for (auto& t : stoppers) t.join();
  server_->Stop();
  EXPECT_TRUE(waiter.ClosedByPeer());
  EXPECT_TRUE(idle.ClosedByPeer());
  RawClient late;
  EXPECT_FALSE(late.Connect(server_->port()).ok());
  server_.reset();  // destructor after Stop is fine
}

TEST(TcpStoreServerBindTest, PortInUseIsAnErrorNamingTheAddress) {
  TcpStoreServer::Options o;
  o.host = "127.0.0.1";
  auto first = TcpStoreServer::Start(o);
  ASSERT_TRUE(first.ok());
  o.port = (*first)->port();
  auto second = TcpStoreServer::Start(o);
  ASSERT_FALSE(second.ok());
  EXPECT_TRUE(absl::StrContains(second.status().message(),
                                absl::StrCat("127.0.0.1:", o.port)))
      << second.status();
}

TEST(TcpStoreServerBindTest, AllInterfacesServesIpv4Loopback) {
  TcpStoreServer::Options o;  // host "": IPv6 dual-stack or IPv4 fallback
  auto server = TcpStoreServer::Start(o);
  ASSERT_TRUE(server.ok()) << server.status();
  RawClient c;
  ASSERT_TRUE(c.Connect((*server)->port()).ok());
  ASSERT_TRUE(c.Send(Validate() + AddFrame(kCur, "/x", 2)).ok());
  EXPECT_EQ(c.RecvI64().value_or(-1), 2);
}

TEST(TcpStoreServerBindTest, BadHostIsInvalidArgument) {
  TcpStoreServer::Options o;
  o.host = "not-an-ip";
  auto server = TcpStoreServer::Start(o);
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ferry
