#include "ferry/tensor/cuda/device_ops.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ferry {
namespace cuda {

ThreadStreamGuard::ThreadStreamGuard(DeviceOps* ops, Device device,
                                     uintptr_t stream)
    : ops_(ops), device_(device) {
  absl::StatusOr<std::optional<uintptr_t>> previous =
      ops_->SetThreadStream(device, stream);
  if (previous.ok()) {
    previous_ = *previous;
  } else {
    status_ = previous.status();
  }
}

ThreadStreamGuard::~ThreadStreamGuard() {
  if (status_.ok()) ops_->SetThreadStream(device_, previous_).IgnoreError();
}

DeviceOps* DeviceOpsOf(const Tensor& t) {
  if (!t.defined() || !t.device().is_cuda()) return nullptr;
  return dynamic_cast<DeviceOps*>(t.storage().compute());
}

std::optional<std::vector<int64_t>> BroadcastSizes(
    const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  const size_t rank = std::max(a.size(), b.size());
  std::vector<int64_t> out(rank, 1);
  for (size_t i = 0; i < rank; ++i) {  // i-th dimension from the end
    const int64_t x = i < a.size() ? a[a.size() - 1 - i] : 1;
    const int64_t y = i < b.size() ? b[b.size() - 1 - i] : 1;
    if (x != y && x != 1 && y != 1) return std::nullopt;
    out[rank - 1 - i] = x == 1 ? y : x;
  }
  return out;
}

std::string DescribeOperand(const Tensor& t) {
  if (!t.defined()) return "undefined";
  return absl::StrCat(DTypeName(t.dtype()), " [",
                      absl::StrJoin(t.sizes(), ", "), "] on ",
                      t.device().ToString());
}

}  // namespace cuda
}  // namespace ferry
