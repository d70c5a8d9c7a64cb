// The physical floor for same-host collectives: how fast this machine copies
// and adds memory with 1, 2, 4, ... threads, each on its own part of one
// large buffer (what a shared-memory collective does in each rank).
//
//   memcpy_floor [--bytes=67108864] [--threads=1,2,4,8,16] [--reps=8]
//
// Rows: copy (memcpy of `bytes` from one buffer to another) and add
// (float32 c = a + b over `bytes` of c). Thread counts above the cores this
// process may use (sched_getaffinity) are skipped. GB/s counts the bytes of
// the destination written per second; the best of `reps` passes (every
// thread's part of one pass done) is reported. Prints a table and one JSON
// line per figure.
#include <sched.h>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"

namespace {

int Cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  return sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
}

// Best seconds per pass of `work(part, parts)` run by `threads` threads.
template <typename Work>
double BestPass(int threads, int reps, Work work) {
  std::vector<double> took(reps, 0);
  std::barrier start(threads), end(threads);
  auto body = [&](int t) {
    for (int r = 0; r < reps; ++r) {
      start.arrive_and_wait();
      const auto t0 = std::chrono::steady_clock::now();
      work(t, threads);
      end.arrive_and_wait();
      if (t == 0) {
        took[r] =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
                .count();
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(body, t);
  body(0);
  for (std::thread& th : pool) th.join();
  return *std::min_element(took.begin(), took.end());
}

}  // namespace

int main(int argc, char** argv) {
  size_t bytes = size_t{64} << 20;
  int reps = 8;
  std::vector<int> counts = {1, 2, 4, 8, 16};
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--bytes=", 0) == 0) {
      absl::SimpleAtoi(a.substr(8), &bytes);
    } else if (a.rfind("--reps=", 0) == 0) {
      absl::SimpleAtoi(a.substr(7), &reps);
    } else if (a.rfind("--threads=", 0) == 0) {
      counts.clear();
      for (absl::string_view s : absl::StrSplit(a.substr(10), ',')) {
        int n = 0;
        if (absl::SimpleAtoi(s, &n) && n > 0) counts.push_back(n);
      }
    } else {
      std::fprintf(stderr, "unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  reps = std::max(reps, 1);
  bytes = std::max<size_t>(bytes / 64 * 64, 64);
  const size_t n = bytes / sizeof(float);
  // Touched before timing, so page faults are not counted.
  std::vector<float> a(n, 1.0f), b(n, 2.0f), c(n, 0.0f);
  const int cpus = Cpus();
  std::printf("# %d cores usable; %zu bytes per pass\n", cpus, bytes);
  std::printf("%-5s %8s %10s %9s\n", "op", "threads", "GB/s", "x 1 thr");
  for (const char* op : {"copy", "add"}) {
    double one = 0;
    for (int threads : counts) {
      if (threads > cpus) continue;
      auto part = [&](int t, int parts, size_t* lo, size_t* hi) {
        *lo = n * t / parts;
        *hi = n * (t + 1) / parts;
      };
      const double sec = BestPass(threads, reps, [&](int t, int parts) {
        size_t lo, hi;
        part(t, parts, &lo, &hi);
        if (std::strcmp(op, "copy") == 0) {
          std::memcpy(&c[lo], &a[lo], (hi - lo) * sizeof(float));
        } else {
          for (size_t i = lo; i < hi; ++i) c[i] = a[i] + b[i];
        }
      });
      const double gbps = bytes / sec / 1e9;
      if (one == 0) one = gbps;
      std::printf("%-5s %8d %10.2f %8.2fx\n", op, threads, gbps, gbps / one);
      std::printf(
          "{\"bench\":\"memcpy_floor\",\"op\":\"%s\",\"threads\":%d,"
          "\"bytes\":%zu,\"GBps\":%.3f,\"cpus\":%d}\n",
          op, threads, bytes, gbps, cpus);
    }
  }
  return c[n / 2] > 0 ? 0 : 1;
}
