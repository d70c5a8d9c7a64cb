// One rank of the c10d benchmark (bench/c10d/run.sh starts N of them).
//
//   c10d_bench --rank=R --world_size=N --init=file:///tmp/x
//              [--ops=allreduce,broadcast,allgather,reducescatter,alltoall]
//              [--sizes=4096,...,67108864] [--check_args=true]
//              [--impl=ferry-gloo] [--shm=false] [--shm_slot_bytes=B]
//              [--shm_broadcast=auto|stream|rounds]
//              [--shm_streaming_store_bytes=B] [--shm_chunk_bytes=B]
//              [--shm_threads=T] [--budget_s=1] [--settle_s=1]
//              [--backend=mpi]   (under mpirun: rank and size from
//                                 OMPI_COMM_WORLD_*)
//
// --shm=false keeps the group on Gloo alone; --shm=true (what the default
// registry does for ranks on one host) puts the shared-memory backend in
// front of it: its rows are named algorithm "shm" (broadcasts larger than a
// slot "shm-stream" or "shm-rounds", whichever the backend runs; the
// --shm_* flags are its options). --backend=mpi rows are named "mpi" (Open
// MPI picks its algorithm per size).
//
// Rank 0 prints one JSON line per (op, size), float32 (allreduce and
// reducescatter with SUM). Calls: allreduce = Allreduce(t); broadcast =
// Broadcast(t, root 0); allgather = Allgather(list of N outputs, t);
// reducescatter = ReduceScatterTensor(t / N, t); alltoall =
// AlltoallSingle(out, t) with equal splits. Each figure: warm-up calls, then
// `iters` calls each waited on (like torch.distributed's synchronous calls),
// timed on rank 0 between barriers; fewer iterations for big sizes (Iters)
// and for slow calls (about --budget_s=1 seconds of timed calls per figure).
// Beside the time, cpu_us, sleeps and preempted: CPU time (user + system)
// and voluntary / involuntary context switches per call, summed over the
// ranks' processes (on a busy host they say more than the wall time does:
// sleeps count the waits an algorithm makes, preempted the host's load).
//
// Conventions (nccl-tests'): size = bytes of the tensor each rank passes in
// (allgather: its input; reducescatter and alltoall: the whole input, N
// chunks). algbw = size / time (allgather: N * size / time). busbw =
// algbw * factor, with nccl-tests' factor for the op: allreduce 2(N-1)/N,
// broadcast 1, allgather / reducescatter / alltoall (N-1)/N. That is the
// data each rank must send for ring (allreduce, allgather, reducescatter)
// and pairwise (alltoall) algorithms; for the others it is a normalization,
// so each line names the algorithm: "ring" (Gloo's), "ferry-ring" (Ferry's
// ring, c10d/gloo/ring.h: checked all-reduce, reduce-scatter, all-gather),
// "chain" (Ferry's checked pipelined broadcast), "tree" (Gloo's
// binomial-tree broadcast), "pairwise" (Gloo's alltoall) and
// "ferry-pairwise" (Ferry's): every rank sends each peer its chunk directly,
// "direct" (Ferry's small call that completes in the argument exchange:
// all-reduce and broadcast with every rank sending its whole buffer to every
// other, busbw = size * (N-1) / time instead; all-gather and reduce-scatter
// sending each peer what it needs, the ring's volume), "shm", "mpi". Timed here
// in C++; PyTorch's figures come from torch_bench.py, timed in Python.
#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "ferry/c10d/gloo/gloo_backend.h"
#include "ferry/c10d/init.h"
#include "ferry/c10d/shm/shm_backend.h"

namespace ferry {
namespace c10d {
namespace {

// Calls timed per figure: about 256 MiB moved per rank in all, 3 to 200
// (fewer when they would take longer than --budget_s, see AgreedIters).
int Iters(int64_t volume) {
  int64_t it = (int64_t{256} << 20) / std::max<int64_t>(volume, 1);
  return static_cast<int>(std::clamp<int64_t>(it, 3, 200));
}

std::vector<int64_t> ParseSizes(const std::string& s) {
  std::vector<int64_t> out;
  for (absl::string_view p : absl::StrSplit(s, ',', absl::SkipEmpty())) {
    int64_t v;
    if (absl::SimpleAtoi(p, &v)) out.push_back(v);
  }
  return out;
}

// Timed calls: at most `max_iters`, fewer when the slowest rank's last
// warm-up call says they would take more than `budget_sec` (at least 2: a
// first call can be slow for reasons of its own).
// Every rank must make the same count: they agree on the slowest warm-up
// through an allreduce (MAX).
int AgreedIters(ProcessGroup& pg, double warm_sec, double budget_sec,
                int max_iters) {
  Tensor slowest = full({1}, warm_sec, DType::kFloat64);
  if (!pg.Allreduce(slowest, {.op = ReduceOp::kMax})->Wait().ok()) return 1;
  const double per_call = std::max(slowest.to_vector<double>()[0], 1e-9);
  return static_cast<int>(
      std::clamp<double>(budget_sec / per_call, 2, max_iters));
}

// This process's CPU time (user + system, every thread) and context
// switches so far: voluntary (a thread slept) and involuntary (preempted).
struct Usage {
  double cpu_us;
  double sleeps;
  double preempted;
};
Usage SelfUsage() {
  struct rusage u {};
  ::getrusage(RUSAGE_SELF, &u);
  auto us = [](const struct timeval& t) { return t.tv_sec * 1e6 + t.tv_usec; };
  return {us(u.ru_utime) + us(u.ru_stime), static_cast<double>(u.ru_nvcsw),
          static_cast<double>(u.ru_nivcsw)};
}

// Which algorithm ran, and nccl-tests' busbw factor for it.
struct Algorithm {
  std::string name;
  double factor;
};

int Main(int argc, char** argv) {
  std::map<std::string, std::string> flags = {
      {"check_args", "true"},
      {"impl", "ferry-gloo"},
      {"budget_s", "1"},
      {"settle_s", "1"},
      {"shm", "false"},
      {"ops", "allreduce,broadcast,allgather,reducescatter,alltoall"},
      {"sizes", "4096,16384,65536,262144,1048576,4194304,16777216,67108864"}};
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    size_t eq = a.find('=');
    if (a.rfind("--", 0) != 0 || eq == std::string::npos) {
      std::fprintf(stderr, "bad argument %s\n", a.c_str());
      return 2;
    }
    flags[a.substr(2, eq - 2)] = a.substr(eq + 1);
  }
  // Under mpirun (--backend=mpi) the rank and size come from Open MPI.
  for (const auto& [flag, env] :
       {std::pair{"rank", "OMPI_COMM_WORLD_RANK"},
        std::pair{"world_size", "OMPI_COMM_WORLD_SIZE"}}) {
    const char* v = std::getenv(env);
    if (!flags.count(flag) && v != nullptr) flags[flag] = v;
  }
  int rank, world;
  if (!absl::SimpleAtoi(flags["rank"], &rank) ||
      !absl::SimpleAtoi(flags["world_size"], &world) || flags["init"].empty()) {
    std::fprintf(stderr, "need --rank, --world_size, --init\n");
    return 2;
  }
  InitProcessGroupOptions o;
  o.init_method = flags["init"];
  o.rank = rank;
  o.world_size = world;
  o.group.timeout = absl::Minutes(5);
  o.group.backend_options["check_args"] = flags["check_args"];
  o.group.backend_options["shm"] = flags["shm"];
  // Every --shm_* flag (shm_slot_bytes, shm_broadcast, ...) is a shm option.
  for (const auto& [k, v] : flags) {
    if (k.rfind("shm_", 0) == 0) o.group.backend_options[k] = v;
  }
  if (flags.count("backend")) o.group.backend = flags["backend"];
  auto pg_or = InitProcessGroup(o);
  if (!pg_or.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank,
                 pg_or.status().ToString().c_str());
    return 1;
  }
  ProcessGroup& pg = **pg_or;
  // Which algorithm the backend picks for an op and size (for gloo see
  // InlineBytes()).
  const bool check_args = flags["check_args"] != "false";
  size_t inline_bytes = 0;
  bool mpi = false;
  const ShmBackend* shm_backend = nullptr;
  if (auto backend = pg.GetBackend(DeviceType::kCPU); backend.ok()) {
    mpi = (*backend)->name() == "mpi";
    if (auto* gloo = dynamic_cast<GlooBackend*>(*backend)) {
      inline_bytes = gloo->InlineBytes();
    }
    shm_backend = dynamic_cast<ShmBackend*>(*backend);
  }
  const int n = world;
  auto algorithm = [&](const std::string& op, int64_t bytes) -> Algorithm {
    const double ring = double(n - 1) / n;
    const double factor = op == "allreduce"   ? 2 * ring
                          : op == "broadcast" ? 1.0
                                              : ring;
    if (mpi) return {"mpi", factor};
    if (shm_backend != nullptr) {
      // Broadcasts larger than a slot stream or run in rounds.
      if (op == "broadcast" &&
          static_cast<size_t>(bytes) > shm_backend->slot_bytes()) {
        return {shm_backend->streams_broadcasts() ? "shm-stream" : "shm-rounds",
                factor};
      }
      return {"shm", factor};
    }
    // Bytes per rank that ride in the argument exchange: allgather's input,
    // reducescatter's output chunk (each peer gets its own).
    const int64_t per_rank = op == "reducescatter" ? bytes / n : bytes;
    const bool direct_op = op == "allreduce" || op == "broadcast" ||
                           op == "allgather" || op == "reducescatter";
    if (check_args && direct_op &&
        static_cast<size_t>(per_rank) <= inline_bytes) {
      // allgather / reducescatter: the ring's volume, (N-1)/N, moves.
      return {"direct", op == "allgather" || op == "reducescatter"
                            ? factor
                            : double(n - 1)};
    }
    // With the check on, larger all-reduce and broadcast run Ferry's own
    // ring and pipelined chain (c10d/gloo/ring.h), not Gloo's; reduce-scatter,
    // all-gather and all-to-all always run Ferry's (ring.h).
    if (check_args && op == "allreduce") return {"ferry-ring", factor};
    if (check_args && op == "broadcast") return {"chain", factor};
    if (op == "broadcast") return {"tree", factor};
    if (op == "alltoall") return {"ferry-pairwise", factor};
    if (op == "allgather" || op == "reducescatter") {
      return {"ferry-ring", factor};
    }
    return {"ring", factor};
  };
  double budget_sec = 1.0;
  if (!absl::SimpleAtod(flags["budget_s"], &budget_sec) || budget_sec <= 0) {
    budget_sec = 1.0;
  }
  // Before the first figure, about --settle_s seconds of its calls, untimed:
  // right after start a process is not yet in its steady state (lazily
  // started threads, first-touch pages). torch_bench.py does the same.
  // (OpenBLAS's per-core threads spun for longer than this on 16 vCPUs:
  // run_bench.py gives the ranks one OpenBLAS thread, as ferry_run does.)
  double settle_sec = 1;
  if (!absl::SimpleAtod(flags["settle_s"], &settle_sec)) settle_sec = 1;
  bool settled = false;
  bool failed = false;
  auto run = [&](const std::string& op, int64_t bytes,
                 const std::function<std::shared_ptr<Work>()>& call) {
    const int64_t volume = op == "allgather" ? n * bytes : bytes;
    if (!settled && settle_sec > 0) {
      settled = true;
      const absl::Time t0 = absl::Now();
      if (!call()->Wait().ok()) failed = true;
      const int calls = AgreedIters(pg, absl::ToDoubleSeconds(absl::Now() - t0),
                                    settle_sec, 1 << 20);
      for (int i = 0; i < calls; ++i) {
        if (!call()->Wait().ok()) failed = true;
      }
    }
    double warm_sec = 0;
    for (int i = 0; i < (volume >= (int64_t{16} << 20) ? 1 : 2); ++i) {
      const absl::Time t0 = absl::Now();
      absl::Status s = call()->Wait();
      warm_sec = absl::ToDoubleSeconds(absl::Now() - t0);
      if (!s.ok()) {
        std::fprintf(stderr, "rank %d %s: %s\n", rank, op.c_str(),
                     s.ToString().c_str());
        failed = true;
        return;
      }
    }
    const int iters = AgreedIters(pg, warm_sec, budget_sec, Iters(volume));
    if (!pg.Barrier()->Wait().ok()) failed = true;
    const Usage before = SelfUsage();
    absl::Time start = absl::Now();
    for (int i = 0; i < iters; ++i) {
      if (!call()->Wait().ok()) failed = true;
    }
    absl::Duration took = (absl::Now() - start) / iters;
    const Usage after = SelfUsage();
    // CPU time and context switches per call, summed over the ranks: on a
    // shared, loaded host these say more than the wall time does.
    Tensor usage =
        from_vector<double>({(after.cpu_us - before.cpu_us) / iters,
                             (after.sleeps - before.sleeps) / iters,
                             (after.preempted - before.preempted) / iters},
                            {3});
    if (!pg.Allreduce(usage)->Wait().ok()) failed = true;
    const std::vector<double> per_call = usage.to_vector<double>();
    if (!pg.Barrier()->Wait().ok()) failed = true;
    double sec = absl::ToDoubleSeconds(took);
    double algbw = volume / sec / 1e9;
    const Algorithm alg = algorithm(op, bytes);
    if (rank == 0) {
      std::printf(
          "{\"bench\":\"c10d\",\"impl\":\"%s\",\"op\":\"%s\","
          "\"algorithm\":\"%s\",\"ranks\":%d,"
          "\"bytes\":%lld,\"iters\":%d,\"time_us\":%.1f,\"algbw_GBps\":%.4f,"
          "\"busbw_GBps\":%.4f,\"cpu_us\":%.1f,\"sleeps\":%.1f,"
          "\"preempted\":%.1f}\n",
          flags["impl"].c_str(), op.c_str(), alg.name.c_str(), n,
          static_cast<long long>(bytes), iters, sec * 1e6, algbw,
          algbw * alg.factor, per_call[0], per_call[1], per_call[2]);
      std::fflush(stdout);
    }
  };
  const std::vector<int64_t> sizes = ParseSizes(flags["sizes"]);
  for (absl::string_view op :
       absl::StrSplit(flags["ops"], ',', absl::SkipEmpty())) {
    for (int64_t bytes : sizes) {
      // Whole elements, divisible into N chunks.
      const int64_t numel = std::max<int64_t>(bytes / 4 / n, 1) * n;
      Tensor t = full({numel}, 1.0);
      if (op == "allreduce") {
        run("allreduce", bytes, [&] { return pg.Allreduce(t); });
      } else if (op == "broadcast") {
        run("broadcast", bytes, [&] { return pg.Broadcast(t, {.root = 0}); });
      } else if (op == "allgather") {
        std::vector<Tensor> outs;
        for (int r = 0; r < n; ++r) outs.push_back(zeros({numel}));
        run("allgather", bytes, [&] { return pg.Allgather(outs, t); });
      } else if (op == "reducescatter") {
        Tensor out = zeros({numel / n});
        run("reducescatter", bytes,
            [&] { return pg.ReduceScatterTensor(out, t); });
      } else if (op == "alltoall") {
        Tensor out = zeros({numel});
        run("alltoall", bytes, [&] { return pg.AlltoallSingle(out, t); });
      } else {
        std::fprintf(stderr, "unknown op %s\n", std::string(op).c_str());
        return 2;
      }
    }
  }
  return failed ? 1 : 0;
}

}  // namespace
}  // namespace c10d
}  // namespace ferry

int main(int argc, char** argv) { return ferry::c10d::Main(argc, argv); }
