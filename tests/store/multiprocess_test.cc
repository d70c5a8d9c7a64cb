// TCPStore across processes: a server handle in this process, workers in
// child processes (tcp_store_worker), joined through wait_for_workers and
// synchronised with the store-based barrier; both protocol generations.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "store/tcp_store.h"

extern char** environ;

namespace ferry {
namespace {

std::string g_worker;  // path of tcp_store_worker (argv[1])

pid_t Spawn(const std::vector<std::string>& args) {
  std::vector<std::string> argv_s = {g_worker};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  if (posix_spawn(&pid, g_worker.c_str(), nullptr, nullptr, argv.data(),
                  environ) != 0) {
    return -1;
  }
  return pid;
}

int Reap(pid_t pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

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
  std::vector<pid_t> pids;
  for (int r = 1; r <= workers; ++r) {
    pids.push_back(
        Spawn({absl::StrCat("--port=", (*store)->port()),
               absl::StrCat("--rank=", r), absl::StrCat("--world_size=", world),
               absl::StrCat("--legacy=", legacy ? "true" : "false")}));
    ASSERT_GT(pids.back(), 0);
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
  for (pid_t pid : pids) EXPECT_EQ(Reap(pid), 0);
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
