// ferry_run as a multi-node launcher: two ferry_run "nodes" on loopback
// meet through node 0's store, give their workers torchrun's variables, run
// a Ferry job (RPC + Gloo all-reduce + store) across both, restart it after
// a failure (--max_restarts) and stop every node when it cannot; the failure
// policy (--elastic_ranks, --restart_ranks) on one node with policy_worker:
// every wait is on the launcher's output lines or a process's exit.
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "ferry/tests/util/held_port.h"
#include "ferry/tests/util/subprocess.h"

namespace ferry {
namespace {

using testutil::HeldPort;
using testutil::RunCommand;
using testutil::RunfilePath;
using testutil::SpawnOptions;
using testutil::Subprocess;

struct NodeResult {
  int code = -1;
  std::string out;
};

// Runs one ferry_run per entry of `nodes` (its flags, then the program)
// concurrently; returns each one's exit code and output.
std::vector<NodeResult> RunNodes(
    const std::vector<std::vector<std::string>>& nodes) {
  std::vector<std::unique_ptr<Subprocess>> procs;
  for (const auto& args : nodes) {
    std::vector<std::string> argv = {RunfilePath("tools/launcher/ferry_run")};
    argv.insert(argv.end(), args.begin(), args.end());
    auto p =
        Subprocess::Spawn(argv, SpawnOptions().CaptureStdout().MergeStderr());
    EXPECT_TRUE(p.ok()) << p.status();
    if (!p.ok()) return {};
    procs.push_back(*std::move(p));
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(90);
  std::vector<NodeResult> results(procs.size());
  // Each launcher's output is small; reading them in turn cannot deadlock a
  // pipe, and each read ends at EOF (exit) or the shared deadline.
  for (size_t i = 0; i < procs.size(); ++i) {
    results[i].out = procs[i]->ReadAll(deadline);
    absl::StatusOr<int> code = procs[i]->Wait(deadline);
    results[i].code = code.ok() ? *code : -1;
  }
  return results;
}

// ferry_run `flags`, then job_main with `args`.
std::vector<std::string> Job(std::vector<std::string> flags,
                             std::vector<std::string> args = {}) {
  flags.push_back("--");
  flags.push_back(RunfilePath("tests/multihost/job_main"));
  flags.insert(flags.end(), args.begin(), args.end());
  return flags;
}

TEST(MultiNodeLaunch, TwoNodesGiveTorchrunsVariables) {
  HeldPort port;
  ASSERT_NE(port.port(), 0);
  const std::string p = std::to_string(port.port());
  const std::string show =
      "echo \"r=$RANK l=$LOCAL_RANK w=$WORLD_SIZE lw=$LOCAL_WORLD_SIZE "
      "g=$GROUP_RANK gw=$GROUP_WORLD_SIZE m=$MASTER_ADDR:$MASTER_PORT "
      "gen=$FERRY_RUN_GENERATION\"";
  // Node 1 in torchrun's spelling (hyphens, no "--"); node 0 in ours.
  std::vector<NodeResult> r =
      RunNodes({{"--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "2",
                 "--rdzv-endpoint", "127.0.0.1:" + p, "/bin/sh", "-c", show},
                {"--nnodes=2", "--node_rank=0", "--nproc_per_node=2",
                 "--master_addr=127.0.0.1", "--master_port=" + p, "--",
                 "/bin/sh", "-c", show}});
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].code, 0) << r[0].out;
  EXPECT_EQ(r[1].code, 0) << r[1].out;
  for (int local = 0; local < 2; ++local) {
    for (int node = 0; node < 2; ++node) {
      const int rank = node * 2 + local;
      const std::string want =
          absl::StrCat("[", rank, "]: r=", rank, " l=", local,
                       " w=4 lw=2 g=", node, " gw=2 m=127.0.0.1:", p, " gen=0");
      EXPECT_TRUE(absl::StrContains(r[1 - node].out, want))
          << "missing '" << want << "' in\n"
          << r[1 - node].out;
    }
  }
}

TEST(MultiNodeLaunch, TwoNodesRunAFerryJob) {
  HeldPort port;
  ASSERT_NE(port.port(), 0);
  const std::string p = std::to_string(port.port());
  std::vector<NodeResult> r =
      RunNodes({Job({"--nnodes=2", "--node_rank=0", "--nproc_per_node=2",
                     "--master_port=" + p, "--timeout_s=80"}),
                Job({"--nnodes=2", "--node_rank=1", "--nproc_per_node=2",
                     "--master_port=" + p, "--timeout_s=80"})});
  ASSERT_EQ(r.size(), 2u);
  ASSERT_EQ(r[0].code, 0) << r[0].out;
  ASSERT_EQ(r[1].code, 0) << r[1].out;
  for (int rank = 0; rank < 4; ++rank) {
    const std::string& out = r[rank / 2].out;
    for (const char* step :
         {"rpc ok", "allreduce ok sum=10", "store ok", "done"}) {
      EXPECT_TRUE(absl::StrContains(
          out, absl::StrCat("[", rank, "]: rank ", rank, ": ", step)))
          << "rank " << rank << " missing '" << step << "' in\n"
          << out;
    }
  }
}

TEST(MultiNodeLaunch, MaxRestartsRestartsEveryNodeAsTheNextGeneration) {
  HeldPort port;
  ASSERT_NE(port.port(), 0);
  const std::string p = std::to_string(port.port());
  auto node = [&](int rank) {
    return Job({"--nnodes=2", absl::StrCat("--node_rank=", rank),
                "--nproc_per_node=2", "--master_port=" + p, "--max_restarts=1",
                "--grace_s=2", "--timeout_s=80"});
  };
  std::vector<std::string> n0 = node(0), n1 = node(1);
  n0.push_back("--fail_rank=3");
  n1.push_back("--fail_rank=3");
  std::vector<NodeResult> r = RunNodes({n0, n1});
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].code, 0) << r[0].out;
  EXPECT_EQ(r[1].code, 0) << r[1].out;
  EXPECT_TRUE(absl::StrContains(r[1].out, "rank 3: failing on purpose"))
      << r[1].out;
  for (const NodeResult& n : r) {
    EXPECT_TRUE(absl::StrContains(
        n.out,
        "node 1 rank 3 failed with exit code 3; restarting the job as "
        "generation 1"))
        << n.out;
  }
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_TRUE(absl::StrContains(
        r[rank / 2].out, absl::StrCat("[", rank, "]: rank ", rank, ": done")))
        << r[rank / 2].out;
  }
}

TEST(MultiNodeLaunch, AFailureWithoutRestartsStopsEveryNodeNamingIt) {
  HeldPort port;
  ASSERT_NE(port.port(), 0);
  const std::string p = std::to_string(port.port());
  const absl::Time start = absl::Now();
  // Rank 2 fails; rank 3 (same node) and node 0's ranks would wait for it
  // in the all-reduce: the launchers must stop them.
  std::vector<NodeResult> r =
      RunNodes({Job({"--nnodes=2", "--node_rank=0", "--nproc_per_node=2",
                     "--master_port=" + p, "--grace_s=2", "--timeout_s=80"},
                    {"--fail_rank=2"}),
                Job({"--nnodes=2", "--node_rank=1", "--nproc_per_node=2",
                     "--master_port=" + p, "--grace_s=2", "--timeout_s=80"},
                    {"--fail_rank=2"})});
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[1].code, 3) << r[1].out;
  EXPECT_EQ(r[0].code, 1) << r[0].out;
  for (const NodeResult& n : r) {
    EXPECT_TRUE(absl::StrContains(
        n.out, "job failed (node 1 rank 2 failed with exit code 3)"))
        << n.out;
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(45));
}

// A worker of an earlier attempt that reaches the store after the restart is
// refused by InitRpc, naming both generations.
TEST(MultiNodeLaunch, AStaleWorkerIsRefusedAfterARestart) {
  HeldPort port;
  ASSERT_NE(port.port(), 0);
  const std::string p = std::to_string(port.port());
  // Generation 0 fails; generation 1 waits for our stdin to close.
  auto launcher = Subprocess::Spawn(
      {RunfilePath("tools/launcher/ferry_run"), "--nproc_per_node=1",
       "--master_port=" + p, "--max_restarts=1", "--timeout_s=60", "--",
       "/bin/sh", "-c",
       "[ \"$FERRY_RUN_GENERATION\" = 0 ] && exit 5; echo waiting; read x; "
       "exit 0"},
      SpawnOptions().PipeStdin().CaptureStdout().MergeStderr());
  ASSERT_TRUE(launcher.ok()) << launcher.status();
  std::string seen = (*launcher)->ReadUntil(
      absl::Now() + absl::Seconds(30), [](const std::string& t) {
        return absl::StrContains(t, "[0]: waiting");
      });
  ASSERT_TRUE(absl::StrContains(seen, "[0]: waiting")) << seen;

  auto [code, out] = RunCommand({RunfilePath("tests/multihost/job_main")},
                                {{"RANK", "0"},
                                 {"WORLD_SIZE", "1"},
                                 {"MASTER_ADDR", "127.0.0.1"},
                                 {"MASTER_PORT", p},
                                 {"FERRY_USE_AGENT_STORE", "1"},
                                 {"FERRY_RUN_GENERATION", "0"}},
                                absl::Seconds(30));
  EXPECT_EQ(code, 1) << out;
  EXPECT_TRUE(absl::StrContains(
      out,
      "worker of launcher generation 0 refused: the job has restarted "
      "and is at generation 1"))
      << out;

  (*launcher)->CloseStdin();
  std::string rest = (*launcher)->ReadAll(absl::Now() + absl::Seconds(30));
  absl::StatusOr<int> done = (*launcher)->Wait(absl::Now() + absl::Seconds(30));
  EXPECT_TRUE(done.ok() && *done == 0) << seen << rest;
}

TEST(MultiNodeLaunch, BadFlagsAreRefused) {
  struct Case {
    std::vector<std::string> args;
    std::string says;
  } cases[] = {
      {{"--standalone", "--nnodes=2", "--", "/bin/true"}, "--standalone"},
      {{"--nnodes=2", "--node_rank=1", "--", "/bin/true"}, "--master_port"},
      {{"--nnodes=2", "--node_rank=2", "--master_port=1", "--", "/bin/true"},
       "--node_rank 2 is outside [0, --nnodes 2)"},
      {{"--rdzv_endpoint=h:1", "--master_port=2", "--", "/bin/true"},
       "not both"},
      {{"--nproc=2"}, "no program given"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> argv = {RunfilePath("tools/launcher/ferry_run")};
    argv.insert(argv.end(), c.args.begin(), c.args.end());
    auto [code, out] = RunCommand(argv, {}, absl::Seconds(20));
    EXPECT_EQ(code, 2) << out;
    EXPECT_TRUE(absl::StrContains(out, c.says)) << out;
  }
}

TEST(MultiNodeLaunch, MasterAddrMayBeAHostName) {
  auto [code, out] = RunCommand(
      {RunfilePath("tools/launcher/ferry_run"), "--master_addr=localhost",
       "--nproc=2", "--", "/bin/sh", "-c", "echo \"m=$MASTER_ADDR r=$RANK\""},
      {}, absl::Seconds(30));
  EXPECT_EQ(code, 0) << out;
  EXPECT_TRUE(absl::StrContains(out, "[1]: m=localhost r=1")) << out;
}

TEST(MultiNodeLaunch, StandaloneRunsOneNode) {
  auto [code, out] =
      RunCommand({RunfilePath("tools/launcher/ferry_run"), "--standalone",
                  "--nproc-per-node", "2", "/bin/sh", "-c",
                  "echo \"r=$RANK w=$WORLD_SIZE g=$GROUP_RANK\""},
                 {}, absl::Seconds(30));
  EXPECT_EQ(code, 0) << out;
  EXPECT_TRUE(absl::StrContains(out, "[1]: r=1 w=2 g=0")) << out;
}

// Like torchrun's OMP_NUM_THREADS: one thread per pool when several workers
// share the node, unless the user chose; a single worker keeps the default.
TEST(MultiNodeLaunch, SeveralWorkersGetOneBlasThreadUnlessSet) {
  const std::vector<std::string> show = {
      "/bin/sh", "-c",
      "echo \"o=${OMP_NUM_THREADS-unset} b=${OPENBLAS_NUM_THREADS-unset}\""};
  auto run = [&](const std::string& nproc,
                 std::map<std::string, std::string> env) {
    std::vector<std::string> argv = {RunfilePath("tools/launcher/ferry_run"),
                                     "--standalone", "--nproc=" + nproc, "--"};
    argv.insert(argv.end(), show.begin(), show.end());
    return RunCommand(argv, std::move(env), absl::Seconds(30));
  };
  auto [code, out] = run("2", {});
  EXPECT_EQ(code, 0) << out;
  EXPECT_TRUE(absl::StrContains(out, "[1]: o=1 b=1")) << out;
  std::tie(code, out) = run("2", {{"OPENBLAS_NUM_THREADS", "3"}});
  EXPECT_EQ(code, 0) << out;
  EXPECT_TRUE(absl::StrContains(out, "[0]: o=1 b=3")) << out;
  std::tie(code, out) = run("1", {});
  EXPECT_EQ(code, 0) << out;
  EXPECT_TRUE(absl::StrContains(out, "[0]: o=unset b=unset")) << out;
}

// --- The failure policy ------------------------------------------------------

struct PolicyRun {
  int code = -1;
  std::string out;  // The launcher's output (its workers' lines included).
};

// ferry_run --standalone --nproc=3 `flags` -- policy_worker `args`; once the
// launcher printed every string of `markers` (in any order), its stdin is
// closed, which tells the surviving workers to finish (policy_worker).
PolicyRun RunPolicy(std::vector<std::string> flags,
                    std::vector<std::string> args,
                    std::vector<std::string> markers) {
  std::vector<std::string> argv = {RunfilePath("tools/launcher/ferry_run"),
                                   "--standalone", "--nproc=3", "--grace_s=2",
                                   "--timeout_s=60"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  argv.push_back("--");
  argv.push_back(RunfilePath("tests/multihost/policy_worker"));
  argv.insert(argv.end(), args.begin(), args.end());
  PolicyRun r;
  auto p = Subprocess::Spawn(
      argv, SpawnOptions().PipeStdin().CaptureStdout().MergeStderr());
  EXPECT_TRUE(p.ok()) << p.status();
  if (!p.ok()) return r;
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  r.out = (*p)->ReadUntil(deadline, [&](const std::string& text) {
    for (const std::string& m : markers) {
      if (!absl::StrContains(text, m)) return false;
    }
    return true;
  });
  (*p)->CloseStdin();
  r.out += (*p)->ReadAll(deadline);
  absl::StatusOr<int> code = (*p)->Wait(deadline);
  r.code = code.ok() ? *code : -1;
  return r;
}

int Count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos;
       at = text.find(what, at + 1)) {
    ++n;
  }
  return n;
}

// A SIGKILLed worker of an elastic rank is reported; the others go on and
// the job succeeds, its summary naming the rank, the signal and the time.
TEST(FailurePolicy, AnElasticRankLostIsReportedAndTheJobGoesOn) {
  PolicyRun r =
      RunPolicy({"--elastic-ranks=1-2"}, {"--die_ranks=1"},
                {"reported (elastic rank), the job goes on",
                 "[0]: rank 0 restart 0", "[2]: rank 2 restart 0"});
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "[0]: rank 0 done")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "[2]: rank 2 done")) << r.out;
  EXPECT_FALSE(absl::StrContains(r.out, "[1]: rank 1 done")) << r.out;
  EXPECT_TRUE(absl::StrContains(
      r.out, "all 3 workers finished (1 failure(s) handled by the policy)"))
      << r.out;
  const size_t at = r.out.find("ferry_run: summary: node 0: rank 1 (pid ");
  ASSERT_NE(at, std::string::npos) << r.out;
  const std::string line = r.out.substr(at, r.out.find('\n', at) - at);
  EXPECT_TRUE(absl::StrContains(line, ") died with signal 9 (Killed) at "))
      << line;
  EXPECT_TRUE(absl::StrContains(line, " s: reported (elastic rank)")) << line;
  EXPECT_EQ(Count(r.out, "ferry_run: summary:"), 1) << r.out;
}

// A worker of a restart rank is started again alone, with the same RANK and
// FERRY_RUN_RESTART=k, until it stays up; the other workers are the same
// processes throughout (each printed its start line once).
TEST(FailurePolicy, ARestartRankIsRestartedAloneWithinItsBudget) {
  PolicyRun r = RunPolicy({"--restart_ranks=1", "--rank-restarts=3"},
                          {"--die_ranks=1", "--die_times=2"},
                          {"[1]: rank 1 restart 2 pid", "[0]: rank 0 restart 0",
                           "[2]: rank 2 restart 0"});
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(Count(r.out, "[0]: rank 0 restart"), 1) << r.out;
  EXPECT_EQ(Count(r.out, "[2]: rank 2 restart"), 1) << r.out;
  for (int k = 0; k <= 2; ++k) {
    EXPECT_TRUE(
        absl::StrContains(r.out, absl::StrCat("[1]: rank 1 restart ", k)))
        << r.out;
  }
  EXPECT_TRUE(absl::StrContains(r.out, "[1]: rank 1 done")) << r.out;
  EXPECT_EQ(Count(r.out, "ferry_run: summary: node 0: rank 1 (pid "), 2)
      << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, ": restarted 1 of 3 (new pid ")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, ": restarted 2 of 3 (new pid ")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "FERRY_RUN_RESTART=2)")) << r.out;
}

// Past its budget a restart rank's failure stops the job, as a rank without
// a policy does; the summary says so and lists the restarts before it.
TEST(FailurePolicy, ASpentRestartBudgetStopsTheJob) {
  PolicyRun r = RunPolicy({"--restart_ranks=1-2", "--rank_restarts=1"},
                          {"--die_ranks=2", "--die_exit=5"}, {"job failed"});
  EXPECT_EQ(r.code, 5) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "died with exit code 5 at ")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, ": restarted 1 of 1 (new pid ")) << r.out;
  EXPECT_TRUE(absl::StrContains(
      r.out, ": job stopped (restart budget of 1 spent)")) << r.out;
  EXPECT_TRUE(absl::StrContains(
      r.out, "job failed (node 0 rank 2 failed with exit code 5)")) << r.out;
  EXPECT_EQ(Count(r.out, "ferry_run: summary: node 0: rank 2 (pid "), 2)
      << r.out;
  EXPECT_FALSE(absl::StrContains(r.out, "rank 0 done")) << r.out;
}

// Outside the policy's ranks (and, for an elastic rank, an exit code rather
// than a signal: the worker's own verdict) a failure still stops the job.
TEST(FailurePolicy, FailuresOutsideThePolicyStillStopTheJob) {
  PolicyRun r = RunPolicy({"--elastic_ranks=1-2"}, {"--die_ranks=0"},
                          {"job failed"});
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(absl::StrContains(
      r.out, "job failed (node 0 rank 0 failed with signal 9 (Killed))"))
      << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "s: job stopped\n")) << r.out;
  PolicyRun e = RunPolicy({"--elastic_ranks=1-2"},
                          {"--die_ranks=1", "--die_exit=3"}, {"job failed"});
  EXPECT_EQ(e.code, 3) << e.out;
  EXPECT_TRUE(absl::StrContains(
      e.out,
      "job stopped (an elastic rank that exited with an error, not a signal)"))
      << e.out;
}

// Across two nodes: node 1's elastic rank 3 is lost, node 1's launcher
// reports it, and both nodes finish with 0 (the attempt is done once every
// other worker of both nodes exited 0).
TEST(FailurePolicy, AnElasticRankLostOnAnotherNodeDoesNotStopTheJob) {
  HeldPort port;
  ASSERT_NE(port.port(), 0);
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (int n = 0; n < 2; ++n) {
    auto p = Subprocess::Spawn(
        {RunfilePath("tools/launcher/ferry_run"), "--nnodes=2",
         absl::StrCat("--node_rank=", n), "--nproc_per_node=2",
         absl::StrCat("--master_port=", port.port()), "--elastic_ranks=2-3",
         "--grace_s=2", "--timeout_s=60", "--",
         RunfilePath("tests/multihost/policy_worker"), "--die_ranks=3"},
        SpawnOptions().PipeStdin().CaptureStdout().MergeStderr());
    ASSERT_TRUE(p.ok()) << p.status();
    nodes.push_back(*std::move(p));
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  // Node 1 closes its workers' stdin once its loss is reported; node 0's
  // once its workers run (they then finish: the order does not matter).
  std::string out1 = nodes[1]->ReadUntil(deadline, [](const std::string& t) {
    return absl::StrContains(t, "reported (elastic rank)");
  });
  nodes[1]->CloseStdin();
  nodes[0]->CloseStdin();
  std::string out0 = nodes[0]->ReadAll(deadline);
  out1 += nodes[1]->ReadAll(deadline);
  absl::StatusOr<int> code0 = nodes[0]->Wait(deadline);
  absl::StatusOr<int> code1 = nodes[1]->Wait(deadline);
  ASSERT_TRUE(code0.ok() && code1.ok()) << out0 << out1;
  EXPECT_EQ(*code0, 0) << out0;
  EXPECT_EQ(*code1, 0) << out1;
  EXPECT_TRUE(absl::StrContains(out0, "[0]: rank 0 done")) << out0;
  EXPECT_TRUE(absl::StrContains(out0, "[1]: rank 1 done")) << out0;
  EXPECT_TRUE(absl::StrContains(out1, "[2]: rank 2 done")) << out1;
  EXPECT_TRUE(absl::StrContains(
      out1, "ferry_run: summary: node 1: rank 3 (pid "))
      << out1;
  EXPECT_FALSE(absl::StrContains(out0, "ferry_run: summary:")) << out0;
  EXPECT_TRUE(absl::StrContains(out0, "all 4 workers finished")) << out0;
}

TEST(FailurePolicy, BadPolicyFlagsAreRefused) {
  struct Case {
    std::vector<std::string> args;
    std::string says;
  } cases[] = {
      {{"--elastic_ranks=1-x", "--", "/bin/true"}, "is not a rank or a range"},
      {{"--elastic_ranks=3-1", "--", "/bin/true"}, "is not a rank or a range"},
      {{"--elastic_ranks=1-2", "--restart_ranks=2", "--rank_restarts=1", "--",
        "/bin/true"},
       "rank 2 is in both"},
      {{"--rank_restarts=1", "--", "/bin/true"}, "needs --restart_ranks"},
      {{"--restart-ranks=0", "--", "/bin/true"}, "needs --rank_restarts"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> argv = {RunfilePath("tools/launcher/ferry_run")};
    argv.insert(argv.end(), c.args.begin(), c.args.end());
    auto [code, out] = RunCommand(argv, {}, absl::Seconds(20));
    EXPECT_EQ(code, 2) << out;
    EXPECT_TRUE(absl::StrContains(out, c.says)) << out;
  }
}

}  // namespace
}  // namespace ferry
