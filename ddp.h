// DDP umbrella: DistributedDataParallel over a c10d process group, and the
// optimizer fused into backward. Include as "ferry/ddp.h".
#ifndef FERRY_DDP_H_
#define FERRY_DDP_H_

#include "ferry/c10d.h"
#include "ferry/ddp/distributed_data_parallel.h"
#include "ferry/ddp/optimizer_in_backward.h"

#endif  // FERRY_DDP_H_
