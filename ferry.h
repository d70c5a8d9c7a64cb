// Ferry's umbrella header: what a worker needs. Include as "ferry/ferry.h".
//
//   InitWorker / Worker (ferry/worker/worker.h): start a worker with RPC,
//     RRefs, distributed autograd and the optimizer service installed.
//   rpc: FunctionRegistry, RemoteFunction handles, rpc_sync / rpc_async.
//   RRef<T>, remote(): remote references (ferry/rref/rref.h).
//   Distributed autograd contexts and backward (ferry/autograd/dist/...).
//   Local autograd, nn modules, optimizers, DistributedOptimizer.
//   Tensor, Value, Status helpers (ASSIGN_OR_RETURN, RETURN_IF_ERROR).
// Per-area umbrellas: ferry/c10d.h, ferry/ddp.h, ferry/store.h; tests of
// user code: ferry/testing.h. None of them reaches a gRPC or protobuf
// header (checked by //tests/api:public_headers_test).
#ifndef FERRY_FERRY_H_
#define FERRY_FERRY_H_

#include "ferry/autograd/dist/dist_autograd.h"
#include "ferry/autograd/engine.h"
#include "ferry/autograd/grad_mode.h"
#include "ferry/autograd/nn.h"
#include "ferry/autograd/ops.h"
#include "ferry/common/future.h"
#include "ferry/common/status.h"
#include "ferry/optim/distributed_optimizer.h"
#include "ferry/optim/optim.h"
#include "ferry/rpc/agent.h"
#include "ferry/rpc/function_registry.h"
#include "ferry/rpc/remote_function.h"
#include "ferry/rref/rref.h"
#include "ferry/rref/rref_context.h"
#include "ferry/tensor/tensor.h"
#include "ferry/tensor/value.h"
#include "ferry/worker/worker.h"

#endif  // FERRY_FERRY_H_
