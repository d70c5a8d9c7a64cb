// GlooBackend: c10d collectives over Gloo's TCP transport, for CPU tensors.
//
// Create() connects a full mesh through the given Store (keys "0".."size-1":
// give every backend instance its own namespace, e.g. a PrefixStore); a rank
// that does not arrive within the timeout fails it with DeadlineExceeded.
//
// Collectives run one at a time on a background thread in issue order.
// With check_args (the default) every call's arguments are compared across
// ranks before any payload moves: a mismatch fails every rank with
// InvalidArgument naming the call's sequence number, the ranks and what
// differs, and the group stays usable. check_args = false skips the check:
// mismatched calls are then undefined behaviour.
//
// Send/Recv are posted at once on the calling thread and matched by
// (peer, tag) in issue order. A Recv whose dtype/size differ from the Send's
// fails with InvalidArgument; treat that (peer, tag) as out of step after.
//
// Errors: an operation past its timeout fails with DeadlineExceeded naming
// the operation, sequence number, rank and timeout. After a timeout or a
// transport error every later collective fails with FailedPrecondition
// quoting the first failure: make a new group. Gloo's exceptions never leave
// this class. Dtypes: all nine for data movement; reductions as CheckReduceOp
// accepts (Float16/BFloat16 reduce in float).
//
// Memory: header and scratch buffers are kept between calls, grown to the
// largest call seen.
// Thread safety: all methods may be called from any thread (see backend.h
// on ordering). The destructor fails queued operations with Cancelled and
// waits for the running one (bounded by its timeout).
// Design: docs/design/c10d_shm_and_gloo.md
#ifndef FERRY_C10D_GLOO_GLOO_BACKEND_H_
#define FERRY_C10D_GLOO_GLOO_BACKEND_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ferry/c10d/backend.h"
#include "ferry/c10d/gloo/ring.h"
#include "ferry/c10d/reduce.h"
#include "ferry/c10d/registry.h"
#include "ferry/common/executor.h"
#include "ferry/common/sync.h"
#include "ferry/store/store.h"

namespace ferry {
namespace c10d {

struct GlooBackendOptions {
  // Address Gloo's pairs listen on (loopback by default). Through
  // Factory() without a "hostname" option: ChooseWorkerHost's choice
  // (common/host_address.h: FERRY_ADVERTISE_ADDR, FERRY_SOCKET_IFNAME, else
  // the local address routing toward MASTER_ADDR, else loopback).
  std::string hostname = "127.0.0.1";
  // Exchange argument headers before each collective (see above).
  bool check_args = true;
  // Log every collective's signature (op, dtype, count, root, sequence
  // number) at INFO before it runs.
  bool log_calls = false;
  // Threads that wait for Send/Recv completion (posting never waits).
  int p2p_threads = 4;

  // From BackendConfig::options: "hostname", "check_args" (true/false),
  // "p2p_threads". InvalidArgument naming an unknown key or bad value.
  // Where "check_args" is not given, FERRY_DISTRIBUTED_DEBUG (read from
  // `debug_level`, normally the environment) decides, in the spirit of
  // TORCH_DISTRIBUTED_DEBUG: OFF turns the check off; INFO (the default,
  // also when unset) keeps it; DETAIL keeps it and sets log_calls. Any
  // other value is InvalidArgument.
  static absl::StatusOr<GlooBackendOptions> FromMap(
      const std::map<std::string, std::string>& options,
      std::optional<std::string> debug_level = std::nullopt);
};

namespace gloo_internal {
// A small payload's fast path (see "Before each collective" above), or a
// large one's Ferry-owned algorithm.
struct InlinePath {
  size_t bytes = 0;
  // Writes the payload for `peer` (every peer gets the same unless
  // `personal`).
  absl::AnyInvocable<void(char*, int peer)> fill;
  bool personal = false;
  absl::AnyInvocable<absl::Status(const std::vector<const char*>&)> finish;
  // Without `finish`: checks every rank's payload, then the data phase runs.
  absl::AnyInvocable<absl::Status(const std::vector<const char*>&)> check;
  // Larger payloads with check_args (groups of 2 or more): the algorithm to
  // run on Gloo slot `slot` instead of `run` (see ring.h), and what follows
  // it on success.
  absl::AnyInvocable<std::unique_ptr<EarlyAlgorithm>(uint64_t slot)> algorithm;
  absl::AnyInvocable<void()> after;
};
}  // namespace gloo_internal

class GlooBackend : public Backend {
 public:
  static absl::StatusOr<std::unique_ptr<GlooBackend>> Create(
      std::shared_ptr<Store> store, int rank, int size, absl::Duration timeout,
      GlooBackendOptions options = {});

  // A factory for BackendRegistry (name "gloo", devices {cpu}).
  static BackendFactory Factory();

  ~GlooBackend() override;

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

  // Payload bytes that ride in each rank's header block (same on every
  // rank): with check_args on, an Allreduce or Broadcast of at most this many
  // bytes, an Allgather of an input this small and a ReduceScatter of an
  // output this small complete in that one direct exchange (every rank sends
  // its buffer, or the peer's chunk, to every other); larger ones run
  // Ferry's ring or chain (see ring.h).
  size_t InlineBytes() const;

  // Argument header exchanged before each collective (public for tests).
  struct Header {
    int64_t magic = 0;
    int64_t op = -1;
    int64_t dtype = -1;
    int64_t reduce_op = -1;
    int64_t root = -1;
    int64_t count = -1;    // Elements per rank (op-specific meaning).
    int64_t valid = 1;     // 0: this rank's arguments failed local checks.
    int64_t reserved = 0;  // Inline payload bytes following the header.
    int64_t early = 0;     // Receives posted before the check (ring.h), per
                        // peer they await (bit 32: every peer, else the left).
  };

 private:
  struct Op {
    OpType type;
    Header header;
    absl::Status local_error;
    absl::Duration timeout;
    std::shared_ptr<Work> work;
    uint32_t seq = 0;
    // Runs the data phase with Gloo tag `tag`; may throw (caught by caller).
    absl::AnyInvocable<absl::Status(uint32_t tag, absl::Duration timeout)> run;
    // Small payloads: written into this rank's exchange block, and the
    // operation finished from every rank's block instead of running `run`.
    absl::AnyInvocable<void(char*, int)> fill_inline;
    bool personal_inline = false;
    size_t inline_bytes = 0;
    absl::AnyInvocable<absl::Status(const std::vector<const char*>&)>
        finish_inline;
    absl::AnyInvocable<absl::Status(const std::vector<const char*>&)>
        check_inline;
    absl::AnyInvocable<std::unique_ptr<gloo_internal::EarlyAlgorithm>(
        uint64_t slot)>
        algorithm;
    absl::AnyInvocable<void()> after_algorithm;
  };
  // One of two alternating receive areas of the header exchange.
  struct ExchangeArea {
    std::vector<char> blocks;
    std::unique_ptr<::gloo::transport::UnboundBuffer> buf;
    int64_t posted_seq = -1;
  };
  using InlinePath = gloo_internal::InlinePath;
  struct P2P;

  GlooBackend(int rank, int size, absl::Duration timeout,
              GlooBackendOptions options, std::shared_ptr<::gloo::Context> ctx);

  // Queues a collective. `local_error` non-OK: this rank's arguments are
  // invalid (still queued when check_args, so the others fail too).
  std::shared_ptr<Work> Enqueue(
      OpType type, Header header, absl::Status local_error,
      const std::optional<absl::Duration>& timeout,
      absl::AnyInvocable<absl::Status(uint32_t tag, absl::Duration timeout)>
          run,
      InlinePath path = {});
  void WorkerLoop();
  absl::Status RunOp(Op& op);
  // Exchanges every rank's header block and checks them. OK: every rank's
  // arguments agree. Otherwise, when the exchange itself completed, *all
  // holds every rank's header (the refusal is then the same on every rank).
  absl::Status ExchangeHeaders(Op& op, absl::Time deadline,
                               std::vector<Header>* all);
  // A refused call with early receives (see RunOp): completes every peer's
  // early receives for this rank, then this rank's own.
  void AbandonEarly(const std::vector<Header>& all, uint64_t slot,
                    gloo_internal::EarlyAlgorithm* algorithm,
                    absl::Time deadline);
  // Posts the header receives of call `seq` (worker thread only).
  void PostExchange(uint32_t seq);
  ExchangeArea& Area(uint32_t seq) { return exchange_[seq % 2]; }
  // The shared argument checks, for this backend's rank and size.
  ArgChecks Checks() const;
  // Calls fn, turning Gloo exceptions into a Status for `op`.
  absl::Status CallGloo(const Op& op, absl::Duration timeout,
                        absl::AnyInvocable<absl::Status()> fn);

  using RunFn = absl::AnyInvocable<absl::Status(uint32_t, absl::Duration)>;
  using AlgorithmFactory =
      std::function<std::unique_ptr<gloo_internal::EarlyAlgorithm>(uint64_t)>;
  // A Ferry-owned algorithm (ring.h) made by `make` for a slot, then
  // `after`: with the check and `path`, RunOp starts it (early receives
  // before the exchange); the returned run drives it start to end (no check,
  // or one rank).
  RunFn OwnAlgorithm(AlgorithmFactory make, std::function<void()> after,
                     InlinePath* path);
  // Reduce-scatter of `chunks` (size pointers into `inputs`, each
  // output.nbytes()) into `output`; all-gather of `input` into `chunks`
  // (size pointers into `outputs`, each input.nbytes()). `chunks` is empty
  // when `local` is an error.
  std::shared_ptr<Work> EnqueueReduceScatter(OpType op, Tensor output,
                                             std::vector<Tensor> inputs,
                                             std::vector<const char*> chunks,
                                             absl::Status local,
                                             const ReduceScatterOptions& o);
  std::shared_ptr<Work> EnqueueAllgather(OpType op, std::vector<Tensor> outputs,
                                         std::vector<char*> chunks,
                                         Tensor input, absl::Status local,
                                         const AllgatherOptions& o);
  // The worker's scratch memory, at least `bytes`, kept between calls (no
  // allocation, page faults or zeroing per call); worker thread only.
  char* Scratch(size_t bytes);

  // Send and Recv: validates, posts the header and payload buffers, and
  // hands completion to a p2p waiter thread.
  // peer -1 on a receive: any source.
  std::shared_ptr<Work> StartP2P(bool is_send, Tensor tensor, int peer, int tag,
                                 std::optional<absl::Duration> timeout);
  void WaitP2P(std::shared_ptr<P2P> p2p);
  void Bury(std::shared_ptr<P2P> p2p) ABSL_LOCKS_EXCLUDED(p2p_mu_);

  const GlooBackendOptions options_;
  const std::shared_ptr<::gloo::Context> context_;

  Mutex mu_;
  std::deque<std::unique_ptr<Op>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  uint32_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
  // Set by the worker after a timeout or transport error.
  absl::Status broken_ ABSL_GUARDED_BY(mu_);

  // Point-to-point transfers that failed while Gloo may still write into
  // their buffers; kept alive until the backend goes.
  Mutex p2p_mu_;
  std::vector<std::shared_ptr<P2P>> graveyard_ ABSL_GUARDED_BY(p2p_mu_);

  // The header exchange's receive areas (worker thread only): call seq's
  // receives are posted while call seq-1 runs, so a header travels one way.
  ExchangeArea exchange_[2];
  // The outgoing header messages (worker thread only), kept between calls.
  std::vector<char> exchange_out_;
  // Scratch(): grows to the largest need seen, never shrinks.
  std::unique_ptr<char[]> scratch_;
  size_t scratch_bytes_ = 0;

  std::unique_ptr<ThreadPoolExecutor> p2p_waiters_;
  std::thread worker_;
};

}  // namespace c10d
}  // namespace ferry

#endif  // FERRY_C10D_GLOO_GLOO_BACKEND_H_
