// Reducer: averages gradients across the ranks of a process group in
// buckets, overlapping each bucket's all-reduce with the rest of backward.
// A pass: Prepare(outputs) -> autograd backward (hooks fire) -> Finish();
// Finish leaves the averaged gradient in each parameter's .grad. Buckets are
// launched strictly in bucket order, so every rank's collective sequence is
// identical.
//
// State machine (guarded by mu_):
//   kIdle --Prepare--> kActive --Finish--> kIdle
//   any error in Prepare/Finish (communication failure, timeout, a parameter
//   that got no gradient) --> kBroken (terminal: make a new group and DDP).
// Invariants:
//   1. Hooks change state only in kActive; otherwise they return at once.
//   2. In kActive, ready_[i] iff parameter i's gradient for this pass is in
//      its bucket slot (or was marked ready as unused).
//   3. bucket.pending == number of its parameters not ready.
//   4. Buckets [0, next_launch_) have been launched (futures set), and a
//      bucket is launched only once pending == 0, in index order.
//   5. Buckets [0, next_complete_) have their averaged gradients in .grad
//      (and, with optimizer_in_backward, their step done);
//      next_complete_ <= next_launch_.
//   6. Outside kActive no launched future is outstanding.
//
// Device gradients: bucketed and reduced on a communication stream after
// each producer's stream; the caller's stream then waits for it (ddp.md).
// Thread safety: Prepare/Finish are called from the training thread; hooks
// fire on the backward pass's thread. Communication hooks run under the
// reducer's lock on the backward thread: they must only issue collectives
// and return a future, never call back into the reducer.
// Design: docs/design/ddp.md
#ifndef FERRY_DDP_REDUCER_H_
#define FERRY_DDP_REDUCER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ferry/c10d/process_group.h"
#include "ferry/common/future.h"
#include "ferry/common/sync.h"
#include "ferry/tensor/cuda/device_ops.h"
#include "ferry/tensor/tensor.h"

namespace ferry::ddp {

// One bucket as a communication hook sees it.
struct GradBucket {
  int index = 0;  // The bucket's position in launch order.
  // Flat, contiguous, one dtype: the local gradients of `parameters`
  // (summed over any no_sync passes), each at its offset.
  Tensor buffer;
  // Indices (registration order) of the parameters in this bucket.
  std::vector<int> parameters;
  int world_size = 1;  // The group's size.
  // Device buckets: the communication stream, current on the hook's thread
  // while it runs; pass it as AllreduceOptions::stream. 0 on the CPU.
  uintptr_t stream = 0;
};

// Returns a future of the bucket's *averaged* gradients: a flat tensor with
// buffer.numel() elements (any floating dtype; converted back when it is
// not the buffer itself). Must issue its collectives before returning.
using CommHook =
    std::function<Future<Tensor>(c10d::ProcessGroup& pg, const GradBucket&)>;

// Divides by the world size and all-reduces (SUM) the buffer in place.
CommHook AllreduceHook();
// Same in float16 / bfloat16: compress, all-reduce, decompress into the
// buffer (half the bytes on the wire for float32 gradients).
CommHook Fp16CompressHook();
CommHook Bf16CompressHook();  // The same in bfloat16.

// An optimizer step over one bucket's parameters, run as soon as the
// bucket's averaged gradients are in place (optimizer overlapped with
// communication): `indices` are the parameters' registration indices,
// `grads` their averaged gradients (views into the bucket buffer). Runs on
// the training thread, during backward (from a later parameter's hook) or
// in Finish. See optimizer_in_backward.h for ready-made ones.
using BucketOptimizer = std::function<absl::Status(
    const std::vector<int>& indices, const std::vector<Tensor>& params,
    const std::vector<Tensor>& grads)>;

// How the Reducer buckets and reduces (docs/guide/ddp.md lists them).
struct ReducerOptions {
  int64_t first_bucket_bytes = int64_t{1} << 20;  // Cap of the first bucket.
  int64_t bucket_cap_bytes = int64_t{25} << 20;  // Cap of the others.
  bool gradient_as_bucket_view = false;  // .grad is a view into the bucket.
  bool find_unused_parameters = false;  // See Prepare.
  // Rebuild buckets in ready order after the first pass (see above).
  bool rebuild_buckets = true;
  // The graph (which parameters are used, and their ready order) is the
  // same every pass: find_unused_parameters traverses the graph only on
  // the first pass, and buckets are rebuilt even with find_unused. (A
  // parameter the first pass did not use whose gradient arrives later is
  // not reduced: it counts as ready from Prepare on.)
  bool static_graph = false;
  // Null: the caller steps after Backward. Set: the step happens per
  // bucket inside Backward, and .grad still holds the averaged gradients.
  BucketOptimizer optimizer_in_backward;
  // Bounds Finish's wait for all buckets.
  absl::Duration timeout = absl::Minutes(30);
  CommHook comm_hook;  // Null: AllreduceHook().
};

// Parameter indices per bucket: `order` (indices into `params`) is cut
// into buckets of one dtype each, the first up to `first_cap` bytes, the
// rest up to `cap` bytes (a parameter larger than the cap is alone).
std::vector<std::vector<int>> AssignBuckets(const std::vector<Tensor>& params,
                                            const std::vector<int>& order,
                                            int64_t first_cap, int64_t cap);

// Buckets and averages one model's gradients (see the top of this file).
class Reducer : public std::enable_shared_from_this<Reducer> {
 public:
  // `params` are leaves that require grad, identical in shape, dtype and
  // order on every rank. Registers a post-accumulate hook on each (the hook
  // holds the reducer weakly, so parameters may outlive it).
  static absl::StatusOr<std::shared_ptr<Reducer>> Create(
      std::vector<std::pair<std::string, Tensor>> named_params,
      std::shared_ptr<c10d::ProcessGroup> pg, ReducerOptions options);

  // Starts a synchronized pass whose loss depends on `outputs`. With
  // find_unused_parameters, parameters `outputs` do not reach are marked
  // ready now. FailedPrecondition when a pass is already active or the
  // reducer is broken.
  absl::Status Prepare(const std::vector<Tensor>& outputs);
  // Waits for every bucket and writes the averaged gradients to .grad.
  // FailedPrecondition naming the parameters (and this rank) that got no
  // gradient (find_unused_parameters off); the communication error
  // otherwise. Any error leaves the reducer broken.
  absl::Status Finish();

  // Buckets as parameter indices (for tests and logs).
  std::vector<std::vector<int>> buckets() const;
  // Bytes handed to the communication hook so far (buffer bytes, before
  // any compression).
  int64_t bytes_reduced() const;
  // Passes completed by Finish.
  int64_t passes() const;
  // Bucket optimizer steps that ran before Finish (during backward).
  int64_t steps_during_backward() const;
  // The stream device buckets are filled and reduced on (0 on the CPU).
  uintptr_t comm_stream() const;

  // For the hooks only.
  void OnGradReady(int index);

 private:
  enum class State { kIdle, kActive, kBroken };
  struct Bucket {
    std::vector<int> params;
    std::vector<int64_t> offsets;  // Element offset of each parameter.
    Tensor buffer;
    int pending = 0;
    Future<Tensor> result;  // Valid once launched.
  };

  Reducer(std::vector<std::pair<std::string, Tensor>> named_params,
          std::shared_ptr<c10d::ProcessGroup> pg, ReducerOptions options);

  // Builds buckets_ from parameter index lists; re-points .grad views.
  // Fails only when a device buffer cannot be made (out of memory).
  absl::Status BuildBuckets(const std::vector<std::vector<int>>& groups)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Puts the parameter's current .grad (or zeros) into its slot; a device
  // copy's failure is kept in deferred_ for Finish.
  void CopyIntoSlot(int index) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Gradient `g` (undefined: zeros) into `slot`; on a device, on the
  // communication stream after the gradient's producer.
  absl::Status FillSlot(const Tensor& slot, const Tensor& g)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Device: bucket `b`'s averaged `result` into its buffer and .grad, on
  // the communication stream.
  absl::Status CopyOutOnComm(const Bucket& b, const Tensor& result)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Device: this thread's current stream waits for the communication one.
  absl::Status ComputeWaitsForComm() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MarkReady(int index) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LaunchReadyBuckets() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Finishes bucket `k` (its result is ready): averaged values into the
  // buffer and .grad, then the optimizer step when configured.
  absl::Status CompleteBucket(int k) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Completes launched buckets whose results are ready, without waiting.
  void CompleteFinishedBuckets() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Parameters reachable from `outputs` through the autograd graph.
  std::vector<bool> Reachable(const std::vector<Tensor>& outputs) const;
  absl::Status MissingError() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Agrees on rank 0's ready order and rebuilds the buckets with it.
  absl::Status Rebuild() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::vector<std::string> names_;
  const std::vector<Tensor> params_;
  const std::shared_ptr<c10d::ProcessGroup> pg_;
  const ReducerOptions options_;
  // Autograd meta address of each parameter -> index (graph traversal).
  std::unordered_map<const void*, int> index_of_;
  // Device parameters (set by Create, before any hook; then read-only):
  // their backend (kept alive by their storage), device and the
  // communication stream the backend owns. Null / 0 on the CPU.
  cuda::DeviceOps* ops_ = nullptr;
  Device device_;
  uintptr_t comm_stream_ = 0;

  mutable Mutex mu_;
  State state_ ABSL_GUARDED_BY(mu_) = State::kIdle;
  std::vector<Bucket> buckets_ ABSL_GUARDED_BY(mu_);
  std::vector<int> bucket_of_ ABSL_GUARDED_BY(mu_);    // Per parameter.
  std::vector<int> position_of_ ABSL_GUARDED_BY(mu_);  // Within its bucket.
  // Parameter i's slot in its bucket buffer, shaped like the parameter.
  std::vector<Tensor> views_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> ready_ ABSL_GUARDED_BY(mu_);
  int next_launch_ ABSL_GUARDED_BY(mu_) = 0;
  // Buckets [0, next_complete_) are completed (next_complete_ <=
  // next_launch_); the first error doing so during backward.
  int next_complete_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status deferred_ ABSL_GUARDED_BY(mu_);
  // static_graph: reachability from the first pass.
  std::vector<bool> static_reached_ ABSL_GUARDED_BY(mu_);
  int64_t steps_during_backward_ ABSL_GUARDED_BY(mu_) = 0;
  // Parameter indices in the order they became ready (first pass only).
  std::vector<int> ready_order_ ABSL_GUARDED_BY(mu_);
  bool rebuilt_ ABSL_GUARDED_BY(mu_) = false;
  int64_t bytes_reduced_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t passes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ferry::ddp

#endif  // FERRY_DDP_REDUCER_H_
