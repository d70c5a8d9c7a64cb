// c10d umbrella: process groups over a store, with the registered backends
// (gloo, shared memory; mpi and nccl where built). Include as
// "ferry/c10d.h". Start here: ferry/c10d/init.h (InitProcessGroup).
#ifndef FERRY_C10D_H_
#define FERRY_C10D_H_

#include "ferry/c10d/backend.h"
#include "ferry/c10d/default_registry.h"
#include "ferry/c10d/init.h"
#include "ferry/c10d/process_group.h"
#include "ferry/c10d/registry.h"
#include "ferry/c10d/types.h"
#include "ferry/c10d/work.h"

#endif  // FERRY_C10D_H_
