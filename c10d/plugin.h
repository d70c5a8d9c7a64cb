// Out-of-tree c10d backends: shared libraries loaded at run time that
// register backends by name into a BackendRegistry, so a program that never
// linked a backend can create a process group on it.
//
// A plugin is a shared library, linked against libferry.so (the installed
// Ferry) or carrying its own copy of the c10d interface, that exports
//
//   FERRY_C10D_PLUGIN(registry) {
//     return registry.RegisterBackend("mine", MyFactory());
//   }
//
// which defines the entry point `ferry_c10d_plugin_init` with C linkage.
// LoadBackendPlugin dlopens the file, calls the entry point once with the
// registry, and checks what it registered:
//
//   - the file does not load (missing, not a shared library, unresolved
//     symbols): FailedPrecondition naming the file and dlerror's reason;
//   - no entry point: NotFound naming the file and ferry_c10d_plugin_init;
//   - the entry point fails (e.g. AlreadyExists for a taken name, which
//     RegisterBackend reports naming the backend): that code, the message
//     prefixed with the file;
//   - it succeeds but registered nothing: InvalidArgument naming the file.
//
// MakeDefaultBackendRegistry() (default_registry.h) loads every plugin
// listed in FERRY_C10D_PLUGINS (colon-separated paths) after Ferry's own
// backends; LoadBackendPluginsFromEnv is that step.
//
// A loaded plugin stays loaded for the life of the process (its factories
// and backends' code live in it). Thread safety: as BackendRegistry; the
// entry point runs on the caller's thread.
#ifndef FERRY_C10D_PLUGIN_H_
#define FERRY_C10D_PLUGIN_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ferry/c10d/registry.h"

// The entry point's name and type. `status` is OK on entry; the plugin sets
// it to its registration's result.
#define FERRY_C10D_PLUGIN_ENTRY_NAME "ferry_c10d_plugin_init"
extern "C" {
// The entry point's type (see FERRY_C10D_PLUGIN_ENTRY_NAME).
typedef void (*FerryC10dPluginInit)(ferry::c10d::BackendRegistry* registry,
                                    absl::Status* status);
}

// Defines the entry point; the body registers into `registry_var` and
// returns an absl::Status.
#define FERRY_C10D_PLUGIN(registry_var)                                     \
  static absl::Status FerryC10dPluginBody(                                  \
      ::ferry::c10d::BackendRegistry& registry_var);                        \
  extern "C" __attribute__((visibility("default"))) void                    \
  ferry_c10d_plugin_init(::ferry::c10d::BackendRegistry* registry,          \
                         absl::Status* status) {                            \
    *status = FerryC10dPluginBody(*registry);                               \
  }                                                                         \
  static absl::Status FerryC10dPluginBody(                                  \
      ::ferry::c10d::BackendRegistry& registry_var)

namespace ferry {
namespace c10d {

// Loads the plugin at `path` into `registry`; returns the names it
// registered (sorted). Errors as above.
absl::StatusOr<std::vector<std::string>> LoadBackendPlugin(
    const std::string& path, BackendRegistry& registry);

// Loads each path of `paths` (colon-separated; empty entries skipped) in
// order; stops at the first error. The environment variable's name, when
// given, prefixes errors (the list came from it).
absl::Status LoadBackendPlugins(absl::string_view paths,
                                BackendRegistry& registry,
                                absl::string_view source = "");

// LoadBackendPlugins on $FERRY_C10D_PLUGINS; OK when it is unset or empty.
absl::Status LoadBackendPluginsFromEnv(BackendRegistry& registry);

}  // namespace c10d
}  // namespace ferry

#endif  // FERRY_C10D_PLUGIN_H_
