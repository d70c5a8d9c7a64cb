#include "ferry/rpc/function_registry.h"

namespace ferry::rpc {

absl::Status FunctionRegistry::RegisterRaw(FunctionEntry entry) {
  if (entry.name.empty()) {
    return absl::InvalidArgumentError("function name must not be empty");
  }
  if (!entry.fn) {
    return absl::InvalidArgumentError(
        absl::StrCat("function '", entry.name, "' has no callable"));
  }
  MutexLock lock(&mu_);
  std::string name = entry.name;
  auto [it, inserted] = functions_.emplace(
      name, std::make_shared<const FunctionEntry>(std::move(entry)));
  if (!inserted) {
    return absl::AlreadyExistsError(
        absl::StrCat("function '", name, "' is already registered"));
  }
  return absl::OkStatus();
}

std::shared_ptr<const FunctionEntry> FunctionRegistry::Find(
    const std::string& name) const {
  MutexLock lock(&mu_);
  auto it = functions_.find(name);
  return it == functions_.end() ? nullptr : it->second;
}

std::vector<std::shared_ptr<const FunctionEntry>> FunctionRegistry::List()
    const {
  MutexLock lock(&mu_);
  std::vector<std::shared_ptr<const FunctionEntry>> out;
  out.reserve(functions_.size());
  for (const auto& [name, e] : functions_) out.push_back(e);
  return out;
}

}  // namespace ferry::rpc
