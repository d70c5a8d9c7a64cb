#include "ferry/c10d/default_registry.h"

#include "ferry/c10d/gloo/gloo_backend.h"
#include "ferry/c10d/plugin.h"
#include "ferry/c10d/shm/shm_backend.h"
#include "ferry/common/logging.h"
#ifdef FERRY_C10D_WITH_NCCL
#include "ferry/c10d/nccl/nccl_backend.h"
#endif
#ifdef FERRY_C10D_WITH_MPI
#include "ferry/c10d/mpi/mpi_backend.h"
#endif

namespace ferry {
namespace c10d {

std::shared_ptr<BackendRegistry> MakeDefaultBackendRegistry() {
  auto registry = std::make_shared<BackendRegistry>();
  // "gloo" is Gloo alone; "shm" is shared memory (one host only) with Gloo
  // for the operations it lacks; "auto" (the default) picks shm when every
  // rank is on this host and Gloo otherwise (options "shm"=false or
  // FERRY_C10D_SHM=0 keep it on Gloo). Backend::name() says which it built.
  absl::Status s = registry->RegisterBackend("gloo", GlooBackend::Factory(),
                                             {DeviceType::kCPU});
  if (!s.ok()) FERRY_LOG(ERROR) << s;
  s = registry->RegisterBackend("shm", ShmBackend::Factory(),
                                {DeviceType::kCPU});
  if (!s.ok()) FERRY_LOG(ERROR) << s;
  s = registry->RegisterBackend("auto", ShmBackend::AutoFactory(),
                                {DeviceType::kCPU});
  if (!s.ok()) FERRY_LOG(ERROR) << s;
#ifdef FERRY_C10D_WITH_MPI
  // MPI starts only when a group on it is created (under mpirun).
  s = registry->RegisterBackend("mpi", MpiBackend::Factory(),
                                {DeviceType::kCPU});
  if (!s.ok()) FERRY_LOG(ERROR) << s;
#endif
#ifdef FERRY_C10D_WITH_NCCL
  s = registry->RegisterBackend("nccl", NcclBackend::Factory(),
                                {DeviceType::kCUDA});
  if (!s.ok()) FERRY_LOG(ERROR) << s;
#endif
  // Out-of-tree backends (plugin.h). A plugin that fails is logged with its
  // file; creating a group on its backend then fails as an unknown name.
  s = LoadBackendPluginsFromEnv(*registry);
  if (!s.ok()) FERRY_LOG(ERROR) << s;
  return registry;
}

}  // namespace c10d
}  // namespace ferry
