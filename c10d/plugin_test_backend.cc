// A c10d plugin for plugin_test: registers "plugin_test", whose factory
// fails with a message the test recognizes (it proves the factory that runs
// is this library's).
#include "absl/status/status.h"
#include "ferry/c10d/plugin.h"
#include "ferry/c10d/registry.h"

FERRY_C10D_PLUGIN(registry) {
  return registry.RegisterBackend(
      "plugin_test",
      [](const ferry::c10d::BackendConfig& config)
          -> absl::StatusOr<std::unique_ptr<ferry::c10d::Backend>> {
        return absl::UnimplementedError(
            "made by libplugin_test_backend.so for rank " +
            std::to_string(config.rank));
      });
}
