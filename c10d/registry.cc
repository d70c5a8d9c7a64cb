#include "ferry/c10d/registry.h"

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ferry/common/status.h"

namespace ferry {
namespace c10d {

absl::string_view DeviceTypeName(DeviceType type) {
  return type == DeviceType::kCUDA ? "cuda" : "cpu";
}

BackendRegistry::BackendRegistry() = default;
BackendRegistry::~BackendRegistry() = default;

absl::Status BackendRegistry::RegisterBackend(std::string name,
                                              BackendFactory factory,
                                              std::vector<DeviceType> devices) {
  if (name.empty()) {
    return absl::InvalidArgumentError("RegisterBackend: empty backend name");
  }
  for (char c : name) {
    if (c == ':' || c == ',' ||
        absl::ascii_isspace(static_cast<unsigned char>(c))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "RegisterBackend: backend name '", name,
          "' may not contain ':', ',' or whitespace (they separate specs)"));
    }
  }
  if (!factory) {
    return absl::InvalidArgumentError(
        absl::StrCat("RegisterBackend: null factory for '", name, "'"));
  }
  if (devices.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RegisterBackend: backend '", name, "' serves no device type"));
  }
  MutexLock lock(&mu_);
  if (entries_.count(name) != 0) {
    return absl::AlreadyExistsError(absl::StrCat(
        "RegisterBackend: backend '", name, "' is already registered"));
  }
  entries_.emplace(std::move(name),
                   Entry{std::move(factory), std::move(devices)});
  return absl::OkStatus();
}

bool BackendRegistry::IsRegistered(absl::string_view name) const {
  MutexLock lock(&mu_);
  return entries_.find(name) != entries_.end();
}

std::vector<std::string> BackendRegistry::Names() const {
  MutexLock lock(&mu_);
  std::vector<std::string> names;
  for (const auto& [name, entry] : entries_) names.push_back(name);
  return names;
}

absl::Status BackendRegistry::UnknownLocked(absl::string_view name) const {
  std::vector<std::string> names;
  for (const auto& [n, entry] : entries_) names.push_back(n);
  return absl::NotFoundError(
      absl::StrCat("unknown backend '", name, "'; registered backends: ",
                   names.empty() ? "(none)" : absl::StrJoin(names, ", ")));
}

absl::StatusOr<std::vector<DeviceType>> BackendRegistry::Devices(
    absl::string_view name) const {
  MutexLock lock(&mu_);
  auto it = entries_.find(name);
  if (it == entries_.end()) return UnknownLocked(name);
  return it->second.devices;
}

absl::StatusOr<std::unique_ptr<Backend>> BackendRegistry::Create(
    absl::string_view name, const BackendConfig& config) const {
  BackendFactory factory;
  {
    MutexLock lock(&mu_);
    auto it = entries_.find(name);
    if (it == entries_.end()) return UnknownLocked(name);
    factory = it->second.factory;
  }
  absl::StatusOr<std::unique_ptr<Backend>> backend = factory(config);
  if (!backend.ok()) {
    return Annotate(backend.status(),
                    absl::StrCat("creating backend '", name, "' (rank ",
                                 config.rank, " of ", config.size, ")"));
  }
  if (*backend == nullptr) {
    return absl::InternalError(
        absl::StrCat("factory of backend '", name, "' returned null"));
  }
  if ((*backend)->rank() != config.rank || (*backend)->size() != config.size) {
    return absl::InternalError(
        absl::StrCat("factory of backend '", name, "' returned rank ",
                     (*backend)->rank(), " of ", (*backend)->size(),
                     ", asked for rank ", config.rank, " of ", config.size));
  }
  return backend;
}

}  // namespace c10d
}  // namespace ferry
