// Functional optimizers as DDP bucket steps (ReducerOptions::
// optimizer_in_backward): each bucket's parameters are updated the moment
// its averaged gradients arrive, so the optimizer step ends with backward.
//
// Each returned step keeps per-parameter state (momentum, Adam moments)
// indexed by registration index, so it survives bucket rebuilds. The result
// equals calling the same functional step on all parameters after Backward
// (same gradients, same per-element arithmetic).
//
// Thread safety: a returned step is called by one Reducer on its training
// thread; do not share one between DDP instances.
#ifndef FERRY_DDP_OPTIMIZER_IN_BACKWARD_H_
#define FERRY_DDP_OPTIMIZER_IN_BACKWARD_H_

#include <cstddef>

#include "ferry/ddp/reducer.h"
#include "ferry/optim/optim.h"

namespace ferry::ddp {

// `num_params`: how many parameters the DDP holds.
BucketOptimizer SgdInBackward(optim::SgdOptions options, size_t num_params);
// Adam per bucket (AdamW with `decoupled_weight_decay`).
BucketOptimizer AdamInBackward(optim::AdamOptions options, size_t num_params,
                               bool decoupled_weight_decay = false);

}  // namespace ferry::ddp

#endif  // FERRY_DDP_OPTIMIZER_IN_BACKWARD_H_
