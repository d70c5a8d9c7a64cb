// Ferry's own algorithms inside GlooBackend (ring all-reduce and chain
// broadcast above InlineBytes() with check_args on; reduce-scatter,
// all-gather and all-to-all at every size, checked or not): exact results,
// and argument mismatches refused on every rank with the group usable
// afterwards.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ferry/c10d/gloo/gloo_backend.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ferry/store/hash_store.h"
#include "ferry/store/prefix_store.h"
#include "ferry/tests/util/run_ranks.h"

namespace ferry {
namespace c10d {
namespace {

using ::testing::HasSubstr;

constexpr absl::Duration kTimeout = absl::Seconds(60);

// Runs fn on n ranks (threads), each with its own backend.
void RunGroup(int n, const std::function<void(int, GlooBackend&)>& fn,
              bool check_args = true) {
  auto store = std::make_shared<HashStore>();
  testutil::RunRanks(
      n,
      [&](int r) {
        GlooBackendOptions o;
        o.check_args = check_args;
        return GlooBackend::Create(std::make_shared<PrefixStore>("g", store),
                                   r, n, kTimeout, o);
      },
      [&](int r, auto& b) {
        ASSERT_TRUE(b.ok()) << b.status();
        fn(r, **b);
      });
}

// RunGroup at 2, 3 and 4 ranks, with the check on and off.
// A group the exactness tests run on: its size, with or without the
// argument check. One test instance per group, so shards spread them.
struct Group {
  bool check;
  int n;
};

class GlooRingGroupTest : public ::testing::TestWithParam<Group> {
 protected:
  void ForGroup(
      const std::function<void(bool check, int n, int r, GlooBackend&)>& fn) {
    const Group g = GetParam();
    RunGroup(
        g.n, [&](int r, GlooBackend& b) { fn(g.check, g.n, r, b); }, g.check);
  }
};

INSTANTIATE_TEST_SUITE_P(Groups, GlooRingGroupTest,
                         ::testing::Values(Group{true, 2}, Group{true, 3},
                                           Group{true, 4}, Group{false, 2},
                                           Group{false, 3}, Group{false, 4}),
                         [](const ::testing::TestParamInfo<Group>& info) {
                           return absl::StrCat(
                               info.param.check ? "Checked" : "Unchecked",
                               info.param.n, "Ranks");
                         });

// Elements just above the inline limit, and a multi-segment size that does
// not divide into n chunks evenly.
std::vector<int64_t> LargeSizes(GlooBackend& b, size_t itemsize) {
  int64_t above = static_cast<int64_t>(b.InlineBytes() / itemsize) + 1;
  return {above, above * 3 + 7};
}

// The reductions the exactness tests run.
struct ReduceCase {
  DType dtype;
  ReduceOp op;
};
constexpr ReduceCase kReduceCases[] = {{DType::kFloat32, ReduceOp::kSum},
                                       {DType::kInt64, ReduceOp::kMax},
                                       {DType::kFloat64, ReduceOp::kAvg},
                                       {DType::kBFloat16, ReduceOp::kSum}};

Tensor Iota(int64_t numel, DType dtype, int rank) {
  std::vector<double> v(numel);
  for (int64_t i = 0; i < numel; ++i) v[i] = (i % 29) + rank * 3;
  return from_vector<double>(v, {numel}).to(dtype);
}

TEST(GlooRingTest, LargeAllreduceIsExactOnEveryRank) {
  for (int n : {2, 3, 4}) {
    RunGroup(n, [&](int r, GlooBackend& b) {
      for (ReduceCase c : kReduceCases) {
        for (int64_t numel : LargeSizes(b, ItemSize(c.dtype))) {
          Tensor t = Iota(numel, c.dtype, r);
          absl::Status s = b.Allreduce(t, {.op = c.op})->Wait(kTimeout);
          ASSERT_TRUE(s.ok()) << s;
          std::vector<double> got = t.to(DType::kFloat64).to_vector<double>();
          for (int64_t i = 0; i < numel; ++i) {
            double base = i % 29, want = 0;
            if (c.op == ReduceOp::kSum) want = n * base + 3.0 * n * (n - 1) / 2;
            if (c.op == ReduceOp::kMax) want = base + 3.0 * (n - 1);
            if (c.op == ReduceOp::kAvg) want = base + 1.5 * (n - 1);
            ASSERT_EQ(got[i], want)
                << "n " << n << " rank " << r << " " << DTypeName(c.dtype)
                << " " << ReduceOpName(c.op) << " numel " << numel << " i "
                << i;
          }
        }
      }
    });
  }
}

TEST(GlooRingTest, LargeBroadcastIsExactOnEveryRank) {
  for (int n : {2, 3, 4}) {
    RunGroup(n, [&](int r, GlooBackend& b) {
      for (int root : {0, n - 1}) {
        for (int64_t numel : LargeSizes(b, 8)) {
          Tensor t = Iota(numel, DType::kInt64, r);
          absl::Status s = b.Broadcast(t, {.root = root})->Wait(kTimeout);
          ASSERT_TRUE(s.ok()) << s;
          std::vector<int64_t> got = t.to_vector<int64_t>();
          for (int64_t i = 0; i < numel; ++i) {
            ASSERT_EQ(got[i], (i % 29) + root * 3)
                << "n " << n << " rank " << r << " root " << root << " numel "
                << numel << " i " << i;
          }
        }
      }
    });
  }
}

// Expected element i of rank r's reduce-scatter output (inputs from Iota).
double ReduceScatterWant(ReduceOp op, int n, int r, int64_t numel, int64_t i) {
  const double base = (r * numel + i) % 29;
  if (op == ReduceOp::kSum) return n * base + 3.0 * n * (n - 1) / 2;
  if (op == ReduceOp::kMax) return base + 3.0 * (n - 1);
  return base + 1.5 * (n - 1);  // kAvg
}

// Sizes per rank chunk for reduce-scatter and all-gather: inline (the whole
// input rides in the exchange), just above it, and a multi-segment size
// that is no multiple of the segment count.
std::vector<int64_t> ChunkSizes(GlooBackend& b, size_t itemsize, int n) {
  const int64_t inline_numel = static_cast<int64_t>(b.InlineBytes() / itemsize);
  return {5, inline_numel / n + 1, inline_numel * 3 + 7};
}

TEST_P(GlooRingGroupTest, ReduceScatterIsExactOnEveryRank) {
  ForGroup([&](bool check, int n, int r, GlooBackend& b) {
    for (ReduceCase c : kReduceCases) {
      for (int64_t numel : ChunkSizes(b, ItemSize(c.dtype), n)) {
        for (int form = 0; form < 3; ++form) {
          // 0: flat; 1: list; 2: flat, output aliasing own chunk.
          Tensor in = Iota(numel * n, c.dtype, r);
          Tensor out = form == 2 ? in.slice(0, r * numel, (r + 1) * numel)
                                 : zeros({numel}, c.dtype);
          std::vector<Tensor> list;
          for (int k = 0; k < n && form == 1; ++k) {
            list.push_back(in.slice(0, k * numel, (k + 1) * numel).clone());
          }
          absl::Status s =
              (form == 1 ? b.ReduceScatter(out, list, {.op = c.op})
                         : b.ReduceScatterTensor(out, in, {.op = c.op}))
                  ->Wait(kTimeout);
          ASSERT_TRUE(s.ok()) << s;
          std::vector<double> got = out.to(DType::kFloat64).to_vector<double>();
          for (int64_t i = 0; i < numel; ++i) {
            ASSERT_EQ(got[i], ReduceScatterWant(c.op, n, r, numel, i))
                << "check " << check << " n " << n << " rank " << r << " "
                << DTypeName(c.dtype) << " " << ReduceOpName(c.op) << " numel "
                << numel << " form " << form << " i " << i;
          }
        }
      }
    }
  });
}

TEST_P(GlooRingGroupTest, AllgatherIsExactOnEveryRank) {
  ForGroup([&](bool check, int n, int r, GlooBackend& b) {
    for (int64_t numel : ChunkSizes(b, 8, n)) {
      for (int form = 0; form < 4; ++form) {
        // 0: flat; 1: list; 2: flat, input = own output chunk; 3: flat,
        // input = the next rank's output chunk (overwritten while sent).
        Tensor out = zeros({numel * n}, DType::kInt64);
        Tensor in = Iota(numel, DType::kInt64, r);
        if (form >= 2) {
          const int64_t at = form == 2 ? r : (r + 1) % n;
          in = out.slice(0, at * numel, (at + 1) * numel);
          in.copy_(Iota(numel, DType::kInt64, r));
        }
        std::vector<Tensor> list;
        for (int k = 0; k < n && form == 1; ++k) {
          list.push_back(zeros({numel}, DType::kInt64));
        }
        absl::Status s =
            (form == 1 ? b.Allgather(list, in) : b.AllgatherIntoTensor(out, in))
                ->Wait(kTimeout);
        ASSERT_TRUE(s.ok()) << s;
        for (int k = 0; k < n; ++k) {
          std::vector<int64_t> got =
              form == 1 ? list[k].to_vector<int64_t>()
                        : out.slice(0, k * numel, (k + 1) * numel)
                              .to_vector<int64_t>();
          for (int64_t i = 0; i < numel; ++i) {
            ASSERT_EQ(got[i], (i % 29) + k * 3)
                << "check " << check << " n " << n << " rank " << r << " numel "
                << numel << " form " << form << " chunk " << k << " i " << i;
          }
        }
      }
    }
  });
}

TEST_P(GlooRingGroupTest, AlltoallIsExactOnEveryRank) {
  ForGroup([&](bool check, int n, int r, GlooBackend& b) {
    const int64_t big = static_cast<int64_t>(b.InlineBytes() / 8) + 3;
    for (int64_t rows : {int64_t{1}, big}) {
      // Uneven: rank s sends rank d (s + d) % 3 * rows rows (some
      // none) of two int64 each, values naming (s, d, row).
      auto count = [&](int s, int d) { return (s + d) % 3 * rows; };
      std::vector<int64_t> in_splits, out_splits;
      std::vector<int64_t> in_values;
      int64_t out_rows = 0;
      for (int d = 0; d < n; ++d) {
        in_splits.push_back(count(r, d));
        out_splits.push_back(count(d, r));
        out_rows += count(d, r);
        for (int64_t i = 0; i < count(r, d); ++i) {
          in_values.push_back(r * 1000000 + d * 10000 + i % 9973);
          in_values.push_back(-i);
        }
      }
      const int64_t in_rows = in_values.size() / 2;
      Tensor in = from_vector<int64_t>(in_values, {in_rows, 2});
      Tensor out = zeros({out_rows, 2}, DType::kInt64);
      absl::Status s = b.AlltoallSingle(out, in,
                                        {.output_split_sizes = out_splits,
                                         .input_split_sizes = in_splits})
                           ->Wait(kTimeout);
      ASSERT_TRUE(s.ok()) << s;
      std::vector<int64_t> got = out.to_vector<int64_t>();
      size_t k = 0;
      for (int src = 0; src < n; ++src) {
        for (int64_t i = 0; i < count(src, r); ++i, k += 2) {
          ASSERT_EQ(got[k], src * 1000000 + r * 10000 + i % 9973)
              << "check " << check << " n " << n << " rank " << r << " src "
              << src << " row " << i;
          ASSERT_EQ(got[k + 1], -i);
        }
      }
    }
  });
}

// In place (output = input), both forms: every receive is posted before the
// sends have read the input.
TEST_P(GlooRingGroupTest, AlltoallInPlaceIsExactOnEveryRank) {
  ForGroup([&](bool check, int n, int r, GlooBackend& b) {
    const int64_t big = static_cast<int64_t>(b.InlineBytes() / 8) + 3;
    for (int64_t rows : {int64_t{1}, big}) {
      // Row i of the block rank r sends rank d holds r * 1000 + d * 100 + i%7.
      auto value = [](int s, int d, int64_t i) {
        return s * 1000 + d * 100 + i % 7;
      };
      std::vector<int64_t> v;
      for (int d = 0; d < n; ++d) {
        for (int64_t i = 0; i < rows; ++i) v.push_back(value(r, d, i));
      }
      Tensor t = from_vector<int64_t>(v, {n * rows});
      std::vector<Tensor> list;
      for (int d = 0; d < n; ++d)
        list.push_back(t.slice(0, d * rows, (d + 1) * rows).clone());
      ASSERT_TRUE(b.AlltoallSingle(t, t, {})->Wait(kTimeout).ok());
      ASSERT_TRUE(b.Alltoall(list, list, {})->Wait(kTimeout).ok());
      std::vector<int64_t> flat = t.to_vector<int64_t>();
      for (int s = 0; s < n; ++s) {
        std::vector<int64_t> got = list[s].to_vector<int64_t>();
        for (int64_t i = 0; i < rows; ++i) {
          ASSERT_EQ(flat[s * rows + i], value(s, r, i))
              << "check " << check << " n " << n << " rank " << r << " src "
              << s;
          ASSERT_EQ(got[i], value(s, r, i))
              << "list, check " << check << " n " << n << " rank " << r;
        }
      }
    }
  });
}

// A rank that sends and receives no rows still agrees with the others on
// the row shape.
TEST_P(GlooRingGroupTest, AlltoallWithARankMovingNoRows) {
  ForGroup([&](bool check, int n, int r, GlooBackend& b) {
    // Ranks other than 0 send each other one row of 3; rank 0 moves none.
    auto rows = [](int s, int d) { return s == 0 || d == 0 ? 0 : 1; };
    std::vector<int64_t> in_splits, out_splits, v;
    for (int d = 0; d < n; ++d) {
      in_splits.push_back(rows(r, d));
      out_splits.push_back(rows(d, r));
      for (int k = 0; k < 3 * rows(r, d); ++k) v.push_back(r * 10 + d);
    }
    const int64_t in_rows = static_cast<int64_t>(v.size()) / 3;
    Tensor in = v.empty() ? zeros({0, 3}, DType::kInt64)
                          : from_vector<int64_t>(v, {in_rows, 3});
    Tensor out = zeros({r == 0 ? 0 : n - 1, 3}, DType::kInt64);
    absl::Status s = b.AlltoallSingle(out, in,
                                      {.output_split_sizes = out_splits,
                                       .input_split_sizes = in_splits})
                         ->Wait(kTimeout);
    ASSERT_TRUE(s.ok()) << "check " << check << " n " << n << " rank " << r
                        << ": " << s;
    std::vector<int64_t> got = out.to_vector<int64_t>();
    size_t k = 0;
    for (int src = 1; src < n && r != 0; ++src) {
      for (int c = 0; c < 3; ++c, ++k) ASSERT_EQ(got[k], src * 10 + r);
    }
  });
}

// Every rank gets InvalidArgument naming the call and its sequence number,
// and the group then runs a large all-reduce correctly.
void ExpectRefusedEverywhere(
    int n, const std::string& what,
    const std::function<std::shared_ptr<Work>(int, GlooBackend&, int64_t)>&
        call) {
  RunGroup(n, [&](int r, GlooBackend& b) {
    const int64_t numel = static_cast<int64_t>(b.InlineBytes() / 4) * 2 + 5;
    absl::Status s = call(r, b, numel)->Wait(kTimeout);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument)
        << what << ", n " << n << ", rank " << r << ": " << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("#0")) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("rank ")) << s;
    Tensor t = ones({numel});
    absl::Status after = b.Allreduce(t)->Wait(kTimeout);
    ASSERT_TRUE(after.ok()) << what << ": " << after;
    std::vector<float> v = t.to_vector<float>();
    EXPECT_EQ(v.front(), n);
    EXPECT_EQ(v.back(), n);
  });
}

TEST(GlooRingTest, LargeMismatchesFailOnEveryRankThenRecover) {
  for (int n : {2, 3, 4}) {
    const int odd = n - 1;  // The rank that differs.
    ExpectRefusedEverywhere(
        n, "count", [&](int r, GlooBackend& b, int64_t numel) {
          return b.Allreduce(ones({r == odd ? numel + 1 : numel}));
        });
    ExpectRefusedEverywhere(
        n, "dtype", [&](int r, GlooBackend& b, int64_t numel) {
          return b.Allreduce(
              ones({numel}, r == odd ? DType::kFloat64 : DType::kFloat32));
        });
    ExpectRefusedEverywhere(n, "op", [&](int r, GlooBackend& b, int64_t numel) {
      return b.Allreduce(ones({numel}),
                         {.op = r == odd ? ReduceOp::kMax : ReduceOp::kSum});
    });
    ExpectRefusedEverywhere(
        n, "root", [&](int r, GlooBackend& b, int64_t numel) {
          return b.Broadcast(ones({numel}), {.root = r == odd ? 1 : 0});
        });
    ExpectRefusedEverywhere(n, "collective",
                            [&](int r, GlooBackend& b, int64_t numel) {
                              Tensor t = ones({numel});
                              return r == odd ? b.Broadcast(t) : b.Allreduce(t);
                            });
    // Reduce-scatter and all-gather above the inline size.
    ExpectRefusedEverywhere(
        n, "reduce-scatter count", [&](int r, GlooBackend& b, int64_t numel) {
          const int64_t m = r == odd ? numel + 1 : numel;
          return b.ReduceScatterTensor(ones({m}), ones({m * n}));
        });
    ExpectRefusedEverywhere(  // One rank inline, the others on the ring.
        n, "reduce-scatter inline vs ring",
        [&](int r, GlooBackend& b, int64_t numel) {
          const int64_t m = r == odd ? 1 : numel;
          return b.ReduceScatterTensor(ones({m}), ones({m * n}));
        });
    ExpectRefusedEverywhere(
        n, "reduce-scatter op", [&](int r, GlooBackend& b, int64_t numel) {
          return b.ReduceScatterTensor(
              ones({numel}), ones({numel * n}),
              {.op = r == odd ? ReduceOp::kMax : ReduceOp::kSum});
        });
    ExpectRefusedEverywhere(
        n, "all-gather dtype", [&](int r, GlooBackend& b, int64_t numel) {
          const DType d = r == odd ? DType::kFloat64 : DType::kFloat32;
          return b.AllgatherIntoTensor(ones({numel * n}, d), ones({numel}, d));
        });
    ExpectRefusedEverywhere(n, "all-gather count",
                            [&](int r, GlooBackend& b, int64_t numel) {
                              std::vector<Tensor> outs;
                              const int64_t m = r == odd ? numel + 3 : numel;
                              for (int k = 0; k < n; ++k)
                                outs.push_back(ones({m}));
                              return b.Allgather(outs, ones({m}));
                            });
    ExpectRefusedEverywhere(
        n, "reduce-scatter vs all-gather",
        [&](int r, GlooBackend& b, int64_t numel) {
          return r == odd
                     ? b.AllgatherIntoTensor(ones({numel * n}), ones({numel}))
                     : b.ReduceScatterTensor(ones({numel}), ones({numel * n}));
        });
    // All-to-all posts its receive from every peer before the check.
    ExpectRefusedEverywhere(
        n, "all-to-all splits", [&](int r, GlooBackend& b, int64_t numel) {
          // Rank `odd` expects one row more from rank 0 than it is sent.
          std::vector<int64_t> out_splits(n, numel), in_splits(n, numel);
          if (r == odd) out_splits[0] += 1;
          return b.AlltoallSingle(ones({numel * n + (r == odd ? 1 : 0)}),
                                  ones({numel * n}),
                                  {.output_split_sizes = out_splits,
                                   .input_split_sizes = in_splits});
        });
    ExpectRefusedEverywhere(n, "all-to-all vs all-reduce",
                            [&](int r, GlooBackend& b, int64_t numel) {
                              return r == odd
                                         ? b.AlltoallSingle(ones({numel * n}),
                                                            ones({numel * n}))
                                         : b.Allreduce(ones({numel}));
                            });
    // Invalid on one rank only (AVG of integers).
    ExpectRefusedEverywhere(
        n, "invalid", [&](int r, GlooBackend& b, int64_t numel) {
          return r == odd ? b.Allreduce(ones({numel}, DType::kInt32),
                                        {.op = ReduceOp::kAvg})
                          : b.Allreduce(ones({numel}, DType::kInt32));
        });
  }
}

TEST(GlooRingTest, MismatchMessageNamesTheOtherRank) {
  RunGroup(2, [&](int r, GlooBackend& b) {
    const int64_t numel = static_cast<int64_t>(b.InlineBytes() / 4) + 10;
    absl::Status s =
        b.Allreduce(ones({r == 1 ? numel + 1 : numel}))->Wait(kTimeout);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("Allreduce"));
    EXPECT_THAT(std::string(s.message()), HasSubstr("#0"));
    EXPECT_THAT(std::string(s.message()),
                HasSubstr(absl::StrCat("rank ", 1 - r, " called")));
    EXPECT_THAT(std::string(s.message()),
                HasSubstr(absl::StrCat("float32 x ", numel + 1)));
  });
}

}  // namespace
}  // namespace c10d
}  // namespace ferry
