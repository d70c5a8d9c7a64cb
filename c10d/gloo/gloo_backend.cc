#include "ferry/c10d/gloo/gloo_backend.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ferry/c10d/gloo/ring.h"
#include "ferry/c10d/gloo/store_adapter.h"
#include "ferry/c10d/reduce.h"
#include "ferry/common/env.h"
#include "ferry/common/host_address.h"
#include "ferry/common/logging.h"
#include "ferry/common/status.h"
#include "gloo/allgather.h"
#include "gloo/allreduce.h"
#include "gloo/barrier.h"
#include "gloo/broadcast.h"
#include "gloo/common/error.h"
#include "gloo/gather.h"
#include "gloo/reduce.h"
#include "gloo/rendezvous/context.h"
#include "gloo/scatter.h"
#include "gloo/transport/tcp/device.h"
#include "gloo/transport/unbound_buffer.h"

namespace ferry {
namespace c10d {
namespace {

constexpr int64_t kHeaderMagic = 0x4665727279433130;  // "FerryC10"
constexpr int64_t kP2PMagic = 0x4665727279503250;     // "FerryP2P"
// Slot prefixes for point-to-point transfers, above Gloo's collective
// prefixes (0x01..0x08) so they never collide.
constexpr uint64_t kP2PHeaderPrefix = 0x41;
constexpr uint64_t kP2PPayloadPrefix = 0x42;
// Slot prefix of the per-call header exchange.
constexpr uint64_t kExchangePrefix = 0x43;
// Slot prefix of the ring reduce-scatter's steps.
constexpr uint64_t kRingPrefix = 0x44;
// Slot prefix of Ferry-owned algorithms with early receives (ring.h).
constexpr uint64_t kEarlyPrefix = 0x45;
// Header::early flag: the early receives were posted for every peer (each
// sends that many empty messages on refusal), not only the left one.
constexpr int64_t kEarlyFromAll = int64_t{1} << 32;
// Largest mismatched payload a Recv drains (see WaitP2P).
constexpr int64_t kMaxDrainBytes = int64_t{1} << 30;

std::chrono::milliseconds ToMillis(absl::Duration d) {
  int64_t ms = absl::ToInt64Milliseconds(d);
  if (ms <= 0) ms = 1;  // Gloo treats 0 as "no timeout".
  return std::chrono::milliseconds(ms);
}

// Gloo's buffers are typed only by element size; the reduction function
// knows the real type.
template <typename Opts>
void SetOutputBySize(Opts& o, void* ptr, size_t numel, size_t itemsize) {
  switch (itemsize) {
    case 1:
      o.template setOutput<uint8_t>(static_cast<uint8_t*>(ptr), numel);
      break;
    case 2:
      o.template setOutput<uint16_t>(static_cast<uint16_t*>(ptr), numel);
      break;
    case 4:
      o.template setOutput<uint32_t>(static_cast<uint32_t*>(ptr), numel);
      break;
    default:
      o.template setOutput<uint64_t>(static_cast<uint64_t*>(ptr), numel);
      break;
  }
}
template <typename Opts>
void SetInputBySize(Opts& o, void* ptr, size_t numel, size_t itemsize) {
  switch (itemsize) {
    case 1:
      o.template setInput<uint8_t>(static_cast<uint8_t*>(ptr), numel);
      break;
    case 2:
      o.template setInput<uint16_t>(static_cast<uint16_t*>(ptr), numel);
      break;
    case 4:
      o.template setInput<uint32_t>(static_cast<uint32_t*>(ptr), numel);
      break;
    default:
      o.template setInput<uint64_t>(static_cast<uint64_t*>(ptr), numel);
      break;
  }
}

std::string HeaderString(const GlooBackend::Header& h) {
  std::string s = absl::StrCat(OpTypeName(static_cast<OpType>(h.op)));
  if (h.dtype >= 0) {
    absl::StrAppend(&s, " ", DTypeName(static_cast<DType>(h.dtype)), " x ",
                    h.count);
  }
  if (h.reduce_op >= 0) {
    absl::StrAppend(&s, " ", ReduceOpName(static_cast<ReduceOp>(h.reduce_op)));
  }
  if (h.root >= 0) absl::StrAppend(&s, " root ", h.root);
  return s;
}

bool SameCall(const GlooBackend::Header& a, const GlooBackend::Header& b) {
  return a.magic == b.magic && a.op == b.op && a.dtype == b.dtype &&
         a.reduce_op == b.reduce_op && a.root == b.root && a.count == b.count;
}

// The data phase of a call with nothing to move (or refused locally).
absl::Status NoData(uint32_t, absl::Duration) { return absl::OkStatus(); }

void CopyBytes(void* dst, const void* src, size_t n) {
  if (n > 0) std::memcpy(dst, src, n);
}

}  // namespace

// One point-to-point transfer. The header and payload buffers must outlive
// any chance of Gloo writing into them (see Bury).
struct GlooBackend::P2P {
  bool is_send = false;
  int peer = 0;
  int tag = 0;
  absl::Duration timeout;
  Tensor tensor;
  int64_t header[4] = {0, 0, 0, 0};  // magic, dtype, numel, nbytes
  std::unique_ptr<::gloo::transport::UnboundBuffer> header_buf;
  std::unique_ptr<::gloo::transport::UnboundBuffer> payload_buf;
  std::vector<char> drain;
  std::unique_ptr<::gloo::transport::UnboundBuffer> drain_buf;
  std::shared_ptr<Work> work;
};

absl::StatusOr<GlooBackendOptions> GlooBackendOptions::FromMap(
    const std::map<std::string, std::string>& options,
    std::optional<std::string> debug_level) {
  GlooBackendOptions out;
  if (debug_level.has_value() && !debug_level->empty()) {
    if (*debug_level == "OFF") {
      out.check_args = false;
    } else if (*debug_level == "DETAIL") {
      out.log_calls = true;
    } else if (*debug_level != "INFO") {
      return absl::InvalidArgumentError(
          absl::StrCat("FERRY_DISTRIBUTED_DEBUG='", *debug_level,
                       "' is not one of OFF, INFO, DETAIL"));
    }
  }
  for (const auto& [key, value] : options) {
    if (key == "hostname") {
      out.hostname = value;
    } else if (key == "check_args") {
      if (!absl::SimpleAtob(value, &out.check_args)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "gloo option check_args: '", value, "' is not a boolean"));
      }
    } else if (key == "p2p_threads") {
      if (!absl::SimpleAtoi(value, &out.p2p_threads) || out.p2p_threads < 1 ||
          out.p2p_threads > 256) {
        return absl::InvalidArgumentError(absl::StrCat(
            "gloo option p2p_threads: '", value, "' is not in [1, 256]"));
      }
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown gloo option '", key,
                       "' (known: hostname, check_args, p2p_threads)"));
    }
  }
  return out;
}

BackendFactory GlooBackend::Factory() {
  return [](const BackendConfig& config)
             -> absl::StatusOr<std::unique_ptr<Backend>> {
    ASSIGN_OR_RETURN(GlooBackendOptions options,
                     GlooBackendOptions::FromMap(
                         config.options, GetEnv("FERRY_DISTRIBUTED_DEBUG")));
    if (config.options.count("hostname") == 0) {
      // Across hosts the pairs must listen where peers can reach them: the
      // same choice as the RPC agent's (common/host_address.h), routing
      // toward the store's host (tcp:// or env://), else MASTER_ADDR.
      std::string toward = config.rendezvous_host;
      if (toward.empty()) {
        toward = GetEnv("MASTER_ADDR").value_or("");
      }
      ASSIGN_OR_RETURN(HostChoice host, ChooseWorkerHost(toward));
      options.hostname = host.host;
    }
    ASSIGN_OR_RETURN(std::unique_ptr<GlooBackend> backend,
                     GlooBackend::Create(config.store, config.rank, config.size,
                                         config.timeout, options));
    return std::unique_ptr<Backend>(std::move(backend));
  };
}

absl::StatusOr<std::unique_ptr<GlooBackend>> GlooBackend::Create(
    std::shared_ptr<Store> store, int rank, int size, absl::Duration timeout,
    GlooBackendOptions options) {
  if (store == nullptr) {
    return absl::InvalidArgumentError("GlooBackend::Create: null store");
  }
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GlooBackend::Create: rank ", rank, " is not in [0, ", size, ")"));
  }
  if (timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("GlooBackend::Create: timeout ",
                     absl::FormatDuration(timeout), " must be positive"));
  }
  if (options.p2p_threads < 1) options.p2p_threads = 1;
  GlooStoreAdapter adapter(store, timeout);
  std::shared_ptr<::gloo::rendezvous::Context> context;
  std::string where = absl::StrCat("gloo rendezvous of rank ", rank, " of ",
                                   size, " through ", store->Describe());
  try {
    ::gloo::transport::tcp::attr attr;
    attr.hostname = options.hostname;
    std::shared_ptr<::gloo::transport::Device> device =
        ::gloo::transport::tcp::CreateDevice(attr);
    context = std::make_shared<::gloo::rendezvous::Context>(rank, size);
    context->setTimeout(ToMillis(timeout));
    context->connectFullMesh(adapter, device);
  } catch (const std::exception& e) {
    absl::Status store_error = adapter.first_error();
    if (!store_error.ok()) {
      return Annotate(store_error,
                      absl::StrCat(where, " (timeout ",
                                   absl::FormatDuration(timeout), ")"));
    }
    std::string what = e.what();
    if (absl::StrContains(what, "imed out") ||
        absl::StrContains(what, "timeout")) {
      return absl::DeadlineExceededError(
          absl::StrCat(where, ": peers did not connect within ",
                       absl::FormatDuration(timeout), ": ", what));
    }
    return absl::UnavailableError(absl::StrCat(where, ": ", what));
  }
  return std::unique_ptr<GlooBackend>(new GlooBackend(
      rank, size, timeout, std::move(options), std::move(context)));
}

GlooBackend::GlooBackend(int rank, int size, absl::Duration timeout,
                         GlooBackendOptions options,
                         std::shared_ptr<::gloo::Context> ctx)
    : Backend("gloo", rank, size, timeout),
      options_(std::move(options)),
      context_(std::move(ctx)) {
  ThreadPoolExecutor::Options pool;
  pool.name = absl::StrCat("gloo-p2p-rank", rank);
  pool.num_threads = options_.p2p_threads;
  p2p_waiters_ = std::make_unique<ThreadPoolExecutor>(pool);
  if (options_.check_args) {
    const size_t block = sizeof(Header) + InlineBytes();
    for (ExchangeArea& area : exchange_) {
      area.blocks.assign(block * static_cast<size_t>(size), 0);
      area.buf =
          context_->createUnboundBuffer(area.blocks.data(), area.blocks.size());
    }
  }
  worker_ = std::thread([this] { WorkerLoop(); });
}

GlooBackend::~GlooBackend() {
  std::deque<std::unique_ptr<Op>> cancelled;
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    cancelled.swap(queue_);
  }
  for (auto& op : cancelled) {
    op->work->Complete(absl::CancelledError(absl::StrCat(
        op->work->description(), ": the backend was destroyed before it ran")));
  }
  if (worker_.joinable()) worker_.join();
  // Waiters finish within their operations' timeouts.
  p2p_waiters_->Shutdown(ThreadPoolExecutor::ShutdownMode::kDrain)
      .IgnoreError();
  MutexLock lock(&p2p_mu_);
  graveyard_.clear();
}

std::shared_ptr<Work> GlooBackend::Enqueue(
    OpType type, Header header, absl::Status local_error,
    const std::optional<absl::Duration>& timeout,
    absl::AnyInvocable<absl::Status(uint32_t, absl::Duration)> run,
    InlinePath path) {
  header.magic = kHeaderMagic;
  header.op = static_cast<int64_t>(type);
  header.valid = local_error.ok() ? 1 : 0;
  if (!local_error.ok() && !options_.check_args) return Fail(type, local_error);
  auto op = std::make_unique<Op>();
  op->type = type;
  op->header = header;
  op->local_error = CopyStatus(local_error);
  op->timeout = TimeoutOr(timeout);
  op->run = std::move(run);
  op->fill_inline = std::move(path.fill);
  op->personal_inline = path.personal;
  op->inline_bytes = path.bytes;
  op->finish_inline = std::move(path.finish);
  op->check_inline = std::move(path.check);
  op->algorithm = std::move(path.algorithm);
  op->after_algorithm = std::move(path.after);
  std::shared_ptr<Work> work;
  {
    MutexLock lock(&mu_);
    op->seq = next_seq_++;
    work = std::make_shared<Work>(absl::StrCat(Describe(type), " #", op->seq));
    op->work = work;
    if (stopping_) {
      work->Complete(absl::CancelledError(
          absl::StrCat(work->description(), ": the backend is shutting down")));
      return work;
    }
    queue_.push_back(std::move(op));
  }
  return work;
}

void GlooBackend::WorkerLoop() {
  ScopedLogLabel label(absl::StrCat("gloo-rank", rank()));
  for (;;) {
    std::unique_ptr<Op> op;
    absl::Status broken;
    {
      MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !queue_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;
      op = std::move(queue_.front());
      queue_.pop_front();
      broken = broken_;
    }
    absl::Status status;
    if (!broken.ok()) {
      status = absl::FailedPreconditionError(absl::StrCat(
          op->work->description(),
          ": the gloo backend is unusable after an earlier failure (",
          broken.message(), "); create a new process group"));
    } else {
      status = RunOp(*op);
      if (absl::IsDeadlineExceeded(status) || absl::IsUnavailable(status) ||
          absl::IsInternal(status)) {
        MutexLock lock(&mu_);
        if (broken_.ok()) broken_ = status;
      }
    }
    op->work->Complete(std::move(status));
  }
}

absl::Status GlooBackend::CallGloo(const Op& op, absl::Duration timeout,
                                   absl::AnyInvocable<absl::Status()> fn) {
  try {
    return fn();
  } catch (const std::exception& e) {
    std::string what = e.what();
    if (absl::StrContains(what, "imed out") ||
        absl::StrContains(what, "timeout")) {
      return absl::DeadlineExceededError(
          absl::StrCat(op.work->description(), ": timed out after ",
                       absl::FormatDuration(timeout),
                       " waiting for the other ranks (gloo: ", what, ")"));
    }
    return absl::UnavailableError(
        absl::StrCat(op.work->description(), ": gloo error: ", what));
  } catch (...) {
    return absl::InternalError(
        absl::StrCat(op.work->description(), ": unknown exception from gloo"));
  }
}

size_t GlooBackend::InlineBytes() const {
  // Inlining a payload of S bytes makes each rank receive (size - 1) * S in
  // one round, where a ring allreduce receives 2 (size - 1) / size * S over
  // 2 (size - 1) rounds: equal volume for two ranks, and on loopback the
  // rounds cost more than the bytes up to about 1 MiB per rank (above it
  // the ring, which overlaps transfer and reduction and copies nothing
  // extra, wins; it adds no round for the check either: ring.h).
  size_t n = static_cast<size_t>(size());
  size_t per_rank =
      n < 2 ? (size_t{1} << 20) : (size_t{8} << 20) / (n * (n - 1));
  per_rank = std::clamp<size_t>(per_rank, size_t{4} << 10, size_t{1} << 20);
  return per_rank & ~size_t{7};
}

void GlooBackend::PostExchange(uint32_t seq) {
  ExchangeArea& area = Area(seq);
  const size_t block = sizeof(Header) + InlineBytes();
  const uint64_t slot = (kExchangePrefix << 56) | (uint64_t{seq} << 8);
  for (int peer = 0; peer < size(); ++peer) {
    if (peer != rank()) area.buf->recv(peer, slot, peer * block, block);
  }
  area.posted_seq = seq;
}

absl::Status GlooBackend::ExchangeHeaders(Op& op, absl::Time deadline,
                                          std::vector<Header>* all) {
  // Each rank sends every other rank its header, followed by its inline
  // payload when it has one, directly and all at once. The receives were
  // posted during the previous call, so the headers travel one way only.
  // Receive areas are sized for the largest block, and Gloo accepts a
  // shorter message into a longer receive, so ranks that disagree on the
  // payload cannot overrun anything: the headers then reveal the mismatch.
  const size_t block = sizeof(Header) + InlineBytes();
  op.header.reserved = 0;
  if (op.fill_inline && op.local_error.ok()) {
    op.header.reserved = static_cast<int64_t>(op.inline_bytes);
  }
  // A personal payload (one per peer) goes out as one message per peer;
  // otherwise every peer gets the same. The outgoing messages live in
  // exchange_out_, kept between calls.
  const size_t msg = sizeof(Header) + op.header.reserved;
  const bool personal = op.personal_inline && op.header.reserved > 0;
  const size_t copies = personal ? static_cast<size_t>(size()) : 1;
  if (exchange_out_.size() < copies * msg) exchange_out_.resize(copies * msg);
  for (size_t k = 0; k < copies; ++k) {
    char* dst = exchange_out_.data() + k * msg;
    std::memcpy(dst, &op.header, sizeof(Header));
    if (op.header.reserved > 0) {
      op.fill_inline(dst + sizeof(Header),
                     personal ? static_cast<int>(k) : rank());
    }
  }
  ExchangeArea& area = Area(op.seq);
  std::memcpy(area.blocks.data() + rank() * block,
              exchange_out_.data() + (personal ? rank() * msg : 0), msg);
  const uint64_t slot = (kExchangePrefix << 56) | (uint64_t{op.seq} << 8);
  RETURN_IF_ERROR(CallGloo(op, op.timeout, [&]() -> absl::Status {
    if (area.posted_seq != op.seq) PostExchange(op.seq);
    // The other area's last call (seq - 1) is finished: post the next one.
    PostExchange(op.seq + 1);
    auto in = context_->createUnboundBuffer(exchange_out_.data(), copies * msg);
    for (int peer = 0; peer < size(); ++peer) {
      if (peer != rank()) in->send(peer, slot, personal ? peer * msg : 0, msg);
    }
    for (int i = 1; i < size(); ++i) {
      area.buf->waitRecv(gloo_internal::MillisUntil(deadline));
    }
    for (int i = 1; i < size(); ++i) {
      in->waitSend(gloo_internal::MillisUntil(deadline));
    }
    return absl::OkStatus();
  }));
  all->resize(size());
  for (int r = 0; r < size(); ++r) {
    std::memcpy(&(*all)[r], area.blocks.data() + r * block, sizeof(Header));
  }
  if (!op.local_error.ok())
    return Annotate(op.local_error, op.work->description());
  const Header& me = op.header;
  std::vector<std::string> invalid;
  for (int r = 0; r < size(); ++r) {
    if ((*all)[r].valid == 0) invalid.push_back(absl::StrCat(r));
  }
  if (!invalid.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        op.work->description(), ": rank(s) ", absl::StrJoin(invalid, ", "),
        " passed invalid arguments to this call (see their errors)"));
  }
  for (int r = 0; r < size(); ++r) {
    if (!SameCall((*all)[r], me)) {
      return absl::InvalidArgumentError(absl::StrCat(
          op.work->description(), ": arguments differ between ranks: rank ",
          rank(), " called ", HeaderString(me), ", rank ", r, " called ",
          (*all)[r].magic == kHeaderMagic ? HeaderString((*all)[r])
                                          : std::string("something else")));
    }
  }
  return absl::OkStatus();
}

void GlooBackend::AbandonEarly(const std::vector<Header>& all, uint64_t slot,
                               gloo_internal::EarlyAlgorithm* algorithm,
                               absl::Time deadline) {
  // Refused on every rank: complete the early receives that peers posted
  // for this rank's messages with empty ones (they fit any receive), then
  // wait for our own.
  const int right = (rank() + 1) % size();
  for (int peer = 0; peer < size(); ++peer) {
    const int64_t early = all[peer].early;
    if (peer == rank() || (peer != right && (early & kEarlyFromAll) == 0)) {
      continue;
    }
    gloo_internal::SendEmpty(*context_, peer, slot,
                             static_cast<int>(early & ~kEarlyFromAll),
                             deadline);
  }
  if (algorithm != nullptr) algorithm->Abandon(deadline);
}

absl::Status GlooBackend::RunOp(Op& op) {
  if (options_.log_calls) {
    FERRY_LOG(INFO) << op.work->description() << ": "
                    << HeaderString(op.header);
  }
  const uint32_t tag = op.seq * 2 + 1;
  if (!options_.check_args) {
    return CallGloo(op, op.timeout, [&]() { return op.run(tag, op.timeout); });
  }
  const absl::Time deadline = absl::Now() + op.timeout;
  // A Ferry-owned algorithm posts its first receives now, so they cross the
  // network together with the headers (ring.h).
  const uint64_t early_slot = (kEarlyPrefix << 56) | (uint64_t{op.seq} << 8);
  std::unique_ptr<gloo_internal::EarlyAlgorithm> algorithm;
  op.header.early = 0;
  if (op.algorithm && op.local_error.ok() && size() > 1) {
    algorithm = op.algorithm(early_slot);
    RETURN_IF_ERROR(CallGloo(op, op.timeout, [&]() -> absl::Status {
      op.header.early = algorithm->PostEarlyReceives();
      if (algorithm->EarlyFromEveryPeer()) op.header.early |= kEarlyFromAll;
      return absl::OkStatus();
    }));
  }
  std::vector<Header> all;
  absl::Status verdict = ExchangeHeaders(op, deadline, &all);
  if (!verdict.ok() && all.empty()) return verdict;  // The exchange failed.
  ExchangeArea& area = Area(op.seq);
  const size_t block = sizeof(Header) + InlineBytes();
  std::vector<const char*> data(size());
  for (int r = 0; r < size(); ++r) {
    data[r] = area.blocks.data() + r * block + sizeof(Header);
  }
  // Every rank holds every rank's payload: the same verdict everywhere.
  if (verdict.ok() && op.check_inline && !op.finish_inline) {
    verdict = Annotate(op.check_inline(data), op.work->description());
  }
  if (!verdict.ok()) {
    RETURN_IF_ERROR(CallGloo(op, op.timeout, [&]() -> absl::Status {
      AbandonEarly(all, early_slot, algorithm.get(), deadline);
      return absl::OkStatus();
    }));
    return verdict;
  }
  // Every rank's payload came with the headers: no second round.
  if (op.finish_inline) return op.finish_inline(data);
  if (algorithm) {
    return CallGloo(op, op.timeout, [&]() -> absl::Status {
      algorithm->Run(deadline);
      if (op.after_algorithm) op.after_algorithm();
      return absl::OkStatus();
    });
  }
  return CallGloo(op, op.timeout, [&]() { return op.run(tag, op.timeout); });
}

// --- Collectives -----------------------------------------------------------

ArgChecks GlooBackend::Checks() const {
  return ArgChecks("gloo", DeviceType::kCPU, rank(), size());
}

std::shared_ptr<Work> GlooBackend::Allreduce(Tensor tensor,
                                             const AllreduceOptions& options) {
  constexpr OpType kOp = OpType::kAllreduce;
  absl::Status local = Checks().One(kOp, tensor, "tensor");
  Header h;
  absl::StatusOr<ReduceFn> fn = absl::UnknownError("unset");
  if (local.ok()) {
    h.dtype = static_cast<int64_t>(tensor.dtype());
    h.count = tensor.numel();
    fn = GetReduceFn(tensor.dtype(), options.op);
    if (!fn.ok()) local = fn.status();
  }
  h.reduce_op = static_cast<int64_t>(options.op);
  ReduceOp rop = options.op;
  int n = size();
  InlinePath path;
  if (local.ok() && options_.check_args && tensor.nbytes() <= InlineBytes()) {
    // Small: each rank's tensor rides in the header exchange and every rank
    // reduces them in rank order (identical bits everywhere).
    path.bytes = tensor.nbytes();
    path.fill = [tensor](char* dst, int) {
      CopyBytes(dst, tensor.data_ptr(), tensor.nbytes());
    };
    path.finish = [tensor, rop, n, fn = fn.value_or(nullptr)](
                      const std::vector<const char*>& data) mutable {
      size_t nbytes = tensor.nbytes();
      if (nbytes == 0) return absl::OkStatus();
      CopyBytes(tensor.data_ptr(), data[0], nbytes);
      for (int r = 1; r < n; ++r) {
        fn(tensor.data_ptr(), tensor.data_ptr(), data[r],
           static_cast<size_t>(tensor.numel()));
      }
      if (rop == ReduceOp::kAvg) FinishAverage(tensor, n);
      return absl::OkStatus();
    };
  } else if (local.ok() && options_.check_args && tensor.numel() > 0) {
    // Larger: Ferry's ring, whose first receives ride with the check.
    path.algorithm = [this, tensor, fn = fn.value_or(nullptr)](uint64_t slot) {
      return std::unique_ptr<gloo_internal::EarlyAlgorithm>(
          std::make_unique<gloo_internal::RingAllreduce>(
              context_, tensor.data_ptr(), static_cast<size_t>(tensor.numel()),
              tensor.itemsize(), fn, slot,
              Scratch(gloo_internal::RingAllreduce::kScratchBytes)));
    };
    path.after = [tensor, rop, n]() mutable {
      if (rop == ReduceOp::kAvg) FinishAverage(tensor, n);
    };
  }
  return Enqueue(
      kOp, h, local, options.timeout,
      [this, tensor, rop, n, fn = fn.value_or(nullptr)](
          uint32_t tag, absl::Duration timeout) mutable -> absl::Status {
        if (tensor.numel() == 0) return absl::OkStatus();
        ::gloo::AllreduceOptions o(context_);
        SetOutputBySize(o, tensor.data_ptr(), tensor.numel(),
                        tensor.itemsize());
        o.setReduceFunction([fn](void* c, const void* a, const void* b,
                                 size_t k) { fn(c, a, b, k); });
        o.setTag(tag);
        o.setTimeout(ToMillis(timeout));
        ::gloo::allreduce(o);
        if (rop == ReduceOp::kAvg) FinishAverage(tensor, n);
        return absl::OkStatus();
      },
      std::move(path));
}

std::shared_ptr<Work> GlooBackend::Broadcast(Tensor tensor,
                                             const BroadcastOptions& options) {
  constexpr OpType kOp = OpType::kBroadcast;
  absl::Status local = Checks().Rooted(kOp, tensor, "tensor", options.root);
  Header h;
  h.root = options.root;
  if (tensor.defined()) {
    h.dtype = static_cast<int64_t>(tensor.dtype());
    h.count = tensor.numel();
  }
  int root = options.root;
  InlinePath path;
  if (local.ok() && options_.check_args && tensor.nbytes() <= InlineBytes()) {
    bool is_root = rank() == root;
    path.bytes = is_root ? tensor.nbytes() : 0;
    path.fill = [tensor, is_root](char* dst, int) {
      if (is_root) CopyBytes(dst, tensor.data_ptr(), tensor.nbytes());
    };
    path.finish = [tensor, root](const std::vector<const char*>& data) {
      CopyBytes(tensor.data_ptr(), data[root], tensor.nbytes());
      return absl::OkStatus();
    };
  } else if (local.ok() && options_.check_args && tensor.numel() > 0) {
    // Larger: Ferry's chain, whose first receives ride with the check.
    path.algorithm = [this, tensor, root](uint64_t slot) {
      return std::unique_ptr<gloo_internal::EarlyAlgorithm>(
          std::make_unique<gloo_internal::ChainBroadcast>(
              context_, tensor.data_ptr(), tensor.nbytes(), root, slot));
    };
  }
  return Enqueue(
      kOp, h, local, options.timeout,
      [this, tensor, root](uint32_t tag,
                           absl::Duration timeout) -> absl::Status {
        if (tensor.numel() == 0) return absl::OkStatus();
        ::gloo::BroadcastOptions o(context_);
        SetOutputBySize(o, tensor.data_ptr(), tensor.numel(),
                        tensor.itemsize());
        o.setRoot(root);
        o.setTag(tag);
        o.setTimeout(ToMillis(timeout));
        ::gloo::broadcast(o);
        return absl::OkStatus();
      },
      std::move(path));
}

std::shared_ptr<Work> GlooBackend::Reduce(Tensor tensor,
                                          const ReduceOptions& options) {
  constexpr OpType kOp = OpType::kReduce;
  absl::Status local = Checks().Rooted(kOp, tensor, "tensor", options.root);
  Header h;
  h.root = options.root;
  h.reduce_op = static_cast<int64_t>(options.op);
  absl::StatusOr<ReduceFn> fn = absl::UnknownError("unset");
  if (tensor.defined()) {
    h.dtype = static_cast<int64_t>(tensor.dtype());
    h.count = tensor.numel();
  }
  if (local.ok()) {
    fn = GetReduceFn(tensor.dtype(), options.op);
    if (!fn.ok()) local = fn.status();
  }
  int root = options.root;
  ReduceOp rop = options.op;
  bool is_root = rank() == root;
  int n = size();
  return Enqueue(
      kOp, h, local, options.timeout,
      [this, tensor, root, rop, is_root, n, fn = fn.value_or(nullptr)](
          uint32_t tag, absl::Duration timeout) mutable -> absl::Status {
        if (tensor.numel() == 0) return absl::OkStatus();
        // Non-roots keep their tensor: Gloo uses the output as scratch.
        Tensor scratch =
            is_root ? tensor : empty(tensor.sizes(), tensor.dtype());
        ::gloo::ReduceOptions o(context_);
        SetInputBySize(o, tensor.data_ptr(), tensor.numel(), tensor.itemsize());
        SetOutputBySize(o, scratch.data_ptr(), tensor.numel(),
                        tensor.itemsize());
        o.setReduceFunction([fn](void* c, const void* a, const void* b,
                                 size_t k) { fn(c, a, b, k); });
        o.setRoot(root);
        o.setTag(tag);
        o.setTimeout(ToMillis(timeout));
        ::gloo::reduce(o);
        if (is_root && rop == ReduceOp::kAvg) FinishAverage(tensor, n);
        return absl::OkStatus();
      });
}

std::shared_ptr<Work> GlooBackend::Allgather(std::vector<Tensor> outputs,
                                             Tensor input,
                                             const AllgatherOptions& options) {
  constexpr OpType kOp = OpType::kAllgather;
  absl::Status local =
      Checks().WithList(kOp, input, "input", outputs, "outputs");
  std::vector<char*> chunks;
  if (local.ok()) {
    for (Tensor& t : outputs)
      chunks.push_back(static_cast<char*>(t.data_ptr()));
  }
  return EnqueueAllgather(kOp, std::move(outputs), std::move(chunks),
                          std::move(input), local, options);
}
std::shared_ptr<Work> GlooBackend::Gather(std::vector<Tensor> outputs,
                                          Tensor input,
                                          const GatherOptions& options) {
  constexpr OpType kOp = OpType::kGather;
  absl::Status local = Checks().RootedWithList(
      kOp, input, "input", options.root, outputs, "outputs");
  bool is_root = rank() == options.root;
  Header h;
  h.root = options.root;
  if (input.defined()) {
    h.dtype = static_cast<int64_t>(input.dtype());
    h.count = input.numel();
  }
  int root = options.root;
  int n = size();
  return Enqueue(
      kOp, h, local, options.timeout,
      [this, outputs = std::move(outputs), input, root, is_root, n](
          uint32_t tag, absl::Duration timeout) -> absl::Status {
        size_t nbytes = input.nbytes();
        if (nbytes == 0) return absl::OkStatus();
        Tensor flat;
        ::gloo::GatherOptions o(context_);
        o.setInput<uint8_t>(static_cast<uint8_t*>(input.data_ptr()), nbytes);
        if (is_root) {
          flat = empty({static_cast<int64_t>(n * nbytes)}, DType::kUInt8);
          o.setOutput<uint8_t>(static_cast<uint8_t*>(flat.data_ptr()),
                               n * nbytes);
        }
        o.setRoot(root);
        o.setTag(tag);
        o.setTimeout(ToMillis(timeout));
        ::gloo::gather(o);
        if (is_root) {
          const char* src = static_cast<const char*>(flat.data_ptr());
          for (int r = 0; r < n; ++r) {
            CopyBytes(outputs[r].data_ptr(), src + r * nbytes, nbytes);
          }
        }
        return absl::OkStatus();
      });
}

std::shared_ptr<Work> GlooBackend::Scatter(Tensor output,
                                           std::vector<Tensor> inputs,
                                           const ScatterOptions& options) {
  constexpr OpType kOp = OpType::kScatter;
  absl::Status local = Checks().RootedWithList(kOp, output, "output",
                                               options.root, inputs, "inputs");
  bool is_root = rank() == options.root;
  Header h;
  h.root = options.root;
  if (output.defined()) {
    h.dtype = static_cast<int64_t>(output.dtype());
    h.count = output.numel();
  }
  int root = options.root;
  return Enqueue(kOp, h, local, options.timeout,
                 [this, inputs = std::move(inputs), output, root, is_root](
                     uint32_t tag, absl::Duration timeout) -> absl::Status {
                   size_t nbytes = output.nbytes();
                   if (nbytes == 0) return absl::OkStatus();
                   ::gloo::ScatterOptions o(context_);
                   if (is_root) {
                     std::vector<uint8_t*> ptrs;
                     for (const Tensor& t : inputs) {
                       ptrs.push_back(static_cast<uint8_t*>(t.data_ptr()));
                     }
                     o.setInputs<uint8_t>(ptrs, nbytes);
                   }
                   o.setOutput<uint8_t>(
                       static_cast<uint8_t*>(output.data_ptr()), nbytes);
                   o.setRoot(root);
                   o.setTag(tag);
                   o.setTimeout(ToMillis(timeout));
                   ::gloo::scatter(o);
                   return absl::OkStatus();
                 });
}

std::shared_ptr<Work> GlooBackend::ReduceScatter(
    Tensor output, std::vector<Tensor> inputs,
    const ReduceScatterOptions& options) {
  constexpr OpType kOp = OpType::kReduceScatter;
  absl::Status local =
      Checks().WithList(kOp, output, "output", inputs, "inputs");
  std::vector<const char*> chunks;
  if (local.ok()) {
    for (const Tensor& t : inputs) {
      chunks.push_back(static_cast<const char*>(t.data_ptr()));
    }
  }
  return EnqueueReduceScatter(kOp, std::move(output), std::move(inputs),
                              std::move(chunks), local, options);
}

std::shared_ptr<Work> GlooBackend::ReduceScatterTensor(
    Tensor output, Tensor input, const ReduceScatterOptions& options) {
  constexpr OpType kOp = OpType::kReduceScatterTensor;
  absl::Status local = Checks().Flat(kOp, input, "input", output, "output");
  std::vector<const char*> chunks;
  if (local.ok()) {
    const char* base = static_cast<const char*>(input.data_ptr());
    for (int r = 0; r < size(); ++r)
      chunks.push_back(base + r * output.nbytes());
  }
  return EnqueueReduceScatter(kOp, std::move(output), {std::move(input)},
                              std::move(chunks), local, options);
}

char* GlooBackend::Scratch(size_t bytes) {
  if (scratch_bytes_ < bytes) {
    scratch_.reset();  // Release the old one before taking the new.
    scratch_.reset(new char[bytes]);
    scratch_bytes_ = bytes;
  }
  return scratch_.get();
}

GlooBackend::RunFn GlooBackend::OwnAlgorithm(AlgorithmFactory make,
                                             std::function<void()> after,
                                             InlinePath* path) {
  if (options_.check_args && path != nullptr) {
    path->algorithm = make;
    // An empty std::function would make a non-empty AnyInvocable.
    if (after) path->after = after;
  }
  return [make = std::move(make), after = std::move(after)](
             uint32_t tag, absl::Duration timeout) -> absl::Status {
    // Without the check (or on one rank): the same algorithm, start to end.
    std::unique_ptr<gloo_internal::EarlyAlgorithm> algorithm =
        make((kRingPrefix << 56) | (uint64_t{tag} << 8));
    algorithm->PostEarlyReceives();
    algorithm->Run(absl::Now() + timeout);
    if (after) after();
    return absl::OkStatus();
  };
}

std::shared_ptr<Work> GlooBackend::EnqueueReduceScatter(
    OpType op, Tensor output, std::vector<Tensor> inputs,
    std::vector<const char*> chunks, absl::Status local,
    const ReduceScatterOptions& o) {
  Header h;
  h.reduce_op = static_cast<int64_t>(o.op);
  if (output.defined()) {
    h.dtype = static_cast<int64_t>(output.dtype());
    h.count = output.numel();
  }
  absl::StatusOr<ReduceFn> fn = absl::UnknownError("unset");
  if (local.ok()) {
    fn = GetReduceFn(output.dtype(), o.op);
    if (!fn.ok()) local = fn.status();
  }
  const ReduceOp rop = o.op;
  const int n = size(), me = rank();
  const ReduceFn reduce = fn.value_or(nullptr);
  const size_t bytes = output.defined() ? output.nbytes() : 0;
  auto finish_average = [output, rop, n]() mutable {
    if (rop == ReduceOp::kAvg) FinishAverage(output, n);
  };
  if (!local.ok() || bytes == 0) {
    return Enqueue(op, h, local, o.timeout, NoData);
  }
  InlinePath path;
  const bool small = options_.check_args && bytes <= InlineBytes();
  if (small) {
    // Small: each rank's chunk for each peer rides in its header message to
    // that peer, and each rank reduces what it got in rank order.
    path.bytes = bytes;
    path.personal = true;
    path.fill = [chunks, bytes, inputs](char* dst, int peer) {
      CopyBytes(dst, chunks[peer], bytes);
    };
    path.finish = [output, bytes, me, n, reduce, finish_average](
                      const std::vector<const char*>& data) mutable {
      char* out = static_cast<char*>(output.data_ptr());
      const size_t numel = static_cast<size_t>(output.numel());
      CopyBytes(out, data[0], bytes);
      for (int r = 1; r < n; ++r) reduce(out, out, data[r], numel);
      finish_average();
      return absl::OkStatus();
    };
  }
  // The ring's destinations must not overlap its inputs: an output that
  // aliases the input gets its sums in scratch first.
  const char* out_begin = static_cast<const char*>(output.data_ptr());
  bool aliased = false;
  for (const char* c : chunks) {
    aliased = aliased || (c < out_begin + bytes && out_begin < c + bytes);
  }
  AlgorithmFactory make = [this, output, inputs, chunks, bytes, reduce, n,
                           aliased](uint64_t slot) {
    const size_t scratch_chunks = (n > 2 ? 1 : 0) + (aliased ? 1 : 0);
    char* scratch =
        scratch_chunks > 0 ? Scratch(scratch_chunks * bytes) : nullptr;
    char* out = aliased ? scratch + (scratch_chunks - 1) * bytes
                        : static_cast<char*>(output.data_ptr());
    return std::unique_ptr<gloo_internal::EarlyAlgorithm>(
        std::make_unique<gloo_internal::RingReduceScatter>(
            context_, chunks, out, n > 2 ? scratch : nullptr,
            static_cast<size_t>(output.numel()), output.itemsize(), reduce,
            slot));
  };
  std::function<void()> after = [this, output, bytes, n, aliased,
                                 finish_average]() mutable {
    if (aliased) {
      CopyBytes(output.data_ptr(), scratch_.get() + (n > 2 ? bytes : 0), bytes);
    }
    finish_average();
  };
  RunFn run =
      OwnAlgorithm(std::move(make), std::move(after), small ? nullptr : &path);
  return Enqueue(op, h, local, o.timeout, std::move(run), std::move(path));
}

std::shared_ptr<Work> GlooBackend::AllgatherIntoTensor(
    Tensor output, Tensor input, const AllgatherOptions& options) {
  constexpr OpType kOp = OpType::kAllgatherIntoTensor;
  absl::Status local = Checks().Flat(kOp, output, "output", input, "input");
  std::vector<char*> chunks;
  if (local.ok()) {
    char* base = static_cast<char*>(output.data_ptr());
    for (int r = 0; r < size(); ++r)
      chunks.push_back(base + r * input.nbytes());
  }
  return EnqueueAllgather(kOp, {std::move(output)}, std::move(chunks),
                          std::move(input), local, options);
}

std::shared_ptr<Work> GlooBackend::EnqueueAllgather(
    OpType op, std::vector<Tensor> outputs, std::vector<char*> chunks,
    Tensor input, absl::Status local, const AllgatherOptions& o) {
  Header h;
  if (input.defined()) {
    h.dtype = static_cast<int64_t>(input.dtype());
    h.count = input.numel();
  }
  const size_t bytes = input.defined() ? input.nbytes() : 0;
  const bool small = options_.check_args && bytes <= InlineBytes();
  if (!local.ok() || bytes == 0) {
    return Enqueue(op, h, local, o.timeout, NoData);
  }
  // The ring sends from the input while receives land in the outputs: an
  // input overlapping any output chunk but exactly its own is sent from a
  // copy.
  const char* in = static_cast<const char*>(input.data_ptr());
  for (size_t r = 0; r < chunks.size(); ++r) {
    const bool own = static_cast<int>(r) == rank() && chunks[r] == in;
    if (!own && chunks[r] < in + bytes && in < chunks[r] + bytes) {
      input = input.clone();
      break;
    }
  }
  InlinePath path;
  if (small) {
    // Small: every rank's input rides in the header exchange.
    path.bytes = bytes;
    path.fill = [input, bytes](char* dst, int) {
      CopyBytes(dst, input.data_ptr(), bytes);
    };
    path.finish = [outputs, chunks,
                   bytes](const std::vector<const char*>& data) {
      for (size_t r = 0; r < chunks.size(); ++r) {
        if (chunks[r] != data[r]) CopyBytes(chunks[r], data[r], bytes);
      }
      return absl::OkStatus();
    };
  }
  AlgorithmFactory make = [this, outputs, chunks, input, bytes](uint64_t slot) {
    return std::unique_ptr<gloo_internal::EarlyAlgorithm>(
        std::make_unique<gloo_internal::RingAllgather>(
            context_, static_cast<const char*>(input.data_ptr()), chunks, bytes,
            slot));
  };
  RunFn run = OwnAlgorithm(std::move(make), nullptr, small ? nullptr : &path);
  return Enqueue(op, h, local, o.timeout, std::move(run), std::move(path));
}

std::shared_ptr<Work> GlooBackend::AlltoallSingle(
    Tensor output, Tensor input, const AlltoallSingleOptions& options) {
  constexpr OpType kOp = OpType::kAlltoallSingle;
  std::vector<int64_t> out_rows, in_rows;
  absl::Status local =
      Checks().AlltoallSingle(output, input, options, &out_rows, &in_rows);
  Header h;
  int64_t row_bytes = 0;
  if (local.ok()) {
    h.dtype = static_cast<int64_t>(input.dtype());
    h.count = ElementsPerRow(input);  // Also when this rank moves no rows.
    row_bytes = h.count * input.itemsize();
  }
  const int n = size();
  InlinePath path;
  const size_t split_bytes = sizeof(int64_t) * 2 * static_cast<size_t>(n);
  if (local.ok() && options_.check_args && split_bytes <= InlineBytes()) {
    // Every rank learns every rank's splits, so all reach one verdict.
    path.bytes = split_bytes;
    path.fill = [in_rows, out_rows, n](char* dst, int) {
      std::memcpy(dst, in_rows.data(), sizeof(int64_t) * n);
      std::memcpy(dst + sizeof(int64_t) * n, out_rows.data(),
                  sizeof(int64_t) * n);
    };
    path.check = [n](const std::vector<const char*>& data) -> absl::Status {
      for (int src = 0; src < n; ++src) {
        for (int dst = 0; dst < n; ++dst) {
          int64_t sent, expected;
          std::memcpy(&sent, data[src] + sizeof(int64_t) * dst, sizeof(sent));
          std::memcpy(&expected, data[dst] + sizeof(int64_t) * (n + src),
                      sizeof(expected));
          if (sent != expected) {
            return absl::InvalidArgumentError(absl::StrCat(
                "rank ", src, " sends ", sent, " rows to rank ", dst,
                ", which expects ", expected, " from it (split sizes differ)"));
          }
        }
      }
      return absl::OkStatus();
    };
  }
  if (!local.ok()) return Enqueue(kOp, h, local, options.timeout, NoData);
  // Receives are posted before the sends have read the input: an output
  // that overlaps it sends from a copy.
  if (SharesBytes(output, input)) input = input.clone();
  // Byte spans per peer in input (sent) and output (received).
  using Span = gloo_internal::PairwiseAlltoall::Span;
  std::vector<Span> send(n), recv(n);
  char* in_base = static_cast<char*>(input.data_ptr());
  char* out_base = static_cast<char*>(output.data_ptr());
  for (int r = 0; r < n; ++r) {
    send[r] = {in_base, static_cast<size_t>(in_rows[r] * row_bytes)};
    recv[r] = {out_base, static_cast<size_t>(out_rows[r] * row_bytes)};
    in_base += send[r].bytes;
    out_base += recv[r].bytes;
  }
  AlgorithmFactory make = [this, output, input, send, recv](uint64_t slot) {
    return std::unique_ptr<gloo_internal::EarlyAlgorithm>(
        std::make_unique<gloo_internal::PairwiseAlltoall>(context_, send, recv,
                                                          slot));
  };
  // Its receives are posted before the check only when the splits ride in
  // it (the check then runs before any payload moves).
  RunFn run =
      OwnAlgorithm(std::move(make), nullptr, path.check ? &path : nullptr);
  return Enqueue(kOp, h, local, options.timeout, std::move(run),
                 std::move(path));
}

std::shared_ptr<Work> GlooBackend::Alltoall(std::vector<Tensor> outputs,
                                            std::vector<Tensor> inputs,
                                            const AlltoallOptions& options) {
  constexpr OpType kOp = OpType::kAlltoall;
  absl::Status local = Checks().Alltoall(outputs, inputs);
  Header h;
  if (!inputs.empty() && inputs[0].defined()) {
    h.dtype = static_cast<int64_t>(inputs[0].dtype());
    h.count = inputs[0].numel();
  }
  if (!local.ok()) return Enqueue(kOp, h, local, options.timeout, NoData);
  // Straight from each input to its peer's output: no flat copies, unless
  // an output overlaps an input (receives are posted before the sends read).
  bool overlap = false;
  for (const Tensor& o : outputs) {
    for (const Tensor& i : inputs) overlap = overlap || SharesBytes(o, i);
  }
  if (overlap) {
    for (Tensor& i : inputs) i = i.clone();
  }
  using Span = gloo_internal::PairwiseAlltoall::Span;
  std::vector<Span> send, recv;
  for (int r = 0; r < size(); ++r) {
    send.push_back(
        {static_cast<char*>(inputs[r].data_ptr()), inputs[r].nbytes()});
    recv.push_back(
        {static_cast<char*>(outputs[r].data_ptr()), outputs[r].nbytes()});
  }
  AlgorithmFactory make = [this, outputs, inputs, send, recv](uint64_t slot) {
    return std::unique_ptr<gloo_internal::EarlyAlgorithm>(
        std::make_unique<gloo_internal::PairwiseAlltoall>(context_, send, recv,
                                                          slot));
  };
  InlinePath path;
  RunFn run = OwnAlgorithm(std::move(make), nullptr, &path);
  return Enqueue(kOp, h, local, options.timeout, std::move(run),
                 std::move(path));
}

std::shared_ptr<Work> GlooBackend::Barrier(const BarrierOptions& options) {
  InlinePath path;
  if (options_.check_args) {
    // The header allgather cannot finish on any rank before every rank
    // joined it: it is the barrier.
    path.finish = [](const std::vector<const char*>&) {
      return absl::OkStatus();
    };
  }
  return Enqueue(
      OpType::kBarrier, Header{}, absl::OkStatus(), options.timeout,
      [this](uint32_t tag, absl::Duration timeout) -> absl::Status {
        ::gloo::BarrierOptions o(context_);
        o.setTag(tag);
        o.setTimeout(ToMillis(timeout));
        ::gloo::barrier(o);
        return absl::OkStatus();
      },
      std::move(path));
}

// --- Point to point ----------------------------------------------------------

namespace {

uint64_t P2PSlot(uint64_t prefix, int tag, uint64_t nbytes) {
  // prefix (8 bits) | tag (32 bits) | size fingerprint (24 bits): payloads of
  // different sizes never match, so a mismatch cannot overrun a buffer.
  uint64_t fp = (nbytes * 0x9E3779B97F4A7C15ull) >> 40;
  return (prefix << 56) |
         (static_cast<uint64_t>(static_cast<uint32_t>(tag)) << 24) |
         (fp & 0xFFFFFF);
}

}  // namespace

std::shared_ptr<Work> GlooBackend::Send(Tensor tensor, int dst_rank,
                                        const SendOptions& options) {
  return StartP2P(/*is_send=*/true, std::move(tensor), dst_rank, options.tag,
                  options.timeout);
}

std::shared_ptr<Work> GlooBackend::Recv(Tensor tensor, int src_rank,
                                        const RecvOptions& options) {
  return StartP2P(/*is_send=*/false, std::move(tensor), src_rank, options.tag,
                  options.timeout);
}

std::shared_ptr<Work> GlooBackend::RecvAnysource(Tensor tensor,
                                                 const RecvOptions& options) {
  return StartP2P(/*is_send=*/false, std::move(tensor), /*peer=*/-1,
                  options.tag, options.timeout);
}

std::shared_ptr<Work> GlooBackend::StartP2P(
    bool is_send, Tensor tensor, int peer, int tag,
    std::optional<absl::Duration> timeout) {
  const bool any_source = !is_send && peer == -1;
  const OpType kOp = is_send      ? OpType::kSend
                     : any_source ? OpType::kRecvAnysource
                                  : OpType::kRecv;
  absl::Status local = any_source
                           ? Checks().One(kOp, tensor, "tensor")
                           : Checks().PointToPoint(kOp, tensor, peer, tag);
  if (local.ok() && tag < 0) {
    local = absl::InvalidArgumentError(
        absl::StrCat(OpTypeName(kOp), ": tag ", tag, " is negative"));
  }
  if (!local.ok()) return Fail(kOp, local);
  auto p = std::make_shared<P2P>();
  p->is_send = is_send;
  p->peer = peer;
  p->tag = tag;
  p->timeout = TimeoutOr(timeout);
  p->tensor = tensor;
  if (is_send) {
    p->header[0] = kP2PMagic;
    p->header[1] = static_cast<int64_t>(tensor.dtype());
    p->header[2] = tensor.numel();
    p->header[3] = static_cast<int64_t>(tensor.nbytes());
  }
  p->work = std::make_shared<Work>(
      any_source
          ? absl::StrCat(Describe(kOp), " tag ", tag)
          : absl::StrCat(Describe(kOp), is_send ? " to rank " : " from rank ",
                         peer, " tag ", tag));
  try {
    p->header_buf = context_->createUnboundBuffer(p->header, sizeof(p->header));
    const uint64_t header_slot = P2PSlot(kP2PHeaderPrefix, p->tag, 0);
    if (is_send) {
      p->header_buf->send(peer, header_slot);
    } else if (any_source) {
      std::vector<int> peers;
      for (int r = 0; r < size(); ++r) {
        if (r != rank()) peers.push_back(r);
      }
      p->header_buf->recv(peers, header_slot);
    } else {
      p->header_buf->recv(peer, header_slot);
    }
    // An any-source payload is posted once the header names the sender.
    if (tensor.nbytes() > 0 && !any_source) {
      p->payload_buf =
          context_->createUnboundBuffer(tensor.data_ptr(), tensor.nbytes());
      const uint64_t payload_slot =
          P2PSlot(kP2PPayloadPrefix, p->tag, tensor.nbytes());
      if (is_send) {
        p->payload_buf->send(peer, payload_slot);
      } else {
        p->payload_buf->recv(peer, payload_slot);
      }
    }
  } catch (const std::exception& e) {
    Bury(p);
    return Fail(kOp, absl::UnavailableError(absl::StrCat("gloo: ", e.what())));
  }
  std::shared_ptr<Work> work = p->work;
  absl::Status submitted = p2p_waiters_->Submit([this, p] { WaitP2P(p); });
  if (!submitted.ok()) {
    Bury(p);
    work->Complete(Annotate(submitted, work->description()));
  }
  return work;
}

void GlooBackend::WaitP2P(std::shared_ptr<P2P> p) {
  absl::Time deadline = absl::Now() + p->timeout;
  auto remaining = [&] { return ToMillis(deadline - absl::Now()); };
  absl::Status status;
  try {
    if (p->is_send) {
      bool ok = p->header_buf->waitSend(remaining());
      if (ok && p->payload_buf) ok = p->payload_buf->waitSend(remaining());
      if (!ok) status = absl::CancelledError("send aborted");
    } else {
      const bool any_source = p->peer == -1;
      int source = p->peer;
      bool ok = p->header_buf->waitRecv(&source, remaining());
      if (ok && any_source) {
        p->peer = source;
        p->work->set_source_rank(source);
      }
      if (ok && any_source && p->tensor.nbytes() > 0 &&
          p->header[0] == kP2PMagic &&
          p->header[1] == static_cast<int64_t>(p->tensor.dtype()) &&
          p->header[2] == p->tensor.numel()) {
        p->payload_buf = context_->createUnboundBuffer(p->tensor.data_ptr(),
                                                       p->tensor.nbytes());
        p->payload_buf->recv(
            source, P2PSlot(kP2PPayloadPrefix, p->tag, p->tensor.nbytes()));
      }
      if (!ok) {
        status = absl::CancelledError("receive aborted");
      } else if (p->header[0] != kP2PMagic ||
                 p->header[1] != static_cast<int64_t>(p->tensor.dtype()) ||
                 p->header[2] != p->tensor.numel()) {
        std::string sent =
            p->header[0] == kP2PMagic && p->header[1] >= 0 && p->header[1] <= 8
                ? absl::StrCat(DTypeName(static_cast<DType>(p->header[1])),
                               " x ", p->header[2])
                : std::string("an unrecognized header");
        status = absl::InvalidArgumentError(absl::StrCat(
            "rank ", p->peer, " sent ", sent, " but this Recv expects ",
            DTypeName(p->tensor.dtype()), " x ", p->tensor.numel()));
        // Drain the sender's payload (its slot carries its size) so the
        // Send completes instead of timing out, which would close the pairs.
        int64_t announced = p->header[3];
        if (p->header[0] == kP2PMagic && announced > 0 &&
            announced <= kMaxDrainBytes) {
          p->drain.resize(static_cast<size_t>(announced));
          p->drain_buf =
              context_->createUnboundBuffer(p->drain.data(), p->drain.size());
          p->drain_buf->recv(p->peer,
                             P2PSlot(kP2PPayloadPrefix, p->tag,
                                     static_cast<uint64_t>(announced)));
          p->drain_buf->waitRecv(remaining());
        }
      } else if (p->payload_buf) {
        if (!p->payload_buf->waitRecv(remaining())) {
          status = absl::CancelledError("receive aborted");
        }
      }
    }
  } catch (const std::exception& e) {
    std::string what = e.what();
    if (absl::StrContains(what, "imed out")) {
      status = absl::DeadlineExceededError(
          absl::StrCat("timed out after ", absl::FormatDuration(p->timeout),
                       " (gloo: ", what, ")"));
    } else {
      status = absl::UnavailableError(absl::StrCat("gloo: ", what));
    }
  }
  std::shared_ptr<Work> work = p->work;
  if (absl::IsDeadlineExceeded(status) || absl::IsUnavailable(status)) {
    // Gloo closes every pair of the context when a wait times out.
    MutexLock lock(&mu_);
    if (broken_.ok()) broken_ = Annotate(status, work->description());
  }
  if (!status.ok()) Bury(std::move(p));
  work->Complete(Annotate(status, work->description()));
}

void GlooBackend::Bury(std::shared_ptr<P2P> p) {
  // Gloo may still deliver into these buffers later; destroying them would
  // wedge the pair, so they live as long as the backend.
  MutexLock lock(&p2p_mu_);
  graveyard_.push_back(std::move(p));
}

}  // namespace c10d
}  // namespace ferry
