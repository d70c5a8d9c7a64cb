// Helpers shared by Store implementations: error constructors, so every store
// words its errors the same way (the conformance suite checks the content),
// and the value rules of Add and CompareSet.
//
// Thread safety: stateless.
#ifndef FERRY_STORE_STORE_UTIL_H_
#define FERRY_STORE_STORE_UTIL_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace ferry {

// DeadlineExceeded for a blocking operation `op` ("Get", "Wait", ...) on the
// store described by `store` that waited `waited` (of `timeout`) and still
// misses `missing`. Message: `<store>: <op> timed out: waited 301ms (timeout
// 300ms) for keys still missing: "a", "b"`. Keys longer than 200 bytes are
// truncated and at most 16 keys are listed (followed by a count).
absl::Status StoreTimeoutError(absl::string_view store, absl::string_view op,
                               absl::Span<const std::string> missing,
                               absl::Duration waited, absl::Duration timeout);

// InvalidArgument: Add on `key` whose value is not a decimal int64.
absl::Status NotAnIntegerError(absl::string_view store, absl::string_view key,
                               absl::string_view value);

// OutOfRange: Add of `delta` to `current` at `key` overflows int64.
absl::Status AddOverflowError(absl::string_view store, absl::string_view key,
                              int64_t current, int64_t delta);

// InvalidArgument: MultiSet with `keys` and `values` of different lengths.
absl::Status MultiSetLengthError(absl::string_view store, size_t keys,
                                 size_t values);

// NotFound: non-blocking QueuePop on an empty queue `key`.
absl::Status QueueEmptyError(absl::string_view store, absl::string_view key);

// Add's rule: `current` (nullptr: key absent, counts as 0) parsed as a
// decimal int64 plus `delta`. InvalidArgument when not numeric, OutOfRange on
// overflow.
absl::StatusOr<int64_t> AddToDecimal(absl::string_view store,
                                     absl::string_view key,
                                     const std::string* current, int64_t delta);

// CompareSet's rule. `current` is nullptr when the key is absent. Returns
// the value to report; sets *store_desired when `desired` must be stored.
std::string CompareSetResult(const std::string* current,
                             absl::string_view expected,
                             absl::string_view desired, bool* store_desired);

// Quotes `key` for messages (C-escaped, truncated to 200 bytes).
std::string QuoteKey(absl::string_view key);

}  // namespace ferry

#endif  // FERRY_STORE_STORE_UTIL_H_
