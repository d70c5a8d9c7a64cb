// What checkpointing a parameter-server shard costs (docs/design/
// checkpoints.md), against the machine's floors:
//   snapshot   SnapshotShard under the step lock   vs memcpy of the bytes
//              (fresh buffers, and into a spare as MaybeCheckpoint does)
//   write      WriteCheckpoint (encode+CRC32C+write+fsync+renames)
//                                                   vs write+fsync of a buffer
//   restore    LoadLatest (read+checks+tensors)     vs read of the file
//   overhead   an SGD step loop over the shard with a Checkpointer (every K
//              steps) against the same loop without
//
//   checkpoint_bench [--mb=100] [--dir=/tmp/ferry_ckpt_bench] [--reps=5]
//                    [--steps=60] [--every=10]
//
// Times are the median of --reps runs. Prints a table and one JSON line per
// figure. The page cache is not dropped: restore reads a file just written
// (warm), as a server restarted on the same host would.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "ferry/optim/checkpoint.h"
#include "ferry/optim/optim.h"

namespace ferry::optim {
namespace {

struct Flags {
  int64_t mb = 100;
  std::string dir = "/tmp/ferry_ckpt_bench";
  int reps = 5;
  int steps = 60;
  int every = 10;
};

Flags Parse(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto val = [&](const char* name) -> const char* {
      std::string p = absl::StrCat("--", name, "=");
      return a.rfind(p, 0) == 0 ? argv[i] + p.size() : nullptr;
    };
    bool ok = true;
    if (const char* v = val("mb")) ok = absl::SimpleAtoi(v, &f.mb);
    else if (const char* v = val("dir")) f.dir = v;
    else if (const char* v = val("reps")) ok = absl::SimpleAtoi(v, &f.reps);
    else if (const char* v = val("steps")) ok = absl::SimpleAtoi(v, &f.steps);
    else if (const char* v = val("every")) ok = absl::SimpleAtoi(v, &f.every);
    else ok = false;
    if (!ok || f.mb <= 0 || f.reps <= 0 || f.steps <= 0 || f.every <= 0) {
      std::fprintf(stderr, "bad argument '%s'\n", argv[i]);
      std::exit(2);
    }
  }
  return f;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double TimeMs(const std::function<void()>& f) {
  const absl::Time t = absl::Now();
  f();
  return absl::ToDoubleMilliseconds(absl::Now() - t);
}

void Die(const absl::Status& s) {
  std::fprintf(stderr, "%s\n", s.ToString().c_str());
  std::exit(1);
}

struct Row {
  std::string figure;
  double ms;
  double floor_ms;  // <0: none
  std::string floor;
};

}  // namespace

int Main(int argc, char** argv) {
  const Flags f = Parse(argc, argv);
  ::mkdir(f.dir.c_str(), 0755);
  const int64_t bytes = f.mb << 20;
  // The shard: 10 float32 tensors of mb/10 MiB each.
  std::vector<Tensor> params, grads;
  for (int i = 0; i < 10; ++i) {
    params.push_back(rand({bytes / 40}, 1 + i));
    grads.push_back(rand({bytes / 40}, 100 + i));
  }
  std::vector<Row> rows;

  // Snapshot vs memcpy.
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  std::vector<double> snap, copy;
  for (int r = 0; r < f.reps; ++r) {
    snap.push_back(TimeMs([&] {
      ShardCheckpoint c = SnapshotShard(r, params, nullptr);
      (void)c;
    }));
    copy.push_back(TimeMs([&] { std::memcpy(dst.data(), src.data(), bytes); }));
  }
  rows.push_back({"snapshot (fresh)", Median(snap), Median(copy), "memcpy"});
  // Into a spare snapshot's buffers, as MaybeCheckpoint does.
  ShardCheckpoint spare = SnapshotShard(0, params, nullptr);
  std::vector<double> reused;
  for (int r = 0; r < f.reps; ++r) {
    reused.push_back(
        TimeMs([&] { SnapshotShardInto(spare, r, params, nullptr); }));
  }
  rows.push_back({"snapshot (spare)", Median(reused), Median(copy), "memcpy"});

  // Write vs raw write+fsync.
  const ShardCheckpoint shard = SnapshotShard(1, params, nullptr);
  std::vector<double> wr, raw;
  for (int r = 0; r < f.reps; ++r) {
    wr.push_back(TimeMs([&] {
      absl::StatusOr<uint64_t> w = WriteCheckpoint(f.dir, "shard", shard);
      if (!w.ok()) Die(w.status());
    }));
    raw.push_back(TimeMs([&] {
      const std::string p = f.dir + "/raw.bin";
      int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      size_t off = 0;
      while (off < dst.size()) {
        ssize_t n = ::write(fd, dst.data() + off, dst.size() - off);
        if (n <= 0) Die(absl::InternalError("raw write failed"));
        off += n;
      }
      ::fsync(fd);
      ::close(fd);
    }));
  }
  rows.push_back({"write+fsync", Median(wr), Median(raw), "write+fsync"});
  // Restore vs raw read.
  std::vector<double> rd, rawrd;
  for (int r = 0; r < f.reps; ++r) {
    rd.push_back(TimeMs([&] {
      absl::StatusOr<LoadedCheckpoint> l = LoadLatest(f.dir, "shard");
      if (!l.ok()) Die(l.status());
      if (l->checkpoint.tensors.size() != params.size() ||
          !l->checkpoint.tensors[3].second.equal(params[3])) {
        Die(absl::InternalError("restored shard differs"));
      }
    }));
    rawrd.push_back(TimeMs([&] {
      const std::string p = f.dir + "/raw.bin";
      int fd = ::open(p.c_str(), O_RDONLY);
      size_t off = 0;
      while (off < dst.size()) {
        ssize_t n = ::read(fd, dst.data() + off, dst.size() - off);
        if (n <= 0) break;
        off += n;
      }
      ::close(fd);
    }));
  }
  rows.push_back({"restore", Median(rd), Median(rawrd), "read"});

  // Overhead on an SGD step loop (snapshot on the stepping thread, write in
  // the background), paired runs.
  const SgdOptions sgd{.lr = 1e-6};
  SgdState state;
  std::vector<double> base, with;
  int64_t written = 0, superseded = 0;
  for (int r = 0; r < f.reps; ++r) {
    base.push_back(TimeMs([&] {
      for (int s = 0; s < f.steps; ++s) {
        if (!SgdStep(params, grads, state, sgd).ok()) Die(absl::InternalError("step"));
      }
    }));
    absl::StatusOr<std::unique_ptr<Checkpointer>> ck = Checkpointer::Create(
        {.dir = f.dir, .name = "loop", .every_steps = f.every});
    if (!ck.ok()) Die(ck.status());
    (*ck)->Due(0);
    with.push_back(TimeMs([&] {
      for (int s = 1; s <= f.steps; ++s) {
        if (!SgdStep(params, grads, state, sgd).ok()) Die(absl::InternalError("step"));
        (*ck)->MaybeCheckpoint(s, [&](ShardCheckpoint& c) {
          SnapshotShardInto(c, s, params, nullptr);
        });
      }
    }));
    absl::Status flushed = (*ck)->Flush(absl::Seconds(300));
    if (!flushed.ok()) Die(flushed);
    written += (*ck)->stats().written;
    superseded += (*ck)->stats().superseded;
  }
  const double step_base = Median(base) / f.steps;
  const double step_with = Median(with) / f.steps;

  std::string load = "?";
  if (FILE* lf = std::fopen("/proc/loadavg", "r")) {
    char buf[128] = {0};
    if (std::fgets(buf, sizeof(buf), lf) != nullptr) load = buf;
    std::fclose(lf);
    if (!load.empty() && load.back() == '\n') load.pop_back();
  }
  std::printf(
      "shard: %lld MiB float32 in 10 tensors; dir %s; median of %d; %u cores, "
      "loadavg after: %s\n",
      static_cast<long long>(f.mb), f.dir.c_str(), f.reps,
      std::thread::hardware_concurrency(), load.c_str());
  std::printf("%-20s %10s %10s %-12s %8s\n", "figure", "ms", "floor ms",
              "floor", "GB/s");
  for (const Row& r : rows) {
    std::printf("%-20s %10.1f %10.1f %-12s %8.2f\n", r.figure.c_str(), r.ms,
                r.floor_ms, r.floor.c_str(), bytes / r.ms / 1e6);
  }
  const double overhead = (step_with - step_base) / step_base * 100;
  std::printf(
      "step loop: %.2f ms/step without, %.2f ms/step with a checkpoint every "
      "%d steps: overhead %.1f%% (goal <= 5%%); %lld written, %lld "
      "superseded\n",
      step_base, step_with, f.every, overhead, static_cast<long long>(written),
      static_cast<long long>(superseded));
  for (const Row& r : rows) {
    std::printf(
        "{\"bench\":\"checkpoint\",\"figure\":\"%s\",\"mib\":%lld,\"ms\":%.2f,"
        "\"floor\":\"%s\",\"floor_ms\":%.2f}\n",
        r.figure.c_str(), static_cast<long long>(f.mb), r.ms, r.floor.c_str(),
        r.floor_ms);
  }
  std::printf(
      "{\"bench\":\"checkpoint\",\"figure\":\"step_overhead\",\"mib\":%lld,"
      "\"every_steps\":%d,\"ms_per_step_base\":%.3f,\"ms_per_step_with\":%.3f,"
      "\"overhead_pct\":%.2f}\n",
      static_cast<long long>(f.mb), f.every, step_base, step_with, overhead);
  return 0;
}

}  // namespace ferry::optim

int main(int argc, char** argv) { return ferry::optim::Main(argc, argv); }
