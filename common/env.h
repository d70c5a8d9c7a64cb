// The one way Ferry's libraries read environment variables.
//
// Code that reads a variable takes an EnvLookup (name -> value, nullopt when
// unset) whose default is GetEnv, the process environment; tests and
// embedders pass their own instead of changing the process's environment.
// Library code calls GetEnv rather than std::getenv, so every variable Ferry
// reads is found by searching for one name.
//
// Thread safety: GetEnv is safe to call from any thread as long as nothing
// changes the environment concurrently (setenv is not thread-safe in libc).
#ifndef FERRY_COMMON_ENV_H_
#define FERRY_COMMON_ENV_H_

#include <functional>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace ferry {

/// Returns a variable's value, or nullopt when it is unset.
using EnvLookup =
    std::function<std::optional<std::string>(absl::string_view name)>;

/// The process environment (getenv): the default EnvLookup.
std::optional<std::string> GetEnv(absl::string_view name);

}  // namespace ferry

#endif  // FERRY_COMMON_ENV_H_
