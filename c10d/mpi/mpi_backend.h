// MpiBackend: c10d collectives over MPI (Debian's Open MPI), CPU tensors.
//
// Registered as "mpi" in the default registry where libopenmpi-dev is
// installed. Each process is one MPI rank, started by mpirun (or another MPI
// launcher); the c10d rank and size come from the caller (env:// reads
// OMPI_COMM_WORLD_RANK / _SIZE). A rank that never arrives at the rendezvous
// fails Create with DeadlineExceeded on the others.
//
// MPI is process-wide: the first Create initializes it with
// MPI_THREAD_MULTIPLE (or uses the program's own MPI; anything below
// THREAD_MULTIPLE fails Create with FailedPrecondition) and finalizes it at
// exit when it initialized it. MPI errors are Statuses naming the operation
// and rank, never an abort (MPI_ERRORS_RETURN).
//
// Operations: all of backend.h's; every (dtype, ReduceOp) pair behaves as in
// the other CPU backends. Argument check (on unless option "mpi_check_args"
// is "false"): a mismatch fails every rank with InvalidArgument naming the
// ranks and what differs, and the group stays usable.
//
// Timeouts: a timed-out receive is cancelled; a timed-out collective cannot
// be, so it fails with DeadlineExceeded and every later collective fails
// with FailedPrecondition quoting it.
//
// Thread safety: calls may come from any thread (backend.h's ordering
// rules). The destructor fails queued operations with Cancelled and waits
// for the running ones (bounded by their timeouts).
// Design: docs/design/c10d_nccl_and_mpi.md
#ifndef FERRY_C10D_MPI_MPI_BACKEND_H_
#define FERRY_C10D_MPI_MPI_BACKEND_H_

#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "ferry/c10d/backend.h"
#include "ferry/c10d/registry.h"
#include "ferry/common/sync.h"
#include "ferry/store/store.h"

namespace ferry {
namespace c10d {

struct MpiBackendOptions {
  bool check_args = true;

  // "mpi_check_args" ("true"/"false") from BackendConfig::options; other
  // keys are ignored.
  static absl::StatusOr<MpiBackendOptions> FromMap(
      const std::map<std::string, std::string>& options);
};

class MpiBackend : public Backend {
 public:
  static absl::StatusOr<std::unique_ptr<MpiBackend>> Create(
      std::shared_ptr<Store> store, int rank, int size, absl::Duration timeout,
      MpiBackendOptions options = {});
  static BackendFactory Factory();

  // This process's MPI world rank and size, initializing MPI if needed.
  static absl::StatusOr<std::pair<int, int>> WorldRankAndSize();

  ~MpiBackend() override;

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
  std::shared_ptr<Work> AllgatherIntoTensor(
      Tensor output, Tensor input,
      const AllgatherOptions& options = {}) override;
  std::shared_ptr<Work> ReduceScatterTensor(
      Tensor output, Tensor input,
      const ReduceScatterOptions& options = {}) override;
  std::shared_ptr<Work> AlltoallSingle(
      Tensor output, Tensor input,
      const AlltoallSingleOptions& options = {}) override;
  std::shared_ptr<Work> RecvAnysource(Tensor tensor,
                                      const RecvOptions& options = {}) override;

  // What ranks compare before moving data (public for tests).
  using Signature = CallSignature;

  struct Comm;    // The MPI communicator (keeps mpi.h out of this header).
  struct Posted;  // Requests in flight and what to do when they finish.
  struct Op;      // One queued operation.

 private:
  MpiBackend(int rank, int size, absl::Duration timeout,
             MpiBackendOptions options, std::unique_ptr<Comm> comm);

  using PostFn = absl::AnyInvocable<absl::StatusOr<Posted>(Comm&)>;
  std::shared_ptr<Work> EnqueueCollective(
      OpType type, Signature sig, absl::Status local,
      const std::optional<absl::Duration>& timeout, PostFn post,
      std::vector<int64_t> splits = {});
  std::shared_ptr<Work> EnqueueP2P(OpType type, absl::Status local,
                                   const std::optional<absl::Duration>& timeout,
                                   PostFn post);
  std::shared_ptr<Work> EnqueueAllgather(OpType type, std::vector<Tensor> outs,
                                         Tensor flat_out, Tensor input,
                                         absl::Status local,
                                         const AllgatherOptions& options);
  std::shared_ptr<Work> EnqueueReduceScatter(OpType type, Tensor output,
                                             std::vector<Tensor> inputs,
                                             Tensor flat_in, absl::Status local,
                                             const ReduceScatterOptions& o);
  ArgChecks Checks() const;

  // The progress thread.
  void Run();
  // Advances the running collective; true if anything changed.
  bool StepCollective();
  bool StepP2P();
  absl::Status CheckSignatures(const Op& op) const;

  const MpiBackendOptions options_;
  const std::unique_ptr<Comm> comm_;

  Mutex mu_;
  CondVar wake_;
  int64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<std::shared_ptr<Op>> collectives_ ABSL_GUARDED_BY(mu_);
  std::deque<std::shared_ptr<Op>> new_p2p_ ABSL_GUARDED_BY(mu_);

  // Progress thread only.
  std::shared_ptr<Op> running_;
  std::vector<std::shared_ptr<Op>> p2p_;
  absl::Status broken_;

  std::thread progress_;
};

}  // namespace c10d
}  // namespace ferry

#endif  // FERRY_C10D_MPI_MPI_BACKEND_H_
