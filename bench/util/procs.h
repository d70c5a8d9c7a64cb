// Shared by the multi-process benchmarks (bench/rref, bench/dist_autograd):
// fatal-error helpers, a timed latency loop, and a launcher that hosts a
// TcpStore on 127.0.0.1 and starts copies of this program as the other
// ranks. Benchmarks only: errors end the process.
#ifndef FERRY_BENCH_UTIL_PROCS_H_
#define FERRY_BENCH_UTIL_PROCS_H_

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ferry::bench {

[[noreturn]] void Die(const std::string& what);
void OrDie(const absl::Status& s, const std::string& what);
template <typename T>
T OrDie(absl::StatusOr<T> v, const std::string& what) {
  if (!v.ok()) Die(what + ": " + v.status().ToString());
  return *std::move(v);
}

struct Stats {
  double mean = 0, p50 = 0, p99 = 0;
  size_t iters = 0;
};
// Runs `op` 50 times to warm up, then for `seconds` (at most `max_iters`
// times), timing each run in microseconds.
Stats TimeLoop(const std::function<void()>& op, double seconds,
               size_t max_iters = 200000);
// Runs the ops in turn, each for seconds / rounds per round, over `rounds`
// rounds; per op, the round with the lowest p50 (the machine is shared: the
// least disturbed round; every figure gets the same treatment).
std::vector<Stats> InterleavedBest(
    const std::vector<std::function<void()>>& ops, double seconds, int rounds);
// The same over a fixed number of runs, after `warmup` untimed ones.
Stats TimeIters(const std::function<void()>& op, size_t iters,
                size_t warmup = 10);

// Hosts a TcpStore on 127.0.0.1 (port 0), starts this program once per
// entry of `children` with that entry's arguments plus --port=<store port>,
// runs `here(port)` in this process, then waits for the children. Returns
// `here`'s result, or 1 when a child failed.
int LaunchRanks(const std::vector<std::vector<std::string>>& children,
                const std::function<int(int port)>& here);

}  // namespace ferry::bench

#endif  // FERRY_BENCH_UTIL_PROCS_H_
