// OpenPsDevices of the CPU-only parameter_server binary: it has no CUDA.
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "ferry/examples/parameter_server/ps_devices.h"

namespace ferry::ps_example {

absl::StatusOr<PsDevices> OpenPsDevices(const std::string& who) {
  return absl::FailedPreconditionError(absl::StrCat(
      who, ": this parameter_server binary is built without CUDA; "
           "--device=cuda needs //examples/parameter_server:"
           "parameter_server_cuda"));
}

}  // namespace ferry::ps_example
