#include "ferry/rref/class_registry.h"

namespace ferry::rref {

std::shared_ptr<const ClassInfo> ClassRegistry::Find(
    const std::string& name) const {
  MutexLock lock(&mu_);
  auto it = classes_.find(name);
  return it == classes_.end() ? nullptr : it->second;
}

void ClassRegistry::Update(const std::string& name,
                           const std::function<void(ClassInfo&)>& edit) {
  MutexLock lock(&mu_);
  auto it = classes_.find(name);
  auto info = it == classes_.end() ? std::make_shared<ClassInfo>()
                                   : std::make_shared<ClassInfo>(*it->second);
  info->name = name;
  edit(*info);
  classes_[name] = std::move(info);
}

}  // namespace ferry::rref
