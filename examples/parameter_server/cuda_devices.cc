// OpenPsDevices of parameter_server_cuda: the CUDA runtime's devices with
// the CUDA kernels (cuda::CreateComputeContext).
#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "ferry/examples/parameter_server/ps_devices.h"
#include "ferry/tensor/cuda/context.h"
#include "ferry/tensor/cuda/ops.h"

namespace ferry::ps_example {

absl::StatusOr<PsDevices> OpenPsDevices(const std::string& who) {
  absl::StatusOr<std::unique_ptr<cuda::CudaContext>> made =
      cuda::CreateComputeContext({});
  if (!made.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat(who, ": --device=cuda: ", made.status().message()));
  }
  std::shared_ptr<cuda::CudaContext> ctx = *std::move(made);
  PsDevices d;
  // Aliasing: the API is the context's and lives as long as it does.
  d.api = std::shared_ptr<cuda::DeviceMemoryApi>(ctx, &ctx->api());
  d.compute = ctx->shared_compute();
  d.transport = "auto";
  d.owner = ctx;
  return d;
}

}  // namespace ferry::ps_example
