#include "ferry/c10d/plugin.h"

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "ferry/c10d/default_registry.h"
#include "ferry/c10d/registry.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ferry::c10d {
namespace {

using ::testing::HasSubstr;

// Test plugins, from the test's runfiles directory (its working directory).
const std::string kPlugin = "c10d/libplugin_test_backend.so";
const std::string kNoEntry = "c10d/libplugin_test_no_entry.so";

TEST(LoadBackendPlugin, RegistersItsBackendAndItsFactoryRuns) {
  BackendRegistry registry;
  absl::StatusOr<std::vector<std::string>> added =
      LoadBackendPlugin(kPlugin, registry);
  ASSERT_TRUE(added.ok()) << added.status();
  EXPECT_EQ(*added, std::vector<std::string>{"plugin_test"});
  EXPECT_TRUE(registry.IsRegistered("plugin_test"));
  BackendConfig config;
  config.rank = 0;
  auto backend = registry.Create("plugin_test", config);
  ASSERT_FALSE(backend.ok());
  EXPECT_EQ(backend.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(backend.status().message()),
              HasSubstr("made by libplugin_test_backend.so for rank 0"));
}

TEST(LoadBackendPlugin, TakenNameNamesTheFileAndTheBackend) {
  BackendRegistry registry;
  ASSERT_TRUE(registry
                  .RegisterBackend("plugin_test",
                                   [](const BackendConfig&)
                                       -> absl::StatusOr<std::unique_ptr<Backend>> {
                                     return absl::InternalError("in-tree one");
                                   })
                  .ok());
  absl::StatusOr<std::vector<std::string>> added =
      LoadBackendPlugin(kPlugin, registry);
  ASSERT_FALSE(added.ok());
  EXPECT_EQ(added.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(added.status().message()), HasSubstr(kPlugin));
  EXPECT_THAT(std::string(added.status().message()),
              HasSubstr("'plugin_test'"));
  // The registered one is untouched.
  auto backend = registry.Create("plugin_test", BackendConfig{});
  EXPECT_THAT(std::string(backend.status().message()), HasSubstr("in-tree one"));
}

TEST(LoadBackendPlugin, LoadingTwiceIntoOneRegistryIsATakenName) {
  BackendRegistry registry;
  ASSERT_TRUE(LoadBackendPlugin(kPlugin, registry).ok());
  absl::StatusOr<std::vector<std::string>> again =
      LoadBackendPlugin(kPlugin, registry);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(again.status().message()), HasSubstr(kPlugin));
}

TEST(LoadBackendPlugin, MissingFileNamesTheFile) {
  BackendRegistry registry;
  const std::string path = "c10d/no_such_plugin.so";
  absl::StatusOr<std::vector<std::string>> added =
      LoadBackendPlugin(path, registry);
  EXPECT_EQ(added.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(added.status().message()), HasSubstr(path));
  EXPECT_TRUE(registry.Names().empty());
}

TEST(LoadBackendPlugin, NoEntryPointNamesTheFileAndTheSymbol) {
  BackendRegistry registry;
  absl::StatusOr<std::vector<std::string>> added =
      LoadBackendPlugin(kNoEntry, registry);
  EXPECT_EQ(added.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(added.status().message()), HasSubstr(kNoEntry));
  EXPECT_THAT(std::string(added.status().message()),
              HasSubstr("ferry_c10d_plugin_init"));
}

TEST(LoadBackendPlugins, ListErrorsNameTheVariableAndTheFile) {
  BackendRegistry registry;
  absl::Status s = LoadBackendPlugins(kPlugin + ":c10d/absent.so", registry,
                                      "FERRY_C10D_PLUGINS");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), HasSubstr("FERRY_C10D_PLUGINS"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("c10d/absent.so"));
  // The entries before the failing one are loaded.
  EXPECT_TRUE(registry.IsRegistered("plugin_test"));
}

TEST(MakeDefaultBackendRegistry, LoadsThePluginsInFerryC10dPlugins) {
  ASSERT_EQ(setenv("FERRY_C10D_PLUGINS", (":" + kPlugin + ":").c_str(), 1), 0);
  std::shared_ptr<BackendRegistry> registry = MakeDefaultBackendRegistry();
  unsetenv("FERRY_C10D_PLUGINS");
  EXPECT_TRUE(registry->IsRegistered("plugin_test"));
  EXPECT_TRUE(registry->IsRegistered("gloo"));
  // Without the variable, no plugin.
  EXPECT_FALSE(MakeDefaultBackendRegistry()->IsRegistered("plugin_test"));
}

}  // namespace
}  // namespace ferry::c10d
