// Test-only: CUDA tensors for tests of the device stage (staged and IPC
// paths) over any DeviceMemoryApi, FakeDeviceApi included. Failures are
// reported to GoogleTest (ADD_FAILURE / EXPECT) rather than returned, so a
// test reads as a sequence of checks. Also what a worker's stage holds.
//
// Thread safety: reentrant functions. Design: docs/design/cuda_rpc.md.
#ifndef FERRY_WORKER_DEVICE_TESTING_H_
#define FERRY_WORKER_DEVICE_TESTING_H_

#include <cstdint>

#include "ferry/tensor/cuda/caching_allocator.h"
#include "ferry/tensor/cuda/device_api.h"
#include "ferry/tensor/tensor.h"
#include "ferry/worker/worker.h"

namespace ferry {

/// CPU tensor `cpu` copied onto `device` of `api`, allocated from `alloc`
/// (an undefined tensor, and a test failure, when the copy fails).
Tensor OnDevice(const Tensor& cpu, int device,
                cuda::CachingDeviceAllocator& alloc, cuda::DeviceMemoryApi& api);

/// Whether device tensor `dev` (of `api`) holds the shape, dtype and bytes
/// of CPU tensor `cpu`.
bool SameBytes(const Tensor& dev, const Tensor& cpu,
               cuda::DeviceMemoryApi& api);

/// The pinned bytes `w` holds for messages now (the "devices" inspector's
/// "pinned" row); -1 when it shows none.
int64_t PinnedBytesInUse(Worker& w);

}  // namespace ferry

#endif  // FERRY_WORKER_DEVICE_TESTING_H_
