// c10d across processes: N c10d_worker processes meet through a FileStore
// (file:// init method) or a TCPStore served by this test, run every
// collective on gloo and check the results; a rank that never starts makes
// the others fail with DeadlineExceeded instead of hanging.
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "store/tcp_store.h"

extern char** environ;

namespace ferry {
namespace {

std::string g_worker;  // Path of c10d_worker (argv[1]).

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

void RunJob(int world, const std::function<std::vector<std::string>(int)>& how,
            int skip_rank = -1) {
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    if (r == skip_rank) continue;
    std::vector<std::string> args = how(r);
    args.push_back(absl::StrCat("--rank=", r));
    args.push_back(absl::StrCat("--world_size=", world));
    pids.push_back(Spawn(args));
    ASSERT_GT(pids.back(), 0);
  }
  for (pid_t pid : pids) EXPECT_EQ(Reap(pid), 0) << "worker pid " << pid;
}

std::string FreshPath(const std::string& name) {
  std::string path =
      absl::StrCat(::testing::TempDir(), "/", name, "_", ::getpid());
  std::remove(path.c_str());
  return path;
}

TEST(C10dMultiProcessTest, FileInitMethodTwoAndFourRanks) {
  for (int world : {2, 4}) {
    std::string path = FreshPath(absl::StrCat("c10d_file_", world));
    RunJob(world, [&](int) {
      return std::vector<std::string>{
          absl::StrCat("--init_method=file://", path)};
    });
  }
}

TEST(C10dMultiProcessTest, TcpStoreThreeRanks) {
  TcpStoreOptions o;
  o.host = "127.0.0.1";
  o.port = 0;
  o.is_server = true;
  o.timeout = absl::Seconds(60);
  auto server = TcpStore::Create(o);
  ASSERT_TRUE(server.ok()) << server.status();
  int port = (*server)->port();
  RunJob(3, [&](int) {
    return std::vector<std::string>{absl::StrCat("--tcp_port=", port)};
  });
}

TEST(C10dMultiProcessTest, RankThatNeverStartsGivesDeadlineExceeded) {
  std::string path = FreshPath("c10d_missing");
  RunJob(
      3,
      [&](int) {
        return std::vector<std::string>{
            absl::StrCat("--init_method=file://", path), "--timeout_ms=1000",
            "--mode=expect_deadline"};
      },
      /*skip_rank=*/2);
  std::remove(path.c_str());
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s <path to c10d_worker>\n", argv[0]);
    return 2;
  }
  ferry::g_worker = argv[1];
  return RUN_ALL_TESTS();
}
