// The registry Ferry's own backends come in: "gloo" (Gloo alone), "shm"
// (shared memory, ranks on one host) and "auto" (shm when every rank is on
// one host, else Gloo: the default of ProcessGroupOptions) for cpu, "mpi"
// (cpu) where Open MPI is installed and, where CUDA
// is built, "nccl" (cuda), then the out-of-tree backends of the plugins
// listed in FERRY_C10D_PLUGINS (plugin.h; one that fails to load is logged
// as an error naming its file). Each call returns a new, independent
// registry; add your own backends to it with RegisterBackend.
//
// Thread safety: stateless.
#ifndef FERRY_C10D_DEFAULT_REGISTRY_H_
#define FERRY_C10D_DEFAULT_REGISTRY_H_

#include <memory>

#include "ferry/c10d/registry.h"

namespace ferry {
namespace c10d {

// A new registry with the backends and plugins above.
std::shared_ptr<BackendRegistry> MakeDefaultBackendRegistry();

}  // namespace c10d
}  // namespace ferry

#endif  // FERRY_C10D_DEFAULT_REGISTRY_H_
