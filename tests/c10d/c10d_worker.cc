// One rank of a multi-process c10d job (driven by multiprocess_test.cc).
//
//   c10d_worker --rank=R --world_size=N (--init_method=URL | --tcp_port=P)
//               [--timeout_ms=T] [--mode=collectives|expect_deadline]
//   c10d_worker --init_method=env://     (rank and size from RANK /
//                                         WORLD_SIZE, as under ferry_run)
//   [--backend=NAME]                      (default: the group's default)
//
// collectives: runs every collective on the gloo backend, checks results
// exactly, exits 0 on success and 1 (printing the failure) otherwise.
// expect_deadline: joins a group some rank never joins; exits 0 if group
// creation fails with DeadlineExceeded in time, 1 otherwise.
// shm_kill (--shm_prefix=/name, --shm_op=allreduce|broadcast,
// [--shm_broadcast=stream|rounds]): a group on the "shm" backend runs 4 MiB
// all-reduces, or 16 MiB broadcasts (larger than a slot: streamed or in
// rounds) from the last rank; the last rank SIGKILLs itself right after issuing
// its fourth (while its backend's worker runs it). The others exit 0 if a call
// fails within the timeout (plus 5 s), 1 otherwise.
#include <csignal>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "ferry/c10d/init.h"
#include "ferry/store/tcp_store.h"

namespace ferry {
namespace c10d {
namespace {

#define CHECK_OR_FAIL(cond, msg)                                             \
  do {                                                                       \
    if (!(cond)) {                                                           \
      std::fprintf(stderr, "rank %d: %s:%d: %s\n", rank, __FILE__, __LINE__, \
                   std::string(msg).c_str());                                \
      return 1;                                                              \
    }                                                                        \
  } while (0)

#define OK_OR_FAIL(expr)                                              \
  do {                                                                \
    absl::Status s_ = (expr);                                         \
    CHECK_OR_FAIL(s_.ok(), absl::StrCat(#expr, ": ", s_.ToString())); \
  } while (0)

int RunCollectives(ProcessGroup& pg) {
  const int rank = pg.rank();
  const int n = pg.size();
  const absl::Duration t = absl::Seconds(60);
  // Allreduce of several sizes and dtypes.
  for (int64_t numel : {int64_t{1}, int64_t{1000}, int64_t{1} << 20}) {
    Tensor f = full({numel}, rank + 1.0);
    OK_OR_FAIL(pg.Allreduce(f)->Wait(t));
    std::vector<float> v = f.to_vector<float>();
    CHECK_OR_FAIL(v.front() == n * (n + 1) / 2 && v.back() == v.front(),
                  absl::StrCat("allreduce float32 x ", numel, " got ", v[0]));
  }
  Tensor i64 = full({17}, rank, DType::kInt64);
  OK_OR_FAIL(pg.Allreduce(i64, {.op = ReduceOp::kMax})->Wait(t));
  CHECK_OR_FAIL(i64.to_vector<int64_t>()[16] == n - 1, "allreduce MAX int64");
  // Broadcast from the last rank.
  Tensor b = full({33}, rank, DType::kInt32);
  OK_OR_FAIL(pg.Broadcast(b, {.root = n - 1})->Wait(t));
  CHECK_OR_FAIL(b.to_vector<int32_t>()[32] == n - 1, "broadcast");
  // Allgather.
  std::vector<Tensor> outs;
  for (int r = 0; r < n; ++r) outs.push_back(zeros({5}, DType::kFloat64));
  OK_OR_FAIL(
      pg.Allgather(outs, full({5}, rank * 2.0, DType::kFloat64))->Wait(t));
  for (int r = 0; r < n; ++r) {
    CHECK_OR_FAIL(outs[r].to_vector<double>()[4] == r * 2.0, "allgather");
  }
  // ReduceScatter and Alltoall.
  std::vector<Tensor> ins;
  for (int r = 0; r < n; ++r) ins.push_back(full({3}, r + rank));
  Tensor rs = zeros({3});
  OK_OR_FAIL(pg.ReduceScatter(rs, ins)->Wait(t));
  CHECK_OR_FAIL(rs.to_vector<float>()[0] == n * rank + n * (n - 1) / 2,
                "reduce_scatter");
  std::vector<Tensor> a_in, a_out;
  for (int r = 0; r < n; ++r) {
    a_in.push_back(full({4}, rank * 100 + r, DType::kInt32));
    a_out.push_back(zeros({4}, DType::kInt32));
  }
  OK_OR_FAIL(pg.Alltoall(a_out, a_in)->Wait(t));
  for (int r = 0; r < n; ++r) {
    CHECK_OR_FAIL(a_out[r].to_vector<int32_t>()[3] == r * 100 + rank,
                  "alltoall");
  }
  // Point to point around the ring.
  Tensor got = zeros({8}, DType::kUInt8);
  auto recv = pg.Recv(got, (rank + n - 1) % n, {.tag = 5});
  auto send =
      pg.Send(full({8}, rank, DType::kUInt8), (rank + 1) % n, {.tag = 5});
  OK_OR_FAIL(send->Wait(t));
  OK_OR_FAIL(recv->Wait(t));
  CHECK_OR_FAIL(got.to_vector<uint8_t>()[0] == (rank + n - 1) % n, "recv");
  // Mismatched shapes: every rank gets InvalidArgument, nobody hangs.
  absl::Status mismatch = pg.Allreduce(ones({rank == 0 ? 2 : 3}))->Wait(t);
  CHECK_OR_FAIL(absl::IsInvalidArgument(mismatch),
                absl::StrCat("mismatch gave ", mismatch.ToString()));
  // A subgroup of the even ranks.
  std::vector<int> evens;
  for (int r = 0; r < n; r += 2) evens.push_back(r);
  auto sub = pg.NewGroup(evens);
  OK_OR_FAIL(sub.status());
  if (rank % 2 == 0) {
    CHECK_OR_FAIL(*sub != nullptr, "member got no subgroup");
    Tensor s = full({2}, rank);
    OK_OR_FAIL((*sub)->Allreduce(s)->Wait(t));
    int want = 0;
    for (int r : evens) want += r;
    CHECK_OR_FAIL(s.to_vector<float>()[0] == want, "subgroup allreduce");
  } else {
    CHECK_OR_FAIL(*sub == nullptr, "non-member got a subgroup");
  }
  OK_OR_FAIL(pg.Barrier()->Wait(t));
  return 0;
}

int RunShmKill(ProcessGroup& pg, absl::Duration timeout,
               const std::string& op) {
  const int rank = pg.rank();
  const bool victim = rank == pg.size() - 1;
  const bool broadcast = op == "broadcast";
  Tensor t = full({broadcast ? int64_t{4} << 20 : int64_t{1} << 20}, 1.0);
  for (int i = 0; i < 1000; ++i) {
    std::shared_ptr<Work> w =
        broadcast ? pg.Broadcast(t, {.root = pg.size() - 1}) : pg.Allreduce(t);
    if (victim && i == 3) std::raise(SIGKILL);
    absl::Time start = absl::Now();
    absl::Status s = w->Wait(timeout + absl::Seconds(30));
    absl::Duration took = absl::Now() - start;
    if (s.ok()) continue;
    std::fprintf(stderr, "rank %d: %s %d failed after %s: %s\n", rank,
                 op.c_str(), i, absl::FormatDuration(took).c_str(),
                 s.ToString().c_str());
    return !victim && took < timeout + absl::Seconds(5) ? 0 : 1;
  }
  std::fprintf(stderr, "rank %d: every %s succeeded\n", rank, op.c_str());
  return 1;
}

int Main(int argc, char** argv) {
  std::map<std::string, std::string> flags;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    size_t eq = a.find('=');
    if (!absl::StartsWith(a, "--") || eq == std::string::npos) {
      std::fprintf(stderr, "bad argument %s\n", a.c_str());
      return 2;
    }
    flags[a.substr(2, eq - 2)] = a.substr(eq + 1);
  }
  int rank = -1, world = -1, port = 0, timeout_ms = 60000;
  const bool from_env = flags["init_method"] == "env://";
  if (!from_env && (!absl::SimpleAtoi(flags["rank"], &rank) ||
                    !absl::SimpleAtoi(flags["world_size"], &world))) {
    std::fprintf(stderr, "--rank and --world_size are required\n");
    return 2;
  }
  if (flags.count("timeout_ms")) {
    if (!absl::SimpleAtoi(flags["timeout_ms"], &timeout_ms)) return 2;
  }
  InitProcessGroupOptions o;
  if (flags.count("backend")) o.group.backend = flags["backend"];
  if (flags["mode"] == "shm_kill") {
    o.group.backend = "shm";
    o.group.backend_options["shm_name_prefix"] = flags["shm_prefix"];
    if (flags.count("shm_broadcast")) {
      o.group.backend_options["shm_broadcast"] = flags["shm_broadcast"];
    }
  }
  o.rank = rank;
  o.world_size = world;
  o.group.timeout = absl::Milliseconds(timeout_ms);
  if (flags.count("tcp_port")) {
    if (!absl::SimpleAtoi(flags["tcp_port"], &port)) return 2;
    TcpStoreOptions so;
    so.host = "127.0.0.1";
    so.port = port;
    so.timeout = absl::Milliseconds(timeout_ms);
    auto store = TcpStore::Create(so);
    if (!store.ok()) {
      std::fprintf(stderr, "rank %d: %s\n", rank,
                   store.status().ToString().c_str());
      return 1;
    }
    o.store = std::shared_ptr<Store>(std::move(*store));
  } else {
    o.init_method = flags["init_method"];
  }
  absl::Time start = absl::Now();
  auto pg = InitProcessGroup(o);
  if (flags["mode"] == "expect_deadline") {
    absl::Duration took = absl::Now() - start;
    if (absl::IsDeadlineExceeded(pg.status()) &&
        took < absl::Milliseconds(timeout_ms) + absl::Seconds(10)) {
      return 0;
    }
    std::fprintf(
        stderr, "rank %d: expected DeadlineExceeded, got %s after %s\n", rank,
        pg.status().ToString().c_str(), absl::FormatDuration(took).c_str());
    return 1;
  }
  if (!pg.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, pg.status().ToString().c_str());
    return 1;
  }
  if (flags["mode"] == "shm_kill") {
    const std::string op =
        flags.count("shm_op") ? flags["shm_op"] : std::string("allreduce");
    if (op != "allreduce" && op != "broadcast") {
      std::fprintf(stderr, "bad --shm_op=%s\n", op.c_str());
      return 2;
    }
    return RunShmKill(**pg, absl::Milliseconds(timeout_ms), op);
  }
  return RunCollectives(**pg);
}

}  // namespace
}  // namespace c10d
}  // namespace ferry

int main(int argc, char** argv) { return ferry::c10d::Main(argc, argv); }
