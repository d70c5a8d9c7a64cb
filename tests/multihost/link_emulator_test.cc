// LinkEmulator over SOCK_SEQPACKET socket pairs (one frame per read/write,
// as a TAP device): the shaped direction delays every frame by at least the
// delay and keeps order, the other passes; the seeded loss drops exactly the
// frames its draws name, near the configured rate; the queue bound drops
// the excess; stop ends the loop; bad options are refused.
#include "ferry/tests/multihost/link_emulator.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <future>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace ferry::testutil {
namespace {

// One end of the link: `outer` is the test's (blocking), `inner` the
// emulator's (non-blocking).
struct Endpoint {
  int outer = -1;
  int inner = -1;
};

Endpoint MakeEndpoint() {
  int fds[2];
  EXPECT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds), 0);
  EXPECT_EQ(::fcntl(fds[1], F_SETFL, O_NONBLOCK), 0);
  return {fds[0], fds[1]};
}

void SendFrame(int fd, uint64_t index) {
  char frame[100] = {};
  std::memcpy(frame, &index, sizeof(index));
  ASSERT_EQ(::write(fd, frame, sizeof(frame)),
            static_cast<ssize_t>(sizeof(frame)));
}

// The index of the next frame on `fd`, or -1 if none comes before `wait`.
int64_t ReceiveFrame(int fd, absl::Duration wait) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(wait))) != 1) {
    return -1;
  }
  char frame[100];
  if (::read(fd, frame, sizeof(frame)) != static_cast<ssize_t>(sizeof(frame)))
    return -1;
  uint64_t index;
  std::memcpy(&index, frame, sizeof(index));
  return static_cast<int64_t>(index);
}

// Runs an emulator on a thread until Stop().
class Running {
 public:
  explicit Running(LinkEmulatorOptions o) : link_(o) {
    EXPECT_EQ(::pipe2(stop_, O_CLOEXEC), 0);
    thread_ = std::thread([this] { status_ = link_.Run(stop_[0]); });
  }
  ~Running() { Stop().IgnoreError(); }
  absl::Status Stop() {
    if (thread_.joinable()) {
      EXPECT_EQ(::write(stop_[1], "x", 1), 1);
      thread_.join();
      ::close(stop_[0]);
      ::close(stop_[1]);
    }
    return status_;
  }
  const LinkEmulator& link() const { return link_; }

 private:
  LinkEmulator link_;
  int stop_[2] = {-1, -1};
  absl::Status status_;
  std::thread thread_;
};

class LinkEmulatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    a_ = MakeEndpoint();
    b_ = MakeEndpoint();
    options_.a_fd = a_.inner;
    options_.b_fd = b_.inner;
  }
  void TearDown() override {
    for (int fd : {a_.outer, a_.inner, b_.outer, b_.inner}) ::close(fd);
  }
  Endpoint a_, b_;
  LinkEmulatorOptions options_;
};

TEST_F(LinkEmulatorTest, DelaysTheShapedDirectionInOrderAndPassesTheOther) {
  const absl::Duration delay = absl::Milliseconds(30);
  options_.a_to_b.delay = delay;
  Running run(options_);
  for (uint64_t i = 0; i < 5; ++i) {
    const absl::Time sent = absl::Now();
    SendFrame(a_.outer, i);
    SendFrame(a_.outer, 100 + i);  // Queued behind it: order is kept.
    EXPECT_EQ(ReceiveFrame(b_.outer, absl::Seconds(10)), int64_t(i));
    EXPECT_GE(absl::Now() - sent, delay) << "frame " << i;
    EXPECT_EQ(ReceiveFrame(b_.outer, absl::Seconds(10)), int64_t(100 + i));
  }
  SendFrame(b_.outer, 7);
  EXPECT_EQ(ReceiveFrame(a_.outer, absl::Seconds(10)), 7);
  EXPECT_TRUE(run.Stop().ok());
  EXPECT_EQ(run.link().a_to_b().forwarded, 10u);
  EXPECT_EQ(run.link().b_to_a().forwarded, 1u);
  EXPECT_EQ(run.link().a_to_b().lost, 0u);
}

// The frames a seeded loss of `p` drops, drawn as the emulator draws.
std::vector<bool> ExpectedLost(uint64_t seed, double p, int n) {
  std::mt19937_64 rng(seed);
  std::vector<bool> lost(n);
  for (int i = 0; i < n; ++i) {
    lost[i] = static_cast<double>(rng() >> 11) * 0x1.0p-53 < p;
  }
  return lost;
}

TEST_F(LinkEmulatorTest, SeededLossDropsThePredictedFramesNearTheRate) {
  constexpr int kFrames = 2000;
  constexpr int kWindow = 50;  // Frames in flight, well within the buffers.
  options_.a_to_b.loss = 0.3;
  options_.seed = 42;
  const std::vector<bool> lost = ExpectedLost(42, 0.3, kFrames);
  Running run(options_);
  int dropped = 0;
  for (int start = 0; start < kFrames; start += kWindow) {
    for (int i = start; i < start + kWindow; ++i) SendFrame(a_.outer, i);
    for (int i = start; i < start + kWindow; ++i) {
      if (lost[i]) {
        ++dropped;
        continue;
      }
      ASSERT_EQ(ReceiveFrame(b_.outer, absl::Seconds(10)), i);
    }
  }
  // Nothing else came through.
  SendFrame(b_.outer, 9);
  EXPECT_EQ(ReceiveFrame(a_.outer, absl::Seconds(10)), 9);
  EXPECT_EQ(ReceiveFrame(b_.outer, absl::ZeroDuration()), -1);
  EXPECT_TRUE(run.Stop().ok());
  EXPECT_EQ(run.link().a_to_b().lost, static_cast<uint64_t>(dropped));
  EXPECT_EQ(run.link().a_to_b().forwarded,
            static_cast<uint64_t>(kFrames - dropped));
  EXPECT_EQ(run.link().b_to_a().lost, 0u);
  // 30% of 2000: mean 600, standard deviation about 20.
  EXPECT_GT(dropped, 500);
  EXPECT_LT(dropped, 700);
}

TEST_F(LinkEmulatorTest, DropsFramesBeyondTheQueueLimit) {
  options_.a_to_b.delay = absl::Milliseconds(200);
  options_.limit = 10;
  // All 30 wait in the socket before the emulator starts: it reads them in
  // one batch, queues 10 and drops 20.
  for (uint64_t i = 0; i < 30; ++i) SendFrame(a_.outer, i);
  Running run(options_);
  for (int64_t i = 0; i < 10; ++i) {
    EXPECT_EQ(ReceiveFrame(b_.outer, absl::Seconds(10)), i);
  }
  EXPECT_TRUE(run.Stop().ok());
  EXPECT_EQ(ReceiveFrame(b_.outer, absl::ZeroDuration()), -1);
  EXPECT_EQ(run.link().a_to_b().forwarded, 10u);
  EXPECT_EQ(run.link().a_to_b().overflowed, 20u);
}

TEST_F(LinkEmulatorTest, AClosedEndpointEndsTheLoopWithAnError) {
  ::close(b_.outer);
  b_.outer = -1;
  LinkEmulator link(options_);
  int stop[2];
  ASSERT_EQ(::pipe2(stop, O_CLOEXEC), 0);
  std::future<absl::Status> ended =
      std::async(std::launch::async, [&] { return link.Run(stop[0]); });
  // It ends by itself; the stop is only a backstop for a failing test.
  const bool by_itself =
      ended.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
  if (!by_itself) {
    EXPECT_EQ(::write(stop[1], "x", 1), 1);
  }
  absl::Status s = ended.get();
  ::close(stop[0]);
  ::close(stop[1]);
  EXPECT_TRUE(by_itself);
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(absl::StrContains(s.message(), "closed")) << s;
}

TEST(LinkEmulatorOptionsTest, RefusesBadOptions) {
  LinkEmulatorOptions o;
  EXPECT_FALSE(LinkEmulator::Validate(o).ok());  // No descriptors.
  o.a_fd = 0;
  o.b_fd = 1;
  EXPECT_TRUE(LinkEmulator::Validate(o).ok());
  o.a_to_b.delay = absl::Milliseconds(-1);
  EXPECT_FALSE(LinkEmulator::Validate(o).ok());
  o.a_to_b.delay = absl::ZeroDuration();
  o.b_to_a.loss = 1.5;
  EXPECT_FALSE(LinkEmulator::Validate(o).ok());
  o.b_to_a.loss = 0.01;
  o.limit = 0;
  EXPECT_FALSE(LinkEmulator::Validate(o).ok());
}

}  // namespace
}  // namespace ferry::testutil
