// The devices of one parameter-server process (--device=cuda): the device
// API its worker stages tensors over, the compute backend autograd and the
// optimizers run device tensors on, and the transport between device
// workers. Each binary links one definition of OpenPsDevices: the CPU
// binary's refuses (it has no CUDA), parameter_server_cuda's opens the CUDA
// runtime (CUDA's reason when there is no GPU), and the testonly
// parameter_server_fake's makes FakeDeviceApi host memory computing through
// the host backend (tensor/cuda/host_ops.h), so the job runs without a GPU.
//
// Ownership: the returned PsDevices owns the context; it must outlive the
// worker and every device tensor of the process.
// Errors: FailedPrecondition naming `who` and the reason.
// Thread safety: OpenPsDevices is called once per process, before its worker.
// Design: docs/design/cuda_rpc.md ("The parameter-server job on devices").
#ifndef FERRY_EXAMPLES_PARAMETER_SERVER_PS_DEVICES_H_
#define FERRY_EXAMPLES_PARAMETER_SERVER_PS_DEVICES_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "ferry/tensor/cuda/device_api.h"
#include "ferry/tensor/cuda/device_ops.h"

namespace ferry::ps_example {

/// What a process computing on devices holds (see the top of the file).
struct PsDevices {
  /// Where the devices live (WorkerOptions::device_api).
  std::shared_ptr<cuda::DeviceMemoryApi> api;
  /// The backend device tensors compute with (WorkerOptions::device_compute).
  std::shared_ptr<cuda::DeviceOps> compute;
  /// WorkerOptions::cuda_transport: "auto" on CUDA, "staged" over the fake
  /// (whose IPC needs a FakeHost shared in one process).
  std::string transport = "auto";
  /// Keeps the context behind `api` and `compute` alive.
  std::shared_ptr<void> owner;
};

/// Opens this process's devices; `who` (e.g. "trainer0") names it in errors.
absl::StatusOr<PsDevices> OpenPsDevices(const std::string& who);

}  // namespace ferry::ps_example

#endif  // FERRY_EXAMPLES_PARAMETER_SERVER_PS_DEVICES_H_
