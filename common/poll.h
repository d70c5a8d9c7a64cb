// PollUntil: for tests, waits (bounded) until a condition on observable
// state holds, checking it about every millisecond. Use it where no
// notification exists to wait on (counters, tables a test reads from
// outside); prefer a Future or a condition where one does.
//
// Thread safety: `cond` runs on the calling thread only.
#ifndef FERRY_COMMON_POLL_H_
#define FERRY_COMMON_POLL_H_

#include <functional>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace ferry {

// Returns true as soon as `cond()` is true, false once `limit` has passed
// without it (`cond` is checked once more at the deadline).
inline bool PollUntil(const std::function<bool()>& cond, absl::Duration limit) {
  const absl::Time deadline = absl::Now() + limit;
  while (!cond()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

}  // namespace ferry

#endif  // FERRY_COMMON_POLL_H_
