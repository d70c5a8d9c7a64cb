#include "ferry/tensor/cuda/context.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "ferry/common/status.h"
#include "ferry/tensor/cuda/copy.h"
#include "ferry/tensor/cuda/cuda_device_api.h"

namespace ferry {
namespace cuda {

absl::StatusOr<std::unique_ptr<CudaContext>> CudaContext::Create(
    Options options) {
  ASSIGN_OR_RETURN(std::shared_ptr<CudaDeviceApi> api, CudaDeviceApi::Create());
  return CreateForApi(std::move(api), options, /*runs_kernels=*/true);
}

absl::StatusOr<std::unique_ptr<CudaContext>> CudaContext::CreateForApi(
    std::shared_ptr<DeviceMemoryApi> api, Options options, bool runs_kernels) {
  if (api == nullptr) {
    return absl::InvalidArgumentError("CudaContext: null device API");
  }
  ASSIGN_OR_RETURN(std::unique_ptr<CachingDeviceAllocator> alloc,
                   CachingDeviceAllocator::Create(api, options.allocator));
  return std::unique_ptr<CudaContext>(
      new CudaContext(std::move(api), std::move(alloc), runs_kernels));
}

CudaContext::CudaContext(std::shared_ptr<DeviceMemoryApi> api,
                         std::unique_ptr<CachingDeviceAllocator> alloc,
                         bool runs_kernels)
    : api_(std::move(api)), alloc_(std::move(alloc)),
      runs_kernels_(runs_kernels) {}

CudaContext::~CudaContext() {
  absl::MutexLock lock(&mu_);
  for (auto& [device, handle] : cublas_) {
    int previous = 0;
    cudaGetDevice(&previous);
    cudaSetDevice(device);
    cublasDestroy(static_cast<cublasHandle_t>(handle));
    cudaSetDevice(previous);
  }
}

absl::Status CudaContext::CheckCudaDevice(const char* op,
                                          Device device) const {
  if (!device.is_cuda() || device.index < 0 ||
      device.index >= device_count()) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": device ", device.ToString(), " is not one of the ",
        device_count(), " ", api_->name(), " devices"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Tensor> CudaContext::Empty(const std::vector<int64_t>& sizes,
                                          DType dtype, Device device) {
  if (device.is_cpu()) return Tensor::TryEmpty(sizes, dtype);
  RETURN_IF_ERROR(CheckCudaDevice("Empty", device));
  ASSIGN_OR_RETURN(Allocator * a,
                   alloc_->ForStream(device.index, stream(device.index)));
  return Tensor::TryEmpty(sizes, dtype, a);
}

absl::StatusOr<Tensor> CudaContext::To(const Tensor& t, Device device) {
  if (!t.defined()) return absl::InvalidArgumentError("To: undefined tensor");
  if (device.is_cuda()) RETURN_IF_ERROR(CheckCudaDevice("To", device));
  if (t.device().is_cuda()) RETURN_IF_ERROR(CheckCudaDevice("To", t.device()));
  if (t.device() == device) return t;
  Tensor host = t;
  if (t.device().is_cuda()) {
    ASSIGN_OR_RETURN(host,
                     CopyToHost(t, stream(t.device().index), *api_));
    if (device.is_cpu()) return host;
  }
  return CopyToDevice(host, device.index, stream(device.index), *alloc_,
                      *api_);
}

absl::Status CudaContext::Synchronize(Device device) {
  RETURN_IF_ERROR(CheckCudaDevice("Synchronize", device));
  return api_->SynchronizeStream(device.index, stream(device.index));
}

absl::StatusOr<void*> CudaContext::Cublas(int device) {
  RETURN_IF_ERROR(CheckCudaDevice("Cublas", Device::CUDA(device)));
  if (!runs_kernels_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "Cublas: the context's ", api_->name(), " devices run no kernels"));
  }
  absl::MutexLock lock(&mu_);
  auto it = cublas_.find(device);
  if (it != cublas_.end()) return it->second;
  int previous = 0;
  cudaGetDevice(&previous);
  cudaSetDevice(device);
  cublasHandle_t handle = nullptr;
  cublasStatus_t st = cublasCreate(&handle);
  if (st == CUBLAS_STATUS_SUCCESS) {
    st = cublasSetStream(handle,
                         reinterpret_cast<cudaStream_t>(stream(device)));
  }
  cudaSetDevice(previous);
  if (st != CUBLAS_STATUS_SUCCESS) {
    if (handle != nullptr) cublasDestroy(handle);
    return absl::InternalError(absl::StrCat("cublasCreate on cuda:", device,
                                            ": ", cublasGetStatusString(st)));
  }
  cublas_[device] = handle;
  return static_cast<void*>(handle);
}

}  // namespace cuda
}  // namespace ferry
