// link_emulator: a shaped link between two network namespaces through two
// TAP devices, for kernels without sch_netem (tests/multihost/netns_hosts.sh
// starts one per host link).
//
//   link_emulator --a_netns=NS1 --a_dev=eth0 --b_netns=NS2 --b_dev=vh0
//       --delay_us=20000 --loss_pct=1 [--reverse_delay_us=0]
//       [--reverse_loss_pct=0] [--seed=1] [--limit=10000] [--parent_pid=P]
//
// Creates TAP device a_dev in namespace a_netns (a name under /run/netns, a
// path, or "" for ours) and b_dev in b_netns, prints "ready" on stdout, and
// forwards Ethernet frames between them: a to b delayed by delay_us and lost
// with probability loss_pct/100; b to a by the reverse_* values (default:
// unshaped), as netem on a's egress. The caller configures the devices
// (addresses, bridge ports, up) once it reads "ready".
//
// Ends on SIGTERM, SIGINT, SIGHUP or when its parent dies (PR_SET_PDEATHSIG;
// --parent_pid closes the race with a parent that died before that), and
// its TAP devices vanish with it (they are not persistent). At exit it
// prints per-direction counts to stderr. Exit code 0 after a signal, 1 on an
// error (named on stderr).
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "ferry/tests/multihost/link_emulator.h"

ABSL_FLAG(std::string, a_netns, "", "namespace of endpoint A ('' = ours)");
ABSL_FLAG(std::string, a_dev, "", "TAP device created as endpoint A");
ABSL_FLAG(std::string, b_netns, "", "namespace of endpoint B ('' = ours)");
ABSL_FLAG(std::string, b_dev, "", "TAP device created as endpoint B");
ABSL_FLAG(int64_t, delay_us, 0, "one-way delay, A to B");
ABSL_FLAG(double, loss_pct, 0, "loss percentage, A to B");
ABSL_FLAG(int64_t, reverse_delay_us, 0, "one-way delay, B to A");
ABSL_FLAG(double, reverse_loss_pct, 0, "loss percentage, B to A");
ABSL_FLAG(uint64_t, seed, 1, "seed of the loss draws");
ABSL_FLAG(int64_t, limit, 10000, "frames queued per direction");
ABSL_FLAG(int64_t, parent_pid, 0, "exit at once unless this is our parent");

namespace ferry::testutil {
namespace {

std::string Errno(const std::string& what) {
  return absl::StrCat(what, ": ", std::strerror(errno));
}

// Enters `netns` ("" stays): a name under /run/netns or a path.
absl::Status EnterNetns(const std::string& netns) {
  if (netns.empty()) return absl::OkStatus();
  const std::string path = netns.find('/') == std::string::npos
                               ? absl::StrCat("/run/netns/", netns)
                               : netns;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::NotFoundError(Errno("open " + path));
  const int rc = ::setns(fd, CLONE_NEWNET);
  ::close(fd);
  if (rc != 0) return absl::PermissionDeniedError(Errno("setns " + path));
  return absl::OkStatus();
}

// A new TAP device `dev` in namespace `netns`; its non-blocking fd. The
// device belongs to the namespace the descriptor was opened in.
absl::StatusOr<int> OpenTap(const std::string& netns, const std::string& dev) {
  if (dev.empty() || dev.size() >= IFNAMSIZ) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad device name '", dev, "'"));
  }
  if (absl::Status s = EnterNetns(netns); !s.ok()) return s;
  const int fd = ::open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return absl::UnavailableError(Errno("open /dev/net/tun"));
  ifreq ifr{};
  ifr.ifr_flags = IFF_TAP | IFF_NO_PI;
  std::strncpy(ifr.ifr_name, dev.c_str(), IFNAMSIZ - 1);
  if (::ioctl(fd, TUNSETIFF, &ifr) != 0) {
    const std::string err =
        Errno(absl::StrCat("TUNSETIFF ", dev, " in namespace '", netns, "'"));
    ::close(fd);
    return absl::UnavailableError(err);
  }
  return fd;
}

void PrintStats(const std::string& from, const std::string& to,
                const LinkStats& s) {
  std::fprintf(stderr,
               "link_emulator %s -> %s: forwarded %llu, lost %llu, "
               "overflowed %llu, write failed %llu\n",
               from.c_str(), to.c_str(),
               static_cast<unsigned long long>(s.forwarded),
               static_cast<unsigned long long>(s.lost),
               static_cast<unsigned long long>(s.overflowed),
               static_cast<unsigned long long>(s.write_failed));
}

absl::Status Main() {
  // Signals arrive through a descriptor the forwarding loop polls.
  sigset_t stop;
  sigemptyset(&stop);
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) sigaddset(&stop, sig);
  if (sigprocmask(SIG_BLOCK, &stop, nullptr) != 0) {
    return absl::InternalError(Errno("sigprocmask"));
  }
  const int stop_fd = ::signalfd(-1, &stop, SFD_CLOEXEC);
  if (stop_fd < 0) return absl::InternalError(Errno("signalfd"));
  signal(SIGPIPE, SIG_IGN);
  if (::prctl(PR_SET_PDEATHSIG, SIGTERM) != 0) {
    return absl::InternalError(Errno("prctl(PR_SET_PDEATHSIG)"));
  }
  const int64_t parent = absl::GetFlag(FLAGS_parent_pid);
  if (parent != 0 && ::getppid() != parent) {
    return absl::AbortedError(absl::StrCat("parent ", parent, " is gone"));
  }
  // Wake-ups as close to each frame's due time as the timer allows.
  ::prctl(PR_SET_TIMERSLACK, 1);

  LinkEmulatorOptions o;
  o.a_to_b = {absl::Microseconds(absl::GetFlag(FLAGS_delay_us)),
              absl::GetFlag(FLAGS_loss_pct) / 100};
  o.b_to_a = {absl::Microseconds(absl::GetFlag(FLAGS_reverse_delay_us)),
              absl::GetFlag(FLAGS_reverse_loss_pct) / 100};
  o.seed = absl::GetFlag(FLAGS_seed);
  const int64_t limit = absl::GetFlag(FLAGS_limit);
  o.limit = limit > 0 ? static_cast<size_t>(limit) : 0;
  o.a_fd = 0;  // Checked below, once opened.
  o.b_fd = 0;
  if (absl::Status s = LinkEmulator::Validate(o); !s.ok()) return s;

  absl::StatusOr<int> a =
      OpenTap(absl::GetFlag(FLAGS_a_netns), absl::GetFlag(FLAGS_a_dev));
  if (!a.ok()) return a.status();
  absl::StatusOr<int> b =
      OpenTap(absl::GetFlag(FLAGS_b_netns), absl::GetFlag(FLAGS_b_dev));
  if (!b.ok()) return b.status();
  o.a_fd = *a;
  o.b_fd = *b;
  std::printf("ready\n");
  std::fflush(stdout);

  LinkEmulator link(o);
  absl::Status run = link.Run(stop_fd);
  const std::string a_name = absl::StrCat(absl::GetFlag(FLAGS_a_netns), "/",
                                          absl::GetFlag(FLAGS_a_dev));
  const std::string b_name = absl::StrCat(absl::GetFlag(FLAGS_b_netns), "/",
                                          absl::GetFlag(FLAGS_b_dev));
  PrintStats(a_name, b_name, link.a_to_b());
  PrintStats(b_name, a_name, link.b_to_a());
  return run;
}

}  // namespace
}  // namespace ferry::testutil

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  absl::Status s = ferry::testutil::Main();
  if (!s.ok()) {
    std::fprintf(stderr, "link_emulator: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
