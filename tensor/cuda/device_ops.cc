#include "ferry/tensor/cuda/device_ops.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ferry {
namespace cuda {

DeviceOps* DeviceOpsOf(const Tensor& t) {
  if (!t.defined() || !t.device().is_cuda()) return nullptr;
  return dynamic_cast<DeviceOps*>(t.storage().compute());
}

std::string DescribeOperand(const Tensor& t) {
  if (!t.defined()) return "undefined";
  return absl::StrCat(DTypeName(t.dtype()), " [",
                      absl::StrJoin(t.sizes(), ", "), "] on ",
                      t.device().ToString());
}

}  // namespace cuda
}  // namespace ferry
