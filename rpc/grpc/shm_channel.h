// The same-host channel of a GrpcAgent: tensor payloads between two workers
// on one host stay in the sender's memory; the gRPC envelope carries a
// SameHostPayload (proto/rpc.proto) and the receiver copies the bytes once
// with process_vm_readv into buffers of the agent's ReceiveBufferPool (0
// copies on send, 1 on receive, no shared segment, no file descriptor).
//
// Negotiation at rendezvous (Publish, Negotiate; joiners: ProbeMembers,
// AddJoiner, SettleJoin): each worker publishes its host identity, pid, the
// address of a random secret and a commitment to it, and its lease table;
// each reads the secret of every worker with its identity (what ptrace
// rules allow) and answers which it could read. A pair uses the channel
// only if both are on and each read the other; everything else (other hosts,
// a refused probe, FERRY_RPC_SAME_HOST=0, payloads under `min_bytes`, no
// free lease slot) goes over gRPC.
//
// Leases: a payload's tensors are held in a slot of the sender's lease table
// that lists its regions under a fresh nonce. A request's lease ends with
// its call; a reply's when the sender sees the caller's acknowledgement (a
// word in the caller's own memory, polled by the sender) or after
// `lease_timeout`. A reader of a dead sender fails with Unavailable naming it.
//
// Trust (docs/design/same_host_security.md): the pair key is derived from
// both secrets, so only processes able to read both workers learn it. Fetch
// refuses a descriptor without a valid MAC under it (PermissionDenied naming
// the claimed worker) before reading anything; then it reads only regions
// the sender's lease table (found at the negotiated address) lists under the
// nonce, checks sizes against WireLimits, and never writes into another
// process. Malformed input is an error, never a crash.
//
// Thread safety: all methods may be called from any thread after Negotiate.
#ifndef FERRY_RPC_GRPC_SHM_CHANNEL_H_
#define FERRY_RPC_GRPC_SHM_CHANNEL_H_

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "ferry/common/sync.h"
#include "ferry/proto/rpc.pb.h"
#include "ferry/rpc/agent.h"
#include "ferry/rpc/grpc/buffer_pool.h"
#include "ferry/rpc/grpc/keyed_mac.h"
#include "ferry/store/store.h"
#include "ferry/tensor/storage.h"
#include "ferry/tensor/wire.h"

namespace ferry::rpc::grpc_agent {

struct SameHostOptions {
  bool enabled = true;
  // Payloads whose tensor bytes are fewer go over gRPC (a few syscalls cost
  // more than sending small tensors inline).
  size_t min_bytes = size_t{64} << 10;
  // How long a reply's payload waits for the caller to read it.
  absl::Duration lease_timeout = absl::Seconds(60);
  // Payloads in flight at once; beyond, payloads go over gRPC.
  int max_leases = 1024;
  // The receiver's GrpcAgentOptions::max_message_bytes (the agent sets it;
  // < 0: none): a larger payload is refused with ResourceExhausted before
  // anything is allocated, as gRPC refuses an oversize message.
  int64_t max_message_bytes = -1;
};

// Counters (monotonic, relaxed). bytes_sent were left in place (0 copied),
// bytes_received were copied exactly once (by the kernel).
struct SameHostStats {
  std::atomic<uint64_t> payloads_sent{0};
  std::atomic<uint64_t> bytes_sent{0};
  std::atomic<uint64_t> payloads_received{0};
  std::atomic<uint64_t> bytes_received{0};
  // Payloads that qualified but went over gRPC (no free lease slot).
  std::atomic<uint64_t> fallbacks{0};
  // Descriptors refused before anything was read (no pair key, bad MAC).
  std::atomic<uint64_t> refused{0};
};

// Owned through a shared_ptr: a request's lease handle keeps it alive.
class SameHostChannel : public std::enable_shared_from_this<SameHostChannel> {
 public:
  // `options.enabled` is combined with FERRY_RPC_SAME_HOST. Receive buffers
  // come from `pool` (null: a pool of the channel's own).
  SameHostChannel(SameHostOptions options, std::string self_name,
                  std::shared_ptr<ReceiveBufferPool> pool = nullptr);
  ~SameHostChannel();  // Ends every lease.

  SameHostChannel(const SameHostChannel&) = delete;
  SameHostChannel& operator=(const SameHostChannel&) = delete;

  bool enabled() const { return enabled_; }

  // Rendezvous step 1, before joining the group: publishes this worker's
  // record under "rpc/same_host/" in `store`.
  absl::Status Publish(Store& store, int rank);
  // Step 2, once every worker joined (so every record is there): probes,
  // publishes what this worker can read, waits for the others' answers and
  // decides per peer. A refused probe only turns that pair off; an error is
  // the store's (or DeadlineExceeded after `timeout`), and the agent fails
  // to start with it, as it would joining.
  absl::Status Negotiate(Store& store, const std::vector<WorkerInfo>& group,
                         int rank, absl::Duration timeout);

  // Joining a running group, by id (ids are never reused): the joiner
  // publishes its record (Publish with its id) before its join event, then
  // probes the present `members` and answers which it can read
  // (ProbeMembers), then announces itself. A member told of a joiner
  // probes it, answers, and decides (AddJoiner: the joiner answered
  // first). Once its announcement was answered the joiner decides
  // (SettleJoin). A pair missing either answer (a member not told, the
  // channel off on one side) uses gRPC. Errors are the store's; the pair
  // then uses gRPC. A worker that left has no channel (RemovePeer).
  absl::Status ProbeMembers(Store& store,
                            const std::vector<WorkerInfo>& members, int self);
  // AddJoiner uses its own connection (a clone of `store`, made once): the
  // agent's may be held by a long wait (the shutdown barrier) while workers
  // join.
  absl::Status AddJoiner(Store& store, const WorkerInfo& joiner, int self);
  absl::Status SettleJoin(Store& store, const std::vector<WorkerInfo>& members,
                          int self);
  void RemovePeer(int id);

  // Whether payloads to `peer` go over the channel.
  bool UsableTo(int peer) const;
  // Peers the channel is usable to (for logs and tests).
  int usable_peers() const;

  // Sender. If `payload` qualifies for `peer`, leaves it in a lease, writes
  // its descriptor to `out`, clears `payload` and returns true. With
  // `end_with` set, the lease ends when *end_with is destroyed (a request:
  // the call holds it); otherwise on acknowledgement or timeout (a reply).
  bool Offer(int peer, EncodedValue& payload, v1::SameHostPayload* out,
             std::shared_ptr<void>* end_with);

  // Receiver: copies the payload `d` from `peer`'s memory; the result is the
  // whole wire stream in one aligned chunk that owns its memory.
  // PermissionDenied (naming `peer`'s worker) when `d`'s MAC is not the
  // pair's or its lease does not list its regions; Aborted when the lease
  // ended; InvalidArgument / ResourceExhausted for sizes over the limits.
  absl::StatusOr<WireChunk> Fetch(int peer, const v1::SameHostPayload& d,
                                  const WireLimits& limits);

  const SameHostStats& stats() const { return stats_; }
  // Re-signs `d` as this worker's descriptor to `peer` (tests and the fuzz
  // target, which change descriptors after Offer).
  void SignForTesting(int peer, v1::SameHostPayload* d) const;
  // Leases not ended yet (after ending those acknowledged or timed out).
  int live_leases();

 private:
  struct Slot;
  struct Lease;
  struct Exposed;
  // This worker's acknowledgements of one peer's reply leases, by the
  // peer's slot: written here, polled by the peer (which learned its
  // address from this worker's negotiation answer). Held by the peer's
  // record; a peer that left polls it no more.
  struct AckRow {
    explicit AckRow(uint32_t n)
        : size(n), words(std::make_unique<std::atomic<uint64_t>[]>(n)) {}
    const uint32_t size;
    const std::unique_ptr<std::atomic<uint64_t>[]> words;
  };
  struct PeerRecord {
    bool candidate = false;  // On, same identity: worth probing.
    bool can_read = false;   // This worker read the peer's secret.
    bool usable = false;     // And the peer read this worker's.
    pid_t pid = 0;
    std::string name;
    // The peer's lease table (its address space) and slot count.
    uint64_t lease_table = 0;
    uint32_t slots = 0;
    // The pair's key (set with can_read).
    std::shared_ptr<const KeyedMac> key;
    // Where this worker acknowledges the peer's replies (its own memory),
    // and where the peer acknowledges this worker's (the peer's; 0 until
    // the peer answered).
    std::shared_ptr<AckRow> acks;
    uint64_t peer_acks = 0;
  };

  // `record` (Publish's) of worker `id`, probed.
  PeerRecord Probe(const std::string& record, const std::string& name,
                   int id) const;
  // The record `w` published, probed (not a candidate when there is none).
  absl::StatusOr<PeerRecord> ProbeWorker(Store& store,
                                         const WorkerInfo& w) const;
  void SetPeer(int id, PeerRecord record);
  void EndLease(int slot, uint64_t nonce);
  // Ends the lease in `slot`; its tensors go to `ending` (released by the
  // caller after the lock).
  void TakeLease(int slot, std::vector<std::unique_ptr<Lease>>& ending)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends acknowledged and timed-out reply leases.
  void Sweep();
  absl::StatusOr<PeerRecord> Reader(int peer) const;
  // The tag of descriptor `d` sent by `from` to `to` under `key`.
  static KeyedMac::Tag DescriptorTag(const KeyedMac& key, int from, int to,
                                     const v1::SameHostPayload& d);
  // Sets `p.usable` and `p.peer_acks` from the peer's answer ("" when it
  // gave none).
  static void Settle(PeerRecord& p, absl::string_view answer);
  // This worker's answer to a peer it can read: its ack row's address.
  static std::string Answer(const PeerRecord& p);

  const SameHostOptions options_;
  const std::string self_name_;
  const bool enabled_;
  // This worker's secret half of every pair key; read by peers through
  // cross-memory attach during negotiation, never published.
  std::unique_ptr<Exposed> exposed_;
  // The lease table, at a fixed address peers read; lives as long as the
  // channel.
  std::unique_ptr<Slot[]> slots_;
  // This worker's id (Publish's rank), for the descriptors' tags.
  std::atomic<int> self_id_{-1};
  const std::shared_ptr<ReceiveBufferPool> pool_;
  SameHostStats stats_;

  // Serializes AddJoiner; taken before mu_.
  Mutex member_store_mu_;
  std::unique_ptr<Store> member_store_ ABSL_GUARDED_BY(member_store_mu_);

  mutable Mutex mu_;
  std::vector<PeerRecord> peers_ ABSL_GUARDED_BY(mu_);
  std::vector<int> free_slots_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Lease>> leases_ ABSL_GUARDED_BY(mu_);
  uint64_t next_nonce_ ABSL_GUARDED_BY(mu_);
  // Live leases that end on acknowledgement or timeout (Sweep's work).
  int reply_leases_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ferry::rpc::grpc_agent

#endif  // FERRY_RPC_GRPC_SHM_CHANNEL_H_
