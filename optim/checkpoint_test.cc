#include "ferry/optim/checkpoint.h"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ferry/autograd/node.h"
#include "ferry/common/sync.h"
#include "ferry/optim/crc32c.h"
#include "gtest/gtest.h"

namespace ferry::optim {
namespace {

std::string TempDir(const std::string& tag) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string dir = absl::StrCat(base ? base : "/tmp", "/ckpt_", tag, "_",
                                 ::getpid());
  ::mkdir(dir.c_str(), 0755);
  return dir;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

// Bitwise equality, dtype and shape included.
bool SameBits(const Tensor& a, const Tensor& b) {
  if (a.defined() != b.defined()) return false;
  if (!a.defined()) return true;
  if (a.dtype() != b.dtype() || a.sizes() != b.sizes()) return false;
  Tensor ca = a.contiguous(), cb = b.contiguous();
  return std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.nbytes()) == 0;
}

std::vector<Tensor> Params(uint64_t seed) {
  return {randn({3, 4}, seed, DType::kFloat32), randn({5}, seed + 1,
                                                      DType::kFloat64),
          randn({2, 2}, seed + 2, DType::kFloat32)};
}
std::vector<Tensor> Grads(uint64_t seed, bool skip_last) {
  std::vector<Tensor> g = Params(seed + 100);
  if (skip_last) g[2] = Tensor();  // Its state stays empty.
  return g;
}
std::vector<Tensor> Clone(const std::vector<Tensor>& v) {
  std::vector<Tensor> out;
  for (const Tensor& t : v) out.push_back(t.clone());
  return out;
}

ShardCheckpoint Through(const ShardCheckpoint& c) {
  absl::StatusOr<std::string> bytes = EncodeCheckpoint(c);
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  absl::StatusOr<ShardCheckpoint> back = DecodeCheckpoint(*bytes, "mem");
  EXPECT_TRUE(back.ok()) << back.status();
  return back.ok() ? *std::move(back) : ShardCheckpoint();
}

// Runs two steps, checkpoints (through the file format), restores into a
// fresh state, then takes a third step on both: the parameters must match
// bit for bit (the restored state is the state).
template <typename State, typename StepFn>
void RoundTrip(StepFn step) {
  std::vector<Tensor> params = Params(1);
  State state;
  ASSERT_TRUE(step(params, Grads(2, true), state).ok());
  ASSERT_TRUE(step(params, Grads(3, true), state).ok());
  ShardCheckpoint c;
  c.step = 2;
  for (size_t i = 0; i < params.size(); ++i) {
    c.tensors.emplace_back(absl::StrCat("w", i), params[i].clone());
  }
  c.optimizer_kind = "test";
  c.optimizer = ExportState(state);
  ShardCheckpoint back = Through(c);
  ASSERT_EQ(back.step, 2);
  ASSERT_EQ(back.optimizer_kind, "test");
  ASSERT_EQ(back.tensors.size(), params.size());
  ASSERT_EQ(back.optimizer.tensors.size(), c.optimizer.tensors.size());
  ASSERT_EQ(back.optimizer.ints, c.optimizer.ints);
  std::vector<Tensor> restored;
  for (auto& [name, t] : back.tensors) restored.push_back(t);
  State restored_state;
  ASSERT_TRUE(ImportState(back.optimizer, restored.size(), restored_state).ok());
  const std::vector<Tensor> g = Grads(4, false);
  ASSERT_TRUE(step(params, g, state).ok());
  ASSERT_TRUE(step(restored, Clone(g), restored_state).ok());
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(SameBits(params[i], restored[i])) << "param " << i;
  }
  // And a state that was never restored differs (the test can fail).
  std::vector<Tensor> fresh;
  for (auto& [name, t] : Through(c).tensors) fresh.push_back(t);
  State empty;
  ASSERT_TRUE(step(fresh, Clone(g), empty).ok());
  bool any_differs = false;
  for (size_t i = 0; i < params.size(); ++i) {
    any_differs |= !SameBits(params[i], fresh[i]);
  }
  EXPECT_TRUE(any_differs);
}

TEST(CheckpointTest, SgdMomentumRoundTrip) {
  RoundTrip<SgdState>([](const std::vector<Tensor>& p,
                         const std::vector<Tensor>& g, SgdState& s) {
    return SgdStep(p, g, s, SgdOptions{.lr = 0.1, .momentum = 0.9});
  });
}

TEST(CheckpointTest, AdamRoundTrip) {
  RoundTrip<AdamState>([](const std::vector<Tensor>& p,
                          const std::vector<Tensor>& g, AdamState& s) {
    return AdamStep(p, g, s, AdamOptions{.lr = 0.01, .weight_decay = 0.1});
  });
}

TEST(CheckpointTest, AdamWRoundTrip) {
  RoundTrip<AdamState>([](const std::vector<Tensor>& p,
                          const std::vector<Tensor>& g, AdamState& s) {
    return AdamWStep(p, g, s, AdamOptions{.lr = 0.01, .weight_decay = 0.1});
  });
}

TEST(CheckpointTest, AdagradRoundTrip) {
  RoundTrip<AdagradState>([](const std::vector<Tensor>& p,
                             const std::vector<Tensor>& g, AdagradState& s) {
    return AdagradStep(p, g, s, AdagradOptions{.lr = 0.1, .lr_decay = 0.01});
  });
}

TEST(CheckpointTest, WrappersExportTheirKindAndState) {
  std::vector<Tensor> params = Params(7);
  for (const Tensor& p : params) autograd::SetGrad(p, randn(p.sizes(), 9, p.dtype()));
  Adam adam(params, AdamOptions{});
  ASSERT_TRUE(adam.Step().ok());
  ShardCheckpoint c = SnapshotShard(1, params, &adam);
  EXPECT_EQ(c.optimizer_kind, "adam");
  EXPECT_EQ(c.tensors[0].first, "0");
  EXPECT_EQ(c.optimizer.tensors.size(), 6u);
  // A snapshot is a copy: a later step does not change it.
  Tensor before = c.tensors[0].second.clone();
  ASSERT_TRUE(adam.Step().ok());
  EXPECT_TRUE(SameBits(c.tensors[0].second, before));
  EXPECT_FALSE(SameBits(params[0], before));
  AdamW other(Clone(params), AdamOptions{});
  EXPECT_EQ(other.kind(), "adamw");
  ASSERT_TRUE(other.ImportStateDict(c.optimizer).ok());
  ASSERT_EQ(other.state().exp_avg.size(), params.size());
  EXPECT_TRUE(SameBits(other.state().exp_avg[1], c.optimizer.tensors["1/exp_avg"]));
  EXPECT_EQ(other.state().step[1], 1);
}

TEST(CheckpointTest, SnapshotIntoReusesMatchingBuffers) {
  std::vector<Tensor> params = Params(11);
  for (const Tensor& p : params) {
    autograd::SetGrad(p, randn(p.sizes(), 12, p.dtype()));
  }
  Adagrad opt(params, AdagradOptions{});
  ASSERT_TRUE(opt.Step().ok());
  ShardCheckpoint c = SnapshotShard(1, params, &opt);
  const void* p0 = c.tensors[0].second.data_ptr();
  const void* s0 = c.optimizer.tensors["0/sum"].data_ptr();
  ASSERT_TRUE(opt.Step().ok());
  SnapshotShardInto(c, 2, params, &opt);
  EXPECT_EQ(c.step, 2);
  EXPECT_EQ(c.tensors[0].second.data_ptr(), p0);
  EXPECT_EQ(c.optimizer.tensors["0/sum"].data_ptr(), s0);
  // The contents are the new step's, and copies (not the live tensors).
  ShardCheckpoint fresh = SnapshotShard(2, params, &opt);
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(SameBits(c.tensors[i].second, fresh.tensors[i].second));
    EXPECT_FALSE(c.tensors[i].second.is_same(params[i]));
  }
  EXPECT_EQ(c.optimizer.ints, fresh.optimizer.ints);
  for (const auto& [k, t] : fresh.optimizer.tensors) {
    EXPECT_TRUE(SameBits(c.optimizer.tensors[k], t)) << k;
  }
  // A spare of another shape is not reused.
  std::vector<Tensor> other = {zeros({7})};
  SnapshotShardInto(c, 3, other, nullptr);
  ASSERT_EQ(c.tensors.size(), 1u);
  EXPECT_TRUE(SameBits(c.tensors[0].second, zeros({7})));
  EXPECT_TRUE(c.optimizer.tensors.empty());
}

TEST(CheckpointTest, ImportRefusesUnknownKeysAndLeavesStateAlone) {
  SgdState s;
  s.momentum_buffer = {ones({2})};
  StateDict d;
  d.tensors["0/exp_avg"] = zeros({2});
  absl::Status st = ImportState(d, 1, s);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("0/exp_avg"), std::string::npos) << st;
  d.tensors.clear();
  d.tensors["5/momentum_buffer"] = zeros({2});
  st = ImportState(d, 1, s);
  EXPECT_NE(st.message().find("5/momentum_buffer"), std::string::npos) << st;
  ASSERT_EQ(s.momentum_buffer.size(), 1u);
  EXPECT_TRUE(SameBits(s.momentum_buffer[0], ones({2})));
}

TEST(CheckpointTest, Crc32cKnownValues) {
  // RFC 3720 B.4: 32 bytes of zeros; the classic "123456789" check value.
  std::string zeros(32, '\0');
  EXPECT_EQ(Crc32c(0, zeros.data(), zeros.size()), 0x8A9136AAu);
  EXPECT_EQ(Crc32c(0, "123456789", 9), 0xE3069283u);
  EXPECT_EQ(Crc32c(Crc32c(0, "1234", 4), "56789", 5), 0xE3069283u);
}

ShardCheckpoint Sample(int64_t step, float value) {
  ShardCheckpoint c;
  c.step = step;
  c.tensors.emplace_back("w", full({64, 16}, value));
  c.tensors.emplace_back("b", full({16}, value, DType::kFloat64));
  c.optimizer_kind = "sgd";
  c.optimizer.tensors["0/momentum_buffer"] = full({64, 16}, -value);
  return c;
}

TEST(CheckpointTest, WriteKeepsLatestAndPrevious) {
  const std::string dir = TempDir("keep");
  ASSERT_TRUE(WriteCheckpoint(dir, "ps0", Sample(10, 1)).ok());
  ASSERT_TRUE(WriteCheckpoint(dir, "ps0", Sample(20, 2)).ok());
  ASSERT_TRUE(WriteCheckpoint(dir, "ps0", Sample(30, 3)).ok());
  absl::StatusOr<LoadedCheckpoint> l = LoadLatest(dir, "ps0");
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->checkpoint.step, 30);
  EXPECT_TRUE(l->refused.empty());
  EXPECT_TRUE(SameBits(l->checkpoint.tensors[0].second, full({64, 16}, 3.0f)));
  absl::StatusOr<ShardCheckpoint> prev =
      ReadCheckpointFile(PreviousCheckpointPath(dir, "ps0"));
  ASSERT_TRUE(prev.ok()) << prev.status();
  EXPECT_EQ(prev->step, 20);
  EXPECT_NE(::access(absl::StrCat(dir, "/ps0.tmp").c_str(), F_OK), 0);
  EXPECT_EQ(LoadLatest(dir, "ps1").status().code(),
            absl::StatusCode::kNotFound);
}

// Damages the latest file with `damage`; LoadLatest must refuse it naming
// the file and `reason`, and fall back to the previous one.
void ExpectFallback(const std::string& tag,
                    const std::function<void(std::string&)>& damage,
                    const std::string& reason) {
  const std::string dir = TempDir(tag);
  ASSERT_TRUE(WriteCheckpoint(dir, "ps0", Sample(10, 1)).ok());
  ASSERT_TRUE(WriteCheckpoint(dir, "ps0", Sample(20, 2)).ok());
  const std::string latest = LatestCheckpointPath(dir, "ps0");
  std::string bytes = ReadFile(latest);
  damage(bytes);
  WriteFile(latest, bytes);
  absl::StatusOr<ShardCheckpoint> direct = ReadCheckpointFile(latest);
  ASSERT_FALSE(direct.ok());
  EXPECT_EQ(direct.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(direct.status().message().find(latest), std::string::npos)
      << direct.status();
  EXPECT_NE(direct.status().message().find(reason), std::string::npos)
      << direct.status();
  absl::StatusOr<LoadedCheckpoint> l = LoadLatest(dir, "ps0");
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->checkpoint.step, 10);
  EXPECT_EQ(l->path, PreviousCheckpointPath(dir, "ps0"));
  ASSERT_EQ(l->refused.size(), 1u);
  EXPECT_NE(l->refused[0].find(latest), std::string::npos);
}

TEST(CheckpointTest, TruncatedFileFallsBackToPrevious) {
  ExpectFallback("trunc", [](std::string& b) { b.resize(b.size() / 2); },
                 "truncated");
}

TEST(CheckpointTest, TruncatedHeaderFallsBackToPrevious) {
  ExpectFallback("trunchdr", [](std::string& b) { b.resize(10); },
                 "truncated");
}

TEST(CheckpointTest, FlippedBodyByteFallsBackToPrevious) {
  ExpectFallback("flip", [](std::string& b) { b[b.size() / 2] ^= 0x10; },
                 "body checksum mismatch");
}

TEST(CheckpointTest, FlippedHeaderByteFallsBackToPrevious) {
  ExpectFallback("fliphdr", [](std::string& b) { b[17] ^= 0x01; },
                 "header checksum mismatch");
}

TEST(CheckpointTest, WrongVersionFallsBackToPrevious) {
  ExpectFallback("version",
                 [](std::string& b) {
                   b[8] = 2;  // version, little-endian
                   // A consistent header: only the version is wrong.
                   uint32_t crc = Crc32c(0, b.data(), 28);
                   for (int i = 0; i < 4; ++i) b[28 + i] = char(crc >> (8 * i));
                 },
                 "unsupported version 2");
}

TEST(CheckpointTest, BadMagicFallsBackToPrevious) {
  ExpectFallback("magic", [](std::string& b) { b[0] = 'X'; }, "bad magic");
}

TEST(CheckpointTest, BothCorruptNamesBothFiles) {
  const std::string dir = TempDir("both");
  ASSERT_TRUE(WriteCheckpoint(dir, "ps0", Sample(10, 1)).ok());
  ASSERT_TRUE(WriteCheckpoint(dir, "ps0", Sample(20, 2)).ok());
  const std::string latest = LatestCheckpointPath(dir, "ps0");
  const std::string prev = PreviousCheckpointPath(dir, "ps0");
  std::string a = ReadFile(latest);
  a.resize(a.size() - 1);
  WriteFile(latest, a);
  std::string b = ReadFile(prev);
  b[b.size() - 3] ^= 0x40;
  WriteFile(prev, b);
  absl::StatusOr<LoadedCheckpoint> l = LoadLatest(dir, "ps0");
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.status().code(), absl::StatusCode::kDataLoss);
  const std::string m(l.status().message());
  EXPECT_NE(m.find(latest), std::string::npos) << m;
  EXPECT_NE(m.find("truncated"), std::string::npos) << m;
  EXPECT_NE(m.find(prev), std::string::npos) << m;
  EXPECT_NE(m.find("checksum mismatch"), std::string::npos) << m;
}

TEST(CheckpointTest, EveryByteFlipIsRefused) {
  // Not one single-byte corruption of a small file decodes.
  absl::StatusOr<std::string> bytes = EncodeCheckpoint(Sample(5, 0.5f));
  ASSERT_TRUE(bytes.ok());
  for (size_t i = 0; i < bytes->size(); i += 7) {
    std::string b = *bytes;
    b[i] ^= 0x01;
    EXPECT_FALSE(DecodeCheckpoint(b, "x").ok()) << "byte " << i;
  }
}

TEST(CheckpointTest, CheckpointerOptionsAreChecked) {
  EXPECT_EQ(Checkpointer::Create({.dir = "", .name = "a"}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Checkpointer::Create(
                {.dir = TempDir("opt"), .name = "a", .writer_nice = 20})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Checkpointer::Create({.dir = TempDir("opt"), .name = "a/b"})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  absl::Status s = Checkpointer::Create({.dir = "/proc/no/such/dir", .name = "a"})
                       .status();
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("/proc/no/such/dir"), std::string::npos) << s;
}

TEST(CheckpointTest, DueEveryKSteps) {
  auto c = Checkpointer::Create(
      {.dir = TempDir("due"), .name = "ps0", .every_steps = 3});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE((*c)->Due(0));  // Starts the clocks.
  EXPECT_FALSE((*c)->Due(2));
  EXPECT_TRUE((*c)->Due(3));
  (*c)->Submit(Sample(3, 1));
  EXPECT_FALSE((*c)->Due(5));
  EXPECT_TRUE((*c)->Due(6));
  ASSERT_TRUE((*c)->Flush(absl::Seconds(30)).ok());
}

TEST(CheckpointTest, DueEveryTSeconds) {
  auto c = Checkpointer::Create(
      {.dir = TempDir("duet"), .name = "ps0", .every = absl::Milliseconds(20)});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE((*c)->Due(0));
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  int64_t step = 0;
  // Steps until the clock says due (bounded in time and count).
  while (!(*c)->Due(++step) && absl::Now() < deadline && step < 100000000) {
  }
  EXPECT_TRUE((*c)->Due(step));
}

// A shard stepped by one thread while the Checkpointer snapshots it: every
// element of every parameter equals the step counter, so a snapshot copied
// outside the lock (or torn) would show a mismatch.
TEST(CheckpointTest, WriterUnderConcurrentUpdates) {
  const std::string dir = TempDir("conc");
  auto ck = Checkpointer::Create({.dir = dir, .name = "ps0", .every_steps = 5});
  ASSERT_TRUE(ck.ok()) << ck.status();
  Mutex step_mu;
  std::vector<Tensor> params = {zeros({256, 64}), zeros({1000})};
  int64_t step = 0;
  std::atomic<int64_t> reads_ok{0};
  std::atomic<bool> done{false};
  // A reader thread that loads while writes happen: every load it gets is
  // consistent (atomic rename: never a half-written latest).
  std::thread reader([&] {
    for (int i = 0; i < 200000 && !done.load(); ++i) {
      absl::StatusOr<LoadedCheckpoint> l = LoadLatest(dir, "ps0");
      if (!l.ok()) {
        EXPECT_EQ(l.status().code(), absl::StatusCode::kNotFound) << l.status();
        continue;
      }
      EXPECT_TRUE(l->refused.empty()) << l->refused[0];
      const float want = static_cast<float>(l->checkpoint.step);
      for (auto& [n, t] : l->checkpoint.tensors) {
        EXPECT_TRUE(SameBits(t, full(t.sizes(), want))) << n;
      }
      ++reads_ok;
    }
  });
  EXPECT_FALSE((*ck)->Due(0));  // The clocks start at step 0.
  for (int i = 0; i < 300; ++i) {
    MutexLock lock(&step_mu);
    for (Tensor& p : params) p.add_(1.0);
    ++step;
    (*ck)->MaybeCheckpoint(step, [&](ShardCheckpoint& c) {
      SnapshotShardInto(c, step, params, nullptr);
    });
  }
  ASSERT_TRUE((*ck)->Flush(absl::Seconds(60)).ok());
  done = true;
  reader.join();
  Checkpointer::Stats st = (*ck)->stats();
  EXPECT_EQ(st.submitted, 60);
  EXPECT_EQ(st.written + st.superseded, st.submitted);
  EXPECT_EQ(st.failed, 0);
  EXPECT_EQ(st.last_written_step, 300);
  absl::StatusOr<LoadedCheckpoint> l = LoadLatest(dir, "ps0");
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->checkpoint.step, 300);
  // Restore is bit-identical to the shard.
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(SameBits(l->checkpoint.tensors[i].second, params[i]));
  }
}

TEST(CheckpointTest, DestructionWritesWhatWaits) {
  const std::string dir = TempDir("dtor");
  {
    auto ck = Checkpointer::Create({.dir = dir, .name = "ps0"});
    ASSERT_TRUE(ck.ok());
    (*ck)->Submit(Sample(7, 7));
  }
  absl::StatusOr<LoadedCheckpoint> l = LoadLatest(dir, "ps0");
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->checkpoint.step, 7);
}

TEST(CheckpointTest, WriteFailureIsReportedNamingTheShard) {
  const std::string dir = TempDir("fail");
  auto ck = Checkpointer::Create({.dir = dir, .name = "ps0"});
  ASSERT_TRUE(ck.ok());
  ShardCheckpoint bad = Sample(3, 1);
  bad.tensors.emplace_back("undefined", Tensor());
  (*ck)->Submit(std::move(bad));
  absl::Status s = (*ck)->Flush(absl::Seconds(30));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("ps0"), std::string::npos) << s;
  EXPECT_NE(s.message().find("undefined"), std::string::npos) << s;
  EXPECT_EQ((*ck)->stats().failed, 1);
  (*ck)->Submit(Sample(4, 1));
  EXPECT_TRUE((*ck)->Flush(absl::Seconds(30)).ok());
}

}  // namespace
}  // namespace ferry::optim
