#include "ferry/c10d/shm/shm_backend.h"

#include <dirent.h>
#include <sched.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ferry/c10d/testing/backend_conformance.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ferry/store/hash_store.h"
#include "ferry/store/prefix_store.h"
#include "ferry/tests/util/run_ranks.h"

namespace ferry {
namespace c10d {
namespace {

using ::testing::HasSubstr;

constexpr OpType kShmOps[] = {
    OpType::kAllreduce,
    OpType::kBroadcast,
    OpType::kAllgather,
    OpType::kReduceScatter,
    OpType::kBarrier,
    OpType::kAllgatherIntoTensor,
    OpType::kReduceScatterTensor,
    OpType::kAlltoallSingle,
    OpType::kAlltoall,
};

// Small slots, so the conformance sizes take many rounds.
std::map<std::string, std::string> SmallSlots() {
  return {{"shm_slot_bytes", "4096"}, {"shm_name_prefix", "/ferry-c10d-test"}};
}

// With `teams`, ranks split their copies over copy teams of 3 (even ranks)
// and 2 (odd) threads, in parts as small as 64 bytes, so the conformance
// sizes are split too (and the slot is rank 0's team times the option).
BackendUnderTest ShmAlone(bool teams = false) {
  BackendUnderTest b;
  b.name = teams ? "ShmTeams" : "Shm";
  b.create =
      [teams](
          std::shared_ptr<Store> store, int rank, int size,
          absl::Duration timeout) -> absl::StatusOr<std::unique_ptr<Backend>> {
    std::map<std::string, std::string> options = SmallSlots();
    options["shm_threads"] = teams ? (rank % 2 == 0 ? "3" : "2") : "1";
    if (teams) options["shm_team_part_bytes"] = "64";
    absl::StatusOr<ShmBackendOptions> o = ShmBackendOptions::FromMap(options);
    if (!o.ok()) return o.status();
    auto backend =
        ShmBackend::Create(std::move(store), rank, size, timeout, *o);
    if (!backend.ok()) return backend.status();
    return std::unique_ptr<Backend>(std::move(*backend));
  };
  b.ops.assign(std::begin(kShmOps), std::end(kShmOps));
  return b;
}

// The registered "shm" backend: shared memory plus gloo for the rest.
BackendUnderTest ShmWithGloo() {
  BackendUnderTest b;
  b.name = "ShmWithGloo";
  b.create =
      [](std::shared_ptr<Store> store, int rank, int size,
         absl::Duration timeout) -> absl::StatusOr<std::unique_ptr<Backend>> {
    BackendConfig c;
    c.store = std::move(store);
    c.rank = rank;
    c.size = size;
    c.timeout = timeout;
    c.options = SmallSlots();
    return ShmBackend::Factory()(c);
  };
  for (OpType op : {OpType::kAllgatherIntoTensor, OpType::kReduceScatterTensor,
                    OpType::kAlltoallSingle, OpType::kRecvAnysource,
                    OpType::kMonitoredBarrier}) {
    b.ops.push_back(op);
  }
  return b;
}

INSTANTIATE_TEST_SUITE_P(Shm, BackendConformanceTest,
                         ::testing::Values(ShmAlone(), ShmAlone(true),
                                           ShmWithGloo()),
                         BackendUnderTestName);

// Names of /dev/shm entries starting with `prefix`.
std::vector<std::string> Segments(const std::string& prefix) {
  std::vector<std::string> out;
  DIR* dir = ::opendir("/dev/shm");
  if (dir == nullptr) return out;
  while (dirent* e = ::readdir(dir)) {
    std::string name = e->d_name;
    if (name.rfind(prefix, 0) == 0) out.push_back(name);
  }
  ::closedir(dir);
  return out;
}

// Runs body on n threads, each with its own backend made by `make`.
void RunRanks(int n,
              const std::function<absl::StatusOr<std::unique_ptr<Backend>>(
                  std::shared_ptr<Store>, int)>& make,
              const std::function<void(int, Backend&)>& body) {
  auto store = std::make_shared<HashStore>();
  testutil::RunRanks(
      n, [&](int r) { return make(std::make_shared<PrefixStore>("t", store), r); },
      [&](int r, auto& b) {
        ASSERT_TRUE(b.ok()) << b.status();
        body(r, **b);
      });
}

TEST(ShmBackendTest, SegmentIsUnlinkedOnceEveryRankAttached) {
  const std::string prefix = absl::StrCat("ferry-c10d-unlink-", ::getpid());
  RunRanks(
      3,
      [&](std::shared_ptr<Store> store,
          int r) -> absl::StatusOr<std::unique_ptr<Backend>> {
        ShmBackendOptions o;
        o.name_prefix = "/" + prefix;
        auto b = ShmBackend::Create(store, r, 3, absl::Seconds(20), o);
        if (!b.ok()) return b.status();
        return std::unique_ptr<Backend>(std::move(*b));
      },
      [&](int r, Backend& b) {
        EXPECT_THAT(static_cast<ShmBackend&>(b).segment_name(),
                    HasSubstr(prefix));
        // Every rank has returned from Create: nothing is left by name.
        EXPECT_TRUE(Segments(prefix).empty());
        Tensor t = full({100}, r + 1.0);
        ASSERT_TRUE(b.Allreduce(t)->Wait(absl::Seconds(20)).ok());
        EXPECT_EQ(t.to_vector<float>()[99], 6.0f);
      });
  EXPECT_TRUE(Segments(prefix).empty());
}

// Rank 0's team sets the slot (option x team, within the segment cap); the
// others read it from the segment whatever their own team, and results do
// not depend on who splits how.
TEST(ShmBackendTest, SlotFollowsRankZerosTeamAndTeamsMayDiffer) {
  const std::vector<int> teams = {4, 1, 2};
  const int64_t count = 200003;  // Several rounds of 16 KiB slots.
  RunRanks(
      3,
      [&](std::shared_ptr<Store> store,
          int r) -> absl::StatusOr<std::unique_ptr<Backend>> {
        ShmBackendOptions o;
        o.slot_bytes = 4096;
        o.threads = teams[r];
        o.team_part_bytes = 256;
        o.name_prefix = "/ferry-c10d-test";
        auto b = ShmBackend::Create(store, r, 3, absl::Seconds(20), o);
        if (!b.ok()) return b.status();
        return std::unique_ptr<Backend>(std::move(*b));
      },
      [&](int r, Backend& b) {
        auto& shm = static_cast<ShmBackend&>(b);
        EXPECT_EQ(shm.slot_bytes(), 4u * 4096);
        EXPECT_EQ(shm.threads(), teams[r]);
        std::vector<float> v(count);
        for (int64_t i = 0; i < count; ++i) v[i] = (i % 1000) * 0.5f + r;
        Tensor t = from_vector<float>(v, {count});
        ASSERT_TRUE(b.Allreduce(t)->Wait(absl::Seconds(20)).ok());
        std::vector<float> got = t.to_vector<float>();
        for (int64_t i = 0; i < count; i += 101) {
          ASSERT_EQ(got[i], (i % 1000) * 1.5f + 3.0f) << i;
        }
        Tensor u = full({count}, r == 2 ? 9.0 : 0.0);
        ASSERT_TRUE(b.Broadcast(u, {.root = 2})->Wait(absl::Seconds(20)).ok());
        EXPECT_EQ(u.to_vector<float>(), std::vector<float>(count, 9.0f));
      });
}

TEST(ShmBackendTest, AutoFactoryPicksShmOnOneHostUnlessTurnedOff) {
  for (const char* shm : {"true", "false"}) {
    RunRanks(
        2,
        [&](std::shared_ptr<Store> store,
            int r) -> absl::StatusOr<std::unique_ptr<Backend>> {
          BackendConfig c;
          c.store = store;
          c.rank = r;
          c.size = 2;
          c.timeout = absl::Seconds(20);
          c.options = {{"shm", shm}, {"check_args", "true"}};
          return ShmBackend::AutoFactory()(c);
        },
        [&](int r, Backend& b) {
          EXPECT_EQ(b.name(), std::string(shm) == "true" ? "shm" : "gloo");
          Tensor t = full({10}, r + 1.0);
          ASSERT_TRUE(b.Allreduce(t)->Wait(absl::Seconds(20)).ok());
          EXPECT_EQ(t.to_vector<float>()[0], 3.0f);
        });
  }
  BackendConfig bad;
  bad.store = std::make_shared<HashStore>();
  bad.options = {{"shm", "maybe"}};
  EXPECT_EQ(ShmBackend::AutoFactory()(bad).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Transfers far larger than a slot's share (many rounds, uneven), and an
// all-to-all whose output is its input.
// Makes rank r of `ranks` on ShmBackend with options `o` (for RunRanks).
std::function<absl::StatusOr<std::unique_ptr<Backend>>(std::shared_ptr<Store>,
                                                       int)>
ShmRanks(int ranks, ShmBackendOptions o) {
  return [ranks, o](std::shared_ptr<Store> store,
                    int r) -> absl::StatusOr<std::unique_ptr<Backend>> {
    auto b =
        ShmBackend::Create(std::move(store), r, ranks, absl::Seconds(60), o);
    if (!b.ok()) return b.status();
    return std::unique_ptr<Backend>(std::move(*b));
  };
}

// Default slots (1 MiB), the test prefix.
ShmBackendOptions DefaultSlots() {
  ShmBackendOptions o;
  o.name_prefix = "/ferry-c10d-test";
  return o;
}

TEST(ShmBackendTest, AlltoallSingleOverManyRoundsAndInPlace) {
  constexpr int kRanks = 3;
  // Copy-out with non-temporal stores (from 1 byte on) and without.
  for (int64_t streaming_from : {int64_t{1}, int64_t{0}}) {
    SCOPED_TRACE(absl::StrCat("non-temporal from ", streaming_from));
    ShmBackendOptions options = *ShmBackendOptions::FromMap(SmallSlots());
    options.streaming_store_bytes = streaming_from;
    RunRanks(kRanks, ShmRanks(kRanks, options), [&](int r, Backend& b) {
      // Rank s sends (s + 1) * (d + 1) * 300 int32 values to rank d.
      auto rows = [](int s, int d) { return int64_t{(s + 1) * (d + 1) * 300}; };
      AlltoallSingleOptions o;
      std::vector<int32_t> src;
      int64_t out_total = 0;
      for (int d = 0; d < kRanks; ++d) {
        o.input_split_sizes.push_back(rows(r, d));
        o.output_split_sizes.push_back(rows(d, r));
        out_total += rows(d, r);
        for (int64_t k = 0; k < rows(r, d); ++k) {
          src.push_back(static_cast<int32_t>(r * 1000000 + d * 100000 + k));
        }
      }
      Tensor in = from_vector<int32_t>(src, {static_cast<int64_t>(src.size())});
      Tensor out = zeros({out_total}, DType::kInt32);
      absl::Status s = b.AlltoallSingle(out, in, o)->Wait(absl::Seconds(20));
      ASSERT_TRUE(s.ok()) << s;
      std::vector<int32_t> got = out.to_vector<int32_t>();
      size_t at = 0;
      for (int sr = 0; sr < kRanks; ++sr) {
        for (int64_t k = 0; k < rows(sr, r); ++k) {
          ASSERT_EQ(got[at++], sr * 1000000 + r * 100000 + k)
              << "rank " << r << " from " << sr << " at " << k;
        }
      }
      // In place, equal splits: chunk d of rank s is s * 10 + d.
      constexpr int64_t kChunk = 2000;
      Tensor t = zeros({kRanks * kChunk}, DType::kInt64);
      int64_t* p = static_cast<int64_t*>(t.data_ptr());
      for (int64_t i = 0; i < kRanks * kChunk; ++i) p[i] = r * 10 + i / kChunk;
      s = b.AlltoallSingle(t, t)->Wait(absl::Seconds(20));
      ASSERT_TRUE(s.ok()) << s;
      for (int64_t i = 0; i < kRanks * kChunk; ++i) {
        ASSERT_EQ(p[i], (i / kChunk) * 10 + r) << "rank " << r << " at " << i;
      }
    });
  }
}

// Broadcasts larger than a slot, streamed through the root's two slots in
// chunks (wrapping around them many times; with the default chunk and an
// uneven one) or in rounds, each with and without non-temporal copy-out,
// from every root in turn, with other collectives between them; every rank
// ends with the root's exact values.
TEST(ShmBackendTest, LargeBroadcastsFromEveryRootBothAlgorithms) {
  struct Variant {
    ShmBackendOptions::Broadcast broadcast;
    int64_t streaming_store_bytes;
    int64_t chunk_bytes;
  };
  using B = ShmBackendOptions::Broadcast;
  for (const Variant& v :
       {Variant{B::kStream, 1, 0}, Variant{B::kStream, 0, 100000},
        Variant{B::kRounds, 1, 0}, Variant{B::kRounds, 0, 0}}) {
    for (int ranks : {2, 3}) {
      SCOPED_TRACE(absl::StrCat(ranks, " ranks, ",
                                v.broadcast == B::kStream ? "stream" : "rounds",
                                ", non-temporal from ", v.streaming_store_bytes,
                                ", chunk ", v.chunk_bytes));
      ShmBackendOptions o = DefaultSlots();
      o.broadcast = v.broadcast;
      o.streaming_store_bytes = v.streaming_store_bytes;
      o.chunk_bytes = v.chunk_bytes;
      RunRanks(ranks, ShmRanks(ranks, o), [&](int r, Backend& b) {
        EXPECT_EQ(static_cast<ShmBackend&>(b).streams_broadcasts(),
                  v.broadcast == B::kStream);
        constexpr int64_t kNumel = (int64_t{9} << 20) / 4 + 3;
        for (int call = 0; call < 2 * ranks; ++call) {
          const int root = call % ranks;
          Tensor t = zeros({kNumel}, DType::kInt32);
          int32_t* p = static_cast<int32_t*>(t.data_ptr());
          for (int64_t i = 0; i < kNumel; ++i) {
            p[i] = r == root ? static_cast<int32_t>(i * 7 + call) : -1;
          }
          absl::Status s =
              b.Broadcast(t, {.root = root})->Wait(absl::Seconds(60));
          ASSERT_TRUE(s.ok()) << s;
          for (int64_t i = 0; i < kNumel; ++i) {
            ASSERT_EQ(p[i], static_cast<int32_t>(i * 7 + call))
                << "rank " << r << " call " << call << " at " << i;
          }
          Tensor one = full({5}, 1.0);
          s = b.Allreduce(one)->Wait(absl::Seconds(60));
          ASSERT_TRUE(s.ok()) << s;
          EXPECT_EQ(one.to_vector<float>()[4], static_cast<float>(ranks));
        }
      });
    }
  }
}

// Rank 0 chooses the broadcast algorithm: by default streamed when every
// rank has a core (this process's affinity), else rounds; ranks left on
// "auto" follow an explicit choice of rank 0's; an explicit choice
// differing from rank 0's fails that rank's Create (InvalidArgument naming
// the option) and rank 0's (DeadlineExceeded: not every rank attached),
// leaving no segment.
TEST(ShmBackendTest, RankZeroChoosesTheBroadcastAlgorithm) {
  using B = ShmBackendOptions::Broadcast;
  constexpr int kRanks = 3;
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(::sched_getaffinity(0, sizeof(set), &set), 0);
  const bool core_each = CPU_COUNT(&set) >= kRanks;
  for (B first : {B::kAuto, B::kStream, B::kRounds}) {
    SCOPED_TRACE(static_cast<int>(first));
    const bool streams = first == B::kAuto ? core_each : first == B::kStream;
    auto make = [first](std::shared_ptr<Store> store,
                        int r) -> absl::StatusOr<std::unique_ptr<Backend>> {
      ShmBackendOptions o = DefaultSlots();
      o.broadcast = r == 0 ? first : B::kAuto;
      return ShmRanks(kRanks, o)(std::move(store), r);
    };
    RunRanks(kRanks, make, [&](int r, Backend& b) {
      EXPECT_EQ(static_cast<ShmBackend&>(b).streams_broadcasts(), streams)
          << "rank " << r;
      const int64_t big = (int64_t{3} << 20) / 4 + 1;  // Over a slot.
      Tensor t = full({big}, r == 1 ? 5.0 : 0.0);
      absl::Status s = b.Broadcast(t, {.root = 1})->Wait(absl::Seconds(60));
      ASSERT_TRUE(s.ok()) << s;
      EXPECT_EQ(t.to_vector<float>(), std::vector<float>(big, 5.0f));
    });
  }
  auto store = std::make_shared<HashStore>();
  absl::Status results[2];
  testutil::RunRanks(2, [&](int r) {
    ShmBackendOptions o = DefaultSlots();
    o.broadcast = r == 0 ? B::kStream : B::kRounds;
    // Rank 1 fails at once on seeing rank 0's choice; rank 0 waits for it
    // to attach until its (shorter) timeout.
    results[r] = ShmBackend::Create(std::make_shared<PrefixStore>("t", store),
                                    r, 2, absl::Seconds(r == 0 ? 5 : 60), o)
                     .status();
  });
  EXPECT_EQ(results[1].code(), absl::StatusCode::kInvalidArgument)
      << results[1];
  EXPECT_THAT(std::string(results[1].message()), HasSubstr("shm_broadcast"));
  EXPECT_EQ(results[0].code(), absl::StatusCode::kDeadlineExceeded)
      << results[0];
  EXPECT_TRUE(Segments("ferry-c10d-test").empty());
}

// The list form over many rounds (small slots), once into separate outputs
// and once in place (each output is the input of the same index).
TEST(ShmBackendTest, AlltoallListOverManyRoundsAndInPlace) {
  constexpr int kRanks = 3;
  constexpr int64_t kNumel = 3001;  // 12004 bytes: several 4 KiB slots.
  RunRanks(kRanks, ShmRanks(kRanks, *ShmBackendOptions::FromMap(SmallSlots())),
           [&](int r, Backend& b) {
             auto value = [](int s, int d, int64_t i) {
               return static_cast<int32_t>(s * 1000000 + d * 100000 + i);
             };
             for (bool in_place : {false, true}) {
               std::vector<Tensor> ins, outs;
               for (int d = 0; d < kRanks; ++d) {
                 Tensor t = zeros({kNumel}, DType::kInt32);
                 int32_t* p = static_cast<int32_t*>(t.data_ptr());
                 for (int64_t i = 0; i < kNumel; ++i) p[i] = value(r, d, i);
                 ins.push_back(t);
                 outs.push_back(in_place ? t : zeros({kNumel}, DType::kInt32));
               }
               absl::Status s = b.Alltoall(outs, ins)->Wait(absl::Seconds(20));
               ASSERT_TRUE(s.ok()) << s;
               for (int src = 0; src < kRanks; ++src) {
                 std::vector<int32_t> got = outs[src].to_vector<int32_t>();
                 for (int64_t i = 0; i < kNumel; ++i) {
                   ASSERT_EQ(got[i], value(src, r, i))
                       << "rank " << r << " from " << src << " at " << i
                       << (in_place ? " (in place)" : "");
                 }
               }
             }
           });
}

// Mismatched sizes in a broadcast that would stream, and in the list form of
// all-to-all, fail on every rank before any data is read; the group then
// still streams a broadcast correctly.
TEST(ShmBackendTest, MismatchedStreamedBroadcastAndAlltoallListRecover) {
  constexpr int kRanks = 2;
  RunRanks(kRanks, ShmRanks(kRanks, DefaultSlots()), [&](int r, Backend& b) {
    const int64_t big = (int64_t{3} << 20) / 4;  // 3 MiB: streams.
    Tensor t = full({big + r}, r == 0 ? 7.0 : 0.0);
    absl::Status s = b.Broadcast(t, {.root = 0})->Wait(absl::Seconds(20));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    if (r == 1) {
      EXPECT_EQ(t.to_vector<float>()[0], 0.0f) << "read before the check";
    }
    std::vector<Tensor> ins, outs;
    for (int d = 0; d < kRanks; ++d) {
      ins.push_back(ones({10 + r}));
      outs.push_back(zeros({10 + r}));
    }
    s = b.Alltoall(outs, ins)->Wait(absl::Seconds(20));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("Alltoall"));
    Tensor u = full({big}, r == 0 ? 7.0 : 0.0);
    s = b.Broadcast(u, {.root = 0})->Wait(absl::Seconds(20));
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_EQ(u.to_vector<float>(), std::vector<float>(big, 7.0f));
  });
}

TEST(ShmBackendTest, OptionsFromMapRejectBadValues) {
  EXPECT_FALSE(ShmBackendOptions::FromMap({{"shm_slot_bytes", "12"}}).ok());
  EXPECT_FALSE(ShmBackendOptions::FromMap({{"shm_name_prefix", "x"}}).ok());
  for (auto [key, value] :
       {std::pair{"shm_broadcast", "ring"},
        std::pair{"shm_streaming_store_bytes", "-2"},
        std::pair{"shm_streaming_store_bytes", "8M"},
        std::pair{"shm_chunk_bytes", "-1"}, std::pair{"shm_threads", "-1"},
        std::pair{"shm_threads", "257"},
        std::pair{"shm_team_part_bytes", "8"}}) {
    absl::StatusOr<ShmBackendOptions> bad =
        ShmBackendOptions::FromMap({{key, value}});
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument)
        << key << "=" << value;
    EXPECT_THAT(std::string(bad.status().message()), HasSubstr(key));
  }
  auto o = ShmBackendOptions::FromMap({{"shm_slot_bytes", "8192"},
                                       {"shm_broadcast", "rounds"},
                                       {"shm_streaming_store_bytes", "0"},
                                       {"shm_chunk_bytes", "4096"},
                                       {"shm_threads", "4"},
                                       {"shm_team_part_bytes", "4096"}});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->slot_bytes, 8192u);
  EXPECT_EQ(o->broadcast, ShmBackendOptions::Broadcast::kRounds);
  EXPECT_EQ(o->streaming_store_bytes, 0);
  EXPECT_EQ(o->chunk_bytes, 4096);
  EXPECT_EQ(o->threads, 4);
  EXPECT_EQ(o->team_part_bytes, 4096);
  for (auto [value, want] :
       {std::pair{"auto", ShmBackendOptions::Broadcast::kAuto},
        std::pair{"stream", ShmBackendOptions::Broadcast::kStream}}) {
    auto b = ShmBackendOptions::FromMap({{"shm_broadcast", value}});
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(b->broadcast, want);
  }
}

}  // namespace
}  // namespace c10d
}  // namespace ferry
