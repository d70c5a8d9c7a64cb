#include "ferry/tensor/cuda/copy.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ferry/common/status.h"

namespace ferry {
namespace cuda {
namespace {

std::string Describe(const Tensor& t) {
  return absl::StrCat("tensor of shape [", absl::StrJoin(t.sizes(), ", "),
                      "] on ", t.device().ToString());
}

}  // namespace

absl::StatusOr<Tensor> CopyToDevice(const Tensor& src, int device,
                                    StreamHandle stream,
                                    CachingDeviceAllocator& alloc,
                                    DeviceMemoryApi& api) {
  if (!src.defined()) {
    return absl::InvalidArgumentError("CopyToDevice: undefined tensor");
  }
  if (!src.device().is_cpu()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CopyToDevice to ", api.name(), ":", device, ": the source is a ",
        Describe(src), ", not on cpu"));
  }
  const Tensor host = src.contiguous();
  ASSIGN_OR_RETURN(Storage storage,
                   alloc.Allocate(device, host.nbytes(), stream));
  RETURN_IF_ERROR(api.MemcpyAsync(device, storage.data(), host.data_ptr(),
                                  host.nbytes(), stream));
  RETURN_IF_ERROR(api.SynchronizeStream(device, stream));
  return Tensor::FromStorage(std::move(storage), host.dtype(), host.sizes(),
                             ContiguousStrides(host.sizes()));
}

absl::StatusOr<Tensor> CopyToHost(const Tensor& src, StreamHandle stream,
                                  DeviceMemoryApi& api) {
  if (!src.defined()) {
    return absl::InvalidArgumentError("CopyToHost: undefined tensor");
  }
  if (!src.device().is_cuda()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CopyToHost: the source is a ", Describe(src), ", not a device tensor"));
  }
  if (!src.is_contiguous()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CopyToHost: the source, a ", Describe(src),
        ", is not contiguous (no device kernel compacts it yet)"));
  }
  const int device = src.device().index;
  ASSIGN_OR_RETURN(Tensor out, Tensor::TryEmpty(src.sizes(), src.dtype()));
  RETURN_IF_ERROR(api.MemcpyAsync(device, out.data_ptr(), src.data_ptr(),
                                  src.nbytes(), stream));
  RETURN_IF_ERROR(api.SynchronizeStream(device, stream));
  return out;
}

}  // namespace cuda
}  // namespace ferry
