// ferry_run: starts a job's worker processes on this node, like torchrun.
//
//   ferry_run [--nnodes N --node_rank K] --nproc_per_node P
//             [--master_addr H --master_port PORT | --rdzv_endpoint H:PORT |
//              --standalone] [--max_restarts R] [--timeout_s S]
//             [--grace_s G] [--rdzv_timeout_s T]
//             [--elastic_ranks A-B[,C...]]
//             [--restart_ranks A-B[,C...] --rank_restarts N]
//             [--node_relay] [--] program [args...]
//
// torchrun's spellings work too (--nproc-per-node, --node-rank,
// --master-addr, --max-restarts, --elastic-ranks...), --nproc is the old name of
// --nproc_per_node, and the "--" before the program may be left out.
//
// Node 0 hosts the job's TCPStore (libuv server) on master_addr:master_port
// (port 0: a free one, single node only); every node's launcher connects to
// it. With --node_relay each launcher also runs a store relay
// (store/tcp_store_relay.h) on 127.0.0.1 and its workers' MASTER_ADDR /
// MASTER_PORT name the relay: the store holds one connection per node. Each attempt of the job (a "generation", 0 first) starts with a
// rendezvous of the launchers: every node publishes its worker count and
// ranks follow node order (RANK = workers of the nodes before + LOCAL_RANK).
// Each child gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK
// (the node rank), GROUP_WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
// FERRY_USE_AGENT_STORE=1 (no rank hosts a second store) and
// FERRY_RUN_GENERATION (InitRpc and InitProcessGroup keep each attempt's keys
// apart and refuse a worker of an older attempt). With more than one worker
// per node, OMP_NUM_THREADS and OPENBLAS_NUM_THREADS are 1 unless the
// launcher's environment sets them, as torchrun does for OMP_NUM_THREADS:
// OpenBLAS (tensor/'s matmul) otherwise starts a thread per core in every
// worker, spinning with sched_yield for a while after start and after each
// call, and on a 16-core host those took the cores of same-host collectives
// (bench/c10d/results/shm_teams_openblas_16vcpu_2026-11-26.txt). Children's
// stdout and stderr lines are forwarded with a "[rank]: " prefix.
//
// The attempt's outcome is one store key that every launcher watches; the
// first launcher to write it decides:
//   - every worker on every node exits 0: "done", all launchers exit 0;
//   - a worker fails (non-zero exit or a signal): its launcher stops its
//     other workers (SIGTERM, SIGKILL after --grace_s). With restarts left
//     (--max_restarts) the outcome is "restart": every launcher stops its
//     workers and the job rendezvous again as the next generation. Otherwise
//     "fail": every launcher stops its workers and exits non-zero, naming the
//     node and rank that failed (that node exits with the worker's code);
//   - --timeout_s passes or the launcher gets SIGINT/SIGTERM: "fail" (no
//     restart); the store host lost: the launcher stops its workers and
//     exits 1 naming the store.
//
// Failure policy (docs/design/fault_tolerance.md), per global rank; ranks
// are lists of A or A-B, comma-separated; the two lists must not overlap:
//   - --elastic_ranks: a worker there killed by a signal is "lost": the
//     launcher reports it (a line naming rank, signal and the seconds since
//     the launcher started) and the job goes on without it; the attempt is
//     "done" when every other worker exited 0. A non-zero exit code is the
//     worker's own verdict (e.g. a target not reached) and still stops all.
//   - --restart_ranks with --rank_restarts N: a worker there that fails
//     (signal or non-zero exit) is started again alone, with the same RANK
//     and environment plus FERRY_RUN_RESTART=k (k-th restart of that rank
//     in this generation; 0 at first start), up to N times; the others keep
//     running. After N restarts its next failure stops all, as today.
//   - every other rank: a failure stops all (or restarts the job with
//     --max_restarts), as above.
// Each launcher ends with one "ferry_run: summary: ..." line per failure
// of its workers (rank, signal or exit code, seconds since start, what was
// done: "reported", "restarted k of N", "job stopped"). The exit status is
// 0 when the job succeeded (lost elastic workers included), else as above.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "ferry/common/host_address.h"
#include "ferry/common/sync.h"
#include "ferry/store/store_auth.h"
#include "ferry/store/tcp_store.h"
#include "ferry/store/tcp_store_relay.h"
#include "ferry/store/tcp_store_server.h"

ABSL_FLAG(int, nproc_per_node, 0, "worker processes on this node");
ABSL_FLAG(int, nproc, 0, "old name of --nproc_per_node");
ABSL_FLAG(int, nnodes, 1, "number of nodes (launchers) in the job");
ABSL_FLAG(int, node_rank, 0,
          "this node's rank in [0, nnodes); 0 hosts the store");
ABSL_FLAG(std::string, master_addr, "",
          "store host (node 0's address; default 127.0.0.1)");
ABSL_FLAG(int, master_port, -1,
          "store port (default 0 = a free one, single node only)");
ABSL_FLAG(std::string, rdzv_endpoint, "",
          "host:port of the store: another way to give master_addr/port");
ABSL_FLAG(bool, standalone, false,
          "single node, store on 127.0.0.1 at a free port");
ABSL_FLAG(int, max_restarts, 0,
          "restart the job this many times after a worker fails");
ABSL_FLAG(int, timeout_s, 0, "kill the job after this many seconds (0: never)");
ABSL_FLAG(int, grace_s, 5, "seconds between SIGTERM and SIGKILL when stopping");
ABSL_FLAG(int, rdzv_timeout_s, 300,
          "seconds to wait for every node to join an attempt");
ABSL_FLAG(std::string, elastic_ranks, "",
          "ranks (A-B[,C...]) whose death by a signal is reported, not fatal");
ABSL_FLAG(std::string, restart_ranks, "",
          "ranks (A-B[,C...]) restarted alone when they fail "
          "(--rank_restarts times)");
ABSL_FLAG(int, rank_restarts, 0,
          "restarts of each --restart_ranks worker per generation");
ABSL_FLAG(bool, node_relay, false,
          "start a store relay (store/tcp_store_relay.h) on this node and "
          "point the local workers' MASTER_ADDR/MASTER_PORT at it");

namespace ferry {
namespace {

volatile sig_atomic_t g_signal = 0;
void OnSignal(int sig) { g_signal = sig; }

constexpr char kUsage[] =
    "usage: ferry_run [--nnodes N --node_rank K] --nproc_per_node P "
    "[--master_addr H --master_port PORT | --rdzv_endpoint H:PORT | "
    "--standalone] [--max_restarts R] [--elastic_ranks A-B[,C]] "
    "[--restart_ranks A-B[,C] --rank_restarts N] [--node_relay] [--] "
    "program [args...]";

struct Config {
  int nnodes = 1;
  int node_rank = 0;
  int nproc = 1;
  std::string addr = "127.0.0.1";
  int port = 0;
  int max_restarts = 0;
  absl::Duration timeout = absl::InfiniteDuration();
  absl::Duration grace;
  absl::Duration rdzv_timeout;
  std::set<int> elastic_ranks;  // Lost by a signal: reported.
  std::set<int> restart_ranks;  // Failed: restarted alone, rank_restarts times.
  int rank_restarts = 0;
  bool node_relay = false;  // Workers reach the store through a local relay.
  std::vector<char*> program;  // Null-terminated.
};

absl::Status Usage(absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat(problem, "\n", kUsage));
}

// torchrun-style "--node-rank" becomes "--node_rank"; a "--" is inserted
// before the program when the caller left it out.
std::vector<std::string> NormalizeArgs(int argc, char** argv) {
  std::vector<std::string> out = {argv[0]};
  int i = 1;
  for (; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--") break;
    if (!absl::StartsWith(a, "-")) {
      out.push_back("--");
      break;
    }
    size_t dash = a.find_first_not_of('-');
    size_t end = std::min(a.find('='), a.size());
    for (size_t j = dash; j < end; ++j) {
      if (a[j] == '-') a[j] = '_';
    }
    out.push_back(a);
    // "--flag value": the value is not the program.
    static const char* const kBoolean[] = {
        "standalone", "nostandalone", "node_relay", "nonode_relay",
        "help",       "helpfull",     "helpshort",  "version"};
    const absl::string_view name = absl::string_view(a).substr(dash);
    bool boolean = false;
    for (const char* b : kBoolean) boolean = boolean || name == b;
    if (end == a.size() && !boolean && i + 1 < argc) out.push_back(argv[++i]);
  }
  for (; i < argc; ++i) out.push_back(argv[i]);
  return out;
}

absl::Status ParseEndpoint(absl::string_view endpoint, Config* c) {
  absl::string_view host = endpoint;
  absl::string_view port;
  if (absl::StartsWith(endpoint, "[")) {
    size_t close = endpoint.find(']');
    if (close == absl::string_view::npos) {
      return Usage(
          absl::StrCat("--rdzv_endpoint '", endpoint, "': unterminated '['"));
    }
    host = endpoint.substr(1, close - 1);
    if (absl::StartsWith(endpoint.substr(close + 1), ":")) {
      port = endpoint.substr(close + 2);
    }
  } else if (size_t colon = endpoint.rfind(':');
             colon != absl::string_view::npos) {
    host = endpoint.substr(0, colon);
    port = endpoint.substr(colon + 1);
  }
  c->addr = std::string(host);
  c->port = 29400;  // torchrun's default rendezvous port.
  if (!port.empty() &&
      (!absl::SimpleAtoi(port, &c->port) || c->port < 1 || c->port > 65535)) {
    return Usage(absl::StrCat("--rdzv_endpoint '", endpoint, "': bad port '",
                              port, "'"));
  }
  if (c->addr.empty()) {
    return Usage(absl::StrCat("--rdzv_endpoint '", endpoint, "': no host"));
  }
  return absl::OkStatus();
}

// "1-3,5" -> {1, 2, 3, 5}.
absl::StatusOr<std::set<int>> ParseRanks(absl::string_view flag,
                                         absl::string_view text) {
  std::set<int> ranks;
  if (text.empty()) return ranks;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    std::vector<absl::string_view> ends = absl::StrSplit(part, '-');
    int lo = -1, hi = -1;
    bool ok = ends.size() <= 2 && absl::SimpleAtoi(ends.front(), &lo) &&
              absl::SimpleAtoi(ends.back(), &hi);
    ok = ok && lo >= 0 && lo <= hi && hi - lo <= 1000000;
    if (!ok) {
      return Usage(absl::StrCat("--", flag, " '", text, "': '", part,
                                "' is not a rank or a range A-B of ranks"));
    }
    for (int r = lo; r <= hi; ++r) ranks.insert(r);
  }
  return ranks;
}

absl::StatusOr<Config> ReadConfig(std::vector<char*> program) {
  Config c;
  c.program = std::move(program);
  if (c.program.empty()) return Usage("no program given");
  c.program.push_back(nullptr);
  const int per_node = absl::GetFlag(FLAGS_nproc_per_node);
  const int old = absl::GetFlag(FLAGS_nproc);
  if (per_node > 0 && old > 0 && per_node != old) {
    return Usage("--nproc and --nproc_per_node disagree");
  }
  c.nproc = per_node > 0 ? per_node : (old > 0 ? old : 1);
  c.nnodes = absl::GetFlag(FLAGS_nnodes);
  c.node_rank = absl::GetFlag(FLAGS_node_rank);
  c.max_restarts = absl::GetFlag(FLAGS_max_restarts);
  const std::string addr = absl::GetFlag(FLAGS_master_addr);
  const int port = absl::GetFlag(FLAGS_master_port);
  const std::string endpoint = absl::GetFlag(FLAGS_rdzv_endpoint);
  const bool standalone = absl::GetFlag(FLAGS_standalone);
  if (c.nnodes < 1 || c.node_rank < 0 || c.node_rank >= c.nnodes) {
    return Usage(absl::StrCat("--node_rank ", c.node_rank,
                              " is outside [0, --nnodes ", c.nnodes, ")"));
  }
  if (c.max_restarts < 0) return Usage("--max_restarts must be >= 0");
  if (!endpoint.empty() && (!addr.empty() || port >= 0)) {
    return Usage(
        "give --rdzv_endpoint or --master_addr/--master_port, "
        "not both");
  }
  if (standalone &&
      (c.nnodes != 1 || !endpoint.empty() || !addr.empty() || port >= 0)) {
    return Usage(
        "--standalone is one node with its own store: it takes no "
        "--nnodes > 1, --master_addr, --master_port or "
        "--rdzv_endpoint");
  }
  if (!endpoint.empty()) {
    absl::Status s = ParseEndpoint(endpoint, &c);
    if (!s.ok()) return s;
  } else {
    if (!addr.empty()) c.addr = addr;
    c.port = port >= 0 ? port : 0;
  }
  if (c.port > 65535) return Usage("--master_port must be in 0..65535");
  if (c.nnodes > 1 && c.port == 0) {
    return Usage(
        "with --nnodes > 1 every node must know the store's port: "
        "give --master_port (or --rdzv_endpoint host:port)");
  }
  const int timeout_s = absl::GetFlag(FLAGS_timeout_s);
  if (timeout_s > 0) c.timeout = absl::Seconds(timeout_s);
  c.grace = absl::Seconds(absl::GetFlag(FLAGS_grace_s));
  c.rdzv_timeout = absl::Seconds(absl::GetFlag(FLAGS_rdzv_timeout_s));
  absl::StatusOr<std::set<int>> elastic =
      ParseRanks("elastic_ranks", absl::GetFlag(FLAGS_elastic_ranks));
  if (!elastic.ok()) return elastic.status();
  absl::StatusOr<std::set<int>> restart =
      ParseRanks("restart_ranks", absl::GetFlag(FLAGS_restart_ranks));
  if (!restart.ok()) return restart.status();
  c.elastic_ranks = *std::move(elastic);
  c.restart_ranks = *std::move(restart);
  c.rank_restarts = absl::GetFlag(FLAGS_rank_restarts);
  c.node_relay = absl::GetFlag(FLAGS_node_relay);
  for (int r : c.elastic_ranks) {
    if (c.restart_ranks.count(r) > 0) {
      return Usage(absl::StrCat("rank ", r,
                                " is in both --elastic_ranks and "
                                "--restart_ranks"));
    }
  }
  if (c.rank_restarts < 0) return Usage("--rank_restarts must be >= 0");
  if (c.rank_restarts > 0 && c.restart_ranks.empty()) {
    return Usage("--rank_restarts needs --restart_ranks");
  }
  if (!c.restart_ranks.empty() && c.rank_restarts == 0) {
    return Usage("--restart_ranks needs --rank_restarts N (N >= 1)");
  }
  return c;
}

// ---------------------------------------------------------------------------
// The local workers of one attempt.

void WriteAll(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = write(fd, s.data() + off, s.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    off += static_cast<size_t>(n);
  }
}

std::string Describe(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exit code ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return absl::StrCat("signal ", WTERMSIG(status), " (",
                        strsignal(WTERMSIG(status)), ")");
  }
  return "unknown status";
}

struct Child {
  int rank = 0;
  pid_t pid = -1;
  bool exited = false;
  int status = 0;
  int restarts = 0;  // FERRY_RUN_RESTART of this process.
  bool lost = false;  // Its death was reported (--elastic_ranks).
};

// One output pipe of a child (kept after the child's restart until EOF).
struct Stream {
  int rank = 0;
  int fd = -1;
  bool is_err = false;
  std::string buf;
};

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

// What one attempt's rendezvous assigned to this node.
struct Assignment {
  int generation = 0;
  int first_rank = 0;
  int world_size = 0;
};

class LocalGroup {
 public:
  LocalGroup(const Config& config, const Assignment& a)
      : config_(config), assignment_(a) {}
  ~LocalGroup() {
    for (Child& c : children_) {
      if (!c.exited && c.pid > 0) {
        kill(c.pid, SIGKILL);
        waitpid(c.pid, nullptr, 0);
      }
    }
    for (Stream& s : streams_) {
      if (s.fd >= 0) close(s.fd);
    }
  }

  // The workers reach the store at addr:port (the store, or this node's
  // relay).
  absl::Status Spawn(const std::string& addr, int port) {
    addr_ = addr;
    port_ = port;
    children_.resize(config_.nproc);
    for (int l = 0; l < config_.nproc; ++l) {
      children_[l].rank = assignment_.first_rank + l;
      absl::Status s = SpawnOne(l, /*restarts=*/0);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }

  // Starts the worker of `child` (an exited failed one) again alone, as
  // FERRY_RUN_RESTART=restarts + 1. Its old pipes drain until EOF.
  absl::Status Restart(const Child& child) {
    const int l = child.rank - assignment_.first_rank;
    return SpawnOne(l, children_[l].restarts + 1);
  }

  // Forwards output for up to `wait` and reaps exited children. Returns the
  // children that failed in this call, in rank order.
  std::vector<Child*> Pump(absl::Duration wait) {
    std::vector<pollfd> fds;
    for (Stream& s : streams_) fds.push_back({s.fd, POLLIN, 0});
    poll(fds.data(), fds.size(), absl::ToInt64Milliseconds(wait));
    for (size_t i = 0; i < fds.size(); ++i) {
      if ((fds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      Stream& s = streams_[i];
      const int to = s.is_err ? STDERR_FILENO : STDOUT_FILENO;
      char chunk[65536];
      ssize_t n = read(s.fd, chunk, sizeof(chunk));
      if (n > 0) {
        s.buf.append(chunk, static_cast<size_t>(n));
        EmitLines(s.rank, &s.buf, to, false);
      } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
        EmitLines(s.rank, &s.buf, to, true);
        close(s.fd);
        s.fd = -1;
      }
    }
    std::erase_if(streams_, [](const Stream& s) { return s.fd < 0; });
    std::vector<Child*> failed;
    for (Child& c : children_) {
      int status;
      if (c.exited || c.pid <= 0 || waitpid(c.pid, &status, WNOHANG) != c.pid)
        continue;
      c.exited = true;
      c.status = status;
      if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
        failed.push_back(&c);
      }
    }
    return failed;
  }

  // SIGTERM now; SIGKILL once `grace` has passed (KillOverdue).
  void Terminate() {
    if (kill_at_ != absl::InfiniteFuture()) return;
    for (Child& c : children_) {
      // pid -1: never started (kill(-1) would signal every process we own).
      if (c.pid > 0 && !c.exited) kill(c.pid, SIGTERM);
    }
    kill_at_ = absl::Now() + config_.grace;
  }
  void KillOverdue() {
    if (absl::Now() < kill_at_) return;
    for (Child& c : children_) {
      if (c.pid > 0 && !c.exited) kill(c.pid, SIGKILL);
    }
  }
  bool AllExited() const {
    for (const Child& c : children_) {
      if (c.pid > 0 && !c.exited) return false;  // pid -1: never started.
    }
    return streams_.empty();
  }

 private:
  absl::Status SpawnOne(int l, int restarts) {
    const int rank = assignment_.first_rank + l;
    // Built before fork: the child of a threaded process only execs.
    std::vector<std::string> env = ChildEnv(rank, l, port_, restarts);
    std::vector<char*> envp;
    for (std::string& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    int out[2], err[2];
    if (pipe2(out, O_CLOEXEC) != 0) {
      return absl::InternalError(
          absl::StrCat("rank ", rank, ": pipe: ", strerror(errno)));
    }
    if (pipe2(err, O_CLOEXEC) != 0) {
      close(out[0]);
      close(out[1]);
      return absl::InternalError(
          absl::StrCat("rank ", rank, ": pipe: ", strerror(errno)));
    }
    pid_t pid = fork();
    if (pid < 0) {
      for (int fd : {out[0], out[1], err[0], err[1]}) close(fd);
      return absl::InternalError(
          absl::StrCat("rank ", rank, ": fork: ", strerror(errno)));
    }
    if (pid == 0) {
      dup2(out[1], STDOUT_FILENO);
      dup2(err[1], STDERR_FILENO);
      execvpe(config_.program[0], config_.program.data(), envp.data());
      std::fprintf(stderr, "ferry_run: cannot exec %s: %s\n",
                   config_.program[0], strerror(errno));
      _exit(127);
    }
    close(out[1]);
    close(err[1]);
    Child& c = children_[l];
    c.rank = rank;
    c.pid = pid;
    c.exited = false;
    c.status = 0;
    c.restarts = restarts;
    c.lost = false;
    streams_.push_back({rank, out[0], false, ""});
    streams_.push_back({rank, err[0], true, ""});
    return absl::OkStatus();
  }

  // Thread pools that default to a thread per core: one each per worker
  // when several share the node (see the top of this file).
  static constexpr const char* kOneThreadVars[] = {"OMP_NUM_THREADS",
                                                   "OPENBLAS_NUM_THREADS"};

  // The launcher's environment with the job's variables set.
  std::vector<std::string> ChildEnv(int rank, int local_rank, int port,
                                    int restarts) const {
    const std::pair<const char*, std::string> vars[] = {
        {"RANK", std::to_string(rank)},
        {"LOCAL_RANK", std::to_string(local_rank)},
        {"WORLD_SIZE", std::to_string(assignment_.world_size)},
        {"LOCAL_WORLD_SIZE", std::to_string(config_.nproc)},
        {"GROUP_RANK", std::to_string(config_.node_rank)},
        {"GROUP_WORLD_SIZE", std::to_string(config_.nnodes)},
        {"MASTER_ADDR", addr_},
        {"MASTER_PORT", std::to_string(port)},
        {"FERRY_USE_AGENT_STORE", "1"},
        {"FERRY_RUN_GENERATION", std::to_string(assignment_.generation)},
        {"FERRY_RUN_RESTART", std::to_string(restarts)},
    };
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) {
      bool replaced = false;
      for (const auto& [name, value] : vars) {
        replaced = replaced || absl::StartsWith(*e, absl::StrCat(name, "="));
      }
      if (!replaced) env.push_back(*e);
    }
    for (const auto& [name, value] : vars) {
      env.push_back(absl::StrCat(name, "=", value));
    }
    if (config_.nproc > 1) {
      for (const char* name : kOneThreadVars) {
        if (std::getenv(name) == nullptr)
          env.push_back(absl::StrCat(name, "=1"));
      }
    }
    return env;
  }

  const Config& config_;
  const Assignment assignment_;
  std::vector<Child> children_;
  std::vector<Stream> streams_;  // Open output pipes, of children old and new.
  std::string addr_;
  int port_ = 0;
  absl::Time kill_at_ = absl::InfiniteFuture();
};

// ---------------------------------------------------------------------------
// The launchers' rendezvous and the attempt's outcome, in the job's store.

std::string GenKey(int generation, absl::string_view key) {
  return absl::StrCat("ferry_run/gen", generation, "/", key);
}

absl::StatusOr<std::unique_ptr<TcpStore>> Connect(const Config& c, int port,
                                                  absl::Duration timeout) {
  TcpStoreOptions o;
  o.host = c.addr;
  o.port = port;
  o.timeout = timeout;
  // FERRY_STORE_SECRET_FILE / FERRY_STORE_SECRET (store/store_auth.h).
  absl::StatusOr<std::string> secret = tcpstore::StoreSecretFromEnv();
  if (!secret.ok()) return secret.status();
  o.secret = *secret;
  return TcpStore::Create(o);
}

// Every node publishes its worker count; ranks follow node order.
absl::StatusOr<Assignment> Rendezvous(Store& store, const Config& c,
                                      int generation) {
  const std::string who =
      absl::StrCat("node ", c.node_rank, " joining generation ", generation);
  absl::StatusOr<int64_t> claims =
      store.Add(GenKey(generation, absl::StrCat("claim", c.node_rank)), 1);
  if (!claims.ok()) return claims.status();
  if (*claims > 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        who, ": another launcher already uses --node_rank ", c.node_rank));
  }
  absl::Status s =
      store.Set(GenKey(generation, absl::StrCat("nproc", c.node_rank)),
                std::to_string(c.nproc));
  std::vector<std::string> keys;
  for (int n = 0; n < c.nnodes; ++n) {
    keys.push_back(GenKey(generation, absl::StrCat("nproc", n)));
  }
  if (s.ok()) s = store.Wait(keys, c.rdzv_timeout);
  if (!s.ok()) {
    std::vector<std::string> missing;
    for (int n = 0; n < c.nnodes; ++n) {
      absl::StatusOr<bool> there = store.Check({keys[n]});
      if (there.ok() && !*there) missing.push_back(std::to_string(n));
    }
    return absl::Status(s.code(),
                        absl::StrCat(who, ": ", s.message(),
                                     missing.empty() ? "" : "; nodes missing: ",
                                     absl::StrJoin(missing, ", ")));
  }
  absl::StatusOr<std::vector<std::string>> counts = store.MultiGet(keys);
  if (!counts.ok()) return counts.status();
  Assignment a;
  a.generation = generation;
  for (int n = 0; n < c.nnodes; ++n) {
    int count = 0;
    if (!absl::SimpleAtoi((*counts)[n], &count) || count < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(who, ": node ", n, " published a bad worker count '",
                       (*counts)[n], "'"));
    }
    if (n < c.node_rank) a.first_rank += count;
    a.world_size += count;
  }
  s = store.Set("ferry_run/generation", std::to_string(generation));
  if (!s.ok()) return s;
  return a;
}

// Waits, on its own thread and connection, for the attempt's outcome key.
class OutcomeWatcher {
 public:
  OutcomeWatcher(std::unique_ptr<TcpStore> store, std::string key)
      : store_(std::move(store)), key_(std::move(key)) {
    thread_ = std::thread([this] { Run(); });
  }
  ~OutcomeWatcher() {
    stop_ = true;
    thread_.join();
  }
  // The outcome, or the error that ended the watch; nullopt while waiting.
  std::optional<absl::StatusOr<std::string>> Get() {
    MutexLock lock(&mu_);
    return result_;
  }

 private:
  void Run() {
    // Short waits so that the destructor is never held up for long.
    while (!stop_) {
      absl::Status s = store_->Wait({key_}, absl::Milliseconds(500));
      if (absl::IsDeadlineExceeded(s)) continue;
      absl::StatusOr<std::string> value =
          s.ok() ? store_->Get(key_) : absl::StatusOr<std::string>(s);
      MutexLock lock(&mu_);
      result_ = std::move(value);
      return;
    }
  }

  std::unique_ptr<TcpStore> store_;
  const std::string key_;
  std::atomic<bool> stop_{false};
  Mutex mu_;
  std::optional<absl::StatusOr<std::string>> result_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

// How an attempt ended, for this node.
struct Ending {
  enum Kind { kDone, kRestart, kFail } kind = kFail;
  std::string why;
  int exit_code = 1;
};

Ending ParseOutcome(const std::string& value) {
  if (value == "done") return {Ending::kDone, "", 0};
  if (absl::StartsWith(value, "restart ")) {
    return {Ending::kRestart, value.substr(8), 1};
  }
  return {Ending::kFail,
          absl::StartsWith(value, "fail ") ? value.substr(5) : value, 1};
}

class Launcher {
 public:
  Launcher(Config config, int port) : c_(std::move(config)), port_(port) {}

  int Run() {
    absl::StatusOr<std::unique_ptr<TcpStore>> store =
        Connect(c_, port_, c_.rdzv_timeout);
    if (!store.ok()) return Die(StoreLost(store.status()));
    store_ = *std::move(store);
    if (c_.node_relay) {
      absl::Status relay = StartRelay();
      if (!relay.ok()) return Die(relay.ToString());
    }
    const absl::Time deadline = absl::Now() + c_.timeout;
    // A restart is decided only while generation < max_restarts.
    for (int generation = 0; generation <= c_.max_restarts; ++generation) {
      absl::StatusOr<Assignment> a = Rendezvous(*store_, c_, generation);
      if (!a.ok()) return Die(a.status().ToString());
      std::fprintf(stderr,
                   "ferry_run: node %d generation %d: ranks %d..%d of %d, "
                   "store at %s\n",
                   c_.node_rank, generation, a->first_rank,
                   a->first_rank + c_.nproc - 1, a->world_size,
                   JoinHostPort(c_.addr, port_).c_str());
      Ending e = RunAttempt(*a, deadline);
      if (e.kind == Ending::kRestart) {
        std::fprintf(stderr,
                     "ferry_run: node %d: %s; restarting the job as "
                     "generation %d (restart %d of %d)\n",
                     c_.node_rank, e.why.c_str(), generation + 1,
                     generation + 1, c_.max_restarts);
        continue;
      }
      Acknowledge(generation);
      if (e.kind == Ending::kDone) {
        std::fprintf(stderr, "ferry_run: all %d workers finished%s\n",
                     a->world_size,
                     summary_.empty()
                         ? ""
                         : absl::StrCat(" (", summary_.size(),
                                        " failure(s) handled by the policy)")
                               .c_str());
        PrintSummary();
        return 0;
      }
      std::fprintf(stderr, "ferry_run: job failed (%s)\n", e.why.c_str());
      PrintSummary();
      return e.exit_code;
    }
    return Die("restarted more often than --max_restarts allows");
  }

 private:
  // Seconds since this launcher started.
  double Since() const { return absl::ToDoubleSeconds(absl::Now() - start_); }

  // An event of the failure policy: printed now and in the summary.
  void Record(const std::string& event) {
    std::fprintf(stderr, "ferry_run: node %d: %s\n", c_.node_rank,
                 event.c_str());
    summary_.push_back(event);
  }
  void PrintSummary() const {
    for (const std::string& e : summary_) {
      std::fprintf(stderr, "ferry_run: summary: node %d: %s\n", c_.node_rank,
                   e.c_str());
    }
  }

  // Why a failure of `child` was not covered by the policy ("" when its
  // rank has none).
  std::string PolicyNote(const Child& child) const {
    if (c_.elastic_ranks.count(child.rank) > 0) {
      return " (an elastic rank that exited with an error, not a signal)";
    }
    if (c_.restart_ranks.count(child.rank) > 0) {
      return absl::StrCat(" (restart budget of ", c_.rank_restarts,
                          " spent)");
    }
    return "";
  }

  // Applies --elastic_ranks / --restart_ranks to `failed` (`what` describes
  // its death); false when the policy does not cover it (stop-all).
  bool ApplyPolicy(LocalGroup& group, Child& failed, const std::string& what) {
    if (c_.elastic_ranks.count(failed.rank) > 0 &&
        WIFSIGNALED(failed.status)) {
      failed.lost = true;
      Record(absl::StrCat(what, ": reported (elastic rank), the job goes on"));
      return true;
    }
    if (c_.restart_ranks.count(failed.rank) > 0 &&
        failed.restarts < c_.rank_restarts) {
      const int k = failed.restarts + 1;
      absl::Status s = group.Restart(failed);
      if (!s.ok()) {
        Record(absl::StrCat(what, ": restart ", k, " of ", c_.rank_restarts,
                            " failed: ", s.ToString()));
        return false;
      }
      Record(absl::StrCat(what, ": restarted ", k, " of ", c_.rank_restarts,
                          " (new pid ", failed.pid, ", FERRY_RUN_RESTART=", k,
                          ")"));
      return true;
    }
    return false;
  }

  int Die(const std::string& why) {
    std::fprintf(stderr, "ferry_run: node %d: %s\n", c_.node_rank, why.c_str());
    return 1;
  }
  std::string StoreLost(const absl::Status& s) const {
    return absl::StrCat("lost the job's store at ",
                        JoinHostPort(c_.addr, port_),
                        " (hosted by node 0): ", s.ToString());
  }

  // Writes the outcome unless another launcher did first; returns the
  // outcome that holds.
  absl::StatusOr<std::string> Publish(int generation,
                                      const std::string& value) {
    return store_->CompareSet(GenKey(generation, "outcome"), "", value);
  }

  Ending RunAttempt(const Assignment& a, absl::Time deadline) {
    const int generation = a.generation;
    absl::StatusOr<std::unique_ptr<TcpStore>> watch_store =
        Connect(c_, port_, c_.rdzv_timeout);
    if (!watch_store.ok())
      return {Ending::kFail, StoreLost(watch_store.status())};
    OutcomeWatcher watcher(*std::move(watch_store),
                           GenKey(generation, "outcome"));
    LocalGroup group(c_, a);
    absl::Status spawned =
        relay_ != nullptr ? group.Spawn("127.0.0.1", relay_->port())
                          : group.Spawn(c_.addr, port_);
    std::optional<std::string> local_failure;  // "restart ..." / "fail ..."
    int local_code = 1;
    if (!spawned.ok()) {
      local_failure =
          absl::StrCat("fail node ", c_.node_rank, ": ", spawned.ToString());
      group.Terminate();
    }
    bool published = false;
    // Bounded: the job's deadline, then grace_s until SIGKILL of every child.
    while (true) {
      for (Child* failed : group.Pump(absl::Milliseconds(100))) {
        // Deaths after the attempt's end was decided are its consequence.
        if (local_failure.has_value() || watcher.Get().has_value()) break;
        const std::string what =
            absl::StrCat("rank ", failed->rank, " (pid ", failed->pid,
                         ") died with ", Describe(failed->status), " at ",
                         absl::StrFormat("%.3f", Since()), " s");
        if (ApplyPolicy(group, *failed, what)) continue;
        const bool restart = generation < c_.max_restarts;
        local_failure = absl::StrCat(restart ? "restart " : "fail ", "node ",
                                     c_.node_rank, " rank ", failed->rank,
                                     " failed with ", Describe(failed->status));
        Record(absl::StrCat(what, ": ",
                            restart ? "job restarted" : "job stopped",
                            PolicyNote(*failed)));
        if (WIFEXITED(failed->status)) local_code = WEXITSTATUS(failed->status);
        group.Terminate();
      }
      // A failure is published at once, so the first one decides.
      if (local_failure.has_value() && !published) {
        published = true;
        absl::Status s = Publish(generation, *local_failure).status();
        if (!s.ok()) return {Ending::kFail, StoreLost(s)};
      }
      if (!local_failure.has_value() &&
          (g_signal != 0 || absl::Now() > deadline)) {
        local_failure =
            g_signal != 0
                ? absl::StrCat("fail node ", c_.node_rank, " received signal ",
                               static_cast<int>(g_signal))
                : absl::StrCat("fail job timed out after ",
                               absl::FormatDuration(c_.timeout), " (node ",
                               c_.node_rank, ")");
        local_code = g_signal != 0 ? 128 + g_signal : 124;
        group.Terminate();
      }
      group.KillOverdue();
      std::optional<absl::StatusOr<std::string>> outcome = watcher.Get();
      if (outcome.has_value() && !outcome->ok()) {
        group.Terminate();
        if (group.AllExited())
          return {Ending::kFail, StoreLost(outcome->status())};
        continue;
      }
      if (outcome.has_value()) {
        Ending e = ParseOutcome(**outcome);
        if (e.kind != Ending::kDone) group.Terminate();
        if (!group.AllExited()) continue;
        // The node whose worker failed reports that worker's exit code.
        if (local_failure.has_value() && **outcome == *local_failure) {
          e.exit_code = local_code;
        }
        return e;
      }
      if (published || !group.AllExited()) continue;
      // Every local worker succeeded; the last node to finish says "done".
      published = true;
      absl::StatusOr<int64_t> done = store_->Add(GenKey(generation, "done"), 1);
      absl::Status s = done.status();
      if (s.ok() && *done == c_.nnodes)
        s = Publish(generation, "done").status();
      if (!s.ok()) return {Ending::kFail, StoreLost(s)};
    }
  }

  // Every launcher reports that it saw the final outcome; node 0 keeps the
  // store up until all have (or grace_s passes).
  void Acknowledge(int generation) {
    absl::StatusOr<int64_t> acks = store_->Add(GenKey(generation, "acks"), 1);
    if (acks.ok() && *acks == c_.nnodes) {
      store_->Set(GenKey(generation, "acked"), "1").IgnoreError();
    }
    if (c_.node_rank == 0 && acks.ok()) {
      store_->Wait({GenKey(generation, "acked")}, c_.grace).IgnoreError();
    }
  }

  // --node_relay: a relay on 127.0.0.1 (a free port) for this node's
  // workers; the launcher itself talks to the store directly.
  absl::Status StartRelay() {
    // The store's secret: the relay proves it upstream and requires it of
    // the workers (which read the same variables).
    absl::StatusOr<std::string> secret = tcpstore::StoreSecretFromEnv();
    if (!secret.ok()) return secret.status();
    absl::StatusOr<std::string> upstream = NumericHost(c_.addr);
    if (!upstream.ok()) return upstream.status();
    TcpStoreRelay::Options o;
    o.host = "127.0.0.1";
    o.upstream_host = *upstream;
    o.upstream_port = port_;
    o.connect_timeout = c_.rdzv_timeout;
    o.secret = *secret;
    absl::StatusOr<std::unique_ptr<TcpStoreRelay>> relay =
        TcpStoreRelay::Start(o);
    if (!relay.ok()) return relay.status();
    relay_ = *std::move(relay);
    std::fprintf(stderr,
                 "ferry_run: node %d: store relay for local workers on %s "
                 "(to %s)\n",
                 c_.node_rank, relay_->address().c_str(),
                 relay_->upstream().c_str());
    return absl::OkStatus();
  }

  const Config c_;
  const int port_;
  const absl::Time start_ = absl::Now();
  std::vector<std::string> summary_;  // Policy events, in order.
  std::unique_ptr<TcpStore> store_;
  std::unique_ptr<TcpStoreRelay> relay_;  // --node_relay
};

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(ferry::kUsage);
  std::vector<std::string> args = ferry::NormalizeArgs(argc, argv);
  std::vector<char*> argp;
  for (std::string& a : args) argp.push_back(a.data());
  std::vector<char*> rest =
      absl::ParseCommandLine(static_cast<int>(argp.size()), argp.data());
  // rest[0] is our own name; the "--" has been consumed by the parser.
  absl::StatusOr<ferry::Config> config =
      ferry::ReadConfig(std::vector<char*>(rest.begin() + 1, rest.end()));
  if (!config.ok()) {
    std::fprintf(stderr, "ferry_run: %s\n",
                 std::string(config.status().message()).c_str());
    return 2;
  }
  struct sigaction sa {};
  sa.sa_handler = ferry::OnSignal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  std::unique_ptr<ferry::TcpStoreServer> server;
  int port = config->port;
  if (config->node_rank == 0) {
    // The store binds the master address (a host name is resolved).
    absl::StatusOr<std::string> bind = ferry::NumericHost(config->addr);
    if (!bind.ok()) {
      std::fprintf(stderr, "ferry_run: --master_addr: %s\n",
                   bind.status().ToString().c_str());
      return 2;
    }
    ferry::TcpStoreServer::Options so;
    so.host = *bind;
    so.port = config->port;
    // FERRY_STORE_SECRET_FILE / FERRY_STORE_SECRET: the workers inherit it.
    absl::StatusOr<std::string> secret = ferry::tcpstore::StoreSecretFromEnv();
    if (!secret.ok()) {
      std::fprintf(stderr, "ferry_run: %s\n",
                   secret.status().ToString().c_str());
      return 2;
    }
    so.secret = *secret;
    absl::StatusOr<std::unique_ptr<ferry::TcpStoreServer>> started =
        ferry::TcpStoreServer::Start(so);
    if (!started.ok()) {
      std::fprintf(stderr, "ferry_run: cannot start the store: %s\n",
                   started.status().ToString().c_str());
      return 1;
    }
    server = *std::move(started);
    port = server->port();
  }
  const int code = ferry::Launcher(*std::move(config), port).Run();
  if (server != nullptr) server->Stop();
  return code;
}
