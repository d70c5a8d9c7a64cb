#include "ferry/common/ids.h"

#include <thread>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

TEST(GlobalId, PacksWorkerAndLocal) {
  GlobalId id(0xBEEF, 0x123456789ABC);
  EXPECT_EQ(id.worker_id(), 0xBEEF);
  EXPECT_EQ(id.local_id(), 0x123456789ABCu);
  EXPECT_EQ(id.value(), 0xBEEF123456789ABCu);
  EXPECT_EQ(GlobalId::FromValue(id.value()), id);
  EXPECT_EQ(GlobalId(3, 17).ToString(), "GlobalId(worker=3, local=17)");
}

TEST(IdGenerator, DistinctAcrossWorkersAndThreads) {
  IdGenerator a(1), b(2);
  absl::flat_hash_set<GlobalId> seen;
  for (int i = 0; i < 100; ++i) {
    EXPECT_TRUE(seen.insert(*a.Next()).second);
    EXPECT_TRUE(seen.insert(*b.Next()).second);
  }
  IdGenerator shared(7);
  std::vector<std::vector<GlobalId>> per(4);
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t) {
    ts.emplace_back([&, t] {
      for (int i = 0; i < 1000; ++i) per[t].push_back(*shared.Next());
    });
  }
  for (auto& t : ts) t.join();
  for (auto& v : per) {
    for (GlobalId id : v) {
      EXPECT_EQ(id.worker_id(), 7);
      EXPECT_TRUE(seen.insert(id).second);
    }
  }
  EXPECT_EQ(seen.size(), 200u + 4000u);
}

TEST(IdGenerator, ExhaustionIsAnErrorNotAWrap) {
  IdGenerator g(9, GlobalId::kMaxLocal);
  auto last = g.Next();
  ASSERT_TRUE(last.ok());
  EXPECT_EQ(last->local_id(), GlobalId::kMaxLocal);
  for (int i = 0; i < 3; ++i) {
    auto r = g.Next();
    EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_NE(r.status().message().find("worker 9"), std::string::npos);
  }
}

}  // namespace
}  // namespace ferry
