// Backend: one implementation of the collectives (gloo, nccl, or a user's).
//
// Every call is asynchronous: it validates what it can locally, queues the
// operation and returns a Work at once (never null). Errors found before
// queueing (an invalid root, a non-contiguous tensor) come back as an already
// completed Work. Collectives must be issued by every rank of the group in
// the same order; backends match them by issue order.
//
// Tensor conventions (torch.distributed's): tensors are contiguous and live
// on a device the backend supports; outputs are written in place. Each
// method's comment below says what it computes. The caller must keep the
// tensors' elements untouched until the Work completes (the backend holds
// references, so they stay alive).
//
// A backend that lacks an operation returns a Work failed with Unimplemented
// naming the backend and the operation (the default for every method here).
//
// Thread safety: implementations must accept calls from any thread; calls
// from several threads are ordered by the moment they enter the backend, so
// a program issuing from several threads must order them itself.
//
// Writing a backend: docs/guide/c10d.md. Design of Ferry's own:
// docs/design/c10d_shm_and_gloo.md, docs/design/c10d_nccl_and_mpi.md.
#ifndef FERRY_C10D_BACKEND_H_
#define FERRY_C10D_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "ferry/c10d/types.h"
#include "ferry/c10d/work.h"
#include "ferry/tensor/tensor.h"

namespace ferry {
namespace c10d {

// The collectives of one group, as one implementation provides them; the
// base class fails every operation with Unimplemented.
class Backend {
 public:
  // `name` is the registered name ("gloo"); rank in [0, size).
  Backend(std::string name, int rank, int size, absl::Duration timeout);
  virtual ~Backend();

  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  // The registered name ("gloo").
  const std::string& name() const { return name_; }
  // This process's rank in [0, size()).
  int rank() const { return rank_; }
  // The number of ranks in the group.
  int size() const { return size_; }
  // The default timeout of operations whose options leave it unset.
  absl::Duration timeout() const { return timeout_; }

  // t = options.op over ranks of t.
  virtual std::shared_ptr<Work> Allreduce(Tensor tensor,
                                          const AllreduceOptions& options = {});
  // t = root's t.
  virtual std::shared_ptr<Work> Broadcast(Tensor tensor,
                                          const BroadcastOptions& options = {});
  // root's t = op over ranks of t; the others' t unchanged.
  virtual std::shared_ptr<Work> Reduce(Tensor tensor,
                                       const ReduceOptions& options = {});
  // outputs[r] = rank r's input (outputs.size() == size()).
  virtual std::shared_ptr<Work> Allgather(std::vector<Tensor> outputs,
                                          Tensor input,
                                          const AllgatherOptions& options = {});
  // At root, outputs[r] = rank r's input; outputs is empty elsewhere.
  virtual std::shared_ptr<Work> Gather(std::vector<Tensor> outputs,
                                       Tensor input,
                                       const GatherOptions& options = {});
  // output = root's inputs[rank]; inputs is empty off root.
  virtual std::shared_ptr<Work> Scatter(Tensor output,
                                        std::vector<Tensor> inputs,
                                        const ScatterOptions& options = {});
  // output = op over ranks r of r's inputs[rank].
  virtual std::shared_ptr<Work> ReduceScatter(
      Tensor output, std::vector<Tensor> inputs,
      const ReduceScatterOptions& options = {});
  // outputs[r] = rank r's inputs[rank].
  virtual std::shared_ptr<Work> Alltoall(std::vector<Tensor> outputs,
                                         std::vector<Tensor> inputs,
                                         const AlltoallOptions& options = {});
  // Completes once every rank has called it.
  virtual std::shared_ptr<Work> Barrier(const BarrierOptions& options = {});
  // Sends t to dst_rank, matched with its Recv by options.tag.
  virtual std::shared_ptr<Work> Send(Tensor tensor, int dst_rank,
                                     const SendOptions& options = {});
  // Receives into t from src_rank's Send with the same tag.
  virtual std::shared_ptr<Work> Recv(Tensor tensor, int src_rank,
                                     const RecvOptions& options = {});
  // output = concatenation over ranks r of r's input
  // (output.numel() == size() * input.numel()).
  virtual std::shared_ptr<Work> AllgatherIntoTensor(
      Tensor output, Tensor input, const AllgatherOptions& options = {});
  // output = op over ranks of chunk `rank` of input
  // (input.numel() == size() * output.numel()).
  virtual std::shared_ptr<Work> ReduceScatterTensor(
      Tensor output, Tensor input, const ReduceScatterOptions& options = {});
  // Rows of input go to ranks by options.input_split_sizes; output's rows
  // come from ranks by output_split_sizes (uneven splits allowed).
  virtual std::shared_ptr<Work> AlltoallSingle(
      Tensor output, Tensor input, const AlltoallSingleOptions& options = {});
  // Like Recv, from whichever rank sends first with that tag; the Work's
  // source_rank() names it.
  virtual std::shared_ptr<Work> RecvAnysource(Tensor tensor,
                                              const RecvOptions& options = {});
  // Posts every Send / Recv of `ops`, one Work each. Default: Send / Recv
  // for each entry, in order. Backends that can group
  // them (NCCL) override it.
  virtual std::vector<std::shared_ptr<Work>> BatchIsendIrecv(
      std::vector<P2POp> ops);

  // Blocks until every rank has called it or the timeout passes. Ranks
  // other than 0 send to rank 0 on tag kMonitoredBarrierTag and wait (up to
  // twice the timeout) for its verdict; rank 0 waits up to the timeout for
  // them. A rank that is late makes every rank that did arrive fail with
  // DeadlineExceeded naming the late ranks (rank 0 stops at the first late
  // one unless wait_all_ranks). A failure may leave the backend unusable
  // (gloo closes its pairs after a timed-out wait). The default uses Send /
  // Recv; a wrapper (e.g. a ProcessGroup adaptor) may forward it instead.
  virtual absl::Status MonitoredBarrier(
      const MonitoredBarrierOptions& options = {});
  // Reserved for MonitoredBarrier; user Send/Recv must not use it.
  static constexpr int kMonitoredBarrierTag = 0x7FFFFFF0;

  // "<name> <op> (rank R of N)": the prefix of this backend's Work names.
  std::string Describe(OpType op) const;

 protected:
  // A completed Work failed with Unimplemented:
  // "backend 'foo' does not implement Alltoall".
  std::shared_ptr<Work> Unimplemented(OpType op) const;
  // A completed Work failed with `status`, its message prefixed with
  // Describe(op).
  std::shared_ptr<Work> Fail(OpType op, const absl::Status& status) const;
  // `requested` or, when unset, timeout().
  absl::Duration TimeoutOr(
      const std::optional<absl::Duration>& requested) const {
    return requested.has_value() ? *requested : timeout_;
  }

 private:
  const std::string name_;
  const int rank_;
  const int size_;
  const absl::Duration timeout_;
};

// What ranks compare to catch mismatched calls before moving data (the shm
// and mpi backends exchange it with each collective): the operation, dtype,
// element count, root, ReduceOp, the call's sequence number and whether its
// local arguments were valid; -1 where a field does not apply.
struct CallSignature {
  int64_t op = -1;         // OpType
  int64_t dtype = -1;      // DType
  int64_t count = -1;      // element count
  int64_t root = -1;       // root rank
  int64_t reduce_op = -1;  // ReduceOp
  int64_t seq = -1;        // the call's sequence number in the group
  int64_t valid = 1;       // 1 if the local arguments were valid, else 0
  int64_t pad = 0;         // padding, always 0; not compared
};

// --- Argument checks shared by backends ---------------------------------
// Each returns InvalidArgument naming the operation `op` and the problem.

// `t` is defined and contiguous.
absl::Status CheckTensor(OpType op, const Tensor& t, absl::string_view what);
// `root` in [0, size).
absl::Status CheckRank(OpType op, int root, int size, absl::string_view what);
// `list` has `count` tensors, each defined, contiguous, and of the same dtype,
// shape and device as `like`.
absl::Status CheckTensorList(OpType op, const std::vector<Tensor>& list,
                             size_t count, const Tensor& like,
                             absl::string_view what);
// `reduce_op` applies to `dtype` (AVG: floating; BAND/BOR/BXOR: integral or
// bool).
absl::Status CheckReduceOp(OpType op, ReduceOp reduce_op, DType dtype);

// The local argument checks every backend runs for each operation, in one
// place: layout (CheckTensor / CheckTensorList), device, root and peer
// ranks. A backend adds only what is its own (dtype, ReduceOp support).
// Errors are InvalidArgument naming the operation, the argument and, for a
// wrong device, the backend.
class ArgChecks {
 public:
  // `backend` names the backend in errors ("gloo"); its tensors must be on
  // devices of type `device`.
  ArgChecks(std::string backend, DeviceType device, int rank, int size)
      : backend_(std::move(backend)),
        device_(device),
        rank_(rank),
        size_(size) {}

  // One tensor: CheckTensor, then the device.
  absl::Status One(OpType op, const Tensor& t, absl::string_view what) const;
  // One tensor and a root rank (Broadcast, Reduce).
  absl::Status Rooted(OpType op, const Tensor& t, absl::string_view what,
                      int root) const;
  // One tensor and `size` like it in `list` (Allgather, ReduceScatter).
  absl::Status WithList(OpType op, const Tensor& t, absl::string_view what,
                        const std::vector<Tensor>& list,
                        absl::string_view list_what) const;
  // One tensor, a root, and `size` like it in `list` on the root, none
  // elsewhere (Gather, Scatter).
  absl::Status RootedWithList(OpType op, const Tensor& t,
                              absl::string_view what, int root,
                              const std::vector<Tensor>& list,
                              absl::string_view list_what) const;
  // `size` inputs and `size` outputs, all like inputs[0].
  absl::Status Alltoall(const std::vector<Tensor>& outputs,
                        const std::vector<Tensor>& inputs) const;
  // `big` has `size` times the elements of `small`, same dtype and device
  // (AllgatherIntoTensor, ReduceScatterTensor).
  absl::Status Flat(OpType op, const Tensor& big, absl::string_view big_what,
                    const Tensor& small, absl::string_view small_what) const;
  // AlltoallSingle: both tensors have dim >= 1, the same dtype and row shape;
  // each split list is empty (dim 0 divisible by size) or has `size`
  // non-negative entries summing to dim 0. On success *out_rows / *in_rows
  // hold the resolved splits.
  absl::Status AlltoallSingle(const Tensor& output, const Tensor& input,
                              const AlltoallSingleOptions& options,
                              std::vector<int64_t>* out_rows,
                              std::vector<int64_t>* in_rows) const;
  // Send/Recv: the tensor, a peer that is another rank, a tag >= 0.
  absl::Status PointToPoint(OpType op, const Tensor& t, int peer,
                            int tag) const;

 private:
  std::string backend_;
  DeviceType device_;
  int rank_;
  int size_;
};

// Elements in one row (dim 0 entry) of `t`: the product of sizes()[1:], also
// when dim 0 is 0 (AlltoallSingle's row shape).
int64_t ElementsPerRow(const Tensor& t);

// Whether the bytes of `a` and `b` overlap (an in-place or aliased call).
bool SharesBytes(const Tensor& a, const Tensor& b);

// A copy of `status` that shares no storage with it (code and message; no
// payloads). Use it for a Status handed to another thread: Debian's Abseil
// is not built for ThreadSanitizer, so TSAN cannot see the atomic reference
// count two threads' copies would share, and reports their release as a
// race.
absl::Status CopyStatus(const absl::Status& status);

}  // namespace c10d
}  // namespace ferry

#endif  // FERRY_C10D_BACKEND_H_
