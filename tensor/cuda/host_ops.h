// A host-executing compute backend for tests without a GPU: device tensors
// live in FakeDeviceApi memory (host memory), and the "kernels" are host
// loops around the per-element math of kernel_math.h (the functions
// kernels.cu calls), with plain loops for matrix products. Autograd on such
// "cuda:N" tensors runs the device dispatch end to end, so it can be
// compared with CPU autograd on any machine. An op runs at once, after
// completing what its device's current stream has queued and waits for
// (FakeDeviceApi::CompleteStreamAndWaits), as a kernel queued there would.
//
// What it does not test: the CUDA kernels' indexing, launch configuration,
// block reductions and cuBLAS (those run only on a GPU, in ops_test and
// autograd_dispatch_test's GPU cases).
// Errors: as device_ops.h (InvalidArgument naming the op and operands).
// Thread safety: as device_ops.h; operands follow tensor.h.
// Design: docs/design/cuda_kernels.md.
#ifndef FERRY_TENSOR_CUDA_HOST_OPS_H_
#define FERRY_TENSOR_CUDA_HOST_OPS_H_

#include <memory>

#include "absl/status/statusor.h"
#include "ferry/tensor/cuda/context.h"
#include "ferry/tensor/cuda/fake_device_api.h"

namespace ferry {
namespace cuda {

/// A context over `api` whose device tensors compute on the host (see the
/// top of the file); ops.h's functions on it still report that it runs no
/// kernels.
absl::StatusOr<std::unique_ptr<CudaContext>> CreateHostComputeContext(
    std::shared_ptr<FakeDeviceApi> api, CudaContext::Options options);

}  // namespace cuda
}  // namespace ferry

#endif  // FERRY_TENSOR_CUDA_HOST_OPS_H_
