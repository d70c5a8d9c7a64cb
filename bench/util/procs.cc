#include "ferry/bench/util/procs.h"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "ferry/store/tcp_store_server.h"

extern char** environ;

namespace ferry::bench {
namespace {

Stats Summarize(std::vector<double> us) {
  Stats s;
  if (us.empty()) return s;
  std::sort(us.begin(), us.end());
  s.iters = us.size();
  for (double x : us) s.mean += x;
  s.mean /= static_cast<double>(us.size());
  s.p50 = us[us.size() / 2];
  s.p99 = us[std::min(us.size() - 1, us.size() * 99 / 100)];
  return s;
}

double TimeOnce(const std::function<void()>& op) {
  const absl::Time t0 = absl::Now();
  op();
  return absl::ToDoubleMicroseconds(absl::Now() - t0);
}

}  // namespace

void Die(const std::string& what) {
  std::fprintf(stderr, "bench: %s\n", what.c_str());
  std::exit(1);
}

void OrDie(const absl::Status& s, const std::string& what) {
  if (!s.ok()) Die(what + ": " + s.ToString());
}

Stats TimeLoop(const std::function<void()>& op, double seconds,
               size_t max_iters) {
  for (int i = 0; i < 50; ++i) op();
  std::vector<double> us;
  const absl::Time end = absl::Now() + absl::Seconds(seconds);
  while (absl::Now() < end && us.size() < max_iters) us.push_back(TimeOnce(op));
  return Summarize(std::move(us));
}

std::vector<Stats> InterleavedBest(
    const std::vector<std::function<void()>>& ops, double seconds,
    int rounds) {
  std::vector<Stats> best(ops.size());
  for (int r = 0; r < std::max(rounds, 1); ++r) {
    for (size_t i = 0; i < ops.size(); ++i) {
      Stats s = TimeLoop(ops[i], seconds / std::max(rounds, 1));
      if (best[i].iters == 0 || s.p50 < best[i].p50) best[i] = s;
    }
  }
  return best;
}

Stats TimeIters(const std::function<void()>& op, size_t iters, size_t warmup) {
  for (size_t i = 0; i < warmup; ++i) op();
  std::vector<double> us;
  for (size_t i = 0; i < iters; ++i) us.push_back(TimeOnce(op));
  return Summarize(std::move(us));
}

int LaunchRanks(const std::vector<std::vector<std::string>>& children,
                const std::function<int(int port)>& here) {
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) Die("cannot find this program (/proc/self/exe)");
  self[n] = '\0';
  TcpStoreServer::Options so;
  so.host = "127.0.0.1";
  auto server = OrDie(TcpStoreServer::Start(so), "store");
  std::vector<pid_t> pids;
  for (const std::vector<std::string>& child : children) {
    std::vector<std::string> args = {self};
    args.insert(args.end(), child.begin(), child.end());
    args.push_back(absl::StrCat("--port=", server->port()));
    std::vector<char*> argp;
    for (std::string& a : args) argp.push_back(a.data());
    argp.push_back(nullptr);
    pid_t pid;
    if (posix_spawn(&pid, self, nullptr, nullptr, argp.data(), environ) != 0) {
      Die("cannot start a rank");
    }
    pids.push_back(pid);
  }
  int rc = here(server->port());
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) rc = 1;
  }
  return rc;
}

}  // namespace ferry::bench
