// Copies between CPU tensors and device memory, through a DeviceMemoryApi
// and a CachingDeviceAllocator (what `Tensor::to(device)` will call).
//
// Ordering: each copy is queued on the caller's stream, after the work
// already there, and both calls return once the copy has run: CopyToDevice
// because the source may be pageable memory the caller reuses at once,
// CopyToHost because the caller reads the result. Work queued later on the
// same stream sees the device bytes; another stream must wait for an event
// (and CachingDeviceAllocator::RecordStream the storage). Asynchronous
// copies from pinned host memory, returning an event, are not built yet.
//
// Errors: InvalidArgument naming the op, the devices and the shape for an
// undefined tensor, a source on the wrong kind of device, or a device tensor
// that is not contiguous (no device kernel can compact it yet); allocation
// and copy failures come from the allocator and the API, naming the device.
// Thread safety: as the allocator and the API (any thread).
// Design: docs/design/cuda_allocator.md.
#ifndef FERRY_TENSOR_CUDA_COPY_H_
#define FERRY_TENSOR_CUDA_COPY_H_

#include "absl/status/statusor.h"
#include "ferry/tensor/cuda/caching_allocator.h"
#include "ferry/tensor/cuda/device_api.h"
#include "ferry/tensor/tensor.h"

namespace ferry {
namespace cuda {

/// A contiguous copy of CPU tensor `src` on `device`, allocated from `alloc`
/// for `stream` and written by a copy queued there (see the top).
absl::StatusOr<Tensor> CopyToDevice(const Tensor& src, int device,
                                    StreamHandle stream,
                                    CachingDeviceAllocator& alloc,
                                    DeviceMemoryApi& api);

/// A new CPU tensor with the elements of contiguous device tensor `src`,
/// read by a copy queued on `stream` (see the top).
absl::StatusOr<Tensor> CopyToHost(const Tensor& src, StreamHandle stream,
                                  DeviceMemoryApi& api);

}  // namespace cuda
}  // namespace ferry

#endif  // FERRY_TENSOR_CUDA_COPY_H_
