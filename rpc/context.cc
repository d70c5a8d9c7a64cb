#include "ferry/rpc/context.h"

#include <utility>

namespace ferry::rpc {
namespace {

ContextEntries& Entries() {
  thread_local ContextEntries entries;
  return entries;
}

}  // namespace

const ContextEntries& CurrentContext() { return Entries(); }

std::optional<std::string> CurrentContextValue(const std::string& key) {
  auto it = Entries().find(key);
  if (it == Entries().end()) return std::nullopt;
  return it->second;
}

ScopedContext::ScopedContext(ContextEntries entries)
    : saved_(std::exchange(Entries(), std::move(entries))) {}
ScopedContext::~ScopedContext() { Entries() = std::move(saved_); }

ScopedContextEntry::ScopedContextEntry(const std::string& key,
                                       std::string value)
    : saved_(Entries()) {
  Entries()[key] = std::move(value);
}
ScopedContextEntry::~ScopedContextEntry() { Entries() = std::move(saved_); }

}  // namespace ferry::rpc
