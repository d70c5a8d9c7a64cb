#include "ferry/common/env.h"

#include <cstdlib>

namespace ferry {

std::optional<std::string> GetEnv(absl::string_view name) {
  const char* value = std::getenv(std::string(name).c_str());
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

}  // namespace ferry
