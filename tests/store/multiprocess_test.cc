// TCPStore across processes: a server handle in this process, workers in
// child processes (tcp_store_worker), joined through wait_for_workers and
// synchronised with the store-based barrier; both protocol generations.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "ferry/store/tcp_store.h"
#include "ferry/tests/util/subprocess.h"

namespace ferry {
namespace {

std::string g_worker;  // path of tcp_store_worker (argv[1])

void RunJob(int workers, bool legacy) {
  TcpStoreOptions o;
  o.host = "127.0.0.1";
  o.port = 0;
  o.is_server = true;
  o.timeout = absl::Seconds(60);
  // Without world_size so the port is known before workers start; the join
  // wait is done below through the server.
  auto store = TcpStore::Create(o);
  ASSERT_TRUE(store.ok()) << store.status();
  const int world = workers + 1;
  std::vector<std::unique_ptr<testutil::Subprocess>> children;
  for (int r = 1; r <= workers; ++r) {
    auto child = testutil::Subprocess::Spawn(
        {g_worker, absl::StrCat("--port=", (*store)->port()),
         absl::StrCat("--rank=", r), absl::StrCat("--world_size=", world),
         absl::StrCat("--legacy=", legacy ? "true" : "false")});
    ASSERT_TRUE(child.ok()) << child.status();
    children.push_back(*std::move(child));
  }
  Store& s = **store;
  ASSERT_TRUE(
      (*store)->server()->WaitForWorkers(workers, absl::Seconds(60)).ok());
  ASSERT_TRUE(s.Set("rank/0", "0").ok());
  for (int r = 0; r < 3; ++r) {
    auto n = s.Add(absl::StrCat("barrier/", r), 1);
    ASSERT_TRUE(n.ok()) << n.status();
    if (*n == world) {
      ASSERT_TRUE(s.Set(absl::StrCat("barrier/", r, "/last"), "1").ok());
    }
    ASSERT_TRUE(s.Wait({absl::StrCat("barrier/", r, "/last")}).ok());
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  for (auto& child : children) {
    absl::StatusOr<int> code = child->Wait(deadline);
    EXPECT_EQ(code.value_or(-1), 0) << code.status();
  }
  EXPECT_EQ(s.Get("barrier/2").value_or("?"), absl::StrCat(world));
  EXPECT_EQ((*store)->server()->GetStats().dropped, 0);
}

TEST(MultiProcessTest, CurrentProtocolWorkers) { RunJob(6, false); }

TEST(MultiProcessTest, LegacyProtocolWorkers) { RunJob(4, true); }

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc > 1) ferry::g_worker = argv[1];
  return RUN_ALL_TESTS();
}
