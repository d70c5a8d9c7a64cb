// A Ferry job for the multi-host tests: RPC, a Gloo all-reduce and the store
// across workers, started by ferry_run, mpirun or a test directly.
//
//   job_main                 batch: env:// for RPC (InitRpc) and c10d
//                            (InitProcessGroup), a ring of RPCs, an
//                            all-reduce checked against n(n+1)/2, a store
//                            round (rank 0 sets a key every rank reads), a
//                            graceful shutdown; prints "rank R: ..." lines.
//   job_main --interactive   RPC only; reads commands from stdin, one a line:
//                              call <worker> <timeout_ms>        echo call
//                              block <worker> <timeout_ms>       call a
//                                handler that blocks (<= 60 s) until killed
//                              wait <key> <timeout_ms>           store wait
//                                (on its own TCPStore client)
//                              allreduce - <timeout_ms>          Gloo
//                                all-reduce (needs --with_c10d)
//                              quit                              exit 0
//                            and answers each with one line
//                              result <worker|key> OK|<code> <elapsed_ms> <msg>
//
// --die_rank: that rank SIGKILLs itself after the RPC ring (once the rank
// calling it has its answer, through the store), while the others enter the
// all-reduce (a worker killed mid-job).
// Flags: --fail_rank / --fail_generation make that rank exit 3
// in that FERRY_RUN_GENERATION, before joining (ferry_run tests);
// --c10d_master_port: where c10d's store is when no launcher serves the
// store (mpirun: rank 0 hosts two stores, as a PyTorch job calling init_rpc
// and init_process_group with two ports does).
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "ferry/c10d/backend.h"
#include "ferry/c10d/init.h"
#include "ferry/common/status.h"
#include "ferry/rpc/grpc/init.h"
#include "ferry/store/init_method.h"
#include "ferry/store/tcp_store.h"
#include "ferry/tensor/tensor.h"

ABSL_FLAG(bool, interactive, false, "read commands from stdin (see above)");
ABSL_FLAG(int, fail_rank, -1, "this rank exits 3 after joining");
ABSL_FLAG(int, fail_generation, 0, "... in this FERRY_RUN_GENERATION");
ABSL_FLAG(int, die_rank, -1, "this rank SIGKILLs itself mid-job");
ABSL_FLAG(bool, with_c10d, false, "--interactive: also form a c10d group");
ABSL_FLAG(int, c10d_master_port, 0,
          "c10d store port without a launcher store (0: MASTER_PORT + 1)");
ABSL_FLAG(int, rpc_timeout_ms, 20000, "default RPC timeout");

namespace ferry {
namespace {

using rpc::Agent;

int EnvInt(const char* name, int fallback) {
  std::optional<std::string> v = GetEnv(name);
  int out = fallback;
  if (v.has_value() && !absl::SimpleAtoi(*v, &out)) return fallback;
  return out;
}

std::shared_ptr<rpc::FunctionRegistry> MakeRegistry(const std::string& me) {
  auto registry = std::make_shared<rpc::FunctionRegistry>();
  registry
      ->Register("echo",
                 [me](std::string s) { return absl::StrCat(me, ": ", s); })
      .IgnoreError();
  registry
      ->Register("block",
                 [me](int64_t) {
                   // Tells the test the call is in flight; it then kills us.
                   std::printf("%s: blocking\n", me.c_str());
                   std::fflush(stdout);
                   std::this_thread::sleep_for(std::chrono::seconds(60));
                   return int64_t{0};
                 })
      .IgnoreError();
  return registry;
}

absl::StatusOr<std::unique_ptr<Agent>> StartRpc(const std::string& me) {
  rpc::GrpcAgentOptions options;
  options.rpc_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_rpc_timeout_ms));
  options.join_timeout = absl::Seconds(60);
  ASSIGN_OR_RETURN(
      std::unique_ptr<rpc::GrpcAgent> agent,
      rpc::InitRpc(me, "env://", -1, -1, options, MakeRegistry(me)));
  return std::unique_ptr<Agent>(std::move(agent));
}

// The c10d group: through the launcher's store when one serves it, else its
// own TCPStore at MASTER_PORT + offset.
absl::StatusOr<std::shared_ptr<c10d::ProcessGroup>> StartC10d() {
  c10d::InitProcessGroupOptions o;
  o.init_method = "env://";
  o.group.timeout = absl::Seconds(60);
  if (GetEnv("FERRY_USE_AGENT_STORE") == "1") {
    return c10d::InitProcessGroup(o);
  }
  int port = absl::GetFlag(FLAGS_c10d_master_port);
  if (port == 0) port = EnvInt("MASTER_PORT", 0) + 1;
  return c10d::InitProcessGroup(
      o, [port](absl::string_view name) -> std::optional<std::string> {
        if (name == "MASTER_PORT") return std::to_string(port);
        return GetEnv(name);
      });
}

// A client of the job's store (MASTER_ADDR:MASTER_PORT), in this attempt's
// namespace under ferry_run.
absl::StatusOr<std::unique_ptr<Store>> ConnectStore() {
  TcpStoreOptions so;
  so.host = GetEnv("MASTER_ADDR").value_or("127.0.0.1");
  so.port = EnvInt("MASTER_PORT", 0);
  so.timeout = absl::Seconds(30);
  ASSIGN_OR_RETURN(std::unique_ptr<TcpStore> raw, TcpStore::Create(so));
  return ScopeToLauncherGeneration(std::move(raw));
}

absl::Status Batch(Agent& agent, int rank) {
  const int world = agent.world_size();
  const std::string me = agent.self().name;
  // RPC ring.
  const int next = (rank + 1) % world;
  ASSIGN_OR_RETURN(
      std::string reply,
      agent.rpc_sync<std::string>(next, "echo", absl::StrCat("hi from ", me)));
  std::printf("rank %d: rpc ok: %s\n", rank, reply.c_str());
  const int die_rank = absl::GetFlag(FLAGS_die_rank);
  if (next == die_rank) {
    // Tells the dying rank its call was answered (else this rank could fail
    // first, on that call, and be the failure the launcher names).
    ASSIGN_OR_RETURN(std::unique_ptr<Store> store, ConnectStore());
    RETURN_IF_ERROR(store->Set("job/answered_by_die_rank", "1"));
  }
  if (rank == die_rank) {
    ASSIGN_OR_RETURN(std::unique_ptr<Store> store, ConnectStore());
    RETURN_IF_ERROR(
        store->Wait({"job/answered_by_die_rank"}, absl::Seconds(20)));
    std::printf("rank %d: killing itself\n", rank);
    std::fflush(stdout);
    raise(SIGKILL);
  }
  // All-reduce.
  ASSIGN_OR_RETURN(std::shared_ptr<c10d::ProcessGroup> pg, StartC10d());
  Tensor t = full({1024}, rank + 1.0);
  RETURN_IF_ERROR(pg->Allreduce(t)->Wait(absl::Seconds(60)));
  const float want = world * (world + 1) / 2.0f;
  const float got = t.to_vector<float>().back();
  if (got != want) {
    return absl::InternalError(
        absl::StrCat("allreduce: got ", got, ", want ", want));
  }
  // Which backend carried it: "shm" on one host, "gloo" across hosts.
  ASSIGN_OR_RETURN(c10d::Backend * backend, pg->GetBackend(DeviceType::kCPU));
  std::printf("rank %d: allreduce ok sum=%g backend=%s\n", rank, got,
              backend->name().c_str());
  // Store round trip, on a client of its own, across hosts.
  ASSIGN_OR_RETURN(std::unique_ptr<Store> store, ConnectStore());
  if (rank == 0) RETURN_IF_ERROR(store->Set("job/key", "from rank 0"));
  ASSIGN_OR_RETURN(std::string value, store->Get("job/key"));
  std::printf("rank %d: store ok: %s\n", rank, value.c_str());
  return absl::OkStatus();
}

// One command of --interactive; false on "quit" or EOF.
bool Command(Agent& agent, c10d::ProcessGroup* pg, const std::string& line) {
  std::vector<std::string> w = absl::StrSplit(line, ' ', absl::SkipEmpty());
  if (w.empty() || w[0] == "quit") return false;
  int timeout_ms = 0;
  if (w.size() != 3 || !absl::SimpleAtoi(w[2], &timeout_ms)) {
    std::printf("error: bad command '%s'\n", line.c_str());
    return true;
  }
  const absl::Duration timeout = absl::Milliseconds(timeout_ms);
  const absl::Time start = absl::Now();
  absl::Status s;
  if (w[0] == "allreduce") {
    Tensor t = full({1024}, 1.0);
    s = pg == nullptr ? absl::FailedPreconditionError("no c10d group")
                      : pg->Allreduce(t)->Wait(timeout);
  } else if (w[0] == "wait") {
    absl::StatusOr<std::unique_ptr<Store>> store = ConnectStore();
    s = store.ok() ? (*store)->Wait({w[1]}, timeout) : store.status();
  } else if (w[0] == "block") {
    s = agent.rpc_sync_for<int64_t>(timeout, w[1], "block", int64_t{0})
            .status();
  } else {
    s = agent.rpc_sync_for<std::string>(timeout, w[1], "echo", line).status();
  }
  const int64_t ms = absl::ToInt64Milliseconds(absl::Now() - start);
  std::printf("result %s %s %lld %s\n", w[1].c_str(),
              s.ok() ? "OK" : absl::StatusCodeToString(s.code()).c_str(),
              static_cast<long long>(ms), std::string(s.message()).c_str());
  return true;
}

absl::Status Run() {
  const int rank =
      EnvInt("RANK", EnvInt("OMPI_COMM_WORLD_RANK", EnvInt("SLURM_PROCID", 0)));
  const std::string me = absl::StrCat("worker", rank);
  // Before joining: the others wait for this rank at the rendezvous, so the
  // failure is the first one any launcher sees.
  if (rank == absl::GetFlag(FLAGS_fail_rank) &&
      EnvInt("FERRY_RUN_GENERATION", 0) ==
          absl::GetFlag(FLAGS_fail_generation)) {
    std::printf("rank %d: failing on purpose\n", rank);
    std::fflush(stdout);
    std::_Exit(3);
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Agent> agent, StartRpc(me));
  std::printf("rank %d: joined %d workers as %s at %s\n", rank,
              agent->world_size(), me.c_str(), agent->self().address.c_str());
  if (absl::GetFlag(FLAGS_interactive)) {
    std::shared_ptr<c10d::ProcessGroup> pg;
    if (absl::GetFlag(FLAGS_with_c10d)) {
      ASSIGN_OR_RETURN(pg, StartC10d());
    }
    std::printf("ready\n");
    std::fflush(stdout);
    for (std::string line; std::getline(std::cin, line);) {
      if (!Command(*agent, pg.get(), line)) break;
      std::fflush(stdout);
    }
    // Peers may be dead: no shutdown barrier.
    return agent->Shutdown(/*graceful=*/false);
  }
  absl::Status job = Batch(*agent, rank);
  // Shut down with everyone even after an error, so no peer is left waiting.
  absl::Status down = agent->Shutdown(/*graceful=*/job.ok());
  RETURN_IF_ERROR(job);
  RETURN_IF_ERROR(down);
  std::printf("rank %d: done\n", rank);
  return absl::OkStatus();
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  absl::ParseCommandLine(argc, argv);
  absl::Status s = ferry::Run();
  if (!s.ok()) {
    std::fprintf(stderr, "error: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
