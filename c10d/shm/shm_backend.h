// ShmBackend: same-host collectives through one shared-memory segment.
//
// Allreduce, Broadcast, Allgather, AllgatherIntoTensor, ReduceScatter,
// ReduceScatterTensor, AlltoallSingle (uneven splits), Alltoall (list form)
// and Barrier run here;
// every other operation goes to the `fallback` backend given at creation (gloo
// in the registered factories), or fails Unimplemented when there is none.
//
// Rendezvous (Create): every rank publishes a host identity (boot id, the
// device/inode of /dev/shm and of its network namespace) through the store;
// unless all are equal, Create returns FailedPrecondition (the "auto" factory
// then uses gloo alone; every rank reads the same identities, so all decide
// alike). Rank 0 creates a segment with shm_open (name
// "<prefix>-<pid>-<random>", mode 0600), the others open it; the last rank to
// attach unlinks the name, so once Create returns nothing is left in /dev/shm,
// whatever later happens to a rank. A rank that does not arrive within the
// timeout fails Create with DeadlineExceeded (the name is unlinked then too).
//
// Algorithm: the segment holds two buffer sets of a slot per rank (see
// "Cores" below for the slot's size).
// Each round a rank writes its piece into its slot of set (round % 2) and
// arrives at a barrier; then it reads what it needs. Allreduce splits the
// piece into `size` element ranges; rank r reduces range r (so all ranks'
// cores reduce in parallel, each range by one rank: identical bits
// everywhere), reading its own part of it straight from its tensor (so it
// publishes only the other ranges) and the others' from their slots, a
// cache-sized block at a time into range r of its own slot; a second
// barrier follows and every rank copies the result out. Per rank and byte:
// (n-1)/n copied in, one reduce pass, one copy out. ReduceScatter reduces
// its own chunk straight from its input into its output. Tensors larger
// than a slot take several rounds. Alternating sets make one barrier per
// round enough.
//
// Broadcast larger than a slot, with a core per rank (sched_getaffinity of
// rank 0, which decides for all; option shm_broadcast forces either way),
// streams: after the first (signature) round, the root's two slots are a
// ring of 256 KiB chunks; the root publishes how far it has copied in, each
// reader how far it has copied out (a per-rank progress counter), so copy-in
// and copy-out overlap with no barrier per piece; the root reuses ring space
// once every reader is past it and returns once all have copied everything.
// Readers sleep on one futex word (the root's progress), the root on
// another, bumped only by the reader that completes what it waits for. With
// more ranks than cores it runs in rounds of a slot instead (one barrier
// each, like the other collectives), which measured faster there (4 ranks on
// 2 CPUs, quiet host). Broadcast and all-to-all copy-outs of 8 MiB or more
// use non-temporal stores when every rank has a core; not with more ranks
// than cores, where the 4-rank 64 MiB all-to-all measured slower with them
// (shm_streaming_store_bytes overrides).
// (Cross-memory attach, process_vm_readv from the root's tensor, would save
// the copy-in but measured 2-4x slower than memcpy on the 2-CPU VM this was
// tuned on, so it is not used.)
//
// Cores: every bulk copy and reduction of a rank (copy-in, its reduce range,
// copy-out) is split over its copy team (copy_team.h): the runner thread and
// `threads - 1` helpers, by default the cores this process may use divided by
// the ranks, less one (at least 1, at most 16), so with cores to spare a
// rank is not limited to
// what one thread copies (bench/c10d/memcpy_floor: on a 16-core VM one
// thread copies 7.6 GB/s, four 46 GB/s). Parts are disjoint ranges, so
// results are bitwise the same for any team. With a team, rank 0 scales the
// slot by its team size (a slot of work per thread per round, fewer
// barriers), keeping the segment within 32 MiB; it writes the slot's size in
// the segment header, where the others read it, so only shm_slot_bytes must
// match across ranks. One core per rank or fewer: no helpers, as before.
//
// Barrier: each rank bumps its own counter (for diagnostics) and a shared
// arrival count; a waiter spins briefly (longer when every rank has a core
// of its own, a few pauses when ranks outnumber cores, where spinning would
// take the core of the rank it waits for), then sleeps on the count with a
// process-shared futex; the last rank to arrive wakes the sleepers.
//
// Argument check at no cost: each operation's first round carries a
// signature (operation, dtype, element count, root, ReduceOp, sequence
// number, whether local arguments were valid) beside the data; after the
// barrier every rank compares all signatures before reading anything, so a
// mismatch fails every rank with InvalidArgument naming the ranks and what
// differs (no rank reads a byte), and the backend stays usable.
//
// Failures: a rank that does not arrive within the operation's timeout, or
// whose process has exited (checked through its pid while waiting), makes
// the waiting ranks fail (DeadlineExceeded / Unavailable naming the rank);
// the first rank to see a dead peer raises a flag in the segment so the
// others stop waiting at once (Unavailable). After such a failure every later
// call fails with FailedPrecondition quoting it.
//
// Thread safety: calls may come from any thread; collectives run one at a
// time on a worker thread in issue order (backend.h). The destructor cancels
// queued operations and waits for the running one (bounded by its timeout).
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
  // Registry factory for the default CPU backend: gloo, with shared memory
  // in front of it when every rank is on this host, unless the option
  // "shm" is "false" or FERRY_C10D_SHM=0 (read from the environment).
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
