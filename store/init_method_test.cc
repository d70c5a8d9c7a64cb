#include "ferry/store/init_method.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ferry/store/hash_store.h"
#include "ferry/store/prefix_store.h"

namespace ferry {
namespace {

using ::testing::HasSubstr;

EnvLookup FakeEnv(std::map<std::string, std::string> vars) {
  return [vars](absl::string_view name) -> std::optional<std::string> {
    auto it = vars.find(std::string(name));
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

const EnvLookup kEmptyEnv = FakeEnv({});

void ExpectInvalid(absl::string_view url, absl::string_view needle,
                   const EnvLookup& env = kEmptyEnv) {
  absl::StatusOr<InitMethod> method = ParseInitMethod(url, env);
  EXPECT_EQ(method.status().code(), absl::StatusCode::kInvalidArgument)
      << url << " -> " << method.status();
  EXPECT_THAT(std::string(method.status().message()), HasSubstr(needle)) << url;
}

TEST(ParseInitMethodTest, Tcp) {
  auto method = ParseInitMethod("tcp://10.1.2.3:29500", kEmptyEnv);
  ASSERT_TRUE(method.ok()) << method.status();
  EXPECT_EQ(method->scheme, InitMethod::Scheme::kTcp);
  EXPECT_EQ(method->host, "10.1.2.3");
  EXPECT_EQ(method->port, 29500);
  EXPECT_FALSE(method->rank.has_value());
  EXPECT_FALSE(method->world_size.has_value());
  EXPECT_EQ(method->ToString(), "tcp://10.1.2.3:29500");
}

TEST(ParseInitMethodTest, TcpHostnameIpv6AndQuery) {
  auto method = ParseInitMethod("tcp://master-0.svc:1234/", kEmptyEnv);
  ASSERT_TRUE(method.ok()) << method.status();
  EXPECT_EQ(method->host, "master-0.svc");
  EXPECT_EQ(method->port, 1234);

  method = ParseInitMethod("tcp://[::1]:80?rank=2&world_size=4", kEmptyEnv);
  ASSERT_TRUE(method.ok()) << method.status();
  EXPECT_EQ(method->host, "::1");
  EXPECT_EQ(method->port, 80);
  EXPECT_EQ(method->rank, 2);
  EXPECT_EQ(method->world_size, 4);
  EXPECT_EQ(method->ToString(), "tcp://[::1]:80?rank=2&world_size=4");

  method = ParseInitMethod("tcp://127.0.0.1:0", kEmptyEnv);
  ASSERT_TRUE(method.ok()) << method.status();
  EXPECT_EQ(method->port, 0);
}

TEST(ParseInitMethodTest, TcpErrors) {
  ExpectInvalid("tcp://host", "missing ':port'");
  ExpectInvalid("tcp://host:", "port ''");
  ExpectInvalid("tcp://host:http", "port 'http'");
  ExpectInvalid("tcp://host:65536", "port '65536'");
  ExpectInvalid("tcp://host:-1", "port '-1'");
  ExpectInvalid("tcp://host:99999999999999999999", "not a port number");
  ExpectInvalid("tcp://:29500", "empty host");
  ExpectInvalid("tcp://", "missing host:port");
  ExpectInvalid("tcp://::1:80", "brackets");
  ExpectInvalid("tcp://[::1:80", "unterminated");
  ExpectInvalid("tcp://[::1]80", "missing ':port'");
  ExpectInvalid("tcp://h:1/path", "unexpected path");
  ExpectInvalid("tcp://h:1?rank=x", "rank 'x'");
  ExpectInvalid("tcp://h:1?world_size=0", "world_size '0'");
  ExpectInvalid("tcp://h:1?color=red", "unknown query parameter 'color'");
  ExpectInvalid("tcp://h:1?rank=4&world_size=4", "not below world_size");
}

TEST(ParseInitMethodTest, File) {
  auto method = ParseInitMethod("file:///tmp/ferry/store", kEmptyEnv);
  ASSERT_TRUE(method.ok()) << method.status();
  EXPECT_EQ(method->scheme, InitMethod::Scheme::kFile);
  EXPECT_EQ(method->path, "/tmp/ferry/store");
  EXPECT_EQ(method->ToString(), "file:///tmp/ferry/store");

  method = ParseInitMethod("file://localhost/tmp/s?world_size=3", kEmptyEnv);
  ASSERT_TRUE(method.ok()) << method.status();
  EXPECT_EQ(method->path, "/tmp/s");
  EXPECT_EQ(method->world_size, 3);
}

TEST(ParseInitMethodTest, FileErrors) {
  ExpectInvalid("file://relative/path", "absolute path");
  ExpectInvalid("file://", "absolute path");
  ExpectInvalid("file:///", "must name a file");
  ExpectInvalid("file:///tmp/dir/", "must name a file");
}

TEST(ParseInitMethodTest, Env) {
  auto method = ParseInitMethod("env://", FakeEnv({{"MASTER_ADDR", "10.0.0.1"},
                                                   {"MASTER_PORT", "29501"},
                                                   {"RANK", "3"},
                                                   {"WORLD_SIZE", "8"}}));
  ASSERT_TRUE(method.ok()) << method.status();
  EXPECT_EQ(method->scheme, InitMethod::Scheme::kEnv);
  EXPECT_EQ(method->host, "10.0.0.1");
  EXPECT_EQ(method->port, 29501);
  EXPECT_EQ(method->rank, 3);
  EXPECT_EQ(method->world_size, 8);

  // RANK and WORLD_SIZE are optional; the query overrides them.
  method = ParseInitMethod(
      "env://?rank=1",
      FakeEnv({{"MASTER_ADDR", "[::1]"}, {"MASTER_PORT", "1"}, {"RANK", "0"}}));
  ASSERT_TRUE(method.ok()) << method.status();
  EXPECT_EQ(method->host, "::1");
  EXPECT_EQ(method->rank, 1);
  EXPECT_FALSE(method->world_size.has_value());
}

TEST(ParseInitMethodTest, EnvErrorsNameTheVariable) {
  ExpectInvalid("env://", "MASTER_ADDR is not set");
  ExpectInvalid("env://", "MASTER_PORT is not set",
                FakeEnv({{"MASTER_ADDR", "h"}}));
  ExpectInvalid("env://", "MASTER_PORT 'x'",
                FakeEnv({{"MASTER_ADDR", "h"}, {"MASTER_PORT", "x"}}));
  ExpectInvalid(
      "env://", "RANK 'one'",
      FakeEnv({{"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}, {"RANK", "one"}}));
  ExpectInvalid(
      "env://", "WORLD_SIZE '-2'",
      FakeEnv(
          {{"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}, {"WORLD_SIZE", "-2"}}));
  ExpectInvalid("env://host:1", "takes no host");
}

TEST(ParseInitMethodTest, OtherErrors) {
  ExpectInvalid("", "expected scheme://");
  ExpectInvalid("localhost:29500", "expected scheme://");
  ExpectInvalid("udp://h:1", "unknown scheme 'udp'");
}

TEST(ParseInitMethodTest, ReadsProcessEnvironmentByDefault) {
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", "4242", 1);
  auto method = ParseInitMethod("env://");
  unsetenv("MASTER_ADDR");
  unsetenv("MASTER_PORT");
  ASSERT_TRUE(method.ok()) << method.status();
  EXPECT_EQ(method->port, 4242);
}

std::string TempPath(absl::string_view tag) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir != nullptr ? dir : "/tmp", "/init_", tag, "_",
                      getpid());
}

TEST(CreateStoreTest, FileMakesAFileStore) {
  const std::string path = TempPath("file");
  auto method = ParseInitMethod("file://" + path + "?world_size=2", kEmptyEnv);
  ASSERT_TRUE(method.ok()) << method.status();
  auto rank0 = CreateStore(*method, 0, -1, absl::Seconds(5));
  auto rank1 = CreateStore(*method, 1, 2, absl::Seconds(5));
  ASSERT_TRUE(rank0.ok()) << rank0.status();
  ASSERT_TRUE(rank1.ok()) << rank1.status();
  EXPECT_EQ((*rank0)->Describe(), "file://" + path);
  EXPECT_EQ((*rank0)->Timeout(), absl::Seconds(5));
  ASSERT_TRUE((*rank0)->Set("k", "v").ok());
  EXPECT_EQ((*rank1)->Get("k").value_or(""), "v");
}

TEST(CreateStoreTest, TcpAndEnvGoThroughTheFactory) {
  struct Call {
    std::string host;
    int port;
    bool is_server;
    int world_size;
    absl::Duration timeout;
  };
  std::vector<Call> calls;
  StoreFactories factories;
  factories.tcp =
      [&](const std::string& host, int port, bool is_server, int world_size,
          absl::Duration timeout) -> absl::StatusOr<std::unique_ptr<Store>> {
    calls.push_back({host, port, is_server, world_size, timeout});
    return std::make_unique<HashStore>();
  };
  auto tcp = ParseInitMethod("tcp://127.0.0.1:29500", kEmptyEnv);
  ASSERT_TRUE(tcp.ok());
  auto store = CreateStore(*tcp, 0, 4, absl::Seconds(9), factories);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->Timeout(), absl::Seconds(9));
  store = CreateStore(*tcp, 3, 4, absl::Seconds(9), factories);
  ASSERT_TRUE(store.ok()) << store.status();

  auto env = ParseInitMethod("env://", FakeEnv({{"MASTER_ADDR", "h"},
                                                {"MASTER_PORT", "7"},
                                                {"RANK", "1"},
                                                {"WORLD_SIZE", "2"}}));
  ASSERT_TRUE(env.ok());
  store = CreateStore(*env, -1, -1, absl::Seconds(1), factories);
  ASSERT_TRUE(store.ok()) << store.status();

  ASSERT_EQ(calls.size(), 3u);
  EXPECT_EQ(calls[0].host, "127.0.0.1");
  EXPECT_EQ(calls[0].port, 29500);
  EXPECT_TRUE(calls[0].is_server);
  EXPECT_EQ(calls[0].world_size, 4);
  EXPECT_EQ(calls[0].timeout, absl::Seconds(9));
  EXPECT_FALSE(calls[1].is_server);
  EXPECT_EQ(calls[2].host, "h");
  EXPECT_EQ(calls[2].port, 7);
  EXPECT_FALSE(calls[2].is_server);
  EXPECT_EQ(calls[2].world_size, 2);
}

TEST(CreateStoreTest, Errors) {
  auto tcp = ParseInitMethod("tcp://127.0.0.1:29500", kEmptyEnv);
  ASSERT_TRUE(tcp.ok());
  // No factory.
  auto store = CreateStore(*tcp, 0, 1, absl::Seconds(1));
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(store.status().message()), HasSubstr("factory"));
  // Rank and world size.
  store = CreateStore(*tcp, 2, 2, absl::Seconds(1));
  EXPECT_EQ(store.status().code(), absl::StatusCode::kInvalidArgument);
  store = CreateStore(*tcp, -1, 2, absl::Seconds(1));
  EXPECT_EQ(store.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(store.status().message()), HasSubstr("no rank"));
  auto with_rank = ParseInitMethod("tcp://h:1?rank=1&world_size=2", kEmptyEnv);
  ASSERT_TRUE(with_rank.ok());
  store = CreateStore(*with_rank, 0, 2, absl::Seconds(1));
  EXPECT_EQ(store.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(store.status().message()), HasSubstr("disagrees"));
  // A client cannot connect to port 0.
  StoreFactories factories;
  factories.tcp = [](const std::string&, int, bool, int,
                     absl::Duration) -> absl::StatusOr<std::unique_ptr<Store>> {
    return std::make_unique<HashStore>();
  };
  auto port0 = ParseInitMethod("tcp://h:0", kEmptyEnv);
  ASSERT_TRUE(port0.ok());
  EXPECT_TRUE(CreateStore(*port0, 0, 2, absl::Seconds(1), factories).ok());
  EXPECT_EQ(
      CreateStore(*port0, 1, 2, absl::Seconds(1), factories).status().code(),
      absl::StatusCode::kInvalidArgument);
  // Factory errors pass through.
  factories.tcp = [](const std::string&, int, bool, int,
                     absl::Duration) -> absl::StatusOr<std::unique_ptr<Store>> {
    return absl::UnavailableError("connect refused");
  };
  EXPECT_EQ(
      CreateStore(*tcp, 1, 2, absl::Seconds(1), factories).status().code(),
      absl::StatusCode::kUnavailable);
}

// --- Launcher environments (env:// without RANK / WORLD_SIZE) --------------

void ExpectRanks(const absl::StatusOr<InitMethod>& m, int rank, int world_size,
                 int local_rank, const std::string& source) {
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->rank, rank);
  EXPECT_EQ(m->world_size, world_size);
  EXPECT_EQ(m->local_rank, local_rank);
  EXPECT_EQ(m->env_source, source);
}

TEST(ParseInitMethodTest, EnvPrefersRankWorldSizeOverLaunchers) {
  auto m = ParseInitMethod("env://", FakeEnv({{"MASTER_ADDR", "h"},
                                              {"MASTER_PORT", "1"},
                                              {"RANK", "1"},
                                              {"WORLD_SIZE", "2"},
                                              {"LOCAL_RANK", "1"},
                                              {"OMPI_COMM_WORLD_RANK", "5"},
                                              {"OMPI_COMM_WORLD_SIZE", "8"},
                                              {"SLURM_PROCID", "6"},
                                              {"SLURM_NTASKS", "9"}}));
  ExpectRanks(m, 1, 2, 1, "RANK/WORLD_SIZE");
}

TEST(ParseInitMethodTest, EnvOpenMpi) {
  auto m =
      ParseInitMethod("env://", FakeEnv({{"MASTER_ADDR", "10.0.0.1"},
                                         {"MASTER_PORT", "29500"},
                                         {"OMPI_COMM_WORLD_RANK", "3"},
                                         {"OMPI_COMM_WORLD_SIZE", "4"},
                                         {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                         {"SLURM_PROCID", "0"},
                                         {"SLURM_NTASKS", "1"}}));
  ExpectRanks(m, 3, 4, 1, "OpenMPI");
  EXPECT_EQ(m->host, "10.0.0.1");
  // OpenMPI does not say where the store is.
  ExpectInvalid("env://", "MASTER_ADDR is not set",
                FakeEnv({{"MASTER_PORT", "1"},
                         {"OMPI_COMM_WORLD_RANK", "0"},
                         {"OMPI_COMM_WORLD_SIZE", "2"}}));
  ExpectInvalid("env://", "OMPI_COMM_WORLD_SIZE 'x'",
                FakeEnv({{"MASTER_ADDR", "h"},
                         {"MASTER_PORT", "1"},
                         {"OMPI_COMM_WORLD_RANK", "0"},
                         {"OMPI_COMM_WORLD_SIZE", "x"}}));
  ExpectInvalid("env://", "rank 4 is not below world_size 4",
                FakeEnv({{"MASTER_ADDR", "h"},
                         {"MASTER_PORT", "1"},
                         {"OMPI_COMM_WORLD_RANK", "4"},
                         {"OMPI_COMM_WORLD_SIZE", "4"}}));
}

TEST(ParseInitMethodTest, EnvSlurmTakesTheFirstHostOfTheStep) {
  auto m = ParseInitMethod(
      "env://", FakeEnv({{"MASTER_PORT", "29500"},
                         {"SLURM_PROCID", "5"},
                         {"SLURM_NTASKS", "8"},
                         {"SLURM_LOCALID", "1"},
                         {"SLURM_STEP_NODELIST", "gpu[07-09,12],cpu1"},
                         {"SLURM_JOB_NODELIST", "other1"}}));
  ExpectRanks(m, 5, 8, 1, "Slurm");
  EXPECT_EQ(m->host, "gpu07");
  // An explicit MASTER_ADDR wins; SLURM_NPROCS stands in for SLURM_NTASKS;
  // the job's node list serves when the step's is absent.
  m = ParseInitMethod("env://", FakeEnv({{"MASTER_ADDR", "10.1.1.1"},
                                         {"MASTER_PORT", "1"},
                                         {"SLURM_PROCID", "0"},
                                         {"SLURM_NPROCS", "2"},
                                         {"SLURM_STEP_NODELIST", "n[1-2]"}}));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->host, "10.1.1.1");
  EXPECT_EQ(m->world_size, 2);
  m = ParseInitMethod("env://", FakeEnv({{"MASTER_PORT", "1"},
                                         {"SLURM_PROCID", "0"},
                                         {"SLURM_NTASKS", "2"},
                                         {"SLURM_JOB_NODELIST", "node3"}}));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->host, "node3");
  ExpectInvalid("env://", "unterminated '['",
                FakeEnv({{"MASTER_PORT", "1"},
                         {"SLURM_PROCID", "0"},
                         {"SLURM_NTASKS", "1"},
                         {"SLURM_STEP_NODELIST", "n[1-2"}}));
}

TEST(FirstSlurmHostTest, Forms) {
  EXPECT_EQ(*FirstSlurmHost("node1"), "node1");
  EXPECT_EQ(*FirstSlurmHost("node1,node2"), "node1");
  EXPECT_EQ(*FirstSlurmHost("node[003-010]"), "node003");
  EXPECT_EQ(*FirstSlurmHost("rack[2,4]-n[10-11],x"), "rack2-n10");
  EXPECT_EQ(*FirstSlurmHost("a-b.c[5]"), "a-b.c5");
  for (const char* bad : {"", ",n1", "n[x-2]", "n[]", "n]", "n[1"}) {
    EXPECT_EQ(FirstSlurmHost(bad).status().code(),
              absl::StatusCode::kInvalidArgument)
        << bad;
  }
}

// --- ferry_run generations ---------------------------------------------------

TEST(ScopeToLauncherGenerationTest, PrefixesAndRefusesStaleWorkers) {
  auto base = std::make_shared<HashStore>();
  // Without the variable the store is untouched.
  auto plain =
      ScopeToLauncherGeneration(std::make_unique<HashStore>(), kEmptyEnv);
  ASSERT_TRUE(plain.ok());
  ASSERT_TRUE((*plain)->Set("k", "v").ok());
  EXPECT_TRUE(*(*plain)->Check({"k"}));

  // A worker of the current generation writes under its attempt's prefix.
  ASSERT_TRUE(base->Set("root/ferry_run/generation", "1").ok());
  auto current =
      ScopeToLauncherGeneration(std::make_unique<PrefixStore>("root", base),
                                FakeEnv({{"FERRY_RUN_GENERATION", "1"}}));
  ASSERT_TRUE(current.ok()) << current.status();
  ASSERT_TRUE((*current)->Set("rpc", "x").ok());
  EXPECT_TRUE(*base->Check({"root/ferry_run/attempt_1/rpc"}));

  // A worker of generation 0 is refused, naming both generations.
  auto stale =
      ScopeToLauncherGeneration(std::make_unique<PrefixStore>("root", base),
                                FakeEnv({{"FERRY_RUN_GENERATION", "0"}}));
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(stale.status().message()),
              HasSubstr("generation 0 refused"));
  EXPECT_THAT(std::string(stale.status().message()),
              HasSubstr("at generation 1"));

  auto bad = ScopeToLauncherGeneration(
      std::make_unique<HashStore>(), FakeEnv({{"FERRY_RUN_GENERATION", "-1"}}));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ferry
