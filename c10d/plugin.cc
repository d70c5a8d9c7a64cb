#include "ferry/c10d/plugin.h"
#include "ferry/common/env.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace ferry {
namespace c10d {

absl::StatusOr<std::vector<std::string>> LoadBackendPlugin(
    const std::string& path, BackendRegistry& registry) {
  if (path.empty()) {
    return absl::InvalidArgumentError("LoadBackendPlugin: empty plugin path");
  }
  // RTLD_LOCAL: the plugin's own symbols stay its own; it reaches Ferry
  // through its DT_NEEDED libferry.so or its own copy.
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    return absl::FailedPreconditionError(
        absl::StrCat("c10d plugin ", path,
                     " could not be loaded: ", why ? why : "unknown reason"));
  }
  dlerror();
  void* sym = dlsym(handle, FERRY_C10D_PLUGIN_ENTRY_NAME);
  if (sym == nullptr) {
    dlclose(handle);
    return absl::NotFoundError(
        absl::StrCat("c10d plugin ", path, " has no entry point ",
                     FERRY_C10D_PLUGIN_ENTRY_NAME,
                     " (define it with FERRY_C10D_PLUGIN in "
                     "ferry/c10d/plugin.h)"));
  }
  const std::vector<std::string> before = registry.Names();
  absl::Status status;
  reinterpret_cast<FerryC10dPluginInit>(sym)(&registry, &status);
  // Whatever happened, factories it registered point into it: it stays.
  if (!status.ok()) {
    return absl::Status(status.code(), absl::StrCat("c10d plugin ", path, ": ",
                                                    status.message()));
  }
  const std::vector<std::string> after = registry.Names();
  std::vector<std::string> added;
  std::set_difference(after.begin(), after.end(), before.begin(),
                      before.end(), std::back_inserter(added));
  if (added.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "c10d plugin ", path, " registered no backend (its ",
        FERRY_C10D_PLUGIN_ENTRY_NAME, " returned OK)"));
  }
  return added;
}

absl::Status LoadBackendPlugins(absl::string_view paths,
                                BackendRegistry& registry,
                                absl::string_view source) {
  for (absl::string_view p : absl::StrSplit(paths, ':', absl::SkipEmpty())) {
    absl::StatusOr<std::vector<std::string>> loaded =
        LoadBackendPlugin(std::string(p), registry);
    if (!loaded.ok()) {
      if (source.empty()) return loaded.status();
      return absl::Status(loaded.status().code(),
                          absl::StrCat(source, ": ", loaded.status().message()));
    }
  }
  return absl::OkStatus();
}

absl::Status LoadBackendPluginsFromEnv(BackendRegistry& registry) {
  std::optional<std::string> paths = GetEnv("FERRY_C10D_PLUGINS");
  if (!paths.has_value()) return absl::OkStatus();
  return LoadBackendPlugins(*paths, registry, "FERRY_C10D_PLUGINS");
}

}  // namespace c10d
}  // namespace ferry
