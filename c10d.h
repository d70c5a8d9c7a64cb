// c10d umbrella: process groups over a store, with the registered backends
// (gloo, shared memory; mpi and nccl where built). Include as
// "ferry/c10d.h". Start here: ferry/c10d/init.h (InitProcessGroup).
// Backends of your own: ferry/c10d/registry.h (RegisterBackend), the shared
// CPU reduction kernels in ferry/c10d/reduce.h, and out-of-tree backends
// as shared libraries in ferry/c10d/plugin.h (FERRY_C10D_PLUGIN,
// FERRY_C10D_PLUGINS).
#ifndef FERRY_C10D_H_
#define FERRY_C10D_H_

#include "ferry/c10d/backend.h"
#include "ferry/c10d/default_registry.h"
#include "ferry/c10d/init.h"
#include "ferry/c10d/plugin.h"
#include "ferry/c10d/process_group.h"
#include "ferry/c10d/reduce.h"
#include "ferry/c10d/registry.h"
#include "ferry/c10d/types.h"
#include "ferry/c10d/work.h"

#endif  // FERRY_C10D_H_
