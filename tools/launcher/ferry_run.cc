// ferry_run: starts N local worker processes, like torchrun.
//
//   ferry_run --nproc 3 [--master_addr 127.0.0.1] [--master_port 0]
//             [--timeout_s 600] -- program args...
//
// The launcher hosts the job's TCPStore (libuv server) and gives each child
// RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT
// and FERRY_USE_AGENT_STORE=1 (so no rank hosts a second store). Each
// child's stdout and stderr lines are forwarded with a "[rank]: " prefix.
// When a child fails (non-zero exit or a signal) the others get SIGTERM, then
// SIGKILL after a grace period, and the launcher exits with the failing
// child's status; when all succeed it exits 0. SIGINT/SIGTERM to the
// launcher are passed on to the children.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "store/store_auth.h"
#include "store/tcp_store_server.h"

ABSL_FLAG(int, nproc, 1, "number of worker processes");
ABSL_FLAG(std::string, master_addr, "127.0.0.1",
          "address the store listens on");
ABSL_FLAG(int, master_port, 0, "store port (0: pick a free one)");
ABSL_FLAG(int, timeout_s, 0, "kill the job after this many seconds (0: never)");
ABSL_FLAG(int, grace_s, 5, "seconds between SIGTERM and SIGKILL when stopping");

namespace {

volatile sig_atomic_t g_signal = 0;
void OnSignal(int sig) { g_signal = sig; }

struct Child {
  int rank = 0;
  pid_t pid = -1;
  int out_fd = -1;
  int err_fd = -1;
  std::string out_buf, err_buf;
  bool exited = false;
  int status = 0;
};

void WriteAll(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = write(fd, s.data() + off, s.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    off += static_cast<size_t>(n);
  }
}

// Forwards complete lines from `buf`, prefixed; `flush` forwards the rest.
void EmitLines(int rank, std::string* buf, int fd, bool flush) {
  size_t start = 0;
  std::string out;
  for (size_t nl; (nl = buf->find('\n', start)) != std::string::npos;
       start = nl + 1) {
    absl::StrAppend(&out, "[", rank, "]: ",
                    absl::string_view(*buf).substr(start, nl - start + 1));
  }
  buf->erase(0, start);
  if (flush && !buf->empty()) {
    absl::StrAppend(&out, "[", rank, "]: ", *buf, "\n");
    buf->clear();
  }
  if (!out.empty()) WriteAll(fd, out);
}

std::string Describe(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exit code ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return absl::StrCat("signal ", WTERMSIG(status), " (",
                        strsignal(WTERMSIG(status)), ")");
  }
  return "unknown status";
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("ferry_run --nproc N -- program [args...]");
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  // rest[0] is our own name; a leading "--" has been consumed by the parser.
  std::vector<char*> program(rest.begin() + 1, rest.end());
  const int nproc = absl::GetFlag(FLAGS_nproc);
  if (program.empty() || nproc < 1) {
    std::fprintf(stderr, "usage: ferry_run --nproc N -- program [args...]\n");
    return 2;
  }

  ferry::TcpStoreServer::Options so;
  so.host = absl::GetFlag(FLAGS_master_addr);
  so.port = absl::GetFlag(FLAGS_master_port);
  // FERRY_STORE_SECRET_FILE / FERRY_STORE_SECRET: the children inherit it.
  auto secret = ferry::tcpstore::StoreSecretFromEnv();
  if (!secret.ok()) {
    std::fprintf(stderr, "ferry_run: %s\n", secret.status().ToString().c_str());
    return 1;
  }
  so.secret = *secret;
  auto server = ferry::TcpStoreServer::Start(so);
  if (!server.ok()) {
    std::fprintf(stderr, "ferry_run: cannot start the store: %s\n",
                 server.status().ToString().c_str());
    return 1;
  }
  const std::string port = std::to_string((*server)->port());
  std::fprintf(stderr, "ferry_run: store at %s, starting %d workers\n",
               (*server)->address().c_str(), nproc);

  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  std::vector<Child> children(nproc);
  program.push_back(nullptr);
  for (int r = 0; r < nproc; ++r) {
    int out[2], err[2];
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
      std::perror("ferry_run: pipe");
      return 1;
    }
    pid_t pid = fork();
    if (pid < 0) {
      std::perror("ferry_run: fork");
      return 1;
    }
    if (pid == 0) {
      dup2(out[1], STDOUT_FILENO);
      dup2(err[1], STDERR_FILENO);
      setenv("RANK", std::to_string(r).c_str(), 1);
      setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(nproc).c_str(), 1);
      setenv("LOCAL_WORLD_SIZE", std::to_string(nproc).c_str(), 1);
      setenv("MASTER_ADDR", so.host.c_str(), 1);
      setenv("MASTER_PORT", port.c_str(), 1);
      setenv("FERRY_USE_AGENT_STORE", "1", 1);
      execvp(program[0], program.data());
      std::fprintf(stderr, "ferry_run: cannot exec %s: %s\n", program[0],
                   strerror(errno));
      _exit(127);
    }
    close(out[1]);
    close(err[1]);
    children[r].rank = r;
    children[r].pid = pid;
    children[r].out_fd = out[0];
    children[r].err_fd = err[0];
  }

  const int timeout_s = absl::GetFlag(FLAGS_timeout_s);
  const absl::Time deadline = timeout_s > 0
                                  ? absl::Now() + absl::Seconds(timeout_s)
                                  : absl::InfiniteFuture();
  int failed_rank = -1;
  int failed_status = 0;
  absl::Time kill_at = absl::InfiniteFuture();
  bool terminating = false;
  auto terminate_all = [&](const char* why) {
    if (terminating) return;
    terminating = true;
    std::fprintf(stderr, "ferry_run: %s; stopping the other workers\n", why);
    for (Child& c : children) {
      if (!c.exited) kill(c.pid, SIGTERM);
    }
    kill_at = absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_grace_s));
  };

  while (true) {
    std::vector<pollfd> fds;
    std::vector<std::pair<Child*, bool>> owners;  // (child, is_stderr)
    for (Child& c : children) {
      if (c.out_fd >= 0) {
        fds.push_back({c.out_fd, POLLIN, 0});
        owners.push_back({&c, false});
      }
      if (c.err_fd >= 0) {
        fds.push_back({c.err_fd, POLLIN, 0});
        owners.push_back({&c, true});
      }
    }
    bool all_exited = true;
    for (const Child& c : children) all_exited = all_exited && c.exited;
    if (all_exited && fds.empty()) break;

    poll(fds.data(), fds.size(), 100);
    for (size_t i = 0; i < fds.size(); ++i) {
      if ((fds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      Child* c = owners[i].first;
      bool is_err = owners[i].second;
      int& fd = is_err ? c->err_fd : c->out_fd;
      std::string& buf = is_err ? c->err_buf : c->out_buf;
      char chunk[65536];
      ssize_t n = read(fd, chunk, sizeof(chunk));
      if (n > 0) {
        buf.append(chunk, static_cast<size_t>(n));
        EmitLines(c->rank, &buf, is_err ? STDERR_FILENO : STDOUT_FILENO, false);
      } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
        EmitLines(c->rank, &buf, is_err ? STDERR_FILENO : STDOUT_FILENO, true);
        close(fd);
        fd = -1;
      }
    }
    for (Child& c : children) {
      if (c.exited) continue;
      int status;
      if (waitpid(c.pid, &status, WNOHANG) == c.pid) {
        c.exited = true;
        c.status = status;
        bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        if (!ok && failed_rank < 0 && !terminating) {
          failed_rank = c.rank;
          failed_status = status;
          std::string why =
              absl::StrCat("rank ", c.rank, " failed with ", Describe(status));
          terminate_all(why.c_str());
        }
      }
    }
    if (g_signal != 0 && !terminating) {
      std::string why =
          absl::StrCat("received signal ", static_cast<int>(g_signal));
      terminate_all(why.c_str());
      failed_status = 128 + g_signal;
    }
    if (absl::Now() > deadline && !terminating) {
      terminate_all(
          absl::StrCat("job timed out after ", timeout_s, "s").c_str());
      failed_status = 124 << 8;
    }
    if (absl::Now() > kill_at) {
      for (Child& c : children) {
        if (!c.exited) kill(c.pid, SIGKILL);
      }
      kill_at = absl::InfiniteFuture();
    }
  }
  (*server)->Stop();
  if (failed_rank >= 0) {
    std::fprintf(stderr, "ferry_run: job failed (rank %d: %s)\n", failed_rank,
                 Describe(failed_status).c_str());
    return WIFEXITED(failed_status) && WEXITSTATUS(failed_status) != 0
               ? WEXITSTATUS(failed_status)
               : 1;
  }
  if (failed_status != 0)
    return failed_status >= 256 ? failed_status >> 8 : failed_status;
  std::fprintf(stderr, "ferry_run: all %d workers finished\n", nproc);
  return 0;
}
