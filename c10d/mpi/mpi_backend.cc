#include "ferry/c10d/mpi/mpi_backend.h"

#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <random>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "ferry/c10d/reduce.h"
#include "ferry/common/status.h"

namespace ferry {
namespace c10d {

namespace {

constexpr int kNumDTypes = 9;
constexpr int kNumReduceOps = 8;

// MPI is initialized once per process and outlives every backend, so this
// state is process-wide by necessity (MPI_Init may run only once).
struct MpiProcess {
  absl::Status init;
  int world_rank = -1;
  int world_size = 0;
  int tag_ub = 32767;
  // One contiguous type of ItemSize bytes per DType (distinct handles, so a
  // user operation can tell the dtype), one user operation per ReduceOp.
  MPI_Datatype types[kNumDTypes] = {};
  MPI_Op ops[kNumReduceOps] = {};
  // Buffers of operations MPI may still touch (abandoned after a timeout),
  // kept until the process exits.
  Mutex kept_mu;
  std::vector<std::shared_ptr<void>> kept ABSL_GUARDED_BY(kept_mu);
};

MpiProcess& Process();

template <int kOp>
void UserReduce(void* in, void* inout, int* len, MPI_Datatype* type) {
  const MpiProcess& p = Process();
  for (int d = 0; d < kNumDTypes; ++d) {
    if (p.types[d] != *type) continue;
    absl::StatusOr<ReduceFn> fn =
        GetReduceFn(static_cast<DType>(d), static_cast<ReduceOp>(kOp));
    // Pairs GetReduceFn rejects never reach MPI (checked when queued).
    if (fn.ok()) (*fn)(inout, inout, in, static_cast<size_t>(*len));
    return;
  }
}

template <int... kOps>
void CreateOps(MpiProcess& p, std::integer_sequence<int, kOps...>) {
  (MPI_Op_create(&UserReduce<kOps>, /*commute=*/1, &p.ops[kOps]), ...);
}

void FinalizeAtExit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

absl::Status MpiError(int code, absl::string_view call) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) len = 0;
  return absl::InternalError(
      absl::StrCat(call, " failed: ", absl::string_view(text, len)));
}

absl::Status InitProcess(MpiProcess& p) {
  int initialized = 0, provided = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    if (rc != MPI_SUCCESS) return MpiError(rc, "MPI_Init_thread");
    std::atexit(FinalizeAtExit);
  } else {
    MPI_Query_thread(&provided);
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  if (provided < MPI_THREAD_MULTIPLE) {
    return absl::FailedPreconditionError(
        absl::StrCat("the MPI library provides thread level ", provided,
                     ", the mpi backend needs MPI_THREAD_MULTIPLE (",
                     MPI_THREAD_MULTIPLE, ")"));
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &p.world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &p.world_size);
  int* ub = nullptr;
  int has_ub = 0;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &has_ub);
  if (has_ub && ub != nullptr) p.tag_ub = *ub;
  for (int d = 0; d < kNumDTypes; ++d) {
    MPI_Type_contiguous(static_cast<int>(ItemSize(static_cast<DType>(d))),
                        MPI_BYTE, &p.types[d]);
    MPI_Type_commit(&p.types[d]);
  }
  CreateOps(p, std::make_integer_sequence<int, kNumReduceOps>());
  return absl::OkStatus();
}

MpiProcess& Process() {
  static MpiProcess* const p = [] {
    auto* p = new MpiProcess;
    p->init = InitProcess(*p);
    return p;
  }();
  return *p;
}

// MPI's own type for dtypes its built-in reductions handle as Ferry does
// (two's-complement wrap-around, IEEE floats); MPI_DATATYPE_NULL otherwise.
MPI_Datatype BuiltinType(DType d) {
  switch (d) {
    case DType::kFloat32:
      return MPI_FLOAT;
    case DType::kFloat64:
      return MPI_DOUBLE;
    case DType::kInt64:
      return MPI_INT64_T;
    case DType::kInt32:
      return MPI_INT32_T;
    case DType::kInt8:
      return MPI_INT8_T;
    case DType::kUInt8:
      return MPI_UINT8_T;
    default:
      return MPI_DATATYPE_NULL;
  }
}

// Reductions run as MPI's built-in type and operation where they apply
// (Open MPI's optimized loops and algorithms), else as Ferry's kernels: a
// user operation on a dtype-tagged type (float16, bfloat16, bool).
void KeepUntilExit(std::shared_ptr<void> what) {
  MpiProcess& p = Process();
  MutexLock lock(&p.kept_mu);
  p.kept.push_back(std::move(what));
}

MPI_Datatype TypeOf(DType d) {
  MPI_Datatype builtin = BuiltinType(d);
  return builtin != MPI_DATATYPE_NULL ? builtin
                                      : Process().types[static_cast<int>(d)];
}

MPI_Op OpOf(DType d, ReduceOp op) {
  if (BuiltinType(d) == MPI_DATATYPE_NULL) {
    return Process().ops[static_cast<int>(op)];
  }
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return MPI_SUM;
    case ReduceOp::kProduct:
      return MPI_PROD;
    case ReduceOp::kMin:
      return MPI_MIN;
    case ReduceOp::kMax:
      return MPI_MAX;
    case ReduceOp::kBand:
      return MPI_BAND;
    case ReduceOp::kBor:
      return MPI_BOR;
    case ReduceOp::kBxor:
      return MPI_BXOR;
  }
  return MPI_OP_NULL;
}

char* Bytes(const Tensor& t) { return static_cast<char*>(t.data_ptr()); }

// MPI counts are int.
absl::Status FitsInt(OpType op, const Tensor& t, absl::string_view what) {
  if (!t.defined() || t.nbytes() <= static_cast<size_t>(INT_MAX)) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat(OpTypeName(op), ": ", what, " has ", t.nbytes(),
                   " bytes, over MPI's count limit of ", INT_MAX));
}

MpiBackend::Signature TensorSignature(const Tensor& t) {
  MpiBackend::Signature s;
  if (t.defined()) {
    s.dtype = static_cast<int64_t>(t.dtype());
    s.count = t.numel();
  }
  return s;
}

}  // namespace

// --- Process-private types ---------------------------------------------------

struct MpiBackend::Comm {
  MPI_Comm comm = MPI_COMM_NULL;
  // Set when an operation was abandoned on it (MPI cannot cancel a
  // collective): freeing it then is erroneous.
  bool leak = false;
  ~Comm() {
    if (comm != MPI_COMM_NULL && !leak) MPI_Comm_free(&comm);
  }
};

struct MpiBackend::Posted {
  std::vector<MPI_Request> requests;
  // Runs once every request completed (copies out, AVG); may be empty.
  absl::AnyInvocable<absl::Status()> finish;
  // Buffers and count arrays MPI uses until the requests complete.
  std::vector<Tensor> keep;
  std::vector<std::vector<int>> ints;
};

struct MpiBackend::Op {
  enum class Stage { kQueued, kChecking, kMoving, kDone };
  OpType type;
  Signature sig;
  std::vector<int64_t> splits;  // AlltoallSingle: in rows, then out rows.
  absl::Status local;
  absl::Duration timeout;
  absl::Time deadline;
  std::shared_ptr<Work> work;
  PostFn post;
  Stage stage = Stage::kQueued;
  std::vector<int64_t> record;   // This rank's signature record.
  std::vector<int64_t> records;  // Every rank's, after the check round.
  MPI_Request check = MPI_REQUEST_NULL;
  Posted posted;
  std::vector<MPI_Status> statuses;
  bool cancelled = false;  // A timed-out receive whose cancel is pending.
};

namespace {

// Tests every request of `posted`; OK with *done once all completed.
absl::Status TestAll(MpiBackend::Posted& posted,
                     std::vector<MPI_Status>& statuses, bool* done) {
  *done = false;
  if (posted.requests.empty()) {
    *done = true;
    return absl::OkStatus();
  }
  statuses.resize(posted.requests.size());
  int flag = 0;
  int rc = MPI_Testall(static_cast<int>(posted.requests.size()),
                       posted.requests.data(), &flag, statuses.data());
  if (rc == MPI_ERR_IN_STATUS) {
    *done = true;
    for (const MPI_Status& s : statuses) {
      if (s.MPI_ERROR != MPI_SUCCESS && s.MPI_ERROR != MPI_ERR_PENDING) {
        return MpiError(s.MPI_ERROR, "MPI request");
      }
    }
  }
  if (rc != MPI_SUCCESS) {
    *done = true;
    return MpiError(rc, "MPI_Testall");
  }
  *done = flag != 0;
  return absl::OkStatus();
}

// Wraps an MPI call's return code.
absl::Status Check(int rc, absl::string_view call) {
  return rc == MPI_SUCCESS ? absl::OkStatus() : MpiError(rc, call);
}

}  // namespace

// --- Creation ----------------------------------------------------------------

absl::StatusOr<MpiBackendOptions> MpiBackendOptions::FromMap(
    const std::map<std::string, std::string>& options) {
  MpiBackendOptions o;
  if (auto it = options.find("mpi_check_args"); it != options.end()) {
    if (!absl::SimpleAtob(it->second, &o.check_args)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "option mpi_check_args: '", it->second, "' is not a boolean"));
    }
  }
  return o;
}

absl::StatusOr<std::pair<int, int>> MpiBackend::WorldRankAndSize() {
  const MpiProcess& p = Process();
  RETURN_IF_ERROR(p.init);
  return std::make_pair(p.world_rank, p.world_size);
}

namespace {

// Publishes this rank's MPI world rank and waits (bounded) for the others';
// returns them in c10d rank order and the tag rank 0 chose.
absl::StatusOr<std::pair<std::vector<int>, int>> MeetThroughStore(
    Store& store, int rank, int size, int world_rank, int world_size,
    int tag_ub, absl::Duration timeout) {
  RETURN_IF_ERROR(
      store.Set(absl::StrCat("world_rank/", rank), absl::StrCat(world_rank)));
  if (rank == 0) {
    std::random_device rd;
    RETURN_IF_ERROR(store.Set(
        "tag", absl::StrCat(rd() % static_cast<unsigned>(tag_ub + 1))));
  }
  std::vector<std::string> keys = {"tag"};
  for (int r = 0; r < size; ++r) keys.push_back(absl::StrCat("world_rank/", r));
  absl::Status arrived = store.Wait(keys, timeout);
  if (!arrived.ok()) {
    return absl::Status(
        arrived.code(),
        absl::StrCat("not every rank arrived within ",
                     absl::FormatDuration(timeout), ": ", arrived.message()));
  }
  ASSIGN_OR_RETURN(std::vector<std::string> values, store.MultiGet(keys));
  int tag = 0;
  std::vector<int> world(size);
  bool ok = absl::SimpleAtoi(values[0], &tag);
  for (int r = 0; r < size; ++r) {
    ok = ok && absl::SimpleAtoi(values[r + 1], &world[r]) && world[r] >= 0 &&
         world[r] < world_size;
  }
  std::vector<int> sorted = world;
  std::sort(sorted.begin(), sorted.end());
  if (!ok || std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("ranks map to MPI world ranks [",
                     absl::StrJoin(world, ", "), "] (world size ", world_size,
                     "): each c10d rank must be a distinct MPI process"));
  }
  return std::make_pair(std::move(world), tag);
}

}  // namespace

absl::StatusOr<std::unique_ptr<MpiBackend>> MpiBackend::Create(
    std::shared_ptr<Store> store, int rank, int size, absl::Duration timeout,
    MpiBackendOptions options) {
  const std::string who =
      absl::StrCat("mpi backend (rank ", rank, " of ", size, ")");
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": rank must be in [0, size)"));
  }
  const MpiProcess& p = Process();
  RETURN_IF_ERROR(Annotate(p.init, who));
  if (size > p.world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, ": the group is larger than the MPI world (", p.world_size,
        " processes); start the ranks with mpirun -np ", size));
  }
  auto met = MeetThroughStore(*store, rank, size, p.world_rank, p.world_size,
                              p.tag_ub, timeout);
  RETURN_IF_ERROR(Annotate(met.status(), who));
  const auto& [world, tag] = *met;
  MPI_Group world_group, group;
  MPI_Comm_group(MPI_COMM_WORLD, &world_group);
  MPI_Group_incl(world_group, size, world.data(), &group);
  auto comm = std::make_unique<Comm>();
  // Every member arrived at the store, so this completes promptly.
  int rc = MPI_Comm_create_group(MPI_COMM_WORLD, group, tag, &comm->comm);
  MPI_Group_free(&group);
  MPI_Group_free(&world_group);
  RETURN_IF_ERROR(Annotate(Check(rc, "MPI_Comm_create_group"), who));
  MPI_Comm_set_errhandler(comm->comm, MPI_ERRORS_RETURN);
  return std::unique_ptr<MpiBackend>(
      new MpiBackend(rank, size, timeout, options, std::move(comm)));
}

BackendFactory MpiBackend::Factory() {
  return
      [](const BackendConfig& c) -> absl::StatusOr<std::unique_ptr<Backend>> {
        ASSIGN_OR_RETURN(MpiBackendOptions o,
                         MpiBackendOptions::FromMap(c.options));
        ASSIGN_OR_RETURN(std::unique_ptr<MpiBackend> b,
                         Create(c.store, c.rank, c.size, c.timeout, o));
        return std::unique_ptr<Backend>(std::move(b));
      };
}

MpiBackend::MpiBackend(int rank, int size, absl::Duration timeout,
                       MpiBackendOptions options, std::unique_ptr<Comm> comm)
    : Backend("mpi", rank, size, timeout),
      options_(options),
      comm_(std::move(comm)) {
  progress_ = std::thread([this] { Run(); });
}

MpiBackend::~MpiBackend() {
  std::deque<std::shared_ptr<Op>> cancelled;
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    cancelled.swap(collectives_);
    wake_.SignalAll();
  }
  for (auto& op : cancelled) {
    op->work->Complete(absl::CancelledError(absl::StrCat(
        op->work->description(), ": the backend was destroyed before it ran")));
  }
  progress_.join();
}

ArgChecks MpiBackend::Checks() const {
  return ArgChecks("mpi", DeviceType::kCPU, rank(), size());
}

// --- Queue and progress ------------------------------------------------------

std::shared_ptr<Work> MpiBackend::EnqueueCollective(
    OpType type, Signature sig, absl::Status local,
    const std::optional<absl::Duration>& timeout, PostFn post,
    std::vector<int64_t> splits) {
  auto op = std::make_shared<Op>();
  sig.op = static_cast<int64_t>(type);
  sig.valid = local.ok() ? 1 : 0;
  op->type = type;
  op->splits = std::move(splits);
  op->local = CopyStatus(local);
  op->timeout = TimeoutOr(timeout);
  op->post = std::move(post);
  MutexLock lock(&mu_);
  sig.seq = next_seq_++;
  op->sig = sig;
  op->work =
      std::make_shared<Work>(absl::StrCat(Describe(type), " #", sig.seq));
  if (stopping_) {
    op->work->Complete(absl::CancelledError(absl::StrCat(
        op->work->description(), ": the backend is shutting down")));
    return op->work;
  }
  collectives_.push_back(op);
  wake_.SignalAll();
  return op->work;
}

std::shared_ptr<Work> MpiBackend::EnqueueP2P(
    OpType type, absl::Status local,
    const std::optional<absl::Duration>& timeout, PostFn post) {
  if (!local.ok()) return Fail(type, local);
  auto op = std::make_shared<Op>();
  op->type = type;
  op->timeout = TimeoutOr(timeout);
  op->post = std::move(post);
  op->work = std::make_shared<Work>(Describe(type));
  MutexLock lock(&mu_);
  if (stopping_) {
    op->work->Complete(absl::CancelledError(absl::StrCat(
        op->work->description(), ": the backend is shutting down")));
    return op->work;
  }
  new_p2p_.push_back(op);
  wake_.SignalAll();
  return op->work;
}

void MpiBackend::Run() {
  // Open MPI moves data only inside MPI calls, so the thread polls while
  // anything is in flight: without pause for the first second after an
  // operation was posted or completed (transfers advance one fragment per
  // poll), then every 50 us (a receive waiting long for its peer).
  constexpr absl::Duration kBusyPoll = absl::Seconds(1);
  absl::Time last_progress = absl::Now();
  while (true) {
    std::deque<std::shared_ptr<Op>> fresh;
    {
      MutexLock lock(&mu_);
      fresh.swap(new_p2p_);
      if (running_ == nullptr && !collectives_.empty()) {
        running_ = collectives_.front();
        collectives_.pop_front();
      }
      if (stopping_ && running_ == nullptr) break;
      if (fresh.empty() && running_ == nullptr && p2p_.empty()) {
        wake_.Wait(&mu_);
        continue;
      }
    }
    for (auto& op : fresh) {
      op->deadline = absl::Now() + op->timeout;
      absl::StatusOr<Posted> posted = op->post(*comm_);
      if (!posted.ok()) {
        op->work->Complete(Annotate(posted.status(), op->work->description()));
        continue;
      }
      op->posted = *std::move(posted);
      p2p_.push_back(std::move(op));
    }
    bool moved = StepCollective();
    moved = StepP2P() || moved || !fresh.empty();
    if (moved) {
      last_progress = absl::Now();
    } else if (absl::Now() - last_progress > kBusyPoll) {
      absl::SleepFor(absl::Microseconds(50));
    }
  }
  // Point-to-point requests still pending at shutdown are cancelled and
  // released; MPI may still touch their buffers, so those stay alive.
  for (auto& op : p2p_) {
    op->work->Complete(absl::CancelledError(absl::StrCat(
        op->work->description(), ": the backend was destroyed before it ran")));
    for (MPI_Request& r : op->posted.requests) {
      if (r == MPI_REQUEST_NULL) continue;
      MPI_Cancel(&r);
      MPI_Request_free(&r);
    }
    KeepUntilExit(
        std::make_shared<std::vector<Tensor>>(std::move(op->posted.keep)));
    comm_->leak = true;
  }
}

bool MpiBackend::StepP2P() {
  bool moved = false;
  const absl::Time now = absl::Now();
  for (auto it = p2p_.begin(); it != p2p_.end();) {
    Op& op = **it;
    bool done = false;
    absl::Status s = TestAll(op.posted, op.statuses, &done);
    if (done) {
      if (s.ok() && op.type == OpType::kRecvAnysource && !op.cancelled) {
        op.work->set_source_rank(op.statuses[0].MPI_SOURCE);
      }
      if (s.ok() && op.posted.finish) s = op.posted.finish();
      op.work->Complete(Annotate(s, op.work->description()));
      it = p2p_.erase(it);
      moved = true;
      continue;
    }
    if (!op.cancelled && now > op.deadline) {
      for (MPI_Request& r : op.posted.requests) {
        if (r != MPI_REQUEST_NULL) MPI_Cancel(&r);
      }
      op.cancelled = true;
      op.work->Complete(absl::DeadlineExceededError(
          absl::StrCat(op.work->description(), ": no matching peer within ",
                       absl::FormatDuration(op.timeout))));
      moved = true;
    }
    ++it;
  }
  return moved;
}

bool MpiBackend::StepCollective() {
  if (running_ == nullptr) return false;
  Op& op = *running_;
  const Op::Stage stage_before = op.stage;
  absl::Status status;
  bool finished = false;
  switch (op.stage) {
    case Op::Stage::kQueued: {
      op.deadline = absl::Now() + op.timeout;
      if (!broken_.ok()) {
        status = absl::FailedPreconditionError(absl::StrCat(
            "the mpi backend is unusable after an earlier failure (",
            broken_.message(), "); create a new process group"));
        finished = true;
        break;
      }
      if (options_.check_args && size() > 1) {
        const Signature& s = op.sig;
        op.record = {s.op,        s.dtype, s.count, s.root,
                     s.reduce_op, s.seq,   s.valid, 0};
        op.record.resize(8 + 2 * static_cast<size_t>(size()), 0);
        std::copy(op.splits.begin(), op.splits.end(), op.record.begin() + 8);
        op.records.resize(op.record.size() * size());
        const int bytes = static_cast<int>(op.record.size() * sizeof(int64_t));
        status = Check(
            MPI_Iallgather(op.record.data(), bytes, MPI_BYTE, op.records.data(),
                           bytes, MPI_BYTE, comm_->comm, &op.check),
            "MPI_Iallgather (argument check)");
        op.stage = Op::Stage::kChecking;
        finished = !status.ok();
        break;
      }
      [[fallthrough]];
    }
    case Op::Stage::kChecking: {
      if (op.stage == Op::Stage::kChecking) {
        int flag = 0;
        MPI_Status st;
        status = Check(MPI_Test(&op.check, &flag, &st), "MPI_Test");
        if (status.ok() && !flag) break;
        if (status.ok()) status = CheckSignatures(op);
      } else {
        status = op.local;
      }
      if (!status.ok()) {
        finished = true;
        break;
      }
      absl::StatusOr<Posted> posted = op.post(*comm_);
      status = posted.status();
      if (!status.ok()) {
        finished = true;
        break;
      }
      op.posted = *std::move(posted);
      op.stage = Op::Stage::kMoving;
      break;
    }
    case Op::Stage::kMoving: {
      bool done = false;
      status = TestAll(op.posted, op.statuses, &done);
      if (done && status.ok() && op.posted.finish) status = op.posted.finish();
      finished = done || !status.ok();
      break;
    }
    case Op::Stage::kDone:
      break;
  }
  if (!finished && absl::Now() > op.deadline) {
    status = absl::DeadlineExceededError(absl::StrCat(
        "not every rank took part within ", absl::FormatDuration(op.timeout)));
    finished = true;
    // MPI cannot cancel a collective: keep its buffers for MPI and never
    // free the communicator.
    KeepUntilExit(running_);
    comm_->leak = true;
  }
  if (!finished) return op.stage != stage_before;
  status = Annotate(status, op.work->description());
  if (!status.ok() && !absl::IsInvalidArgument(status) && broken_.ok()) {
    broken_ = CopyStatus(status);
  }
  op.work->Complete(std::move(status));
  running_.reset();
  return true;
}

absl::Status MpiBackend::CheckSignatures(const Op& op) const {
  const size_t width = op.record.size();
  auto at = [&](int r, int field) { return op.records[r * width + field]; };
  std::vector<int> invalid;
  for (int r = 0; r < size(); ++r) {
    if (at(r, 6) == 0) invalid.push_back(r);
  }
  if (!op.local.ok()) return op.local;
  if (!invalid.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank(s) ", absl::StrJoin(invalid, ", "),
                     " called it with invalid arguments (see their errors)"));
  }
  static constexpr const char* kFields[] = {
      "operation", "dtype", "element count", "root", "ReduceOp", "sequence"};
  for (int f = 0; f < 6; ++f) {
    for (int r = 1; r < size(); ++r) {
      if (at(r, f) == at(0, f)) continue;
      auto name = [&](int64_t v) -> std::string {
        if (f == 0) return std::string(OpTypeName(static_cast<OpType>(v)));
        if (f == 1 && v >= 0)
          return std::string(DTypeName(static_cast<DType>(v)));
        return absl::StrCat(v);
      };
      return absl::InvalidArgumentError(
          absl::StrCat("ranks' calls differ in ", kFields[f], ": rank 0 has ",
                       name(at(0, f)), ", rank ", r, " has ", name(at(r, f))));
    }
  }
  if (op.type != OpType::kAlltoallSingle) return absl::OkStatus();
  const int n = size();
  for (int src = 0; src < n; ++src) {
    for (int dst = 0; dst < n; ++dst) {
      int64_t sent = at(src, 8 + dst), expected = at(dst, 8 + n + src);
      if (sent != expected) {
        return absl::InvalidArgumentError(absl::StrCat(
            "rank ", src, " sends ", sent, " rows to rank ", dst,
            ", which expects ", expected, " from it (split sizes differ)"));
      }
    }
  }
  return absl::OkStatus();
}

// --- Collectives -------------------------------------------------------------

namespace {

MpiBackend::Posted OneRequest(MPI_Request r, std::vector<Tensor> keep) {
  MpiBackend::Posted p;
  p.requests.push_back(r);
  p.keep = std::move(keep);
  return p;
}

// `tensor` divided by the group size when `op` is AVG.
absl::AnyInvocable<absl::Status()> AverageIf(ReduceOp op, Tensor tensor,
                                             int size) {
  if (op != ReduceOp::kAvg) return nullptr;
  return [tensor, size]() mutable {
    FinishAverage(tensor, size);
    return absl::OkStatus();
  };
}

// Copies chunk r of `flat` into outs[r] (or the reverse with `to_flat`).
void CopyChunks(const Tensor& flat, const std::vector<Tensor>& outs,
                bool to_flat) {
  size_t at = 0;
  for (const Tensor& t : outs) {
    if (to_flat) {
      std::memcpy(Bytes(flat) + at, t.data_ptr(), t.nbytes());
    } else {
      std::memcpy(t.data_ptr(), Bytes(flat) + at, t.nbytes());
    }
    at += t.nbytes();
  }
}

Tensor Flat(const std::vector<Tensor>& list) {
  int64_t numel = 0;
  for (const Tensor& t : list) numel += t.numel();
  return empty({numel}, list.empty() ? DType::kUInt8 : list[0].dtype());
}

}  // namespace

std::shared_ptr<Work> MpiBackend::Allreduce(Tensor tensor,
                                            const AllreduceOptions& options) {
  constexpr OpType kOp = OpType::kAllreduce;
  absl::Status local = Checks().One(kOp, tensor, "tensor");
  if (local.ok()) local = CheckReduceOp(kOp, options.op, tensor.dtype());
  if (local.ok()) local = FitsInt(kOp, tensor, "tensor");
  Signature sig = TensorSignature(tensor);
  sig.reduce_op = static_cast<int64_t>(options.op);
  const int n = size();
  return EnqueueCollective(
      kOp, sig, local, options.timeout,
      [tensor, op = options.op, n](Comm& c) -> absl::StatusOr<Posted> {
        MPI_Request r;
        RETURN_IF_ERROR(
            Check(MPI_Iallreduce(MPI_IN_PLACE, tensor.data_ptr(),
                                 static_cast<int>(tensor.numel()),
                                 TypeOf(tensor.dtype()),
                                 OpOf(tensor.dtype(), op), c.comm, &r),
                  "MPI_Iallreduce"));
        Posted p = OneRequest(r, {tensor});
        p.finish = AverageIf(op, tensor, n);
        return p;
      });
}

std::shared_ptr<Work> MpiBackend::Broadcast(Tensor tensor,
                                            const BroadcastOptions& options) {
  constexpr OpType kOp = OpType::kBroadcast;
  absl::Status local = Checks().Rooted(kOp, tensor, "tensor", options.root);
  if (local.ok()) local = FitsInt(kOp, tensor, "tensor");
  Signature sig = TensorSignature(tensor);
  sig.root = options.root;
  return EnqueueCollective(
      kOp, sig, local, options.timeout,
      [tensor, root = options.root](Comm& c) -> absl::StatusOr<Posted> {
        MPI_Request r;
        RETURN_IF_ERROR(Check(
            MPI_Ibcast(tensor.data_ptr(), static_cast<int>(tensor.nbytes()),
                       MPI_BYTE, root, c.comm, &r),
            "MPI_Ibcast"));
        return OneRequest(r, {tensor});
      });
}

std::shared_ptr<Work> MpiBackend::Reduce(Tensor tensor,
                                         const ReduceOptions& options) {
  constexpr OpType kOp = OpType::kReduce;
  absl::Status local = Checks().Rooted(kOp, tensor, "tensor", options.root);
  if (local.ok()) local = CheckReduceOp(kOp, options.op, tensor.dtype());
  if (local.ok()) local = FitsInt(kOp, tensor, "tensor");
  Signature sig = TensorSignature(tensor);
  sig.root = options.root;
  sig.reduce_op = static_cast<int64_t>(options.op);
  const bool is_root = options.root == rank();
  const int n = size();
  return EnqueueCollective(
      kOp, sig, local, options.timeout,
      [tensor, o = options, is_root, n](Comm& c) -> absl::StatusOr<Posted> {
        MPI_Request r;
        void* send = is_root ? MPI_IN_PLACE : tensor.data_ptr();
        void* recv = is_root ? tensor.data_ptr() : nullptr;
        RETURN_IF_ERROR(
            Check(MPI_Ireduce(send, recv, static_cast<int>(tensor.numel()),
                              TypeOf(tensor.dtype()),
                              OpOf(tensor.dtype(), o.op), o.root, c.comm, &r),
                  "MPI_Ireduce"));
        Posted p = OneRequest(r, {tensor});
        if (is_root) p.finish = AverageIf(o.op, tensor, n);
        return p;
      });
}

std::shared_ptr<Work> MpiBackend::Allgather(std::vector<Tensor> outputs,
                                            Tensor input,
                                            const AllgatherOptions& options) {
  constexpr OpType kOp = OpType::kAllgather;
  absl::Status local =
      Checks().WithList(kOp, input, "input", outputs, "outputs");
  return EnqueueAllgather(kOp, std::move(outputs), Tensor(), std::move(input),
                          local, options);
}

std::shared_ptr<Work> MpiBackend::AllgatherIntoTensor(
    Tensor output, Tensor input, const AllgatherOptions& options) {
  constexpr OpType kOp = OpType::kAllgatherIntoTensor;
  absl::Status local = Checks().Flat(kOp, output, "output", input, "input");
  return EnqueueAllgather(kOp, {}, std::move(output), std::move(input), local,
                          options);
}

std::shared_ptr<Work> MpiBackend::EnqueueAllgather(
    OpType type, std::vector<Tensor> outs, Tensor flat_out, Tensor input,
    absl::Status local, const AllgatherOptions& options) {
  if (local.ok()) local = FitsInt(type, input, "input");
  return EnqueueCollective(
      type, TensorSignature(input), local, options.timeout,
      [outs = std::move(outs), flat_out,
       input](Comm& c) -> absl::StatusOr<Posted> {
        Tensor dst = flat_out.defined() ? flat_out : Flat(outs);
        const int bytes = static_cast<int>(input.nbytes());
        MPI_Request r;
        RETURN_IF_ERROR(
            Check(MPI_Iallgather(input.data_ptr(), bytes, MPI_BYTE,
                                 dst.data_ptr(), bytes, MPI_BYTE, c.comm, &r),
                  "MPI_Iallgather"));
        Posted p = OneRequest(r, {input, dst});
        if (!flat_out.defined()) {
          p.finish = [dst, outs] {
            CopyChunks(dst, outs, /*to_flat=*/false);
            return absl::OkStatus();
          };
        }
        return p;
      });
}

std::shared_ptr<Work> MpiBackend::Gather(std::vector<Tensor> outputs,
                                         Tensor input,
                                         const GatherOptions& options) {
  constexpr OpType kOp = OpType::kGather;
  absl::Status local = Checks().RootedWithList(
      kOp, input, "input", options.root, outputs, "outputs");
  if (local.ok()) local = FitsInt(kOp, input, "input");
  Signature sig = TensorSignature(input);
  sig.root = options.root;
  const bool is_root = options.root == rank();
  return EnqueueCollective(
      kOp, sig, local, options.timeout,
      [outputs = std::move(outputs), input, root = options.root,
       is_root](Comm& c) -> absl::StatusOr<Posted> {
        Tensor dst = is_root ? Flat(outputs) : Tensor();
        const int bytes = static_cast<int>(input.nbytes());
        MPI_Request r;
        RETURN_IF_ERROR(Check(MPI_Igather(input.data_ptr(), bytes, MPI_BYTE,
                                          is_root ? dst.data_ptr() : nullptr,
                                          bytes, MPI_BYTE, root, c.comm, &r),
                              "MPI_Igather"));
        Posted p = OneRequest(r, {input});
        if (is_root) {
          p.keep.push_back(dst);
          p.finish = [dst, outputs] {
            CopyChunks(dst, outputs, /*to_flat=*/false);
            return absl::OkStatus();
          };
        }
        return p;
      });
}

std::shared_ptr<Work> MpiBackend::Scatter(Tensor output,
                                          std::vector<Tensor> inputs,
                                          const ScatterOptions& options) {
  constexpr OpType kOp = OpType::kScatter;
  absl::Status local = Checks().RootedWithList(kOp, output, "output",
                                               options.root, inputs, "inputs");
  if (local.ok()) local = FitsInt(kOp, output, "output");
  Signature sig = TensorSignature(output);
  sig.root = options.root;
  const bool is_root = options.root == rank();
  return EnqueueCollective(
      kOp, sig, local, options.timeout,
      [output, inputs = std::move(inputs), root = options.root,
       is_root](Comm& c) -> absl::StatusOr<Posted> {
        Tensor src;
        if (is_root) {
          src = Flat(inputs);
          CopyChunks(src, inputs, /*to_flat=*/true);
        }
        const int bytes = static_cast<int>(output.nbytes());
        MPI_Request r;
        RETURN_IF_ERROR(Check(
            MPI_Iscatter(is_root ? src.data_ptr() : nullptr, bytes, MPI_BYTE,
                         output.data_ptr(), bytes, MPI_BYTE, root, c.comm, &r),
            "MPI_Iscatter"));
        return OneRequest(r, {output, src});
      });
}

std::shared_ptr<Work> MpiBackend::ReduceScatter(
    Tensor output, std::vector<Tensor> inputs,
    const ReduceScatterOptions& options) {
  constexpr OpType kOp = OpType::kReduceScatter;
  absl::Status local =
      Checks().WithList(kOp, output, "output", inputs, "inputs");
  return EnqueueReduceScatter(kOp, std::move(output), std::move(inputs),
                              Tensor(), local, options);
}

std::shared_ptr<Work> MpiBackend::ReduceScatterTensor(
    Tensor output, Tensor input, const ReduceScatterOptions& options) {
  constexpr OpType kOp = OpType::kReduceScatterTensor;
  absl::Status local = Checks().Flat(kOp, input, "input", output, "output");
  return EnqueueReduceScatter(kOp, std::move(output), {}, std::move(input),
                              local, options);
}

std::shared_ptr<Work> MpiBackend::EnqueueReduceScatter(
    OpType type, Tensor output, std::vector<Tensor> inputs, Tensor flat_in,
    absl::Status local, const ReduceScatterOptions& o) {
  if (local.ok()) local = CheckReduceOp(type, o.op, output.dtype());
  if (local.ok()) local = FitsInt(type, output, "output");
  Signature sig = TensorSignature(output);
  sig.reduce_op = static_cast<int64_t>(o.op);
  const int n = size();
  return EnqueueCollective(
      type, sig, local, o.timeout,
      [output, inputs = std::move(inputs), flat_in, op = o.op,
       n](Comm& c) -> absl::StatusOr<Posted> {
        Tensor src = flat_in;
        if (!src.defined()) {
          src = Flat(inputs);
          CopyChunks(src, inputs, /*to_flat=*/true);
        }
        MPI_Request r;
        RETURN_IF_ERROR(Check(
            MPI_Ireduce_scatter_block(src.data_ptr(), output.data_ptr(),
                                      static_cast<int>(output.numel()),
                                      TypeOf(output.dtype()),
                                      OpOf(output.dtype(), op), c.comm, &r),
            "MPI_Ireduce_scatter_block"));
        Posted p = OneRequest(r, {output, src});
        p.finish = AverageIf(op, output, n);
        return p;
      });
}

std::shared_ptr<Work> MpiBackend::Alltoall(std::vector<Tensor> outputs,
                                           std::vector<Tensor> inputs,
                                           const AlltoallOptions& options) {
  constexpr OpType kOp = OpType::kAlltoall;
  absl::Status local = Checks().Alltoall(outputs, inputs);
  if (local.ok()) local = FitsInt(kOp, inputs[0], "inputs");
  Signature sig = local.ok() ? TensorSignature(inputs[0]) : Signature{};
  return EnqueueCollective(
      kOp, sig, local, options.timeout,
      [outputs = std::move(outputs),
       inputs = std::move(inputs)](Comm& c) -> absl::StatusOr<Posted> {
        Tensor src = Flat(inputs), dst = Flat(outputs);
        CopyChunks(src, inputs, /*to_flat=*/true);
        const int bytes = static_cast<int>(inputs[0].nbytes());
        MPI_Request r;
        RETURN_IF_ERROR(
            Check(MPI_Ialltoall(src.data_ptr(), bytes, MPI_BYTE, dst.data_ptr(),
                                bytes, MPI_BYTE, c.comm, &r),
                  "MPI_Ialltoall"));
        Posted p = OneRequest(r, {src, dst});
        p.finish = [dst, outputs] {
          CopyChunks(dst, outputs, /*to_flat=*/false);
          return absl::OkStatus();
        };
        return p;
      });
}

std::shared_ptr<Work> MpiBackend::AlltoallSingle(
    Tensor output, Tensor input, const AlltoallSingleOptions& options) {
  constexpr OpType kOp = OpType::kAlltoallSingle;
  std::vector<int64_t> out_rows, in_rows;
  absl::Status local =
      Checks().AlltoallSingle(output, input, options, &out_rows, &in_rows);
  if (local.ok()) local = FitsInt(kOp, input, "input");
  if (local.ok()) local = FitsInt(kOp, output, "output");
  Signature sig;
  size_t row_bytes = 0;
  if (local.ok()) {
    sig.dtype = static_cast<int64_t>(input.dtype());
    const Tensor& shaped = input.sizes()[0] > 0 ? input : output;
    sig.count = shaped.sizes()[0] == 0 ? 0 : shaped.numel() / shaped.sizes()[0];
    row_bytes = static_cast<size_t>(sig.count) * input.itemsize();
  }
  std::vector<int64_t> splits = in_rows;
  splits.insert(splits.end(), out_rows.begin(), out_rows.end());
  return EnqueueCollective(
      kOp, sig, local, options.timeout,
      [output, input, out_rows, in_rows,
       row_bytes](Comm& c) -> absl::StatusOr<Posted> {
        Posted p;
        // counts and displacements in bytes: send, send, recv, recv.
        p.ints.resize(4);
        int at_in = 0, at_out = 0;
        for (size_t d = 0; d < in_rows.size(); ++d) {
          p.ints[0].push_back(static_cast<int>(in_rows[d] * row_bytes));
          p.ints[1].push_back(at_in);
          at_in += p.ints[0].back();
          p.ints[2].push_back(static_cast<int>(out_rows[d] * row_bytes));
          p.ints[3].push_back(at_out);
          at_out += p.ints[2].back();
        }
        MPI_Request r;
        RETURN_IF_ERROR(Check(
            MPI_Ialltoallv(input.data_ptr(), p.ints[0].data(), p.ints[1].data(),
                           MPI_BYTE, output.data_ptr(), p.ints[2].data(),
                           p.ints[3].data(), MPI_BYTE, c.comm, &r),
            "MPI_Ialltoallv"));
        p.requests.push_back(r);
        p.keep = {input, output};
        return p;
      },
      std::move(splits));
}

std::shared_ptr<Work> MpiBackend::Barrier(const BarrierOptions& options) {
  return EnqueueCollective(
      OpType::kBarrier, Signature{}, absl::OkStatus(), options.timeout,
      [](Comm& c) -> absl::StatusOr<Posted> {
        MPI_Request r;
        RETURN_IF_ERROR(Check(MPI_Ibarrier(c.comm, &r), "MPI_Ibarrier"));
        return OneRequest(r, {});
      });
}

// --- Point to point
// ------------------------------------------------------------

namespace {

absl::Status CheckTag(OpType op, int tag) {
  if (tag <= Process().tag_ub) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(OpTypeName(op), ": tag ", tag,
                                                 " is above MPI_TAG_UB (",
                                                 Process().tag_ub, ")"));
}

}  // namespace

std::shared_ptr<Work> MpiBackend::Send(Tensor tensor, int dst_rank,
                                       const SendOptions& options) {
  constexpr OpType kOp = OpType::kSend;
  absl::Status local =
      Checks().PointToPoint(kOp, tensor, dst_rank, options.tag);
  if (local.ok()) local = CheckTag(kOp, options.tag);
  if (local.ok()) local = FitsInt(kOp, tensor, "tensor");
  return EnqueueP2P(
      kOp, local, options.timeout,
      [tensor, dst_rank, tag = options.tag](Comm& c) -> absl::StatusOr<Posted> {
        MPI_Request r;
        RETURN_IF_ERROR(Check(
            MPI_Isend(tensor.data_ptr(), static_cast<int>(tensor.nbytes()),
                      MPI_BYTE, dst_rank, tag, c.comm, &r),
            "MPI_Isend"));
        return OneRequest(r, {tensor});
      });
}

std::shared_ptr<Work> MpiBackend::Recv(Tensor tensor, int src_rank,
                                       const RecvOptions& options) {
  constexpr OpType kOp = OpType::kRecv;
  absl::Status local =
      Checks().PointToPoint(kOp, tensor, src_rank, options.tag);
  if (local.ok()) local = CheckTag(kOp, options.tag);
  if (local.ok()) local = FitsInt(kOp, tensor, "tensor");
  return EnqueueP2P(
      kOp, local, options.timeout,
      [tensor, src_rank, tag = options.tag](Comm& c) -> absl::StatusOr<Posted> {
        MPI_Request r;
        RETURN_IF_ERROR(Check(
            MPI_Irecv(tensor.data_ptr(), static_cast<int>(tensor.nbytes()),
                      MPI_BYTE, src_rank, tag, c.comm, &r),
            "MPI_Irecv"));
        return OneRequest(r, {tensor});
      });
}

std::shared_ptr<Work> MpiBackend::RecvAnysource(Tensor tensor,
                                                const RecvOptions& options) {
  constexpr OpType kOp = OpType::kRecvAnysource;
  // Any peer: validate against a rank other than ours.
  absl::Status local =
      Checks().PointToPoint(kOp, tensor, rank() == 0 ? 1 : 0, options.tag);
  if (size() < 2) {
    local = absl::InvalidArgumentError(
        absl::StrCat(OpTypeName(kOp), ": a group of 1 has no other rank"));
  }
  if (local.ok()) local = CheckTag(kOp, options.tag);
  if (local.ok()) local = FitsInt(kOp, tensor, "tensor");
  return EnqueueP2P(
      kOp, local, options.timeout,
      [tensor, tag = options.tag](Comm& c) -> absl::StatusOr<Posted> {
        MPI_Request r;
        RETURN_IF_ERROR(Check(
            MPI_Irecv(tensor.data_ptr(), static_cast<int>(tensor.nbytes()),
                      MPI_BYTE, MPI_ANY_SOURCE, tag, c.comm, &r),
            "MPI_Irecv"));
        return OneRequest(r, {tensor});
      });
}

}  // namespace c10d
}  // namespace ferry
