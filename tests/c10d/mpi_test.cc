// The "mpi" c10d backend under a real mpirun (Debian's openmpi-bin):
//  - the Backend conformance suite, one MPI rank per process, at 2 and 4
//    processes (mpi_conformance_main.cc);
//  - c10d_worker's collectives through InitProcessGroup("env://") on
//    backend "mpi": rank and size come from the OMPI_COMM_WORLD_* variables
//    mpirun sets, the store from MASTER_ADDR/MASTER_PORT (hosted here).
// Skips, saying why, when mpirun is not installed.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ferry/store/tcp_store.h"
#include "ferry/store/testing/loopback_store.h"
#include "ferry/tests/util/subprocess.h"

namespace ferry {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Debian's locations only: run through /bin (a link to /usr/bin), Open MPI
// would take "/" for its installation prefix and refuse to start.
std::string FindMpirun() {
  for (const char* p : {"/usr/bin/mpirun", "/usr/local/bin/mpirun"}) {
    if (::access(p, X_OK) == 0) return p;
  }
  return "";
}

class MpiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    mpirun_ = FindMpirun();
    if (mpirun_.empty()) {
      GTEST_SKIP() << "mpirun not found (install openmpi-bin: tools/setup)";
    }
    auto server = testutil::StartLoopbackStore();
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  // mpirun -np `np` argv... with `env` exported to every rank.
  std::pair<int, std::string> Mpirun(int np, std::vector<std::string> argv,
                                     std::map<std::string, std::string> env) {
    std::vector<std::string> cmd = {
        mpirun_, "--allow-run-as-root", "--oversubscribe", "-np",
        absl::StrCat(np),
        // Shared memory between ranks, no network; no cross-memory attach
        // (containers often forbid ptrace).
        "--mca", "btl", "self,vader", "--mca",
        "btl_vader_single_copy_mechanism", "none"};
    for (const auto& [k, v] : env) {
      cmd.push_back("-x");
      cmd.push_back(k);
    }
    cmd.insert(cmd.end(), argv.begin(), argv.end());
    // Open MPI's session directory holds Unix sockets: keep its path short.
    env["TMPDIR"] = "/tmp";
    return testutil::RunCommand(cmd, env, absl::Minutes(6));
  }

  std::string mpirun_;
  std::unique_ptr<TcpStore> server_;
};

TEST_F(MpiTest, ConformanceSuiteOnTwoAndFourProcesses) {
  const std::string suite =
      testutil::RunfilePath("tests/c10d/mpi_conformance_main");
  for (int np : {2, 4}) {
    if (np > 2) SetUp();  // A fresh store: group prefixes start again.
    // The ranks run every test, whatever filter this test was run with, and
    // leave this test's XML report alone.
    auto [code, out] =
        Mpirun(np, {suite, "--gtest_filter=*"},
               {{"FERRY_TEST_STORE_PORT", absl::StrCat(server_->port())},
                {"XML_OUTPUT_FILE", ""},
                {"TEST_PREMATURE_EXIT_FILE", ""}});
    EXPECT_EQ(code, 0) << "mpirun -np " << np << ":\n" << out;
    EXPECT_THAT(out, HasSubstr("[       OK ] Mpi/BackendConformanceTest."
                               "AllreduceEveryDtypeAndOp/Mpi"))
        << out;
    EXPECT_THAT(out, Not(HasSubstr("[  FAILED  ]"))) << out;
    // Every rank's full output beside the test's logs, and what ran here.
    if (const char* dir = std::getenv("TEST_UNDECLARED_OUTPUTS_DIR")) {
      std::string path = absl::StrCat(dir, "/mpirun_np", np, ".log");
      if (std::FILE* f = std::fopen(path.c_str(), "w")) {
        std::fwrite(out.data(), 1, out.size(), f);
        std::fclose(f);
      }
    }
    for (absl::string_view line : absl::StrSplit(out, '\n')) {
      if (absl::StrContains(line, "tests ran") ||
          absl::StrContains(line, "[  PASSED  ]") ||
          absl::StrContains(line, "[  SKIPPED ]")) {
        std::printf("np %d: %s\n", np, std::string(line).c_str());
      }
    }
  }
}

TEST_F(MpiTest, EnvInitMethodTakesRankAndSizeFromMpirun) {
  auto [code, out] = Mpirun(3,
                            {testutil::RunfilePath("tests/c10d/c10d_worker"),
                             "--init_method=env://", "--backend=mpi"},
                            {{"MASTER_ADDR", "127.0.0.1"},
                             {"MASTER_PORT", absl::StrCat(server_->port())},
                             {"FERRY_USE_AGENT_STORE", "1"}});
  EXPECT_EQ(code, 0) << out;
  // The mpi backend met through this store: each rank published its MPI
  // world rank there.
  for (int r = 0; r < 3; ++r) {
    auto v = server_->Get(absl::StrCat("default_pg/mpi/world_rank/", r));
    ASSERT_TRUE(v.ok()) << v.status();
    EXPECT_EQ(*v, absl::StrCat(r));
  }
}

}  // namespace
}  // namespace ferry
