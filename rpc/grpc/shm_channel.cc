#include "ferry/rpc/grpc/shm_channel.h"

#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <random>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "ferry/common/logging.h"
#include "ferry/common/same_host.h"
#include "ferry/common/status.h"
#include "ferry/store/prefix_store.h"
#include "ferry/tensor/storage.h"

namespace ferry::rpc::grpc_agent {
namespace {

// Bytes and pieces one process_vm_readv moves at most: the kernel caps a
// call at 2 GiB - 1 page, and IOV_MAX is 1024.
constexpr size_t kMaxCallBytes = size_t{1} << 30;
constexpr size_t kMaxIovecs = 512;
// Regions (tensors) one payload may describe; a Value with more tensors
// goes over gRPC, and a descriptor with more is refused as malformed.
constexpr int kMaxRegions = 1 << 16;

// Store keys: "<prefix>/<rank>" (records), "<prefix>/readable/<rank>"
// (static group), "<prefix>/pair/<reader>/<target>" (joiners).
constexpr char kPrefix[] = "rpc/same_host";

std::string PairKey(int reader, int target) {
  return absl::StrCat(kPrefix, "/pair/", reader, "/", target);
}

// Whether worker `reader` published that it can read `target`.
absl::StatusOr<bool> Answered(Store& store, int reader, int target) {
  const std::string key = PairKey(reader, target);
  ASSIGN_OR_RETURN(bool there, store.Check({key}));
  if (!there) return false;
  // Not ASSIGN_OR_RETURN into a string: g++ 12 -O2 then warns
  // (maybe-uninitialized, a false positive) on the comparison.
  absl::StatusOr<std::string> answer = store.Get(key);
  if (!answer.ok()) return answer.status();
  return answer->size() == 1 && answer->front() == '1';
}

bool EnvDisabled() {
  const char* v = std::getenv("FERRY_RPC_SAME_HOST");
  return v != nullptr && std::string(v) == "0";
}

uint64_t RandomNonZero() {
  std::random_device rd;
  uint64_t v = (uint64_t{rd()} << 32) ^ rd();
  return v == 0 ? 1 : v;
}

// Reads `size` bytes at `remote` in `pid` into `local`.
absl::Status ReadWord(pid_t pid, uint64_t remote, uint64_t* local) {
  iovec l{local, sizeof(*local)};
  iovec r{reinterpret_cast<void*>(remote), sizeof(*local)};
  ssize_t n = ::process_vm_readv(pid, &l, 1, &r, 1, 0);
  if (n == static_cast<ssize_t>(sizeof(*local))) return absl::OkStatus();
  return absl::ErrnoToStatus(n < 0 ? errno : EFAULT, "process_vm_readv");
}

absl::Status PeerError(const absl::Status& cause, const std::string& who,
                       pid_t pid) {
  const int e = cause.code() == absl::StatusCode::kNotFound ? ESRCH : 0;
  if (e == ESRCH || !ProcessAlive(pid)) {
    return absl::UnavailableError(
        absl::StrCat("same-host channel: worker '", who, "' (pid ", pid,
                     ") exited before its payload was read"));
  }
  if (cause.code() == absl::StatusCode::kPermissionDenied) {
    return absl::PermissionDeniedError(
        absl::StrCat("same-host channel: reading worker '", who, "' (pid ", pid,
                     ") is not permitted (ptrace access): ", cause.message()));
  }
  return absl::AbortedError(absl::StrCat(
      "same-host channel: the payload of worker '", who, "' (pid ", pid,
      ") is gone (released before it was read): ", cause.message()));
}

}  // namespace

struct alignas(64) SameHostChannel::Slot {
  std::atomic<uint64_t> token{0};  // The live lease's nonce, 0 when free.
  std::atomic<uint64_t> ack{0};    // Written by the reader (another process).
};

struct SameHostChannel::Lease {
  uint64_t nonce = 0;
  std::vector<Tensor> tensors;
  bool held_by_call = false;
  absl::Time expiry;
};

SameHostChannel::SameHostChannel(SameHostOptions options, std::string self_name,
                                 std::shared_ptr<ReceiveBufferPool> pool)
    : options_(std::move(options)),
      self_name_(std::move(self_name)),
      enabled_(options_.enabled && !EnvDisabled() && options_.max_leases > 0),
      probe_value_(RandomNonZero()),
      probe_word_(std::make_unique<uint64_t>(probe_value_)),
      slots_(std::make_unique<Slot[]>(std::max(options_.max_leases, 1))),
      pool_(pool != nullptr ? std::move(pool) : ReceiveBufferPool::Create()),
      next_nonce_(RandomNonZero()) {
  MutexLock lock(&mu_);
  leases_.resize(std::max(options_.max_leases, 1));
  for (int i = options_.max_leases - 1; i >= 0; --i) free_slots_.push_back(i);
}

SameHostChannel::~SameHostChannel() {
  std::vector<std::unique_ptr<Lease>> ending;
  {
    MutexLock lock(&mu_);
    for (size_t i = 0; i < leases_.size(); ++i) {
      slots_[i].token.store(0, std::memory_order_seq_cst);
      if (leases_[i]) ending.push_back(std::move(leases_[i]));
    }
  }
}

// ---------------------------------------------------------------------------
// Negotiation.

absl::Status SameHostChannel::Publish(Store& base, int rank) {
  // Fields: on, identity, pid, probe address, probe value.
  const std::string record = absl::StrJoin(
      {std::string(enabled_ ? "1" : "0"), enabled_ ? HostIdentity() : "",
       absl::StrCat(::getpid()),
       absl::StrCat(reinterpret_cast<uintptr_t>(probe_word_.get())),
       absl::StrCat(probe_value_)},
      "\n");
  return base.Set(absl::StrCat(kPrefix, "/", rank), record);
}

absl::Status SameHostChannel::Negotiate(Store& base,
                                        const std::vector<WorkerInfo>& group,
                                        int rank, absl::Duration timeout) {
  // PrefixStore adds the '/' after the prefix.
  PrefixStore store(kPrefix, std::shared_ptr<Store>(&base, [](Store*) {}));
  const int n = static_cast<int>(group.size());
  std::vector<std::string> keys, read_keys;
  for (int i = 0; i < n; ++i) {
    keys.push_back(absl::StrCat(i));
    read_keys.push_back(absl::StrCat("readable/", i));
  }
  RETURN_IF_ERROR(store.Wait(keys, timeout));
  ASSIGN_OR_RETURN(std::vector<std::string> records, store.MultiGet(keys));
  std::vector<PeerRecord> peers(n);
  std::vector<std::string> readable;
  for (int i = 0; i < n; ++i) {
    peers[i] = Probe(records[i], group[i].name, i);
    if (peers[i].can_read) readable.push_back(absl::StrCat(i));
  }
  RETURN_IF_ERROR(store.Set(read_keys[rank], absl::StrJoin(readable, ",")));
  RETURN_IF_ERROR(store.Wait(read_keys, timeout));
  ASSIGN_OR_RETURN(std::vector<std::string> answers, store.MultiGet(read_keys));
  const std::string me = absl::StrCat(rank);
  for (int i = 0; i < n; ++i) {
    for (absl::string_view r : absl::StrSplit(answers[i], ',')) {
      // Both ways or neither: a pair that can read only one way uses gRPC.
      if (r == me && peers[i].can_read) peers[i].usable = true;
    }
  }
  MutexLock lock(&mu_);
  // Joiners heard of meanwhile keep their records (ids above the group's).
  if (peers_.size() < peers.size()) peers_.resize(peers.size());
  std::move(peers.begin(), peers.end(), peers_.begin());
  return absl::OkStatus();
}

SameHostChannel::PeerRecord SameHostChannel::Probe(const std::string& record,
                                                   const std::string& name,
                                                   int id) const {
  PeerRecord p;
  p.name = name;
  std::vector<std::string> f = absl::StrSplit(record, '\n');
  int64_t pid = 0;
  uint64_t address = 0, value = 0;
  if (f.size() != 5 || !absl::SimpleAtoi(f[2], &pid) ||
      !absl::SimpleAtoi(f[3], &address) || !absl::SimpleAtoi(f[4], &value)) {
    FERRY_LOG(WARNING) << "worker '" << self_name_
                       << "': malformed same-host record of worker " << id;
    return p;
  }
  const std::string mine = enabled_ ? HostIdentity() : "";
  p.pid = static_cast<pid_t>(pid);
  p.candidate = enabled_ && f[0] == "1" && !mine.empty() && f[1] == mine;
  if (!p.candidate) return p;
  uint64_t seen = 0;
  absl::Status probe = ReadWord(p.pid, address, &seen);
  p.can_read = probe.ok() && seen == value;
  if (!p.can_read) {
    FERRY_LOG(INFO) << "worker '" << self_name_ << "': same-host channel to '"
                    << name << "' refused (cannot read pid " << pid << ": "
                    << (probe.ok() ? "probe mismatch" : probe.ToString())
                    << "); using gRPC";
  }
  return p;
}

absl::StatusOr<SameHostChannel::PeerRecord> SameHostChannel::ProbeWorker(
    Store& store, const WorkerInfo& w) const {
  const std::string key = absl::StrCat(kPrefix, "/", w.id);
  ASSIGN_OR_RETURN(bool there, store.Check({key}));
  if (!there) return PeerRecord{.name = w.name};  // It published none.
  ASSIGN_OR_RETURN(std::string record, store.Get(key));
  return Probe(record, w.name, w.id);
}

void SameHostChannel::SetPeer(int id, PeerRecord record) {
  MutexLock lock(&mu_);
  if (peers_.size() <= static_cast<size_t>(id)) peers_.resize(id + 1);
  peers_[id] = std::move(record);
}

absl::Status SameHostChannel::ProbeMembers(
    Store& store, const std::vector<WorkerInfo>& members, int self) {
  if (!enabled_) return absl::OkStatus();
  for (const WorkerInfo& w : members) {
    if (w.id == self) continue;
    ASSIGN_OR_RETURN(PeerRecord p, ProbeWorker(store, w));
    const bool can_read = p.can_read;
    // Known before the member may read the answer and send.
    SetPeer(w.id, std::move(p));
    if (can_read) RETURN_IF_ERROR(store.Set(PairKey(self, w.id), "1"));
  }
  return absl::OkStatus();
}

absl::Status SameHostChannel::AddJoiner(Store& base, const WorkerInfo& joiner,
                                        int self) {
  if (!enabled_) return absl::OkStatus();
  MutexLock serial(&member_store_mu_);
  if (member_store_ == nullptr) {
    ASSIGN_OR_RETURN(member_store_, base.Clone());
  }
  Store& store = *member_store_;
  ASSIGN_OR_RETURN(PeerRecord p, ProbeWorker(store, joiner));
  if (p.can_read) {
    // The joiner answered before it announced itself.
    ASSIGN_OR_RETURN(p.usable, Answered(store, joiner.id, self));
  }
  const bool can_read = p.can_read;
  SetPeer(joiner.id, std::move(p));
  return can_read ? store.Set(PairKey(self, joiner.id), "1") : absl::OkStatus();
}

absl::Status SameHostChannel::SettleJoin(Store& store,
                                         const std::vector<WorkerInfo>& members,
                                         int self) {
  if (!enabled_) return absl::OkStatus();
  for (const WorkerInfo& w : members) {
    if (w.id == self || !Reader(w.id).ok()) continue;
    ASSIGN_OR_RETURN(bool answered, Answered(store, w.id, self));
    MutexLock lock(&mu_);
    peers_[w.id].usable = answered && peers_[w.id].can_read;
  }
  return absl::OkStatus();
}

void SameHostChannel::RemovePeer(int id) {
  MutexLock lock(&mu_);
  if (id >= 0 && static_cast<size_t>(id) < peers_.size()) {
    peers_[id] = PeerRecord{.name = peers_[id].name};
  }
}

bool SameHostChannel::UsableTo(int peer) const {
  MutexLock lock(&mu_);
  return peer >= 0 && peer < static_cast<int>(peers_.size()) &&
         peers_[peer].usable;
}

int SameHostChannel::usable_peers() const {
  MutexLock lock(&mu_);
  int n = 0;
  for (const PeerRecord& p : peers_) n += p.usable ? 1 : 0;
  return n;
}

// ---------------------------------------------------------------------------
// Sending.

bool SameHostChannel::Offer(int peer, EncodedValue& payload,
                            v1::SameHostPayload* out,
                            std::shared_ptr<void>* end_with) {
  if (!enabled_ || payload.payloads.empty()) return false;
  size_t bytes = 0;
  for (const WirePayload& p : payload.payloads) bytes += p.size;
  if (bytes < options_.min_bytes || bytes == 0 ||
      payload.payloads.size() > static_cast<size_t>(kMaxRegions) ||
      !UsableTo(peer)) {
    return false;
  }
  Sweep();
  auto lease = std::make_unique<Lease>();
  lease->held_by_call = end_with != nullptr;
  lease->expiry = absl::Now() + options_.lease_timeout;
  int slot;
  {
    MutexLock lock(&mu_);
    if (free_slots_.empty()) {
      stats_.fallbacks.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    slot = free_slots_.back();
    free_slots_.pop_back();
    lease->nonce = next_nonce_++;
    if (lease->nonce == 0) lease->nonce = next_nonce_++;
  }
  out->set_head(std::move(payload.head));
  for (WirePayload& p : payload.payloads) {
    v1::SameHostPayload::Region* r = out->add_regions();
    r->set_address(reinterpret_cast<uintptr_t>(p.data));
    r->set_size(p.size);
    r->set_padding(p.padding);
    lease->tensors.push_back(std::move(p.tensor));
  }
  payload.payloads.clear();
  payload.head.clear();
  Slot& s = slots_[slot];
  out->set_token_address(reinterpret_cast<uintptr_t>(&s.token));
  // A request's lease ends with its call: no acknowledgement wanted (0
  // spares the reader a write into this process).
  out->set_ack_address(
      end_with != nullptr ? 0 : reinterpret_cast<uintptr_t>(&s.ack));
  out->set_nonce(lease->nonce);
  const uint64_t nonce = lease->nonce;
  s.ack.store(0, std::memory_order_relaxed);
  s.token.store(nonce, std::memory_order_seq_cst);
  {
    MutexLock lock(&mu_);
    if (!lease->held_by_call) ++reply_leases_;
    leases_[slot] = std::move(lease);
  }
  if (end_with != nullptr) {
    *end_with = std::shared_ptr<void>(
        nullptr, [self = shared_from_this(), slot, nonce](void*) {
          self->EndLease(slot, nonce);
        });
  }
  stats_.payloads_sent.fetch_add(1, std::memory_order_relaxed);
  stats_.bytes_sent.fetch_add(bytes, std::memory_order_relaxed);
  return true;
}

void SameHostChannel::EndLease(int slot, uint64_t nonce) {
  std::unique_ptr<Lease> ending;
  {
    MutexLock lock(&mu_);
    if (!leases_[slot] || leases_[slot]->nonce != nonce) return;
    if (!leases_[slot]->held_by_call) --reply_leases_;
    // A reader that checks the token after this sees the lease is over
    // before the tensors' memory can be reused.
    slots_[slot].token.store(0, std::memory_order_seq_cst);
    ending = std::move(leases_[slot]);
    free_slots_.push_back(slot);
  }
  // Tensors released outside the lock.
}

void SameHostChannel::Sweep() {
  std::vector<std::unique_ptr<Lease>> ending;  // Released after the lock.
  MutexLock lock(&mu_);
  if (reply_leases_ == 0) return;  // Requests' leases end with their calls.
  const absl::Time now = absl::Now();
  for (size_t i = 0; i < leases_.size() && reply_leases_ > 0; ++i) {
    Lease* l = leases_[i].get();
    if (l == nullptr || l->held_by_call) continue;
    const bool acked =
        slots_[i].ack.load(std::memory_order_acquire) == l->nonce;
    if (!acked && now < l->expiry) continue;
    slots_[i].token.store(0, std::memory_order_seq_cst);
    ending.push_back(std::move(leases_[i]));
    free_slots_.push_back(static_cast<int>(i));
    --reply_leases_;
  }
}

int SameHostChannel::live_leases() {
  Sweep();
  MutexLock lock(&mu_);
  return options_.max_leases - static_cast<int>(free_slots_.size());
}

// ---------------------------------------------------------------------------
// Receiving.

absl::StatusOr<SameHostChannel::PeerRecord> SameHostChannel::Reader(
    int peer) const {
  MutexLock lock(&mu_);
  if (peer < 0 || peer >= static_cast<int>(peers_.size()) ||
      !peers_[peer].can_read) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker '", self_name_, "': a same-host payload from rank ", peer,
        ", which has no same-host channel to this worker"));
  }
  return peers_[peer];
}

absl::StatusOr<WireChunk> SameHostChannel::Fetch(int peer,
                                                 const v1::SameHostPayload& d,
                                                 const WireLimits& limits) {
  ASSIGN_OR_RETURN(PeerRecord from, Reader(peer));
  const std::string who =
      absl::StrCat("same-host payload from worker '", from.name, "'");
  // A sender offers only payloads with tensors (Offer), so no region is as
  // malformed as too many.
  if (d.regions_size() == 0 || d.regions_size() > kMaxRegions ||
      d.nonce() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": malformed descriptor (", d.regions_size(),
                     " regions, nonce ", d.nonce(), ")"));
  }
  uint64_t total = d.head().size();
  uint64_t payload_bytes = 0;
  if (total > limits.max_total_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": a head of ", total, " bytes exceeds the limit of ",
                     limits.max_total_bytes, " bytes"));
  }
  for (const auto& r : d.regions()) {
    if (r.size() > limits.max_total_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          who, ": a region of ", r.size(), " bytes exceeds the limit of ",
          limits.max_total_bytes, " bytes"));
    }
    if (r.padding() >= kWireAlignment || r.address() > UINT64_MAX - r.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(who, ": malformed region (", r.size(), " bytes, ",
                       r.padding(), " padding)"));
    }
    payload_bytes += r.size();
    total += r.size() + r.padding();
    if (total > limits.max_total_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(who, ": ", total, " bytes exceed the limit of ",
                       limits.max_total_bytes, " bytes"));
    }
  }
  if (options_.max_message_bytes >= 0 &&
      total > static_cast<uint64_t>(options_.max_message_bytes)) {
    return absl::ResourceExhaustedError(
        absl::StrCat(who, ": ", total, " bytes, over the limit of ",
                     options_.max_message_bytes, " bytes of worker '",
                     self_name_, "' (max_message_bytes)"));
  }
  Sweep();  // Replies acknowledged since: their buffers may be reused.
  ASSIGN_OR_RETURN(Storage storage, pool_->Get(total, limits.allocator));
  char* buffer = static_cast<char*>(storage.data());
  std::memcpy(buffer, d.head().data(), d.head().size());

  auto check_token = [&]() -> absl::Status {
    uint64_t token = 0;
    absl::Status s = ReadWord(from.pid, d.token_address(), &token);
    if (!s.ok()) return PeerError(s, from.name, from.pid);
    if (token != d.nonce()) {
      return PeerError(absl::AbortedError("lease ended"), from.name, from.pid);
    }
    return absl::OkStatus();
  };
  // Pieces of at most kMaxCallBytes, batched kMaxIovecs per call. The token
  // is checked once, after the copy: a lease that ended before or during it
  // fails the check (a released region that is no longer mapped fails the
  // copy itself), so bytes the sender let go are never taken.
  std::vector<iovec> local, remote;
  size_t batch_bytes = 0;
  auto flush = [&]() -> absl::Status {
    if (local.empty()) return absl::OkStatus();
    ssize_t n = ::process_vm_readv(from.pid, local.data(), local.size(),
                                   remote.data(), remote.size(), 0);
    if (n != static_cast<ssize_t>(batch_bytes)) {
      absl::Status s =
          absl::ErrnoToStatus(n < 0 ? errno : EFAULT, "process_vm_readv");
      return PeerError(s, from.name, from.pid);
    }
    local.clear();
    remote.clear();
    batch_bytes = 0;
    return absl::OkStatus();
  };
  char* at = buffer + d.head().size();
  for (const auto& r : d.regions()) {
    for (uint64_t done = 0; done < r.size();) {
      const size_t take = std::min<uint64_t>(r.size() - done, kMaxCallBytes);
      if (local.size() == kMaxIovecs || batch_bytes + take > kMaxCallBytes) {
        RETURN_IF_ERROR(flush());
      }
      local.push_back(iovec{at + done, take});
      remote.push_back(
          iovec{reinterpret_cast<void*>(r.address() + done), take});
      batch_bytes += take;
      done += take;
    }
    at += r.size();
    std::memset(at, 0, r.padding());
    at += r.padding();
  }
  RETURN_IF_ERROR(flush());
  RETURN_IF_ERROR(check_token());
  // Let the sender drop a reply's payload now (a request's ends with its
  // call: no ack address); if this fails, its lease times out.
  if (d.ack_address() != 0) {
    uint64_t nonce = d.nonce();
    iovec l{&nonce, sizeof(nonce)};
    iovec r{reinterpret_cast<void*>(d.ack_address()), sizeof(nonce)};
    if (::process_vm_writev(from.pid, &l, 1, &r, 1, 0) != sizeof(nonce)) {
      FERRY_LOG(DEBUG) << who
                       << ": acknowledging failed: " << std::strerror(errno);
    }
  }
  stats_.payloads_received.fetch_add(1, std::memory_order_relaxed);
  stats_.bytes_received.fetch_add(payload_bytes, std::memory_order_relaxed);
  Sweep();
  auto keep = std::make_shared<Storage>(std::move(storage));
  return WireChunk{buffer, total, std::shared_ptr<const void>(keep, buffer)};
}

}  // namespace ferry::rpc::grpc_agent
