#include "ferry/c10d/nccl/nccl_backend.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "ferry/c10d/nccl/cuda_util.h"
#include "ferry/common/logging.h"
#include "ferry/common/status.h"

namespace ferry {
namespace c10d {
namespace {

constexpr char kUniqueIdKey[] = "nccl/unique_id";

absl::Status NcclStatus(ncclResult_t r, absl::string_view what) {
  if (r == ncclSuccess || r == ncclInProgress) return absl::OkStatus();
  std::string msg = absl::StrCat(what, ": NCCL error ", static_cast<int>(r),
                                 " (", ncclGetErrorString(r), ")");
  if (r == ncclInvalidArgument || r == ncclInvalidUsage) {
    return absl::InvalidArgumentError(msg);
  }
  if (r == ncclRemoteError || r == ncclSystemError) {
    return absl::UnavailableError(msg);
  }
  return absl::InternalError(msg);
}

absl::StatusOr<ncclDataType_t> NcclType(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return ncclFloat32;
    case DType::kFloat64:
      return ncclFloat64;
    case DType::kFloat16:
      return ncclFloat16;
    case DType::kBFloat16:
      return ncclBfloat16;
    case DType::kInt64:
      return ncclInt64;
    case DType::kInt32:
      return ncclInt32;
    case DType::kInt8:
      return ncclInt8;
    case DType::kUInt8:
    case DType::kBool:
      return ncclUint8;
  }
  return absl::InvalidArgumentError("unknown dtype");
}

absl::StatusOr<ncclRedOp_t> NcclOp(OpType op, ReduceOp reduce_op, DType dtype) {
  RETURN_IF_ERROR(CheckReduceOp(op, reduce_op, dtype));
  if (dtype == DType::kBool) {
    // 0/1 bytes: "or" is max, "and" is min.
    switch (reduce_op) {
      case ReduceOp::kSum:
      case ReduceOp::kMax:
        return ncclMax;
      case ReduceOp::kProduct:
      case ReduceOp::kMin:
        return ncclMin;
      default:
        break;
    }
  }
  switch (reduce_op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kAvg:
      return ncclAvg;
    case ReduceOp::kProduct:
      return ncclProd;
    case ReduceOp::kMin:
      return ncclMin;
    case ReduceOp::kMax:
      return ncclMax;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          OpTypeName(op), ": NCCL has no bitwise reduction (ReduceOp ",
          ReduceOpName(reduce_op), ")"));
  }
}

struct InFlight;

// Events recorded on the stream after each operation, for NcclWork's
// polling. They are reused, and destroyed only with the pool, so a waiter
// that polls an event already handed to a later operation still polls a
// valid one; an event returns to the pool only after its work completed,
// so such a waiter can only find that work complete already.
class EventPool {
 public:
  EventPool() = default;
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;
  ~EventPool() {
    MutexLock lock(&mu_);
    for (cudaEvent_t e : free_) cudaEventDestroy(e);
  }

  // An event of the current device.
  absl::StatusOr<cudaEvent_t> Take() {
    {
      MutexLock lock(&mu_);
      if (!free_.empty()) {
        cudaEvent_t e = free_.back();
        free_.pop_back();
        return e;
      }
    }
    cudaEvent_t e = nullptr;
    RETURN_IF_ERROR(
        CudaStatus(cudaEventCreateWithFlags(&e, cudaEventDisableTiming),
                   "cudaEventCreateWithFlags"));
    return e;
  }
  void Give(cudaEvent_t e) {
    if (e == nullptr) return;
    MutexLock lock(&mu_);
    free_.push_back(e);
  }

 private:
  Mutex mu_;
  std::vector<cudaEvent_t> free_ ABSL_GUARDED_BY(mu_);
};

// What the backend shares with its works and CUDA host callbacks, both of
// which may outlive it.
struct NcclShared {
  // Wakes the watchdog: HostDone and the worker bump `generation`.
  Mutex mu;
  uint64_t generation ABSL_GUARDED_BY(mu) = 0;
  // Operations whose host callback ran: handed on by the watchdog, never
  // dropped in the callback, since the last reference may free device
  // memory.
  std::vector<std::shared_ptr<InFlight>> released ABSL_GUARDED_BY(mu);
  EventPool events;
  // Set before the communicator is aborted: an event that completes after
  // that may mark a kernel that gave up, not one that finished.
  std::atomic<bool> aborting{false};
};

// A Work whose Wait first polls the event recorded after its operation: a
// call that finishes within a short spin completes on the waiting thread,
// without the hops through CUDA's callback thread and the watchdog. The
// watchdog still completes every work (and alone fails them).
class NcclWork final : public Work {
 public:
  NcclWork(std::string description, std::shared_ptr<NcclShared> shared)
      : Work(std::move(description)), shared_(std::move(shared)) {}

  // The event recorded after the operation (worker thread, once).
  void SetEvent(cudaEvent_t e) { event_.store(e); }

 protected:
  void PollBeforeBlocking(absl::Duration budget) override {
    const absl::Time end = absl::Now() + std::min(budget, kSpin);
    while (!IsCompleted()) {
      cudaEvent_t e = event_.load();
      if (e != nullptr) {
        cudaError_t q = cudaEventQuery(e);
        if (q == cudaSuccess) {
          if (!shared_->aborting.load()) Complete(absl::OkStatus());
          return;
        }
        if (q != cudaErrorNotReady) return;  // The watchdog decides.
      }
      if (absl::Now() >= end) return;
      std::this_thread::yield();
    }
  }

 private:
  static constexpr absl::Duration kSpin = absl::Microseconds(200);
  const std::shared_ptr<NcclShared> shared_;
  std::atomic<cudaEvent_t> event_{nullptr};
};

struct InFlight {
  std::shared_ptr<Work> work;
  std::shared_ptr<NcclShared> shared;
  cudaEvent_t event = nullptr;  // From NcclShared::events; may be null.
  // Set by HostDone: no abort had begun when the operation ended, so it
  // finished rather than gave up.
  std::atomic<bool> clean{false};
  absl::Time deadline;
  absl::Duration timeout;
  std::vector<Tensor> keep_alive;
  std::atomic<bool> done{false};
};

void CUDART_CB HostDone(void* arg) {
  // No CUDA calls allowed here (nor dropping what may free device memory):
  // flag, park the reference and wake the watchdog.
  std::unique_ptr<std::shared_ptr<InFlight>> holder(
      static_cast<std::shared_ptr<InFlight>*>(arg));
  // No reference is dropped here: the backend outlives every callback.
  NcclShared& shared = *(*holder)->shared;
  (*holder)->clean.store(!shared.aborting.load());
  MutexLock lock(&shared.mu);
  (*holder)->done.store(true);
  shared.released.push_back(std::move(*holder));
  ++shared.generation;
}

int DeviceOf(const Tensor& t) { return t.defined() ? t.device().index : -1; }

// What bounds the enqueueing of the operation the calling (worker) thread
// runs: set by Impl::Enqueue around the operation's enqueue function, and
// read by NCCL_CALL (through NcclEnqueued) inside it.
struct EnqueueLimits {
  absl::Time deadline = absl::InfiniteFuture();
  // The watchdog is aborting the communicator: stop waiting for NCCL.
  const std::atomic<bool>* aborting = nullptr;
};
thread_local EnqueueLimits t_enqueue;

// On a non-blocking communicator a call may return ncclInProgress before its
// work is on the stream, and nothing else may go on the stream or to NCCL
// until it is (else a copy after ncclAllGather runs before the gather). So
// wait for `r`'s call to finish enqueueing, until the operation's deadline.
absl::Status NcclEnqueued(ncclResult_t r, ncclComm_t comm,
                          absl::string_view what) {
  while (r == ncclInProgress) {
    if (t_enqueue.aborting != nullptr && t_enqueue.aborting->load()) {
      return absl::AbortedError(
          absl::StrCat(what,
                       ": the NCCL communicator is being aborted (an earlier "
                       "operation timed out)"));
    }
    if (absl::Now() > t_enqueue.deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          what, ": NCCL was still enqueueing it at the operation's deadline"));
    }
    absl::SleepFor(absl::Microseconds(20));
    ncclResult_t state = ncclInProgress;
    ncclResult_t q = ncclCommGetAsyncError(comm, &state);
    r = q != ncclSuccess ? q : state;
  }
  return NcclStatus(r, what);
}

}  // namespace

struct NcclBackend::Op {
  OpType type;
  uint32_t seq = 0;
  std::shared_ptr<Work> work;
  absl::Duration timeout;
  int device = -1;
  absl::Status local_error;
  absl::AnyInvocable<absl::Status(void*, void*)> enqueue;
  std::vector<Tensor> keep_alive;
  // Recorded at the call on the caller's stream: the backend's stream waits
  // for it before the operation (null: no device tensors).
  cudaEvent_t ready = nullptr;
  ~Op() {
    if (ready != nullptr) cudaEventDestroy(ready);  // Pending is fine.
  }
};

namespace {

// An event after the work queued so far on `stream` (0: the legacy default
// stream) of `device`, recorded on the calling thread; its current device
// is left as it was.
absl::StatusOr<cudaEvent_t> RecordCallerEvent(int device, uintptr_t stream) {
  int previous = 0;
  RETURN_IF_ERROR(CudaStatus(cudaGetDevice(&previous), "cudaGetDevice"));
  RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device),
                             absl::StrCat("cudaSetDevice(", device, ")")));
  cudaEvent_t e = nullptr;
  absl::Status s = CudaStatus(
      cudaEventCreateWithFlags(&e, cudaEventDisableTiming),
      "cudaEventCreateWithFlags");
  if (s.ok()) {
    s = CudaStatus(cudaEventRecord(e, reinterpret_cast<cudaStream_t>(stream)),
                   absl::StrCat("cudaEventRecord on the caller's stream of "
                                "cuda:", device));
    if (!s.ok()) cudaEventDestroy(e);
  }
  cudaSetDevice(previous);
  if (!s.ok()) return s;
  return e;
}

}  // namespace

struct NcclBackend::Impl {
  std::shared_ptr<Store> store;
  NcclBackend* self = nullptr;

  Mutex mu;
  std::deque<std::unique_ptr<Op>> queue ABSL_GUARDED_BY(mu);
  bool stopping ABSL_GUARDED_BY(mu) = false;
  uint32_t next_seq ABSL_GUARDED_BY(mu) = 0;
  absl::Status broken ABSL_GUARDED_BY(mu);
  // The communicator; the watchdog aborts it under this lock, the worker
  // enqueues under it.
  Mutex comm_mu ABSL_ACQUIRED_AFTER(mu);
  ncclComm_t comm ABSL_GUARDED_BY(comm_mu) = nullptr;
  bool comm_aborted ABSL_GUARDED_BY(comm_mu) = false;

  // Worker-thread state.
  int device = -1;
  cudaStream_t stream = nullptr;
  Tensor barrier_buf;

  std::shared_ptr<NcclShared> shared = std::make_shared<NcclShared>();

  // Watchdog state, under shared->mu.
  std::vector<std::shared_ptr<InFlight>> in_flight;  // Guarded by shared->mu.
  bool watchdog_stop = false;                        // Guarded by shared->mu.

  // Operations the watchdog is done with: their last references may free
  // device memory (cudaFree waits for the device), so the reaper drops
  // them, never the watchdog, which must stay free to abort a hung call.
  Mutex reap_mu;
  std::vector<std::shared_ptr<InFlight>> to_reap ABSL_GUARDED_BY(reap_mu);
  bool reap_stop ABSL_GUARDED_BY(reap_mu) = false;

  std::thread worker;
  std::thread watchdog;
  std::thread reaper;

  void SetBroken(const absl::Status& s) {
    MutexLock lock(&mu);
    if (broken.ok()) broken = s;
  }
  absl::Status EnsureComm(const Op& op);
  void WorkerLoop();
  void WatchdogLoop();
  void ReaperLoop();
  void Reap(std::vector<std::shared_ptr<InFlight>> done);
  void RunOp(std::unique_ptr<Op> op);
  // Why `op` cannot be enqueued (the backend broke, its arguments, or no
  // communicator could be made); OK when it can.
  absl::Status Precheck(const Op& op);
  // Puts `op` on the stream. DeadlineExceeded: NCCL was still enqueueing it
  // at `deadline`; the communicator is then aborted here, while this thread
  // holds the lock the next operation needs.
  absl::Status Enqueue(Op& op, absl::Time deadline);
  // Hands `op` to the watchdog; `stuck`: already expired (see Enqueue).
  void Track(std::unique_ptr<Op> op, absl::Time deadline, bool stuck);
  // Records an event after `f`'s operation on the stream for `work`'s Wait.
  void RecordEvent(InFlight& f, NcclWork& work);
  // Watchdog: `expired` passed its deadline; aborts the communicator and
  // fails it and `others`.
  void AbortAndFail(const std::shared_ptr<InFlight>& expired,
                    const std::vector<std::shared_ptr<InFlight>>& others);
};

absl::StatusOr<std::unique_ptr<NcclBackend>> NcclBackend::Create(
    std::shared_ptr<Store> store, int rank, int size, absl::Duration timeout) {
  if (store == nullptr) {
    return absl::InvalidArgumentError("NcclBackend::Create: null store");
  }
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NcclBackend::Create: rank ", rank, " is not in [0, ", size, ")"));
  }
  if (timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "NcclBackend::Create: timeout must be positive");
  }
  return std::unique_ptr<NcclBackend>(
      new NcclBackend(std::move(store), rank, size, timeout));
}

BackendFactory NcclBackend::Factory() {
  return
      [](const BackendConfig& c) -> absl::StatusOr<std::unique_ptr<Backend>> {
        if (!c.options.empty()) {
          return absl::InvalidArgumentError(
              absl::StrCat("the nccl backend takes no options, got '",
                           c.options.begin()->first, "'"));
        }
        ASSIGN_OR_RETURN(
            std::unique_ptr<NcclBackend> b,
            NcclBackend::Create(c.store, c.rank, c.size, c.timeout));
        return std::unique_ptr<Backend>(std::move(b));
      };
}

NcclBackend::NcclBackend(std::shared_ptr<Store> store, int rank, int size,
                         absl::Duration timeout)
    : Backend("nccl", rank, size, timeout), impl_(std::make_unique<Impl>()) {
  impl_->store = std::move(store);
  impl_->self = this;
  impl_->worker = std::thread([this] { impl_->WorkerLoop(); });
  impl_->watchdog = std::thread([this] { impl_->WatchdogLoop(); });
  impl_->reaper = std::thread([this] { impl_->ReaperLoop(); });
}

NcclBackend::~NcclBackend() {
  std::deque<std::unique_ptr<Op>> cancelled;
  {
    MutexLock lock(&impl_->mu);
    impl_->stopping = true;
    cancelled.swap(impl_->queue);
  }
  for (auto& op : cancelled) {
    op->work->Complete(absl::CancelledError(absl::StrCat(
        op->work->description(), ": the backend was destroyed before it ran")));
  }
  impl_->worker.join();
  bool pending;
  {
    MutexLock lock(&impl_->shared->mu);
    pending = false;
    for (const auto& f : impl_->in_flight) pending |= !f->done.load();
  }
  {
    MutexLock lock(&impl_->comm_mu);
    if (impl_->comm != nullptr && !impl_->comm_aborted) {
      // Anything still running would hang a clean destroy.
      if (pending) {
        impl_->shared->aborting.store(true);
        ncclCommAbort(impl_->comm);
      } else {
        if (impl_->stream != nullptr) cudaStreamSynchronize(impl_->stream);
        ncclCommDestroy(impl_->comm);
      }
    }
    impl_->comm = nullptr;
  }
  if (impl_->stream != nullptr) {
    cudaStreamSynchronize(impl_->stream);
    cudaStreamDestroy(impl_->stream);
  }
  {
    MutexLock lock(&impl_->shared->mu);
    impl_->watchdog_stop = true;
    ++impl_->shared->generation;
  }
  impl_->watchdog.join();
  {
    MutexLock lock(&impl_->reap_mu);
    impl_->reap_stop = true;
  }
  impl_->reaper.join();
}

absl::Status NcclBackend::Impl::EnsureComm(const Op& op) {
  {
    MutexLock lock(&comm_mu);
    if (comm_aborted) {
      return absl::FailedPreconditionError("the NCCL communicator was aborted");
    }
    if (comm != nullptr) {
      if (op.device >= 0 && op.device != device) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensors on cuda:", op.device,
                         " but this nccl backend's "
                         "communicator lives on cuda:",
                         device));
      }
      return absl::OkStatus();
    }
  }
  int count = CudaDeviceCount();
  if (count == 0) {
    return absl::FailedPreconditionError(
        "the nccl backend found no CUDA device (cudaGetDeviceCount is 0)");
  }
  int dev = op.device >= 0 ? op.device : self->rank() % count;
  RETURN_IF_ERROR(
      CudaStatus(cudaSetDevice(dev), absl::StrCat("cudaSetDevice(", dev, ")")));
  absl::Time deadline = absl::Now() + op.timeout;
  ncclUniqueId id;
  std::vector<std::string> keys = {kUniqueIdKey};
  if (self->rank() == 0) {
    RETURN_IF_ERROR(NcclStatus(ncclGetUniqueId(&id), "ncclGetUniqueId"));
    RETURN_IF_ERROR(store->Set(
        kUniqueIdKey, absl::string_view(id.internal, sizeof(id.internal))));
  } else {
    RETURN_IF_ERROR(Annotate(store->Wait(keys, op.timeout),
                             "waiting for rank 0's NCCL unique id"));
    ASSIGN_OR_RETURN(std::string bytes, store->Get(kUniqueIdKey));
    if (bytes.size() != sizeof(id.internal)) {
      return absl::DataLossError(absl::StrCat("NCCL unique id has ",
                                              bytes.size(), " bytes, expected ",
                                              sizeof(id.internal)));
    }
    std::memcpy(id.internal, bytes.data(), sizeof(id.internal));
  }
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // So a missing rank cannot hang us: we poll below.
  ncclComm_t c = nullptr;
  RETURN_IF_ERROR(NcclStatus(
      ncclCommInitRankConfig(&c, self->size(), id, self->rank(), &config),
      "ncclCommInitRankConfig"));
  ncclResult_t state = ncclInProgress;
  while (true) {
    ncclResult_t r = ncclCommGetAsyncError(c, &state);
    if (r != ncclSuccess) state = r;
    if (state != ncclInProgress) break;
    if (absl::Now() > deadline) {
      ncclCommAbort(c);
      return absl::DeadlineExceededError(absl::StrCat(
          "NCCL communicator setup did not complete within ",
          absl::FormatDuration(op.timeout), " (a rank did not join)"));
    }
    absl::SleepFor(absl::Milliseconds(1));  // NCCL's documented polling.
  }
  if (state != ncclSuccess) {
    ncclCommAbort(c);
    return NcclStatus(state, "NCCL communicator setup");
  }
  // Non-blocking: device work on the legacy default stream (backward's
  // kernels) overlaps the collectives; Submit orders each operation after
  // its caller's stream instead.
  RETURN_IF_ERROR(CudaStatus(
      cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
      "cudaStreamCreateWithFlags"));
  CudaAllocator allocator(dev);
  ASSIGN_OR_RETURN(barrier_buf,
                   Tensor::TryEmpty({1}, DType::kFloat32, &allocator));
  device = dev;
  MutexLock lock(&comm_mu);
  comm = c;
  return absl::OkStatus();
}

void NcclBackend::Impl::WorkerLoop() {
  ScopedLogLabel label(absl::StrCat("nccl-rank", self->rank()));
  for (;;) {
    std::unique_ptr<Op> op;
    {
      MutexLock lock(&mu);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
        return stopping || !queue.empty();
      };
      mu.Await(absl::Condition(&ready));
      if (queue.empty()) return;
      op = std::move(queue.front());
      queue.pop_front();
    }
    RunOp(std::move(op));
  }
}

void NcclBackend::Impl::RunOp(std::unique_ptr<Op> op) {
  const std::string& desc = op->work->description();
  absl::Status s = Precheck(*op);
  if (!s.ok()) {
    op->work->Complete(Annotate(s, desc));
    return;
  }
  cudaSetDevice(device);
  const absl::Time deadline = absl::Now() + op->timeout;
  s = Enqueue(*op, deadline);
  const bool stuck = absl::IsDeadlineExceeded(s);
  if (stuck) {
    SetBroken(Annotate(s, desc));  // Enqueue aborted the communicator.
  } else if (!s.ok()) {
    // While the watchdog aborts, its timeout is the backend's failure.
    if (!shared->aborting.load()) SetBroken(Annotate(s, desc));
    op->work->Complete(Annotate(s, desc));
    return;
  }
  Track(std::move(op), deadline, stuck);
}

absl::Status NcclBackend::Impl::Precheck(const Op& op) {
  {
    MutexLock lock(&mu);
    if (!broken.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the nccl backend is unusable after an earlier failure (",
          broken.message(), "); create a new process group"));
    }
  }
  if (!op.local_error.ok()) return op.local_error;
  absl::Status s = EnsureComm(op);
  if (absl::IsDeadlineExceeded(s) || absl::IsUnavailable(s)) SetBroken(s);
  return s;
}

absl::Status NcclBackend::Impl::Enqueue(Op& op, absl::Time deadline) {
  MutexLock lock(&comm_mu);
  if (comm == nullptr || comm_aborted) {
    return absl::FailedPreconditionError("the NCCL communicator was aborted");
  }
  if (op.ready != nullptr) {
    RETURN_IF_ERROR(CudaStatus(cudaStreamWaitEvent(stream, op.ready, 0),
                               "cudaStreamWaitEvent for the caller's stream"));
  }
  t_enqueue = {deadline, &shared->aborting};
  absl::Status s = op.enqueue(comm, stream);
  t_enqueue = {};
  if (s.ok()) {
    // An error NCCL reports asynchronously (e.g. a peer's connection lost).
    ncclResult_t state = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(comm, &state);
    s = NcclStatus(r != ncclSuccess ? r : state, "NCCL");
  }
  if (absl::IsDeadlineExceeded(s)) {
    shared->aborting.store(true);  // Before any kernel can give up.
    ncclCommAbort(comm);
    comm_aborted = true;
    comm = nullptr;
  }
  return s;
}

void NcclBackend::Impl::Track(std::unique_ptr<Op> op, absl::Time deadline,
                              bool stuck) {
  auto f = std::make_shared<InFlight>();
  f->work = op->work;
  f->shared = shared;
  f->deadline = deadline;
  f->timeout = op->timeout;
  f->keep_alive = std::move(op->keep_alive);
  if (!stuck) {
    RecordEvent(*f, static_cast<NcclWork&>(*op->work));
    // HostDone may run before `f` is in flight: the watchdog then finds it
    // done at once.
    auto* holder = new std::shared_ptr<InFlight>(f);
    absl::Status launched = CudaStatus(
        cudaLaunchHostFunc(stream, &HostDone, holder), "cudaLaunchHostFunc");
    if (!launched.ok()) {
      delete holder;
      const std::string& desc = op->work->description();
      SetBroken(Annotate(launched, desc));
      f->work->Complete(Annotate(launched, desc));
      shared->events.Give(f->event);
      return;
    }
  }
  // A stuck operation's deadline has passed: the watchdog reports it.
  MutexLock lock(&shared->mu);
  in_flight.push_back(f);
  ++shared->generation;
}

void NcclBackend::Impl::RecordEvent(InFlight& f, NcclWork& work) {
  absl::StatusOr<cudaEvent_t> e = shared->events.Take();
  if (!e.ok()) return;  // Without an event, Wait just blocks.
  if (cudaEventRecord(*e, stream) != cudaSuccess) {
    cudaGetLastError();
    shared->events.Give(*e);
    return;
  }
  f.event = *e;
  work.SetEvent(*e);
}

void NcclBackend::Impl::WatchdogLoop() {
  ScopedLogLabel label(absl::StrCat("nccl-watchdog-rank", self->rank()));
  uint64_t seen = 0;
  for (;;) {
    std::vector<std::shared_ptr<InFlight>> finished, failed, released;
    std::shared_ptr<InFlight> expired;
    bool stop;
    {
      MutexLock lock(&shared->mu);
      absl::Time earliest = absl::InfiniteFuture();
      for (const auto& f : in_flight) {
        if (!f->done.load() && f->deadline < earliest) earliest = f->deadline;
      }
      auto changed = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return shared->generation != seen;
      };
      shared->mu.AwaitWithDeadline(absl::Condition(&changed), earliest);
      seen = shared->generation;
      stop = watchdog_stop;
      released.swap(shared->released);
      absl::Time now = absl::Now();
      std::vector<std::shared_ptr<InFlight>> keep;
      for (auto& f : in_flight) {
        if (f->done.load()) {
          finished.push_back(std::move(f));
        } else if (f->deadline <= now && expired == nullptr) {
          expired = std::move(f);
        } else {
          keep.push_back(std::move(f));
        }
      }
      in_flight.swap(keep);
      if (expired != nullptr || stop) {
        // Everything else in flight shares the aborted communicator.
        for (auto& f : in_flight) failed.push_back(std::move(f));
        in_flight.clear();
      }
    }
    for (auto& f : finished) {
      // Ended after an abort began: the kernel may have given up.
      f->work->Complete(
          f->clean.load()
              ? absl::OkStatus()
              : absl::AbortedError(absl::StrCat(
                    f->work->description(),
                    ": the NCCL communicator was aborted before it finished")));
    }
    if (expired != nullptr) {
      AbortAndFail(expired, failed);
    } else {
      for (auto& f : failed) {
        f->work->Complete(absl::CancelledError(absl::StrCat(
            f->work->description(), ": the backend was destroyed")));
      }
    }
    // Every work here is complete: their events may serve again.
    finished.insert(finished.end(), failed.begin(), failed.end());
    if (expired != nullptr) finished.push_back(std::move(expired));
    for (const auto& f : finished) shared->events.Give(f->event);
    finished.insert(finished.end(), released.begin(), released.end());
    Reap(std::move(finished));
    if (stop) return;
  }
}

void NcclBackend::Impl::Reap(std::vector<std::shared_ptr<InFlight>> done) {
  if (done.empty()) return;
  MutexLock lock(&reap_mu);
  to_reap.insert(to_reap.end(), std::make_move_iterator(done.begin()),
                 std::make_move_iterator(done.end()));
}

void NcclBackend::Impl::ReaperLoop() {
  for (;;) {
    std::vector<std::shared_ptr<InFlight>> batch;
    bool stop;
    {
      MutexLock lock(&reap_mu);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(reap_mu) {
        return reap_stop || !to_reap.empty();
      };
      reap_mu.Await(absl::Condition(&ready));
      batch.swap(to_reap);
      stop = reap_stop;
    }
    batch.clear();  // Here, off the watchdog: may wait in cudaFree.
    if (stop) return;
  }
}

void NcclBackend::Impl::AbortAndFail(
    const std::shared_ptr<InFlight>& expired,
    const std::vector<std::shared_ptr<InFlight>>& others) {
  absl::Status timeout = absl::DeadlineExceededError(absl::StrCat(
      expired->work->description(), ": collective did not finish within ",
      absl::FormatDuration(expired->timeout),
      "; the NCCL communicator was aborted"));
  FERRY_LOG(ERROR) << timeout;
  shared->aborting.store(true);  // Before any kernel can give up.
  {
    MutexLock lock(&comm_mu);
    if (comm != nullptr && !comm_aborted) {
      ncclCommAbort(comm);
      comm_aborted = true;
      comm = nullptr;
    }
  }
  SetBroken(timeout);
  expired->work->Complete(timeout);
  for (const auto& f : others) {
    f->work->Complete(absl::AbortedError(
        absl::StrCat(f->work->description(), ": aborted because ",
                     expired->work->description(), " timed out")));
  }
}

std::shared_ptr<Work> NcclBackend::Submit(
    OpType type, absl::Status local_error, int device,
    const std::optional<absl::Duration>& timeout,
    absl::AnyInvocable<absl::Status(void*, void*)> enqueue,
    std::vector<Tensor> keep_alive, uintptr_t caller_stream) {
  auto op = std::make_unique<Op>();
  op->type = type;
  op->local_error = CopyStatus(local_error);
  op->device = device;
  // The backend's stream does not wait for the default stream by itself:
  // order the operation after what the caller queued (without a device,
  // EnsureComm reports that instead).
  if (op->local_error.ok() && device >= 0 && CudaDeviceCount() > 0) {
    absl::StatusOr<cudaEvent_t> ready = RecordCallerEvent(device,
                                                          caller_stream);
    if (ready.ok()) {
      op->ready = *ready;
    } else {
      op->local_error = ready.status();
    }
  }
  op->timeout = TimeoutOr(timeout);
  op->enqueue = std::move(enqueue);
  op->keep_alive = std::move(keep_alive);
  std::shared_ptr<Work> work;
  MutexLock lock(&impl_->mu);
  op->seq = impl_->next_seq++;
  work = std::make_shared<NcclWork>(absl::StrCat(Describe(type), " #", op->seq),
                                    impl_->shared);
  op->work = work;
  if (impl_->stopping) {
    work->Complete(absl::CancelledError("the backend is shutting down"));
    return work;
  }
  impl_->queue.push_back(std::move(op));
  return work;
}

// --- Collectives -----------------------------------------------------------

// Every NCCL call of an operation waits until its work is on the stream.
// `comm` is the lambda's communicator (void* or ncclComm_t).
#define NCCL_CALL(expr) \
  RETURN_IF_ERROR(NcclEnqueued((expr), static_cast<ncclComm_t>(comm), #expr))
#define CUDA_CALL(expr) RETURN_IF_ERROR(CudaStatus((expr), #expr))

ArgChecks NcclBackend::Checks() const {
  return ArgChecks("nccl", DeviceType::kCUDA, rank(), size());
}

std::shared_ptr<Work> NcclBackend::Allreduce(Tensor tensor,
                                             const AllreduceOptions& options) {
  constexpr OpType kOp = OpType::kAllreduce;
  absl::Status local = Checks().One(kOp, tensor, "tensor");
  absl::StatusOr<ncclDataType_t> dt = ncclFloat32;
  absl::StatusOr<ncclRedOp_t> rop = ncclSum;
  if (local.ok()) dt = NcclType(tensor.dtype());
  if (local.ok()) rop = NcclOp(kOp, options.op, tensor.dtype());
  if (local.ok() && !rop.ok()) local = rop.status();
  return Submit(
      kOp, local, DeviceOf(tensor), options.timeout,
      [tensor, dt = dt.value_or(ncclFloat32), rop = rop.value_or(ncclSum)](
          void* comm, void* stream) -> absl::Status {
        if (tensor.numel() == 0) return absl::OkStatus();
        NCCL_CALL(ncclAllReduce(
            tensor.data_ptr(), tensor.data_ptr(), tensor.numel(), dt, rop,
            static_cast<ncclComm_t>(comm), static_cast<cudaStream_t>(stream)));
        return absl::OkStatus();
      },
      {tensor}, options.stream);
}

std::shared_ptr<Work> NcclBackend::Broadcast(Tensor tensor,
                                             const BroadcastOptions& options) {
  constexpr OpType kOp = OpType::kBroadcast;
  absl::Status local = Checks().Rooted(kOp, tensor, "tensor", options.root);
  absl::StatusOr<ncclDataType_t> dt = ncclFloat32;
  if (local.ok()) dt = NcclType(tensor.dtype());
  int root = options.root;
  return Submit(kOp, local, DeviceOf(tensor), options.timeout,
                [tensor, root, dt = dt.value_or(ncclFloat32)](
                    void* comm, void* stream) -> absl::Status {
                  if (tensor.numel() == 0) return absl::OkStatus();
                  NCCL_CALL(ncclBroadcast(tensor.data_ptr(), tensor.data_ptr(),
                                          tensor.numel(), dt, root,
                                          static_cast<ncclComm_t>(comm),
                                          static_cast<cudaStream_t>(stream)));
                  return absl::OkStatus();
                },
                {tensor});
}

std::shared_ptr<Work> NcclBackend::Reduce(Tensor tensor,
                                          const ReduceOptions& options) {
  constexpr OpType kOp = OpType::kReduce;
  absl::Status local = Checks().Rooted(kOp, tensor, "tensor", options.root);
  absl::StatusOr<ncclDataType_t> dt = ncclFloat32;
  absl::StatusOr<ncclRedOp_t> rop = ncclSum;
  if (local.ok()) dt = NcclType(tensor.dtype());
  if (local.ok()) rop = NcclOp(kOp, options.op, tensor.dtype());
  if (local.ok() && !rop.ok()) local = rop.status();
  int root = options.root;
  return Submit(
      kOp, local, DeviceOf(tensor), options.timeout,
      [tensor, root, dt = dt.value_or(ncclFloat32),
       rop = rop.value_or(ncclSum)](void* comm, void* stream) -> absl::Status {
        if (tensor.numel() == 0) return absl::OkStatus();
        // recvbuff is only written on the root.
        NCCL_CALL(ncclReduce(
            tensor.data_ptr(), tensor.data_ptr(), tensor.numel(), dt, rop, root,
            static_cast<ncclComm_t>(comm), static_cast<cudaStream_t>(stream)));
        return absl::OkStatus();
      },
      {tensor});
}

std::shared_ptr<Work> NcclBackend::Allgather(std::vector<Tensor> outputs,
                                             Tensor input,
                                             const AllgatherOptions& options) {
  constexpr OpType kOp = OpType::kAllgather;
  absl::Status local =
      Checks().WithList(kOp, input, "input", outputs, "outputs");
  absl::StatusOr<ncclDataType_t> dt = ncclFloat32;
  Tensor flat;
  if (local.ok()) dt = NcclType(input.dtype());
  if (local.ok() && input.numel() > 0) {
    CudaAllocator alloc(input.device().index);
    absl::StatusOr<Tensor> f =
        Tensor::TryEmpty({size() * input.numel()}, input.dtype(), &alloc);
    if (f.ok())
      flat = *f;
    else
      local = f.status();
  }
  std::vector<Tensor> keep = outputs;
  keep.push_back(input);
  keep.push_back(flat);
  int n = size();
  return Submit(
      kOp, local, DeviceOf(input), options.timeout,
      [outputs, input, flat, n, dt = dt.value_or(ncclFloat32)](
          void* comm, void* stream) -> absl::Status {
        if (input.numel() == 0) return absl::OkStatus();
        auto s = static_cast<cudaStream_t>(stream);
        NCCL_CALL(ncclAllGather(input.data_ptr(), flat.data_ptr(),
                                input.numel(), dt,
                                static_cast<ncclComm_t>(comm), s));
        size_t nbytes = input.nbytes();
        for (int r = 0; r < n; ++r) {
          CUDA_CALL(
              cudaMemcpyAsync(outputs[r].data_ptr(),
                              static_cast<char*>(flat.data_ptr()) + r * nbytes,
                              nbytes, cudaMemcpyDeviceToDevice, s));
        }
        return absl::OkStatus();
      },
      std::move(keep));
}

std::shared_ptr<Work> NcclBackend::Gather(std::vector<Tensor> outputs,
                                          Tensor input,
                                          const GatherOptions& options) {
  constexpr OpType kOp = OpType::kGather;
  absl::Status local = Checks().RootedWithList(
      kOp, input, "input", options.root, outputs, "outputs");
  bool is_root = rank() == options.root;
  absl::StatusOr<ncclDataType_t> dt = ncclFloat32;
  if (local.ok()) dt = NcclType(input.dtype());
  std::vector<Tensor> keep = outputs;
  keep.push_back(input);
  int root = options.root, me = rank(), n = size();
  return Submit(
      kOp, local, DeviceOf(input), options.timeout,
      [outputs, input, root, me, n, is_root, dt = dt.value_or(ncclFloat32)](
          void* vcomm, void* stream) -> absl::Status {
        if (input.numel() == 0) return absl::OkStatus();
        auto comm = static_cast<ncclComm_t>(vcomm);
        auto s = static_cast<cudaStream_t>(stream);
        NCCL_CALL(ncclGroupStart());
        if (is_root) {
          for (int r = 0; r < n; ++r) {
            if (r == me) continue;
            NCCL_CALL(
                ncclRecv(outputs[r].data_ptr(), input.numel(), dt, r, comm, s));
          }
        } else {
          NCCL_CALL(
              ncclSend(input.data_ptr(), input.numel(), dt, root, comm, s));
        }
        NCCL_CALL(ncclGroupEnd());
        if (is_root) {
          CUDA_CALL(cudaMemcpyAsync(outputs[me].data_ptr(), input.data_ptr(),
                                    input.nbytes(), cudaMemcpyDeviceToDevice,
                                    s));
        }
        return absl::OkStatus();
      },
      std::move(keep));
}

std::shared_ptr<Work> NcclBackend::Scatter(Tensor output,
                                           std::vector<Tensor> inputs,
                                           const ScatterOptions& options) {
  constexpr OpType kOp = OpType::kScatter;
  absl::Status local = Checks().RootedWithList(kOp, output, "output",
                                               options.root, inputs, "inputs");
  bool is_root = rank() == options.root;
  absl::StatusOr<ncclDataType_t> dt = ncclFloat32;
  if (local.ok()) dt = NcclType(output.dtype());
  std::vector<Tensor> keep = inputs;
  keep.push_back(output);
  int root = options.root, me = rank(), n = size();
  return Submit(
      kOp, local, DeviceOf(output), options.timeout,
      [inputs, output, root, me, n, is_root, dt = dt.value_or(ncclFloat32)](
          void* vcomm, void* stream) -> absl::Status {
        if (output.numel() == 0) return absl::OkStatus();
        auto comm = static_cast<ncclComm_t>(vcomm);
        auto s = static_cast<cudaStream_t>(stream);
        NCCL_CALL(ncclGroupStart());
        if (is_root) {
          for (int r = 0; r < n; ++r) {
            if (r == me) continue;
            NCCL_CALL(
                ncclSend(inputs[r].data_ptr(), output.numel(), dt, r, comm, s));
          }
        } else {
          NCCL_CALL(
              ncclRecv(output.data_ptr(), output.numel(), dt, root, comm, s));
        }
        NCCL_CALL(ncclGroupEnd());
        if (is_root) {
          CUDA_CALL(cudaMemcpyAsync(output.data_ptr(), inputs[me].data_ptr(),
                                    output.nbytes(), cudaMemcpyDeviceToDevice,
                                    s));
        }
        return absl::OkStatus();
      },
      std::move(keep));
}

std::shared_ptr<Work> NcclBackend::ReduceScatter(
    Tensor output, std::vector<Tensor> inputs,
    const ReduceScatterOptions& options) {
  constexpr OpType kOp = OpType::kReduceScatter;
  absl::Status local =
      Checks().WithList(kOp, output, "output", inputs, "inputs");
  absl::StatusOr<ncclDataType_t> dt = ncclFloat32;
  absl::StatusOr<ncclRedOp_t> rop = ncclSum;
  if (local.ok()) dt = NcclType(output.dtype());
  if (local.ok()) rop = NcclOp(kOp, options.op, output.dtype());
  if (local.ok() && !rop.ok()) local = rop.status();
  Tensor flat;
  if (local.ok() && output.numel() > 0) {
    CudaAllocator alloc(output.device().index);
    absl::StatusOr<Tensor> f =
        Tensor::TryEmpty({size() * output.numel()}, output.dtype(), &alloc);
    if (f.ok())
      flat = *f;
    else
      local = f.status();
  }
  std::vector<Tensor> keep = inputs;
  keep.push_back(output);
  keep.push_back(flat);
  int n = size();
  return Submit(
      kOp, local, DeviceOf(output), options.timeout,
      [inputs, output, flat, n, dt = dt.value_or(ncclFloat32),
       rop = rop.value_or(ncclSum)](void* comm, void* stream) -> absl::Status {
        if (output.numel() == 0) return absl::OkStatus();
        auto s = static_cast<cudaStream_t>(stream);
        size_t nbytes = output.nbytes();
        for (int r = 0; r < n; ++r) {
          CUDA_CALL(cudaMemcpyAsync(
              static_cast<char*>(flat.data_ptr()) + r * nbytes,
              inputs[r].data_ptr(), nbytes, cudaMemcpyDeviceToDevice, s));
        }
        NCCL_CALL(ncclReduceScatter(flat.data_ptr(), output.data_ptr(),
                                    output.numel(), dt, rop,
                                    static_cast<ncclComm_t>(comm), s));
        return absl::OkStatus();
      },
      std::move(keep));
}

std::shared_ptr<Work> NcclBackend::Alltoall(std::vector<Tensor> outputs,
                                            std::vector<Tensor> inputs,
                                            const AlltoallOptions& options) {
  constexpr OpType kOp = OpType::kAlltoall;
  absl::Status local = Checks().Alltoall(outputs, inputs);
  absl::StatusOr<ncclDataType_t> dt = ncclFloat32;
  if (local.ok()) dt = NcclType(inputs[0].dtype());
  std::vector<Tensor> keep = inputs;
  keep.insert(keep.end(), outputs.begin(), outputs.end());
  int me = rank(), n = size();
  int device = inputs.empty() ? -1 : DeviceOf(inputs[0]);
  return Submit(
      kOp, local, device, options.timeout,
      [outputs, inputs, me, n, dt = dt.value_or(ncclFloat32)](
          void* vcomm, void* stream) -> absl::Status {
        int64_t count = inputs[0].numel();
        if (count == 0) return absl::OkStatus();
        auto comm = static_cast<ncclComm_t>(vcomm);
        auto s = static_cast<cudaStream_t>(stream);
        NCCL_CALL(ncclGroupStart());
        for (int r = 0; r < n; ++r) {
          if (r == me) continue;
          NCCL_CALL(ncclSend(inputs[r].data_ptr(), count, dt, r, comm, s));
          NCCL_CALL(ncclRecv(outputs[r].data_ptr(), count, dt, r, comm, s));
        }
        NCCL_CALL(ncclGroupEnd());
        CUDA_CALL(cudaMemcpyAsync(outputs[me].data_ptr(), inputs[me].data_ptr(),
                                  inputs[me].nbytes(), cudaMemcpyDeviceToDevice,
                                  s));
        return absl::OkStatus();
      },
      std::move(keep));
}

std::shared_ptr<Work> NcclBackend::Barrier(const BarrierOptions& options) {
  Impl* impl = impl_.get();
  return Submit(
      OpType::kBarrier, absl::OkStatus(), -1, options.timeout,
      [impl](void* comm, void* stream) -> absl::Status {
        NCCL_CALL(ncclAllReduce(impl->barrier_buf.data_ptr(),
                                impl->barrier_buf.data_ptr(), 1, ncclFloat32,
                                ncclSum, static_cast<ncclComm_t>(comm),
                                static_cast<cudaStream_t>(stream)));
        return absl::OkStatus();
      },
      {});
}

// --- Point to point ---------------------------------------------------------

namespace {

// Posts one send or receive of `op.tensor`'s bytes (inside a group or not).
absl::Status PostP2P(const P2POp& op, ncclComm_t comm, cudaStream_t s) {
  if (op.tensor.nbytes() == 0) return absl::OkStatus();
  if (op.kind == P2POp::Kind::kSend) {
    NCCL_CALL(ncclSend(op.tensor.data_ptr(), op.tensor.nbytes(), ncclUint8,
                       op.peer, comm, s));
  } else {
    NCCL_CALL(ncclRecv(op.tensor.data_ptr(), op.tensor.nbytes(), ncclUint8,
                       op.peer, comm, s));
  }
  return absl::OkStatus();
}

}  // namespace

std::shared_ptr<Work> NcclBackend::Send(Tensor tensor, int dst_rank,
                                        const SendOptions& options) {
  P2POp op{P2POp::Kind::kSend, std::move(tensor), dst_rank, options.tag};
  absl::Status local =
      Checks().PointToPoint(OpType::kSend, op.tensor, dst_rank, options.tag);
  return Submit(OpType::kSend, local, DeviceOf(op.tensor), options.timeout,
                [op](void* comm, void* stream) {
                  return PostP2P(op, static_cast<ncclComm_t>(comm),
                                 static_cast<cudaStream_t>(stream));
                },
                {op.tensor});
}

std::shared_ptr<Work> NcclBackend::Recv(Tensor tensor, int src_rank,
                                        const RecvOptions& options) {
  P2POp op{P2POp::Kind::kRecv, std::move(tensor), src_rank, options.tag};
  absl::Status local =
      Checks().PointToPoint(OpType::kRecv, op.tensor, src_rank, options.tag);
  return Submit(OpType::kRecv, local, DeviceOf(op.tensor), options.timeout,
                [op](void* comm, void* stream) {
                  return PostP2P(op, static_cast<ncclComm_t>(comm),
                                 static_cast<cudaStream_t>(stream));
                },
                {op.tensor});
}

std::vector<std::shared_ptr<Work>> NcclBackend::BatchIsendIrecv(
    std::vector<P2POp> ops) {
  if (ops.empty()) return {};
  absl::Status local;
  std::vector<Tensor> keep;
  const int device = DeviceOf(ops[0].tensor);
  for (const P2POp& op : ops) {
    OpType type = op.kind == P2POp::Kind::kSend ? OpType::kSend : OpType::kRecv;
    if (local.ok())
      local = Checks().PointToPoint(type, op.tensor, op.peer, op.tag);
    if (local.ok() && DeviceOf(op.tensor) != device) {
      local = absl::InvalidArgumentError(
          absl::StrCat(OpTypeName(type),
                       ": every tensor of a batch must be on one device "
                       "(cuda:",
                       device, " and cuda:", DeviceOf(op.tensor), " given)"));
    }
    keep.push_back(op.tensor);
  }
  // One group: NCCL posts every send and receive before any waits.
  std::shared_ptr<Work> work = Submit(
      ops[0].kind == P2POp::Kind::kSend ? OpType::kSend : OpType::kRecv, local,
      device, std::nullopt,
      [ops](void* vcomm, void* stream) -> absl::Status {
        auto comm = static_cast<ncclComm_t>(vcomm);
        auto s = static_cast<cudaStream_t>(stream);
        NCCL_CALL(ncclGroupStart());
        absl::Status posted;
        for (const P2POp& op : ops) {
          posted = PostP2P(op, comm, s);
          if (!posted.ok()) break;
        }
        NCCL_CALL(ncclGroupEnd());
        return posted;
      },
      std::move(keep));
  return std::vector<std::shared_ptr<Work>>(ops.size(), work);
}

#undef NCCL_CALL
#undef CUDA_CALL

}  // namespace c10d
}  // namespace ferry
