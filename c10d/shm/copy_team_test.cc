#include "ferry/c10d/shm/copy_team.h"

#include <atomic>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <vector>

#include "ferry/c10d/reduce.h"
#include "gtest/gtest.h"

namespace ferry {
namespace c10d {
namespace {

std::vector<char> Pattern(size_t n, int seed) {
  std::vector<char> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<char>(i * 31 + seed);
  return v;
}

TEST(CopyTeamTest, RunCallsEveryPartOnceOnEveryJob) {
  CopyTeam team(4, "test");
  EXPECT_EQ(team.threads(), 4);
  for (int job = 0; job < 2000; ++job) {
    const int parts = 1 + job % 5;  // 5 asks for more than the team has.
    std::atomic<int> calls[4] = {};
    team.Run(parts, [&](int p) { calls[p].fetch_add(1); });
    for (int p = 0; p < 4; ++p) {
      ASSERT_EQ(calls[p].load(), p < std::min(parts, 4) ? 1 : 0)
          << "job " << job << " part " << p;
    }
  }
}

TEST(CopyTeamTest, CopySplitsMovesOfAnySizeExactly) {
  for (int threads : {1, 2, 3, 7}) {
    CopyTeam team(threads, "test", /*min_part_bytes=*/64);
    for (bool streaming : {false, true}) {
      // Odd sizes and offsets, one empty move, one that spans several parts.
      const std::vector<size_t> sizes = {1000, 0, 13, 64 * 1024 + 7, 3, 640};
      std::vector<std::vector<char>> src, dst;
      std::vector<CopyTeam::Move> moves;
      for (size_t i = 0; i < sizes.size(); ++i) {
        src.push_back(Pattern(sizes[i] + 5, static_cast<int>(i)));
        dst.push_back(std::vector<char>(sizes[i] + 9, 0x55));
      }
      for (size_t i = 0; i < sizes.size(); ++i) {
        moves.push_back({dst[i].data() + 3, src[i].data() + 1, sizes[i]});
      }
      team.Copy(moves, streaming);
      for (size_t i = 0; i < sizes.size(); ++i) {
        SCOPED_TRACE(testing::Message() << threads << " threads, move " << i
                                        << ", streaming " << streaming);
        EXPECT_EQ(std::memcmp(dst[i].data() + 3, src[i].data() + 1, sizes[i]),
                  0);
        // Nothing around the destination was touched.
        for (size_t j : {size_t{0}, size_t{1}, size_t{2}}) {
          EXPECT_EQ(dst[i][j], 0x55);
        }
        for (size_t j = sizes[i] + 3; j < dst[i].size(); ++j) {
          EXPECT_EQ(dst[i][j], 0x55);
        }
      }
    }
  }
}

TEST(CopyTeamTest, ReduceGivesTheSameBitsForEveryTeamSize) {
  const int64_t count = 100003;
  std::vector<std::vector<float>> in(3, std::vector<float>(count));
  for (int q = 0; q < 3; ++q) {
    for (int64_t i = 0; i < count; ++i) {
      in[q][i] = 1.0f / static_cast<float>(i + 1 + q * 7) * (q == 1 ? 1e7f : 1);
    }
  }
  std::vector<const char*> src;
  for (auto& v : in) src.push_back(reinterpret_cast<const char*>(v.data()));
  absl::StatusOr<ReduceFn> fn = GetReduceFn(DType::kFloat32, ReduceOp::kSum);
  ASSERT_TRUE(fn.ok());
  std::vector<float> want(count);
  CopyTeam one(1, "test");
  one.Reduce(*fn, reinterpret_cast<char*>(want.data()), src, count, 4);
  for (int i = 0; i < count; i += 997) {
    ASSERT_EQ(want[i], (in[0][i] + in[1][i]) + in[2][i]) << i;
  }
  for (int threads : {2, 5}) {
    CopyTeam team(threads, "test", 64);
    std::vector<float> got(count, -1);
    team.Reduce(*fn, reinterpret_cast<char*>(got.data()), src, count, 4);
    EXPECT_EQ(std::memcmp(got.data(), want.data(), count * 4), 0) << threads;
    // One source: a copy.
    team.Reduce(*fn, reinterpret_cast<char*>(got.data()),
                absl::MakeConstSpan(src.data(), 1), count, 4);
    EXPECT_EQ(got, in[0]) << threads;
  }
}

TEST(CopyTeamTest, SmallJobsStayOnTheCaller) {
  CopyTeam team(4, "test");  // Default: parts of at least 64 KiB.
  std::vector<char> a = Pattern(100 << 10, 1), b(100 << 10);
  team.Copy(b.data(), a.data(), a.size());
  EXPECT_EQ(a, b);
}

}  // namespace
}  // namespace c10d
}  // namespace ferry
