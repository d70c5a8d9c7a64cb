// Ferry's ring all-reduce and chain broadcast inside GlooBackend (payloads
// above InlineBytes() with check_args on): results, and argument mismatches
// refused on every rank with the group usable afterwards.
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "c10d/gloo/gloo_backend.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "store/hash_store.h"
#include "store/prefix_store.h"

namespace ferry {
namespace c10d {
namespace {

using ::testing::HasSubstr;

constexpr absl::Duration kTimeout = absl::Seconds(60);

// Runs fn on n ranks (threads), each with its own backend.
void RunGroup(int n, const std::function<void(int, GlooBackend&)>& fn,
              bool check_args = true) {
  auto store = std::make_shared<HashStore>();
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      GlooBackendOptions o;
      o.check_args = check_args;
      auto b = GlooBackend::Create(std::make_shared<PrefixStore>("g", store), r,
                                   n, kTimeout, o);
      ASSERT_TRUE(b.ok()) << b.status();
      fn(r, **b);
    });
  }
  for (auto& t : threads) t.join();
}

// Elements just above the inline limit, and a multi-segment size that does
// not divide into n chunks evenly.
std::vector<int64_t> LargeSizes(GlooBackend& b, size_t itemsize) {
  int64_t above = static_cast<int64_t>(b.InlineBytes() / itemsize) + 1;
  return {above, above * 3 + 7};
}

Tensor Iota(int64_t numel, DType dtype, int rank) {
  std::vector<double> v(numel);
  for (int64_t i = 0; i < numel; ++i) v[i] = (i % 29) + rank * 3;
  return from_vector<double>(v, {numel}).to(dtype);
}

TEST(GlooRingTest, LargeAllreduceIsExactOnEveryRank) {
  for (int n : {2, 3, 4}) {
    RunGroup(n, [&](int r, GlooBackend& b) {
      struct Case {
        DType dtype;
        ReduceOp op;
      };
      for (Case c : {Case{DType::kFloat32, ReduceOp::kSum},
                     Case{DType::kInt64, ReduceOp::kMax},
                     Case{DType::kFloat64, ReduceOp::kAvg},
                     Case{DType::kBFloat16, ReduceOp::kSum}}) {
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
