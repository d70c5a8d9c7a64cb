// A worker for ferry_run's failure-policy tests (launcher_test.cc): no RPC,
// only what the launcher gives it.
//
//   policy_worker [--die_ranks=1,2] [--die_times=N] [--die_exit=C]
//
// Prints "rank R restart K pid P running" (RANK, FERRY_RUN_RESTART), then:
// a rank in --die_ranks whose FERRY_RUN_RESTART is below --die_times (all
// restarts when 0) SIGKILLs itself (exits with code --die_exit instead when
// that is non-zero); every other worker blocks reading its stdin (which
// ferry_run's children inherit from it) until EOF, then prints "rank R
// done" and exits 0 -- the test tells the workers to finish by closing the
// launcher's stdin. Bounded: after --wait_s without EOF it exits 4.
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

ABSL_FLAG(std::vector<std::string>, die_ranks, {}, "ranks that die");
ABSL_FLAG(int, die_times, 0, "die while FERRY_RUN_RESTART < this (0: always)");
ABSL_FLAG(int, die_exit, 0, "exit with this code instead of SIGKILL");
ABSL_FLAG(int, wait_s, 60, "longest wait for EOF on stdin");

namespace {
int EnvInt(const char* name) {
  const char* v = std::getenv(name);
  int n = -1;
  if (v == nullptr || !absl::SimpleAtoi(v, &n)) return -1;
  return n;
}
}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  absl::ParseCommandLine(argc, argv);
  const int rank = EnvInt("RANK");
  const int restart = EnvInt("FERRY_RUN_RESTART");
  std::printf("rank %d restart %d pid %d running\n", rank, restart,
              static_cast<int>(getpid()));
  bool dies = false;
  for (const std::string& r : absl::GetFlag(FLAGS_die_ranks)) {
    int d = -1;
    dies = dies || (absl::SimpleAtoi(r, &d) && d == rank);
  }
  const int times = absl::GetFlag(FLAGS_die_times);
  if (dies && (times == 0 || restart < times)) {
    if (absl::GetFlag(FLAGS_die_exit) != 0) {
      std::printf("rank %d: exiting with %d\n", rank,
                  absl::GetFlag(FLAGS_die_exit));
      return absl::GetFlag(FLAGS_die_exit);
    }
    kill(getpid(), SIGKILL);
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_wait_s));
  char buf[256];
  while (absl::Now() < deadline) {
    pollfd p = {STDIN_FILENO, POLLIN, 0};
    const int left = static_cast<int>(
        absl::ToInt64Milliseconds(deadline - absl::Now()));
    if (poll(&p, 1, left > 0 ? left : 0) <= 0) continue;
    const ssize_t n = read(STDIN_FILENO, buf, sizeof(buf));
    if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) {
      std::printf("rank %d done\n", rank);
      return 0;
    }
  }
  std::printf("rank %d: no EOF on stdin within --wait_s\n", rank);
  return 4;
}
