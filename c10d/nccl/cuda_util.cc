#include "ferry/c10d/nccl/cuda_util.h"

#include <cuda_runtime_api.h>

#include <memory>

#include "absl/strings/str_cat.h"
#include "ferry/common/status.h"

namespace ferry {
namespace c10d {

int CudaDeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // Clear the sticky "no device" error.
    return 0;
  }
  return n;
}

absl::Status CudaStatus(int err, absl::string_view what) {
  cudaError_t e = static_cast<cudaError_t>(err);
  if (e == cudaSuccess) return absl::OkStatus();
  std::string msg =
      absl::StrCat(what, ": CUDA error ", static_cast<int>(e), " (",
                   cudaGetErrorName(e), ": ", cudaGetErrorString(e), ")");
  switch (e) {
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
      return absl::FailedPreconditionError(msg);
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(msg);
    default:
      return absl::InternalError(msg);
  }
}

absl::StatusOr<Storage> CudaAllocator::Allocate(size_t nbytes) {
  RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device_),
                             absl::StrCat("cudaSetDevice(", device_, ")")));
  void* ptr = nullptr;
  if (nbytes > 0) {
    RETURN_IF_ERROR(CudaStatus(
        cudaMalloc(&ptr, nbytes),
        absl::StrCat("cudaMalloc(", nbytes, " bytes) on cuda:", device_)));
  }
  int device = device_;
  std::shared_ptr<const void> owner(ptr, [device](const void* p) {
    if (p != nullptr) {
      cudaSetDevice(device);
      cudaFree(const_cast<void*>(p));
    }
  });
  return Storage::Wrap(ptr, nbytes, Device::CUDA(device_), std::move(owner));
}

absl::StatusOr<Tensor> CopyToCuda(const Tensor& t, int device) {
  Tensor src = t.contiguous();
  CudaAllocator allocator(device);
  ASSIGN_OR_RETURN(Tensor out,
                   Tensor::TryEmpty(src.sizes(), src.dtype(), &allocator));
  if (src.nbytes() > 0) {
    RETURN_IF_ERROR(CudaStatus(cudaMemcpy(out.data_ptr(), src.data_ptr(),
                                          src.nbytes(), cudaMemcpyHostToDevice),
                               "cudaMemcpy host to device"));
  }
  return out;
}

absl::StatusOr<Tensor> CopyToCpu(const Tensor& t) {
  if (!t.device().is_cuda() || !t.is_contiguous()) {
    return absl::InvalidArgumentError(
        "CopyToCpu: needs a contiguous CUDA tensor");
  }
  ASSIGN_OR_RETURN(Tensor out, Tensor::TryEmpty(t.sizes(), t.dtype()));
  if (t.nbytes() > 0) {
    RETURN_IF_ERROR(
        CudaStatus(cudaSetDevice(t.device().index), "cudaSetDevice"));
    RETURN_IF_ERROR(CudaStatus(cudaMemcpy(out.data_ptr(), t.data_ptr(),
                                          t.nbytes(), cudaMemcpyDeviceToHost),
                               "cudaMemcpy device to host"));
  }
  return out;
}

}  // namespace c10d
}  // namespace ferry
