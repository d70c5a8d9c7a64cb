#include "ferry/tests/multihost/link_emulator.h"

#include <poll.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "ferry/common/status.h"

namespace ferry::testutil {
namespace {

// Frames read from one descriptor before the other side gets a turn.
constexpr int kReadBatch = 256;

int64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

absl::Status ErrnoError(const char* call, int fd) {
  return absl::InternalError(absl::StrCat("link emulator: ", call, " on fd ",
                                          fd, ": ", std::strerror(errno)));
}

}  // namespace

absl::Status LinkEmulator::Validate(const LinkEmulatorOptions& o) {
  if (o.a_fd < 0 || o.b_fd < 0) {
    return absl::InvalidArgumentError("link emulator: both endpoints needed");
  }
  for (const LinkShape* s : {&o.a_to_b, &o.b_to_a}) {
    if (s->delay < absl::ZeroDuration()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "link emulator: negative delay ", absl::FormatDuration(s->delay)));
    }
    if (!(s->loss >= 0 && s->loss <= 1)) {
      return absl::InvalidArgumentError(
          absl::StrCat("link emulator: loss ", s->loss, " not in [0, 1]"));
    }
  }
  if (o.limit == 0 || o.max_frame == 0) {
    return absl::InvalidArgumentError(
        "link emulator: limit and max_frame must be positive");
  }
  return absl::OkStatus();
}

LinkEmulator::LinkEmulator(LinkEmulatorOptions options)
    : options_(std::move(options)),
      rng_(options_.seed),
      scratch_(options_.max_frame) {
  dirs_[0].from_fd = options_.a_fd;
  dirs_[0].to_fd = options_.b_fd;
  dirs_[0].delay_ns = absl::ToInt64Nanoseconds(options_.a_to_b.delay);
  dirs_[0].loss = options_.a_to_b.loss;
  dirs_[1].from_fd = options_.b_fd;
  dirs_[1].to_fd = options_.a_fd;
  dirs_[1].delay_ns = absl::ToInt64Nanoseconds(options_.b_to_a.delay);
  dirs_[1].loss = options_.b_to_a.loss;
}

bool LinkEmulator::Lose(double p) {
  if (p <= 0) return false;
  // 53 random bits as a double in [0, 1): the same draws on every libstdc++.
  const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53;
  return u < p;
}

absl::Status LinkEmulator::Receive(Direction& d, int64_t now_ns) {
  for (int i = 0; i < kReadBatch; ++i) {
    const ssize_t n = ::read(d.from_fd, scratch_.data(), scratch_.size());
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return absl::OkStatus();
      if (errno == EINTR) continue;
      return ErrnoError("read", d.from_fd);
    }
    if (n == 0) return absl::OkStatus();  // An empty frame or a closed pair.
    if (Lose(d.loss)) {
      ++d.stats.lost;
    } else if (d.queue.size() >= options_.limit) {
      ++d.stats.overflowed;
    } else {
      d.queue.push_back({now_ns + d.delay_ns, std::string(scratch_.data(), n)});
    }
  }
  return absl::OkStatus();
}

void LinkEmulator::Transmit(Direction& d, int64_t now_ns) {
  while (!d.queue.empty() && d.queue.front().due_ns <= now_ns) {
    const std::string& f = d.queue.front().bytes;
    ssize_t n;
    do {
      n = ::write(d.to_fd, f.data(), f.size());
    } while (n < 0 && errno == EINTR);
    if (n == static_cast<ssize_t>(f.size())) {
      ++d.stats.forwarded;
    } else {
      ++d.stats.write_failed;  // Receiver full or down: the frame is lost.
    }
    d.queue.pop_front();
  }
}

int64_t LinkEmulator::NextDue() const {
  int64_t due = INT64_MAX;
  for (const Direction& d : dirs_) {
    if (!d.queue.empty() && d.queue.front().due_ns < due) {
      due = d.queue.front().due_ns;
    }
  }
  return due;
}

absl::Status LinkEmulator::Run(int stop_fd) {
  while (true) {
    pollfd fds[3] = {{dirs_[0].from_fd, POLLIN, 0},
                     {dirs_[1].from_fd, POLLIN, 0},
                     {stop_fd, POLLIN, 0}};
    const int64_t due = NextDue();
    timespec wait{};
    timespec* timeout = nullptr;  // Nothing queued: wait for a frame.
    if (due != INT64_MAX) {
      const int64_t left = std::max<int64_t>(0, due - NowNs());
      wait.tv_sec = left / 1000000000;
      wait.tv_nsec = left % 1000000000;
      timeout = &wait;
    }
    if (::ppoll(fds, 3, timeout, nullptr) < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("ppoll", stop_fd);
    }
    if (fds[2].revents != 0) return absl::OkStatus();
    for (int i = 0; i < 2; ++i) {
      if (fds[i].revents & (POLLERR | POLLNVAL | POLLHUP)) {
        // A TAP device removed under us, or a closed socket pair: its
        // frames would never come again.
        return absl::InternalError(absl::StrCat(
            "link emulator: endpoint fd ", fds[i].fd, " failed or closed"));
      }
      if (fds[i].revents & POLLIN) {
        RETURN_IF_ERROR(Receive(dirs_[i], NowNs()));
      }
    }
    const int64_t now = NowNs();
    for (Direction& d : dirs_) Transmit(d, now);
  }
}

}  // namespace ferry::testutil
