// NcclBackend: c10d collectives on CUDA tensors through NCCL.
//
// The communicator is created by the first operation (which must be a
// collective every rank calls), on the device of its tensors, rendezvousing
// through the Store ("nccl/unique_id"). Later operations must use tensors on
// the same device (InvalidArgument otherwise). Creating the backend needs no
// GPU; without one, the first operation fails with FailedPrecondition.
//
// Work::Wait OK: the results are in device memory, visible to the host.
// Operations run in issue order on the backend's own stream, each after the
// work queued before the call on AllreduceOptions::stream (else stream 0).
//
// Errors: an operation past its deadline (enqueue time + timeout) makes the
// watchdog abort the communicator, fail it with DeadlineExceeded naming the
// collective, sequence number, rank and timeout, fail every other operation
// in flight, and mark the backend unusable (later calls: FailedPrecondition
// quoting the failure). Mismatched calls between ranks are not detected
// (undefined, as in NCCL).
//
// Supported: Allreduce, Broadcast, Reduce, Allgather, Gather, Scatter,
// ReduceScatter, Alltoall, Barrier, Send, Recv, BatchIsendIrecv; ReduceOps
// SUM, AVG (floating dtypes; may differ from sum / N in the last bits),
// PRODUCT, MIN, MAX; bitwise ops are InvalidArgument. Point to point matches
// in issue order (NCCL has no tags): two ranks that each Send before they
// Recv deadlock until the timeout; exchange with BatchIsendIrecv.
// RecvAnysource is Unimplemented.
//
// Thread safety: as Backend. The destructor cancels queued operations,
// aborts the communicator if anything is in flight, and joins its threads.
// Design: docs/design/c10d_nccl_and_mpi.md
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
  // The operation runs after the work queued so far on `caller_stream` of
  // `device` (0: the legacy default stream).
  std::shared_ptr<Work> Submit(
      OpType type, absl::Status local_error, int device,
      const std::optional<absl::Duration>& timeout,
      absl::AnyInvocable<absl::Status(void* comm, void* stream)> enqueue,
      std::vector<Tensor> keep_alive, uintptr_t caller_stream = 0);

  std::unique_ptr<Impl> impl_;
};

}  // namespace c10d
}  // namespace ferry

#endif  // FERRY_C10D_NCCL_NCCL_BACKEND_H_
