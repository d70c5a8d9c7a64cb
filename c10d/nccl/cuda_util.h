// Minimal CUDA support for c10d's NCCL backend and its tests: an Allocator
// for device memory (plugging into tensor/storage.h) and host<->device
// copies. The tensor library itself has no CUDA code yet.
//
// Errors: CUDA failures become absl::Status naming the call and CUDA's
// message (FailedPrecondition when no device is visible, ResourceExhausted
// for out-of-memory, Internal otherwise).
//
// Thread safety: everything here may be called from any thread; each call
// sets the calling thread's current device as needed.
#ifndef FERRY_C10D_NCCL_CUDA_UTIL_H_
#define FERRY_C10D_NCCL_CUDA_UTIL_H_

#include <cstddef>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ferry/tensor/storage.h"
#include "ferry/tensor/tensor.h"

namespace ferry {
namespace c10d {

// Number of visible CUDA devices; 0 when there is no device or no driver.
int CudaDeviceCount();

// OK, or a Status naming `what` and the CUDA error (`err` is a cudaError_t).
absl::Status CudaStatus(int err, absl::string_view what);

// Device memory on CUDA device `device` (cudaMalloc / cudaFree).
class CudaAllocator : public Allocator {
 public:
  explicit CudaAllocator(int device) : device_(device) {}
  Device device() const override { return Device::CUDA(device_); }
  absl::StatusOr<Storage> Allocate(size_t nbytes) override;

 private:
  const int device_;
};

// A contiguous copy of CPU tensor `t` on CUDA device `device`.
absl::StatusOr<Tensor> CopyToCuda(const Tensor& t, int device);
// A contiguous CPU copy of CUDA tensor `t` (synchronous).
absl::StatusOr<Tensor> CopyToCpu(const Tensor& t);

}  // namespace c10d
}  // namespace ferry

#endif  // FERRY_C10D_NCCL_CUDA_UTIL_H_
