// What Ferry's gloo argument check costs, measured so host noise cancels:
// every rank opens two Gloo groups, one with check_args (Ferry's ring with
// the check in its first exchange, see c10d/gloo/ring.h) and one without
// (Gloo's own ring, no check), and alternates all-reduce calls between them,
// timing each call. On a shared, loaded host the two configurations then see
// the same load. Run it with bench/c10d/gloo_check_ab.sh.
//
//   gloo_check_ab --rank=R --world_size=N --store=/tmp/file
//                 [--sizes=1048576,...] [--calls=20]
//                 [--op=allreduce|broadcast]
//
// Rank 0 prints a table and one JSON line per size: median and mean time
// per call of each configuration and checked/unchecked (median) ratio.
#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "ferry/c10d/gloo/gloo_backend.h"
#include "ferry/store/file_store.h"
#include "ferry/store/prefix_store.h"

namespace ferry {
namespace c10d {
namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double Mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s / v.size();
}

int Main(int argc, char** argv) {
  std::map<std::string, std::string> flags = {
      {"sizes", "1048576,4194304,16777216,67108864"},
      {"calls", "20"},
      {"op", "allreduce"}};
  for (int i = 1; i < argc; ++i) {
    std::pair<std::string, std::string> kv =
        absl::StrSplit(argv[i], absl::MaxSplits('=', 1));
    absl::string_view name = kv.first;
    if (!absl::ConsumePrefix(&name, "--") || kv.second.empty()) {
      std::fprintf(stderr, "bad argument %s (want --name=value)\n", argv[i]);
      return 2;
    }
    flags[std::string(name)] = kv.second;
  }
  int rank, world, calls;
  if (!absl::SimpleAtoi(flags["rank"], &rank) ||
      !absl::SimpleAtoi(flags["world_size"], &world) ||
      !absl::SimpleAtoi(flags["calls"], &calls) || calls < 1 ||
      flags["store"].empty()) {
    std::fprintf(stderr, "need --rank, --world_size, --store\n");
    return 2;
  }
  auto store = FileStore::Open(flags["store"], world);
  if (!store.ok()) {
    std::fprintf(stderr, "%s\n", store.status().ToString().c_str());
    return 1;
  }
  std::shared_ptr<Store> shared = std::move(*store);
  std::unique_ptr<GlooBackend> groups[2];
  for (int checked = 0; checked < 2; ++checked) {
    GlooBackendOptions o;
    o.check_args = checked == 1;
    auto b = GlooBackend::Create(std::make_shared<PrefixStore>(
                                     checked ? "checked" : "unchecked", shared),
                                 rank, world, absl::Minutes(5), o);
    if (!b.ok()) {
      std::fprintf(stderr, "%s\n", b.status().ToString().c_str());
      return 1;
    }
    groups[checked] = std::move(*b);
  }
  if (rank == 0) {
    std::printf("%5s %9s | %12s %12s | %12s %12s | %6s\n", "ranks", "bytes",
                "checked med", "unchecked", "checked mean", "unchecked", "u/c");
  }
  for (absl::string_view part :
       absl::StrSplit(flags["sizes"], ',', absl::SkipEmpty())) {
    int64_t bytes;
    if (!absl::SimpleAtoi(part, &bytes) || bytes < 4) continue;
    Tensor t = full({bytes / 4}, 1.0);
    const bool broadcast = flags["op"] == "broadcast";
    std::vector<double> us[2];
    for (int i = 0; i < calls + 1; ++i) {
      for (int checked = 0; checked < 2; ++checked) {
        // Alternate which goes first, so neither always follows the other.
        const int which = (i % 2) ^ checked;
        absl::Time start = absl::Now();
        absl::Status s = (broadcast ? groups[which]->Broadcast(t)
                                    : groups[which]->Allreduce(t))
                             ->Wait();
        double took = absl::ToDoubleMicroseconds(absl::Now() - start);
        if (!s.ok()) {
          std::fprintf(stderr, "rank %d: %s\n", rank, s.ToString().c_str());
          return 1;
        }
        if (i > 0) us[which].push_back(took);  // Call 0 warms up.
      }
    }
    if (rank == 0) {
      const double mc = Median(us[1]), mu = Median(us[0]);
      std::printf("%5d %9lld | %12.0f %12.0f | %12.0f %12.0f | %5.2fx\n", world,
                  static_cast<long long>(bytes), mc, mu, Mean(us[1]),
                  Mean(us[0]), mu / mc);
      std::printf(
          "{\"bench\":\"gloo_check_ab\",\"op\":\"%s\",\"ranks\":%d,"
          "\"bytes\":%lld,\"calls\":%d,\"checked_median_us\":%.1f,"
          "\"unchecked_median_us\":%.1f,\"checked_mean_us\":%.1f,"
          "\"unchecked_mean_us\":%.1f,\"unchecked_over_checked\":%.3f}\n",
          flags["op"].c_str(), world, static_cast<long long>(bytes), calls, mc,
          mu, Mean(us[1]), Mean(us[0]), mu / mc);
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace
}  // namespace c10d
}  // namespace ferry

int main(int argc, char** argv) { return ferry::c10d::Main(argc, argv); }
