// NcclBackend: c10d collectives on CUDA tensors through NCCL.
//
// Communicator: created lazily by the first operation (like PyTorch), on
// the device of that operation's tensors: rank 0 makes an ncclUniqueId and
// publishes it through the Store ("nccl/unique_id"); the others wait for it
// (up to the timeout). Initialization is non-blocking, so a rank that never
// arrives fails the first operation with DeadlineExceeded (the communicator
// is aborted) instead of hanging. Later operations must use tensors on the
// same device (InvalidArgument otherwise). Creating the backend needs no GPU;
// without one, the first operation fails with FailedPrecondition.
//
// Execution: operations queue to one worker thread that enqueues them, in
// issue order, on the backend's own CUDA stream (a blocking stream, so it
// orders after work on the legacy default stream, e.g. cudaMemcpy). Each
// NCCL call waits until its work is on the stream (a non-blocking
// communicator may still be enqueueing it when the call returns) before the
// next call or copy is issued. A host callback at the end of each operation
// marks it finished; the Work completes (on the watchdog thread) only then, so
// Work::Wait returning OK means the results are in device memory and visible to
// the host. Wait first polls an event recorded after the operation for up to
// 200 us, so a short call completes on the waiting thread without those two
// hand-offs. The tensors an operation kept alive are released on a third
// thread (a cudaFree there waits for the device; the watchdog must not).
//
// Watchdog: a thread tracks every operation in flight against its deadline
// (enqueue time + timeout; an operation NCCL is still enqueueing at its
// deadline, e.g. connecting to a rank that never calls, counts as in
// flight). When one passes, it aborts the communicator
// (ncclCommAbort, which makes the kernels return), fails that operation
// with DeadlineExceeded naming the collective, its sequence number, the rank
// and the timeout, fails every other operation in flight, and marks the
// backend unusable (later calls: FailedPrecondition quoting the failure).
//
// Supported: Allreduce, Broadcast, Reduce, Allgather, Gather, Scatter,
// ReduceScatter, Alltoall, Barrier, Send, Recv, BatchIsendIrecv. ReduceOps:
// SUM, AVG (floating dtypes; NCCL multiplies each input by 1/N before
// summing, so AVG may differ from sum / N in the last bits), PRODUCT, MIN, MAX;
// BAND/BOR/BXOR are InvalidArgument (NCCL has no bitwise reductions). Bool
// travels as uint8 with SUM/MAX -> max and PRODUCT/MIN -> min. Mismatched calls
// between ranks are not detected (undefined, as in NCCL itself).
//
// Point to point (ncclSend / ncclRecv, as bytes) runs on the same stream and
// communicator as the collectives, in issue order. NCCL has no tags: the
// tag is validated but messages between two ranks match in issue order,
// so both sides must issue them in the same order (a receive posted for
// tag 1 before one for tag 0 takes whatever is sent first). A Send waits on
// the stream until its Recv is posted, so two ranks that each Send before
// they Recv deadlock (until the watchdog's timeout): exchange with
// BatchIsendIrecv, which posts all of its operations as one NCCL group (one
// Work, returned for every entry). The communicator spans the whole group
// and is created by the first operation, so that first operation must be
// one every rank calls (a collective). RecvAnysource is Unimplemented.
//
// Thread safety: as Backend. The destructor cancels queued operations,
// aborts the communicator if anything is still in flight, and joins its
// threads.
#ifndef FERRY_C10D_NCCL_NCCL_BACKEND_H_
#define FERRY_C10D_NCCL_NCCL_BACKEND_H_

#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ferry/c10d/backend.h"
#include "ferry/c10d/registry.h"
#include "ferry/common/sync.h"
#include "ferry/store/store.h"

namespace ferry {
namespace c10d {

class NcclBackend : public Backend {
 public:
  // Validates arguments only; see "Communicator" above.
  static absl::StatusOr<std::unique_ptr<NcclBackend>> Create(
      std::shared_ptr<Store> store, int rank, int size, absl::Duration timeout);
  // A factory for BackendRegistry (name "nccl", devices {cuda}).
  static BackendFactory Factory();

  ~NcclBackend() override;

  std::shared_ptr<Work> Allreduce(
      Tensor tensor, const AllreduceOptions& options = {}) override;
  std::shared_ptr<Work> Broadcast(
      Tensor tensor, const BroadcastOptions& options = {}) override;
  std::shared_ptr<Work> Reduce(Tensor tensor,
                               const ReduceOptions& options = {}) override;
  std::shared_ptr<Work> Allgather(
      std::vector<Tensor> outputs, Tensor input,
      const AllgatherOptions& options = {}) override;
  std::shared_ptr<Work> Gather(std::vector<Tensor> outputs, Tensor input,
                               const GatherOptions& options = {}) override;
  std::shared_ptr<Work> Scatter(Tensor output, std::vector<Tensor> inputs,
                                const ScatterOptions& options = {}) override;
  std::shared_ptr<Work> ReduceScatter(
      Tensor output, std::vector<Tensor> inputs,
      const ReduceScatterOptions& options = {}) override;
  std::shared_ptr<Work> Alltoall(std::vector<Tensor> outputs,
                                 std::vector<Tensor> inputs,
                                 const AlltoallOptions& options = {}) override;
  std::shared_ptr<Work> Barrier(const BarrierOptions& options = {}) override;
  std::shared_ptr<Work> Send(Tensor tensor, int dst_rank,
                             const SendOptions& options = {}) override;
  std::shared_ptr<Work> Recv(Tensor tensor, int src_rank,
                             const RecvOptions& options = {}) override;
  std::vector<std::shared_ptr<Work>> BatchIsendIrecv(
      std::vector<P2POp> ops) override;

 private:
  struct Impl;
  struct Op;

  NcclBackend(std::shared_ptr<Store> store, int rank, int size,
              absl::Duration timeout);

  // The shared argument checks, for this backend's rank and size.
  ArgChecks Checks() const;
  // `enqueue` issues the NCCL calls on the stream; it runs on the worker.
  // `device` is the CUDA device of the tensors (-1: any, e.g. Barrier).
  std::shared_ptr<Work> Submit(
      OpType type, absl::Status local_error, int device,
      const std::optional<absl::Duration>& timeout,
      absl::AnyInvocable<absl::Status(void* comm, void* stream)> enqueue,
      std::vector<Tensor> keep_alive);

  std::unique_ptr<Impl> impl_;
};

}  // namespace c10d
}  // namespace ferry

#endif  // FERRY_C10D_NCCL_NCCL_BACKEND_H_
