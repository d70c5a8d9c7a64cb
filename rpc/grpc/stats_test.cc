#include "ferry/rpc/grpc/stats.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace ferry::rpc {
namespace {

const ferry::admin::v1::FunctionStats* Find(
    const ferry::admin::v1::GetStatsResponse& s, const std::string& name) {
  for (const auto& f : s.functions()) {
    if (f.function() == name) return &f;
  }
  return nullptr;
}

void RecordIn(RpcStats& stats, const std::string& name) {
  stats.Record(RpcStats::Direction::kIn, name, absl::Microseconds(5), false, 10,
               20);
}

TEST(RpcStats, CountsCallsPerFunction) {
  RpcStats stats;
  RecordIn(stats, "add");
  RecordIn(stats, "add");
  stats.Record(RpcStats::Direction::kOut, "add", absl::Microseconds(7), true, 1,
               2);
  const auto s = stats.Snapshot();
  const auto* add = Find(s, "add");
  ASSERT_NE(add, nullptr);
  EXPECT_EQ(add->calls_in(), 2u);
  EXPECT_EQ(add->calls_out(), 1u);
  EXPECT_EQ(add->errors_out(), 1u);
  EXPECT_EQ(add->bytes_in(), 21u);
  EXPECT_EQ(s.total_calls_in(), 2u);
}

// A client choosing a new function name per call must not grow the table
// without bound; known names keep their own entries.
TEST(RpcStats, ClientChosenNamesAreBounded) {
  RpcStats stats;
  RecordIn(stats, "known");
  const size_t flood = 3 * RpcStats::kMaxFunctions;
  for (size_t i = 0; i < flood; ++i) RecordIn(stats, absl::StrCat("f", i));
  RecordIn(stats, "known");
  const auto s = stats.Snapshot();
  EXPECT_EQ(s.functions_size(), RpcStats::kMaxFunctions + 1);
  const auto* known = Find(s, "known");
  ASSERT_NE(known, nullptr);
  EXPECT_EQ(known->calls_in(), 2u);
  const auto* other = Find(s, RpcStats::kOtherName);
  ASSERT_NE(other, nullptr);
  // Every name past the first kMaxFunctions - 1 flood names ("known" holds
  // one slot) counts under kOtherName.
  EXPECT_EQ(other->calls_in(), flood - (RpcStats::kMaxFunctions - 1));
  EXPECT_EQ(s.total_calls_in(), flood + 2);
}

TEST(RpcStats, LongNamesAreCutAtACharacterBoundary) {
  RpcStats stats;
  // "é" is two bytes; 200 of them put a character across the cut.
  std::string name;
  for (int i = 0; i < 200; ++i) name += "\xc3\xa9";
  RecordIn(stats, "x" + name);
  const auto s = stats.Snapshot();
  ASSERT_EQ(s.functions_size(), 1);
  const std::string& kept = s.functions(0).function();
  EXPECT_LE(kept.size(), RpcStats::kMaxNameBytes + 3);
  EXPECT_EQ(kept.substr(kept.size() - 3), "...");
  // 'x' then whole two-byte characters: an odd length before the "...".
  EXPECT_EQ((kept.size() - 3) % 2, 1u);
  EXPECT_EQ(kept.substr(0, 3), "x\xc3\xa9");
}

}  // namespace
}  // namespace ferry::rpc
