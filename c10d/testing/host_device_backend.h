// HostDeviceBackend: collectives on "cuda" tensors whose bytes are host
// memory (tensor/cuda/host_ops.h's FakeDeviceApi devices), for tests of
// device-gradient code (DDP's device buckets) on machines without a GPU. It
// aliases each device tensor as a CPU tensor over the same bytes and hands
// it to a Gloo backend of its own, so the reduction is Gloo's, in place.
//
// Only Allreduce and Broadcast are served (what DDP issues on device
// tensors); the rest fail with Unimplemented as Backend's defaults do. A
// tensor on a real GPU would be read as host memory: never register this
// where CUDA devices exist (tests pair it with host_ops contexts only).
// Errors: a CPU tensor or an undefined one is InvalidArgument naming the
// operation; Gloo's own errors otherwise.
// Thread safety: as GlooBackend (any thread; issue order matches ranks).
// Design: docs/design/ddp.md ("Gradients on a device").
#ifndef FERRY_C10D_TESTING_HOST_DEVICE_BACKEND_H_
#define FERRY_C10D_TESTING_HOST_DEVICE_BACKEND_H_

#include "ferry/c10d/registry.h"

namespace ferry {
namespace testutil {

/// A factory for BackendRegistry::RegisterBackend (devices {cuda}).
c10d::BackendFactory HostDeviceBackendFactory();

}  // namespace testutil
}  // namespace ferry

#endif  // FERRY_C10D_TESTING_HOST_DEVICE_BACKEND_H_
