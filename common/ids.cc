#include "ferry/common/ids.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ferry {

std::string GlobalId::ToString() const {
  return absl::StrCat("GlobalId(worker=", worker_id(), ", local=", local_id(),
                      ")");
}

absl::StatusOr<GlobalId> IdGenerator::Next() {
  uint64_t local = next_.fetch_add(1, std::memory_order_relaxed);
  if (local > GlobalId::kMaxLocal) {
    // Park the counter past the limit so it cannot wrap back into range.
    next_.store(GlobalId::kMaxLocal + 1, std::memory_order_relaxed);
    return absl::ResourceExhaustedError(
        absl::StrCat("worker ", worker_id_, " has minted all 2^",
                     GlobalId::kLocalBits, " local ids"));
  }
  return GlobalId(worker_id_, local);
}

}  // namespace ferry
