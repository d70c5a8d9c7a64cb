// DDP umbrella: DistributedDataParallel over a c10d process group, the
// optimizer fused into backward, and the quorum of fault-tolerant DDP.
// Include as "ferry/ddp.h".
#ifndef FERRY_DDP_H_
#define FERRY_DDP_H_

#include "ferry/c10d.h"
#include "ferry/ddp/distributed_data_parallel.h"
#include "ferry/ddp/optimizer_in_backward.h"
#include "ferry/ddp/quorum.h"

#endif  // FERRY_DDP_H_
