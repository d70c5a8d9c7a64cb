#include "ferry/rpc/inspect.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ferry::rpc {

std::string InspectionRow::Get(const std::string& key) const {
  for (const auto& [k, v] : fields) {
    if (k == key) return v;
  }
  return "";
}

absl::Status InspectorRegistry::Register(const std::string& name,
                                         Inspector inspector) {
  if (name.empty() || !inspector) {
    return absl::InvalidArgumentError(
        "an inspector needs a name and a function");
  }
  MutexLock lock(&mu_);
  if (!inspectors_.emplace(name, std::move(inspector)).second) {
    return absl::AlreadyExistsError(
        absl::StrCat("inspector '", name, "' is already registered"));
  }
  return absl::OkStatus();
}

void InspectorRegistry::Unregister(const std::string& name) {
  MutexLock lock(&mu_);
  inspectors_.erase(name);
}

std::vector<std::string> InspectorRegistry::Names() const {
  MutexLock lock(&mu_);
  std::vector<std::string> out;
  for (const auto& [name, fn] : inspectors_) out.push_back(name);
  return out;
}

absl::StatusOr<std::vector<Inspection>> InspectorRegistry::Inspect(
    const std::string& name) const {
  std::vector<std::pair<std::string, Inspector>> chosen;
  {
    MutexLock lock(&mu_);
    for (const auto& [n, fn] : inspectors_) {
      if (name.empty() || n == name) chosen.emplace_back(n, fn);
    }
  }
  if (!name.empty() && chosen.empty()) {
    return absl::NotFoundError(
        absl::StrCat("no inspector '", name,
                     "' (registered: ", absl::StrJoin(Names(), ", "), ")"));
  }
  std::vector<Inspection> out;
  for (auto& [n, fn] : chosen) out.push_back(Inspection{n, fn()});
  return out;
}

}  // namespace ferry::rpc
