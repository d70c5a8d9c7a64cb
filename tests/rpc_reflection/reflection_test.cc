// Inspection of a Ferry worker by a gRPC reflection client Ferry did not
// write: npm's grpc-js-reflection-client on @grpc/grpc-js (see
// reflection_client.js).
//
//   reflection_test <reflection_worker> <reflection_client.js> <prepare.sh>
//
// The Node packages live outside the repository, in $FERRY_NPM_DIR or else
// ~/.cache/ferry-npm; prepare.sh fills that directory (tools/setup runs it).
// When it is empty the test runs prepare.sh itself, and when node/npm are
// missing or the install fails (no network) the test is skipped, saying why.
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "ferry/proto/admin.pb.h"
#include "ferry/tests/util/subprocess.h"
#include "ferry/tests/util/test_pki.h"

namespace {

std::string g_worker, g_client, g_prepare;

bool IsFile(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::optional<std::string> FindInPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  for (absl::string_view dir :
       absl::StrSplit(path ? path : "/usr/bin:/bin", ':')) {
    std::string candidate = absl::StrCat(dir, "/", name);
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return std::nullopt;
}

std::string NpmDir() {
  if (const char* dir = std::getenv("FERRY_NPM_DIR"); dir && *dir) return dir;
  // Bazel points HOME at the test's scratch directory; the cache belongs to
  // the user.
  const passwd* pw = getpwuid(getuid());
  std::string home = pw && pw->pw_dir ? pw->pw_dir : "";
  if (home.empty() && std::getenv("HOME")) home = std::getenv("HOME");
  return absl::StrCat(home, "/.cache/ferry-npm");
}

using ferry::testutil::RunCommand;
using ferry::testutil::Subprocess;

// "RESULT <what> <json>" lines from the client.
std::map<std::string, std::string> ParseResults(const std::string& output) {
  std::map<std::string, std::string> results;
  for (absl::string_view line : absl::StrSplit(output, '\n')) {
    if (!absl::ConsumePrefix(&line, "RESULT ")) continue;
    size_t space = line.find(' ');
    if (space == absl::string_view::npos) continue;
    results[std::string(line.substr(0, space))] =
        std::string(line.substr(space + 1));
  }
  return results;
}

// Parses a JSON array of strings or objects through protobuf's JSON parser.
google::protobuf::ListValue ParseList(const std::string& json) {
  google::protobuf::Value value;
  auto s = google::protobuf::util::JsonStringToMessage(json, &value);
  EXPECT_TRUE(s.ok()) << s.ToString() << " in " << json;
  EXPECT_TRUE(value.has_list_value()) << json;
  return value.list_value();
}

template <typename M>
M ParseMessage(const std::string& json) {
  M m;
  auto s = google::protobuf::util::JsonStringToMessage(json, &m);
  EXPECT_TRUE(s.ok()) << s.ToString() << " in " << json;
  return m;
}

// Finds node and the prepared Node packages; on failure, *skip says why.
struct NodeSetup {
  std::string node;
  std::string npm_dir;
};
std::optional<NodeSetup> PrepareNode(std::string* skip) {
  std::optional<std::string> node = FindInPath("node");
  if (!node) node = FindInPath("nodejs");
  if (!node) {
    *skip = "SKIPPED: node is not installed (Debian: nodejs)";
    return std::nullopt;
  }
  // prepare.sh returns at once when the packages are already there. Inside
  // Bazel's sandbox the user's cache is read-only: when it is not prepared,
  // install into the test's scratch directory instead (network permitting).
  std::string npm_dir = NpmDir();
  const std::map<std::string, std::string> npm_env = {
      {"FERRY_NPM_TIMEOUT", "35"}};
  auto [prepared, why] =
      RunCommand({"/bin/bash", g_prepare, npm_dir}, npm_env, absl::Seconds(40));
  const std::string parent = npm_dir.substr(0, npm_dir.rfind('/'));
  const char* scratch = std::getenv("TEST_TMPDIR");
  if (prepared != 0 && access(parent.c_str(), W_OK) != 0 && scratch) {
    npm_dir = absl::StrCat(scratch, "/ferry-npm");
    std::tie(prepared, why) = RunCommand({"/bin/bash", g_prepare, npm_dir},
                                         npm_env, absl::Seconds(40));
  }
  if (prepared != 0) {
    *skip = absl::StrCat(
        "SKIPPED: the Node reflection client is not installed in ", npm_dir,
        " and could not be installed (", absl::StripAsciiWhitespace(why),
        "); run tests/rpc_reflection/prepare.sh with network access, or set "
        "FERRY_NPM_DIR to a prepared directory");
    return std::nullopt;
  }
  return NodeSetup{*node, npm_dir};
}

struct Inspection {
  std::string address;
  int rc = -1;  // the client's exit status
  std::string output;
  std::map<std::string, std::string> results;
};

// Starts reflection_worker with `worker_args`, runs the Node client against
// it with `client_args` after the address, and stops the worker (which must
// exit cleanly).
Inspection Inspect(const NodeSetup& setup,
                   const std::vector<std::string>& worker_args,
                   const std::vector<std::string>& client_args) {
  Inspection out;
  std::vector<std::string> argv = {g_worker, "--name=inspector"};
  argv.insert(argv.end(), worker_args.begin(), worker_args.end());
  auto spawned = Subprocess::Spawn(argv, ferry::testutil::SpawnOptions()
                                             .PipeStdin()
                                             .CaptureStdout()
                                             .MergeStderr());
  EXPECT_TRUE(spawned.ok()) << spawned.status();
  if (!spawned.ok()) return out;
  Subprocess& worker = **spawned;
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  std::string banner = worker.ReadUntil(deadline, [](const auto& t) {
    return t.find("ADDRESS ") != std::string::npos &&
           t.find('\n', t.find("ADDRESS ")) != std::string::npos;
  });
  size_t at = banner.find("ADDRESS ");
  EXPECT_NE(at, std::string::npos) << "worker said: " << banner;
  if (at == std::string::npos) return out;
  out.address = std::string(absl::StripAsciiWhitespace(
      banner.substr(at + 8, banner.find('\n', at) - at - 8)));
  EXPECT_TRUE(absl::StartsWith(out.address, "127.0.0.1:")) << out.address;

  std::vector<std::string> client = {setup.node, g_client, out.address};
  client.insert(client.end(), client_args.begin(), client_args.end());
  std::tie(out.rc, out.output) =
      RunCommand(client, {{"NODE_PATH", setup.npm_dir + "/node_modules"}},
                 absl::Seconds(30));

  // Closing the worker's stdin asks it to shut down gracefully.
  worker.CloseStdin();
  const absl::Time stop_deadline = absl::Now() + absl::Seconds(15);
  std::string worker_log = worker.ReadAll(stop_deadline);
  absl::StatusOr<int> worker_rc = worker.Wait(stop_deadline);
  EXPECT_EQ(worker_rc.value_or(-1), 0)
      << worker_rc.status() << "; worker log:\n"
      << banner << worker_log;
  out.results = ParseResults(out.output);
  return out;
}

// Health through reflection-resolved descriptors: Check and Watch.
void ExpectHealthy(std::map<std::string, std::string>& results,
                   const std::string& output) {
  EXPECT_EQ(results["health"], R"({"status":"SERVING"})") << output;
  EXPECT_EQ(results["health_watch"], R"({"status":"SERVING"})") << output;
}

// Invoke of greet("ops", 2) and of an unknown function.
void ExpectInvoke(std::map<std::string, std::string>& results,
                  const std::string& output) {
  ASSERT_TRUE(results.contains("invoke")) << output;
  google::protobuf::Struct invoke;
  auto s =
      google::protobuf::util::JsonStringToMessage(results["invoke"], &invoke);
  ASSERT_TRUE(s.ok()) << s.ToString() << " in " << results["invoke"];
  EXPECT_EQ(invoke.fields()
                .at("result")
                .struct_value()
                .fields()
                .at("string_value")
                .string_value(),
            "hello opshello ops")
      << results["invoke"];
  EXPECT_TRUE(absl::StrContains(results["invoke_unknown_error"], "'nope'"))
      << results["invoke_unknown_error"];
  EXPECT_TRUE(absl::StartsWith(results["invoke_unknown_error"], "\"Invoke: 5 "))
      << results["invoke_unknown_error"];  // 5 = NOT_FOUND
}

TEST(RpcReflection, NodeReflectionClientInspectsAWorker) {
  std::string skip;
  std::optional<NodeSetup> setup = PrepareNode(&skip);
  if (!setup) GTEST_SKIP() << skip;
  Inspection run = Inspect(*setup, {"--enable_invoke"}, {});
  const std::string& address = run.address;
  const std::string& output = run.output;
  std::map<std::string, std::string>& results = run.results;
  ASSERT_EQ(run.rc, 0) << "reflection client failed:\n" << output;

  // 1. Services, as listed through server reflection.
  ASSERT_TRUE(results.contains("services")) << output;
  std::set<std::string> services;
  const google::protobuf::ListValue service_list =
      ParseList(results["services"]);
  for (const auto& v : service_list.values()) {
    services.insert(v.string_value());
  }
  for (const char* want :
       {"ferry.rpc.v1.Worker", "ferry.admin.v1.Admin", "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection"}) {
    EXPECT_TRUE(services.contains(want))
        << want << " missing from " << results["services"];
  }

  // 2. The admin service described by reflection.
  ASSERT_TRUE(results.contains("admin_methods")) << output;
  std::map<std::string, std::string> methods;  // name -> "request>response"
  const google::protobuf::ListValue method_list =
      ParseList(results["admin_methods"]);
  for (const auto& m : method_list.values()) {
    const auto& f = m.struct_value().fields();
    methods[f.at("name").string_value()] = absl::StrCat(
        f.at("request").string_value(), ">", f.at("response").string_value());
  }
  EXPECT_EQ(methods["GetWorkerInfo"], "WorkerInfoRequest>WorkerInfo");
  EXPECT_EQ(methods["ListWorkers"], "ListWorkersRequest>ListWorkersResponse");
  EXPECT_EQ(methods["ListFunctions"],
            "ListFunctionsRequest>ListFunctionsResponse");
  EXPECT_EQ(methods["GetStats"], "GetStatsRequest>GetStatsResponse");
  std::set<std::string> fields;
  const google::protobuf::ListValue field_list =
      ParseList(results["worker_info_fields"]);
  for (const auto& v : field_list.values()) {
    fields.insert(v.string_value());
  }
  EXPECT_EQ(fields,
            (std::set<std::string>{"name", "rank", "world_size", "address",
                                   "uptime_seconds", "version", "pid"}));

  // 3. Admin calls made with JSON; the answers are read back as the admin
  // protos, which also proves they render as (proto-compatible) JSON.
  auto info =
      ParseMessage<ferry::admin::v1::WorkerInfo>(results["worker_info"]);
  EXPECT_EQ(info.name(), "inspector");
  EXPECT_EQ(info.rank(), 0);
  EXPECT_EQ(info.world_size(), 1);
  EXPECT_EQ(info.address(), address);
  EXPECT_GT(info.pid(), 0);
  EXPECT_GE(info.uptime_seconds(), 0.0);
  EXPECT_TRUE(absl::StartsWith(info.version(), "ferry")) << info.version();

  auto functions = ParseMessage<ferry::admin::v1::ListFunctionsResponse>(
      results["functions"]);
  std::map<std::string, ferry::admin::v1::FunctionInfo> by_name;
  for (const auto& f : functions.functions()) by_name[f.name()] = f;
  ASSERT_EQ(by_name.size(), 3u) << results["functions"];
  EXPECT_EQ(by_name["add"].signature(), "(Tensor, Tensor) -> Tensor");
  EXPECT_EQ(by_name["greet"].signature(), "(string, int64) -> string");
  EXPECT_EQ(by_name["later"].signature(), "(int64) -> int64");
  EXPECT_TRUE(by_name["later"].is_async());
  EXPECT_FALSE(by_name["add"].is_async());
  EXPECT_EQ(by_name["add"].doc(), "Element-wise sum of two tensors.");

  auto workers =
      ParseMessage<ferry::admin::v1::ListWorkersResponse>(results["workers"]);
  ASSERT_EQ(workers.workers_size(), 1);
  EXPECT_EQ(workers.workers(0).name(), "inspector");
  auto stats =
      ParseMessage<ferry::admin::v1::GetStatsResponse>(results["stats"]);
  EXPECT_EQ(stats.total_errors(), 0u);

  EXPECT_EQ(methods["Invoke"], "InvokeRequest>InvokeResponse");
  ExpectInvoke(results, output);

  // 4. Health, described by reflection.
  ExpectHealthy(results, output);
}

// The same client over mutual TLS, with a CA and certificates made now; a
// client without a certificate is refused.
TEST(RpcReflection, NodeClientOverMutualTls) {
  std::string skip;
  std::optional<NodeSetup> setup = PrepareNode(&skip);
  if (!setup) GTEST_SKIP() << skip;
  auto pki = ferry::testutil::MakeTestPki(testing::TempDir() + "/pki");
  ASSERT_TRUE(pki.ok()) << pki.status();
  const std::vector<std::string> worker = {
      "--enable_invoke", "--tls_ca=" + pki->ca, "--tls_cert=" + pki->alice.cert,
      "--tls_key=" + pki->alice.key, "--require_client_cert"};
  Inspection run =
      Inspect(*setup, worker, {pki->ca, pki->bob.cert, pki->bob.key});
  ASSERT_EQ(run.rc, 0) << "reflection client failed:\n" << run.output;
  auto info =
      ParseMessage<ferry::admin::v1::WorkerInfo>(run.results["worker_info"]);
  EXPECT_EQ(info.name(), "inspector");
  ExpectInvoke(run.results, run.output);
  ExpectHealthy(run.results, run.output);

  // Trusting the CA but showing no certificate: refused in the handshake.
  Inspection anonymous = Inspect(*setup, worker, {pki->ca});
  EXPECT_NE(anonymous.rc, 0) << anonymous.output;
  EXPECT_FALSE(anonymous.results.contains("services")) << anonymous.output;
}

}  // namespace

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  if (argc != 4 || !IsFile(argv[1]) || !IsFile(argv[2]) || !IsFile(argv[3])) {
    fprintf(stderr, "usage: %s <reflection_worker> <client.js> <prepare.sh>\n",
            argv[0]);
    return 2;
  }
  g_worker = argv[1];
  g_client = argv[2];
  g_prepare = argv[3];
  signal(SIGPIPE, SIG_IGN);
  return RUN_ALL_TESTS();
}
