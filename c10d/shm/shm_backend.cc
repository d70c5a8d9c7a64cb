#include "ferry/c10d/shm/shm_backend.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <random>
#include <tuple>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "ferry/c10d/gloo/gloo_backend.h"
#include "ferry/c10d/reduce.h"
#include "ferry/c10d/shm/copy_team.h"
#include "ferry/common/env.h"
#include "ferry/common/executor.h"
#include "ferry/common/same_host.h"
#include "ferry/common/status.h"
#include "ferry/store/prefix_store.h"

namespace ferry {
namespace c10d {
namespace {

constexpr uint64_t kMagic = 0x4665727279534D34;  // "FerrySM4"
constexpr size_t kHeaderBytes = 512;
constexpr absl::Duration kLivenessPeriod = absl::Milliseconds(50);
// Streamed broadcast: the piece a rank copies before publishing its progress
// when every rank has a core of its own (else a slot, as each wake-up then
// costs a context switch).
constexpr int64_t kChunkBytes = int64_t{256} << 10;
// Tensors from this size on are copied out with non-temporal stores when
// every rank has a core of its own.
constexpr int64_t kStreamingStoreBytes = int64_t{8} << 20;
// With a copy team of T threads, rank 0 makes slots T times the option, as
// long as the segment stays within this (a container's /dev/shm may be as
// small as 64 MiB).
constexpr size_t kMaxScaledSegmentBytes = size_t{32} << 20;
// The largest team the automatic choice makes.
constexpr int kMaxAutoThreads = 16;
// SegmentHeader::broadcast values.
constexpr uint32_t kBroadcastStream = 1;
constexpr uint32_t kBroadcastRounds = 2;

struct SegmentHeader {
  uint64_t magic;
  int64_t size;
  // Bytes per slot, and the shm_slot_bytes option they were scaled from.
  uint64_t slot_bytes;
  uint64_t option_slot_bytes;
  uint32_t attached;
  // 0, or (status code << 16) | (1 + the rank that gave up first).
  uint32_t failed;
  // How large broadcasts run (kBroadcastStream / kBroadcastRounds), chosen
  // by rank 0 so that every rank runs the same algorithm.
  uint32_t broadcast;
  // Barrier arrivals of all ranks so far (wraps), the futex word waiters
  // sleep on; on its own cache line, away from the read-mostly fields.
  alignas(64) uint32_t arrivals;
  // Ranks asleep (or about to sleep) on `arrivals`.
  uint32_t sleepers;
  // Streamed broadcast: bumped whenever the root advances its `progress`,
  // the futex word readers sleep on; and the readers asleep on it.
  alignas(64) uint32_t root_events;
  uint32_t root_sleepers;
  // Bumped by a reader whose progress completes what the root waits for
  // (`root_wants`), the futex word the root sleeps on; and 1 while it does.
  // Apart from the readers' word, so a reader's progress wakes neither the
  // other readers nor (until the last of them) the root: with more ranks
  // than cores each needless wake-up costs a context switch.
  alignas(64) uint32_t reader_events;
  uint32_t reader_sleepers;
  uint64_t root_wants;
};
static_assert(sizeof(SegmentHeader) <= kHeaderBytes);

struct alignas(64) RankCtl {
  uint64_t arrived;  // Barriers this rank has reached.
  int64_t pid;
  ShmBackend::Signature sig[2];  // One per buffer set.
  // Streamed broadcast: bytes the root has published, or a reader has
  // copied out, counted over every streamed broadcast so far (so a value
  // left by an earlier one never satisfies a later wait). Own cache line:
  // written once per chunk while others poll it.
  alignas(64) uint64_t progress;
};

template <typename T>
std::atomic_ref<T> Atomic(T& v) {
  return std::atomic_ref<T>(v);
}

// Process-shared futex (the segment is mapped by several processes).
void FutexWait(uint32_t* word, uint32_t expected, absl::Duration timeout) {
  struct timespec ts = absl::ToTimespec(timeout);
  ::syscall(SYS_futex, word, FUTEX_WAIT, expected, &ts, nullptr, 0);
}
void FutexWakeAll(uint32_t* word) {
  ::syscall(SYS_futex, word, FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// The cores this process may run on.
int Cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  return ::sched_getaffinity(0, sizeof(set), &set) == 0
             ? CPU_COUNT(&set)
             : static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN));
}
// Pause-loop iterations before a waiter sleeps: long when every rank has a
// core of its own (a wake-up costs more than the wait), short when ranks
// outnumber the cores (a spinning rank would take the core of the rank it
// waits for).
int SpinLimit(bool core_per_rank) { return core_per_rank ? 4000 : 20; }

// How large broadcasts run (SegmentHeader::broadcast): streamed when every
// rank has a core of its own; with more ranks than cores, rounds (see
// RunBroadcast for why).
uint32_t BroadcastMode(ShmBackendOptions::Broadcast b, int size) {
  switch (b) {
    case ShmBackendOptions::Broadcast::kStream:
      return kBroadcastStream;
    case ShmBackendOptions::Broadcast::kRounds:
      return kBroadcastRounds;
    case ShmBackendOptions::Broadcast::kAuto:
      break;
  }
  return Cpus() >= size ? kBroadcastStream : kBroadcastRounds;
}

// Copy-outs of calls moving this many bytes or more use non-temporal stores
// (0: none).
int64_t StreamingStoreBytes(const ShmBackendOptions& o, bool core_per_rank) {
  if (o.streaming_store_bytes >= 0) return o.streaming_store_bytes;
  return core_per_rank ? kStreamingStoreBytes : 0;
}

size_t RoundUp(size_t v, size_t to) { return (v + to - 1) / to * to; }

// This rank's copy team: the option, else the cores per rank less one (at
// least 1). The core left is for the rank's other threads (the caller
// waking from Work::Wait, the framework's own), which would otherwise
// preempt a spinning helper. (Measured on 16 vCPUs with this choice only:
// bench/c10d/results/shm_teams_16vcpu_2026-11-26.txt.)
int TeamThreads(const ShmBackendOptions& o, int size) {
  if (o.threads > 0) return o.threads;
  return std::clamp(Cpus() / std::max(size, 1) - 1, 1, kMaxAutoThreads);
}

// Rank 0's slot: the option times its team, within kMaxScaledSegmentBytes
// (never below the option).
size_t ScaledSlotBytes(const ShmBackendOptions& o, int size) {
  const size_t per_set = 2 * static_cast<size_t>(size) * o.slot_bytes;
  const size_t fit = std::max<size_t>(1, kMaxScaledSegmentBytes / per_set);
  return o.slot_bytes *
         std::min<size_t>(static_cast<size_t>(TeamThreads(o, size)), fit);
}

std::string ErrnoText(absl::string_view what, const std::string& name) {
  return absl::StrCat(what, " ", name, ": ", std::strerror(errno));
}

std::string SignatureText(const ShmBackend::Signature& s) {
  if (s.valid == 0) return "invalid arguments";
  std::string out(OpTypeName(static_cast<OpType>(s.op)));
  if (s.dtype >= 0) {
    absl::StrAppend(&out, " ", DTypeName(static_cast<DType>(s.dtype)), " x ",
                    s.count);
  }
  if (s.reduce_op >= 0) {
    absl::StrAppend(&out, " ",
                    ReduceOpName(static_cast<ReduceOp>(s.reduce_op)));
  }
  if (s.root >= 0) absl::StrAppend(&out, " root ", s.root);
  return absl::StrCat(out, " (call #", s.seq, ")");
}

bool Matches(const ShmBackend::Signature& a, const ShmBackend::Signature& b) {
  return a.op == b.op && a.dtype == b.dtype && a.count == b.count &&
         a.root == b.root && a.reduce_op == b.reduce_op && a.seq == b.seq &&
         a.valid == b.valid;
}

}  // namespace

// The mapped segment (see the layout in shm_backend.h).
struct ShmBackend::Segment {
  char* base = nullptr;
  size_t bytes = 0;
  int size = 0;
  size_t slot_bytes = 0;
  size_t data_offset = 0;

  ~Segment() {
    if (base != nullptr) ::munmap(base, bytes);
  }
  SegmentHeader& header() { return *reinterpret_cast<SegmentHeader*>(base); }
  RankCtl& ctl(int r) {
    return reinterpret_cast<RankCtl*>(base + kHeaderBytes)[r];
  }
  char* slot(uint64_t set, int r) {
    return base + data_offset +
           (set * static_cast<size_t>(size) + r) * slot_bytes;
  }
  static size_t Layout(int size, size_t slot_bytes, size_t* data_offset) {
    *data_offset = RoundUp(kHeaderBytes + sizeof(RankCtl) * size, 4096);
    return *data_offset + 2 * static_cast<size_t>(size) * slot_bytes;
  }
};

struct ShmBackend::Op {
  OpType type;
  Signature sig;
  absl::Status local;
  absl::Duration timeout;
  std::shared_ptr<Work> work;
  absl::AnyInvocable<absl::Status(Round&)> run;
};

// One operation's view of the rounds it runs (worker thread only).
class ShmBackend::Round {
 public:
  Round(ShmBackend* b, Op* op)
      : b_(b),
        seg_(b->segment_.get()),
        op_(op),
        deadline_(absl::Now() + op->timeout) {}

  // This rank's slot, and rank r's, in the current round's buffer set.
  char* mine() { return seg_->slot(b_->rounds_ % 2, b_->rank()); }
  char* slot(int r) { return seg_->slot(b_->rounds_ % 2, r); }
  size_t slot_bytes() const { return seg_->slot_bytes; }

  // Ends this round's writes: on the operation's first round publishes the
  // signature, then arrives and waits for every rank; on the first round
  // compares every rank's signature before anything is read.
  absl::Status Arrive() {
    RankCtl& me = seg_->ctl(b_->rank());
    const uint64_t set = b_->rounds_ % 2;
    if (first_) me.sig[set] = op_->sig;
    RETURN_IF_ERROR(Barrier());
    if (!first_) return absl::OkStatus();
    first_ = false;
    return CheckSignatures(set);
  }
  // A barrier inside the round (no signature).
  absl::Status Barrier() {
    const uint64_t target = ++b_->arrivals_;
    Atomic(seg_->ctl(b_->rank()).arrived)
        .store(target, std::memory_order_release);
    SegmentHeader& h = seg_->header();
    // Every rank's arrivals at this barrier make the total a multiple of n
    // (ranks cannot pass the next barrier before this one completes), so
    // exactly one rank sees `goal`: it wakes the sleepers.
    const uint32_t goal = Goal(target);
    if (Atomic(h.arrivals).fetch_add(1) + 1 == goal &&
        Atomic(h.sleepers).load() > 0) {
      FutexWakeAll(&h.arrivals);
    }
    return WaitAll(target);
  }
  // Moves to the next round (the other buffer set).
  void Next() { ++b_->rounds_; }

  // The current round's buffer set, and rank r's slot in set `set`.
  uint64_t set() const { return b_->rounds_ % 2; }
  char* slot_in(uint64_t set, int r) { return seg_->slot(set, r); }

  // Streams (see RunBroadcast). The root sets its progress to `value` and
  // wakes the readers waiting for it.
  void PublishRoot(uint64_t value) {
    Atomic(seg_->ctl(b_->rank()).progress).store(value);
    SegmentHeader& h = seg_->header();
    Atomic(h.root_events).fetch_add(1);
    if (Atomic(h.root_sleepers).load() > 0) FutexWakeAll(&h.root_events);
  }
  // A reader sets its progress to `value`; it wakes the root only when the
  // root sleeps and every reader has reached what it waits for. (Of readers
  // publishing at once, the last to store sees the others' progress, as all
  // these accesses are sequentially consistent.)
  void PublishReader(uint64_t value, int root) {
    Atomic(seg_->ctl(b_->rank()).progress).store(value);
    SegmentHeader& h = seg_->header();
    if (Atomic(h.reader_sleepers).load() == 0) return;
    const uint64_t wants = Atomic(h.root_wants).load();
    for (int r = 0; r < b_->size(); ++r) {
      if (r != root && Progress(r) < wants) return;
    }
    Atomic(h.reader_events).fetch_add(1);
    FutexWakeAll(&h.reader_events);
  }
  uint64_t Progress(int r) { return Atomic(seg_->ctl(r).progress).load(); }
  // A reader waits until the root's progress reaches `value`.
  absl::Status WaitForRoot(int root, uint64_t value) {
    SegmentHeader& h = seg_->header();
    auto late = [this, root, value](int r) {
      return r == root && Progress(r) < value;
    };
    return WaitUntil(
        &h.root_events, &h.root_sleepers, [&late, root] { return !late(root); },
        late, "keep up with the broadcast");
  }
  // The root waits until every reader's progress reaches `value`.
  absl::Status WaitForReaders(uint64_t value) {
    SegmentHeader& h = seg_->header();
    // Before announcing a sleep (in WaitUntil): a reader that sees the
    // sleep sees this.
    Atomic(h.root_wants).store(value);
    auto late = [this, value](int r) {
      return r != b_->rank() && Progress(r) < value;
    };
    return WaitUntil(
        &h.reader_events, &h.reader_sleepers,
        [this, &late] {
          for (int r = 0; r < b_->size(); ++r) {
            if (late(r)) return false;
          }
          return true;
        },
        late, "keep up with the broadcast");
  }

 private:
  absl::Status CheckSignatures(uint64_t set) {
    std::vector<std::string> invalid;
    for (int r = 0; r < b_->size(); ++r) {
      if (seg_->ctl(r).sig[set].valid == 0) invalid.push_back(absl::StrCat(r));
    }
    if (!invalid.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank(s) ", absl::StrJoin(invalid, ", "),
                       " passed invalid arguments to this call (see their "
                       "errors)"));
    }
    for (int r = 0; r < b_->size(); ++r) {
      const Signature& other = seg_->ctl(r).sig[set];
      if (!Matches(other, op_->sig)) {
        return absl::InvalidArgumentError(
            absl::StrCat("arguments differ between ranks: rank ", b_->rank(),
                         " called ", SignatureText(op_->sig), ", rank ", r,
                         " called ", SignatureText(other)));
      }
    }
    return absl::OkStatus();
  }

  uint32_t Goal(uint64_t target) const {
    return static_cast<uint32_t>(b_->size()) * static_cast<uint32_t>(target);
  }

  absl::Status WaitAll(uint64_t target) {
    SegmentHeader& h = seg_->header();
    const uint32_t goal = Goal(target);
    return WaitUntil(
        &h.arrivals, &h.sleepers,
        [&h, goal] {
          return static_cast<int32_t>(
                     Atomic(h.arrivals).load(std::memory_order_acquire) -
                     goal) >= 0;
        },
        [this, target](int r) {
          return Atomic(seg_->ctl(r).arrived).load(std::memory_order_acquire) <
                 target;
        },
        "arrive");
  }

  // Spins briefly (see SpinLimit), then sleeps on the futex `word` (which
  // whoever makes progress bumps before looking at `sleepers`), waking at
  // least every kLivenessPeriod to check the deadline, the segment's failure
  // flag and whether the late ranks' processes (late(r)) still exist. `what`
  // the late ranks failed to do, for the DeadlineExceeded message.
  template <typename Done, typename Late>
  absl::Status WaitUntil(uint32_t* word, uint32_t* sleepers, Done done,
                         Late late, absl::string_view what) {
    SegmentHeader& h = seg_->header();
    for (int spin = 0; spin < b_->spin_limit_; ++spin) {
      if (done()) return absl::OkStatus();
      CpuRelax();
    }
    absl::Time next_check = absl::Now() + kLivenessPeriod;
    for (;;) {
      // Announce the sleep before the last look, so a rank making progress
      // (which bumps `word`, then reads `sleepers`) cannot miss us.
      Atomic(*sleepers).fetch_add(1);
      const uint32_t seen = Atomic(*word).load();
      if (!done() && Atomic(h.failed).load() == 0) {
        const absl::Time now = absl::Now();
        FutexWait(word, seen,
                  std::max(absl::ZeroDuration(),
                           std::min(next_check, deadline_) - now));
      }
      Atomic(*sleepers).fetch_sub(1);
      if (done()) return absl::OkStatus();
      const uint32_t failed = Atomic(h.failed).load(std::memory_order_acquire);
      if (failed != 0) {
        // Fail as the first rank did (same code), naming it.
        return absl::Status(
            static_cast<absl::StatusCode>(failed >> 16),
            absl::StrCat("rank ", (failed & 0xFFFF) - 1,
                         " saw a rank of this group exit (see its error)"));
      }
      const absl::Time now = absl::Now();
      if (now >= deadline_) return GiveUp(late, /*dead=*/-1, what);
      if (now >= next_check) {
        next_check = now + kLivenessPeriod;
        for (int r = 0; r < b_->size(); ++r) {
          if (late(r) && !ProcessAlive(seg_->ctl(r).pid)) {
            return GiveUp(late, r, what);
          }
        }
      }
    }
  }

  template <typename Late>
  absl::Status GiveUp(Late late, int dead, absl::string_view what) {
    if (dead >= 0) {
      // A dead rank never arrives: tell the others at once. (A timeout is
      // not shared: each rank's own timeout bounds its wait.)
      uint32_t expected = 0;
      SegmentHeader& h = seg_->header();
      Atomic(h.failed).compare_exchange_strong(
          expected,
          (static_cast<uint32_t>(absl::StatusCode::kUnavailable) << 16) |
              static_cast<uint32_t>(b_->rank() + 1));
      FutexWakeAll(&h.arrivals);
      FutexWakeAll(&h.root_events);
      FutexWakeAll(&h.reader_events);
      return absl::UnavailableError(
          absl::StrCat("rank ", dead, " (pid ", seg_->ctl(dead).pid,
                       ") exited during the operation"));
    }
    std::vector<int> slow;
    for (int r = 0; r < b_->size(); ++r) {
      if (late(r)) slow.push_back(r);
    }
    return absl::DeadlineExceededError(
        absl::StrCat("rank(s) ", absl::StrJoin(slow, ", "), " did not ", what,
                     " within ", absl::FormatDuration(op_->timeout)));
  }

  ShmBackend* b_;
  Segment* seg_;
  Op* op_;
  absl::Time deadline_;
  bool first_ = true;
};

absl::StatusOr<ShmBackendOptions> ShmBackendOptions::FromMap(
    const std::map<std::string, std::string>& options) {
  ShmBackendOptions out;
  if (auto it = options.find("shm_slot_bytes"); it != options.end()) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(it->second, &v) || v < 4096 ||
        v > (int64_t{1} << 30)) {
      return absl::InvalidArgumentError(
          absl::StrCat("shm option shm_slot_bytes: '", it->second,
                       "' is not in [4096, 2^30]"));
    }
    out.slot_bytes = static_cast<size_t>(v);
  }
  if (auto it = options.find("shm_name_prefix"); it != options.end()) {
    if (it->second.empty() || it->second[0] != '/' ||
        it->second.find('/', 1) != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("shm option shm_name_prefix: '", it->second,
                       "' must start with '/' and contain no other '/'"));
    }
    out.name_prefix = it->second;
  }
  if (auto it = options.find("shm_broadcast"); it != options.end()) {
    if (it->second == "auto") {
      out.broadcast = Broadcast::kAuto;
    } else if (it->second == "stream") {
      out.broadcast = Broadcast::kStream;
    } else if (it->second == "rounds") {
      out.broadcast = Broadcast::kRounds;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("shm option shm_broadcast: '", it->second,
                       "' is not one of auto, stream, rounds"));
    }
  }
  if (auto it = options.find("shm_threads"); it != options.end()) {
    if (!absl::SimpleAtoi(it->second, &out.threads) || out.threads < 0 ||
        out.threads > 256) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shm option shm_threads: '", it->second, "' is not in [0, 256]"));
    }
  }
  for (auto [key, field, low] :
       {std::tuple{"shm_streaming_store_bytes", &out.streaming_store_bytes,
                   int64_t{-1}},
        std::tuple{"shm_chunk_bytes", &out.chunk_bytes, int64_t{0}},
        std::tuple{"shm_team_part_bytes", &out.team_part_bytes, int64_t{64}}}) {
    auto it = options.find(key);
    if (it == options.end()) continue;
    if (!absl::SimpleAtoi(it->second, field) || *field < low ||
        *field > (int64_t{1} << 40)) {
      return absl::InvalidArgumentError(
          absl::StrCat("shm option ", key, ": '", it->second, "' is not in [",
                       low, ", 2^40]"));
    }
  }
  return out;
}

namespace {

// Every rank's host identity; FailedPrecondition unless they are all equal.
absl::Status CheckSameHost(Store& store, int rank, int size,
                           absl::Duration timeout) {
  const std::string mine = HostIdentity();
  RETURN_IF_ERROR(store.Set(absl::StrCat("host/", rank), mine));
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back(absl::StrCat("host/", r));
  RETURN_IF_ERROR(store.Wait(keys, timeout));
  // Every rank's identity in one round trip, not one Get per rank.
  ASSIGN_OR_RETURN(std::vector<std::string> others, store.MultiGet(keys));
  for (int r = 0; r < size; ++r) {
    if (mine.empty() || others[r] != mine) {
      return absl::FailedPreconditionError(
          absl::StrCat("shm: rank ", r,
                       " is not on the host (shared-memory namespace) of "
                       "rank ",
                       rank));
    }
  }
  return absl::OkStatus();
}

// Creates (rank 0) or opens the named segment and maps it. Creating, `*bytes`
// is the size to make (allocated at once, so a full /dev/shm fails here, not
// with SIGBUS later); opening, it is set to the segment's size.
absl::Status MapSegment(const std::string& name, bool create, size_t* bytes,
                        char** base) {
  int fd = create ? ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600)
                  : ::shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) return absl::UnavailableError(ErrnoText("shm_open", name));
  struct stat st {};
  absl::Status status;
  int err = 0;
  if (create && ::ftruncate(fd, static_cast<off_t>(*bytes)) != 0) {
    status = absl::UnavailableError(ErrnoText("ftruncate", name));
  } else if (create && (err = ::posix_fallocate(
                            fd, 0, static_cast<off_t>(*bytes))) != 0) {
    status = absl::UnavailableError(
        absl::StrCat("cannot allocate ", *bytes, " bytes for shm segment ",
                     name, " (is /dev/shm full?): ", std::strerror(err)));
  } else if (::fstat(fd, &st) != 0 || st.st_size <= 0 ||
             (create && static_cast<size_t>(st.st_size) != *bytes)) {
    status = absl::InternalError(absl::StrCat("shm segment ", name, " has ",
                                              st.st_size, " bytes, expected ",
                                              *bytes));
  } else {
    *bytes = static_cast<size_t>(st.st_size);
    void* p =
        ::mmap(nullptr, *bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      status = absl::UnavailableError(ErrnoText("mmap", name));
    } else {
      *base = static_cast<char*>(p);
    }
  }
  ::close(fd);
  if (!status.ok() && create) ::shm_unlink(name.c_str());
  return status;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ShmBackend>> ShmBackend::Create(
    std::shared_ptr<Store> store, int rank, int size, absl::Duration timeout,
    ShmBackendOptions options, std::unique_ptr<Backend> fallback) {
  if (store == nullptr || size < 1 || rank < 0 || rank >= size ||
      timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ShmBackend::Create: needs a store, rank in [0, size) and a positive "
        "timeout (rank ",
        rank, ", size ", size, ")"));
  }
  if (fallback != nullptr &&
      (fallback->rank() != rank || fallback->size() != size)) {
    return absl::InvalidArgumentError(
        "ShmBackend::Create: the fallback's rank/size differ");
  }
  options.slot_bytes = std::max<size_t>(RoundUp(options.slot_bytes, 64), 64);
  const std::string where =
      absl::StrCat("shm rendezvous of rank ", rank, " of ", size, " through ",
                   store->Describe());
  RETURN_IF_ERROR(Annotate(CheckSameHost(*store, rank, size, timeout), where));
  auto seg = std::make_unique<Segment>();
  seg->size = size;
  std::string name;
  if (rank == 0) {
    std::random_device rd;
    name = absl::StrCat(options.name_prefix, "-", ::getpid(), "-",
                        absl::Hex(uint64_t{rd()} << 32 | rd()));
    seg->slot_bytes = ScaledSlotBytes(options, size);
    seg->bytes = Segment::Layout(size, seg->slot_bytes, &seg->data_offset);
    RETURN_IF_ERROR(
        Annotate(MapSegment(name, true, &seg->bytes, &seg->base), where));
    SegmentHeader& h = seg->header();
    h.size = size;
    h.slot_bytes = seg->slot_bytes;
    h.option_slot_bytes = options.slot_bytes;
    h.broadcast = BroadcastMode(options.broadcast, size);
    Atomic(h.magic).store(kMagic, std::memory_order_release);
    absl::Status published = store->Set("segment", name);
    if (!published.ok()) {
      ::shm_unlink(name.c_str());
      return Annotate(published, where);
    }
  } else {
    absl::Status waited = store->Wait({std::string("segment")}, timeout);
    if (!waited.ok()) return Annotate(waited, where);
    absl::StatusOr<std::string> published = store->Get("segment");
    if (!published.ok()) return Annotate(published.status(), where);
    name = *published;
    RETURN_IF_ERROR(
        Annotate(MapSegment(name, false, &seg->bytes, &seg->base), where));
    if (seg->bytes < kHeaderBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": segment ", name, " has only ", seg->bytes, " bytes"));
    }
    SegmentHeader& h = seg->header();
    if (Atomic(h.magic).load(std::memory_order_acquire) != kMagic ||
        h.size != size || h.option_slot_bytes != options.slot_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": segment ", name, " was made for ", h.size,
                       " ranks x ", h.option_slot_bytes,
                       " bytes per slot (options must match on every rank)"));
    }
    seg->slot_bytes = h.slot_bytes;
    if (Segment::Layout(size, seg->slot_bytes, &seg->data_offset) !=
        seg->bytes) {
      return absl::InternalError(
          absl::StrCat(where, ": segment ", name, " has ", seg->bytes,
                       " bytes, not what its header describes"));
    }
    if (options.broadcast != ShmBackendOptions::Broadcast::kAuto &&
        BroadcastMode(options.broadcast, size) != h.broadcast) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": shm_broadcast differs from rank 0's (",
                       h.broadcast == kBroadcastStream ? "stream" : "rounds",
                       "); options must match on every rank"));
    }
  }
  seg->ctl(rank).pid = ::getpid();
  const uint32_t attached =
      Atomic(seg->header().attached).fetch_add(1, std::memory_order_acq_rel) +
      1;
  if (attached == static_cast<uint32_t>(size)) ::shm_unlink(name.c_str());
  const absl::Time deadline = absl::Now() + timeout;
  while (Atomic(seg->header().attached).load(std::memory_order_acquire) <
         static_cast<uint32_t>(size)) {
    if (absl::Now() >= deadline) {
      ::shm_unlink(name.c_str());  // Nobody else will.
      return absl::DeadlineExceededError(absl::StrCat(
          where, ": not every rank attached to the segment within ",
          absl::FormatDuration(timeout)));
    }
    absl::SleepFor(absl::Microseconds(200));
  }
  return std::unique_ptr<ShmBackend>(
      new ShmBackend(rank, size, timeout, std::move(options), std::move(seg),
                     std::move(name), std::move(fallback)));
}

ShmBackend::ShmBackend(int rank, int size, absl::Duration timeout,
                       ShmBackendOptions options,
                       std::unique_ptr<Segment> segment,
                       std::string segment_name,
                       std::unique_ptr<Backend> fallback)
    : Backend("shm", rank, size, timeout),
      options_(std::move(options)),
      segment_(std::move(segment)),
      segment_name_(std::move(segment_name)),
      fallback_(std::move(fallback)),
      team_(std::make_unique<CopyTeam>(
          TeamThreads(options_, size), absl::StrCat("shm", rank),
          static_cast<size_t>(options_.team_part_bytes))),
      core_per_rank_(Cpus() >= size),
      spin_limit_(SpinLimit(core_per_rank_)),
      stream_broadcast_(segment_->header().broadcast == kBroadcastStream),
      chunk_bytes_(
          std::min<int64_t>(options_.chunk_bytes > 0 ? options_.chunk_bytes
                            : core_per_rank_ ? kChunkBytes * team_->threads()
                                             : segment_->slot_bytes,
                            segment_->slot_bytes)),
      streaming_store_bytes_(StreamingStoreBytes(options_, core_per_rank_)) {
  ThreadPoolExecutor::Options o;
  o.name = absl::StrCat("shm-rank", rank);
  o.num_threads = 1;  // One at a time, in issue order.
  o.max_queue = size_t{1} << 20;
  runner_ = std::make_unique<ThreadPoolExecutor>(o);
}

size_t ShmBackend::slot_bytes() const { return segment_->slot_bytes; }
int ShmBackend::threads() const { return team_->threads(); }

ShmBackend::~ShmBackend() {
  // Queued operations complete with Cancelled; the running one finishes
  // (bounded by its timeout).
  runner_->Shutdown(ThreadPoolExecutor::ShutdownMode::kCancelPending)
      .IgnoreError();
}

namespace {

absl::StatusOr<std::unique_ptr<Backend>> MakeGloo(const BackendConfig& c) {
  std::map<std::string, std::string> rest;
  for (const auto& [k, v] : c.options) {
    if (k != "shm" && k.rfind("shm_", 0) != 0) rest[k] = v;
  }
  BackendConfig gloo = c;
  gloo.options = std::move(rest);
  return GlooBackend::Factory()(gloo);
}

absl::StatusOr<std::unique_ptr<ShmBackend>> MakeShm(
    const BackendConfig& c, std::unique_ptr<Backend> fallback) {
  ASSIGN_OR_RETURN(ShmBackendOptions o, ShmBackendOptions::FromMap(c.options));
  return ShmBackend::Create(std::make_shared<PrefixStore>("shm", c.store),
                            c.rank, c.size, c.timeout, std::move(o),
                            std::move(fallback));
}

}  // namespace

BackendFactory ShmBackend::Factory() {
  return
      [](const BackendConfig& c) -> absl::StatusOr<std::unique_ptr<Backend>> {
        ASSIGN_OR_RETURN(std::unique_ptr<Backend> gloo, MakeGloo(c));
        ASSIGN_OR_RETURN(std::unique_ptr<ShmBackend> shm,
                         MakeShm(c, std::move(gloo)));
        return std::unique_ptr<Backend>(std::move(shm));
      };
}

BackendFactory ShmBackend::AutoFactory() {
  return
      [](const BackendConfig& c) -> absl::StatusOr<std::unique_ptr<Backend>> {
        bool use_shm = true;
        if (auto it = c.options.find("shm"); it != c.options.end()) {
          if (!absl::SimpleAtob(it->second, &use_shm)) {
            return absl::InvalidArgumentError(absl::StrCat(
                "option shm: '", it->second, "' is not a boolean"));
          }
        } else if (GetEnv("FERRY_C10D_SHM") == "0") {
          use_shm = false;
        }
        if (!use_shm || c.size < 2) return MakeGloo(c);
        // Decide before gloo's rendezvous (it cannot run twice on one store);
        // every rank reads the same identities, so all decide alike.
        auto shm_store = std::make_shared<PrefixStore>("shm", c.store);
        absl::Status same =
            CheckSameHost(*shm_store, c.rank, c.size, c.timeout);
        if (absl::IsFailedPrecondition(same)) return MakeGloo(c);
        RETURN_IF_ERROR(same);
        ASSIGN_OR_RETURN(std::unique_ptr<Backend> gloo, MakeGloo(c));
        ASSIGN_OR_RETURN(std::unique_ptr<ShmBackend> shm,
                         MakeShm(c, std::move(gloo)));
        return std::unique_ptr<Backend>(std::move(shm));
      };
}

// --- Queue -------------------------------------------------------------------

std::shared_ptr<Work> ShmBackend::Enqueue(
    OpType type, Signature sig, absl::Status local,
    const std::optional<absl::Duration>& timeout,
    absl::AnyInvocable<absl::Status(Round&)> run) {
  auto op = std::make_shared<Op>();
  sig.op = static_cast<int64_t>(type);
  sig.valid = local.ok() ? 1 : 0;
  op->type = type;
  op->local = CopyStatus(local);
  op->timeout = TimeoutOr(timeout);
  op->run = std::move(run);
  // Sequence numbers and queue order must agree: both under mu_.
  MutexLock lock(&mu_);
  sig.seq = next_seq_++;
  op->sig = sig;
  op->work =
      std::make_shared<Work>(absl::StrCat(Describe(type), " #", sig.seq));
  std::shared_ptr<Work> work = op->work;
  absl::Status submitted =
      runner_->Submit([this, op] { Execute(*op); },
                      [op](const absl::Status&) {
                        op->work->Complete(absl::CancelledError(absl::StrCat(
                            op->work->description(),
                            ": the backend was destroyed before it ran")));
                      });
  if (!submitted.ok()) work->Complete(Annotate(submitted, work->description()));
  return work;
}

void ShmBackend::Execute(Op& op) {
  absl::Status broken;
  {
    MutexLock lock(&mu_);
    broken = broken_;
  }
  absl::Status status;
  if (!broken.ok()) {
    status = absl::FailedPreconditionError(
        absl::StrCat(op.work->description(),
                     ": the shm backend is unusable after an earlier failure (",
                     broken.message(), "); create a new process group"));
  } else {
    status = Annotate(RunOp(op), op.work->description());
    if (!status.ok() && !absl::IsInvalidArgument(status)) {
      MutexLock lock(&mu_);
      if (broken_.ok()) broken_ = CopyStatus(status);
    }
  }
  op.work->Complete(std::move(status));
}

absl::Status ShmBackend::RunOp(Op& op) {
  Round round(this, &op);
  if (!op.local.ok()) {
    // Still take part in the first round, so the others learn of it.
    absl::Status arrived = round.Arrive();
    round.Next();
    if (!arrived.ok() && !absl::IsInvalidArgument(arrived)) return arrived;
    return op.local;
  }
  return op.run(round);
}

ArgChecks ShmBackend::Checks() const {
  return ArgChecks("shm", DeviceType::kCPU, rank(), size());
}

// --- Collectives -------------------------------------------------------------

namespace {

ShmBackend::Signature TensorSignature(const Tensor& t) {
  ShmBackend::Signature s;
  if (t.defined()) {
    s.dtype = static_cast<int64_t>(t.dtype());
    s.count = t.numel();
  }
  return s;
}

// Pieces of `total` units, at most `cap` each; at least one (possibly empty)
// piece so the signature round always runs.
template <typename Fn>
absl::Status ForEachPiece(int64_t total, int64_t cap, Fn fn) {
  int64_t off = 0;
  do {
    const int64_t len = std::min(cap, total - off);
    RETURN_IF_ERROR(fn(off, len));
    off += len;
  } while (off < total);
  return absl::OkStatus();
}

}  // namespace

std::shared_ptr<Work> ShmBackend::Allreduce(Tensor tensor,
                                            const AllreduceOptions& options) {
  constexpr OpType kOp = OpType::kAllreduce;
  absl::Status local = Checks().One(kOp, tensor, "tensor");
  absl::StatusOr<ReduceFn> fn = absl::UnknownError("unset");
  if (local.ok()) {
    fn = GetReduceFn(tensor.dtype(), options.op);
    if (!fn.ok()) local = fn.status();
  }
  Signature sig = TensorSignature(tensor);
  sig.reduce_op = static_cast<int64_t>(options.op);
  const ReduceOp rop = options.op;
  return Enqueue(
      kOp, sig, local, options.timeout,
      [this, tensor, rop,
       fn = fn.value_or(nullptr)](Round& round) mutable -> absl::Status {
        const int n = size();
        const size_t isz = tensor.itemsize();
        char* data = static_cast<char*>(tensor.data_ptr());
        const int64_t cap = static_cast<int64_t>(round.slot_bytes() / isz);
        std::vector<const char*> src(n);
        std::vector<CopyTeam::Move> out(n);
        RETURN_IF_ERROR(ForEachPiece(
            tensor.numel(), cap, [&](int64_t off, int64_t len) -> absl::Status {
              // Rank q reduces element range q of the piece; its own part of
              // that range it reads from its tensor, so it publishes only
              // the other ranges, and writes the result into range q of its
              // own slot, where every rank copies it from.
              auto lo = [&](int q) { return len * q / n; };
              char* in = data + off * isz;
              const int me = rank();
              const CopyTeam::Move publish[] = {
                  {round.mine(), in, lo(me) * isz},
                  {round.mine() + lo(me + 1) * isz, in + lo(me + 1) * isz,
                   (len - lo(me + 1)) * isz}};
              team_->Copy(publish);
              absl::Status s = round.Arrive();
              if (!s.ok()) {
                round.Next();
                return s;
              }
              for (int q = 0; q < n; ++q) {
                src[q] = (q == me ? in : round.slot(q)) + lo(me) * isz;
                out[q] = {in + lo(q) * isz, round.slot(q) + lo(q) * isz,
                          (lo(q + 1) - lo(q)) * isz};
              }
              team_->Reduce(fn, round.mine() + lo(me) * isz, src,
                            lo(me + 1) - lo(me), isz);
              s = round.Barrier();
              if (s.ok()) team_->Copy(out);
              round.Next();
              return s;
            }));
        if (rop == ReduceOp::kAvg) FinishAverage(tensor, n);
        return absl::OkStatus();
      });
}

std::shared_ptr<Work> ShmBackend::Broadcast(Tensor tensor,
                                            const BroadcastOptions& options) {
  constexpr OpType kOp = OpType::kBroadcast;
  absl::Status local = Checks().Rooted(kOp, tensor, "tensor", options.root);
  Signature sig = TensorSignature(tensor);
  sig.root = options.root;
  const int root = options.root;
  return Enqueue(kOp, sig, local, options.timeout,
                 [this, tensor, root](Round& round) -> absl::Status {
                   return RunBroadcast(
                       round, static_cast<char*>(tensor.data_ptr()),
                       static_cast<int64_t>(tensor.nbytes()), root);
                 });
}

// A tensor that fits a slot takes one round: the root copies it in, the
// others copy it out after the barrier. A larger one runs as rank 0 chose
// (stream_broadcast_, the same on every rank): streamed
// (RunStreamedBroadcast) or in rounds of a slot: the root copies piece k
// into its slot of the round's set and arrives; the others copy it out after
// the barrier while the root fills the other set with piece k + 1. Rounds
// are the default with more ranks than cores: on the quiet 2-CPU VM, 4-rank
// broadcasts of 16 and 64 MiB ran 4.1x and 3.8x PyTorch Gloo's speed in
// rounds but 2.85x and 2.67x streamed (bench/c10d), while 2 ranks gained
// from streaming.
absl::Status ShmBackend::RunBroadcast(Round& round, char* data, int64_t total,
                                      int root) {
  const int64_t slot = static_cast<int64_t>(round.slot_bytes());
  const bool is_root = rank() == root;
  const bool large =
      streaming_store_bytes_ > 0 && total >= streaming_store_bytes_;
  if (total > slot && stream_broadcast_) {
    return RunStreamedBroadcast(round, data, total, root, large);
  }
  return ForEachPiece(total, slot,
                      [&](int64_t off, int64_t len) -> absl::Status {
                        if (is_root) team_->Copy(round.mine(), data + off, len);
                        absl::Status s = round.Arrive();
                        if (s.ok() && !is_root) {
                          team_->Copy(data + off, round.slot(root), len, large);
                        }
                        round.Next();
                        return s;
                      });
}

// The root's two slots are a ring of chunks: the root copies the first
// slot's worth in before the signature round, then chunk after chunk,
// publishing how far it got in its `progress`; each reader copies out what
// is published and publishes how far it copied; the root reuses ring space
// once every reader is past it. Root copy-in and reader copy-out thus
// overlap a chunk apart with no barrier per piece. The root returns once
// every reader has copied everything, so its slots are free for the next
// operation (the readers' slots are not used).
absl::Status ShmBackend::RunStreamedBroadcast(Round& round, char* data,
                                              int64_t total, int root,
                                              bool large) {
  const int64_t slot = static_cast<int64_t>(round.slot_bytes());
  const bool is_root = rank() == root;
  const uint64_t set0 = round.set();
  if (is_root) team_->Copy(round.slot_in(set0, root), data, slot);
  absl::Status s = round.Arrive();
  round.Next();
  if (!s.ok()) return s;
  // Stream position p lives in the root's slot of set (set0 + p / slot) % 2;
  // chunks never straddle a slot.
  auto at = [&](int64_t p) {
    return round.slot_in((set0 + p / slot) % 2, root) + p % slot;
  };
  auto chunk_at = [&](int64_t p, int64_t limit) {
    return std::min({chunk_bytes_, slot - p % slot, limit - p});
  };
  const uint64_t base = streamed_;
  int64_t done = is_root ? slot : 0;
  if (is_root) {
    round.PublishRoot(base + done);
    while (done < total) {
      const int64_t len = chunk_at(done, total);
      if (done + len > 2 * slot) {
        RETURN_IF_ERROR(round.WaitForReaders(base + done + len - 2 * slot));
      }
      team_->Copy(at(done), data + done, len);
      done += len;
      round.PublishRoot(base + done);
    }
    RETURN_IF_ERROR(round.WaitForReaders(base + total));
  } else {
    int64_t avail = slot;
    while (done < total) {
      if (done == avail) {
        RETURN_IF_ERROR(round.WaitForRoot(root, base + done + 1));
        avail = std::min<int64_t>(total, round.Progress(root) - base);
      }
      const int64_t len = chunk_at(done, avail);
      team_->Copy(data + done, at(done), len, large);
      done += len;
      round.PublishReader(base + done, root);
    }
  }
  streamed_ += total;
  return absl::OkStatus();
}

std::shared_ptr<Work> ShmBackend::Allgather(std::vector<Tensor> outputs,
                                            Tensor input,
                                            const AllgatherOptions& options) {
  absl::Status local =
      Checks().WithList(OpType::kAllgather, input, "input", outputs, "outputs");
  return EnqueueAllgather(OpType::kAllgather, std::move(outputs), Tensor(),
                          std::move(input), local, options);
}

std::shared_ptr<Work> ShmBackend::AllgatherIntoTensor(
    Tensor output, Tensor input, const AllgatherOptions& options) {
  constexpr OpType kOp = OpType::kAllgatherIntoTensor;
  absl::Status local = Checks().Flat(kOp, output, "output", input, "input");
  return EnqueueAllgather(kOp, {}, std::move(output), std::move(input), local,
                          options);
}

std::shared_ptr<Work> ShmBackend::EnqueueAllgather(
    OpType op, std::vector<Tensor> outs, Tensor flat_out, Tensor input,
    absl::Status local, const AllgatherOptions& options) {
  return Enqueue(
      op, TensorSignature(input), local, options.timeout,
      [this, outs = std::move(outs), flat_out,
       input](Round& round) -> absl::Status {
        const size_t nbytes = input.nbytes();
        const char* in = static_cast<const char*>(input.data_ptr());
        auto dest = [&](int r) -> char* {
          return outs.empty()
                     ? static_cast<char*>(flat_out.data_ptr()) + r * nbytes
                     : static_cast<char*>(outs[r].data_ptr());
        };
        std::vector<CopyTeam::Move> out(size());
        return ForEachPiece(static_cast<int64_t>(nbytes),
                            static_cast<int64_t>(round.slot_bytes()),
                            [&](int64_t off, int64_t len) -> absl::Status {
                              team_->Copy(round.mine(), in + off, len);
                              absl::Status s = round.Arrive();
                              if (s.ok()) {
                                for (int r = 0; r < size(); ++r) {
                                  out[r] = {dest(r) + off, round.slot(r),
                                            static_cast<size_t>(len)};
                                }
                                team_->Copy(out);
                              }
                              round.Next();
                              return s;
                            });
      });
}

std::shared_ptr<Work> ShmBackend::ReduceScatter(
    Tensor output, std::vector<Tensor> inputs,
    const ReduceScatterOptions& options) {
  absl::Status local = Checks().WithList(OpType::kReduceScatter, output,
                                         "output", inputs, "inputs");
  return EnqueueReduceScatter(OpType::kReduceScatter, std::move(output),
                              std::move(inputs), local, options);
}

std::shared_ptr<Work> ShmBackend::ReduceScatterTensor(
    Tensor output, Tensor input, const ReduceScatterOptions& options) {
  constexpr OpType kOp = OpType::kReduceScatterTensor;
  absl::Status local = Checks().Flat(kOp, input, "input", output, "output");
  return EnqueueReduceScatter(kOp, std::move(output), {std::move(input)}, local,
                              options);
}

std::shared_ptr<Work> ShmBackend::EnqueueReduceScatter(
    OpType op, Tensor output, std::vector<Tensor> inputs, absl::Status local,
    const ReduceScatterOptions& options) {
  absl::StatusOr<ReduceFn> fn = absl::UnknownError("unset");
  if (local.ok()) {
    fn = GetReduceFn(output.dtype(), options.op);
    if (!fn.ok()) local = fn.status();
  }
  Signature sig = TensorSignature(output);
  sig.reduce_op = static_cast<int64_t>(options.op);
  const ReduceOp rop = options.op;
  return Enqueue(
      op, sig, local, options.timeout,
      [this, output, inputs = std::move(inputs), rop,
       fn = fn.value_or(nullptr)](Round& round) mutable -> absl::Status {
        const int n = size();
        const size_t isz = output.itemsize();
        const int64_t numel = output.numel();
        // One input per destination (list form) or one flat input.
        auto src = [&](int d) -> const char* {
          return inputs.size() == 1 && n > 1
                     ? static_cast<const char*>(inputs[0].data_ptr()) +
                           d * numel * isz
                     : static_cast<const char*>(inputs[d].data_ptr());
        };
        char* out = static_cast<char*>(output.data_ptr());
        const int64_t cap =
            std::max<int64_t>(1, round.slot_bytes() / (isz * n));
        std::vector<const char*> from(n);
        std::vector<CopyTeam::Move> publish;
        // An output overlapping this rank's own input chunk (in-place use)
        // would be overwritten while read: then that chunk goes through the
        // slot too.
        const char* own = src(rank());
        const bool aliased = out < own + numel * isz && out + numel * isz > own;
        RETURN_IF_ERROR(ForEachPiece(
            numel, cap, [&](int64_t off, int64_t len) -> absl::Status {
              // Every chunk but this rank's own goes to the slot; the own
              // one is read from the input while reducing.
              const int me = rank();
              publish.clear();
              for (int d = 0; d < n; ++d) {
                if (d == me && !aliased) continue;
                publish.push_back({round.mine() + d * len * isz,
                                   src(d) + off * isz,
                                   static_cast<size_t>(len) * isz});
              }
              team_->Copy(publish);
              absl::Status s = round.Arrive();
              if (s.ok() && len > 0) {
                for (int q = 0; q < n; ++q) {
                  from[q] = q == me && !aliased
                                ? src(me) + off * isz
                                : round.slot(q) + me * len * isz;
                }
                team_->Reduce(fn, out + off * isz, from, len, isz);
              }
              round.Next();
              return s;
            }));
        if (rop == ReduceOp::kAvg) FinishAverage(output, n);
        return absl::OkStatus();
      });
}

std::shared_ptr<Work> ShmBackend::AlltoallSingle(
    Tensor output, Tensor input, const AlltoallSingleOptions& options) {
  constexpr OpType kOp = OpType::kAlltoallSingle;
  std::vector<int64_t> out_rows, in_rows;
  absl::Status local =
      Checks().AlltoallSingle(output, input, options, &out_rows, &in_rows);
  Signature sig;
  int64_t row_bytes = 0;
  if (local.ok()) {
    // Ranks must agree on the dtype and the row's element count; the split
    // sizes travel in the first round's slots.
    const int64_t per_row = ElementsPerRow(input);
    sig.dtype = static_cast<int64_t>(input.dtype());
    sig.count = per_row;
    row_bytes = per_row * static_cast<int64_t>(input.itemsize());
  }
  return Enqueue(
      kOp, sig, local, options.timeout,
      [this, output, input, out_rows = std::move(out_rows),
       in_rows = std::move(in_rows), row_bytes](Round& round) -> absl::Status {
        // An output overlapping the input would be overwritten while later
        // rounds still read the input: send from a copy then.
        const Tensor from = SharesBytes(output, input) ? input.clone() : input;
        const int n = size();
        std::vector<const char*> src(n);
        std::vector<char*> dst(n);
        const char* in = static_cast<const char*>(from.data_ptr());
        char* out = static_cast<char*>(output.data_ptr());
        for (int r = 0; r < n; ++r) {
          src[r] = in;
          dst[r] = out;
          in += in_rows[r] * row_bytes;
          out += out_rows[r] * row_bytes;
        }
        return RunAlltoall(round, src, dst, out_rows, in_rows, row_bytes);
      });
}

// The list form: one "row" of a tensor's bytes to and from each rank (the
// tensors are all alike, so the signature's dtype and count cover them).
std::shared_ptr<Work> ShmBackend::Alltoall(std::vector<Tensor> outputs,
                                           std::vector<Tensor> inputs,
                                           const AlltoallOptions& options) {
  constexpr OpType kOp = OpType::kAlltoall;
  absl::Status local = Checks().Alltoall(outputs, inputs);
  Signature sig = local.ok() ? TensorSignature(inputs[0]) : Signature{};
  return Enqueue(
      kOp, sig, local, options.timeout,
      [this, outputs = std::move(outputs),
       inputs = std::move(inputs)](Round& round) mutable -> absl::Status {
        const int n = size();
        const int64_t bytes = static_cast<int64_t>(inputs[0].nbytes());
        bool overlap = false;
        for (const Tensor& o : outputs) {
          for (const Tensor& i : inputs) {
            overlap = overlap || SharesBytes(o, i);
          }
        }
        std::vector<const char*> src(n);
        std::vector<char*> dst(n);
        for (int r = 0; r < n; ++r) {
          if (overlap) inputs[r] = inputs[r].clone();
          src[r] = static_cast<const char*>(inputs[r].data_ptr());
          dst[r] = static_cast<char*>(outputs[r].data_ptr());
        }
        const std::vector<int64_t> ones(n, 1);
        return RunAlltoall(round, src, dst, ones, ones, bytes);
      });
}

// Each round, rank s puts up to `cap` bytes of what it sends rank d at
// slot(s) + header + d * cap; rank d copies them out after the barrier. The
// first round's header carries every rank's split sizes (rows sent to and
// expected from each rank), checked on every rank alike before anything is
// read; it also gives the round count (the longest transfer over `cap`). A
// rank's part for itself is copied directly. src[d] / dst[s]: the bytes for
// rank d / from rank s (in_rows[d] / out_rows[s] rows of `row_bytes`), none
// overlapping another.
absl::Status ShmBackend::RunAlltoall(Round& round,
                                     const std::vector<const char*>& src,
                                     const std::vector<char*>& dst,
                                     const std::vector<int64_t>& out_rows,
                                     const std::vector<int64_t>& in_rows,
                                     int64_t row_bytes) {
  const int n = size();
  const int me = rank();
  const size_t header = RoundUp(2 * n * sizeof(int64_t), 64);
  const int64_t cap = static_cast<int64_t>(
      round.slot_bytes() > header ? (round.slot_bytes() - header) / n / 64 * 64
                                  : 0);
  int64_t out_total = 0;
  for (int r = 0; r < n; ++r) out_total += out_rows[r] * row_bytes;
  const bool large =
      streaming_store_bytes_ > 0 && out_total >= streaming_store_bytes_;
  auto piece = [cap](int64_t total, int64_t k) {
    return std::clamp<int64_t>(total - k * cap, 0, cap);
  };
  int64_t rounds = 1;
  std::vector<CopyTeam::Move> moves;
  for (int64_t k = 0; k < rounds; ++k) {
    if (cap == 0 && n > 1) {
      // Same on every rank (same size and slot): no piece fits a slot.
      return absl::InvalidArgumentError(absl::StrCat(
          "shm slots of ", round.slot_bytes(), " bytes are too small for ", n,
          " ranks' all-to-all (raise shm_slot_bytes)"));
    }
    char* mine = round.mine();
    if (k == 0) {
      std::memcpy(mine, in_rows.data(), n * sizeof(int64_t));
      std::memcpy(mine + n * sizeof(int64_t), out_rows.data(),
                  n * sizeof(int64_t));
    }
    moves.clear();
    for (int d = 0; d < n; ++d) {
      if (d == me) continue;
      moves.push_back({mine + header + d * cap, src[d] + k * cap,
                       static_cast<size_t>(piece(in_rows[d] * row_bytes, k))});
    }
    team_->Copy(moves);
    absl::Status s = round.Arrive();
    if (s.ok() && k == 0) {
      s = CheckAlltoallSplits(round, n, &rounds, cap, row_bytes);
    }
    if (s.ok()) {
      moves.clear();
      for (int from = 0; from < n; ++from) {
        if (from == me) continue;
        moves.push_back(
            {dst[from] + k * cap, round.slot(from) + header + me * cap,
             static_cast<size_t>(piece(out_rows[from] * row_bytes, k))});
      }
      team_->Copy(moves, large);
    }
    round.Next();
    RETURN_IF_ERROR(s);
  }
  team_->Copy(dst[me], src[me], out_rows[me] * row_bytes);
  return absl::OkStatus();
}

// Every rank's split sizes from the first round's headers: what s sends d
// must be what d expects from s. Sets *rounds from the longest transfer.
absl::Status ShmBackend::CheckAlltoallSplits(Round& round, int n,
                                             int64_t* rounds, int64_t cap,
                                             int64_t row_bytes) {
  auto rows = [&](int r, int which, int peer) {
    int64_t v;
    std::memcpy(&v, round.slot(r) + (which * n + peer) * sizeof(int64_t),
                sizeof(v));
    return v;
  };
  int64_t longest = 0;
  for (int src = 0; src < n; ++src) {
    for (int dst = 0; dst < n; ++dst) {
      const int64_t sent = rows(src, 0, dst);
      const int64_t expected = rows(dst, 1, src);
      if (sent != expected) {
        return absl::InvalidArgumentError(absl::StrCat(
            "rank ", src, " sends ", sent, " rows to rank ", dst,
            ", which expects ", expected, " from it (split sizes differ)"));
      }
      if (src != dst) longest = std::max(longest, sent * row_bytes);
    }
  }
  *rounds = cap > 0 ? std::max<int64_t>(1, (longest + cap - 1) / cap) : 1;
  return absl::OkStatus();
}

std::shared_ptr<Work> ShmBackend::Barrier(const BarrierOptions& options) {
  return Enqueue(OpType::kBarrier, Signature{}, absl::OkStatus(),
                 options.timeout, [](Round& round) -> absl::Status {
                   absl::Status s = round.Arrive();
                   round.Next();
                   return s;
                 });
}

// --- Forwarded to the fallback ----------------------------------------------

std::shared_ptr<Work> ShmBackend::Forward(
    OpType op, absl::AnyInvocable<std::shared_ptr<Work>(Backend&)> call) {
  if (fallback_ == nullptr) return Unimplemented(op);
  return call(*fallback_);
}

std::shared_ptr<Work> ShmBackend::Reduce(Tensor t, const ReduceOptions& o) {
  return Forward(OpType::kReduce,
                 [&](Backend& b) { return b.Reduce(std::move(t), o); });
}
std::shared_ptr<Work> ShmBackend::Gather(std::vector<Tensor> outs, Tensor in,
                                         const GatherOptions& o) {
  return Forward(OpType::kGather, [&](Backend& b) {
    return b.Gather(std::move(outs), std::move(in), o);
  });
}
std::shared_ptr<Work> ShmBackend::Scatter(Tensor out, std::vector<Tensor> ins,
                                          const ScatterOptions& o) {
  return Forward(OpType::kScatter, [&](Backend& b) {
    return b.Scatter(std::move(out), std::move(ins), o);
  });
}
std::shared_ptr<Work> ShmBackend::Send(Tensor t, int dst,
                                       const SendOptions& o) {
  return Forward(OpType::kSend,
                 [&](Backend& b) { return b.Send(std::move(t), dst, o); });
}
std::shared_ptr<Work> ShmBackend::Recv(Tensor t, int src,
                                       const RecvOptions& o) {
  return Forward(OpType::kRecv,
                 [&](Backend& b) { return b.Recv(std::move(t), src, o); });
}
std::shared_ptr<Work> ShmBackend::RecvAnysource(Tensor t,
                                                const RecvOptions& o) {
  return Forward(OpType::kRecvAnysource,
                 [&](Backend& b) { return b.RecvAnysource(std::move(t), o); });
}
std::vector<std::shared_ptr<Work>> ShmBackend::BatchIsendIrecv(
    std::vector<P2POp> ops) {
  if (fallback_ != nullptr) return fallback_->BatchIsendIrecv(std::move(ops));
  return Backend::BatchIsendIrecv(std::move(ops));
}
absl::Status ShmBackend::MonitoredBarrier(const MonitoredBarrierOptions& o) {
  if (fallback_ != nullptr) return fallback_->MonitoredBarrier(o);
  return Backend::MonitoredBarrier(o);
}

}  // namespace c10d
}  // namespace ferry
