// CudaContext: what device tensors and the CUDA ops (ops.h) need, owned by
// one explicit object the program creates and passes around: the device
// API, one CachingDeviceAllocator serving every device, a pinned
// CachingHostAllocator for asynchronous copies, and cuBLAS (loaded
// with dlopen on the first Gemm, so binaries run where only the driver and
// cudart are: then Gemm is FailedPrecondition naming the library; one
// handle per device). There is no process-wide instance: a
// program makes one (normally one per process, since CUDA's own per-device
// context is process-wide anyway) and keeps it alive while any of its
// tensors or queued work is. Device tensors' storage keeps the allocator's
// state alive on its own (caching_allocator.h).
//
// Streams: each device has a current stream (the legacy default stream, 0,
// until SetStream; NewStream makes streams the context owns; a thread may
// override it for itself with SetThreadStream), on which ops, copies and
// Gemm are queued, so work on one stream is ordered. Across streams the
// caller orders work (RecordEvent, then StreamWait on the device or Wait on
// the host) and calls allocator().RecordStream for a tensor one stream made
// and another uses, as for copy.h.
//
// Errors: Create without a driver or device is FailedPrecondition naming
// CUDA's reason; a device index outside [0, device_count) is InvalidArgument
// naming it and the count; copies report as copy.h.
// Thread safety: every method may be called from any thread (cuBLAS, its
// handles and the owned streams are under an annotated mutex; Gemm binds a
// handle to the current stream and calls it under that mutex).
// Design: docs/design/cuda_kernels.md.
#ifndef FERRY_TENSOR_CUDA_CONTEXT_H_
#define FERRY_TENSOR_CUDA_CONTEXT_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "ferry/tensor/cuda/caching_allocator.h"
#include "ferry/tensor/cuda/device_api.h"
#include "ferry/tensor/cuda/device_ops.h"
#include "ferry/tensor/cuda/event.h"
#include "ferry/tensor/cuda/pinned_allocator.h"
#include "ferry/tensor/tensor.h"

namespace ferry {
namespace cuda {

/// Devices, allocator and cuBLAS handles (see the top of the file).
class CudaContext {
 public:
  /// Configuration.
  struct Options {
    CachingDeviceAllocator::Options allocator;  ///< Limits of the cache.
    CachingHostAllocator::Options pinned;  ///< Limit of the pinned cache.
  };
  /// A context over the CUDA runtime's visible devices.
  static absl::StatusOr<std::unique_ptr<CudaContext>> Create(Options options);
  /// A context over `api` (a FakeDeviceApi in tests): tensors and copies
  /// work; ops report FailedPrecondition instead of launching kernels
  /// unless `runs_kernels` (only true for CudaDeviceApi).
  static absl::StatusOr<std::unique_ptr<CudaContext>> CreateForApi(
      std::shared_ptr<DeviceMemoryApi> api, Options options,
      bool runs_kernels);
  ~CudaContext();
  CudaContext(const CudaContext&) = delete;
  CudaContext& operator=(const CudaContext&) = delete;

  int device_count() const { return api_->DeviceCount(); }  ///< Devices.
  bool runs_kernels() const { return runs_kernels_; }  ///< See CreateForApi.
  DeviceMemoryApi& api() { return *api_; }  ///< The device calls.
  CachingDeviceAllocator& allocator() { return *alloc_; }  ///< The cache.
  /// Pinned host memory for asynchronous copies.
  CachingHostAllocator& pinned() { return *pinned_; }
  /// The current stream of `device` for the calling thread, which its work
  /// on the device is queued on: the thread's SetThreadStream choice, else
  /// the device's (0, the legacy default stream, unless SetStream chose
  /// another; 0 for an index out of range).
  StreamHandle stream(int device) const;
  /// Makes `stream` (nullopt: none) the calling thread's own current stream
  /// of `device` in this context, over SetStream's; returns the thread's
  /// previous choice. Undo it before the context goes (ThreadStreamGuard).
  absl::StatusOr<std::optional<StreamHandle>> SetThreadStream(
      Device device, std::optional<StreamHandle> stream);
  /// Work queued later on `waiter` of `device` waits, on the device, for
  /// the work queued on `producer` so far (an event recorded now).
  absl::Status StreamWaitStream(Device device, StreamHandle waiter,
                                StreamHandle producer);
  /// Makes `stream` (0, or a stream of that device) the current stream of
  /// `device` for work queued from now on (see the top for ordering).
  absl::Status SetStream(Device device, StreamHandle stream);
  /// A new stream of `device`, owned by the context (destroyed, after its
  /// work, when the context is).
  absl::StatusOr<StreamHandle> NewStream(Device device)
      ABSL_LOCKS_EXCLUDED(mu_);
  /// An event after the work queued so far on `device`'s current stream.
  absl::StatusOr<StreamEvent> RecordEvent(Device device);
  /// Makes work queued later on `device`'s current stream wait, on the
  /// device, for `event` (from any device or stream); the host goes on.
  absl::Status StreamWait(Device device, const StreamEvent& event);

  /// OK if `device` is CUDA with an index below device_count(), else
  /// InvalidArgument naming `op`, the device and the count.
  absl::Status CheckCudaDevice(const char* op, Device device) const;
  /// Uninitialized contiguous tensor on `device` (CPU or CUDA).
  absl::StatusOr<Tensor> Empty(const std::vector<int64_t>& sizes, DType dtype,
                               Device device);
  /// `t` on `device`: `t` itself when it is there already, else a
  /// contiguous copy (CPU->CUDA, CUDA->CPU, or CUDA->CUDA through the host)
  /// on the devices' current streams. Blocking: returns once the copy is
  /// done (copy.h). With `non_blocking`, returns once it is queued, staged
  /// through pinned memory: device work queued later on that stream sees
  /// the bytes; a CPU result is pinned and readable after Synchronize(the
  /// source device) or a RecordEvent's Wait; CUDA->CUDA queues the second
  /// half behind a device-side wait for the first.
  absl::StatusOr<Tensor> To(const Tensor& t, Device device,
                            bool non_blocking = false);
  /// Waits for the work queued on `device` so far.
  absl::Status Synchronize(Device device);
  /// Makes `ops` the backend recorded in every device storage this context
  /// makes from now on (Empty, To), so autograd dispatches to it; `ops`
  /// refers back to *this, and the destructor detaches it. Call once,
  /// before the context makes tensors or is shared (not synchronized).
  void set_compute(std::shared_ptr<DeviceOps> ops) { compute_ = std::move(ops); }
  /// The backend given to set_compute (null when none).
  DeviceOps* compute() const { return compute_.get(); }
  /// The same, shared: for owners that record it in tensors they make
  /// themselves (WorkerOptions::device_compute, landed RPC tensors).
  std::shared_ptr<DeviceOps> shared_compute() const { return compute_; }

  /// Row-major c[m, n] = op(a) @ op(b) on `device` (float32, float64,
  /// float16 or bfloat16 device pointers, the 16-bit ones accumulated in
  /// float32 by cublasGemmEx; lda/ldb are a's and b's row lengths; op
  /// transposes when asked), queued on stream(device) through cuBLAS. With batch > 1,
  /// `batch` such products in one strided-batched call: product i reads a
  /// + i * stride_a and b + i * stride_b (elements) and writes the i-th
  /// [m, n] block of c.
  absl::Status Gemm(int device, DType dtype, bool transpose_a,
                    bool transpose_b, int m, int n, int k, const void* a,
                    int lda, const void* b, int ldb, void* c, int batch = 1,
                    int64_t stride_a = 0, int64_t stride_b = 0);

 private:
  CudaContext(std::shared_ptr<DeviceMemoryApi> api,
              std::unique_ptr<CachingDeviceAllocator> alloc,
              std::unique_ptr<CachingHostAllocator> pinned, bool runs_kernels);

  const std::shared_ptr<DeviceMemoryApi> api_;
  const std::unique_ptr<CachingDeviceAllocator> alloc_;
  const std::unique_ptr<CachingHostAllocator> pinned_;
  // Current stream per device (read on every launch, hence atomics).
  std::vector<std::atomic<StreamHandle>> streams_;
  const bool runs_kernels_;
  std::shared_ptr<DeviceOps> compute_;
  // `t` over the same bytes with compute_ recorded in its storage.
  absl::StatusOr<Tensor> Attach(Tensor t) const;
  struct Blas;  // The cuBLAS entry points, once loaded.
  // The loaded library and `device`'s handle, made on first use.
  absl::StatusOr<void*> CublasHandle(int device) ABSL_LOCKS_EXCLUDED(mu_);

  absl::Mutex mu_;
  std::unique_ptr<Blas> blas_ ABSL_GUARDED_BY(mu_);
  absl::Status blas_error_ ABSL_GUARDED_BY(mu_);  // Why loading failed.
  std::map<int, void*> cublas_ ABSL_GUARDED_BY(mu_);
  // Streams from NewStream: (device, stream).
  std::vector<std::pair<int, StreamHandle>> owned_streams_ ABSL_GUARDED_BY(mu_);
};

/// Base of backends bound to one context: holds the context pointer under a
/// reader-writer mutex so Detach (the context's destructor) waits for calls
/// in flight and later calls fail with FailedPrecondition.
class ContextBoundOps : public DeviceOps {
 public:
  /// Bound to `ctx`, which must call Detach before it dies.
  explicit ContextBoundOps(CudaContext* ctx) : ctx_(ctx) {}
  void Detach() override ABSL_LOCKS_EXCLUDED(mu_);
  // The stream calls, forwarded to the context.
  absl::StatusOr<uintptr_t> NewStream(Device device) override;
  absl::StatusOr<uintptr_t> CurrentStream(Device device) override;
  absl::StatusOr<std::optional<uintptr_t>> SetThreadStream(
      Device device, std::optional<uintptr_t> stream) override;
  absl::Status StreamWaitStream(Device device, uintptr_t waiter,
                                uintptr_t producer) override;
  absl::Status CopyAsync(const Tensor& dst, const Tensor& src,
                         uintptr_t stream) override;
  absl::Status RecordStream(const Tensor& t, uintptr_t stream) override;

 protected:
  /// The context, or FailedPrecondition naming `op` once detached.
  absl::StatusOr<CudaContext*> Context(const char* op) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  /// Held (shared) by every call for its whole duration.
  mutable absl::Mutex mu_;

 private:
  CudaContext* ctx_ ABSL_GUARDED_BY(mu_);
};

}  // namespace cuda
}  // namespace ferry

#endif  // FERRY_TENSOR_CUDA_CONTEXT_H_
