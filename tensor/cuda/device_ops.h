// DeviceOps: the compute backend of device tensors, as autograd sees it.
// A device tensor's Storage carries the DeviceOps of the context that made
// it (Storage::compute), so autograd's ops and engine find the kernels for
// their operands without a process-wide registry and without depending on
// CUDA: this header is plain C++. Implementations: the CUDA ops of ops.h
// (CreateComputeContext) and, for tests on machines without a GPU, host
// loops over FakeDeviceApi memory (host_ops.h).
//
// Contract of every method: operands are defined float32/float64 tensors
// (targets int64, conditions bool; float16/bfloat16 too, computed in
// float32, except for embedding, nll_loss and dropout masks) on one device
// of the backend's context;
// results are new contiguous tensors on that device (Fill, AddInPlace and
// CopyInto write in place). Errors are Status (InvalidArgument naming the
// op, each operand's dtype, shape and device; FailedPrecondition once the
// context is destroyed); nothing aborts.
// Ownership: storages hold the backend by shared_ptr; the backend refers to
// its context, which detaches it on destruction (calls then fail).
// Thread safety: every method may be called from any thread.
// Design: docs/design/cuda_kernels.md.
#ifndef FERRY_TENSOR_CUDA_DEVICE_OPS_H_
#define FERRY_TENSOR_CUDA_DEVICE_OPS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ferry/tensor/cuda/kernel_math.h"
#include "ferry/tensor/tensor.h"

namespace ferry {
namespace cuda {

/// The ops autograd runs on device tensors (see the top of the file).
class DeviceOps : public DeviceComputeInterface {
 public:
  ~DeviceOps() override = default;
  /// "cuda" or "host-fake": for messages.
  virtual std::string name() const = 0;
  /// Called by the context's destructor: later calls fail.
  virtual void Detach() = 0;

  /// `t` on `device` (CPU or one of this backend's devices); `t` itself
  /// when already there; waits for the copy.
  virtual absl::StatusOr<Tensor> To(const Tensor& t, Device device) = 0;
  /// Uninitialized contiguous tensor on CUDA `device`.
  virtual absl::StatusOr<Tensor> Empty(const std::vector<int64_t>& sizes,
                                       DType dtype, Device device) = 0;
  /// op(x) elementwise.
  virtual absl::StatusOr<Tensor> Unary(math::UnaryOp op, const Tensor& x) = 0;
  /// a op b, broadcasting.
  virtual absl::StatusOr<Tensor> Binary(math::BinaryOp op, const Tensor& a,
                                        const Tensor& b) = 0;
  /// x op s.
  virtual absl::StatusOr<Tensor> Scalar(math::BinaryOp op, const Tensor& x,
                                        double s) = 0;
  /// Activation backward (math::BackwardOp says what `saved` is).
  virtual absl::StatusOr<Tensor> UnaryBackward(math::BackwardOp op,
                                               const Tensor& g,
                                               const Tensor& saved) = 0;
  /// Sets every element of contiguous `x` to `value`.
  virtual absl::Status Fill(const Tensor& x, double value) = 0;
  /// acc += x (same shape; acc contiguous).
  virtual absl::Status AddInPlace(const Tensor& acc, const Tensor& x) = 0;
  /// Sum of every element, 0-d.
  virtual absl::StatusOr<Tensor> Sum(const Tensor& x) = 0;
  /// Sum over `dim`.
  virtual absl::StatusOr<Tensor> SumDim(const Tensor& x, int64_t dim,
                                        bool keepdim) = 0;
  /// Softmax (log-softmax if `log`) over the last dimension.
  virtual absl::StatusOr<Tensor> Softmax(const Tensor& x, bool log) = 0;
  /// Its input gradient from the output `y` and gradient `g`.
  virtual absl::StatusOr<Tensor> SoftmaxBackward(const Tensor& g,
                                                 const Tensor& y,
                                                 bool log) = 0;
  /// Mean cross-entropy of logits [N, C] against targets [N]: (loss, lse).
  virtual absl::StatusOr<std::pair<Tensor, Tensor>> CrossEntropy(
      const Tensor& logits, const Tensor& target) = 0;
  /// The logits' gradient from the forward's lse and the loss gradient.
  virtual absl::StatusOr<Tensor> CrossEntropyBackward(
      const Tensor& logits, const Tensor& target, const Tensor& lse,
      const Tensor& grad_loss) = 0;
  /// Rows of weight [V, D] at int64 `indices` (any shape): [*indices, D];
  /// an index outside [0, V) is InvalidArgument.
  virtual absl::StatusOr<Tensor> Embedding(const Tensor& weight,
                                           const Tensor& indices) = 0;
  /// The weight's gradient [vocab, D] from the output gradient (repeated
  /// indices accumulate).
  virtual absl::StatusOr<Tensor> EmbeddingBackward(const Tensor& g,
                                                   const Tensor& indices,
                                                   int64_t vocab) = 0;
  /// op(a) @ op(b) of 2-D tensors.
  virtual absl::StatusOr<Tensor> Matmul(const Tensor& a, const Tensor& b,
                                        bool transpose_a,
                                        bool transpose_b) = 0;
  /// Copies `src` (broadcast to dst's shape) into the strided view `dst`
  /// of a device tensor (a slice of a larger one: cat, slice backward);
  /// dst's elements must be distinct. Any dtype, the same for both.
  virtual absl::Status CopyInto(const Tensor& dst, const Tensor& src) = 0;
  /// A contiguous copy of `x` (float32/float64/float16/bfloat16) as
  /// `dtype` (one of those); 16-bit results round to nearest even from
  /// float32, as the CPU's conversions do.
  virtual absl::StatusOr<Tensor> Cast(const Tensor& x, DType dtype) = 0;
  /// cond ? a : b elementwise, broadcasting; cond is bool.
  virtual absl::StatusOr<Tensor> Where(const Tensor& cond, const Tensor& a,
                                       const Tensor& b) = 0;
  /// Mean over rows of -log_probs[r, target[r]], 0-d, for log_probs [N, C]
  /// and int64 target [N]; a target outside [0, C) is InvalidArgument.
  virtual absl::StatusOr<Tensor> NllLoss(const Tensor& log_probs,
                                         const Tensor& target) = 0;
  /// The log-probabilities' gradient [N, classes] from the 0-d loss
  /// gradient (targets as the forward checked them).
  virtual absl::StatusOr<Tensor> NllLossBackward(const Tensor& target,
                                                 const Tensor& grad_loss,
                                                 int64_t classes) = 0;
  /// A dropout mask of `sizes` on CUDA `device`: element i (row-major) is
  /// math::DropoutScale(seed, offset + i, p), 0 or 1 / (1 - p), the same on
  /// every backend (Philox counters); p in [0, 1].
  virtual absl::StatusOr<Tensor> DropoutMask(const std::vector<int64_t>& sizes,
                                             DType dtype, Device device,
                                             double p, uint64_t seed,
                                             uint64_t offset) = 0;
  /// op(a_i) @ op(b_i) for each i of 3-D operands [B, *, *] (one
  /// strided-batched GEMM on CUDA): [B, m, n].
  virtual absl::StatusOr<Tensor> BatchedMatmul(const Tensor& a,
                                               const Tensor& b,
                                               bool transpose_a,
                                               bool transpose_b) = 0;
  /// One SGD step of contiguous `param` in place (`buf` when momentum).
  virtual absl::Status SgdStep(const Tensor& param, const Tensor& grad,
                               const Tensor& buf,
                               const math::SgdParams& o) = 0;
  /// One Adam/AdamW step in place; `o` from math::AdamForStep.
  virtual absl::Status AdamStep(const Tensor& param, const Tensor& grad,
                                const Tensor& exp_avg,
                                const Tensor& exp_avg_sq,
                                const math::AdamParams& o) = 0;
  /// One Adagrad step in place (`sum` contiguous, like `param`).
  virtual absl::Status AdagradStep(const Tensor& param, const Tensor& grad,
                                   const Tensor& sum,
                                   const math::AdagradParams& o) = 0;

  // Streams, for code that orders its own work across streams (DDP's
  // communication stream). A stream is the context's StreamHandle
  // (device_api.h: a cudaStream_t on CUDA); every op above is queued on
  // CurrentStream of its operands' device.
  /// A new stream of CUDA `device`, owned by the backend's context.
  virtual absl::StatusOr<uintptr_t> NewStream(Device device) = 0;
  /// The stream work queued by this thread on `device` goes to.
  virtual absl::StatusOr<uintptr_t> CurrentStream(Device device) = 0;
  /// Makes `stream` the current stream of `device` for this thread only
  /// (nullopt: back to the device's own); returns the thread's previous
  /// choice. Use ThreadStreamGuard.
  virtual absl::StatusOr<std::optional<uintptr_t>> SetThreadStream(
      Device device, std::optional<uintptr_t> stream) = 0;
  /// Work queued later on `waiter` waits, on the device, for the work
  /// queued on `producer` so far (an event recorded now); the host goes on.
  virtual absl::Status StreamWaitStream(Device device, uintptr_t waiter,
                                        uintptr_t producer) = 0;
  /// Queues a copy of contiguous `src` into contiguous `dst` (one device,
  /// dtype and element count) on `stream`; returns once queued.
  virtual absl::Status CopyAsync(const Tensor& dst, const Tensor& src,
                                 uintptr_t stream) = 0;
  /// Notes that work on `stream` uses `t`'s memory: the allocator reuses
  /// it only after that work (CachingDeviceAllocator::RecordStream).
  virtual absl::Status RecordStream(const Tensor& t, uintptr_t stream) = 0;
};

/// Makes a stream this thread's current one on a device for its lifetime
/// (DeviceOps::SetThreadStream), restoring the previous choice after.
class ThreadStreamGuard {
 public:
  /// `ops` (not null) must outlive the guard. Check status() after.
  ThreadStreamGuard(DeviceOps* ops, Device device, uintptr_t stream);
  ~ThreadStreamGuard();
  ThreadStreamGuard(const ThreadStreamGuard&) = delete;
  ThreadStreamGuard& operator=(const ThreadStreamGuard&) = delete;
  /// Why the stream could not be set (then the guard does nothing).
  const absl::Status& status() const { return status_; }

 private:
  DeviceOps* ops_;
  Device device_;
  std::optional<uintptr_t> previous_;
  absl::Status status_;
};

/// The backend of device tensor `t` (its storage's), or null for a CPU
/// tensor or a device tensor made without one (e.g. by DLPack import).
DeviceOps* DeviceOpsOf(const Tensor& t);

/// The NumPy broadcast of shapes `a` and `b` (aligned at the last
/// dimension; sizes equal or 1), or nullopt when they do not broadcast.
std::optional<std::vector<int64_t>> BroadcastSizes(
    const std::vector<int64_t>& a, const std::vector<int64_t>& b);

/// "float32 [2, 3] on cuda:0": an operand in error messages.
std::string DescribeOperand(const Tensor& t);

}  // namespace cuda
}  // namespace ferry

#endif  // FERRY_TENSOR_CUDA_DEVICE_OPS_H_
