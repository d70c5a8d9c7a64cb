#include "ferry/store/store_util.h"

#include <cstdint>
#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace ferry {
namespace {

constexpr size_t kMaxKeyChars = 200;
constexpr size_t kMaxKeysListed = 16;

}  // namespace

std::string QuoteKey(absl::string_view key) {
  if (key.size() <= kMaxKeyChars) {
    return absl::StrCat("\"", absl::CEscape(key), "\"");
  }
  return absl::StrCat("\"", absl::CEscape(key.substr(0, kMaxKeyChars)),
                      "\"... (", key.size(), " bytes)");
}

absl::Status StoreTimeoutError(absl::string_view store, absl::string_view op,
                               absl::Span<const std::string> missing,
                               absl::Duration waited, absl::Duration timeout) {
  std::string keys;
  for (size_t i = 0; i < missing.size() && i < kMaxKeysListed; ++i) {
    absl::StrAppend(&keys, i == 0 ? "" : ", ", QuoteKey(missing[i]));
  }
  if (missing.size() > kMaxKeysListed) {
    absl::StrAppend(&keys, " and ", missing.size() - kMaxKeysListed, " more");
  }
  return absl::DeadlineExceededError(absl::StrCat(
      store, ": ", op, " timed out: waited ",
      absl::FormatDuration(absl::Trunc(waited, absl::Milliseconds(1))),
      " (timeout ", absl::FormatDuration(timeout),
      ") for keys still missing: ", keys));
}

absl::Status NotAnIntegerError(absl::string_view store, absl::string_view key,
                               absl::string_view value) {
  return absl::InvalidArgumentError(absl::StrCat(
      store, ": Add on key ", QuoteKey(key),
      ": existing value is not a decimal int64: ", QuoteKey(value)));
}

absl::Status AddOverflowError(absl::string_view store, absl::string_view key,
                              int64_t current, int64_t delta) {
  return absl::OutOfRangeError(absl::StrCat(store, ": Add on key ",
                                            QuoteKey(key), ": ", current, " + ",
                                            delta, " overflows int64"));
}

absl::Status MultiSetLengthError(absl::string_view store, size_t keys,
                                 size_t values) {
  return absl::InvalidArgumentError(
      absl::StrCat(store, ": MultiSet got ", keys, " keys but ", values,
                   " values; the counts must match"));
}

absl::Status QueueEmptyError(absl::string_view store, absl::string_view key) {
  return absl::NotFoundError(
      absl::StrCat(store, ": QueuePop: queue ", QuoteKey(key), " is empty"));
}

absl::StatusOr<int64_t> AddToDecimal(absl::string_view store,
                                     absl::string_view key,
                                     const std::string* current,
                                     int64_t delta) {
  int64_t value = 0;
  if (current != nullptr && !absl::SimpleAtoi(*current, &value)) {
    return NotAnIntegerError(store, key, *current);
  }
  int64_t sum = 0;
  if (__builtin_add_overflow(value, delta, &sum)) {
    return AddOverflowError(store, key, value, delta);
  }
  return sum;
}

std::string CompareSetResult(const std::string* current,
                             absl::string_view expected,
                             absl::string_view desired, bool* store_desired) {
  if (current == nullptr) {
    *store_desired = expected.empty();
    return std::string(expected.empty() ? desired : expected);
  }
  *store_desired = (*current == expected);
  return *store_desired ? std::string(desired) : *current;
}

}  // namespace ferry
