#include "ferry/common/env.h"
#include "ferry/rpc/grpc/shm_channel.h"

#include <openssl/crypto.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <random>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "ferry/common/logging.h"
#include "ferry/common/same_host.h"
#include "ferry/common/status.h"
#include "ferry/store/prefix_store.h"
#include "ferry/store/store_auth.h"
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

// What worker `reader` answered about `target` (its ack row's address when
// it can read it); "" when it did not answer.
absl::StatusOr<std::string> PairAnswer(Store& store, int reader, int target) {
  const std::string key = PairKey(reader, target);
  ASSIGN_OR_RETURN(bool there, store.Check({key}));
  if (!there) return std::string();
  return store.Get(key);
}

bool EnvDisabled() {
  return GetEnv("FERRY_RPC_SAME_HOST") == "0";
}

uint64_t RandomNonZero() {
  std::random_device rd;
  uint64_t v = (uint64_t{rd()} << 32) ^ rd();
  return v == 0 ? 1 : v;
}

// Record fields (Publish): on, host identity, pid, secret address, secret
// commitment, lease table address, lease slots. Records of another format
// (an older Ferry) are not candidates: that pair uses gRPC.
constexpr size_t kRecordFields = 7;
constexpr size_t kSecretBytes = tcpstore::kAuthNonceBytes;
// Slots a peer's lease table may have (the ack row this worker keeps for
// it has as many words).
constexpr uint64_t kMaxSlots = uint64_t{1} << 16;
constexpr char kCommitLabel[] = "ferry-same-host-commit-v1";
constexpr char kPairLabel[] = "ferry-same-host-pair-v1";

// What the store holds of a secret: a MAC keyed with it, which reveals
// nothing of it, so a reader can tell it read the right word.
std::string Commitment(absl::string_view secret) {
  KeyedMac::Tag t = KeyedMac(secret).Begin().Add(kCommitLabel).Finish();
  return absl::BytesToHexString(KeyedMac::ToString(t));
}

// The pair key of workers `a` and `b` from their secrets (symmetric).
std::shared_ptr<const KeyedMac> PairKeyOf(int a, absl::string_view secret_a,
                                          int b, absl::string_view secret_b) {
  if (b < a) {
    std::swap(a, b);
    std::swap(secret_a, secret_b);
  }
  KeyedMac::Tag k = KeyedMac(kPairLabel)
                        .Begin()
                        .AddU64(static_cast<uint64_t>(a))
                        .AddBytes(secret_a)
                        .AddU64(static_cast<uint64_t>(b))
                        .AddBytes(secret_b)
                        .Finish();
  return std::make_shared<const KeyedMac>(KeyedMac::ToString(k));
}

// Reads `size` bytes at `remote` in `pid` into `local`.
absl::Status ReadRemote(pid_t pid, uint64_t remote, void* local, size_t size) {
  iovec l{local, size};
  iovec r{reinterpret_cast<void*>(remote), size};
  ssize_t n = ::process_vm_readv(pid, &l, 1, &r, 1, 0);
  if (n == static_cast<ssize_t>(size)) return absl::OkStatus();
  return absl::ErrnoToStatus(n < 0 ? errno : EFAULT, "process_vm_readv");
}

absl::Status ReadWord(pid_t pid, uint64_t remote, uint64_t* local) {
  return ReadRemote(pid, remote, local, sizeof(*local));
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

// One entry of a lease's region list (what receivers read, 24 bytes).
struct RegionEntry {
  uint64_t address;
  uint64_t size;
  uint64_t padding;
};
// A lease slot as a receiver reads it (the first words of Slot).
struct SlotView {
  uint64_t token;
  uint64_t regions;
  uint64_t count;
};

}  // namespace

struct alignas(64) SameHostChannel::Slot {
  std::atomic<uint64_t> token{0};    // The live lease's nonce, 0 when free.
  std::atomic<uint64_t> regions{0};  // Its RegionEntry list (this process).
  std::atomic<uint64_t> count{0};    // Entries in the list.
};
static_assert(sizeof(std::atomic<uint64_t>) == sizeof(uint64_t));

struct SameHostChannel::Exposed {
  char secret[kSecretBytes];
};

struct SameHostChannel::Lease {
  uint64_t nonce = 0;
  int peer = -1;
  std::vector<Tensor> tensors;
  std::vector<RegionEntry> regions;  // Read by the peer (Slot::regions).
  bool held_by_call = false;
  absl::Time expiry;
};

SameHostChannel::SameHostChannel(SameHostOptions options, std::string self_name,
                                 std::shared_ptr<ReceiveBufferPool> pool)
    : options_(std::move(options)),
      self_name_(std::move(self_name)),
      enabled_(options_.enabled && !EnvDisabled() && options_.max_leases > 0 &&
               static_cast<uint64_t>(options_.max_leases) <= kMaxSlots),
      exposed_(std::make_unique<Exposed>()),
      slots_(std::make_unique<Slot[]>(std::max(options_.max_leases, 1))),
      pool_(pool != nullptr ? std::move(pool) : ReceiveBufferPool::Create()),
      next_nonce_(RandomNonZero()) {
  const std::string secret = tcpstore::RandomNonce();
  std::memcpy(exposed_->secret, secret.data(), kSecretBytes);
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
  self_id_.store(rank, std::memory_order_relaxed);
  const absl::string_view secret(exposed_->secret, kSecretBytes);
  // The secret itself never leaves this process's memory.
  const std::string record = absl::StrJoin(
      {std::string(enabled_ ? "1" : "0"), enabled_ ? HostIdentity() : "",
       absl::StrCat(::getpid()),
       absl::StrCat(reinterpret_cast<uintptr_t>(exposed_.get())),
       Commitment(secret),
       absl::StrCat(reinterpret_cast<uintptr_t>(slots_.get())),
       absl::StrCat(options_.max_leases)},
      "\n");
  return base.Set(absl::StrCat(kPrefix, "/", rank), record);
}

std::string SameHostChannel::Answer(const PeerRecord& p) {
  return absl::StrCat(reinterpret_cast<uintptr_t>(p.acks->words.get()));
}

void SameHostChannel::Settle(PeerRecord& p, absl::string_view answer) {
  uint64_t address = 0;
  // Both ways or neither: a pair that can read only one way uses gRPC.
  p.usable = p.can_read && absl::SimpleAtoi(answer, &address) && address != 0;
  p.peer_acks = p.usable ? address : 0;
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
  // "<rank>=<ack row address>" for each worker this one can read.
  std::vector<std::string> readable;
  for (int i = 0; i < n; ++i) {
    peers[i] = Probe(records[i], group[i].name, i);
    if (peers[i].can_read) {
      readable.push_back(absl::StrCat(i, "=", Answer(peers[i])));
    }
  }
  RETURN_IF_ERROR(store.Set(read_keys[rank], absl::StrJoin(readable, ",")));
  RETURN_IF_ERROR(store.Wait(read_keys, timeout));
  ASSIGN_OR_RETURN(std::vector<std::string> answers, store.MultiGet(read_keys));
  const std::string me = absl::StrCat(rank, "=");
  for (int i = 0; i < n; ++i) {
    absl::string_view mine;
    for (absl::string_view r : absl::StrSplit(answers[i], ',')) {
      if (absl::ConsumePrefix(&r, me)) mine = r;
    }
    Settle(peers[i], mine);
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
  uint64_t address = 0, table = 0, slots = 0;
  if (f.size() != kRecordFields || !absl::SimpleAtoi(f[2], &pid) ||
      !absl::SimpleAtoi(f[3], &address) || !absl::SimpleAtoi(f[5], &table) ||
      !absl::SimpleAtoi(f[6], &slots) || slots == 0 || slots > kMaxSlots) {
    FERRY_LOG(WARNING) << "worker '" << self_name_
                       << "': same-host record of worker " << id << " ('"
                       << name << "') is malformed or of another version";
    return p;
  }
  const std::string mine = enabled_ ? HostIdentity() : "";
  p.pid = static_cast<pid_t>(pid);
  p.candidate = enabled_ && f[0] == "1" && !mine.empty() && f[1] == mine;
  if (!p.candidate) return p;
  char secret[kSecretBytes];
  absl::Status probe = ReadRemote(p.pid, address, secret, sizeof(secret));
  const absl::string_view theirs(secret, sizeof(secret));
  p.can_read = probe.ok() && Commitment(theirs) == f[4];
  if (!p.can_read) {
    FERRY_LOG(INFO) << "worker '" << self_name_ << "': same-host channel to '"
                    << name << "' refused (cannot read pid " << pid << ": "
                    << (probe.ok() ? "probe mismatch" : probe.ToString())
                    << "); using gRPC";
    return p;
  }
  p.lease_table = table;
  p.slots = static_cast<uint32_t>(slots);
  p.key = PairKeyOf(self_id_.load(std::memory_order_relaxed),
                    absl::string_view(exposed_->secret, kSecretBytes), id,
                    theirs);
  p.acks = std::make_shared<AckRow>(p.slots);
  OPENSSL_cleanse(secret, sizeof(secret));
  return p;
}

absl::StatusOr<SameHostChannel::PeerRecord> SameHostChannel::ProbeWorker(
    Store& store, const WorkerInfo& w) const {
  const std::string key = absl::StrCat(kPrefix, "/", w.id);
  ASSIGN_OR_RETURN(bool there, store.Check({key}));
  if (!there) {  // It published none.
    PeerRecord none;
    none.name = w.name;
    return none;
  }
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
    const std::string answer = p.can_read ? Answer(p) : "";
    // Known before the member may read the answer and send.
    SetPeer(w.id, std::move(p));
    if (!answer.empty()) RETURN_IF_ERROR(store.Set(PairKey(self, w.id), answer));
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
    ASSIGN_OR_RETURN(std::string answer, PairAnswer(store, joiner.id, self));
    Settle(p, answer);
  }
  const std::string answer = p.can_read ? Answer(p) : "";
  SetPeer(joiner.id, std::move(p));
  return answer.empty() ? absl::OkStatus()
                        : store.Set(PairKey(self, joiner.id), answer);
}

absl::Status SameHostChannel::SettleJoin(Store& store,
                                         const std::vector<WorkerInfo>& members,
                                         int self) {
  if (!enabled_) return absl::OkStatus();
  for (const WorkerInfo& w : members) {
    if (w.id == self || !Reader(w.id).ok()) continue;
    ASSIGN_OR_RETURN(std::string answer, PairAnswer(store, w.id, self));
    MutexLock lock(&mu_);
    Settle(peers_[w.id], answer);
  }
  return absl::OkStatus();
}

void SameHostChannel::RemovePeer(int id) {
  MutexLock lock(&mu_);
  if (id >= 0 && static_cast<size_t>(id) < peers_.size()) {
    PeerRecord gone;
    gone.name = peers_[id].name;
    peers_[id] = std::move(gone);
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

KeyedMac::Tag SameHostChannel::DescriptorTag(const KeyedMac& key, int from,
                                             int to,
                                             const v1::SameHostPayload& d) {
  KeyedMac::Builder b = key.Begin();
  b.AddU64(static_cast<uint32_t>(from))
      .AddU64(static_cast<uint32_t>(to))
      .AddU64(d.slot())
      .AddU64(d.nonce())
      .AddBytes(d.head())
      .AddU64(static_cast<uint64_t>(d.regions_size()));
  for (const auto& r : d.regions()) {
    const uint64_t words[3] = {r.address(), r.size(), r.padding()};
    b.Add(words, sizeof(words));
  }
  return b.Finish();
}

bool SameHostChannel::Offer(int peer, EncodedValue& payload,
                            v1::SameHostPayload* out,
                            std::shared_ptr<void>* end_with) {
  if (!enabled_ || payload.payloads.empty()) return false;
  size_t bytes = 0;
  for (const WirePayload& p : payload.payloads) bytes += p.size;
  if (bytes < options_.min_bytes || bytes == 0 ||
      payload.payloads.size() > static_cast<size_t>(kMaxRegions)) {
    return false;
  }
  std::shared_ptr<const KeyedMac> key;
  {
    MutexLock lock(&mu_);
    if (peer < 0 || peer >= static_cast<int>(peers_.size()) ||
        !peers_[peer].usable) {
      return false;
    }
    key = peers_[peer].key;
  }
  Sweep();
  auto lease = std::make_unique<Lease>();
  lease->peer = peer;
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
  lease->regions.reserve(payload.payloads.size());
  for (WirePayload& p : payload.payloads) {
    v1::SameHostPayload::Region* r = out->add_regions();
    const uint64_t address = reinterpret_cast<uintptr_t>(p.data);
    r->set_address(address);
    r->set_size(p.size);
    r->set_padding(p.padding);
    lease->regions.push_back(RegionEntry{address, p.size, p.padding});
    lease->tensors.push_back(std::move(p.tensor));
  }
  payload.payloads.clear();
  payload.head.clear();
  const uint64_t nonce = lease->nonce;
  out->set_slot(static_cast<uint32_t>(slot));
  out->set_nonce(nonce);
  const KeyedMac::Tag tag =
      DescriptorTag(*key, self_id_.load(std::memory_order_relaxed), peer, *out);
  out->set_mac(tag.data(), tag.size());
  // The list is published before the nonce: a reader that sees the nonce
  // sees the list (and the final token check covers any torn read).
  Slot& s = slots_[slot];
  s.regions.store(reinterpret_cast<uintptr_t>(lease->regions.data()),
                  std::memory_order_relaxed);
  s.count.store(lease->regions.size(), std::memory_order_relaxed);
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

void SameHostChannel::SignForTesting(int peer, v1::SameHostPayload* d) const {
  std::shared_ptr<const KeyedMac> key;
  {
    MutexLock lock(&mu_);
    if (peer < 0 || peer >= static_cast<int>(peers_.size())) return;
    key = peers_[peer].key;
  }
  if (key == nullptr) return;
  d->clear_mac();
  const KeyedMac::Tag tag =
      DescriptorTag(*key, self_id_.load(std::memory_order_relaxed), peer, *d);
  d->set_mac(tag.data(), tag.size());
}

void SameHostChannel::TakeLease(int slot,
                                std::vector<std::unique_ptr<Lease>>& ending) {
  if (!leases_[slot]->held_by_call) --reply_leases_;
  // A reader that checks the token after this sees the lease is over
  // before the tensors' memory (and the region list) can be reused.
  slots_[slot].token.store(0, std::memory_order_seq_cst);
  ending.push_back(std::move(leases_[slot]));
  free_slots_.push_back(slot);
}

void SameHostChannel::EndLease(int slot, uint64_t nonce) {
  std::vector<std::unique_ptr<Lease>> ending;  // Released after the lock.
  MutexLock lock(&mu_);
  if (!leases_[slot] || leases_[slot]->nonce != nonce) return;
  TakeLease(slot, ending);
}

void SameHostChannel::Sweep() {
  // Reply leases to poll: the peer acknowledges in its own memory.
  struct Poll {
    int slot;
    uint64_t nonce;
    pid_t pid;
    uint64_t word;
  };
  std::vector<Poll> polls;
  std::vector<std::unique_ptr<Lease>> ending;  // Released after the lock.
  {
    MutexLock lock(&mu_);
    if (reply_leases_ == 0) return;  // Requests' leases end with their calls.
    const absl::Time now = absl::Now();
    int left = reply_leases_;
    for (size_t i = 0; i < leases_.size() && left > 0; ++i) {
      Lease* l = leases_[i].get();
      if (l == nullptr || l->held_by_call) continue;
      --left;
      const PeerRecord* p =
          l->peer < static_cast<int>(peers_.size()) ? &peers_[l->peer] : nullptr;
      if (now >= l->expiry || p == nullptr || !p->usable) {
        // Timed out, or the peer left (it acknowledges nothing more).
        TakeLease(static_cast<int>(i), ending);
        continue;
      }
      polls.push_back(Poll{static_cast<int>(i), l->nonce, p->pid,
                           p->peer_acks + i * sizeof(uint64_t)});
    }
  }
  if (polls.empty()) return;
  std::vector<Poll> acked;
  for (const Poll& poll : polls) {
    uint64_t seen = 0;
    absl::Status read = ReadWord(poll.pid, poll.word, &seen);
    // A peer that exited reads nothing more: its leases end now.
    if (read.ok() ? seen == poll.nonce
                  : absl::IsNotFound(read) || !ProcessAlive(poll.pid)) {
      acked.push_back(poll);
    }
  }
  MutexLock lock(&mu_);
  for (const Poll& poll : acked) {
    if (leases_[poll.slot] && leases_[poll.slot]->nonce == poll.nonce) {
      TakeLease(poll.slot, ending);
    }
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
    const std::string who =
        peer >= 0 && peer < static_cast<int>(peers_.size()) &&
                !peers_[peer].name.empty()
            ? absl::StrCat("worker '", peers_[peer].name, "' (rank ", peer,
                           ")")
            : absl::StrCat("rank ", peer);
    return absl::PermissionDeniedError(absl::StrCat(
        "worker '", self_name_, "': a same-host payload claiming to come from ",
        who, ", which has no same-host channel (no pair key) to this worker"));
  }
  return peers_[peer];
}

absl::StatusOr<WireChunk> SameHostChannel::Fetch(int peer,
                                                 const v1::SameHostPayload& d,
                                                 const WireLimits& limits) {
  absl::StatusOr<PeerRecord> reader = Reader(peer);
  if (!reader.ok()) {
    stats_.refused.fetch_add(1, std::memory_order_relaxed);
    return reader.status();
  }
  const PeerRecord& from = *reader;
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
  // Nothing is read from the peer before its tag is checked.
  const KeyedMac::Tag tag = DescriptorTag(
      *from.key, peer, self_id_.load(std::memory_order_relaxed), d);
  if (!KeyedMac::Equal(tag, d.mac())) {
    stats_.refused.fetch_add(1, std::memory_order_relaxed);
    return absl::PermissionDeniedError(absl::StrCat(
        "worker '", self_name_, "' refused a ", who, " (rank ", peer,
        "): its MAC is not the pair's (a descriptor that worker did not "
        "make)"));
  }
  if (d.slot() >= from.slots) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, ": lease slot ", d.slot(), " of ", from.slots));
  }
  // The lease as the sender's table lists it, at an address learned at
  // negotiation.
  const uint64_t slot_address = from.lease_table + d.slot() * sizeof(Slot);
  SlotView view{};
  if (absl::Status s = ReadRemote(from.pid, slot_address, &view, sizeof(view));
      !s.ok()) {
    return PeerError(s, from.name, from.pid);
  }
  if (view.token != d.nonce()) {
    return PeerError(absl::AbortedError("lease ended"), from.name, from.pid);
  }
  if (view.count != static_cast<uint64_t>(d.regions_size())) {
    return absl::PermissionDeniedError(
        absl::StrCat(who, ": its lease lists ", view.count, " regions, not ",
                     d.regions_size()));
  }
  std::vector<RegionEntry> listed(view.count);
  if (absl::Status s = ReadRemote(from.pid, view.regions, listed.data(),
                                  listed.size() * sizeof(RegionEntry));
      !s.ok()) {
    return PeerError(s, from.name, from.pid);
  }
  for (int i = 0; i < d.regions_size(); ++i) {
    const auto& r = d.regions(i);
    if (listed[i].address != r.address() || listed[i].size != r.size() ||
        listed[i].padding != r.padding()) {
      return absl::PermissionDeniedError(absl::StrCat(
          who, ": region ", i, " is not the one its lease lists"));
    }
  }
  Sweep();  // Replies acknowledged since: their buffers may be reused.
  ASSIGN_OR_RETURN(Storage storage, pool_->Get(total, limits.allocator));
  char* buffer = static_cast<char*>(storage.data());
  std::memcpy(buffer, d.head().data(), d.head().size());

  // Pieces of at most kMaxCallBytes, batched kMaxIovecs per call. The token
  // is checked again after the copy: a lease that ended before or during it
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
  uint64_t token = 0;
  if (absl::Status s = ReadWord(from.pid, slot_address, &token); !s.ok()) {
    return PeerError(s, from.name, from.pid);
  }
  if (token != d.nonce()) {
    return PeerError(absl::AbortedError("lease ended"), from.name, from.pid);
  }
  // Acknowledged in this process's memory; the sender polls it for a
  // reply's lease (a request's ends with its call).
  from.acks->words[d.slot()].store(d.nonce(), std::memory_order_release);
  stats_.payloads_received.fetch_add(1, std::memory_order_relaxed);
  stats_.bytes_received.fetch_add(payload_bytes, std::memory_order_relaxed);
  auto keep = std::make_shared<Storage>(std::move(storage));
  return WireChunk{buffer, total, std::shared_ptr<const void>(keep, buffer)};
}

}  // namespace ferry::rpc::grpc_agent
