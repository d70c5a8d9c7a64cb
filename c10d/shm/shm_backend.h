// ShmBackend: same-host collectives through one shared-memory segment.
//
// Allreduce, Broadcast, Allgather, AllgatherIntoTensor, ReduceScatter,
// ReduceScatterTensor, AlltoallSingle (uneven splits), Alltoall (list form)
// and Barrier run here; every other operation goes to the `fallback` backend
// given at creation (gloo in the registered factories), or fails
// Unimplemented when there is none.
//
// Create: FailedPrecondition unless every rank shares the host (boot id,
// /dev/shm, network namespace), so the "auto" factory uses gloo alone;
// DeadlineExceeded when a rank does not arrive within the timeout. Once
// Create returns, the segment's name is unlinked: nothing is left in
// /dev/shm whatever later happens to a rank.
//
// Results are bitwise identical on every rank and for any copy team size.
// Mismatched arguments (operation, dtype, count, root, ReduceOp) fail every
// rank with InvalidArgument naming the ranks, before any rank reads data;
// the backend stays usable.
//
// Failures: a rank that does not arrive within the operation's timeout, or
// whose process exited, fails the waiting ranks (DeadlineExceeded /
// Unavailable naming the rank); after that every later call fails with
// FailedPrecondition quoting the first failure.
//
// Thread safety: calls may come from any thread; collectives run one at a
// time on a worker thread in issue order (backend.h). The destructor cancels
// queued operations and waits for the running one (bounded by its timeout).
// Design: docs/design/c10d_shm_and_gloo.md
#ifndef FERRY_C10D_SHM_SHM_BACKEND_H_
#define FERRY_C10D_SHM_SHM_BACKEND_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "ferry/c10d/backend.h"
#include "ferry/c10d/registry.h"
#include "ferry/common/executor.h"
#include "ferry/common/sync.h"
#include "ferry/store/store.h"

namespace ferry {
namespace c10d {

class CopyTeam;

struct ShmBackendOptions {
  // Bytes per rank in each of the two buffer sets (rounded to 64): the piece
  // one round moves (rank 0 multiplies it by its team's size, see "Cores"). 1
  // MiB keeps a round's buffers (2 sets x size slots) in the caches, so large
  // tensors stream through memory once instead of bouncing through a DRAM-sized
  // segment; measured at 4 ranks on 2 cores, 256 KiB pays too many barriers and
  // 4 MiB twice the memory traffic.
  size_t slot_bytes = size_t{1} << 20;
  // Prefix of the segment's name (must start with '/').
  std::string name_prefix = "/ferry-c10d";
  // How broadcasts larger than a slot run: streamed through the root's slots,
  // or in barrier-separated rounds of a slot each. kAuto: rank 0 decides at
  // Create (streamed when every rank has a core, see the layout above) and
  // every rank follows; an explicit choice must be the same on every rank.
  enum class Broadcast { kAuto, kStream, kRounds };
  Broadcast broadcast = Broadcast::kAuto;
  // Broadcast and all-to-all copy-outs of calls moving at least this many
  // bytes per rank use non-temporal stores; 0: never. -1: the default
  // (8 MiB when every rank has a core, else never).
  int64_t streaming_store_bytes = -1;
  // Streamed broadcast: bytes a rank copies between progress updates
  // (at most a slot); 0: the default (256 KiB when every rank has a core,
  // else a slot).
  int64_t chunk_bytes = 0;
  // Threads that copy and reduce for this rank (its copy team, see "Cores");
  // 0: the cores this process may use divided by the ranks, less one
  // (1 to 16).
  int threads = 0;
  // The smallest range of a copy or reduction given to one team thread.
  int64_t team_part_bytes = int64_t{64} << 10;

  // "shm_slot_bytes", "shm_name_prefix", "shm_broadcast" (auto, stream,
  // rounds), "shm_streaming_store_bytes", "shm_chunk_bytes", "shm_threads"
  // and "shm_team_part_bytes" from
  // BackendConfig::options; other keys are ignored (they belong to the
  // fallback).
  static absl::StatusOr<ShmBackendOptions> FromMap(
      const std::map<std::string, std::string>& options);
};

class ShmBackend : public Backend {
 public:
  // See above. `fallback` (may be null) serves the operations this backend
  // does not implement; it must be of the same rank and size.
  static absl::StatusOr<std::unique_ptr<ShmBackend>> Create(
      std::shared_ptr<Store> store, int rank, int size, absl::Duration timeout,
      ShmBackendOptions options = {}, std::unique_ptr<Backend> fallback = {});

  // Registry factory "shm": shared memory plus a gloo fallback (made from the
  // same config); fails with FailedPrecondition when ranks span hosts.
  static BackendFactory Factory();
  // Registry factory "auto", the default CPU backend: this backend (over a
  // gloo fallback) when every rank is on this host, else gloo alone; the
  // option "shm"="false" or FERRY_C10D_SHM=0 (read from the environment)
  // keep it on gloo. The built backend's name() is "shm" or "gloo".
  static BackendFactory AutoFactory();

  ~ShmBackend() override;

  std::shared_ptr<Work> Allreduce(
      Tensor tensor, const AllreduceOptions& options = {}) override;
  std::shared_ptr<Work> Broadcast(
      Tensor tensor, const BroadcastOptions& options = {}) override;
  std::shared_ptr<Work> Allgather(
      std::vector<Tensor> outputs, Tensor input,
      const AllgatherOptions& options = {}) override;
  std::shared_ptr<Work> AllgatherIntoTensor(
      Tensor output, Tensor input,
      const AllgatherOptions& options = {}) override;
  std::shared_ptr<Work> ReduceScatter(
      Tensor output, std::vector<Tensor> inputs,
      const ReduceScatterOptions& options = {}) override;
  std::shared_ptr<Work> ReduceScatterTensor(
      Tensor output, Tensor input,
      const ReduceScatterOptions& options = {}) override;
  std::shared_ptr<Work> AlltoallSingle(
      Tensor output, Tensor input,
      const AlltoallSingleOptions& options = {}) override;
  std::shared_ptr<Work> Alltoall(std::vector<Tensor> outputs,
                                 std::vector<Tensor> inputs,
                                 const AlltoallOptions& options = {}) override;
  std::shared_ptr<Work> Barrier(const BarrierOptions& options = {}) override;

  // Forwarded to the fallback.
  std::shared_ptr<Work> Reduce(Tensor tensor,
                               const ReduceOptions& options = {}) override;
  std::shared_ptr<Work> Gather(std::vector<Tensor> outputs, Tensor input,
                               const GatherOptions& options = {}) override;
  std::shared_ptr<Work> Scatter(Tensor output, std::vector<Tensor> inputs,
                                const ScatterOptions& options = {}) override;
  std::shared_ptr<Work> Send(Tensor tensor, int dst_rank,
                             const SendOptions& options = {}) override;
  std::shared_ptr<Work> Recv(Tensor tensor, int src_rank,
                             const RecvOptions& options = {}) override;
  std::shared_ptr<Work> RecvAnysource(Tensor tensor,
                                      const RecvOptions& options = {}) override;
  std::vector<std::shared_ptr<Work>> BatchIsendIrecv(
      std::vector<P2POp> ops) override;
  absl::Status MonitoredBarrier(
      const MonitoredBarrierOptions& options = {}) override;

  // The fallback backend, or null.
  Backend* fallback() const { return fallback_.get(); }
  // The segment's name (already unlinked once Create returned).
  const std::string& segment_name() const { return segment_name_; }
  // Bytes per rank in each buffer set: the option rounded to 64, times rank
  // 0's team size within the segment cap (the same on every rank).
  size_t slot_bytes() const;
  // Threads in this rank's copy team (1: the runner alone).
  int threads() const;
  // Whether broadcasts larger than a slot stream (else: rounds); rank 0's
  // choice, the same on every rank.
  bool streams_broadcasts() const { return stream_broadcast_; }

  // What ranks compare before reading each other's data (public for tests).
  using Signature = CallSignature;

 private:
  struct Segment;
  struct Op;
  class Round;

  ShmBackend(int rank, int size, absl::Duration timeout,
             ShmBackendOptions options, std::unique_ptr<Segment> segment,
             std::string segment_name, std::unique_ptr<Backend> fallback);

  std::shared_ptr<Work> Enqueue(OpType type, Signature sig, absl::Status local,
                                const std::optional<absl::Duration>& timeout,
                                absl::AnyInvocable<absl::Status(Round&)> run);
  // Runs `op` on the runner thread and completes its Work.
  void Execute(Op& op);
  absl::Status RunOp(Op& op);
  ArgChecks Checks() const;
  std::shared_ptr<Work> Forward(
      OpType op, absl::AnyInvocable<std::shared_ptr<Work>(Backend&)> call);
  std::shared_ptr<Work> EnqueueAllgather(OpType op, std::vector<Tensor> outs,
                                         Tensor flat_out, Tensor input,
                                         absl::Status local,
                                         const AllgatherOptions& options);
  std::shared_ptr<Work> EnqueueReduceScatter(OpType op, Tensor output,
                                             std::vector<Tensor> inputs,
                                             absl::Status local,
                                             const ReduceScatterOptions& o);
  absl::Status RunBroadcast(Round& round, char* data, int64_t total, int root);
  absl::Status RunStreamedBroadcast(Round& round, char* data, int64_t total,
                                    int root, bool large);
  absl::Status RunAlltoall(Round& round, const std::vector<const char*>& src,
                           const std::vector<char*>& dst,
                           const std::vector<int64_t>& out_rows,
                           const std::vector<int64_t>& in_rows,
                           int64_t row_bytes);
  absl::Status CheckAlltoallSplits(Round& round, int n, int64_t* rounds,
                                   int64_t cap, int64_t row_bytes);

  const ShmBackendOptions options_;
  const std::unique_ptr<Segment> segment_;
  const std::string segment_name_;
  const std::unique_ptr<Backend> fallback_;

  Mutex mu_;
  int64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status broken_ ABSL_GUARDED_BY(mu_);

  // Runner thread only: rounds and barriers done so far (equal on every
  // rank between operations).
  uint64_t rounds_ = 0;
  uint64_t arrivals_ = 0;
  // Bytes of streamed broadcasts so far (the base of `progress` counters).
  uint64_t streamed_ = 0;

  // The runner's helpers for bulk copies and reductions.
  const std::unique_ptr<CopyTeam> team_;
  // Whether every rank has a core of its own (sched_getaffinity, read once):
  // the defaults below depend on it.
  const bool core_per_rank_;
  // Pause-loop iterations before a barrier wait sleeps on the futex.
  const int spin_limit_;
  // Whether broadcasts larger than a slot stream (else: rounds); the same
  // on every rank (rank 0's choice, from the segment).
  const bool stream_broadcast_;
  // Streamed broadcast: bytes copied between progress updates.
  const int64_t chunk_bytes_;
  // Copy-outs of calls this large or larger use non-temporal stores (0:
  // none).
  const int64_t streaming_store_bytes_;

  // One thread: runs the collectives in issue order.
  std::unique_ptr<ThreadPoolExecutor> runner_;
};

}  // namespace c10d
}  // namespace ferry

#endif  // FERRY_C10D_SHM_SHM_BACKEND_H_
