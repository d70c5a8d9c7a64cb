#include "ferry/store/hash_store.h"

#include <algorithm>
#include <deque>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "ferry/common/status.h"
#include "ferry/common/sync.h"
#include "ferry/store/store_util.h"

namespace ferry {
namespace {

// Waits wake at least hourly, so a huge or infinite timeout never overflows
// the clock arithmetic of the condition variable.
absl::Time ClampDeadline(absl::Time deadline) {
  return std::min(deadline, absl::Now() + absl::Hours(1));
}

}  // namespace

struct HashStore::State {
  std::string name;
  Mutex mu;
  // Signalled (SignalAll) by every mutation that can satisfy a waiter.
  CondVar changed;
  absl::flat_hash_map<std::string, std::string> kv ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<std::string, std::deque<std::string>> queues
      ABSL_GUARDED_BY(mu);
  // Calls parked in changed.WaitWithDeadline now.
  int64_t blocked ABSL_GUARDED_BY(mu) = 0;

  void BlockUntil(absl::Time deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    ++blocked;
    changed.WaitWithDeadline(&mu, ClampDeadline(deadline));
    --blocked;
  }

  // Blocks until every key exists or `timeout` passes.
  absl::Status AwaitKeys(absl::string_view op,
                         absl::Span<const std::string> keys,
                         absl::Duration timeout)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    const absl::Time start = absl::Now();
    const absl::Time deadline = start + timeout;
    std::vector<std::string> missing;
    while (true) {
      missing.clear();
      for (const std::string& key : keys) {
        if (!kv.contains(key)) missing.push_back(key);
      }
      if (missing.empty()) return absl::OkStatus();
      const absl::Time now = absl::Now();
      if (now >= deadline) {
        return StoreTimeoutError(name, op, missing, now - start, timeout);
      }
      BlockUntil(deadline);
    }
  }
};

HashStore::HashStore() : HashStore(std::make_shared<State>()) {}

HashStore::HashStore(std::shared_ptr<State> state) : state_(std::move(state)) {
  if (state_->name.empty()) {
    state_->name = absl::StrFormat("hash:%p", static_cast<void*>(state_.get()));
  }
}

HashStore::~HashStore() = default;

std::string HashStore::Describe() const { return state_->name; }

int64_t HashStore::BlockedCalls() const {
  MutexLock lock(&state_->mu);
  return state_->blocked;
}

absl::Status HashStore::Set(absl::string_view key, absl::string_view value) {
  MutexLock lock(&state_->mu);
  state_->kv[key] = std::string(value);
  state_->changed.SignalAll();
  return absl::OkStatus();
}

absl::StatusOr<std::string> HashStore::Get(absl::string_view key) {
  const std::string keys[] = {std::string(key)};
  MutexLock lock(&state_->mu);
  RETURN_IF_ERROR(state_->AwaitKeys("Get", keys, Timeout()));
  return state_->kv.find(key)->second;
}

absl::StatusOr<int64_t> HashStore::Add(absl::string_view key, int64_t delta) {
  MutexLock lock(&state_->mu);
  auto it = state_->kv.find(key);
  ASSIGN_OR_RETURN(
      int64_t sum,
      AddToDecimal(state_->name, key,
                   it == state_->kv.end() ? nullptr : &it->second, delta));
  state_->kv[key] = absl::StrCat(sum);
  state_->changed.SignalAll();
  return sum;
}

absl::StatusOr<std::string> HashStore::CompareSet(absl::string_view key,
                                                  absl::string_view expected,
                                                  absl::string_view desired) {
  MutexLock lock(&state_->mu);
  auto it = state_->kv.find(key);
  bool store_desired = false;
  std::string result =
      CompareSetResult(it == state_->kv.end() ? nullptr : &it->second, expected,
                       desired, &store_desired);
  if (store_desired) {
    state_->kv[key] = std::string(desired);
    state_->changed.SignalAll();
  }
  return result;
}

absl::StatusOr<bool> HashStore::Check(absl::Span<const std::string> keys) {
  MutexLock lock(&state_->mu);
  for (const std::string& key : keys) {
    if (!state_->kv.contains(key)) return false;
  }
  return true;
}

absl::Status HashStore::Wait(absl::Span<const std::string> keys,
                             std::optional<absl::Duration> timeout) {
  MutexLock lock(&state_->mu);
  return state_->AwaitKeys("Wait", keys, timeout.value_or(Timeout()));
}

absl::StatusOr<bool> HashStore::DeleteKey(absl::string_view key) {
  MutexLock lock(&state_->mu);
  return state_->kv.erase(key) > 0;
}

absl::StatusOr<int64_t> HashStore::NumKeys() {
  MutexLock lock(&state_->mu);
  return static_cast<int64_t>(state_->kv.size());
}

absl::StatusOr<std::vector<std::string>> HashStore::MultiGet(
    absl::Span<const std::string> keys) {
  MutexLock lock(&state_->mu);
  RETURN_IF_ERROR(state_->AwaitKeys("MultiGet", keys, Timeout()));
  std::vector<std::string> values;
  values.reserve(keys.size());
  for (const std::string& key : keys) values.push_back(state_->kv[key]);
  return values;
}

absl::Status HashStore::MultiSet(absl::Span<const std::string> keys,
                                 absl::Span<const std::string> values) {
  if (keys.size() != values.size()) {
    return MultiSetLengthError(state_->name, keys.size(), values.size());
  }
  MutexLock lock(&state_->mu);
  for (size_t i = 0; i < keys.size(); ++i) state_->kv[keys[i]] = values[i];
  state_->changed.SignalAll();
  return absl::OkStatus();
}

absl::Status HashStore::Append(absl::string_view key, absl::string_view value) {
  MutexLock lock(&state_->mu);
  absl::StrAppend(&state_->kv[key], value);
  state_->changed.SignalAll();
  return absl::OkStatus();
}

absl::Status HashStore::QueuePush(absl::string_view key,
                                  absl::string_view value) {
  MutexLock lock(&state_->mu);
  state_->queues[key].emplace_back(value);
  state_->changed.SignalAll();
  return absl::OkStatus();
}

absl::StatusOr<std::string> HashStore::QueuePop(
    absl::string_view key, bool block, std::optional<absl::Duration> timeout) {
  MutexLock lock(&state_->mu);
  auto nonempty = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_->mu) {
    auto it = state_->queues.find(key);
    return it != state_->queues.end() && !it->second.empty();
  };
  if (!nonempty()) {
    if (!block) return QueueEmptyError(state_->name, key);
    const absl::Duration limit = timeout.value_or(Timeout());
    const absl::Time start = absl::Now();
    const absl::Time deadline = start + limit;
    while (!nonempty()) {
      const absl::Time now = absl::Now();
      if (now >= deadline) {
        const std::string keys[] = {std::string(key)};
        return StoreTimeoutError(state_->name, "QueuePop", keys, now - start,
                                 limit);
      }
      state_->BlockUntil(deadline);
    }
  }
  auto it = state_->queues.find(key);
  std::string value = std::move(it->second.front());
  it->second.pop_front();
  if (it->second.empty()) state_->queues.erase(it);
  return value;
}

absl::StatusOr<int64_t> HashStore::QueueLen(absl::string_view key) {
  MutexLock lock(&state_->mu);
  auto it = state_->queues.find(key);
  return it == state_->queues.end() ? 0
                                    : static_cast<int64_t>(it->second.size());
}

absl::StatusOr<std::unique_ptr<Store>> HashStore::Clone() {
  auto clone = std::unique_ptr<HashStore>(new HashStore(state_));
  clone->SetTimeout(Timeout());
  return clone;
}

}  // namespace ferry
