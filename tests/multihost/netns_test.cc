// Ferry across three "hosts": network namespaces joined by veth pairs to a
// bridge (tests/multihost/netns_hosts.sh), each with its own 10.213.0.x
// address. Stated expectations, each asserted:
//   - a job (RPC, Gloo all-reduce, store) under one ferry_run per host
//     completes, every worker publishing its host's address, and c10d takes
//     Gloo (not same-host shared memory) across the namespaces;
//   - a worker SIGKILLed while two peers' calls to it are in flight: both
//     callers get an error naming it well within their timeout, and can
//     still call each other;
//   - a link cut (the bridge port of host 1 set down): a call to host 1
//     fails with Unavailable or DeadlineExceeded within its timeout; after
//     the link returns, new calls succeed (gRPC reconnects);
//   - a worker SIGKILLed while the others are in a Gloo all-reduce: they
//     fail within their timeout, the error naming its address;
//   - a worker SIGKILLed mid-job under ferry_run (the others in the
//     all-reduce): every node's ferry_run exits non-zero naming it, soon;
//   - the store host killed: a worker waiting on the store gets an error
//     naming the store within its timeout;
//   - 20 ms one-way delay and 1% loss on every host's egress (tc netem where
//     the kernel has sch_netem, else tests/multihost/link_emulator; the log
//     says which): every rpc_sync pays at least the added round trip (40 ms)
//     and an all-reduce at least one added one-way delay (20 ms), each
//     within its timeout, and the job completes within its deadline.
// Skips with the harness's reason where namespaces cannot be created (not
// root).
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "ferry/tests/util/subprocess.h"

namespace ferry {
namespace {

using testutil::RunCommand;
using testutil::RunfilePath;
using testutil::SpawnOptions;
using testutil::Subprocess;

constexpr int kHosts = 3;
constexpr char kIp[] = "/usr/sbin/ip";

class NetnsTest : public ::testing::Test {
 protected:
  // Extra netns_hosts.sh flags (link shape).
  virtual std::vector<std::string> HarnessFlags() const { return {}; }

  void SetUp() override {
    signal(SIGPIPE, SIG_IGN);  // A killed worker's stdin must not kill us.
    std::vector<std::string> argv = {
        RunfilePath("tests/multihost/netns_hosts.sh"),
        "--emulator=" + RunfilePath("tests/multihost/link_emulator")};
    for (std::string& f : HarnessFlags()) argv.push_back(std::move(f));
    argv.push_back(std::to_string(kHosts));
    auto h =
        Subprocess::Spawn(argv, SpawnOptions().PipeStdin().CaptureStdout());
    ASSERT_TRUE(h.ok()) << h.status();
    harness_ = *std::move(h);
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    for (int lines = 0; lines < 2 * kHosts + 4; ++lines) {
      std::string line = harness_->ReadLine(deadline);
      if (absl::StartsWith(line, "skip: ")) GTEST_SKIP() << line.substr(6);
      ASSERT_FALSE(line.empty() || absl::StartsWith(line, "error"))
          << "netns_hosts.sh: '" << line << "'";
      std::vector<std::string> f = absl::StrSplit(line, ' ');
      if (f[0] == "host" && f.size() == 4) {
        ns_.push_back(f[2]);
        addr_.push_back(f[3]);
      } else if (f[0] == "switch" && f.size() == 2) {
        switch_ = f[1];
      } else if (f[0] == "shape") {
        shape_ = line;
        std::printf("netns_hosts.sh: %s\n", line.c_str());
      } else if (f[0] == "ready") {
        break;
      }
    }
    ASSERT_EQ(ns_.size(), static_cast<size_t>(kHosts));
    ASSERT_FALSE(switch_.empty());
    ASSERT_FALSE(shape_.empty());
  }

  void TearDown() override {
    workers_.clear();  // SIGKILLs what is left, before the hosts go.
    if (harness_ == nullptr) return;
    harness_->CloseStdin();  // The harness removes the namespaces.
    absl::StatusOr<int> code = harness_->Wait(absl::Now() + absl::Seconds(20));
    EXPECT_TRUE(code.ok() && *code == 0) << "netns_hosts.sh cleanup";
  }

  // `argv` run inside host `h` (ip netns exec execs it: same pid).
  std::unique_ptr<Subprocess> SpawnOn(int h, std::vector<std::string> argv,
                                      std::map<std::string, std::string> env,
                                      bool pipe_stdin) {
    argv.insert(argv.begin(), {kIp, "netns", "exec", ns_[h]});
    SpawnOptions o = SpawnOptions().CaptureStdout().MergeStderr();
    o.pipe_stdin = pipe_stdin;
    // c10d's default is left alone: the namespaces share /dev/shm and the
    // boot id, and the job checks that the network namespace alone keeps
    // it on Gloo, as between real hosts.
    o.env = std::move(env);
    auto p = Subprocess::Spawn(argv, o);
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? *std::move(p) : nullptr;
  }

  std::pair<int, std::string> Ip(std::vector<std::string> args) {
    args.insert(args.begin(), kIp);
    return RunCommand(args, {}, absl::Seconds(10));
  }

  // One ferry_run per host, 1 worker each, job_main given `job_args`.
  // Returns each node's exit code (-1: none) and output.
  std::vector<std::pair<int, std::string>> RunJobOnEveryHost(
      std::vector<std::string> job_args = {}) {
    std::vector<std::unique_ptr<Subprocess>> nodes;
    for (int h = 0; h < kHosts; ++h) {
      std::vector<std::string> argv = {RunfilePath("tools/launcher/ferry_run"),
                                       "--nnodes=3",
                                       absl::StrCat("--node_rank=", h),
                                       "--nproc_per_node=1",
                                       "--master_addr=" + addr_[0],
                                       "--master_port=29500",
                                       "--timeout_s=50",
                                       "--rdzv_timeout_s=30",
                                       "--grace_s=2",
                                       "--",
                                       RunfilePath("tests/multihost/job_main")};
      argv.insert(argv.end(), job_args.begin(), job_args.end());
      nodes.push_back(SpawnOn(h, argv, {}, false));
    }
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    std::vector<std::pair<int, std::string>> out;
    for (auto& n : nodes) {
      if (n == nullptr) {
        out.push_back({-1, ""});
        continue;
      }
      std::string text = n->ReadAll(deadline);
      absl::StatusOr<int> code = n->Wait(deadline);
      out.push_back({code.ok() ? *code : -1, std::move(text)});
    }
    return out;
  }

  void ExpectJobDone(const std::vector<std::pair<int, std::string>>& nodes) {
    for (int h = 0; h < kHosts; ++h) {
      const std::string& out_h = nodes[h].second;
      EXPECT_EQ(nodes[h].first, 0) << out_h;
      // Rank h runs on host h and publishes that host's address.
      EXPECT_TRUE(absl::StrContains(
          out_h, absl::StrCat("rank ", h, ": joined 3 workers as worker", h,
                              " at ", addr_[h], ":")))
          << out_h;
      for (const char* step :
           {"rpc ok", "allreduce ok sum=6 backend=gloo", "store ok", "done"}) {
        EXPECT_TRUE(
            absl::StrContains(out_h, absl::StrCat("rank ", h, ": ", step)))
            << "host " << h << " missing '" << step << "':\n"
            << out_h;
      }
    }
  }

  // Interactive workers (job_main --interactive), one per host; rank 0
  // hosts the store on host 0.
  void StartInteractive(int port, bool with_c10d = false) {
    for (int h = 0; h < kHosts; ++h) {
      workers_.push_back(
          SpawnOn(h,
                  {RunfilePath("tests/multihost/job_main"), "--interactive",
                   absl::StrCat("--with_c10d=", with_c10d)},
                  {{"RANK", std::to_string(h)},
                   {"WORLD_SIZE", std::to_string(kHosts)},
                   {"MASTER_ADDR", addr_[0]},
                   {"MASTER_PORT", std::to_string(port)}},
                  true));
      ASSERT_NE(workers_.back(), nullptr);
    }
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    for (auto& w : workers_) {
      std::string got = w->ReadUntil(deadline, [](const std::string& t) {
        return absl::StrContains(t, "ready\n");
      });
      ASSERT_TRUE(absl::StrContains(got, "ready")) << got;
    }
  }

  struct CallResult {
    std::string code;  // "OK", "UNAVAILABLE", ... ; "" if no answer.
    int64_t ms = -1;
    std::string line;
  };
  // Sends a command to worker `h` and waits (up to `wait`) for its result.
  CallResult Send(int h, const std::string& command, absl::Duration wait) {
    EXPECT_TRUE(workers_[h]->WriteStdin(command + "\n").ok());
    return ReadResult(h, wait);
  }
  CallResult ReadResult(int h, absl::Duration wait) {
    CallResult r;
    const absl::Time deadline = absl::Now() + wait;
    while (absl::Now() < deadline) {
      std::string line = workers_[h]->ReadLine(deadline);
      if (!absl::StartsWith(line, "result ")) {
        if (line.empty()) break;
        continue;
      }
      std::vector<std::string> f =
          absl::StrSplit(line, absl::MaxSplits(' ', 4));
      r.line = line;
      if (f.size() >= 4) {
        r.code = f[2];
        absl::SimpleAtoi(f[3], &r.ms);
      }
      break;
    }
    return r;
  }

  std::unique_ptr<Subprocess> harness_;
  std::vector<std::string> ns_, addr_;
  std::string switch_;
  std::string shape_;  // netns_hosts.sh's "shape ..." line.
  std::vector<std::unique_ptr<Subprocess>> workers_;
};

TEST_F(NetnsTest, JobRunsAcrossThreeHosts) {
  ExpectJobDone(RunJobOnEveryHost());
}

TEST_F(NetnsTest, WorkerKilledMidJobStopsEveryNodeNamingIt) {
  const absl::Time start = absl::Now();
  std::vector<std::pair<int, std::string>> nodes =
      RunJobOnEveryHost({"--die_rank=2"});
  for (int h = 0; h < kHosts; ++h) {
    EXPECT_NE(nodes[h].first, 0) << nodes[h].second;
    EXPECT_NE(nodes[h].first, -1) << "node " << h << " did not exit";
    EXPECT_TRUE(absl::StrContains(
        nodes[h].second,
        "job failed (node 2 rank 2 failed with signal 9 (Killed))"))
        << nodes[h].second;
  }
  EXPECT_TRUE(absl::StrContains(nodes[2].second, "rank 2: killing itself"))
      << nodes[2].second;
  // Far below the job's --timeout_s (50 s): nobody waited it out.
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
}

TEST_F(NetnsTest, WorkerKilledMidCollectiveFailsTheOthersInTime) {
  ASSERT_NO_FATAL_FAILURE(StartInteractive(29504, /*with_c10d=*/true));
  // Hosts 0 and 1 enter an all-reduce (timeout 15 s) that host 2 never
  // joins: it is killed.
  ASSERT_TRUE(workers_[0]->WriteStdin("allreduce - 15000\n").ok());
  ASSERT_TRUE(workers_[1]->WriteStdin("allreduce - 15000\n").ok());
  ASSERT_TRUE(workers_[2]->Signal(SIGKILL).ok());
  const absl::Time killed = absl::Now();
  for (int h : {0, 1}) {
    CallResult r = ReadResult(h, absl::Seconds(20));
    std::printf("host %d in the all-reduce: %s\n", h, r.line.c_str());
    EXPECT_NE(r.code, "") << "host " << h << " never answered";
    EXPECT_NE(r.code, "OK") << r.line;
    // Gloo names the dead peer by its address (not yet by rank).
    EXPECT_TRUE(absl::StrContains(r.line, addr_[2])) << r.line;
    EXPECT_LT(absl::Now() - killed, absl::Seconds(16)) << r.line;
  }
}

TEST_F(NetnsTest, StoreHostKilledFailsAStoreWaitNamingTheStore) {
  ASSERT_NO_FATAL_FAILURE(StartInteractive(29503));
  // Worker 1 waits (up to 15 s) for a key nobody sets; rank 0, which hosts
  // the store on host 0, dies meanwhile.
  ASSERT_TRUE(workers_[1]->WriteStdin("wait never_set 15000\n").ok());
  ASSERT_TRUE(workers_[0]->Signal(SIGKILL).ok());
  const absl::Time killed = absl::Now();
  CallResult r = ReadResult(1, absl::Seconds(20));
  std::printf("store host killed: %s\n", r.line.c_str());
  EXPECT_NE(r.code, "") << "worker 1 never answered";
  EXPECT_NE(r.code, "OK") << r.line;
  EXPECT_TRUE(absl::StrContains(r.line, absl::StrCat(addr_[0], ":29503")))
      << r.line;
  EXPECT_LT(absl::Now() - killed, absl::Seconds(16)) << r.line;
}

TEST_F(NetnsTest, WorkerKilledMidCallFailsItsCallersNamingIt) {
  ASSERT_NO_FATAL_FAILURE(StartInteractive(29501));
  // Hosts 0 and 1 call worker2's blocking function (timeout 15 s).
  ASSERT_TRUE(workers_[0]->WriteStdin("block worker2 15000\n").ok());
  ASSERT_TRUE(workers_[1]->WriteStdin("block worker2 15000\n").ok());
  std::string seen = workers_[2]->ReadUntil(
      absl::Now() + absl::Seconds(10), [](const std::string& t) {
        return absl::StrContains(t, "worker2: blocking");
      });
  ASSERT_TRUE(absl::StrContains(seen, "worker2: blocking")) << seen;
  const absl::Time killed = absl::Now();
  ASSERT_TRUE(workers_[2]->Signal(SIGKILL).ok());
  for (int h : {0, 1}) {
    CallResult r = ReadResult(h, absl::Seconds(20));
    std::printf("host %d after the kill: %s\n", h, r.line.c_str());
    EXPECT_NE(r.code, "") << "host " << h << " never answered";
    EXPECT_NE(r.code, "OK") << r.line;
    EXPECT_TRUE(absl::StrContains(r.line, "worker2")) << r.line;
    // Well within the 15 s timeout: the dead peer's connection is reset.
    EXPECT_LT(absl::Now() - killed, absl::Seconds(10)) << r.line;
  }
  // The survivors still reach each other.
  CallResult ok = Send(0, "call worker1 5000", absl::Seconds(10));
  EXPECT_EQ(ok.code, "OK") << ok.line;
}

TEST_F(NetnsTest, LinkCutFailsCallsInTimeAndTheyRecoverAfterward) {
  ASSERT_NO_FATAL_FAILURE(StartInteractive(29502));
  CallResult before = Send(0, "call worker1 3000", absl::Seconds(10));
  ASSERT_EQ(before.code, "OK") << before.line;

  auto [down, down_out] = Ip({"-n", switch_, "link", "set", "vh1", "down"});
  ASSERT_EQ(down, 0) << down_out;
  CallResult cut = Send(0, "call worker1 2000", absl::Seconds(10));
  std::printf("link down: %s\n", cut.line.c_str());
  EXPECT_TRUE(cut.code == "UNAVAILABLE" || cut.code == "DEADLINE_EXCEEDED")
      << cut.line;
  EXPECT_GE(cut.ms, 0) << cut.line;
  EXPECT_LE(cut.ms, 2000 + 1000) << cut.line;
  EXPECT_TRUE(absl::StrContains(cut.line, "worker1")) << cut.line;

  auto [up, up_out] = Ip({"-n", switch_, "link", "set", "vh1", "up"});
  ASSERT_EQ(up, 0) << up_out;
  // gRPC reconnects (backoff <= 1 s): bounded retries, 20 s in all.
  CallResult after;
  const absl::Time until = absl::Now() + absl::Seconds(20);
  for (int i = 0; i < 20 && absl::Now() < until && after.code != "OK"; ++i) {
    after = Send(0, "call worker1 1000", absl::Seconds(5));
  }
  std::printf("link up again: %s\n", after.line.c_str());
  EXPECT_EQ(after.code, "OK") << after.line;
}

// The harness SIGKILLed: its link emulators exit with it (their parent-death
// signal), and the next harness removes the namespaces it left.
TEST(NetnsHarnessTest, AKilledHarnessLeavesNoEmulatorAndNoNamespace) {
  auto h = Subprocess::Spawn(
      {RunfilePath("tests/multihost/netns_hosts.sh"), "--shape=emulator",
       "--emulator=" + RunfilePath("tests/multihost/link_emulator"), "2"},
      SpawnOptions().PipeStdin().CaptureStdout());
  ASSERT_TRUE(h.ok()) << h.status();
  std::vector<int> pidfds;
  std::vector<std::string> namespaces;
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  for (int lines = 0; lines < 10; ++lines) {
    std::string line = (*h)->ReadLine(deadline);
    if (absl::StartsWith(line, "skip: ")) GTEST_SKIP() << line.substr(6);
    ASSERT_FALSE(line.empty() || absl::StartsWith(line, "error")) << line;
    std::vector<std::string> f = absl::StrSplit(line, ' ');
    int pid = 0;
    if (f[0] == "emulator" && f.size() == 3 && absl::SimpleAtoi(f[2], &pid)) {
      const int fd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
      ASSERT_GE(fd, 0) << "emulator " << pid << " is not running";
      pidfds.push_back(fd);
    } else if (f[0] == "host" && f.size() == 4) {
      namespaces.push_back(f[2]);
    } else if (f[0] == "ready") {
      break;
    }
  }
  ASSERT_EQ(pidfds.size(), 2u);
  ASSERT_TRUE((*h)->Signal(SIGKILL).ok());
  EXPECT_FALSE((*h)->Wait(absl::Now() + absl::Seconds(10)).ok());
  for (int fd : pidfds) {
    pollfd p{fd, POLLIN, 0};
    EXPECT_EQ(poll(&p, 1, 10000), 1) << "an emulator outlived its harness";
    close(fd);
  }
  // A new harness clears what the killed one left.
  auto next =
      Subprocess::Spawn({RunfilePath("tests/multihost/netns_hosts.sh"), "1"},
                        SpawnOptions().PipeStdin().CaptureStdout());
  ASSERT_TRUE(next.ok()) << next.status();
  std::string got = (*next)->ReadUntil(
      absl::Now() + absl::Seconds(60), [](const std::string& t) {
        return absl::StrContains(t, "ready\n") || absl::StrContains(t, "error");
      });
  ASSERT_TRUE(absl::StrContains(got, "ready")) << got;
  auto [code, list] = RunCommand({kIp, "netns", "list"}, {}, absl::Seconds(10));
  ASSERT_EQ(code, 0) << list;
  for (const std::string& ns : namespaces) {
    EXPECT_FALSE(absl::StrContains(list, ns)) << ns << " left behind:\n"
                                              << list;
  }
  (*next)->CloseStdin();
  absl::StatusOr<int> done = (*next)->Wait(absl::Now() + absl::Seconds(20));
  EXPECT_TRUE(done.ok() && *done == 0) << "netns_hosts.sh cleanup";
}

// Every host's egress delayed 20 ms and 1% of its frames lost.
class NetnsShapedTest : public NetnsTest {
 protected:
  static constexpr int kDelayMs = 20;
  std::vector<std::string> HarnessFlags() const override {
    return {absl::StrCat("--delay_us=", kDelayMs * 1000), "--loss_pct=1",
            "--seed=13"};
  }
};

TEST_F(NetnsShapedTest, CallsAndAllReducesPayTheAddedDelayInTime) {
  ASSERT_NO_FATAL_FAILURE(StartInteractive(29505, /*with_c10d=*/true));
  // A round trip crosses two shaped egresses (caller's, callee's).
  for (int i = 0; i < 5; ++i) {
    CallResult r = Send(0, "call worker1 5000", absl::Seconds(10));
    std::printf("rpc_sync worker0 -> worker1: %s\n", r.line.c_str());
    EXPECT_EQ(r.code, "OK") << r.line;
    EXPECT_GE(r.ms, 2 * kDelayMs) << r.line;
  }
  // An all-reduce needs data from another host: at least one egress.
  for (auto& w : workers_) {
    ASSERT_TRUE(w->WriteStdin("allreduce - 15000\n").ok());
  }
  for (int h = 0; h < kHosts; ++h) {
    CallResult r = ReadResult(h, absl::Seconds(20));
    std::printf("all-reduce on host %d: %s\n", h, r.line.c_str());
    EXPECT_EQ(r.code, "OK") << r.line;
    EXPECT_GE(r.ms, kDelayMs) << r.line;
  }
}

TEST_F(NetnsShapedTest, JobCompletesUnderDelayAndLoss) {
  const absl::Time start = absl::Now();
  ExpectJobDone(RunJobOnEveryHost());  // Each node within 60 s.
  std::printf("job under the shaped links: %s\n",
              absl::FormatDuration(absl::Now() - start).c_str());
}

}  // namespace
}  // namespace ferry
