// One rank of the c10d benchmark (bench/c10d/run.sh starts N of them).
//
//   c10d_bench --rank=R --world_size=N --init=file:///tmp/x
//              [--check_args=true] [--impl=ferry-gloo] [--shm=false]
//              [--backend=mpi]   (under mpirun: rank and size from
//                                 OMPI_COMM_WORLD_*)
//
// --shm=false keeps the group on Gloo alone; --shm=true (what the default
// registry does for ranks on one host) puts the shared-memory backend in
// front of it, and rows are then named algorithm "shm" (busbw computed with
// the ring factors, for comparison with the other rows). --backend=mpi rows
// are named "mpi" (Open MPI picks its algorithm per size; busbw uses the
// ring factors too).
//
// Rank 0 prints one JSON line per figure: allreduce (SUM, float32) for every
// size in --allreduce_sizes, broadcast and allgather for --other_sizes. Each
// figure: 2 warm-up calls, then `iters` calls each waited on (like
// torch.distributed's synchronous calls), timed on rank 0 between barriers.
// Conventions (nccl-tests'): size = bytes of the tensor each rank passes in;
// algbw = size / time (allgather: N * size / time). busbw = the bytes each
// rank moves for the algorithm that ran, over time: "ring" (Gloo's ring
// allreduce: algbw * 2(N-1)/N; allgather: algbw * (N-1)/N; broadcast:
// algbw) or "direct" (Ferry's small Allreduce/Broadcast that completes in
// the argument exchange, where every rank sends its whole buffer to every
// other: size * (N-1) / time). Each line names the algorithm. Timed here in
// C++; PyTorch's figures come from torch_bench.py, timed in Python.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "c10d/gloo/gloo_backend.h"
#include "c10d/init.h"
#include "c10d/shm/shm_backend.h"

namespace ferry {
namespace c10d {
namespace {

int Iters(int64_t bytes) {
  int64_t it = (int64_t{256} << 20) / std::max<int64_t>(bytes, 1);
  return static_cast<int>(std::clamp<int64_t>(it, 5, 200));
}

std::vector<int64_t> ParseSizes(const std::string& s) {
  std::vector<int64_t> out;
  for (absl::string_view p : absl::StrSplit(s, ',', absl::SkipEmpty())) {
    int64_t v;
    if (absl::SimpleAtoi(p, &v)) out.push_back(v);
  }
  return out;
}

int Main(int argc, char** argv) {
  std::map<std::string, std::string> flags = {
      {"check_args", "true"},
      {"impl", "ferry-gloo"},
      {"shm", "false"},
      {"allreduce_sizes",
       "4096,16384,65536,262144,1048576,4194304,16777216,67108864"},
      {"other_sizes", "1048576,16777216"}};
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
  if (flags.count("backend")) o.group.backend = flags["backend"];
  auto pg_or = InitProcessGroup(o);
  if (!pg_or.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank,
                 pg_or.status().ToString().c_str());
    return 1;
  }
  ProcessGroup& pg = **pg_or;
  // Which algorithm the gloo backend picks for a size (see InlineBytes()).
  const bool check_args = flags["check_args"] != "false";
  size_t inline_bytes = 0;
  bool shm = false, mpi = false;
  if (auto backend = pg.GetBackend(DeviceType::kCPU); backend.ok()) {
    mpi = (*backend)->name() == "mpi";
    if (auto* gloo = dynamic_cast<GlooBackend*>(*backend)) {
      inline_bytes = gloo->InlineBytes();
    }
    shm = dynamic_cast<ShmBackend*>(*backend) != nullptr;
  }
  const int n = world;
  bool failed = false;
  auto run = [&](const std::string& op, int64_t bytes,
                 const std::function<std::shared_ptr<Work>()>& call) {
    for (int i = 0; i < 2; ++i) {
      absl::Status s = call()->Wait();
      if (!s.ok()) {
        std::fprintf(stderr, "rank %d %s: %s\n", rank, op.c_str(),
                     s.ToString().c_str());
        failed = true;
        return;
      }
    }
    int iters = Iters(bytes);
    if (!pg.Barrier()->Wait().ok()) failed = true;
    absl::Time start = absl::Now();
    for (int i = 0; i < iters; ++i) {
      if (!call()->Wait().ok()) failed = true;
    }
    absl::Duration took = (absl::Now() - start) / iters;
    if (!pg.Barrier()->Wait().ok()) failed = true;
    double sec = absl::ToDoubleSeconds(took);
    double algbw = (op == "allgather" ? n * bytes : bytes) / sec / 1e9;
    const bool direct = !shm && !mpi && check_args && op != "allgather" &&
                        static_cast<size_t>(bytes) <= inline_bytes;
    double factor = direct              ? double(n - 1)
                    : op == "allreduce" ? 2.0 * (n - 1) / n
                    : op == "allgather" ? double(n - 1) / n
                                        : 1.0;
    if (rank == 0) {
      std::printf(
          "{\"bench\":\"c10d\",\"impl\":\"%s\",\"op\":\"%s\","
          "\"algorithm\":\"%s\",\"ranks\":%d,"
          "\"bytes\":%lld,\"iters\":%d,\"time_us\":%.1f,\"algbw_GBps\":%.4f,"
          "\"busbw_GBps\":%.4f}\n",
          flags["impl"].c_str(), op.c_str(),
          shm      ? "shm"
          : mpi    ? "mpi"
          : direct ? "direct"
                   : "ring",
          n, static_cast<long long>(bytes), iters, sec * 1e6, algbw,
          algbw * factor);
      std::fflush(stdout);
    }
  };
  for (int64_t bytes : ParseSizes(flags["allreduce_sizes"])) {
    Tensor t = full({bytes / 4}, 1.0);
    run("allreduce", bytes, [&] { return pg.Allreduce(t); });
  }
  for (int64_t bytes : ParseSizes(flags["other_sizes"])) {
    Tensor t = full({bytes / 4}, 1.0);
    run("broadcast", bytes, [&] { return pg.Broadcast(t, {.root = 0}); });
    std::vector<Tensor> outs;
    for (int r = 0; r < n; ++r) outs.push_back(zeros({bytes / 4}));
    run("allgather", bytes, [&] { return pg.Allgather(outs, t); });
  }
  return failed ? 1 : 0;
}

}  // namespace
}  // namespace c10d
}  // namespace ferry

int main(int argc, char** argv) { return ferry::c10d::Main(argc, argv); }
