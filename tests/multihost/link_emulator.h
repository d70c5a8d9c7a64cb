// A userspace network link for tests on kernels without sch_netem: frames
// read from one descriptor are written to the other after a fixed one-way
// delay, each lost with a given probability (seeded, so a run can be
// repeated), through a bounded queue. Both directions are shaped
// independently, as `tc qdisc ... netem delay D loss P limit L` shapes one
// interface's egress.
//
// The descriptors carry one frame per read()/write(): TAP devices in
// production (tests/multihost/link_emulator_main.cc), SOCK_SEQPACKET socket
// pairs in its unit test. They must be non-blocking.
//
// Semantics per direction, as netem's: frames leave in arrival order (no
// jitter, so no reordering), each `delay` after it was read; a frame is lost
// (never queued) with probability `loss`; one arriving when `limit` frames
// wait is dropped (tail drop). A write the receiver refuses drops the frame.
//
// Thread safety: not thread-safe; Run() occupies the calling thread, and
// stats() may be read once Run() has returned.
#ifndef FERRY_TESTS_MULTIHOST_LINK_EMULATOR_H_
#define FERRY_TESTS_MULTIHOST_LINK_EMULATOR_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace ferry::testutil {

struct LinkShape {
  absl::Duration delay = absl::ZeroDuration();  // One way, >= 0.
  double loss = 0;                              // Probability in [0, 1].
};

struct LinkEmulatorOptions {
  int a_fd = -1;  // Endpoint A (frames read here go to B: `a_to_b`).
  int b_fd = -1;  // Endpoint B (frames read here go to A: `b_to_a`).
  LinkShape a_to_b;
  LinkShape b_to_a;
  uint64_t seed = 1;
  size_t limit = 10000;      // Frames waiting per direction.
  size_t max_frame = 65536;  // Larger frames are truncated by read().
};

struct LinkStats {
  uint64_t forwarded = 0;
  uint64_t lost = 0;          // Dropped by the loss draw.
  uint64_t overflowed = 0;    // Dropped because `limit` frames waited.
  uint64_t write_failed = 0;  // Dropped because the receiver refused it.
};

class LinkEmulator {
 public:
  // InvalidArgument for a negative delay, a loss outside [0, 1], a zero
  // limit or a missing descriptor.
  static absl::Status Validate(const LinkEmulatorOptions& options);

  explicit LinkEmulator(LinkEmulatorOptions options);

  // Forwards frames until `stop_fd` is readable (or hangs up). Returns OK
  // then; Internal naming the call on a descriptor error other than
  // EAGAIN/EINTR (a TAP device that vanished, say).
  absl::Status Run(int stop_fd);

  const LinkStats& a_to_b() const { return dirs_[0].stats; }
  const LinkStats& b_to_a() const { return dirs_[1].stats; }

 private:
  struct Frame {
    int64_t due_ns;
    std::string bytes;
  };
  struct Direction {
    int from_fd = -1;
    int to_fd = -1;
    int64_t delay_ns = 0;
    double loss = 0;
    std::deque<Frame> queue;
    LinkStats stats;
  };

  // Reads what `d.from_fd` has (a bounded batch), queueing or dropping it.
  absl::Status Receive(Direction& d, int64_t now_ns);
  // Writes every frame of `d` that is due at `now_ns`.
  void Transmit(Direction& d, int64_t now_ns);
  // When the next queued frame is due (INT64_MAX: none).
  int64_t NextDue() const;
  bool Lose(double p);

  LinkEmulatorOptions options_;
  Direction dirs_[2];
  std::mt19937_64 rng_;
  std::vector<char> scratch_;
};

}  // namespace ferry::testutil

#endif  // FERRY_TESTS_MULTIHOST_LINK_EMULATOR_H_
