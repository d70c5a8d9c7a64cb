// OpenPsDevices of the testonly parameter_server_fake: --fake_devices
// FakeDeviceApi devices of host memory per process, computing through the
// host backend (tensor/cuda/host_ops.h). Each process has its own fake (no
// FakeHost spans processes), so device tensors travel staged.
#include <cstdint>
#include <memory>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "ferry/examples/parameter_server/ps_devices.h"
#include "ferry/tensor/cuda/context.h"
#include "ferry/tensor/cuda/fake_device_api.h"
#include "ferry/tensor/cuda/host_ops.h"

ABSL_FLAG(int, fake_devices, 1,
          "parameter_server_fake: FakeDeviceApi devices per process");
ABSL_FLAG(int64_t, fake_device_mib, 1024,
          "parameter_server_fake: capacity of each fake device (MiB)");

namespace ferry::ps_example {

absl::StatusOr<PsDevices> OpenPsDevices(const std::string& who) {
  const int count = absl::GetFlag(FLAGS_fake_devices);
  const int64_t mib = absl::GetFlag(FLAGS_fake_device_mib);
  if (count < 1 || mib < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, ": need --fake_devices >= 1 and --fake_device_mib >= 1"));
  }
  auto api = std::make_shared<cuda::FakeDeviceApi>(
      count, static_cast<uint64_t>(mib) << 20);
  absl::StatusOr<std::unique_ptr<cuda::CudaContext>> made =
      cuda::CreateHostComputeContext(api, {});
  if (!made.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat(who, ": fake devices: ", made.status().message()));
  }
  std::shared_ptr<cuda::CudaContext> ctx = *std::move(made);
  PsDevices d;
  d.api = api;
  d.compute = ctx->shared_compute();
  d.transport = "staged";
  d.owner = ctx;
  return d;
}

}  // namespace ferry::ps_example
